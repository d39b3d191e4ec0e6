-- Charge settlements owed to billing: the confirm of an accepted send's held charge, the
-- refund of a cancelled one. Written in the transaction that makes them owed, tried at once
-- and retried by a sweep until billing answers, so neither is lost to an outage or a crash.
CREATE TABLE settlements (
    task_id       uuid NOT NULL,
    action        text NOT NULL CHECK (action IN ('confirm', 'refund')),
    api_key_id    uuid NOT NULL,
    account_id    text NOT NULL,
    caller_email  text NOT NULL,
    cost          bigint NOT NULL,
    attempts      integer NOT NULL DEFAULT 0,
    next_at       bigint NOT NULL,
    done_at       bigint,
    outcome       text,
    PRIMARY KEY (task_id, action)
);
CREATE INDEX settlements_due ON settlements (next_at) WHERE done_at IS NULL;

-- Jobs accepted and not finished (neither sent nor failed), per workspace: what the plan's
-- quota counts beside the emails already sent, without scanning past tasks.
CREATE TABLE unfinished_jobs (
    job_id        uuid PRIMARY KEY,
    workspace_id  uuid NOT NULL,
    created_at    bigint NOT NULL
);
CREATE INDEX unfinished_jobs_workspace ON unfinished_jobs (workspace_id, created_at);
