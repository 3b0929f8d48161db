-- Search: full text (FTS5) and per-item vectors. Existing messages are back-filled into
-- the full-text index by the Python step that runs after this file.

-- One row per message, rowid = messages.pk. `body` is the message text with CJK runs
-- expanded to character uni/bi-grams (unicode61 alone cannot segment CJK); `scope` holds
-- one token per (project, user) so a user's search intersects posting lists instead of
-- filtering every user's matches.
CREATE VIRTUAL TABLE messages_fts USING fts5 (
    body,
    scope,
    tokenize = 'porter unicode61 remove_diacritics 2'
);

CREATE TABLE vectors (
    pk         INTEGER PRIMARY KEY,
    project_id TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    kind       TEXT NOT NULL,
    item_pk    INTEGER NOT NULL,
    embedder   TEXT NOT NULL,
    dim        INTEGER NOT NULL,
    vec        BLOB NOT NULL,
    UNIQUE (kind, item_pk, embedder)
);
CREATE INDEX vectors_by_scope ON vectors (project_id, user_id, kind, embedder, pk);

-- Bumped whenever vectors of a scope are removed, so in-process indexes know to reload.
CREATE TABLE vector_generations (
    project_id TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    kind       TEXT NOT NULL,
    generation INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (project_id, user_id, kind)
);
