-- A turn that asks something: its text ends with a question mark, judged when it is stored
-- (recall lets a question another speaker answers give way to the answer). Searches used
-- to read the text's last character; the messages stored before this version are judged
-- here the same way (events are not turns).
ALTER TABLE messages ADD COLUMN asks INTEGER NOT NULL DEFAULT 0;
UPDATE messages SET asks = 1
WHERE event_type IS NULL
  AND substr(rtrim(content, ' ' || char(9) || char(10) || char(13)), -1) IN ('?', char(65311));
