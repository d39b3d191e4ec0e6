-- A checkout whose session was never opened (the payment processor was down and the caller
-- never retried with its key) is expired by billing's sweep a day on, when nothing can be
-- paid on it any more; its key then answers 409.
ALTER TABLE checkouts ADD COLUMN expired_at bigint;
CREATE INDEX checkouts_unopened ON checkouts (created_at) WHERE url IS NULL AND expired_at IS NULL;
