-- Which summaries hold each fact: the reverse of summaries.fact_ids, kept by triggers in the
-- transaction that writes the summary (PostgreSQL has a GIN index on fact_ids instead).
-- Retiring a superseded summary's facts asks whether another current summary still holds
-- them, and the read of a user's standing items asks which summaries hold them: without it
-- each ask parsed the fact_ids of every summary of the user, inside the batch's write
-- transaction (at a million messages, long enough for other writers' 30 s wait to run out).
CREATE TABLE summary_facts (
    project_id TEXT NOT NULL,
    fact_id    TEXT NOT NULL,
    summary_pk INTEGER NOT NULL,
    PRIMARY KEY (project_id, fact_id, summary_pk)
) WITHOUT ROWID;
CREATE INDEX summary_facts_by_summary ON summary_facts (summary_pk);
INSERT OR IGNORE INTO summary_facts (project_id, fact_id, summary_pk)
    SELECT s.project_id, j.value, s.pk FROM summaries s, json_each(s.fact_ids) j;
CREATE TRIGGER summary_facts_added AFTER INSERT ON summaries BEGIN
    INSERT OR IGNORE INTO summary_facts (project_id, fact_id, summary_pk)
        SELECT NEW.project_id, value, NEW.pk FROM json_each(NEW.fact_ids);
END;
CREATE TRIGGER summary_facts_changed AFTER UPDATE OF fact_ids ON summaries BEGIN
    DELETE FROM summary_facts WHERE summary_pk = OLD.pk;
    INSERT OR IGNORE INTO summary_facts (project_id, fact_id, summary_pk)
        SELECT NEW.project_id, value, NEW.pk FROM json_each(NEW.fact_ids);
END;
CREATE TRIGGER summary_facts_removed AFTER DELETE ON summaries BEGIN
    DELETE FROM summary_facts WHERE summary_pk = OLD.pk;
END;
