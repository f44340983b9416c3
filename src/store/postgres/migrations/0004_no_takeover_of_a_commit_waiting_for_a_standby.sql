-- A holder that is waiting for its COMMIT to reach a synchronous standby is not taken over.
-- Its transaction has committed on the primary already: terminating it would not roll it
-- back, and the claimant would then read its mark and answer the callback as acknowledged
-- while no standby has it — what synchronous replication is there to prevent. A COMMIT
-- waits for the standby however long it takes (PostgreSQL ends a statement's timeout before
-- the commit itself begins); the aggregator's retries find the nonce busy meanwhile and are
-- answered 503 until the standby answers.
--
-- The function is otherwise that of migration 2.

CREATE OR REPLACE FUNCTION {schema}.claim_callback(
    key text, status integer, stale_after double precision, retention double precision,
    OUT claimed boolean, OUT acknowledged boolean, OUT previous integer, OUT attempts integer,
    OUT failing boolean)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    lock_key bigint := hashtextextended('{schema}/callback/' || key, 11);
    holder integer;
BEGIN
    claimed := pg_try_advisory_xact_lock(lock_key);
    IF NOT claimed THEN
        SELECT l.pid INTO holder
        FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND l.classid = ((lock_key >> 32) & 4294967295)::oid
          AND l.objid = (lock_key & 4294967295)::oid
          AND a.xact_start <= clock_timestamp() - make_interval(secs => stale_after)
          AND a.wait_event IS DISTINCT FROM 'SyncRep';
        IF holder IS NOT NULL AND pg_terminate_backend(holder, 5000) THEN
            claimed := pg_try_advisory_xact_lock(lock_key);
        END IF;
    END IF;
    SELECT coalesce(cb.done @> ARRAY[claim_callback.status], false),
           cb.done[array_upper(cb.done, 1)],
           coalesce(cb.attempts, 0),
           EXISTS (SELECT 1 FROM {schema}.callback_failures f
                   WHERE f.nonce_key = key COLLATE "default"
                     AND f.status = claim_callback.status)
    INTO acknowledged, previous, attempts, failing
    FROM (SELECT) AS one LEFT JOIN {schema}.callbacks cb
      ON cb.nonce_key = key COLLATE "default";
    IF claimed AND NOT acknowledged THEN
        claim_callback.attempts := claim_callback.attempts + 1;
        INSERT INTO {schema}.callbacks AS cb (nonce_key, done, attempts, expires_at)
        VALUES (key, ARRAY[claim_callback.status], claim_callback.attempts,
                now() + make_interval(secs => retention))
        ON CONFLICT (nonce_key) DO UPDATE
          SET done = array_append(cb.done, claim_callback.status),
              attempts = EXCLUDED.attempts, expires_at = EXCLUDED.expires_at;
    END IF;
END
$$;
