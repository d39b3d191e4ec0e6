-- A workspace's delivery events by time: the daily counts of `/email-stats`.
CREATE INDEX delivery_events_workspace_time ON delivery_events (workspace_id, occurred_at);
