-- Migration 12: what the dashboard's overview reads besides the counters, kept cheap and
-- bounded whatever the number of jobs.
--
-- The recent failures: the events of failed and lost attempts, newest first, are the tail of
-- this partial index; the overview reads 20 entries of it, never the other events. (Chains of
-- equalities, not an IN list: see 0008_check_lists.sql.)
CREATE INDEX job_events_failures ON job_events (id)
    WHERE kind = 'failed' OR kind = 'retry_scheduled' OR kind = 'lost' OR kind = 'reclaimed';

-- Samples of the durable counters and of two gauges, taken by a runner's sweeper once a
-- sample interval (a minute by default): the charts are the differences between consecutive
-- samples. The table keeps the newest 61 samples, and of the samples that were the first of
-- their 60 intervals (`coarse` = 1) the newest 25: at most 86 rows, whatever the number of
-- jobs. Pruning jobs leaves it alone; the counters it samples are never lowered.
CREATE TABLE metric_samples (
    at         INTEGER PRIMARY KEY,
    coarse     INTEGER NOT NULL DEFAULT 0 CHECK (coarse = 0 OR coarse = 1),
    -- Gauges at `at`: running jobs, and pending jobs ready to claim (due, not waiting).
    running    INTEGER NOT NULL,
    ready      INTEGER NOT NULL,
    -- Counters so far: jobs ended by outcome, and failed attempts followed by a retry.
    succeeded  INTEGER NOT NULL,
    failed     INTEGER NOT NULL,
    lost       INTEGER NOT NULL,
    cancelled  INTEGER NOT NULL,
    retried    INTEGER NOT NULL,
    -- The wait and run histograms so far, over every queue and outcome: the count of each
    -- bucket (not cumulative) of metric_histograms' bounds, +Inf last, comma-separated.
    wait       TEXT    NOT NULL,
    run        TEXT    NOT NULL
);
