-- The derived layers: facts (observations), summaries (propositions) and topics, with
-- provenance links down to messages, summary version history, and LLM token accounting.
-- observed_at is the time of the latest message an item rests on (when it was said).

CREATE TABLE facts (
    pk             INTEGER PRIMARY KEY,
    project_id     TEXT NOT NULL,
    id             TEXT NOT NULL,
    user_id        TEXT NOT NULL,
    text           TEXT NOT NULL,
    kind           TEXT NOT NULL,
    occurred_at    TEXT,
    observed_at    TEXT,
    valid_from     TEXT,
    valid_to       TEXT,
    confidence     REAL NOT NULL,
    status         TEXT NOT NULL DEFAULT 'active'
                   CHECK (status IN ('active', 'superseded', 'deleted')),
    superseded_by  TEXT,
    message_ids    TEXT NOT NULL,
    labels         TEXT NOT NULL DEFAULT '[]',
    model          TEXT NOT NULL,
    prompt_version TEXT NOT NULL,
    created_at     TEXT NOT NULL,
    UNIQUE (project_id, id)
);
CREATE INDEX facts_by_user ON facts (project_id, user_id, pk);

CREATE TABLE fact_sources (
    fact_pk    INTEGER NOT NULL,
    message_pk INTEGER NOT NULL,
    PRIMARY KEY (fact_pk, message_pk)
);
CREATE INDEX fact_sources_by_message ON fact_sources (message_pk);

CREATE TABLE summaries (
    pk             INTEGER PRIMARY KEY,
    project_id     TEXT NOT NULL,
    id             TEXT NOT NULL,
    user_id        TEXT NOT NULL,
    text           TEXT NOT NULL,
    status         TEXT NOT NULL DEFAULT 'active'
                   CHECK (status IN ('active', 'deprioritized', 'archived', 'deleted',
                                     'superseded')),
    observed_at    TEXT,
    valid_from     TEXT,
    valid_to       TEXT,
    confidence     REAL NOT NULL,
    labels         TEXT NOT NULL DEFAULT '[]',
    version        INTEGER NOT NULL DEFAULT 1,
    superseded_by  TEXT,
    fact_ids       TEXT NOT NULL DEFAULT '[]',
    message_ids    TEXT NOT NULL DEFAULT '[]',
    model          TEXT NOT NULL,
    prompt_version TEXT NOT NULL,
    created_at     TEXT NOT NULL,
    updated_at     TEXT NOT NULL,
    UNIQUE (project_id, id)
);
CREATE INDEX summaries_by_user ON summaries (project_id, user_id, status, pk);

-- One row per version of a summary: what it said, its status, and why it changed.
CREATE TABLE summary_history (
    pk         INTEGER PRIMARY KEY,
    summary_pk INTEGER NOT NULL,
    version    INTEGER NOT NULL,
    text       TEXT NOT NULL,
    status     TEXT NOT NULL,
    confidence REAL NOT NULL,
    fact_ids   TEXT NOT NULL,
    reason     TEXT NOT NULL,
    actor      TEXT NOT NULL,
    changed_at TEXT NOT NULL
);
CREATE INDEX summary_history_by_summary ON summary_history (summary_pk, version);

CREATE TABLE topics (
    pk          INTEGER PRIMARY KEY,
    project_id  TEXT NOT NULL,
    id          TEXT NOT NULL,
    user_id     TEXT NOT NULL,
    name        TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    status      TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'merged', 'deleted')),
    merged_into TEXT,
    created_at  TEXT NOT NULL,
    updated_at  TEXT NOT NULL,
    UNIQUE (project_id, id)
);
CREATE INDEX topics_by_user ON topics (project_id, user_id, status);

CREATE TABLE topic_summaries (
    topic_pk   INTEGER NOT NULL,
    summary_pk INTEGER NOT NULL,
    PRIMARY KEY (topic_pk, summary_pk)
);
CREATE INDEX topic_summaries_by_summary ON topic_summaries (summary_pk);

CREATE VIRTUAL TABLE facts_fts USING fts5 (
    body,
    scope,
    tokenize = 'porter unicode61 remove_diacritics 2'
);

CREATE VIRTUAL TABLE summaries_fts USING fts5 (
    body,
    scope,
    tokenize = 'porter unicode61 remove_diacritics 2'
);

CREATE TABLE llm_calls (
    pk                INTEGER PRIMARY KEY,
    project_id        TEXT NOT NULL,
    user_id           TEXT NOT NULL,
    stage             TEXT NOT NULL,
    model             TEXT NOT NULL,
    prompt_version    TEXT NOT NULL,
    prompt_tokens     INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    latency_ms        REAL NOT NULL,
    ok                INTEGER NOT NULL,
    created_at        REAL NOT NULL
);
CREATE INDEX llm_calls_by_project ON llm_calls (project_id, created_at);
