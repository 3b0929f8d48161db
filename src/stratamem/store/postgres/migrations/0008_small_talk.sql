-- A turn that is small talk as a whole ("Take care!", "Cool! What did it look like?"),
-- judged from its text when it is stored (pipeline.is_small_talk): recall counts it less.
-- Messages stored before this version are not judged (false).
ALTER TABLE messages ADD COLUMN small_talk boolean NOT NULL DEFAULT false;
