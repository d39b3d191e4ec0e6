-- A held charge is refunded unless confirmed by `hold_until` (Unix seconds): NULL is final,
-- a positive time is held, -1 means the hold ran out and the charge was refunded.
ALTER TABLE ledger ADD COLUMN hold_until bigint;
CREATE INDEX ledger_holds ON ledger (hold_until) WHERE hold_until > 0;
