-- Retries of a failed batch narrow down to the job that fails: a claim that takes a job
-- with a batch_cap takes at most that many jobs (half the failed batch; 1 after a job
-- failed alone). NULL: only batch_max_messages limits the batch.
ALTER TABLE jobs ADD COLUMN batch_cap INTEGER;
-- Services that processing needs (the LLM, a remote embedder) and that are down: while a
-- row exists no batch is claimed before next_probe, then one every retry_every (a probe),
-- until a probe ends otherwise than by an outage. Times are epoch seconds.
CREATE TABLE outages (
    service      TEXT PRIMARY KEY,
    since        REAL NOT NULL,
    failures     INTEGER NOT NULL,
    last_error   TEXT NOT NULL,
    last_failure REAL NOT NULL,
    retry_every  REAL NOT NULL,
    next_probe   REAL NOT NULL
);
