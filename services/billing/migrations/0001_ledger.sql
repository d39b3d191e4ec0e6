-- Credit balances per API key, changed only through the append-only ledger.
CREATE TABLE balances (
    api_key_id  uuid PRIMARY KEY,
    account_id  uuid NOT NULL,
    balance     bigint NOT NULL CHECK (balance >= 0),
    updated_at  bigint NOT NULL
);

-- One row per balance change. A charge has a negative delta; its refund points back at it.
CREATE TABLE ledger (
    id               uuid PRIMARY KEY,
    seq              bigserial NOT NULL UNIQUE,
    api_key_id       uuid NOT NULL,
    idempotency_key  text NOT NULL,
    kind             text NOT NULL CHECK (kind IN ('charge', 'refund', 'grant')),
    delta            bigint NOT NULL,
    created_at       bigint NOT NULL,
    caller_email     text NOT NULL,
    target_email     text,
    from_email       text,
    subject          text,
    send_mode        text,
    recipient_count  bigint,
    task_id          text,
    refund_of        uuid UNIQUE REFERENCES ledger (id),
    UNIQUE (api_key_id, idempotency_key)
);

-- The consumption log: charges and refunds of a key, newest first.
CREATE INDEX ledger_consumption ON ledger (api_key_id, seq DESC) WHERE kind <> 'grant';
