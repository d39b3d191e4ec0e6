-- A refund that finds no charge leaves a 'void' entry holding the charge's idempotency key,
-- so a charge that arrives late (its caller already gave up on it) can never take credits.
ALTER TABLE ledger DROP CONSTRAINT ledger_kind_check;
ALTER TABLE ledger ADD CONSTRAINT ledger_kind_check
    CHECK (kind IN ('charge', 'refund', 'grant', 'void'));

-- The consumption log shows charges and refunds only.
DROP INDEX ledger_consumption;
CREATE INDEX ledger_consumption ON ledger (api_key_id, seq DESC)
    WHERE kind IN ('charge', 'refund');
