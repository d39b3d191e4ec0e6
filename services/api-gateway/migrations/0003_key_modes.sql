-- A key is live (sends and charges) or test (validates, prices, stores and shows, but
-- delivers and charges nothing); every key made before is live.
ALTER TABLE api_keys ADD COLUMN mode text NOT NULL DEFAULT 'live' CHECK (mode IN ('live', 'test'));
