-- Per-user indexes (see _pg_user_indexes.py): which users have an HNSW index of their own
-- for one kind and dimension of vectors, or a full-text index of their own for one table.
-- Built in the background with CREATE INDEX CONCURRENTLY under an advisory lock on the
-- index's name; a 'building' row whose builder died is taken over by the next one.
CREATE TABLE user_indexes (
    name text PRIMARY KEY,
    project_id text NOT NULL,
    user_id text NOT NULL,
    target text NOT NULL,  -- 'vectors:<kind>:<dim>' or '<table>:fts'
    state text NOT NULL CHECK (state IN ('building', 'ready')),
    rows_at_build bigint NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (project_id, user_id, target)
);
