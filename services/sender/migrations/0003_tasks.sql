-- Send requests (`/send-email`): a task, its recipients (one SEND job each) and attachments.
-- The message is rendered once, at acceptance, and stored with the task, so a template
-- edited or deleted later changes nothing that was already accepted.
CREATE TABLE tasks (
    id                uuid PRIMARY KEY,
    workspace_id      uuid NOT NULL,
    api_key_id        uuid NOT NULL,
    account_id        text NOT NULL,
    status            text NOT NULL CHECK (status IN ('scheduled', 'queued', 'cancelled')),
    scheduled_at      bigint,
    -- Rendered content and headers: sender::send::TaskMessage as JSON.
    message           jsonb NOT NULL,
    email_type        text NOT NULL,
    topic             text,
    source_app        text,
    business_goal     text,
    recipient_reason  text,
    campaign_name     text,
    template_key      text,
    template_version  integer,
    test_send         boolean NOT NULL DEFAULT false,
    cost              bigint NOT NULL,
    recipient_count   integer NOT NULL,
    created_at        bigint NOT NULL,
    released_at       bigint,
    cancelled_at      bigint
);
CREATE INDEX tasks_due ON tasks (scheduled_at) WHERE status = 'scheduled';
CREATE INDEX tasks_workspace ON tasks (workspace_id, created_at);

CREATE TABLE task_recipients (
    task_id      uuid NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    idx          integer NOT NULL,
    email        text NOT NULL,
    external_id  text,
    -- The SEND job of this recipient (`deliveries.job_id` once claimed).
    job_id       uuid NOT NULL UNIQUE,
    PRIMARY KEY (task_id, idx)
);

CREATE TABLE task_attachments (
    task_id       uuid NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    idx           integer NOT NULL,
    filename      text NOT NULL,
    content_type  text NOT NULL,
    content       bytea NOT NULL,
    PRIMARY KEY (task_id, idx)
);

-- Templates of a workspace: each POST of a key adds its next version; a delete hides every version.
CREATE TABLE templates (
    workspace_id  uuid NOT NULL,
    key         text NOT NULL,
    version     integer NOT NULL,
    subject     text NOT NULL,
    html        text NOT NULL,
    text        text NOT NULL,
    created_at  bigint NOT NULL,
    deleted_at  bigint,
    PRIMARY KEY (workspace_id, key, version)
);

-- Deliveries learn who they were for and what the provider called them.
ALTER TABLE deliveries
    ADD COLUMN workspace_id uuid,
    ADD COLUMN task_id uuid,
    ADD COLUMN provider_message_id text;
CREATE INDEX deliveries_sent ON deliveries (workspace_id, updated_at) WHERE status = 'sent';
