-- A session's messages in time order: recall looks up the turn before and after each
-- candidate with two index seeks, instead of ordering the whole session (a captured
-- session grows without bound).
CREATE INDEX messages_by_session_time ON messages (project_id, session_id, ts, pk);
