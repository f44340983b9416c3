-- The records payhook keeps as JSON become `json` (the text as written, checked to be
-- JSON) instead of `jsonb`. A validation's record holds the request as received, its
-- free-form fields included, and `jsonb` refuses a string carrying U+0000 (`\u0000`),
-- which JSON allows and the aggregator may send there: such a postponed validation could
-- not be recorded, and was answered 503 on every attempt. payhook reads these columns as
-- text and never queries inside them, so nothing is lost with `jsonb`'s indexing.

ALTER TABLE {schema}.validations
    ALTER COLUMN fingerprint TYPE json USING fingerprint::json,
    ALTER COLUMN decision TYPE json USING decision::json;

ALTER TABLE {schema}.postponed
    ALTER COLUMN record TYPE json USING record::json;
