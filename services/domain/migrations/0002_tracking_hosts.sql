-- A domain's own tracking host: `track.<domain>`, a CNAME of TRACKING_HOST once verified.
ALTER TABLE domains
    ADD COLUMN tracking_status text NOT NULL DEFAULT 'not_started'
        CHECK (tracking_status IN ('not_started', 'pending', 'verified')),
    ADD COLUMN tracking_checked_at bigint;
