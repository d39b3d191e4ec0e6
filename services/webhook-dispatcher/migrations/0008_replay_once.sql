-- A replay adds no second pending delivery of a message to a target: a repeated replay
-- request (a retried call, a double click) queues only what is not already waiting. Such
-- duplicates waiting now are dropped first (one of each stays).
DELETE FROM attempts a USING attempts b
WHERE a.origin = 'replay' AND b.origin = 'replay'
  AND a.status = 'pending' AND b.status = 'pending'
  AND a.message_id = b.message_id
  AND COALESCE(a.endpoint_id, a.webhook_id) = COALESCE(b.endpoint_id, b.webhook_id)
  AND a.id > b.id;
CREATE UNIQUE INDEX attempts_replay_pending
    ON attempts (message_id, COALESCE(endpoint_id, webhook_id))
    WHERE origin = 'replay' AND status = 'pending';
