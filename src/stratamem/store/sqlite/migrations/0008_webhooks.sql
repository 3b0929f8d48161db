-- Webhooks: per-project HTTP targets called at the write pipeline's hook points
-- (docs/webhooks.md).
-- pk is the creation order, which is the order hooks on one point run in. The secret signs
-- deliveries (HMAC), so it is kept as it was issued; no read path returns it.
CREATE TABLE webhooks (
    pk          INTEGER PRIMARY KEY,
    id          TEXT NOT NULL UNIQUE,
    project_id  TEXT NOT NULL,
    name        TEXT NOT NULL,
    resource    TEXT NOT NULL,
    event       TEXT NOT NULL,
    mode        TEXT NOT NULL CHECK (mode IN ('sync', 'async')),
    target_url  TEXT NOT NULL,
    secret      TEXT NOT NULL,
    enabled     INTEGER NOT NULL DEFAULT 1,
    timeout_ms  INTEGER NOT NULL,
    created_at  TEXT NOT NULL,
    updated_at  TEXT NOT NULL
);
CREATE INDEX webhooks_by_project ON webhooks (project_id, pk);

-- One row per delivery attempt. Request and response are excerpts (the request holds user
-- content): user_id and message_ids let forget/erase remove them with the messages.
CREATE TABLE webhook_deliveries (
    pk          INTEGER PRIMARY KEY,
    id          TEXT NOT NULL,
    hook_pk     INTEGER NOT NULL REFERENCES webhooks (pk) ON DELETE CASCADE,
    project_id  TEXT NOT NULL,
    user_id     TEXT,
    message_ids TEXT NOT NULL DEFAULT '[]',
    resource    TEXT NOT NULL,
    event       TEXT NOT NULL,
    mode        TEXT NOT NULL,
    attempt     INTEGER NOT NULL DEFAULT 1,
    status      TEXT NOT NULL CHECK (status IN ('delivered', 'failed', 'retrying')),
    http_status INTEGER,
    latency_ms  REAL NOT NULL DEFAULT 0,
    reason      TEXT NOT NULL DEFAULT '',
    request     TEXT NOT NULL DEFAULT '',
    response    TEXT NOT NULL DEFAULT '',
    at          TEXT NOT NULL
);
CREATE INDEX webhook_deliveries_by_hook ON webhook_deliveries (hook_pk, pk);
CREATE INDEX webhook_deliveries_by_user ON webhook_deliveries (project_id, user_id);

-- Async deliveries, written in the transaction that completes the batch which triggered
-- them (a batch that fails and is retried sends nothing twice). A sender claims a row under
-- a lease; a row whose holder died is claimed again once the lease has run out.
CREATE TABLE webhook_outbox (
    pk           INTEGER PRIMARY KEY,
    delivery_id  TEXT NOT NULL UNIQUE,
    hook_pk      INTEGER NOT NULL REFERENCES webhooks (pk) ON DELETE CASCADE,
    project_id   TEXT NOT NULL,
    user_id      TEXT,
    message_ids  TEXT NOT NULL DEFAULT '[]',
    payload      TEXT NOT NULL,
    status       TEXT NOT NULL DEFAULT 'queued'
                 CHECK (status IN ('queued', 'running', 'failed')),
    attempts     INTEGER NOT NULL DEFAULT 0,
    run_after    REAL NOT NULL,
    lease_owner  TEXT,
    lease_until  REAL,
    last_error   TEXT,
    created_at   TEXT NOT NULL
);
CREATE INDEX webhook_outbox_due ON webhook_outbox (status, run_after);
CREATE INDEX webhook_outbox_by_user ON webhook_outbox (project_id, user_id);
