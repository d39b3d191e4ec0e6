-- A scheduled task whose release keeps failing is set aside as failed (and refunded) after
-- its tries, so it never holds up the tasks due after it.
ALTER TABLE tasks DROP CONSTRAINT tasks_status_check;
ALTER TABLE tasks ADD CONSTRAINT tasks_status_check
    CHECK (status IN ('scheduled', 'queued', 'cancelled', 'failed'));
ALTER TABLE tasks ADD COLUMN release_failures integer NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN last_error text;
