-- The recall log: one row per recall a face made (capture, the proxy, the REST context
-- routes), with the exact block injected (docs/recall.md#the-recall-log). It holds memory
-- text, so forget and erase_user delete a user's rows. Bounded: the engine prunes it to
-- recall_log_max_entries per project and recall_log_retention_hours. Times are epoch
-- seconds (bucketed by time for the latency chart).
CREATE TABLE recall_log (
    pk                INTEGER PRIMARY KEY,
    project_id        TEXT NOT NULL,
    user_id           TEXT NOT NULL,
    session_id        TEXT,
    source            TEXT NOT NULL CHECK (source IN ('capture', 'proxy', 'rest')),
    request           TEXT NOT NULL,
    query             TEXT,
    outcome           TEXT NOT NULL CHECK (outcome IN ('injected', 'none', 'skipped')),
    formatted_context TEXT NOT NULL DEFAULT '',
    hits              INTEGER NOT NULL DEFAULT 0,
    latency_ms        REAL NOT NULL,
    created_at        REAL NOT NULL
);
CREATE INDEX recall_log_by_time ON recall_log (project_id, created_at);
CREATE INDEX recall_log_by_user ON recall_log (project_id, user_id);
