-- Workflow events, workflows and their runs.

-- An event as reported, once per (workspace, event_id), forever.
CREATE TABLE workflow_events (
    workspace_id uuid NOT NULL,
    event_id     text NOT NULL,
    event_name   text NOT NULL,
    -- RFC 3339 as normalized to UTC, and as Unix seconds for comparisons.
    occurred_at  text NOT NULL,
    occurred_unix bigint NOT NULL,
    received_at  bigint NOT NULL,
    contact_id   uuid NOT NULL,
    -- The contact as the event named it: {external_contact_id, email}.
    contact      jsonb NOT NULL,
    properties   jsonb NOT NULL,
    -- Other top-level fields of the event, kept as given.
    extra        jsonb NOT NULL DEFAULT '{}',
    PRIMARY KEY (workspace_id, event_id)
);
CREATE INDEX workflow_events_received ON workflow_events (workspace_id, received_at);

CREATE TABLE workflows (
    id            uuid PRIMARY KEY,
    workspace_id  uuid NOT NULL,
    name          text NOT NULL,
    -- The current version; runs pin the one they started on.
    version       int NOT NULL,
    trigger_event text NOT NULL,
    created_at    bigint NOT NULL,
    updated_at    bigint NOT NULL,
    deleted_at    bigint
);
CREATE INDEX workflows_trigger ON workflows (workspace_id, trigger_event) WHERE deleted_at IS NULL;

CREATE TABLE workflow_versions (
    workflow_id uuid NOT NULL REFERENCES workflows (id),
    version     int NOT NULL,
    definition  jsonb NOT NULL,
    -- The events that end this version's runs (its exit rules' names).
    exit_events text[] NOT NULL,
    created_at  bigint NOT NULL,
    PRIMARY KEY (workflow_id, version)
);

-- A contact's way through one version of a workflow: `pc` is the step it is at (steps
-- compiled to a list), `next_at` when it may go on, `lease_until` who works on it now.
CREATE TABLE workflow_runs (
    id           uuid PRIMARY KEY,
    workspace_id uuid NOT NULL,
    workflow_id  uuid NOT NULL REFERENCES workflows (id),
    version      int NOT NULL,
    contact_id   uuid NOT NULL,
    event_id     text NOT NULL,
    -- Without reentry a contact has at most one active run of a workflow.
    single       boolean NOT NULL,
    status       text NOT NULL CHECK (status IN ('active', 'completed', 'exited', 'failed')),
    pc           int NOT NULL DEFAULT 0,
    next_at      bigint,
    lease_until  bigint,
    -- The pass that holds the lease; its writes check it.
    lease_token  uuid,
    attempts     int NOT NULL DEFAULT 0,
    started_at   bigint NOT NULL,
    ended_at     bigint,
    exit_reason  text,
    -- Who pays for its sends: the event's caller.
    account_id   uuid NOT NULL,
    billing_key  uuid NOT NULL,
    caller_email text NOT NULL,
    UNIQUE (workflow_id, event_id)
);
CREATE UNIQUE INDEX workflow_runs_single_active ON workflow_runs (workflow_id, contact_id)
    WHERE status = 'active' AND single;
CREATE INDEX workflow_runs_due ON workflow_runs (next_at) WHERE status = 'active';
CREATE INDEX workflow_runs_event ON workflow_runs (workspace_id, event_id);
CREATE INDEX workflow_runs_contact ON workflow_runs (workspace_id, contact_id) WHERE status = 'active';
CREATE INDEX workflow_runs_started ON workflow_runs (workspace_id, started_at);
