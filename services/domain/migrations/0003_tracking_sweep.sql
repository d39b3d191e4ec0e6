-- The tracking sweep walks set-up tracking hosts, least recently checked first.
CREATE INDEX domains_tracking_due ON domains (tracking_checked_at)
    WHERE tracking_status <> 'not_started';
