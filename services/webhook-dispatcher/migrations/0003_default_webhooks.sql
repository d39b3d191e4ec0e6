-- A workspace's default inbox webhook: mail of addresses without an active endpoint.
CREATE TABLE default_webhooks (
    workspace_id uuid PRIMARY KEY,
    url text NOT NULL,
    body_format text NOT NULL CHECK (body_format IN ('text', 'html', 'markdown')),
    strip_quotes boolean NOT NULL,
    -- Sealed under SECRETS_KEY for the workspace; the previous one signs beside it until
    -- previous_secret_until (Unix seconds) after a rotation.
    secret_sealed bytea NOT NULL,
    previous_secret_sealed bytea,
    previous_secret_until bigint,
    created_at bigint NOT NULL,
    updated_at bigint NOT NULL
);
