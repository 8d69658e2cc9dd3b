"""The chaos soak (issue 32): a real ``qcluster`` on a private PostgreSQL and Redis, a feeder of
mixed fenced jobs, an editor, SIGKILLs of workers holding claims, Redis and PostgreSQL restarts,
then exact checks of what the engine promises. Run it with ``make soak`` (bench/soak.py).

- :mod:`.servers`: the private PostgreSQL (initdb, pg_ctl) and redis-server;
- :mod:`.settings`: the cluster's and the soak's Django settings (short lease, quick retries);
- :mod:`.journal`: crash-proof per-process logs of handler starts and external calls;
- :mod:`.handlers`: the soak's job handlers (registered through ``project.stress.handlers``);
- :mod:`.feeder`, :mod:`.editor`, :mod:`.chaos`: the load, the staff edits, the faults;
- :mod:`.checks`: the invariants, on plain data; :mod:`.evidence` loads that data;
- :mod:`.report`: the JSON and the table; :mod:`.run`: one soak from start to verdict.
"""
