-- When each user's memory was last forgotten (forget, erase_user: forgotten_at) and erased
-- (erase_user: erased_at), in epoch seconds of the store's clock. A writer that buffered
-- something of the user before then, in any process (a recall log record, a captured
-- exchange), checks it in the transaction that would write it and drops what began before
-- (store/_core/erasures.py). One row per such user; it holds no memory text.
CREATE TABLE erasures (
    project_id   TEXT NOT NULL,
    user_id      TEXT NOT NULL,
    forgotten_at REAL NOT NULL,
    erased_at    REAL,
    PRIMARY KEY (project_id, user_id)
);
