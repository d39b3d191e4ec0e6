-- Inbox addresses, their threads and their messages. Times are Unix seconds.

CREATE TABLE addresses (
    id uuid PRIMARY KEY,
    workspace_id uuid NOT NULL,
    -- Lower-cased, without a +tag.
    address text NOT NULL,
    created_at bigint NOT NULL,
    -- Set when deleted: no mail is accepted; its messages go once the retention passes.
    deleted_at bigint
);
-- Unique across the platform among live addresses; a deleted one frees its name.
CREATE UNIQUE INDEX addresses_live ON addresses (address) WHERE deleted_at IS NULL;
CREATE INDEX addresses_workspace ON addresses (workspace_id) WHERE deleted_at IS NULL;
CREATE INDEX addresses_deleted ON addresses (deleted_at) WHERE deleted_at IS NOT NULL;

CREATE TABLE threads (
    id uuid PRIMARY KEY,
    address_id uuid NOT NULL REFERENCES addresses ON DELETE CASCADE,
    workspace_id uuid NOT NULL,
    -- The subject of its first message, and its normalised form (no Re:/Fwd:/AW:, lower case).
    subject text NOT NULL,
    subject_key text NOT NULL,
    message_count integer NOT NULL DEFAULT 0,
    -- message_count when the thread was last read.
    read_count integer NOT NULL DEFAULT 0,
    unread boolean GENERATED ALWAYS AS (message_count > read_count) STORED,
    last_message_at bigint NOT NULL,
    -- Taken from thread_activity at each new message: orders threads by their latest
    -- message exactly, where seconds would tie.
    activity bigint NOT NULL,
    created_at bigint NOT NULL
);
CREATE SEQUENCE thread_activity;
CREATE INDEX threads_recent ON threads (workspace_id, activity DESC);
CREATE INDEX threads_of_address ON threads (address_id, activity DESC);
CREATE INDEX threads_by_subject ON threads (address_id, subject_key, last_message_at DESC);
-- The count of a workspace's unread threads reads this index alone.
CREATE INDEX threads_unread ON threads (workspace_id) WHERE unread;

CREATE TABLE messages (
    id uuid PRIMARY KEY,
    address_id uuid NOT NULL REFERENCES addresses ON DELETE CASCADE,
    thread_id uuid NOT NULL REFERENCES threads ON DELETE CASCADE,
    workspace_id uuid NOT NULL,
    -- 'mid:<Message-ID>', or 'sha256:<hex of the raw message>' without one: a message is
    -- stored once per inbox, whatever retries or races.
    dedup_key text NOT NULL,
    envelope_from text NOT NULL,
    envelope_to text[] NOT NULL,
    from_header text,
    to_header text[] NOT NULL,
    cc_header text[] NOT NULL,
    subject text NOT NULL,
    text_body text,
    html_body text,
    -- Without angle brackets.
    message_id text,
    in_reply_to text,
    refs text[] NOT NULL,
    -- [{filename, contentType, size}]
    attachments jsonb NOT NULL,
    authentication jsonb NOT NULL,
    -- False when mail-parser could not read the message: only the raw form is kept.
    parsed boolean NOT NULL,
    -- A text or HTML body over 1 MiB is not copied here: it is read from the raw message.
    bodies_in_raw boolean NOT NULL,
    size bigint NOT NULL,
    received_at bigint NOT NULL,
    UNIQUE (address_id, dedup_key)
);
CREATE INDEX messages_of_thread ON messages (thread_id, received_at, id);
CREATE INDEX messages_by_message_id ON messages (address_id, message_id) WHERE message_id IS NOT NULL;

-- The original MIME, apart from the rows listed and searched.
CREATE TABLE message_raw (
    message_id uuid PRIMARY KEY REFERENCES messages ON DELETE CASCADE,
    raw bytea NOT NULL
);
-- Out of line and uncompressed: a 10 MiB message is written as it came, without CPU spent
-- on compressing base64.
ALTER TABLE message_raw ALTER COLUMN raw SET STORAGE EXTERNAL;
