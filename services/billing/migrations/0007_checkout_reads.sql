-- When a reconcile last asked Stripe about the checkout's session: one is asked at most
-- every few seconds, however often a client reconciles.
ALTER TABLE checkouts ADD COLUMN asked_at bigint;
