-- Standing instructions and preferences (docs/recall.md#standing-instructions): a fact the
-- user meant to hold for later requests, with what it applies to (scope; NULL: every
-- request), and the summaries made of such facts. Facts stored before this version are
-- not standing. The partial indexes serve the read of a user's standing items, which
-- every get_memory makes.
ALTER TABLE facts ADD COLUMN standing boolean NOT NULL DEFAULT false;
ALTER TABLE facts ADD COLUMN scope text;
ALTER TABLE summaries ADD COLUMN standing boolean NOT NULL DEFAULT false;
CREATE INDEX facts_standing ON facts (project_id, user_id, pk) WHERE standing;
CREATE INDEX summaries_standing ON summaries (project_id, user_id, pk) WHERE standing;
