-- A send's log (its deliveries, their events, its tags, attachments and raw message) is
-- purged a retention period after the send was released or cancelled, never while it waits
-- for its time; the task row stays, marked, since caps and exclusions look back through it.
ALTER TABLE tasks ADD COLUMN log_purged boolean NOT NULL DEFAULT false;
CREATE INDEX tasks_log_expiry ON tasks ((coalesce(released_at, cancelled_at)))
    WHERE NOT log_purged;
