-- A send made with a test key: stored and shown like any other, but no message reaches a
-- transport (each is recorded sent and delivered at once) and nothing is charged.
ALTER TABLE tasks ADD COLUMN test_mode boolean NOT NULL DEFAULT false;
-- A run started by a test key's event sends as that key would.
ALTER TABLE workflow_runs ADD COLUMN test_mode boolean NOT NULL DEFAULT false;
