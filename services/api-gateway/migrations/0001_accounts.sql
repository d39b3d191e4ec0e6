-- Accounts and their API keys. Keys are stored as a SHA-256 hash; the prefix is the
-- visible, indexed part used to find the row before the constant-time hash comparison.
CREATE TABLE accounts (
    id         uuid PRIMARY KEY,
    email      text NOT NULL UNIQUE,
    created_at bigint NOT NULL
);

CREATE TABLE api_keys (
    id           uuid PRIMARY KEY,
    account_id   uuid NOT NULL REFERENCES accounts (id),
    workspace_id uuid NOT NULL,
    prefix       text NOT NULL UNIQUE,
    hash         bytea NOT NULL,
    role         text NOT NULL DEFAULT 'member' CHECK (role IN ('member', 'admin')),
    created_at   bigint NOT NULL,
    revoked_at   bigint
);

CREATE INDEX api_keys_account ON api_keys (account_id);
