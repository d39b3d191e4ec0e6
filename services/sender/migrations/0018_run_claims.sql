-- Times a run was taken up without finishing its pass (the process working it stopped):
-- past a few, the run is failed instead of taken up forever.
ALTER TABLE workflow_runs ADD COLUMN claims integer NOT NULL DEFAULT 0;
