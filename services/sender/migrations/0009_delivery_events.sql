-- What happened to each recipient's message after it was accepted: sent, delivered,
-- bounced, complained, rejected, delayed, unsubscribed. `source_key` makes an event recorded
-- twice (a provider notification redelivered, a page posted twice) one row.
CREATE TABLE delivery_events (
    id           uuid PRIMARY KEY,
    workspace_id uuid NOT NULL,
    task_id      uuid,
    delivery_id  uuid,
    email        text NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('sent', 'delivered', 'bounced', 'complained',
                                               'rejected', 'delayed', 'unsubscribed')),
    detail       jsonb NOT NULL DEFAULT '{}',
    occurred_at  bigint NOT NULL,
    source_key   text NOT NULL UNIQUE
);
CREATE INDEX delivery_events_delivery ON delivery_events (delivery_id, occurred_at)
    WHERE delivery_id IS NOT NULL;
-- Provider notifications find the delivery by the provider's message id.
CREATE INDEX deliveries_provider_id ON deliveries (provider_message_id)
    WHERE provider_message_id IS NOT NULL;
