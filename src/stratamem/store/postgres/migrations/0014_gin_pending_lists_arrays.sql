-- The array GIN indexes take the full-text indexes' small pending lists (0013): the read
-- of a user's standing items asks which summaries hold the newest 200 standing facts
-- (fact_ids &&), as does retiring a superseded summary's facts inside a batch's write,
-- and that scan read a pending list of 66 pages for a 100,000-message user (23 ms of a
-- 25 ms statement; 3 ms once merged); removals ask the message_ids indexes the same way
-- (facts_by_message_ids had 167 pages, 66,885 entries, pending after the load).
ALTER INDEX facts_by_message_ids SET (gin_pending_list_limit = 128);
ALTER INDEX summaries_by_fact_ids SET (gin_pending_list_limit = 128);
ALTER INDEX summaries_by_message_ids SET (gin_pending_list_limit = 128);
ALTER INDEX summary_history_by_fact_ids SET (gin_pending_list_limit = 128);
