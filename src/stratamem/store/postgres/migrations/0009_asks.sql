-- A turn that asks something: its text ends with a question mark, judged when it is stored
-- (recall lets a question another speaker answers give way to the answer). Searches used
-- to read the text's last character, which fetches a long turn's out-of-line text whole;
-- the messages stored before this version are judged here the same way (events are not
-- turns).
ALTER TABLE messages ADD COLUMN asks boolean NOT NULL DEFAULT false;
UPDATE messages SET asks = true
WHERE event_type IS NULL
  AND right(rtrim(content, E' \t\n\r'), 1) IN ('?', chr(65311));
