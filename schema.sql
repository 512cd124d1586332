-- leasehold schema, version 3 (PRAGMA user_version = 3).
--
-- This file is the newest schema, readable on its own. The library creates it, or migrates an
-- older file to it, when it opens a database; tests check that a migrated empty file equals it.
-- Times are INTEGER milliseconds since the Unix epoch, UTC.
--
-- Not schema text, but part of version 2 and later: the file is
-- `PRAGMA auto_vacuum = INCREMENTAL` (set before the first table is created; an older file is converted with a one-time VACUUM),
-- so pages freed by pruning go back to the filesystem with `PRAGMA incremental_vacuum`. To
-- make a file from this text by hand, run `PRAGMA auto_vacuum = INCREMENTAL;` first.

-- One row per job. The lease columns keep the names that lease-recovery runbooks use, so plain
-- SQL works: status, attempt, max_attempts, recovery_count, started_at, completed_at,
-- heartbeat_at, lease_expires_at, run_token, worker_id, last_error.
CREATE TABLE jobs (
    id                  INTEGER PRIMARY KEY AUTOINCREMENT,
    queue               TEXT    NOT NULL DEFAULT 'default',
    -- The command: a JSON array of strings, argv[0] first.
    argv                TEXT    NOT NULL,
    -- Extra environment: a JSON array of [name, value] pairs.
    env                 TEXT    NOT NULL DEFAULT '[]',
    cwd                 TEXT,
    priority            INTEGER NOT NULL DEFAULT 0,
    status              TEXT    NOT NULL DEFAULT 'pending'
                        CHECK (status IN ('pending', 'running', 'succeeded', 'failed', 'cancelled')),
    -- Claims so far; the attempt being run while running.
    attempt             INTEGER NOT NULL DEFAULT 0,
    max_attempts        INTEGER NOT NULL DEFAULT 1 CHECK (max_attempts >= 1),
    -- Attempts that ended in a failure of the command (exit, signal, timeout, idle timeout).
    -- A lost or interrupted attempt does not count against max_attempts.
    failed_attempts     INTEGER NOT NULL DEFAULT 0,
    backoff_base_ms     INTEGER NOT NULL DEFAULT 1000,
    backoff_max_ms      INTEGER NOT NULL DEFAULT 3600000,
    recovery_count      INTEGER NOT NULL DEFAULT 0,
    on_lost             TEXT    NOT NULL DEFAULT 'requeue' CHECK (on_lost IN ('requeue', 'fail')),
    timeout_ms          INTEGER,
    idle_timeout_ms     INTEGER,
    created_at          INTEGER NOT NULL,
    scheduled_at        INTEGER NOT NULL,
    started_at          INTEGER,
    completed_at        INTEGER,
    heartbeat_at        INTEGER,
    lease_expires_at    INTEGER,
    run_token           TEXT,
    worker_id           TEXT,
    -- The current (or last) attempt's main process: pid, process group and start time in
    -- clock ticks since boot (/proc/PID/stat), which tell it apart from a reused pid.
    pid                 INTEGER,
    pgid                INTEGER,
    proc_start_time     INTEGER,
    exit_code           INTEGER,
    signal              INTEGER,
    error_kind          TEXT
                        CHECK (error_kind IN ('exit', 'signal', 'timeout', 'idle_timeout', 'lost', 'spawn')),
    last_error          TEXT,
    -- A lost attempt whose processes still have to be torn down. While teardown_token is set
    -- the job cannot be claimed: two attempts of one job never run at once.
    teardown_token      TEXT,
    teardown_pgid       INTEGER,
    teardown_start_time INTEGER
    -- How many of a pending job's dependencies (job_deps) have not succeeded yet (version 3).
    -- A waiting job is pending but left out of the claim indexes, so it never slows a claim.
    -- (Written as SQLite writes a column added by ALTER TABLE, so the texts compare equal.)
    , waiting INTEGER NOT NULL DEFAULT 0);

-- Claiming: the next ready job of any queue, or of one queue, in priority order, reading only
-- the head of the index whatever the size of the table.
CREATE INDEX jobs_claim ON jobs (priority DESC, scheduled_at, id)
    WHERE status = 'pending' AND teardown_token IS NULL AND waiting = 0;
CREATE INDEX jobs_claim_queue ON jobs (queue, priority DESC, scheduled_at, id)
    WHERE status = 'pending' AND teardown_token IS NULL AND waiting = 0;
-- Renewing and reclaiming leases: only running rows are indexed.
CREATE INDEX jobs_running_lease ON jobs (lease_expires_at) WHERE status = 'running';
CREATE INDEX jobs_running_worker ON jobs (worker_id, run_token) WHERE status = 'running';
-- Lost attempts still to be torn down.
CREATE INDEX jobs_teardown ON jobs (teardown_token) WHERE teardown_token IS NOT NULL;
-- Counts and listings by status.
CREATE INDEX jobs_status ON jobs (status, id);
-- What pruning reads: per status, finished rows in `completed_at` order (version 2).
CREATE INDEX jobs_finished ON jobs (status, completed_at, id) WHERE completed_at IS NOT NULL;

-- Every transition of a job, written in the same transaction as the transition itself.
CREATE TABLE job_events (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id      INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    at          INTEGER NOT NULL,
    kind        TEXT    NOT NULL,
    attempt     INTEGER NOT NULL,
    detail      TEXT
);
CREATE INDEX job_events_job ON job_events (job_id, id);

-- The bounded tail of each attempt's stdout and stderr. An operator's retry starts counting
-- attempts again, so one attempt number may have several rows: the newest is the latest run.
CREATE TABLE job_output (
    id                INTEGER PRIMARY KEY,
    job_id            INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    attempt           INTEGER NOT NULL,
    stdout            BLOB    NOT NULL,
    stderr            BLOB    NOT NULL,
    stdout_truncated  INTEGER NOT NULL DEFAULT 0,
    stderr_truncated  INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX job_output_job ON job_output (job_id, attempt);

-- One row per runner process that ever opened this file.
CREATE TABLE runners (
    worker_id              TEXT    PRIMARY KEY,
    pid                    INTEGER NOT NULL,
    proc_start_time        INTEGER NOT NULL,
    boot_id                TEXT    NOT NULL,
    host                   TEXT    NOT NULL,
    started_at             INTEGER NOT NULL,
    heartbeat_at           INTEGER NOT NULL,
    stopped_at             INTEGER,
    lease_ttl_ms           INTEGER NOT NULL,
    heartbeat_interval_ms  INTEGER NOT NULL,
    max_recovery_attempts  INTEGER NOT NULL
);
CREATE INDEX runners_started ON runners (started_at);

-- Queue settings stored in the file, so that they hold across every runner and process on it
-- (version 3). A queue without a row has no limit and is not paused.
CREATE TABLE queues (
    name         TEXT    PRIMARY KEY,
    -- At most this many of the queue's jobs run at once, over every runner; NULL: no limit.
    max_running  INTEGER CHECK (max_running IS NULL OR max_running >= 0),
    -- 1: the queue's jobs are not claimed (running ones finish).
    paused       INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1))
);

-- A job's dependencies: it runs only after every `after_id` succeeded (version 3). Rows stay
-- after they are satisfied, so that a job still shows what it waited for. `after_id` is no
-- foreign key: a finished dependency may be pruned before its dependent.
CREATE TABLE job_deps (
    job_id    INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    after_id  INTEGER NOT NULL,
    PRIMARY KEY (job_id, after_id)
) WITHOUT ROWID;
-- The dependents of a job that just ended.
CREATE INDEX job_deps_after ON job_deps (after_id, job_id);
