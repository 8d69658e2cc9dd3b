"""Operating the engine: heartbeats of the workers, the Prometheus metrics, the health checks,
the optional traces and the fields of the engine's log lines about jobs.

Everything here reads the ledger (and the workers' heartbeat rows) at the moment it is asked:
any number of worker processes and hosts, nothing to merge. Ids, statuses, reasons, handler and
queue names only: no record's field value and no job's parameters.
"""
