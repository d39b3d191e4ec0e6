-- A dispute the seller wins gives back what it took. A purchase counts what its reversals
-- actually took (credits, or nano-USD of usage money; less than its share when the rest was
-- spent) and numbers them, each its own ledger entry.
ALTER TABLE purchases ADD COLUMN reversed_units bigint NOT NULL DEFAULT 0;
ALTER TABLE purchases ADD COLUMN reversals integer NOT NULL DEFAULT 0;
ALTER TABLE stripe_reversals ADD COLUMN dispute_won boolean NOT NULL DEFAULT false;

UPDATE purchases p SET reversed_units = COALESCE((
    SELECT -SUM(l.delta) FROM ledger l
    WHERE l.api_key_id = p.api_key_id AND l.idempotency_key LIKE 'reversal:' || p.id || ':%'), 0)
WHERE p.reversed_amount > 0 AND p.kind = 'credits';
UPDATE purchases p SET reversed_units = COALESCE((
    SELECT -SUM(l.delta_nano) FROM usage_ledger l
    WHERE l.api_key_id = p.api_key_id AND l.idempotency_key LIKE 'reversal:' || p.id || ':%'), 0)
WHERE p.reversed_amount > 0 AND p.kind = 'usage';
