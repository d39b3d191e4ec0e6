-- SNS messages already applied, by SNS's MessageId: a redelivered notification changes
-- nothing.
CREATE TABLE provider_notifications (
    message_id  text PRIMARY KEY,
    received_at bigint NOT NULL
);
