-- A raw message's MIME (`/send-raw`, the SMTP submission service), as its client wrote it
-- but for the fields taken out at acceptance; each recipient's delivery sends it as is.
CREATE TABLE task_mime (
    task_id  uuid PRIMARY KEY REFERENCES tasks (id) ON DELETE CASCADE,
    mime     bytea NOT NULL
);
