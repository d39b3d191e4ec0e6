-- A send made with an Idempotency-Key header: the key, a digest of its body and the answer
-- it got, so a retry with the same key gets the same answer and sends nothing more, and the
-- same key with another body is refused. One key per workspace.
ALTER TABLE tasks
    ADD COLUMN idempotency_key text,
    ADD COLUMN request_digest bytea,
    ADD COLUMN answer jsonb;
CREATE UNIQUE INDEX tasks_idempotency ON tasks (workspace_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
