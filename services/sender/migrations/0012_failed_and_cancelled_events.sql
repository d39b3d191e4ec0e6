-- Two more delivery event kinds: `failed` (our side gave up on the message for good) and
-- `cancelled` (a scheduled send was cancelled before it went out).
ALTER TABLE delivery_events DROP CONSTRAINT delivery_events_kind_check;
ALTER TABLE delivery_events ADD CONSTRAINT delivery_events_kind_check
    CHECK (kind IN ('sent', 'delivered', 'bounced', 'complained', 'rejected', 'delayed',
                    'unsubscribed', 'failed', 'cancelled'));
