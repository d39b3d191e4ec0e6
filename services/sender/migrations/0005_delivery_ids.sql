-- A delivery (one recipient's message) is not a queue job (up to 50 recipients): the
-- columns that hold delivery ids say so.
ALTER TABLE deliveries RENAME COLUMN job_id TO delivery_id;
ALTER TABLE task_recipients RENAME COLUMN job_id TO delivery_id;
ALTER TABLE unfinished_jobs RENAME COLUMN job_id TO delivery_id;
ALTER TABLE unfinished_jobs RENAME TO unfinished_deliveries;
ALTER INDEX unfinished_jobs_workspace RENAME TO unfinished_deliveries_workspace;
