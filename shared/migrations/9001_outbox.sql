-- The transactional outbox (shared::jetstream::outbox): a message to publish, written in the
-- same transaction as the change it announces; the relay publishes it with Nats-Msg-Id = id
-- and marks it published. Kit migrations use versions from 9001 up, services below 9000.
CREATE TABLE outbox (
    id            uuid PRIMARY KEY,
    seq           bigserial NOT NULL UNIQUE,
    subject       text NOT NULL,
    payload       bytea NOT NULL,
    traceparent   text,
    request_id    text,
    created_at    bigint NOT NULL,
    published_at  bigint
);

CREATE INDEX outbox_waiting ON outbox (seq) WHERE published_at IS NULL;
CREATE INDEX outbox_published ON outbox (published_at) WHERE published_at IS NOT NULL;
