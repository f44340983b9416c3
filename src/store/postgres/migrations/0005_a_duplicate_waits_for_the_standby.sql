-- A callback is answered as a duplicate only once the mark it was answered from is on the
-- synchronous standby, where one is configured.
--
-- The mark a delivery reads may come from a transaction whose wait for the standby was cut
-- short after it committed on the primary: an operator's pg_cancel_backend, a crash of its
-- backend, or a takeover. Migration 4 leaves a claim alone while its COMMIT waits for the
-- standby, but the holder can begin that wait between the claimant's look at it and
-- pg_terminate_backend: the claimant then reads a mark committed on the primary alone.
-- Answered 200 at once, the callback would never come again, and a failover to the standby
-- would lose its booking.
--
-- So when the status read is acknowledged and synchronous replication is on, the claim
-- writes a transactional logical message (WAL and a transaction id, no row: it waits on no
-- lock) — or, for a role the function is revoked from, rewrites the nonce's row as it is —
-- and payhook COMMITs the claim's transaction before answering: the COMMIT returns once the
-- standby has WAL past it, and so past the mark. Without synchronous replication
-- nothing is written, and the COMMIT costs what the ROLLBACK did.
--
-- The function is otherwise that of migration 4; its columns are unchanged, so an instance
-- of the previous version (which rolls the claim back) still reads it.

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
    IF acknowledged AND current_setting('synchronous_standby_names') <> ''
       AND current_setting('synchronous_commit') NOT IN ('off', 'local') THEN
        BEGIN
            PERFORM pg_logical_emit_message(true, 'payhook', 'duplicate answered');
        EXCEPTION WHEN insufficient_privilege OR undefined_function THEN
            -- A role the function is revoked from (as some managed services do): the
            -- nonce's row, rewritten as it is, gives the COMMIT its WAL instead (and may
            -- wait for a booking of another status of the nonce that holds it).
            UPDATE {schema}.callbacks AS cb SET attempts = cb.attempts
            WHERE cb.nonce_key = key COLLATE "default";
        END;
    END IF;
END
$$;
