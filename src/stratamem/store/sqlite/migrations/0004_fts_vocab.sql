-- Term statistics of the full-text indexes (document frequency per term), read at query
-- time to leave out terms so common that ranking every match costs more than it tells.
CREATE VIRTUAL TABLE messages_fts_vocab USING fts5vocab (messages_fts, 'row');
CREATE VIRTUAL TABLE summaries_fts_vocab USING fts5vocab (summaries_fts, 'row');
