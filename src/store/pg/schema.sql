-- leasehold schema on PostgreSQL, version 22 (the same version as the SQLite schema.sql).
--
-- This file is the newest PostgreSQL schema, readable on its own. It has the same tables, the
-- same column names and the same meanings as the SQLite file (/schema.sql; the why of each part
-- is in src/migrations/*.sql), so that the runbook's SQL runs unchanged on either. What differs,
-- and why, is said where it differs; docs/postgres.md lists the SQL constructs of the store's
-- statements that differ between the two dialects.
--
-- Loading it: the store runs this whole file in one transaction, holding
--     SELECT pg_advisory_xact_lock(7810756276994469740);
-- (the key is the bytes of 'leasehol', 0x6c65617365686f6c), which every migration of a
-- leasehold database takes before it reads leasehold_migrations: two runners starting at once
-- on an empty database create it once, and the second finds version 22. Names are not
-- schema-qualified: the connection's search_path picks the schema (one per test, for example).
--
-- Types: every integer is BIGINT (the store binds every integer as int8, as SQLite's INTEGER
-- is 64-bit). Flags stay BIGINT 0/1 (`deferred`, `waiting`, `paused`, ...), not boolean, so that
-- hand-written SQL like `deferred = 1` works on both. Times are BIGINT milliseconds since the
-- Unix epoch, UTC, taken from the server's clock: leasehold_now_ms() below.
-- Text that the store compares, sorts or groups (queue, names, statuses) has COLLATE "C":
-- byte order, as SQLite's BINARY collation, whatever the database's locale.
--
-- SQLite-only parts of schema.sql, and what stands in for them here:
-- - PRAGMA auto_vacuum = INCREMENTAL and `PRAGMA incremental_vacuum` after pruning: autovacuum
--   (on by default) makes the space of pruned rows reusable; nothing to set per table.
-- - PRAGMA user_version: the table leasehold_migrations.
-- - INTEGER PRIMARY KEY AUTOINCREMENT and its sqlite_sequence: an identity column (a sequence
--   of its own, never reusing an id, as AUTOINCREMENT). BY DEFAULT, not ALWAYS, so that rows
--   copied from a SQLite file keep their ids (then `SELECT setval(pg_get_serial_sequence(
--   'jobs', 'id'), max(id)) FROM jobs;`).
-- - WITHOUT ROWID: a plain table with the same primary key (PostgreSQL tables have no rowid).
-- - rowid, which two statements order by (cascades, runners: the order rows were written):
--   a `seq` identity column on those two tables.
-- - BLOB: BYTEA.
-- - JSON columns (jobs.argv, jobs.env, schedules.job) stay TEXT: the store writes and reads
--   them as text, and no statement looks inside them (one that must can cast, `argv::jsonb`).
--   No default calls a JSON function (env's default is the text '[]').
-- - The job_counts triggers: plpgsql functions below, with a table sharded so that runners'
--   transitions do not queue behind one row, and a view named job_counts that reads as the
--   SQLite table does. The metric counters and histograms are sharded the same way, behind
--   views named metric_counters and metric_histograms.

-- The server's clock, in milliseconds since the Unix epoch: every lease, heartbeat, schedule
-- and retention time comes from it, as hosts' clocks differ. clock_timestamp(), not now():
-- now() is the start of the transaction, frozen for its whole length, so a lease renewed at the
-- end of a long transaction would be stamped with its start, and two reads in one transaction
-- could not measure the time between them.
CREATE FUNCTION leasehold_now_ms() RETURNS BIGINT
    LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$ SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint $$;

-- SQLite's julianday(), for the runbook's hand-written SQL only (the store never calls it):
-- `CAST((julianday('now') - 2440587.5) * 86400000 AS BIGINT)` is the current time in ms on
-- both databases. ('now' is the server's clock; any other text is a time read as UTC, as
-- SQLite reads it.) The runbook's older spelling, `AS INTEGER`, cannot run here: INTEGER is
-- 32-bit on PostgreSQL, and the time in ms does not fit.
CREATE FUNCTION julianday(t TEXT) RETURNS DOUBLE PRECISION
    LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$
        SELECT extract(epoch FROM CASE WHEN t = 'now' THEN clock_timestamp()
                                       ELSE t::timestamp AT TIME ZONE 'UTC' END)::float8
               / 86400 + 2440587.5
    $$;

-- Schema versions applied, the newest last (SQLite keeps one number, PRAGMA user_version). A
-- database made from this file has one row, 22. The store's migration holds the advisory lock
-- above, reads max(version), and applies each newer migration in that transaction.
CREATE TABLE leasehold_migrations (
    version     BIGINT PRIMARY KEY,
    applied_at  BIGINT NOT NULL
);
INSERT INTO leasehold_migrations (version, applied_at) VALUES (22, leasehold_now_ms());

-- One row per job. The lease columns keep the names that lease-recovery runbooks use, so plain
-- SQL works: status, attempt, max_attempts, recovery_count, started_at, completed_at,
-- heartbeat_at, lease_expires_at, run_token, worker_id, last_error. The columns are in the
-- SQLite table's order, the ones SQLite's migrations added last included, so `SELECT *` reads
-- the same on both.
CREATE TABLE jobs (
    id                  BIGINT  GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    queue               TEXT    COLLATE "C" NOT NULL DEFAULT 'default',
    -- The command: a JSON array of strings, argv[0] first.
    argv                TEXT    NOT NULL,
    -- Extra environment: a JSON array of [name, value] pairs.
    env                 TEXT    NOT NULL DEFAULT '[]',
    cwd                 TEXT,
    priority            BIGINT  NOT NULL DEFAULT 0,
    status              TEXT    COLLATE "C" NOT NULL DEFAULT 'pending'
                        CHECK (status = 'pending' OR status = 'running' OR status = 'succeeded'
                               OR status = 'failed' OR status = 'cancelled'),
    -- Claims so far; the attempt being run while running.
    attempt             BIGINT  NOT NULL DEFAULT 0,
    max_attempts        BIGINT  NOT NULL DEFAULT 1 CHECK (max_attempts >= 1),
    -- Attempts that ended in a failure of the command (exit, signal, timeout, idle timeout).
    -- A lost or interrupted attempt does not count against max_attempts.
    failed_attempts     BIGINT  NOT NULL DEFAULT 0,
    backoff_base_ms     BIGINT  NOT NULL DEFAULT 1000,
    backoff_max_ms      BIGINT  NOT NULL DEFAULT 3600000,
    recovery_count      BIGINT  NOT NULL DEFAULT 0,
    on_lost             TEXT    NOT NULL DEFAULT 'requeue' CHECK (on_lost IN ('requeue', 'fail')),
    timeout_ms          BIGINT,
    idle_timeout_ms     BIGINT,
    created_at          BIGINT  NOT NULL,
    scheduled_at        BIGINT  NOT NULL,
    started_at          BIGINT,
    completed_at        BIGINT,
    heartbeat_at        BIGINT,
    lease_expires_at    BIGINT,
    run_token           TEXT    COLLATE "C",
    worker_id           TEXT    COLLATE "C",
    -- The current (or last) attempt's main process: pid, process group and start time in
    -- clock ticks since boot (/proc/PID/stat), which tell it apart from a reused pid.
    pid                 BIGINT,
    pgid                BIGINT,
    proc_start_time     BIGINT,
    exit_code           BIGINT,
    signal              BIGINT,
    error_kind          TEXT
                        CHECK (error_kind = 'exit' OR error_kind = 'signal' OR error_kind = 'timeout'
                               OR error_kind = 'idle_timeout' OR error_kind = 'lost'
                               OR error_kind = 'spawn' OR error_kind = 'memory'),
    last_error          TEXT,
    -- A lost attempt whose processes still have to be torn down. While teardown_token is set
    -- the job cannot be claimed: two attempts of one job never run at once.
    teardown_token      TEXT    COLLATE "C",
    teardown_pgid       BIGINT,
    teardown_start_time BIGINT,
    -- unique_key, when set, makes enqueueing a job whose key matches an unfinished job (or,
    -- with a window, any job of that key created within it) create nothing; schedule and
    -- slot_at name the schedule that enqueued the job and its slot.
    unique_key          TEXT    COLLATE "C",
    schedule            TEXT    COLLATE "C",
    slot_at             BIGINT,
    -- The pending job's dependencies (job_deps) that have not succeeded yet; a waiting job is
    -- pending but left out of the claim indexes, so it never slows a claim.
    waiting             BIGINT  NOT NULL DEFAULT 0,
    -- The runner that held the lost attempt still to be torn down: only a runner in that
    -- runner's PID namespace can see its processes. NULL (written by hand): any runner tears
    -- it down.
    teardown_worker     TEXT    COLLATE "C",
    -- The attempt's keeper, the process that is its command's parent and writes its outcome
    -- beside the database.
    keeper_pid          BIGINT,
    keeper_start_time   BIGINT,
    -- 1 for a pending job written to run later (enqueued with a delay, or retried after a
    -- backoff): it is left out of the claim indexes until a claim promotes it, once due, in its
    -- own transaction (see 0014_per_job_cost.sql). A row written by hand is 0: claimable once
    -- due.
    deferred            BIGINT  NOT NULL DEFAULT 0,
    -- The lease the lost attempt still to be torn down held when it was marked (NULL: none).
    -- Its keeper stops it by the end of that lease, so a runner elsewhere records its teardown
    -- as the keeper's only once this server's clock is past it (and a slack).
    teardown_lease_expires_at BIGINT,
    -- The job's name (Job::name), NULL for none: what a harness calls each test it runs as a job.
    name                TEXT,
    -- What must hold on the runner's machine for the job to start, a bit mask (1 ac-power,
    -- 2 battery-not-low, 4 unmetered, 8 online, 16 idle; 0: none), and what happens when one
    -- stops holding while it runs.
    conditions          BIGINT  NOT NULL DEFAULT 0,
    when_lost           TEXT    NOT NULL DEFAULT 'run'
                        CHECK (when_lost = 'run' OR when_lost = 'stop'),
    -- The job's manners and caps, a JSON object of nice, io_class, memory_max, cpu_weight and
    -- pids_max (NULL: none); the bound on exits 75 ("try me later") that requeue it without
    -- spending an attempt (NULL: the default), and how many did so far.
    limits              TEXT,
    tempfail_max        BIGINT,
    tempfails           BIGINT  NOT NULL DEFAULT 0
);

-- Claiming: the next ready job of any queue, or of one queue, in priority order, reading only
-- the head of the index whatever the size of the table. Jobs not yet due are not in them,
-- whatever their priority. A claim's WHERE must contain these predicates word for word (as
-- the store's READY_TO_CLAIM does) for the planner to use a partial index.
CREATE INDEX jobs_claim ON jobs (priority DESC, scheduled_at, id)
    WHERE status = 'pending' AND teardown_token IS NULL AND waiting = 0 AND deferred = 0;
CREATE INDEX jobs_claim_queue ON jobs (queue, priority DESC, scheduled_at, id)
    WHERE status = 'pending' AND teardown_token IS NULL AND waiting = 0 AND deferred = 0;
-- Deferred jobs by due time: a claim promotes the due ones with one seek.
CREATE INDEX jobs_deferred ON jobs (scheduled_at) WHERE deferred = 1;
-- Renewing and reclaiming leases: only running rows are indexed.
CREATE INDEX jobs_running_worker ON jobs (worker_id, run_token) WHERE status = 'running';
-- Lost attempts still to be torn down, in id order: the sweeper reads them a page at a time.
CREATE INDEX jobs_teardown ON jobs (id) WHERE teardown_token IS NOT NULL;
-- Listings by status, of the statuses few jobs have at once (version 18): a claim's new row
-- (running) and a success's (succeeded) get no entry, so each transition writes one index entry
-- fewer (neither update can be HOT: status is in the claim indexes' predicates). Running jobs
-- are listed from jobs_running_worker, succeeded ones (most jobs) from the primary key
-- backwards. SQLite's index has every row.
CREATE INDEX jobs_status ON jobs (status, id) WHERE status <> 'running' AND status <> 'succeeded';
-- The job list by queue, newest first, a page at a time.
CREATE INDEX jobs_queue ON jobs (queue, id);
-- What pruning reads: per status, finished rows in `completed_at` order.
CREATE INDEX jobs_finished ON jobs (status, completed_at, id) WHERE completed_at IS NOT NULL;
-- The runbook's failed-stale jobs: failed rows by recovery_count, so that only those past the
-- recovery budget are read.
CREATE INDEX jobs_failed_recovery ON jobs (recovery_count) WHERE status = 'failed';
-- Queue lag: the oldest ready pending job of one queue is the head of this index (jobs
-- waiting for a dependency left out).
CREATE INDEX jobs_pending_due ON jobs (queue, scheduled_at)
    WHERE status = 'pending' AND teardown_token IS NULL AND waiting = 0;
-- The unique-key check of an enqueue, and a schedule's overlap check.
CREATE INDEX jobs_unique ON jobs (unique_key, status, created_at) WHERE unique_key IS NOT NULL;
CREATE INDEX jobs_schedule ON jobs (schedule, status) WHERE schedule IS NOT NULL;

-- Every transition of a job, written in the same transaction as the transition itself.
CREATE TABLE job_events (
    id          BIGINT  GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    -- No foreign key (version 18; SQLite's has one): its check took a key-share lock on the
    -- job's row for each event, a WAL record and a query each. Every event is written in a
    -- transaction that holds its job's row (or reads it), and the trigger job_events_follow
    -- below deletes a deleted job's events, as ON DELETE CASCADE did.
    job_id      BIGINT  NOT NULL,
    at          BIGINT  NOT NULL,
    kind        TEXT    COLLATE "C" NOT NULL,
    attempt     BIGINT  NOT NULL,
    detail      TEXT,
    -- When set, this row records two events: the attempt's `started` (at the same `at`, for
    -- the same attempt, with start_detail as its detail), then the row's own `kind`, the
    -- attempt's ending. The runner writes it so when an attempt's start and its ending share
    -- one commit (a short job): one row instead of two. A `started` row of its own still
    -- records a start committed before its ending.
    start_detail TEXT
);
CREATE INDEX job_events_job ON job_events (job_id, id);
-- The recent failures: the events of failed and lost attempts, newest first, are the tail of
-- this partial index; the dashboard's overview reads 20 entries of it, never the other events.
CREATE INDEX job_events_failures ON job_events (id)
    WHERE kind = 'failed' OR kind = 'retry_scheduled' OR kind = 'lost' OR kind = 'reclaimed';

-- The bounded tail of each attempt's stdout and stderr. An operator's retry starts counting
-- attempts again, so one attempt number may have several rows: the newest is the latest run.
-- (SQLite's id is INTEGER PRIMARY KEY without AUTOINCREMENT, which may reuse the id of a
-- deleted newest row; an identity never does, which no reader can tell apart.)
CREATE TABLE job_output (
    id                BIGINT  GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    job_id            BIGINT  NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    attempt           BIGINT  NOT NULL,
    stdout            BYTEA   NOT NULL,
    stderr            BYTEA   NOT NULL,
    stdout_truncated  BIGINT  NOT NULL DEFAULT 0,
    stderr_truncated  BIGINT  NOT NULL DEFAULT 0
);
CREATE INDEX job_output_job ON job_output (job_id, attempt);

-- Which runner does each kind of maintenance (`prune`: retention) until `expires_at`, so that
-- runners on many hosts do not all prune at once (River's river_leader). The holder renews it
-- at every sweep; another takes it once it expired. Only PostgreSQL has it: SQLite's single
-- writer already serialises the runners of a file.
CREATE TABLE leaders (
    role        TEXT    COLLATE "C" PRIMARY KEY,
    holder      TEXT    COLLATE "C" NOT NULL,
    expires_at  BIGINT  NOT NULL
);

-- One row per runner process that ever opened this database.
CREATE TABLE runners (
    worker_id              TEXT    COLLATE "C" PRIMARY KEY,
    pid                    BIGINT  NOT NULL,
    proc_start_time        BIGINT  NOT NULL,
    boot_id                TEXT    NOT NULL,
    host                   TEXT    COLLATE "C" NOT NULL,
    started_at             BIGINT  NOT NULL,
    heartbeat_at           BIGINT  NOT NULL,
    stopped_at             BIGINT,
    lease_ttl_ms           BIGINT  NOT NULL,
    heartbeat_interval_ms  BIGINT  NOT NULL,
    max_recovery_attempts  BIGINT  NOT NULL,
    -- Its PID namespace, the inode of /proc/self/ns/pid (NULL: unreadable). Its pid is
    -- evidence only to a judge in the same boot and namespace.
    pid_ns                 BIGINT,
    -- The order rows were written, which SQLite's statements read as `rowid` (the latest
    -- runner of two started in one millisecond).
    seq                    BIGINT  GENERATED BY DEFAULT AS IDENTITY UNIQUE,
    -- How it contains its attempts, `cgroup <node>` or `process groups (why)` (NULL:
    -- registered before version 19).
    containment            TEXT,
    -- The conditions that hold as it sees them (the jobs' bits; NULL: registered before
    -- version 20) and what it assumes where it cannot tell.
    conditions_held        BIGINT,
    conditions_note        TEXT
);
CREATE INDEX runners_started ON runners (started_at);

-- Metrics: counters and histograms updated in the transaction of the transition they count
-- (never recomputed from job_events, so pruning never lowers them), and the count of jobs by
-- queue and status, kept by triggers.

-- Monotonic counters: `name` is the metric's short name (`jobs_ended`, `retries_scheduled`,
-- ...), `queue` and `outcome` its labels ('' when the counter has none).
--
-- SQLite has one row per counter. Here that row would be a lock that every runner's writer
-- takes in its transaction and holds until it commits: the runners would queue behind each
-- other on it, and two transactions bumping two counters in opposite orders would deadlock.
-- So each counter has up to 16 shards, as the job counts below have: a transaction adds to
-- the shard it owns (job_count_shard()), and the view metric_counters sums them. Reads go
-- through the view; writes go to the shards (the view cannot be written).
CREATE TABLE metric_counter_shards (
    name     TEXT    COLLATE "C" NOT NULL,
    queue    TEXT    COLLATE "C" NOT NULL DEFAULT '',
    outcome  TEXT    COLLATE "C" NOT NULL DEFAULT '',
    shard    BIGINT  NOT NULL CHECK (shard >= 0 AND shard < 16),
    value    BIGINT  NOT NULL DEFAULT 0,
    PRIMARY KEY (name, queue, outcome, shard)
);

-- The counters as SQLite's metric_counters table reads: one row per counter ever bumped.
CREATE VIEW metric_counters (name, queue, outcome, value) AS
    SELECT name, queue, outcome, sum(value)::bigint
    FROM metric_counter_shards
    GROUP BY name, queue, outcome;

-- Histograms of attempt durations (`wait`: scheduled to started; `run`: started to ended), by
-- queue and outcome. Each row is one bucket, not cumulative: `le_ms` is the bucket's upper
-- bound in milliseconds (9223372036854775807 for +Inf), `count` the observations that fell in
-- it and `sum_ms` their total. The exposition cumulates them. Sharded as the counters are.
CREATE TABLE metric_histogram_shards (
    name     TEXT    COLLATE "C" NOT NULL,
    queue    TEXT    COLLATE "C" NOT NULL,
    outcome  TEXT    COLLATE "C" NOT NULL,
    le_ms    BIGINT  NOT NULL,
    shard    BIGINT  NOT NULL CHECK (shard >= 0 AND shard < 16),
    count    BIGINT  NOT NULL DEFAULT 0,
    sum_ms   BIGINT  NOT NULL DEFAULT 0,
    PRIMARY KEY (name, queue, outcome, le_ms, shard)
);

-- The buckets as SQLite's metric_histograms table reads.
CREATE VIEW metric_histograms (name, queue, outcome, le_ms, count, sum_ms) AS
    SELECT name, queue, outcome, le_ms, sum(count)::bigint, sum(sum_ms)::bigint
    FROM metric_histogram_shards
    GROUP BY name, queue, outcome, le_ms;

-- Jobs by queue and status, exact, kept by the triggers below on every INSERT, UPDATE and
-- DELETE of `jobs` (the store's statements and hand-written SQL alike).
--
-- SQLite has one row per (queue, status), which its single writer updates. On PostgreSQL that
-- row would be a lock held by every transition's transaction until it commits: every runner's
-- claims and endings would queue behind each other on it, and two transactions that moved
-- jobs between the same statuses in opposite orders would deadlock. So each (queue, status)
-- has up to 16 shards, and a count is the sum of its shards. A transaction writes to one shard
-- only, and owns it until it commits (a transaction-level advisory lock on the shard's
-- number, see job_count_shard()): no two transactions write one row at once, so no transition
-- waits for another's commit or deadlocks on a count. Rows are upserted as transitions meet
-- them, so a shard's row may be missing (0) or negative (its jobs moved on through other
-- shards): only the sums mean anything. Reads go through the view job_counts.
--
-- Differences from SQLite's table, whose statements do not port: an enqueue adds nothing
-- itself (the INSERT trigger counts it, a job inserted by hand included), and
-- `INSERT INTO job_counts` is not written (it is a view).
CREATE TABLE job_count_shards (
    queue    TEXT    COLLATE "C" NOT NULL,
    status   TEXT    COLLATE "C" NOT NULL,
    shard    BIGINT  NOT NULL CHECK (shard >= 0 AND shard < 16),
    n        BIGINT  NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, status, shard)
);

-- The counts as SQLite's job_counts table reads: one row per queue that ever had a job and
-- per status (0 when none; a gauge falls to 0 instead of vanishing), so that the store's
-- reads of job_counts (`SELECT queue, status, n FROM job_counts ...`, `sum(n)`, `WHERE
-- status = 'pending' AND n > 0`) run unchanged.
CREATE VIEW job_counts (queue, status, n) AS
    SELECT q.queue, s.status, coalesce(sum(c.n), 0)::bigint
    FROM (SELECT DISTINCT queue FROM job_count_shards) AS q
    CROSS JOIN (VALUES ('pending' COLLATE "C"), ('running'), ('succeeded'), ('failed'),
                       ('cancelled')) AS s (status)
    LEFT JOIN job_count_shards AS c ON c.queue = q.queue AND c.status = s.status
    GROUP BY q.queue, s.status;

-- The shard this transaction writes its count changes to (job counts, metric counters and
-- histograms alike: one shard per transaction for all three). The first call of a transaction
-- takes the first free one of the 16 transaction-level advisory locks (1818583411, shard),
-- starting from one picked by the backend's pid, and remembers it in a transaction-local
-- setting; later calls read the setting. 1818583411 is the bytes of 'leas' (0x6c656173), a
-- key space of its own: the two-key form of the advisory locks never meets the one-key form
-- of the migration lock. When all 16 are held (more than 16 transactions writing jobs at
-- once), it waits for its own pick: correct, only slower.
CREATE FUNCTION job_count_shard() RETURNS BIGINT
    LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT
AS $$
DECLARE
    held TEXT := current_setting('leasehold.count_shard', true);
    first INT;
    s INT;
BEGIN
    IF held IS NOT NULL AND held <> '' THEN
        RETURN held::bigint;
    END IF;
    first := pg_backend_pid() % 16;
    FOR i IN 0 .. 15 LOOP
        s := (first + i) % 16;
        IF pg_try_advisory_xact_lock(1818583411, s) THEN
            PERFORM set_config('leasehold.count_shard', s::text, true);
            RETURN s;
        END IF;
    END LOOP;
    PERFORM pg_advisory_xact_lock(1818583411, first);
    PERFORM set_config('leasehold.count_shard', first::text, true);
    RETURN first;
END
$$;

-- The count changes of `jobs` (the same semantics as SQLite's job_counts_delete,
-- job_counts_status and job_counts_queue triggers, and the enqueue's own addition):
-- - per INSERT statement (version 22), over its transition table: one upsert for each
--   (queue, status) of its rows (a bulk enqueue writes 100 rows a statement: one upsert, not
--   100; the row trigger of versions 15 to 21 cost more than the rows themselves);
-- - per row, a DELETE takes its row away: one upsert of the transaction's shard row each;
-- - per UPDATE statement (version 18), over its transition tables: the rows' old (queue,
--   status) taken away and their new ones added, so that only the rows whose status or queue
--   (hand-written SQL only moves queues) changed count, with one upsert for each (queue,
--   status) whose count changed. A claim, or a batch of successes, of 16 jobs writes two
--   shard rows, not 32 row locks and 32 updates; a statement that moves no job between counts
--   (a lease's renewal) writes nothing and takes no shard.
-- The trigger functions keep the search_path they were created with (SET ... FROM CURRENT): a
-- hand-written `UPDATE myschema.jobs ...` from a session whose search_path lacks the schema
-- still counts into that schema's shards.
CREATE FUNCTION job_counts_follow() RETURNS trigger
    LANGUAGE plpgsql SET search_path FROM CURRENT
AS $$
BEGIN
    IF TG_LEVEL = 'STATEMENT' AND TG_OP = 'INSERT' THEN
        INSERT INTO job_count_shards AS c (queue, status, shard, n)
            SELECT queue, status, job_count_shard(), count(*) FROM added GROUP BY queue, status
            ON CONFLICT (queue, status, shard) DO UPDATE SET n = c.n + excluded.n;
    ELSIF TG_LEVEL = 'ROW' AND TG_OP = 'DELETE' THEN
        INSERT INTO job_count_shards AS c (queue, status, shard, n)
            VALUES (OLD.queue, OLD.status, job_count_shard(), -1)
            ON CONFLICT (queue, status, shard) DO UPDATE SET n = c.n - 1;
    ELSIF TG_LEVEL = 'STATEMENT' AND TG_OP = 'UPDATE' THEN
        INSERT INTO job_count_shards AS c (queue, status, shard, n)
            SELECT queue, status, job_count_shard(), sum(d)
            FROM (SELECT queue, status, -1 AS d FROM removed
                  UNION ALL SELECT queue, status, 1 FROM added) AS m
            GROUP BY queue, status
            HAVING sum(d) <> 0
            ON CONFLICT (queue, status, shard) DO UPDATE SET n = c.n + excluded.n;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER job_counts_insert AFTER INSERT ON jobs
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION job_counts_follow();
CREATE TRIGGER job_counts_delete AFTER DELETE ON jobs
    FOR EACH ROW EXECUTE FUNCTION job_counts_follow();
-- A statement trigger with transition tables can neither name columns (UPDATE OF) nor test
-- rows (WHEN): every UPDATE of jobs calls it. A statement with several writable CTEs on jobs
-- (a claim's promotion and its pick) fires it once, with all their rows.
CREATE TRIGGER job_counts_update AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS removed NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION job_counts_follow();

-- A deleted job's events go with it (job_events has no foreign key since version 18, whose
-- check locked the job's row for each event written), as ON DELETE CASCADE did: a row trigger,
-- as the foreign key's own was, so that each delete finds the job's events through
-- job_events_job (a statement trigger's plan over its transition table, cached by plpgsql,
-- could read the whole table for each row of a bulk enqueue's abandon). The store's prune
-- deletes them itself first; this covers every other DELETE, hand-written ones included.
CREATE FUNCTION job_events_follow() RETURNS trigger
    LANGUAGE plpgsql SET search_path FROM CURRENT
AS $$
BEGIN
    DELETE FROM job_events WHERE job_id = OLD.id;
    RETURN NULL;
END
$$;
CREATE TRIGGER job_events_follow AFTER DELETE ON jobs
    FOR EACH ROW EXECUTE FUNCTION job_events_follow();
-- TRUNCATE fires no DELETE trigger: every count goes to 0, the queues' rows stay.
CREATE FUNCTION job_counts_truncate() RETURNS trigger
    LANGUAGE plpgsql SET search_path FROM CURRENT
AS $$
BEGIN
    INSERT INTO job_count_shards (queue, status, shard, n)
        SELECT DISTINCT queue, 'pending', 0, 0 FROM job_count_shards
        ON CONFLICT DO NOTHING;
    DELETE FROM job_count_shards WHERE shard <> 0;
    UPDATE job_count_shards SET n = 0;
    RETURN NULL;
END
$$;
CREATE TRIGGER job_counts_truncate AFTER TRUNCATE ON jobs
    FOR EACH STATEMENT EXECUTE FUNCTION job_counts_truncate();

-- One row per recurring schedule. A slot fires in the transaction that enqueues its job and
-- moves next_slot_at past it, guarded by next_slot_at (`UPDATE ... WHERE name = $1 AND
-- next_slot_at = $2`, whose row lock makes a second runner's guard re-read the moved value
-- and match nothing): any number of runners fire each slot exactly once.
CREATE TABLE schedules (
    name          TEXT    COLLATE "C" PRIMARY KEY CHECK (name <> ''),
    -- A cron expression (5 fields, 6 with seconds first, or an @shorthand), or NULL for an
    -- interval of every_ms milliseconds counted from anchor_at.
    cron          TEXT,
    every_ms      BIGINT  CHECK (every_ms IS NULL OR every_ms > 0),
    anchor_at     BIGINT  NOT NULL,
    -- An IANA zone name: cron fields are read in its local time.
    tz            TEXT    NOT NULL DEFAULT 'UTC',
    -- The job each slot enqueues: a JSON object of the `jobs add` options.
    job           TEXT    NOT NULL,
    catch_up      TEXT    NOT NULL DEFAULT 'skip' CHECK (catch_up IN ('skip', 'one', 'all')),
    overlap       TEXT    NOT NULL DEFAULT 'skip' CHECK (overlap IN ('skip', 'allow')),
    paused        BIGINT  NOT NULL DEFAULT 0,
    -- The newest slot fired (or missed), and the next slot due; NULL when none is left.
    last_slot_at  BIGINT,
    next_slot_at  BIGINT,
    created_at    BIGINT  NOT NULL,
    updated_at    BIGINT  NOT NULL,
    CHECK ((cron IS NULL) <> (every_ms IS NULL))
);
CREATE INDEX schedules_due ON schedules (next_slot_at) WHERE paused = 0;

-- A schedule's own history: missed and skipped slots (a fired slot is its job's history).
CREATE TABLE schedule_events (
    id          BIGINT  GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    schedule    TEXT    COLLATE "C" NOT NULL REFERENCES schedules (name) ON DELETE CASCADE,
    at          BIGINT  NOT NULL,
    kind        TEXT    NOT NULL,
    slot_at     BIGINT,
    detail      TEXT
);
CREATE INDEX schedule_events_schedule ON schedule_events (schedule, id);

-- Queue settings stored in the database, so that they hold across every runner and process on
-- it. A queue without a row has no limit and is not paused.
CREATE TABLE queues (
    name         TEXT    COLLATE "C" PRIMARY KEY,
    -- At most this many of the queue's jobs run at once, over every runner; NULL: no limit.
    max_running  BIGINT  CHECK (max_running IS NULL OR max_running >= 0),
    -- 1: the queue's jobs are not claimed (running ones finish).
    paused       BIGINT  NOT NULL DEFAULT 0 CHECK (paused IN (0, 1))
);

-- A job's dependencies: it runs only after every `after_id` succeeded. Rows stay after they
-- are satisfied, so that a job still shows what it waited for. `after_id` is no foreign key:
-- a finished dependency may be pruned before its dependent (and a batch's gate is `-id`).
CREATE TABLE job_deps (
    job_id    BIGINT  NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    after_id  BIGINT  NOT NULL,
    PRIMARY KEY (job_id, after_id)
);
-- The dependents of a job that just ended.
CREATE INDEX job_deps_after ON job_deps (after_id, job_id);

-- Jobs handed to a running runner by a command. A command that gets no answer stores the job
-- itself under the same token: whichever commits first stores the job and its token, and the
-- other finds the token and stores nothing. Rows are deleted some time after the command could
-- still be waiting, by the next hand-off.
CREATE TABLE handoffs (
    token       TEXT    COLLATE "C" PRIMARY KEY,
    job_id      BIGINT  NOT NULL,
    -- 1: the job's unique key matched a job, and job_id is that job.
    duplicate   BIGINT  NOT NULL CHECK (duplicate IN (0, 1)),
    expires_at  BIGINT  NOT NULL
);
CREATE INDEX handoffs_expiry ON handoffs (expires_at);

-- Bulk enqueues in bounded transactions: a batch's jobs are gated by a `job_deps` row naming
-- `-id`, counted in their `waiting`, until the batch commits (the gates are then lifted) or is
-- abandoned (its jobs are then deleted). See `src/migrations/0010_bounded.sql`.
CREATE TABLE batches (
    id          BIGINT  GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    -- 0 open, 1 committed, 2 abandoned.
    state       BIGINT  NOT NULL CHECK (state = 0 OR state = 1 OR state = 2),
    created_at  BIGINT  NOT NULL,
    expires_at  BIGINT  NOT NULL
);

-- Fan-outs in bounded transactions: an ending handles a few hundred of its dependents in its
-- own transaction and leaves the rest as a cascade, which whoever comes next continues a slice
-- at a time. Dependents of `job_id` with an id in (after_job, last_job] are still to be
-- handled (a success counts down their `waiting`; a failure or a cancel cancels the pending
-- ones, which may start cascades of their own); a slice moves `after_job` in the transaction
-- that handles them, so each is handled exactly once. `root` is the job whose failure started
-- a chain of cancels.
CREATE TABLE cascades (
    job_id     BIGINT  NOT NULL,
    status     TEXT    COLLATE "C" NOT NULL
               CHECK (status = 'succeeded' OR status = 'failed' OR status = 'cancelled'),
    root       BIGINT  NOT NULL,
    after_job  BIGINT  NOT NULL,
    last_job   BIGINT  NOT NULL,
    -- The order cascades were stored, which SQLite's statements read as `rowid` (the oldest
    -- is continued first).
    seq        BIGINT  GENERATED BY DEFAULT AS IDENTITY UNIQUE,
    PRIMARY KEY (job_id, status)
);

-- Samples of the durable counters and of two gauges, taken by a runner's sweeper once a
-- sample interval (a minute by default): the charts are the differences between consecutive
-- samples. The table keeps the newest 61 samples, and of the samples that were the first of
-- their 60 intervals (`coarse` = 1) the newest 25: at most 86 rows, whatever the number of
-- jobs. Pruning jobs leaves it alone; the counters it samples are never lowered.
-- (`at` is SQLite's INTEGER PRIMARY KEY, a rowid alias; the store always writes it.)
CREATE TABLE metric_samples (
    at         BIGINT  PRIMARY KEY,
    coarse     BIGINT  NOT NULL DEFAULT 0 CHECK (coarse = 0 OR coarse = 1),
    -- Gauges at `at`: running jobs, and pending jobs ready to claim (due, not waiting).
    running    BIGINT  NOT NULL,
    ready      BIGINT  NOT NULL,
    -- Counters so far: jobs ended by outcome, and failed attempts followed by a retry.
    succeeded  BIGINT  NOT NULL,
    failed     BIGINT  NOT NULL,
    lost       BIGINT  NOT NULL,
    cancelled  BIGINT  NOT NULL,
    retried    BIGINT  NOT NULL,
    -- The wait and run histograms so far, over every queue and outcome: the count of each
    -- bucket (not cumulative) of metric_histograms' bounds, +Inf last, comma-separated.
    wait       TEXT    NOT NULL,
    run        TEXT    NOT NULL
);
