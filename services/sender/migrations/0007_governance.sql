-- Addresses a workspace must not mail (or not mail on a topic): `topic` '' means every
-- topic. Bounces and complaints block every email type; see sender::governance.
CREATE TABLE suppressions (
    workspace_id uuid NOT NULL,
    email_key    text NOT NULL,
    email        text NOT NULL,
    reason       text NOT NULL CHECK (reason IN ('unsubscribed', 'bounce', 'complaint', 'manual')),
    topic        text NOT NULL DEFAULT '',
    created_at   bigint NOT NULL,
    PRIMARY KEY (workspace_id, email_key, reason, topic)
);

-- Every accepted recipient of a send, by address: what frequency caps and topic exclusions
-- count. A cancelled task's rows go with it.
CREATE TABLE sends_to (
    workspace_id uuid NOT NULL,
    email_key    text NOT NULL,
    email_type   text NOT NULL,
    topic        text,
    task_id      uuid NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    sent_at      bigint NOT NULL
);
CREATE INDEX sends_to_address ON sends_to (workspace_id, email_key, sent_at);
CREATE INDEX sends_to_task ON sends_to (task_id);

-- One row per address a capped send has locked: two capped sends to one address take
-- turns, so both cannot pass a cap of 1.
CREATE TABLE address_gates (
    workspace_id uuid NOT NULL,
    email_key    text NOT NULL,
    PRIMARY KEY (workspace_id, email_key)
);

-- Recipients a send left out, with why (`suppressed:bounce`, `frequency_cap`, ...).
CREATE TABLE task_rejections (
    task_id uuid NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    idx     integer NOT NULL,
    email   text NOT NULL,
    reason  text NOT NULL,
    PRIMARY KEY (task_id, idx)
);
