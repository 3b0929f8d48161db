-- A counter per user and kind of vector, bumped when that user's vectors are deleted
-- (forget, erase, the items' removal) or the store's embedder changes. A process that keeps
-- a user's vectors in memory (store/_vector_cache.py) reads only the rows past the last pk
-- it saw while the counter holds, and loads them all again once it moved.
CREATE TABLE vector_generations (
    project_id text NOT NULL,
    user_id    text NOT NULL,
    kind       text NOT NULL,
    generation bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (project_id, user_id, kind)
);
