-- The postponed validations that wait for a decision, read on their own: a review loop
-- lists them every few seconds, among the retention period's delivered ones (30 days by
-- default). Those awaiting delivery have `postponed_outbox`; final ones `postponed_expiry`.

CREATE INDEX postponed_pending ON {schema}.postponed (validation_id)
    WHERE NOT final AND deliver_at IS NULL;
