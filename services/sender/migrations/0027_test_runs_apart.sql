-- A test key's runs and a live key's runs of one workflow and contact stand apart: a test
-- run never keeps a live one from starting (nor the other way round).
DROP INDEX workflow_runs_single_active;
CREATE UNIQUE INDEX workflow_runs_single_active ON workflow_runs (workflow_id, contact_id, test_mode)
    WHERE status = 'active' AND single;
