-- Money Stripe gave back to a buyer (a refund, a chargeback) takes back what it paid for.
-- A purchase knows its payment; what was given back of it so far, in cents.
ALTER TABLE purchases ADD COLUMN payment_intent text;
ALTER TABLE purchases ADD COLUMN reversed_amount bigint NOT NULL DEFAULT 0;
CREATE UNIQUE INDEX purchases_payment_intent ON purchases (payment_intent)
    WHERE payment_intent IS NOT NULL;

-- The most Stripe has said was given back of each payment, kept even before the payment's
-- purchase is known here (its webhook may come after the refund's).
CREATE TABLE stripe_reversals (
    payment_intent  text PRIMARY KEY,
    cents           bigint NOT NULL CHECK (cents >= 0),
    updated_at      bigint NOT NULL
);

ALTER TABLE ledger DROP CONSTRAINT ledger_kind_check;
ALTER TABLE ledger ADD CONSTRAINT ledger_kind_check
    CHECK (kind IN ('charge', 'refund', 'grant', 'void', 'reversal'));
