-- When the scheduler queues a pending attempt (again), in Unix seconds: its retry's time, a
-- busy target's short pause, or, for an attempt whose job was just queued (the default),
-- five minutes on: still pending and unleased by then, its job was lost. Retries wait here,
-- not as delayed NAKs in the WEBHOOK consumer, so a failing or stalled target's backlog
-- holds nothing there that other targets' jobs would wait behind.
ALTER TABLE attempts
    ADD COLUMN requeue_at bigint NOT NULL DEFAULT (extract(epoch FROM now())::bigint + 300);
DROP INDEX attempts_pending;
CREATE INDEX attempts_due ON attempts (requeue_at) WHERE status = 'pending';
