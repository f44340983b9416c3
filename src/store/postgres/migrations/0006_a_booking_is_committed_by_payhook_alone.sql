-- A callback's booking is committed by payhook alone, never by one of its effects.
--
-- The claim writes the nonce's mark in its transaction (migration 2), before the handler's
-- effects run in it. An effect that ended that transaction with a COMMIT of its own — sqlx's
-- begin() and commit() on the connection it is given send BEGIN (a no-op inside payhook's
-- transaction) and COMMIT — committed the mark with what the effect had written so far: the
-- delivery was answered 503, but every retry was a duplicate (200), and the effects staged
-- after it never ran.
--
-- So the claim declares its transaction a booking (payhook.booking = 'held', for that
-- transaction only), and a deferred trigger on the mark's row refuses a COMMIT while it is
-- so: the COMMIT fails, and the mark goes with everything else the transaction wrote. payhook
-- declares its own COMMIT first (payhook.booking = 'commit'). A transaction that declares
-- nothing — an instance of an earlier version, an import — passes. (The check is queued for
-- every write of a mark: the claim declares its transaction in the statement that writes
-- it, after the write.)

CREATE OR REPLACE FUNCTION {schema}.booking_committed_by_payhook() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('payhook.booking', true) = 'held' THEN
        RAISE EXCEPTION 'an effect committed the transaction of its callback''s booking; payhook commits it'
            USING HINT = 'write through the connection given to the effect without COMMIT or '
                'ROLLBACK: sqlx''s begin() on it opens no savepoint; use SAVEPOINT and '
                'ROLLBACK TO SAVEPOINT';
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS booking_committed_by_payhook ON {schema}.callbacks;
CREATE CONSTRAINT TRIGGER booking_committed_by_payhook
    AFTER INSERT OR UPDATE OF done ON {schema}.callbacks
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    EXECUTE FUNCTION {schema}.booking_committed_by_payhook();
