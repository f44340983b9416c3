-- payhook's tables, in the schema named by store.schema ({schema} below).

-- One row per callback nonce acknowledged: its statuses, oldest first.
CREATE TABLE {schema}.callbacks (
    nonce_key   text PRIMARY KEY,
    done        integer[] NOT NULL,
    attempts    integer NOT NULL DEFAULT 0,
    expires_at  timestamptz NOT NULL
);
CREATE INDEX callbacks_expiry ON {schema}.callbacks (expires_at);

-- One row per validation nonce decided: the payment it was first used for and the decision.
CREATE TABLE {schema}.validations (
    nonce_key   text PRIMARY KEY,
    fingerprint jsonb NOT NULL,
    decision    jsonb NOT NULL,
    expires_at  timestamptz NOT NULL
);
CREATE INDEX validations_expiry ON {schema}.validations (expires_at);

-- The claims of deliveries in progress: a lease on the database's clock (`claimed_at`) and
-- the instance that holds it (`claim_owner`: a claim whose instance is gone is taken over
-- at once). UNLOGGED: a claim needs no durability (lost in a crash of the database, it is
-- taken again), so claiming writes no WAL. A callback's claim row also mirrors the statuses
-- acknowledged (`done`, written in the mark's transaction), so that a claim is refused for
-- an acknowledged status by the row's latest version, never by a stale snapshot; after a
-- crash empties the table, `callbacks` answers for what was acknowledged.
CREATE UNLOGGED TABLE {schema}.callback_claims (
    nonce_key   text PRIMARY KEY,
    done        integer[] NOT NULL,
    attempts    integer NOT NULL,
    claim_id    bigint,
    claim_owner integer,
    claimed_at  timestamptz,
    expires_at  timestamptz NOT NULL
);
CREATE INDEX callback_claims_expiry ON {schema}.callback_claims (expires_at);

CREATE UNLOGGED TABLE {schema}.validation_claims (
    nonce_key   text PRIMARY KEY,
    decided     boolean NOT NULL DEFAULT false,
    claim_id    bigint,
    claim_owner integer,
    claimed_at  timestamptz,
    expires_at  timestamptz NOT NULL
);
CREATE INDEX validation_claims_expiry ON {schema}.validation_claims (expires_at);

-- Callbacks whose handler failed, per (nonce, status), until that status is booked.
CREATE TABLE {schema}.callback_failures (
    nonce_key    text NOT NULL,
    status       integer NOT NULL,
    nonce        text NOT NULL,
    failures     integer NOT NULL,
    first_failed timestamptz NOT NULL,
    last_failed  timestamptz NOT NULL,
    last_reason  text NOT NULL,
    reference_id text NOT NULL,
    client_id    text NOT NULL,
    amount       text NOT NULL,
    currency     text NOT NULL,
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (nonce_key, status)
);
CREATE INDEX callback_failures_expiry ON {schema}.callback_failures (expires_at);

-- Postponed validations (Awaitable mode) and the outbox of their results: `deadline_at` is
-- set while undecided, `deliver_at` while a result awaits delivery; the instance posting it
-- holds a lease (`lease_owner`, `lease_until`), void as soon as that instance is gone.
CREATE TABLE {schema}.postponed (
    validation_id bigint PRIMARY KEY,
    nonce         text NOT NULL,
    record        jsonb NOT NULL,
    final         boolean NOT NULL,
    deadline_at   timestamptz,
    deliver_at    timestamptz,
    lease_owner   integer,
    lease_until   timestamptz,
    expires_at    timestamptz NOT NULL
);
CREATE INDEX postponed_deadline ON {schema}.postponed (deadline_at) WHERE deadline_at IS NOT NULL;
CREATE INDEX postponed_outbox ON {schema}.postponed (deliver_at) WHERE deliver_at IS NOT NULL;
CREATE INDEX postponed_expiry ON {schema}.postponed (expires_at) WHERE final;

-- The merchant's declared trees (key-value effects), written in the mark's transaction.
CREATE TABLE {schema}.trees (
    tree  text NOT NULL,
    key   bytea NOT NULL,
    value bytea NOT NULL,
    PRIMARY KEY (tree, key)
);

-- A key of the merchant's trees read in a callback's transaction, after locking it for the
-- rest of that transaction: two concurrent read-modify-writes of one key (one that exists
-- or one that does not yet) are serialised. A VOLATILE function's statements each take a
-- new snapshot, so the read sees what the lock's previous holder committed.
CREATE FUNCTION {schema}.locked_get(t text, k bytea) RETURNS bytea
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(t || '/' || encode(k, 'hex'), 7));
    RETURN (SELECT value FROM {schema}.trees WHERE tree = t AND key = k);
END
$$;
