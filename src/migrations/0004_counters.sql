-- Migration 3: durable metrics. Counters and histograms of transitions, updated in the
-- transaction of the transition they count (never recomputed from job_events, so pruning
-- never lowers them), and the count of jobs by queue and status, kept by triggers so that a
-- scrape reads a few rows instead of counting a million. Frozen once released.

-- Monotonic counters: `name` is the metric's short name (`jobs_ended`, `retries_scheduled`,
-- ...), `queue` and `outcome` its labels ('' when the counter has none).
CREATE TABLE metric_counters (
    name     TEXT    NOT NULL,
    queue    TEXT    NOT NULL DEFAULT '',
    outcome  TEXT    NOT NULL DEFAULT '',
    value    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (name, queue, outcome)
) WITHOUT ROWID;

-- Histograms of attempt durations (`wait`: scheduled to started; `run`: started to ended), by
-- queue and outcome. Each row is one bucket, not cumulative: `le_ms` is the bucket's upper
-- bound in milliseconds (9223372036854775807 for +Inf), `count` the observations that fell in
-- it and `sum_ms` their total. The exposition cumulates them.
CREATE TABLE metric_histograms (
    name     TEXT    NOT NULL,
    queue    TEXT    NOT NULL,
    outcome  TEXT    NOT NULL,
    le_ms    INTEGER NOT NULL,
    count    INTEGER NOT NULL DEFAULT 0,
    sum_ms   INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (name, queue, outcome, le_ms)
) WITHOUT ROWID;

-- Jobs by queue and status. Enqueues add to it in their transaction (one row per queue and
-- batch: a trigger on INSERT made every single-row INSERT open a statement journal, and a
-- batch enqueue 3x slower); the triggers below follow every UPDATE and DELETE of `jobs`, the
-- runbook's hand-written SQL included. A job inserted by hand is not counted. A row stays
-- at 0 once its jobs are gone, so that a gauge falls to 0 instead of vanishing.
CREATE TABLE job_counts (
    queue    TEXT    NOT NULL,
    status   TEXT    NOT NULL,
    n        INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, status)
) WITHOUT ROWID;

INSERT INTO job_counts (queue, status, n)
    SELECT queue, status, count(*) FROM jobs GROUP BY queue, status;

CREATE TRIGGER job_counts_delete AFTER DELETE ON jobs BEGIN
    UPDATE job_counts SET n = n - 1 WHERE queue = OLD.queue AND status = OLD.status;
END;
CREATE TRIGGER job_counts_update AFTER UPDATE OF queue, status ON jobs
    WHEN OLD.queue IS NOT NEW.queue OR OLD.status IS NOT NEW.status BEGIN
    UPDATE job_counts SET n = n - 1 WHERE queue = OLD.queue AND status = OLD.status;
    INSERT INTO job_counts (queue, status, n) VALUES (NEW.queue, NEW.status, 1)
        ON CONFLICT (queue, status) DO UPDATE SET n = n + 1;
END;

-- Queue lag: the oldest ready pending job of one queue is the head of this index.
CREATE INDEX jobs_pending_due ON jobs (queue, scheduled_at)
    WHERE status = 'pending' AND teardown_token IS NULL;
