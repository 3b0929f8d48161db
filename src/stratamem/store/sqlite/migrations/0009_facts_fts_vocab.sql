-- Document frequencies of the facts' full-text index, as 0004 gave messages and summaries:
-- fact searches keep to the match budget too (SQLiteStore._plan_fulltext).
CREATE VIRTUAL TABLE facts_fts_vocab USING fts5vocab (facts_fts, 'row');
