-- When billing asked Stripe for the state a subscription row holds, in microseconds since the
-- epoch (0: from an event's own object). A read asked earlier and answered later than another
-- of the same subscription does not overwrite it: every change at Stripe sends an event, and
-- that event's read is asked after the change.
ALTER TABLE subscriptions ADD COLUMN asked_at bigint NOT NULL DEFAULT 0;
