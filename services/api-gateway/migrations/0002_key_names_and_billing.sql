-- Keys of one account bill to one balance: the account's primary key (its first). A key
-- made before this migration keeps its own balance (billing_key_id = its id), so no credits
-- move. Keys get a name, shown in the web app and by `postmesh whoami`.
ALTER TABLE api_keys ADD COLUMN name text NOT NULL DEFAULT '';
ALTER TABLE api_keys ADD COLUMN billing_key_id uuid;
UPDATE api_keys SET billing_key_id = id;
ALTER TABLE api_keys ALTER COLUMN billing_key_id SET NOT NULL;

ALTER TABLE accounts ADD COLUMN primary_key_id uuid;
UPDATE accounts a SET primary_key_id = (
    SELECT k.id FROM api_keys k WHERE k.account_id = a.id ORDER BY k.created_at, k.id LIMIT 1
);

-- Sign-in finds an account by its address without regard to case.
CREATE INDEX accounts_email_lower ON accounts (lower(email));
