-- Full-text searches are always scoped to one user. A GIN index over (user_id, fts)
-- intersects a term's rows with the user's inside the index (btree_gin gives the text
-- column a GIN operator class), so a search does not fetch other users' rows from the
-- heap: with a user a twentieth of a large table, that was most of its cost. project_id
-- stays out: a project's one posting list spans the whole table, and decoding it cost
-- more than it saved (the project is checked on the rows). A multicolumn GIN index serves
-- conditions on any of its columns, so the unscoped document-frequency counts use it too
-- and the fts-only indexes go.
--
-- On an existing database this builds three indexes inside the migration's transaction:
-- writes to these tables wait until it commits (about 20 s per million rows measured).
CREATE EXTENSION IF NOT EXISTS btree_gin;

CREATE INDEX messages_fts_by_user ON messages USING gin (user_id, fts);
DROP INDEX messages_fts;
CREATE INDEX facts_fts_by_user ON facts USING gin (user_id, fts);
DROP INDEX facts_fts;
CREATE INDEX summaries_fts_by_user ON summaries USING gin (user_id, fts);
DROP INDEX summaries_fts;
