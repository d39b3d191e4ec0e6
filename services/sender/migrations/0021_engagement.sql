-- Engagement: a send's tags and metadata, the message log (one row per delivery with its
-- latest state and its people's opens and clicks), and open and click tracking.
ALTER TABLE tasks
    ADD COLUMN tags jsonb NOT NULL DEFAULT '[]',
    ADD COLUMN metadata jsonb NOT NULL DEFAULT '{}';

-- A tag as `name:value`, once per task, for the log's tag filter (newest first by index).
CREATE TABLE task_tags (
    workspace_id uuid NOT NULL,
    tag          text NOT NULL,
    created_at   bigint NOT NULL,
    task_id      uuid NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    PRIMARY KEY (workspace_id, tag, created_at, task_id)
);
CREATE INDEX task_tags_task ON task_tags (task_id);

ALTER TABLE task_recipients
    ADD COLUMN workspace_id uuid,
    ADD COLUMN created_at bigint,
    ADD COLUMN status text NOT NULL DEFAULT 'queued',
    ADD COLUMN opens integer NOT NULL DEFAULT 0,
    ADD COLUMN clicks integer NOT NULL DEFAULT 0;
UPDATE task_recipients r SET workspace_id = t.workspace_id, created_at = t.created_at,
    status = CASE WHEN t.status = 'scheduled' THEN 'scheduled' ELSE 'queued' END
FROM tasks t WHERE t.id = r.task_id;
ALTER TABLE task_recipients
    ALTER COLUMN workspace_id SET NOT NULL,
    ALTER COLUMN created_at SET NOT NULL;
CREATE INDEX task_recipients_log ON task_recipients (workspace_id, created_at DESC, delivery_id DESC);
CREATE INDEX task_recipients_log_to ON task_recipients (workspace_id, lower(email), created_at DESC);
CREATE INDEX task_recipients_log_status ON task_recipients (workspace_id, status, created_at DESC);

-- How far along a delivery's state is: a later event of a lower rank (a `sent` reported
-- after `delivered`) does not move it back.
CREATE FUNCTION log_rank(kind text) RETURNS integer LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE kind
        WHEN 'scheduled' THEN 0 WHEN 'queued' THEN 0 WHEN 'sent' THEN 1 WHEN 'delayed' THEN 2
        WHEN 'delivered' THEN 3 WHEN 'unsubscribed' THEN 3 ELSE 4 END
$$;

-- A workspace's tracking defaults; without a row both are off.
CREATE TABLE tracking_settings (
    workspace_id uuid PRIMARY KEY,
    opens        boolean NOT NULL,
    clicks       boolean NOT NULL,
    updated_at   bigint NOT NULL
);

ALTER TABLE delivery_events DROP CONSTRAINT delivery_events_kind_check;
ALTER TABLE delivery_events ADD CONSTRAINT delivery_events_kind_check
    CHECK (kind IN ('sent', 'delivered', 'bounced', 'complained', 'rejected', 'delayed',
                    'unsubscribed', 'failed', 'cancelled', 'opened', 'clicked'));
