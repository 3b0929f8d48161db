-- Core rows: projects, sessions, messages and the durable job queue.
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE projects (
    id         TEXT PRIMARY KEY,
    name       TEXT NOT NULL,
    created_at TEXT NOT NULL
);

CREATE TABLE sessions (
    pk         INTEGER PRIMARY KEY,
    project_id TEXT NOT NULL,
    id         TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    title      TEXT,
    metadata   TEXT NOT NULL DEFAULT '{}',
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    UNIQUE (project_id, id)
);
CREATE INDEX sessions_by_user ON sessions (project_id, user_id);

-- pk is the acceptance order: per-user processing follows it.
CREATE TABLE messages (
    pk           INTEGER PRIMARY KEY,
    project_id   TEXT NOT NULL,
    id           TEXT NOT NULL,
    user_id      TEXT NOT NULL,
    session_id   TEXT NOT NULL,
    process_id   TEXT,
    role         TEXT NOT NULL,
    content      TEXT NOT NULL,
    content_hash TEXT NOT NULL,
    ts           TEXT NOT NULL,
    event_type   TEXT,
    page         TEXT,
    metadata     TEXT NOT NULL DEFAULT '{}',
    status       TEXT NOT NULL DEFAULT 'pending'
                 CHECK (status IN ('pending', 'processed', 'failed')),
    error        TEXT,
    attempts     INTEGER NOT NULL DEFAULT 0,
    job_id       INTEGER,
    created_at   TEXT NOT NULL,
    processed_at TEXT,
    UNIQUE (project_id, id)
);
CREATE INDEX messages_by_session ON messages (project_id, session_id, pk);
CREATE INDEX messages_by_user ON messages (project_id, user_id, pk);
CREATE INDEX messages_by_job ON messages (job_id);

CREATE TABLE jobs (
    id           INTEGER PRIMARY KEY,
    project_id   TEXT NOT NULL,
    user_id      TEXT NOT NULL,
    kind         TEXT NOT NULL,
    size         INTEGER NOT NULL DEFAULT 0,
    status       TEXT NOT NULL DEFAULT 'queued'
                 CHECK (status IN ('queued', 'running', 'done', 'failed')),
    attempts     INTEGER NOT NULL DEFAULT 0,
    run_after    REAL NOT NULL,
    locked_by    TEXT,
    lease_until  REAL,
    last_error   TEXT,
    created_at   REAL NOT NULL,
    finished_at  REAL
);
CREATE INDEX jobs_ready ON jobs (status, run_after, id);
CREATE INDEX jobs_by_user ON jobs (project_id, user_id, status, id);
