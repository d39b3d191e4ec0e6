-- Sender domains: one row per domain name across the whole platform.
CREATE TABLE domains (
    id                   uuid PRIMARY KEY,
    workspace_id         uuid NOT NULL,
    name                 text NOT NULL,
    -- Published by the owner as TXT _postmesh.<name> to prove ownership.
    verification_token   text NOT NULL,
    ownership            text NOT NULL DEFAULT 'pending'
                         CHECK (ownership IN ('pending', 'verified', 'rejected')),
    inbound_status       text NOT NULL DEFAULT 'not_started'
                         CHECK (inbound_status IN ('not_started', 'pending', 'verified')),
    outbound_status      text NOT NULL DEFAULT 'not_started'
                         CHECK (outbound_status IN ('not_started', 'pending', 'verified', 'failed')),
    -- Easy DKIM tokens of the SES identity, once setup-outbound created it.
    dkim_tokens          text[] NOT NULL DEFAULT '{}',
    created_at           bigint NOT NULL,
    ownership_checked_at bigint NOT NULL DEFAULT 0,
    verified_at          bigint,
    reviewed_by          uuid,
    inbound_checked_at   bigint,
    outbound_checked_at  bigint
);

-- A name is unique across the platform, whatever its state.
CREATE UNIQUE INDEX domains_name ON domains (name);
CREATE INDEX domains_workspace ON domains (workspace_id, created_at);
-- The ownership sweep takes the pending domains checked longest ago.
CREATE INDEX domains_pending ON domains (ownership_checked_at) WHERE ownership = 'pending';

-- A workspace's DNS host token (apply-dns), sealed with SECRETS_KEY.
CREATE TABLE dns_providers (
    workspace_id uuid NOT NULL,
    provider     text NOT NULL,
    sealed_token bytea NOT NULL,
    updated_at   bigint NOT NULL,
    PRIMARY KEY (workspace_id, provider)
);
