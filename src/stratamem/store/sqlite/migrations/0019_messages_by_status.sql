-- stats() counts a project's messages by status (the dashboard's overview, `stratamem
-- stats`, the import's progress): without an index that read every row, and the status
-- column sits after the content, so every long message's overflow pages too (1.6 s of a
-- 2.1 s stats() at a million messages). PostgreSQL keeps long content out of the row
-- (TOAST), so its scan of the table reads small rows; it has no such index.
CREATE INDEX messages_by_status ON messages (project_id, status);
