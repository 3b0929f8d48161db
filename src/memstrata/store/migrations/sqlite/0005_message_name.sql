-- A message's speaker name (OpenAI's `name`): in a conversation between named people
-- ("Caroline", "Melanie") it says who said a turn, which recall needs to answer
-- "what did Caroline ...". Indexed as part of the full-text body and the embedded text.
ALTER TABLE messages ADD COLUMN name TEXT;
