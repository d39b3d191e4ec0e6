-- The catalog: packs and plans loaded from the catalog file at start. Rows are never deleted
-- (purchases and subscriptions point at them); a row missing from the file is unavailable.
CREATE TABLE packs (
    id         text PRIMARY KEY,
    name       text NOT NULL,
    credits    bigint NOT NULL CHECK (credits >= 0),
    amount     bigint NOT NULL CHECK (amount > 0),
    currency   text NOT NULL,
    kind       text NOT NULL CHECK (kind IN ('credits', 'usage')),
    position   integer NOT NULL,
    available  boolean NOT NULL
);

CREATE TABLE plans (
    id               text PRIMARY KEY,
    name             text NOT NULL,
    mailboxes        bigint NOT NULL CHECK (mailboxes >= 0),
    custom_domains   bigint NOT NULL CHECK (custom_domains >= 0),
    monthly_emails   bigint NOT NULL CHECK (monthly_emails >= 0),
    stripe_price_id  text NOT NULL UNIQUE,
    position         integer NOT NULL,
    available        boolean NOT NULL
);

-- One row per hosted checkout, top-up or plan: the caller's idempotency key, the request it
-- stands for, and the Stripe Checkout Session once created. `creating_until` leases the
-- session's creation to one request (Unix seconds; NULL once the session exists).
CREATE TABLE checkouts (
    id               uuid PRIMARY KEY,
    api_key_id       uuid NOT NULL,
    idempotency_key  text NOT NULL,
    request          text NOT NULL,
    session_id       text UNIQUE,
    url              text,
    creating_until   bigint,
    created_at       bigint NOT NULL,
    UNIQUE (api_key_id, idempotency_key)
);

-- Credit and usage top-ups. What was bought is copied from the pack, so history never changes.
CREATE TABLE purchases (
    id           uuid PRIMARY KEY REFERENCES checkouts (id),
    api_key_id   uuid NOT NULL,
    account_id   uuid NOT NULL,
    email        text NOT NULL,
    pack_id      text REFERENCES packs (id),
    pack_name    text NOT NULL,
    credits      bigint NOT NULL,
    amount       bigint NOT NULL,
    currency     text NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('credits', 'usage')),
    status       text NOT NULL CHECK (status IN ('pending', 'paid', 'expired', 'failed')),
    created_at   bigint NOT NULL,
    paid_at      bigint
);
CREATE INDEX purchases_latest ON purchases (api_key_id, created_at DESC, id DESC);

-- Plan checkouts of a workspace.
CREATE TABLE subscription_checkouts (
    id            uuid PRIMARY KEY REFERENCES checkouts (id),
    workspace_id  uuid NOT NULL,
    plan_id       text NOT NULL REFERENCES plans (id),
    status        text NOT NULL CHECK (status IN ('pending', 'complete', 'expired')),
    created_at    bigint NOT NULL
);

-- Stripe subscriptions as Stripe last reported them.
CREATE TABLE subscriptions (
    id                    text PRIMARY KEY,
    workspace_id          uuid NOT NULL,
    customer_id           text NOT NULL,
    plan_id               text REFERENCES plans (id),
    status                text NOT NULL,
    period_start          bigint NOT NULL,
    period_end            bigint NOT NULL,
    cancel_at_period_end  boolean NOT NULL,
    created_at            bigint NOT NULL,
    updated_at            bigint NOT NULL
);
CREATE INDEX subscriptions_by_workspace ON subscriptions (workspace_id, created_at DESC);

-- Stripe events already applied, by event id: a redelivered event changes nothing.
CREATE TABLE stripe_events (
    id           text PRIMARY KEY,
    type         text NOT NULL,
    received_at  bigint NOT NULL
);

-- Usage balances in nano-USD (1 cent = 10^7 nano), changed only through their own ledger.
CREATE TABLE usage_balances (
    api_key_id    uuid PRIMARY KEY,
    balance_nano  bigint NOT NULL CHECK (balance_nano >= 0),
    updated_at    bigint NOT NULL
);

CREATE TABLE usage_ledger (
    id               uuid PRIMARY KEY,
    api_key_id       uuid NOT NULL,
    idempotency_key  text NOT NULL,
    delta_nano       bigint NOT NULL,
    created_at       bigint NOT NULL,
    UNIQUE (api_key_id, idempotency_key)
);
