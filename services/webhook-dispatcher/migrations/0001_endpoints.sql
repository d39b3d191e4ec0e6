-- Inbox webhook endpoints. Times are Unix seconds.
CREATE TABLE endpoints (
    id uuid PRIMARY KEY,
    workspace_id uuid NOT NULL,
    -- An inbox address of the workspace (the inbound service's).
    address_id uuid NOT NULL,
    url text NOT NULL,
    active boolean NOT NULL,
    body_format text NOT NULL CHECK (body_format IN ('text', 'html', 'markdown')),
    strip_quotes boolean NOT NULL,
    -- The signing secret (its decoded bytes), sealed under SECRETS_KEY for this endpoint.
    secret_sealed bytea NOT NULL,
    created_at bigint NOT NULL,
    UNIQUE (address_id, url)
);
CREATE INDEX endpoints_workspace ON endpoints (workspace_id, created_at, id);
