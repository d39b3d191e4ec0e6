-- Workspace webhooks (issue 21): delivery events, and inbound.received, for a whole
-- workspace. `events` lists the types wanted; empty: every type.
CREATE TABLE webhooks (
    id uuid PRIMARY KEY,
    workspace_id uuid NOT NULL,
    url text NOT NULL,
    events text[] NOT NULL,
    active boolean NOT NULL,
    -- Sealed under SECRETS_KEY for the webhook, as endpoints' are.
    secret_sealed bytea NOT NULL,
    previous_secret_sealed bytea,
    previous_secret_until bigint,
    failing_since bigint,
    created_at bigint NOT NULL,
    UNIQUE (workspace_id, url)
);

-- Delivery events the dispatcher was told of (DELIVERY): what their deliveries carry, and
-- what a replay sends again. `data` is the payload's `data`, as first rendered.
CREATE TABLE events (
    id uuid PRIMARY KEY,
    workspace_id uuid NOT NULL,
    type text NOT NULL,
    occurred_at bigint NOT NULL,
    data jsonb NOT NULL
);
CREATE INDEX events_by_workspace ON events (workspace_id, occurred_at);

-- An attempt's target is an endpoint, a webhook, or (neither) the workspace's default
-- webhook; `message_id` is the received message, or for origin 'event' the event.
ALTER TABLE attempts ADD COLUMN webhook_id uuid;
ALTER TABLE attempts DROP CONSTRAINT attempts_origin_check;
ALTER TABLE attempts ADD CONSTRAINT attempts_origin_check
    CHECK (origin IN ('inbound', 'event', 'replay'));
DROP INDEX attempts_once;
CREATE UNIQUE INDEX attempts_once
    ON attempts (message_id, COALESCE(endpoint_id, webhook_id, workspace_id))
    WHERE origin IN ('inbound', 'event');
CREATE INDEX attempts_of_webhook ON attempts (webhook_id, created_at DESC, id)
    WHERE webhook_id IS NOT NULL;
-- A webhook's replay of inbound.received reads its workspace's messages.
CREATE INDEX received_by_workspace ON received (workspace_id, received_at);
