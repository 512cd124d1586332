-- leasehold schema, version 22 (PRAGMA user_version = 22).
--
-- This file is the newest schema, readable on its own. The library creates it, or migrates an
-- older file to it, when it opens a database; tests check that a migrated empty file equals it.
-- Times are INTEGER milliseconds since the Unix epoch, UTC.
--
-- Not schema text, but part of versions 2 and later: the file is `PRAGMA auto_vacuum = INCREMENTAL`
-- (set before the first table is created; an older file is converted with a one-time VACUUM),
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
                        -- Chains of equalities, not IN lists (version 8): see 0008_check_lists.sql.
                        CHECK (status = 'pending' OR status = 'running' OR status = 'succeeded'
                               OR status = 'failed' OR status = 'cancelled'),
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
                        CHECK (error_kind = 'exit' OR error_kind = 'signal' OR error_kind = 'timeout'
                               OR error_kind = 'idle_timeout' OR error_kind = 'lost'
                               OR error_kind = 'spawn' OR error_kind = 'memory'),
    last_error          TEXT,
    -- A lost attempt whose processes still have to be torn down. While teardown_token is set
    -- the job cannot be claimed: two attempts of one job never run at once.
    teardown_token      TEXT,
    teardown_pgid       INTEGER,
    teardown_start_time INTEGER
    -- Version 5: unique_key, when set, makes enqueueing a job whose key matches an unfinished
    -- job (or, with a window, any job of that key created within it) create nothing;
    -- schedule and slot_at name the schedule that enqueued the job and its slot.
    -- Version 6: waiting counts a pending job's dependencies (job_deps) that have not
    -- succeeded yet; a waiting job is pending but left out of the claim indexes, so it never
    -- slows a claim.
    -- Version 9: teardown_worker names the runner that held the lost attempt still to be torn
    -- down: only a runner in that runner's PID namespace can see its processes. NULL (a
    -- marker from before version 9, or written by hand): any runner tears it down.
    -- Version 13: keeper_pid and keeper_start_time identify the attempt's keeper, the
    -- process that is its command's parent and writes its outcome beside the database.
    -- Version 14: deferred is 1 for a pending job written to run later (enqueued with a
    -- delay, or retried after a backoff): it is left out of the claim indexes until a claim
    -- promotes it, once due, in its own transaction (see 0014_per_job_cost.sql). A row written
    -- by hand is 0: claimable once due, as before.
    -- Version 16: teardown_lease_expires_at is the lease the lost attempt still to be torn
    -- down held when it was marked (NULL: none, or a marker from before version 16). On
    -- PostgreSQL, a keeper stops its attempt by the end of that lease, so a runner elsewhere
    -- may record the teardown as the keeper's only once the server's clock is past it.
    -- Version 17: name is the job's name (Job::name, `jobs add --name`), NULL for none.
    -- Version 20: conditions is a bit mask of what must hold on the runner's machine for the
    -- job to start (1 ac-power, 2 battery-not-low, 4 unmetered, 8 online, 16 idle; 0: none);
    -- when_lost is what happens when one stops holding while it runs (see 0020_conditions.sql).
    -- Version 21: limits is the job's manners and caps, a JSON object of nice, io_class,
    -- memory_max, cpu_weight and pids_max (NULL: none); tempfail_max bounds the exits 75
    -- ("try me later") that requeue it without spending an attempt (NULL: the default) and
    -- tempfails counts them. error_kind 'memory': killed for its memory cap.
    -- (Written as ALTER TABLE ADD COLUMN writes them, so that a migrated file's text and this
    -- one's agree.)
, unique_key TEXT, schedule TEXT, slot_at INTEGER, waiting INTEGER NOT NULL DEFAULT 0,
  teardown_worker TEXT, keeper_pid INTEGER, keeper_start_time INTEGER,
  deferred INTEGER NOT NULL DEFAULT 0, teardown_lease_expires_at INTEGER, name TEXT,
  conditions INTEGER NOT NULL DEFAULT 0, when_lost TEXT NOT NULL DEFAULT 'run'
    CHECK (when_lost = 'run' OR when_lost = 'stop'),
  limits TEXT, tempfail_max INTEGER, tempfails INTEGER NOT NULL DEFAULT 0);

-- Claiming: the next ready job of any queue, or of one queue, in priority order, reading only
-- the head of the index whatever the size of the table. Jobs not yet due are not in them
-- (version 14), whatever their priority.
CREATE INDEX jobs_claim ON jobs (priority DESC, scheduled_at, id)
    WHERE status = 'pending' AND teardown_token IS NULL AND waiting = 0 AND deferred = 0;
CREATE INDEX jobs_claim_queue ON jobs (queue, priority DESC, scheduled_at, id)
    WHERE status = 'pending' AND teardown_token IS NULL AND waiting = 0 AND deferred = 0;
-- Deferred jobs by due time: a claim promotes the due ones with one seek (version 14).
CREATE INDEX jobs_deferred ON jobs (scheduled_at) WHERE deferred = 1;
-- Renewing and reclaiming leases: only running rows are indexed (one index since version 14:
-- the sweeper reads every running row, bounded by the runners' workers).
CREATE INDEX jobs_running_worker ON jobs (worker_id, run_token) WHERE status = 'running';
-- Lost attempts still to be torn down, in id order: the sweeper reads them a page at a time
-- (keyed by id since version 14; by the token before, which made that read walk the table).
CREATE INDEX jobs_teardown ON jobs (id) WHERE teardown_token IS NOT NULL;
-- Counts and listings by status.
CREATE INDEX jobs_status ON jobs (status, id);
-- The job list by queue, newest first, a page at a time (version 11).
CREATE INDEX jobs_queue ON jobs (queue, id);
-- What pruning reads: per status, finished rows in `completed_at` order (version 2).
CREATE INDEX jobs_finished ON jobs (status, completed_at, id) WHERE completed_at IS NOT NULL;
-- The runbook's failed-stale jobs: failed rows by recovery_count, so that only those past the
-- recovery budget are read (version 3).
CREATE INDEX jobs_failed_recovery ON jobs (recovery_count) WHERE status = 'failed';
-- Queue lag: the oldest ready pending job of one queue is the head of this index (version 4;
-- version 6 leaves out jobs waiting for a dependency).
CREATE INDEX jobs_pending_due ON jobs (queue, scheduled_at)
    WHERE status = 'pending' AND teardown_token IS NULL AND waiting = 0;
-- The unique-key check of an enqueue, and a schedule's overlap check (version 5).
CREATE INDEX jobs_unique ON jobs (unique_key, status, created_at) WHERE unique_key IS NOT NULL;
CREATE INDEX jobs_schedule ON jobs (schedule, status) WHERE schedule IS NOT NULL;

-- Every transition of a job, written in the same transaction as the transition itself.
CREATE TABLE job_events (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id      INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    at          INTEGER NOT NULL,
    kind        TEXT    NOT NULL,
    attempt     INTEGER NOT NULL,
    detail      TEXT
    -- Version 15: start_detail, when set, makes this row record two events: the attempt's
    -- `started` (at the same `at`, for the same attempt, with start_detail as its detail),
    -- then the row's own `kind`, the attempt's ending. The runner writes it so when an
    -- attempt's start and its ending share one commit (a short job): one row instead of two.
    -- A `started` row of its own still records a start committed before its ending.
    -- (Written as ALTER TABLE ADD COLUMN writes it.)
, start_detail TEXT);
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
    -- Version 9: its PID namespace, the inode of /proc/self/ns/pid (NULL: registered before
    -- version 9, or unreadable). Its pid is evidence only to a judge in the same boot and
    -- namespace.
    -- Version 19: how it contains its attempts, `cgroup <node>` or `process groups (why)`
    -- (NULL: registered before version 19).
    -- Version 20: the conditions that hold as it sees them (the jobs' bits; NULL: registered
    -- before version 20) and what it assumes where it cannot tell.
, pid_ns INTEGER, containment TEXT, conditions_held INTEGER, conditions_note TEXT);
CREATE INDEX runners_started ON runners (started_at);

-- Metrics (version 4): counters and histograms updated in the transaction of the transition
-- they count (never recomputed from job_events, so pruning never lowers them), and the count
-- of jobs by queue and status, kept by triggers.

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
-- runbook's hand-written SQL included. A job inserted by hand is not counted. A queue gets its
-- row of every status when its first job is enqueued (version 14), so that a change of status
-- is two plain UPDATEs, not an upsert; a row stays at 0 once its jobs are gone, so that a gauge
-- falls to 0 instead of vanishing.
CREATE TABLE job_counts (
    queue    TEXT    NOT NULL,
    status   TEXT    NOT NULL,
    n        INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, status)
) WITHOUT ROWID;

CREATE TRIGGER job_counts_delete AFTER DELETE ON jobs BEGIN
    UPDATE job_counts SET n = n - 1 WHERE queue = OLD.queue AND status = OLD.status;
END;
CREATE TRIGGER job_counts_status AFTER UPDATE OF status ON jobs
    WHEN OLD.status IS NOT NEW.status AND OLD.queue IS NEW.queue BEGIN
    UPDATE job_counts SET n = n - 1 WHERE queue = OLD.queue AND status = OLD.status;
    UPDATE job_counts SET n = n + 1 WHERE queue = NEW.queue AND status = NEW.status;
END;
-- A job moved to another queue (hand-written SQL only): that queue may have no rows yet,
-- and gets its row of every status.
CREATE TRIGGER job_counts_queue AFTER UPDATE OF queue ON jobs
    WHEN OLD.queue IS NOT NEW.queue BEGIN
    UPDATE job_counts SET n = n - 1 WHERE queue = OLD.queue AND status = OLD.status;
    INSERT OR IGNORE INTO job_counts (queue, status, n)
        VALUES (NEW.queue, 'pending', 0), (NEW.queue, 'running', 0), (NEW.queue, 'succeeded', 0),
               (NEW.queue, 'failed', 0), (NEW.queue, 'cancelled', 0);
    UPDATE job_counts SET n = n + 1 WHERE queue = NEW.queue AND status = NEW.status;
END;
-- One row per recurring schedule. A slot fires in the IMMEDIATE transaction that enqueues its
-- job and moves next_slot_at past it, guarded by next_slot_at: any number of runners fire
-- each slot exactly once.
CREATE TABLE schedules (
    name          TEXT    PRIMARY KEY CHECK (name <> ''),
    -- A cron expression (5 fields, 6 with seconds first, or an @shorthand), or NULL for an
    -- interval of every_ms milliseconds counted from anchor_at.
    cron          TEXT,
    every_ms      INTEGER CHECK (every_ms IS NULL OR every_ms > 0),
    anchor_at     INTEGER NOT NULL,
    -- An IANA zone name: cron fields are read in its local time.
    tz            TEXT    NOT NULL DEFAULT 'UTC',
    -- The job each slot enqueues: a JSON object of the `jobs add` options.
    job           TEXT    NOT NULL,
    catch_up      TEXT    NOT NULL DEFAULT 'skip' CHECK (catch_up IN ('skip', 'one', 'all')),
    overlap       TEXT    NOT NULL DEFAULT 'skip' CHECK (overlap IN ('skip', 'allow')),
    paused        INTEGER NOT NULL DEFAULT 0,
    -- The newest slot fired (or missed), and the next slot due; NULL when none is left.
    last_slot_at  INTEGER,
    next_slot_at  INTEGER,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    CHECK ((cron IS NULL) <> (every_ms IS NULL))
);
CREATE INDEX schedules_due ON schedules (next_slot_at) WHERE paused = 0;

-- A schedule's own history: missed and skipped slots (a fired slot is its job's history).
CREATE TABLE schedule_events (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    schedule    TEXT    NOT NULL REFERENCES schedules (name) ON DELETE CASCADE,
    at          INTEGER NOT NULL,
    kind        TEXT    NOT NULL,
    slot_at     INTEGER,
    detail      TEXT
);
CREATE INDEX schedule_events_schedule ON schedule_events (schedule, id);
-- Queue settings stored in the file, so that they hold across every runner and process on it
-- (version 6). A queue without a row has no limit and is not paused.
CREATE TABLE queues (
    name         TEXT    PRIMARY KEY,
    -- At most this many of the queue's jobs run at once, over every runner; NULL: no limit.
    max_running  INTEGER CHECK (max_running IS NULL OR max_running >= 0),
    -- 1: the queue's jobs are not claimed (running ones finish).
    paused       INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1))
);

-- A job's dependencies: it runs only after every `after_id` succeeded (version 6). Rows stay
-- after they are satisfied, so that a job still shows what it waited for. `after_id` is no
-- foreign key: a finished dependency may be pruned before its dependent.
CREATE TABLE job_deps (
    job_id    INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    after_id  INTEGER NOT NULL,
    PRIMARY KEY (job_id, after_id)
) WITHOUT ROWID;
-- The dependents of a job that just ended.
CREATE INDEX job_deps_after ON job_deps (after_id, job_id);

-- Jobs handed to a running runner by a command (version 7). A command that gets no answer
-- stores the job itself under the same token: whichever commits first stores the job and its
-- token, and the other finds the token and stores nothing. Rows are deleted some time after
-- the command could still be waiting, by the next hand-off.
CREATE TABLE handoffs (
    token       TEXT    PRIMARY KEY,
    job_id      INTEGER NOT NULL,
    -- 1: the job's unique key matched a job, and job_id is that job.
    duplicate   INTEGER NOT NULL CHECK (duplicate IN (0, 1)),
    expires_at  INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX handoffs_expiry ON handoffs (expires_at);

-- Bulk enqueues in bounded transactions (version 10): a batch's jobs are gated by a `job_deps`
-- row naming `-id`, counted in their `waiting`, until the batch commits (the gates are then
-- lifted) or is abandoned (its jobs are then deleted). Version 9 is reserved for another
-- change. See `src/migrations/0010_bounded.sql`.
CREATE TABLE batches (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    -- 0 open, 1 committed, 2 abandoned.
    state       INTEGER NOT NULL CHECK (state = 0 OR state = 1 OR state = 2),
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL
);

-- Fan-outs in bounded transactions (version 10): an ending handles a few hundred of its dependents in its
-- own transaction and leaves the rest as a cascade, which whoever comes next continues a slice
-- at a time. Dependents of `job_id` with an id in (after_job, last_job] are still to be
-- handled (a success counts down their `waiting`; a failure or a cancel cancels the pending
-- ones, which may start cascades of their own); a slice moves `after_job` in the transaction
-- that handles them, so each is handled exactly once. `root` is the job whose failure started
-- a chain of cancels.
CREATE TABLE cascades (
    job_id     INTEGER NOT NULL,
    status     TEXT    NOT NULL
               CHECK (status = 'succeeded' OR status = 'failed' OR status = 'cancelled'),
    root       INTEGER NOT NULL,
    after_job  INTEGER NOT NULL,
    last_job   INTEGER NOT NULL,
    PRIMARY KEY (job_id, status)
);

-- The dashboard (version 12); see `src/migrations/0012_dashboard.sql`.
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
