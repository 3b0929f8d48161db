-- API keys belong to a project. Only a SHA-256 of the key is kept: keys are 32 random
-- bytes, so a fast hash is as strong as a slow one and verification costs one index seek.
CREATE TABLE api_keys (
    id           TEXT PRIMARY KEY,
    project_id   TEXT NOT NULL,
    name         TEXT,
    prefix       TEXT NOT NULL,
    hash         TEXT NOT NULL UNIQUE,
    created_at   TEXT NOT NULL,
    revoked_at   TEXT,
    last_used_at TEXT
);
CREATE INDEX api_keys_by_project ON api_keys (project_id);

-- Who changed or removed what, and why. Records name items by id and count what was
-- removed; they never copy the content, so erasing a user leaves no trace of what was said.
CREATE TABLE audit (
    pk         INTEGER PRIMARY KEY,
    project_id TEXT NOT NULL,
    user_id    TEXT,
    action     TEXT NOT NULL,
    target     TEXT,
    actor      TEXT NOT NULL,
    reason     TEXT,
    details    TEXT NOT NULL DEFAULT '{}',
    at         TEXT NOT NULL
);
CREATE INDEX audit_by_project ON audit (project_id, pk);
CREATE INDEX audit_by_user ON audit (project_id, user_id, pk);
