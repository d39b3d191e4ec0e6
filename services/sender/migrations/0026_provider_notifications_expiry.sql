-- The notifications applied are forgotten with the message log (`EMAIL_RETENTION_DAYS`): by
-- then the deliveries they named are gone, and a notification delivered again matches none.
CREATE INDEX provider_notifications_received ON provider_notifications (received_at);
