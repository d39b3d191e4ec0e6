-- A rotated-out signing secret keeps signing beside the new one until previous_secret_until
-- (Unix seconds), so receivers can switch over.
ALTER TABLE endpoints
    ADD COLUMN previous_secret_sealed bytea,
    ADD COLUMN previous_secret_until bigint;
