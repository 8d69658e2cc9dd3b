-- The SQL-only ceiling of one fenced job: the same claim + write + complete cycle the worker runs
-- (tombstones/ledger.py claim() and finish(), the handler's fenced ctx.update()), as plain SQL.
-- Run by bench/pgbench_ceiling.py: pgbench -n -f bench/pgbench_cycle.sql -c N -j N -T 10.
--
-- The broker message is the job id: a sequence stands in for it (each client takes the next id).
SELECT nextval('bench_pgbench_next_job') AS job_id \gset

-- claim: a conditional UPDATE by id, as ledger.claim(): claimable, due, young enough, head of
-- its lane; lease and token in database time. Autocommit: the claim commits on its own.
UPDATE tombstones_job AS j
   SET status = 'running', reason = '', owner = 'pgbench', claim_token = md5(random()::text),
       attempts = j.attempts + 1, started_at = now(),
       lease_expires_at = now() + interval '60 seconds', sending_at = NULL
 WHERE j.id = :job_id
   AND j.status IN ('queued', 'retry_wait') AND j.run_after <= now()
   AND j.created_at >= now() - interval '7 days'
   AND NOT EXISTS (SELECT 1 FROM tombstones_job AS e
                    WHERE e.lane = j.lane AND e.id < j.id
                      AND e.status IN ('queued', 'running', 'retry_wait', 'paused'))
RETURNING j.object_id::bigint AS obj, j.generation AS gen, j.version AS ver,
          j.claim_token AS token \gset

-- write + complete: the fenced write and the outcome commit in ONE transaction.
BEGIN;
UPDATE customers_customer
   SET synced_at = now(), version = version + 1
 WHERE id = :obj AND generation = :gen AND version = :ver AND deleted_at IS NULL;
UPDATE tombstones_job
   SET status = 'succeeded', reason = '', found_generation = :gen, found_version = :ver,
       lease_expires_at = NULL, error_class = '', finished_at = now(), claim_token = ''
 WHERE id = :job_id AND status = 'running' AND claim_token = ':token';
COMMIT;
