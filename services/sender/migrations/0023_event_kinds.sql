-- The tracking recorder asks, per delivery, when it was first sent and whether it was ever
-- opened: found by kind, however many clicks a delivery gathered.
CREATE INDEX delivery_events_delivery_kind ON delivery_events (delivery_id, kind, occurred_at)
    WHERE delivery_id IS NOT NULL;
