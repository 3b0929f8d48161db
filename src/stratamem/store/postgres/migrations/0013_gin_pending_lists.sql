-- GIN indexes take new entries into a pending list (fastupdate) that every search scans
-- in full until it is merged, by (auto)vacuum or once it passes gin_pending_list_limit,
-- 4 MB by default. Searches of the full-text indexes read a pending list of 166 pages in a
-- LoCoMo load (2,496 entries; mem.search's full text 8.4 against 5.1 ms a search once
-- merged). A small limit makes the writer merge often, a few dozen rows at a time, so a
-- search scans at most 16 pages however autovacuum is set.
ALTER INDEX messages_fts_by_user SET (gin_pending_list_limit = 128);
ALTER INDEX facts_fts_by_user SET (gin_pending_list_limit = 128);
ALTER INDEX summaries_fts_by_user SET (gin_pending_list_limit = 128);
