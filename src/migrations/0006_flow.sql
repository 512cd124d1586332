-- Migration 6: flow control. Queue limits and pauses stored in the file, so that they hold
-- across every runner and process on it, and dependencies between jobs.

-- One row per queue that has a setting; a queue without a row has no limit and is not paused.
CREATE TABLE queues (
    name         TEXT    PRIMARY KEY,
    -- At most this many of the queue's jobs run at once, over every runner; NULL: no limit.
    max_running  INTEGER CHECK (max_running IS NULL OR max_running >= 0),
    -- 1: the queue's jobs are not claimed (running ones finish).
    paused       INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1))
);

-- A job's dependencies: it runs only after every `after_id` succeeded. Rows stay after they
-- are satisfied, so that a job still shows what it waited for. `after_id` is no foreign key:
-- a finished dependency may be pruned before its dependent.
CREATE TABLE job_deps (
    job_id    INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    after_id  INTEGER NOT NULL,
    PRIMARY KEY (job_id, after_id)
) WITHOUT ROWID;
-- The dependents of a job that just ended.
CREATE INDEX job_deps_after ON job_deps (after_id, job_id);

-- How many of a pending job's dependencies have not succeeded yet. A waiting job (waiting > 0)
-- is pending but left out of the claim indexes, so it never slows a claim.
ALTER TABLE jobs ADD COLUMN waiting INTEGER NOT NULL DEFAULT 0;

DROP INDEX jobs_claim;
DROP INDEX jobs_claim_queue;
CREATE INDEX jobs_claim ON jobs (priority DESC, scheduled_at, id)
    WHERE status = 'pending' AND teardown_token IS NULL AND waiting = 0;
CREATE INDEX jobs_claim_queue ON jobs (queue, priority DESC, scheduled_at, id)
    WHERE status = 'pending' AND teardown_token IS NULL AND waiting = 0;
-- The queue lag of the metrics is the oldest *ready* job: a waiting one is not.
DROP INDEX jobs_pending_due;
CREATE INDEX jobs_pending_due ON jobs (queue, scheduled_at)
    WHERE status = 'pending' AND teardown_token IS NULL AND waiting = 0;
