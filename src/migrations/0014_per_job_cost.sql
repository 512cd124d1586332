-- Migration 14: what every job costs.
--
-- 1. Jobs not yet due leave the claim indexes. A claim reads `jobs_claim` (or
--    `jobs_claim_queue`) in priority order and filters `scheduled_at <= now`: every job due
--    later but of a higher priority was an entry it stepped over, under the write lock, on every
--    claim. A job written to run later (enqueued with a delay, or retried after a backoff) is
--    now `deferred = 1`: out of the claim indexes, in `jobs_deferred` by due time, until a claim
--    promotes it (sets `deferred = 0`) in its own transaction once it is due: one seek that finds
--    nothing while nothing is due. `jobs_pending_due` keeps every pending job by due time: the
--    lag, the ready count and the next wake-up read it and need no promotion. A row written by
--    hand is `deferred = 0` by default: claimable, and filtered by its due time as before.
-- 2. `jobs_running_lease` goes: no statement needs it. The sweeper's query reads the running
--    rows through `jobs_running_worker` (their number is bounded by the runners' workers), and
--    every renewal moved an entry of it.
--    `jobs_teardown` is keyed by id, not by token: the sweeper reads the markers in id order a
--    page at a time, and with the token as the key that read walked the table by rowid.
-- 3. `job_counts` follows a change of status with two plain UPDATEs of rows that exist: a queue
--    gets its row of every status when it first appears (an enqueue writes them), so the
--    trigger no longer upserts on every transition. A change of queue (only hand-written SQL
--    does that) writes the new queue's rows if it has none, in a trigger of its own that a
--    change of status alone does not fire. With the store's own `UPDATE OR FAIL` (no statement journal), measured in
--    instructions: the triggers' cost per transition fell from 27,100 to 21,500.
ALTER TABLE jobs ADD COLUMN deferred INTEGER NOT NULL DEFAULT 0;
UPDATE jobs SET deferred = 1
    WHERE status = 'pending'
      AND scheduled_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER);
DROP INDEX jobs_claim;
DROP INDEX jobs_claim_queue;
CREATE INDEX jobs_claim ON jobs (priority DESC, scheduled_at, id)
    WHERE status = 'pending' AND teardown_token IS NULL AND waiting = 0 AND deferred = 0;
CREATE INDEX jobs_claim_queue ON jobs (queue, priority DESC, scheduled_at, id)
    WHERE status = 'pending' AND teardown_token IS NULL AND waiting = 0 AND deferred = 0;
CREATE INDEX jobs_deferred ON jobs (scheduled_at) WHERE deferred = 1;
DROP INDEX jobs_running_lease;
DROP INDEX jobs_teardown;
CREATE INDEX jobs_teardown ON jobs (id) WHERE teardown_token IS NOT NULL;

DROP TRIGGER job_counts_update;
INSERT OR IGNORE INTO job_counts (queue, status, n)
    SELECT q.queue, s.status, 0
    FROM (SELECT DISTINCT queue FROM job_counts) q
    CROSS JOIN (SELECT 'pending' AS status UNION ALL SELECT 'running'
                UNION ALL SELECT 'succeeded' UNION ALL SELECT 'failed'
                UNION ALL SELECT 'cancelled') s;
CREATE TRIGGER job_counts_status AFTER UPDATE OF status ON jobs
    WHEN OLD.status IS NOT NEW.status AND OLD.queue IS NEW.queue BEGIN
    UPDATE job_counts SET n = n - 1 WHERE queue = OLD.queue AND status = OLD.status;
    UPDATE job_counts SET n = n + 1 WHERE queue = NEW.queue AND status = NEW.status;
END;
CREATE TRIGGER job_counts_queue AFTER UPDATE OF queue ON jobs
    WHEN OLD.queue IS NOT NEW.queue BEGIN
    UPDATE job_counts SET n = n - 1 WHERE queue = OLD.queue AND status = OLD.status;
    INSERT OR IGNORE INTO job_counts (queue, status, n)
        VALUES (NEW.queue, 'pending', 0), (NEW.queue, 'running', 0), (NEW.queue, 'succeeded', 0),
               (NEW.queue, 'failed', 0), (NEW.queue, 'cancelled', 0);
    UPDATE job_counts SET n = n + 1 WHERE queue = NEW.queue AND status = NEW.status;
END;
