-- A workspace's contacts: found by email (case-insensitively) or by the caller's own
-- external id. Attributes, tags and topic subscriptions are what audiences select on, each
-- with a GIN index so a condition is an index lookup, never a scan of the workspace.
CREATE TABLE contacts (
    id           uuid PRIMARY KEY,
    workspace_id uuid NOT NULL,
    email        text NOT NULL,
    -- lower(email): what "the same address" means.
    email_key    text NOT NULL,
    external_id  text,
    attributes   jsonb NOT NULL DEFAULT '{}',
    tags         text[] NOT NULL DEFAULT '{}',
    -- {topic: "subscribed" | "unsubscribed"}
    topics       jsonb NOT NULL DEFAULT '{}',
    created_at   bigint NOT NULL,
    updated_at   bigint NOT NULL
);
CREATE UNIQUE INDEX contacts_email ON contacts (workspace_id, email_key);
CREATE UNIQUE INDEX contacts_external_id ON contacts (workspace_id, external_id)
    WHERE external_id IS NOT NULL;
CREATE INDEX contacts_tags ON contacts USING gin (tags);
CREATE INDEX contacts_attributes ON contacts USING gin (attributes);
CREATE INDEX contacts_topics ON contacts USING gin (topics jsonb_path_ops);
