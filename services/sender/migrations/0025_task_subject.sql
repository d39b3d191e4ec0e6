-- A send's subject beside its message: the log shows it on every row, and reading it out of
-- `message` (which holds the whole HTML) unpacked that value once a row.
ALTER TABLE tasks ADD COLUMN subject text GENERATED ALWAYS AS (message->>'subject') STORED;
