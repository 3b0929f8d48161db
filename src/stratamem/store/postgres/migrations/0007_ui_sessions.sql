-- The dashboard's sign-ins (see the SQLite migration 0013): keyed by the SHA-256 of the
-- session's random token, never the token; times are epoch seconds.
CREATE TABLE ui_sessions (
    id_hash    text PRIMARY KEY,
    kind       text NOT NULL CHECK (kind IN ('key', 'admin')),
    key_id     text,
    project_id text,
    csrf_token text NOT NULL,
    created_at double precision NOT NULL,
    expires_at double precision NOT NULL,
    last_seen  double precision NOT NULL
);
CREATE INDEX ui_sessions_by_key ON ui_sessions (key_id);
CREATE INDEX ui_sessions_by_expiry ON ui_sessions (expires_at);
-- The dashboard's activity chart counts a project's messages accepted and processed per
-- minute of a recent window: without these it would read every message of the project.
CREATE INDEX messages_by_created ON messages (project_id, created_at);
CREATE INDEX messages_by_processed ON messages (project_id, processed_at);
