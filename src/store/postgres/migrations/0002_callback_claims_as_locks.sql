-- A callback's claim becomes the transaction that books it: it holds a transaction advisory
-- lock on the nonce from the claim to its COMMIT (or ROLLBACK), and the mark and the
-- merchant's effects are written in that same transaction. A claim therefore lives exactly
-- as long as the connection and the transaction holding it: an instance that dies loses
-- its connections, and its claims with them, at once.

DROP TABLE {schema}.callback_claims;

-- Claims a callback's nonce (`key`, as `callbacks` keys it) for the calling transaction
-- unless another one holds it, reads what was acknowledged for it, and, when claimed for a
-- status not yet acknowledged, writes the status's mark in the same transaction: the
-- COMMIT that makes the merchant's effects durable makes the mark so, and a ROLLBACK takes
-- both away. Until then no other transaction sees the mark, and none can claim the nonce.
--
-- * `claimed`: this transaction now holds the nonce's lock, until it ends. A holder whose
--   transaction began more than `stale_after` seconds ago by the database's clock (a
--   handler stuck past its timeout) is terminated and its claim taken over; its
--   transaction is rolled back, so it writes nothing.
-- * `acknowledged`: `status` is among the nonce's acknowledged statuses;
--   `previous`: the latest acknowledged status; `attempts`: deliveries of the nonce that
--   reached a handler, this one included when claimed; `failing`: a failure of `status`
--   is recorded (the booking removes it).
--
-- The read comes after the lock, in its own statement and so its own snapshot (the
-- function is VOLATILE): it sees what the lock's previous holder committed, whose COMMIT is
-- visible before its lock is released.
--
-- The key is compared in the database's default collation, whatever collation the caller's
-- expression has, so that the primary key's index serves the read.
CREATE FUNCTION {schema}.claim_callback(
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
          AND a.xact_start <= clock_timestamp() - make_interval(secs => stale_after);
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
