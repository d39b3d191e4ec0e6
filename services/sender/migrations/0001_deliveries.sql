-- One row per delivery job: makes redelivered jobs idempotent and keeps failures, with
-- their reason, once retries are exhausted.
CREATE TABLE deliveries (
    job_id      uuid PRIMARY KEY,
    kind        text NOT NULL,
    recipients  text[] NOT NULL,
    subject     text NOT NULL,
    status      text NOT NULL CHECK (status IN ('sending', 'sent', 'failed')),
    attempts    integer NOT NULL DEFAULT 1,
    last_error  text,
    created_at  bigint NOT NULL,
    updated_at  bigint NOT NULL
);
