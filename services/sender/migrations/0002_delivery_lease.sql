-- The worker delivering a job holds a lease on it and renews it with its JetStream
-- heartbeats; a redelivery that finds a live lease (the holder's heartbeats to NATS stalled
-- but it is still at work) waits for the lease instead of sending the message again.
ALTER TABLE deliveries
    ADD COLUMN lease_owner uuid,
    ADD COLUMN leased_until_ms bigint NOT NULL DEFAULT 0;
