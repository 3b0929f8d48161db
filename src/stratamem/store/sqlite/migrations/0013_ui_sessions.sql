-- The dashboard's sign-ins: one row per browser session, keyed by the SHA-256 of its
-- random token (the token itself is never stored, so a copy of the database signs no one
-- in). kind 'key': signed in with a project's API key (key_id; revoking the key deletes
-- its rows); 'admin': the operator, project_id NULL until one is picked. Times are epoch
-- seconds; an expired row is never returned and is pruned later.
CREATE TABLE ui_sessions (
    id_hash    TEXT PRIMARY KEY,
    kind       TEXT NOT NULL CHECK (kind IN ('key', 'admin')),
    key_id     TEXT,
    project_id TEXT,
    csrf_token TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    last_seen  REAL NOT NULL
);
CREATE INDEX ui_sessions_by_key ON ui_sessions (key_id);
CREATE INDEX ui_sessions_by_expiry ON ui_sessions (expires_at);
-- The dashboard's activity chart counts a project's messages accepted and processed per
-- minute of a recent window: without these it would read every message of the project.
CREATE INDEX messages_by_created ON messages (project_id, created_at);
CREATE INDEX messages_by_processed ON messages (project_id, processed_at);
