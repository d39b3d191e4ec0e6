-- A send's log (its deliveries, their events, its tags, attachments and raw message) is
-- purged a retention period after the send ended waiting — released, cancelled, or set
-- aside as failed at its time — never while it waits; the task row stays, marked, since caps
-- and exclusions look back through it.
ALTER TABLE tasks ADD COLUMN log_purged boolean NOT NULL DEFAULT false;
CREATE INDEX tasks_log_expiry
    ON tasks ((coalesce(released_at, cancelled_at, CASE WHEN status = 'failed' THEN scheduled_at END)))
    WHERE NOT log_purged;
