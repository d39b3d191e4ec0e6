-- A refund and a dispute of one payment are told apart: each kind keeps the most Stripe has
-- said of it, and what went back is their sum (at most what was paid), so a partial refund
-- followed by a dispute of the rest takes back the whole.
ALTER TABLE stripe_reversals RENAME COLUMN cents TO refunded;
ALTER TABLE stripe_reversals ADD COLUMN disputed bigint NOT NULL DEFAULT 0 CHECK (disputed >= 0);
