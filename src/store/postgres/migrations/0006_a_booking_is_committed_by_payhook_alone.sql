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
-- declares its own COMMIT first (payhook.booking = 'commit'). (An effect's SET CONSTRAINTS
-- ALL IMMEDIATE fires the check early, and fails the booking too: an effect names the
-- constraints it checks early.) A transaction that declares
-- nothing — an instance of an earlier version, an import — passes. (The check is queued for
-- every write of a mark: the claim declares its transaction in the statement that writes
-- it, after the write.)

CREATE OR REPLACE FUNCTION {schema}.booking_committed_by_payhook() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('payhook.booking', true) = 'held' THEN
        RAISE EXCEPTION 'an effect committed the transaction of its callback''s booking, or set all its constraints immediate; payhook commits it'
            USING HINT = 'write through the connection given to the effect without COMMIT, '
                'ROLLBACK or SET CONSTRAINTS ALL: sqlx''s begin() on it opens no savepoint; use '
                'SAVEPOINT and ROLLBACK TO SAVEPOINT, and name the constraints to check early';
    END IF;
    RETURN NULL;
END
$$;

-- Creating the trigger locks `callbacks` against writes (SHARE ROW EXCLUSIVE) until the
-- migration commits; the migration waits for it two seconds at a time (schema.rs).
CREATE CONSTRAINT TRIGGER booking_committed_by_payhook
    AFTER INSERT OR UPDATE OF done ON {schema}.callbacks
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    EXECUTE FUNCTION {schema}.booking_committed_by_payhook();
