-- Dead letters (shared::dead_letters): a stream message whose handling panicked or failed
-- MAX_DELIVER times, or that can never be decoded, kept aside with its payload so the
-- consumer goes on; an operator lists them and requeues one. A row counts a message's
-- failures (`count`) until it is dead (`dead_at`).
CREATE TABLE dead_letters (
    id           uuid PRIMARY KEY,
    stream       text NOT NULL,
    stream_seq   bigint NOT NULL,
    subject      text NOT NULL,
    payload      bytea NOT NULL,
    last_error   text NOT NULL,
    count        integer NOT NULL,
    created_at   bigint NOT NULL,
    dead_at      bigint,
    requeued_at  bigint,
    UNIQUE (stream, stream_seq)
);

CREATE INDEX dead_letters_dead ON dead_letters (dead_at) WHERE dead_at IS NOT NULL AND requeued_at IS NULL;
