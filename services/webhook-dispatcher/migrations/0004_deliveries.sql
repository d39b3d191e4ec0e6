-- Received messages the dispatcher was told of (INBOUND), so a replay knows what came in.
CREATE TABLE received (
    message_id uuid PRIMARY KEY,
    workspace_id uuid NOT NULL,
    address_id uuid NOT NULL,
    received_at bigint NOT NULL
);
CREATE INDEX received_by_address ON received (address_id, received_at);

-- One delivery of one message to one endpoint (or, with no endpoint_id, to the workspace's
-- default webhook): its id is the webhook-id, stable across retries. Times are Unix seconds
-- except the lease, in milliseconds of the database clock.
CREATE TABLE attempts (
    id uuid PRIMARY KEY,
    workspace_id uuid NOT NULL,
    endpoint_id uuid REFERENCES endpoints ON DELETE CASCADE,
    message_id uuid NOT NULL,
    -- 'inbound' (the fan-out of a received message) or 'replay'.
    origin text NOT NULL CHECK (origin IN ('inbound', 'replay')),
    status text NOT NULL CHECK (status IN ('pending', 'succeeded', 'failed')),
    attempt_count integer NOT NULL DEFAULT 0,
    last_status_code integer,
    last_error text,
    next_attempt_at bigint,
    created_at bigint NOT NULL,
    updated_at bigint NOT NULL,
    lease_owner uuid,
    leased_until_ms bigint NOT NULL DEFAULT 0
);
-- A received message fans out once per target, whatever redeliveries of INBOUND; the
-- fan-out finds a message's attempts by it.
CREATE UNIQUE INDEX attempts_once ON attempts (message_id, COALESCE(endpoint_id, workspace_id))
    WHERE origin = 'inbound';
CREATE INDEX attempts_of_endpoint ON attempts (endpoint_id, created_at DESC, id);
-- The sweep's work: pending attempts whose job may have been lost.
CREATE INDEX attempts_pending ON attempts (next_attempt_at) WHERE status = 'pending';

-- Since when every delivery to a target has failed (NULL: the last one succeeded).
ALTER TABLE endpoints ADD COLUMN failing_since bigint;
ALTER TABLE default_webhooks
    ADD COLUMN active boolean NOT NULL DEFAULT true,
    ADD COLUMN failing_since bigint;
-- Room on each page, so an attempt's claim (no indexed column changes) is a HOT update.
ALTER TABLE attempts SET (fillfactor = 50);
