-- Saved audiences: a name and the definition ({include, exclude}) a send can name by id.
CREATE TABLE audiences (
    id           uuid PRIMARY KEY,
    workspace_id uuid NOT NULL,
    name         text NOT NULL,
    definition   jsonb NOT NULL,
    created_at   bigint NOT NULL
);
CREATE INDEX audiences_workspace ON audiences (workspace_id, id);

-- Campaigns: an audience frozen by the first send (frozen_at), and what its sends default to.
CREATE TABLE campaigns (
    id           uuid PRIMARY KEY,
    workspace_id uuid NOT NULL,
    key          text NOT NULL,
    name         text NOT NULL,
    -- The audience's definition as given ({include, exclude}).
    audience     jsonb NOT NULL,
    template_key text,
    topic        text,
    email_type   text,
    created_at   bigint NOT NULL,
    frozen_at    bigint,
    UNIQUE (workspace_id, key)
);

-- The frozen audience: the contacts the first send resolved, in order.
CREATE TABLE campaign_members (
    campaign_id uuid NOT NULL REFERENCES campaigns (id) ON DELETE CASCADE,
    contact_id  uuid NOT NULL,
    PRIMARY KEY (campaign_id, contact_id)
);
