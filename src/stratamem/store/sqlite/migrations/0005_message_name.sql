-- A message's speaker name (OpenAI's `name`): in a conversation between named people
-- ("Caroline", "Melanie") it says who said a turn, which recall needs to answer
-- "what did Caroline ...". The name is part of the embedded text but not of the full-text
-- body: within one user's memory a speaker's name is in half the turns, yet the index's
-- collection-wide statistics would score it as a rare, decisive word.
ALTER TABLE messages ADD COLUMN name TEXT;

-- The speakers of each user's messages, so recall can tell names in a query apart from
-- other words without scanning the user's messages.
CREATE TABLE speakers (
    project_id TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    name       TEXT NOT NULL,
    PRIMARY KEY (project_id, user_id, name)
) WITHOUT ROWID;
