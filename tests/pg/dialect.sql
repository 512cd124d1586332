-- The PostgreSQL text of each statement of src/store/*.rs that differs from SQLite (the list is
-- docs/postgres.md), prepared with untyped parameters, as the `postgres` crate's prepare()
-- does, so the server infers each parameter's type, and executed where its result shows a
-- difference of meaning. Run on a database made from src/store/pg/schema.sql:
--     psql -X -v ON_ERROR_STOP=1 -d DB -f tests/pg/dialect.sql
-- Ends with an error at the first statement that does not prepare or gives a wrong result;
-- prints `dialect texts ok` otherwise. Each PREPARE names the file:line of its statement.
\set QUIET on
SET client_min_messages = warning;
\o /dev/null
CREATE FUNCTION pg_temp.check(ok BOOLEAN, what TEXT) RETURNS VOID LANGUAGE plpgsql AS $$
BEGIN
    IF ok IS NOT TRUE THEN RAISE EXCEPTION 'wrong result: %', what; END IF;
END $$;

-- Some jobs: 1 pending due, 2 pending deferred, 3 running without lease, 4 running leased,
-- 5 succeeded with output, 6 running leased and expired.
INSERT INTO jobs (id, queue, argv, status, created_at, scheduled_at, deferred, run_token,
                  worker_id, lease_expires_at, completed_at)
VALUES (1, 'a', '["true"]', 'pending', 100, 100, 0, NULL, NULL, NULL, NULL),
       (2, 'b', '["true"]', 'pending', 100, 900, 1, NULL, NULL, NULL, NULL),
       (3, 'a', '["true"]', 'running', 100, 100, 0, NULL, 'w1', NULL, NULL),
       (4, 'a', '["true"]', 'running', 100, 100, 0, 't4', 'w1', 5000, NULL),
       (5, 'b', '["true"]', 'succeeded', 100, 100, 0, 't5', 'w1', NULL, 300),
       (6, 'a', '["true"]', 'running', 100, 100, 0, 't6', 'w2', 150, NULL);
SELECT setval(pg_get_serial_sequence('jobs', 'id'), 6);
INSERT INTO job_deps (job_id, after_id) VALUES (1, 5), (1, 4), (2, 99);
INSERT INTO job_output (job_id, attempt, stdout, stderr)
    VALUES (5, 1, '', convert_to(repeat('x', 2000) || 'é-end', 'UTF8'));

-- attempts.rs:21 (json_each): an array parameter.
PREPARE attempts_21 AS SELECT v FROM unnest($1::bigint[]) AS v WHERE v NOT IN (SELECT id FROM jobs);
SELECT pg_temp.check((SELECT array_agg(v) FROM unnest('{1,7,5,8}'::bigint[]) AS v
                      WHERE v NOT IN (SELECT id FROM jobs)) = '{7,8}', 'attempts_21');
EXECUTE attempts_21('{1,7}');
-- The same with the JSON text kept as the parameter.
PREPARE attempts_21_json AS SELECT value::bigint FROM jsonb_array_elements_text($1::jsonb)
    WHERE value::bigint NOT IN (SELECT id FROM jobs);
EXECUTE attempts_21_json('[1,7]');

-- batch.rs:53/55 (last_insert_rowid): RETURNING id.
PREPARE batch_53 AS INSERT INTO batches (state, created_at, expires_at) VALUES ($1, $2, $3)
    RETURNING id;
EXECUTE batch_53(0, 1, 2);
-- batch.rs:99 and :106: a parameter in an INSERT ... SELECT's list.
PREPARE batch_99 AS INSERT INTO job_deps (job_id, after_id) SELECT id, $3 FROM jobs
    WHERE id BETWEEN $1 AND $2;
PREPARE batch_106 AS INSERT INTO job_events (job_id, at, kind, attempt, detail)
    SELECT id, $3, 'enqueued', 0, queue FROM jobs WHERE id BETWEEN $1 AND $2;
-- batch.rs:166 (`?2 IS NULL OR id = ?2`): the first use of $2 needs its type.
PREPARE batch_166 AS SELECT id, state FROM batches WHERE state != $1 AND ($2::bigint IS NULL OR id = $2)
    ORDER BY id LIMIT 1;
EXECUTE batch_166(1, NULL);
-- batch.rs:176 (LIMIT (SELECT ?2)): a bare parameter; `(SELECT $2)` would be text.
PREPARE batch_176 AS SELECT job_id FROM job_deps WHERE after_id = $1 ORDER BY job_id LIMIT $2;
EXECUTE batch_176(5, 10);
-- batch.rs:218 (EXISTS): a boolean, as rusqlite reads it into bool.
PREPARE batch_218 AS SELECT EXISTS (SELECT 1 FROM job_deps WHERE job_id = $1 AND after_id < 0);
-- batch.rs:243 (sum): sum(bigint) is numeric on PostgreSQL.
SELECT pg_temp.check(pg_typeof(coalesce(sum(n), 0)) = 'numeric'::regtype, 'sum is numeric')
    FROM job_counts;
PREPARE batch_243 AS SELECT coalesce(sum(n), 0)::bigint FROM job_counts WHERE status = 'pending';
SELECT pg_temp.check((SELECT coalesce(sum(n), 0)::bigint FROM job_counts WHERE status = 'pending') = 2,
                     'pending count');

-- counter.rs (BUMP_SQL, OBSERVE_SQL: `value = value + 1` in DO UPDATE is ambiguous on
-- PostgreSQL): PG_BUMP_SQL and PG_OBSERVE_SQL write the transaction's shard, qualified by the
-- table's alias; the views metric_counters and metric_histograms sum the shards.
PREPARE counter_bump AS INSERT INTO metric_counter_shards AS c (name, queue, outcome, shard, value)
    VALUES ($1, $2, $3, job_count_shard(), 1)
    ON CONFLICT (name, queue, outcome, shard) DO UPDATE SET value = c.value + 1;
EXECUTE counter_bump('jobs_ended', 'a', 'succeeded');
EXECUTE counter_bump('jobs_ended', 'a', 'succeeded');
SELECT pg_temp.check((SELECT value FROM metric_counters) = 2, 'counter_bump');
SELECT pg_temp.check(pg_typeof((SELECT value FROM metric_counters)) = 'bigint'::regtype,
                     'a counter reads as bigint');
PREPARE counter_observe AS INSERT INTO metric_histogram_shards AS h
        (name, queue, outcome, le_ms, shard, count, sum_ms)
    VALUES ($1, $2, $3, $4, job_count_shard(), 1, $5)
    ON CONFLICT (name, queue, outcome, le_ms, shard)
    DO UPDATE SET count = h.count + 1, sum_ms = h.sum_ms + excluded.sum_ms;
EXECUTE counter_observe('run', 'a', 'succeeded', 10, 4);
EXECUTE counter_observe('run', 'a', 'succeeded', 10, 5);
SELECT pg_temp.check((SELECT (count, sum_ms) = (2::bigint, 9::bigint) FROM metric_histograms),
                     'counter_observe');
-- counter.rs:46 and :52 (the enqueue's own count, INSERT OR IGNORE INTO job_counts): nothing
-- on PostgreSQL; the INSERT trigger counts. job_counts is a view that cannot be written:
DO $$ BEGIN
    BEGIN
        UPDATE job_counts SET n = n + 1 WHERE queue = 'a' AND status = 'pending';
        RAISE EXCEPTION 'job_counts was written';
    EXCEPTION WHEN object_not_in_prerequisite_state OR feature_not_supported THEN NULL;
    END;
END $$;

-- dependency.rs:74 (ORDER BY rowid): the seq column.
PREPARE dependency_74 AS SELECT job_id, status, root, after_job, last_job FROM cascades
    ORDER BY seq LIMIT 16;
-- dependency.rs:141 (`?3 IS NULL`, LIMIT (SELECT ?4)).
PREPARE dependency_141 AS SELECT job_id FROM job_deps WHERE after_id = $1 AND job_id > $2
    AND ($3::bigint IS NULL OR job_id <= $3) ORDER BY job_id LIMIT $4;
EXECUTE dependency_141(5, 0, NULL, 16);
-- dependency.rs:195 (RETURNING): the same text.
PREPARE dependency_195 AS UPDATE jobs SET status = 'cancelled', completed_at = $2, last_error = $3
    WHERE id = $1 AND status = 'pending' RETURNING attempt, queue;
-- dependency.rs:231 (two-argument min and max): least and greatest.
PREPARE dependency_231 AS INSERT INTO cascades (job_id, status, root, after_job, last_job)
    VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (job_id, status) DO UPDATE SET root = excluded.root,
        after_job = least(cascades.after_job, excluded.after_job),
        last_job = greatest(cascades.last_job, excluded.last_job);
EXECUTE dependency_231(7, 'failed', 7, 10, 20);
EXECUTE dependency_231(8, 'failed', 8, 0, 1);
EXECUTE dependency_231(7, 'failed', 9, 5, 15);
SELECT pg_temp.check((SELECT (root, after_job, last_job) = (9::bigint, 5::bigint, 20::bigint)
                      FROM cascades WHERE job_id = 7), 'dependency_231');
SELECT pg_temp.check((SELECT array_agg(job_id ORDER BY seq) FROM cascades) = '{7,8}',
                     'dependency_74 keeps the first insertion order');
DELETE FROM cascades;

-- enqueue.rs:73 (`?2 IS NOT NULL`).
PREPARE enqueue_73 AS SELECT id FROM jobs WHERE unique_key = $1
    AND (status IN ('pending', 'running') OR ($2::bigint IS NOT NULL AND created_at > $2))
    ORDER BY id DESC LIMIT 1;
-- enqueue.rs:111 (`?13 > ?12`, a boolean stored in deferred) and :135 (last_insert_rowid).
PREPARE enqueue_111 AS INSERT INTO jobs (queue, argv, env, cwd, priority, status, max_attempts,
        backoff_base_ms, backoff_max_ms, on_lost, timeout_ms, idle_timeout_ms,
        created_at, scheduled_at, unique_key, schedule, slot_at, deferred)
    VALUES ($1, $2, $3, $4, $5, 'pending', $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
            ($13::bigint > $12::bigint)::int)
    RETURNING id;
EXECUTE enqueue_111('c', '["x"]', '[]', NULL, 0, 1, 1000, 3600000, 'requeue', NULL, NULL,
                    900, 10000, NULL, NULL, NULL);
SELECT pg_temp.check((SELECT deferred FROM jobs WHERE queue = 'c') = 1, 'enqueue_111 deferred');
SELECT pg_temp.check((SELECT n FROM job_counts WHERE queue = 'c' AND status = 'pending') = 1,
                     'an enqueue is counted by the trigger');
DELETE FROM jobs WHERE queue = 'c';
-- enqueue.rs:177 (INSERT OR IGNORE).
PREPARE enqueue_177 AS INSERT INTO job_deps (job_id, after_id) VALUES ($1, $2) ON CONFLICT DO NOTHING;
EXECUTE enqueue_177(1, 5);

-- failure.rs:23 (INDEXED BY; CAST(substr(blob, -1024) AS TEXT); LIMIT (SELECT ?1)): the
-- last 1024 bytes as bytea, decoded in Rust (String::from_utf8_lossy: the cut may split a
-- character, which convert_from would reject).
PREPARE failure_23 AS SELECT e.job_id, e.at, e.kind, e.attempt, e.detail, j.queue, j.argv, j.attempt,
        j.error_kind,
        (SELECT substring(o.stderr FROM greatest(length(o.stderr) - 1023, 1)) FROM job_output o
         WHERE o.job_id = e.job_id AND o.attempt = e.attempt ORDER BY o.id DESC LIMIT 1)
    FROM job_events e JOIN jobs j ON j.id = e.job_id
    WHERE (e.kind = 'failed' OR e.kind = 'retry_scheduled' OR e.kind = 'lost' OR e.kind = 'reclaimed')
    ORDER BY e.id DESC LIMIT $1;
SELECT pg_temp.check((SELECT length(substring(stderr FROM greatest(length(stderr) - 1023, 1)))
                             = 1024
                             AND substring(stderr FROM greatest(length(stderr) - 1023, 1))
                                 = substring(stderr FROM length(stderr) - 1023)
                      FROM job_output), 'failure_23 tail');
SELECT pg_temp.check((SELECT substring('\x0102'::bytea FROM greatest(length('\x0102'::bytea) - 1023, 1)))
                     = '\x0102'::bytea, 'failure_23 short tail');

-- lease.rs:80 (UPDATE OR FAIL): UPDATE. lease.rs:89 (lower(hex(randomblob(16)))).
PREPARE lease_89 AS SELECT id, queue, attempt + 1, replace(gen_random_uuid()::text, '-', ''), argv,
        env, cwd, timeout_ms, idle_timeout_ms, priority, scheduled_at
    FROM jobs
    WHERE status = 'pending' AND teardown_token IS NULL AND waiting = 0 AND deferred = 0
      AND scheduled_at <= $1 AND queue IN ($3, $4)
    ORDER BY priority DESC, scheduled_at, id LIMIT $2;
EXECUTE lease_89(1000, 5, 'a', 'b');
SELECT pg_temp.check(replace(gen_random_uuid()::text, '-', '') ~ '^[0-9a-f]{32}$', 'token');
-- lease.rs:131 (INDEXED BY, LIMIT (SELECT ?3)).
PREPARE lease_131 AS SELECT id, priority, scheduled_at FROM jobs
    WHERE queue = $1 AND status = 'pending' AND teardown_token IS NULL AND waiting = 0
      AND deferred = 0 AND scheduled_at <= $2
    ORDER BY priority DESC, scheduled_at, id LIMIT $3;
-- lease.rs:221.
PREPARE lease_221 AS SELECT id FROM jobs WHERE deferred = 1 AND scheduled_at <= $1
    ORDER BY scheduled_at LIMIT $2;
-- lease.rs:259 (the skip-scan over queues; INDEXED BY dropped).
PREPARE lease_259 AS WITH RECURSIVE q(name) AS (
        SELECT (SELECT queue FROM jobs
                WHERE status = 'pending' AND teardown_token IS NULL AND waiting = 0
                ORDER BY queue LIMIT 1)
        UNION ALL
        SELECT (SELECT queue FROM jobs
                WHERE status = 'pending' AND teardown_token IS NULL AND waiting = 0
                  AND queue > q.name
                ORDER BY queue LIMIT 1)
        FROM q WHERE q.name IS NOT NULL)
    SELECT min((SELECT min(scheduled_at) FROM jobs
                WHERE queue = q.name AND status = 'pending' AND teardown_token IS NULL
                  AND waiting = 0 AND scheduled_at > $1))
    FROM q WHERE q.name IS NOT NULL;
EXECUTE lease_259(100);
-- lease.rs:482 (json_each of tokens): an array.
PREPARE lease_482 AS UPDATE jobs SET heartbeat_at = $2, lease_expires_at = $3
    WHERE status = 'running' AND worker_id = $1 AND run_token = ANY($4::text[])
    RETURNING run_token;
BEGIN;
CREATE TEMP TABLE renewed (run_token TEXT);
WITH r AS (UPDATE jobs SET heartbeat_at = 1, lease_expires_at = 9000
           WHERE status = 'running' AND worker_id = 'w1'
             AND run_token = ANY('{t4,t9}'::text[]) RETURNING run_token)
INSERT INTO renewed SELECT run_token FROM r;
SELECT pg_temp.check((SELECT array_agg(run_token) FROM renewed) = '{t4}', 'lease_482');
ROLLBACK;
-- lease.rs PG_RENEW_SQL and LOCK_RUNNING_SQL, as the store sends them: the running rows locked
-- in ascending id order first (docs/postgres.md, "One order for job rows"), then renewed.
PREPARE lease_pg_renew AS WITH mine AS MATERIALIZED (
        SELECT id FROM jobs
        WHERE status = 'running' AND worker_id = $1
          AND run_token IN (SELECT value FROM json_array_elements_text(($4)::json))
        ORDER BY id FOR NO KEY UPDATE)
    UPDATE jobs SET heartbeat_at = $2, lease_expires_at = $3
    FROM mine
    WHERE jobs.id = mine.id AND jobs.status = 'running' AND jobs.worker_id = $1
    RETURNING jobs.run_token;
BEGIN;
EXECUTE lease_pg_renew('w1', 1, 9000, '["t4", "t6", "t9"]');
SELECT pg_temp.check((SELECT array_agg(lease_expires_at ORDER BY id) FROM jobs
                      WHERE id IN (4, 6)) = '{9000,150}', 'lease_pg_renew');
PREPARE lease_lock_running AS SELECT id FROM jobs
    WHERE id IN (SELECT value::bigint FROM json_array_elements_text(($1)::json))
      AND status = 'running'
    ORDER BY id FOR NO KEY UPDATE;
EXECUTE lease_lock_running('[6, 5, 4]');
SELECT pg_temp.check((SELECT array_agg(id) FROM (SELECT id FROM jobs
                          WHERE id IN (SELECT value::bigint
                                       FROM json_array_elements_text(('[6, 5, 4]')::json))
                            AND status = 'running'
                          ORDER BY id FOR NO KEY UPDATE) AS locked) = '{4,6}',
                     'lease_lock_running');
ROLLBACK;
-- lease.rs:643 (`?3 + ?5`, `deferred = ?5 > 0`).
PREPARE lease_643 AS UPDATE jobs SET status = 'pending', failed_attempts = $4,
        scheduled_at = $3::bigint + $5::bigint, deferred = ($5::bigint > 0)::int, exit_code = $6,
        signal = $7, error_kind = $8, last_error = $9, started_at = NULL, completed_at = NULL,
        heartbeat_at = NULL, lease_expires_at = NULL, run_token = NULL, worker_id = NULL
    WHERE id = $1 AND status = 'running' AND run_token = $2;
-- lease.rs:690 (CASE ... THEN ?3 END: an untyped CASE is text).
PREPARE lease_690 AS UPDATE jobs SET status = $4, recovery_count = $5, last_error = $6,
        scheduled_at = CASE WHEN $4 = 'pending' THEN $3::bigint ELSE scheduled_at END,
        completed_at = CASE WHEN $4 = 'failed' THEN $3::bigint END,
        error_kind = CASE WHEN $4 = 'failed' THEN 'lost' END,
        run_token = CASE WHEN $4 = 'pending' THEN NULL ELSE run_token END,
        worker_id = CASE WHEN $4 = 'pending' THEN NULL ELSE worker_id END,
        started_at = CASE WHEN $4 = 'pending' THEN NULL ELSE started_at END,
        lease_expires_at = NULL,
        heartbeat_at = CASE WHEN $4 = 'pending' THEN NULL ELSE $3::bigint END
    WHERE id = $1 AND status = 'running' AND run_token = $2;
BEGIN;
EXECUTE lease_690(6, 't6', 777, 'failed', 1, 'lost');
SELECT pg_temp.check((SELECT (status, completed_at, heartbeat_at, error_kind)
                             = ('failed', 777::bigint, 777::bigint, 'lost') FROM jobs WHERE id = 6),
                     'lease_690');
ROLLBACK;
-- lease.rs:717, :746, :753: UPDATE OR FAIL becomes UPDATE; the rest is the same text.
PREPARE lease_746 AS UPDATE jobs SET status = 'succeeded', completed_at = $3, exit_code = 0,
        signal = NULL, error_kind = NULL, lease_expires_at = NULL, heartbeat_at = $3
    WHERE id = $1 AND status = 'running' AND run_token = $2;
-- lease.rs:803 (`run_token IS ?2`; a boolean result).
PREPARE lease_803 AS SELECT status = 'cancelled' AND run_token IS NOT DISTINCT FROM $2 AND attempt = $3
    FROM jobs WHERE id = $1;
SELECT pg_temp.check((SELECT run_token IS NOT DISTINCT FROM NULL FROM jobs WHERE id = 3)
                     AND (SELECT NOT (run_token IS NOT DISTINCT FROM NULL) FROM jobs WHERE id = 4),
                     'IS NOT DISTINCT FROM');
-- lease.rs:855 (stdout_truncated from a Rust bool): cast the boolean parameter.
PREPARE lease_855 AS INSERT INTO job_output
        (job_id, attempt, stdout, stderr, stdout_truncated, stderr_truncated)
    VALUES ($1, $2, $3, $4, $5::boolean::int, $6::boolean::int);
EXECUTE lease_855(5, 2, '\x00ff', '', true, false);
SELECT pg_temp.check((SELECT (stdout, stdout_truncated) = ('\x00ff'::bytea, 1::bigint)
                      FROM job_output WHERE attempt = 2), 'lease_855');

-- handoff.rs:303 and :327 (duplicate: a Rust bool in and out).
PREPARE handoff_303 AS SELECT job_id, duplicate <> 0 FROM handoffs WHERE token = $1;
PREPARE handoff_327 AS INSERT INTO handoffs (token, job_id, duplicate, expires_at)
    VALUES ($1, $2, $3::boolean::int, $4);

-- maintenance.rs:33 and :128 (pragma_user_version, pragma_freelist_count, page_count, page_size).
PREPARE maintenance_33 AS SELECT (SELECT max(version) FROM leasehold_migrations),
        pg_database_size(current_database());
EXECUTE maintenance_33;
PREPARE maintenance_128 AS SELECT sum(pg_total_relation_size(c.oid))::bigint
    FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r';
EXECUTE maintenance_128;

-- metrics.rs:26 (INDEXED BY dropped).
PREPARE metrics_26 AS SELECT q.queue,
        (SELECT min(scheduled_at) FROM jobs
         WHERE queue = q.queue AND status = 'pending' AND teardown_token IS NULL AND waiting = 0
           AND scheduled_at <= $1)
    FROM (SELECT DISTINCT queue FROM job_counts) AS q ORDER BY q.queue;
EXECUTE metrics_26(1000);

-- open.rs:253 (user_version, sqlite_master): whether the schema exists, and its version.
PREPARE open_253 AS SELECT to_regclass('leasehold_migrations') IS NOT NULL;
SELECT pg_temp.check((SELECT max(version) FROM leasehold_migrations) = 15, 'version 15');
-- open.rs:508 (BEGIN IMMEDIATE around a migration): BEGIN, then the advisory lock.
BEGIN;
SELECT pg_advisory_xact_lock(7810756276994469740);
COMMIT;

-- queue.rs:22 (paused into a Rust bool).
PREPARE queue_22 AS SELECT name, max_running, paused <> 0,
        CASE WHEN max_running IS NOT NULL AND paused = 0 THEN
            (SELECT count(*) FROM jobs WHERE status = 'running' AND queue = queues.name)
        ELSE 0 END
    FROM queues WHERE paused != 0 OR max_running IS NOT NULL;
-- queue.rs:43 (INDEXED BY dropped).
PREPARE queue_43 AS WITH RECURSIVE q(name) AS (
        SELECT (SELECT queue FROM jobs
                WHERE status = 'pending' AND teardown_token IS NULL AND waiting = 0 AND deferred = 0
                ORDER BY queue LIMIT 1)
        UNION ALL
        SELECT (SELECT queue FROM jobs
                WHERE status = 'pending' AND teardown_token IS NULL AND waiting = 0 AND deferred = 0
                  AND queue > q.name
                ORDER BY queue LIMIT 1)
        FROM q WHERE q.name IS NOT NULL)
    SELECT name FROM q WHERE name IS NOT NULL;
SELECT pg_temp.check((SELECT array_agg(name) FROM (WITH RECURSIVE q(name) AS (
        SELECT (SELECT queue FROM jobs WHERE status = 'pending' ORDER BY queue LIMIT 1)
        UNION ALL
        SELECT (SELECT queue FROM jobs WHERE status = 'pending' AND queue > q.name
                ORDER BY queue LIMIT 1)
        FROM q WHERE q.name IS NOT NULL)
    SELECT name FROM q WHERE name IS NOT NULL) x) = '{a,b}', 'queue_43');
-- queue.rs:88 (paused from a Rust bool).
PREPARE queue_88 AS INSERT INTO queues (name, paused) VALUES ($1, $2::boolean::int)
    ON CONFLICT (name) DO UPDATE SET paused = excluded.paused;
EXECUTE queue_88('a', true);
EXECUTE queue_88('a', false);
SELECT pg_temp.check((SELECT paused FROM queues WHERE name = 'a') = 0, 'queue_88');
-- queue.rs:139 (sums; `?2 AND total > 0`: a boolean parameter; paused into a bool).
PREPARE queue_139 AS WITH counts AS (
        SELECT queue AS name,
               coalesce(sum(n) FILTER (WHERE status = 'pending'), 0)::bigint AS pending,
               coalesce(sum(n) FILTER (WHERE status = 'running'), 0)::bigint AS running,
               coalesce(sum(n) FILTER (WHERE status = 'succeeded'), 0)::bigint AS succeeded,
               coalesce(sum(n) FILTER (WHERE status = 'failed'), 0)::bigint AS failed,
               coalesce(sum(n) FILTER (WHERE status = 'cancelled'), 0)::bigint AS cancelled,
               sum(n)::bigint AS total
        FROM job_counts GROUP BY queue),
    waits AS (
        SELECT jobs.queue AS name, count(*) AS waiting
        FROM (SELECT DISTINCT job_id FROM job_deps) d JOIN jobs ON jobs.id = d.job_id
        WHERE jobs.status = 'pending' AND jobs.waiting > 0
        GROUP BY jobs.queue),
    names AS (SELECT name FROM counts WHERE pending + running > 0 OR ($2::boolean AND total > 0)
              UNION SELECT name FROM queues)
    SELECT n.name, coalesce(c.pending, 0), coalesce(w.waiting, 0), coalesce(c.running, 0),
           q.max_running, coalesce(q.paused, 0) <> 0,
           coalesce(c.succeeded, 0), coalesce(c.failed, 0), coalesce(c.cancelled, 0),
           (SELECT min(scheduled_at) FROM jobs
                WHERE queue = n.name AND status = 'pending' AND teardown_token IS NULL
                  AND waiting = 0 AND scheduled_at <= $1)
    FROM names n LEFT JOIN counts c ON c.name = n.name LEFT JOIN waits w ON w.name = n.name
        LEFT JOIN queues q ON q.name = n.name
    ORDER BY n.name;
EXECUTE queue_139(1000, true);

-- read.rs:92 and :198 (sums).
PREPARE read_92 AS SELECT coalesce(sum(n) FILTER (WHERE status = $1), 0)::bigint,
        coalesce(sum(n) FILTER (WHERE queue = $2), 0)::bigint
    FROM job_counts;
EXECUTE read_92('running', 'a');
PREPARE read_198 AS SELECT status, sum(n)::bigint FROM job_counts GROUP BY status;
-- read.rs:109 (WHERE 1).
PREPARE read_109 AS SELECT id FROM jobs WHERE true ORDER BY id DESC;
-- read.rs:177 (`?2 IS NULL OR attempt = ?2`; truncated flags into Rust bools).
PREPARE read_177 AS SELECT attempt, stdout, stderr, stdout_truncated <> 0, stderr_truncated <> 0
    FROM job_output WHERE job_id = $1 AND ($2::bigint IS NULL OR attempt = $2)
    ORDER BY id DESC LIMIT 1;
EXECUTE read_177(5, NULL);
-- read.rs:220 (sum of comparisons): count(*) FILTER.
PREPARE read_220 AS SELECT count(*),
        count(*) FILTER (WHERE lease_expires_at IS NOT NULL AND lease_expires_at < $1),
        count(*) FILTER (WHERE run_token IS NULL OR worker_id IS NULL OR lease_expires_at IS NULL)
    FROM jobs WHERE status = 'running';
SELECT pg_temp.check((SELECT (count(*),
        count(*) FILTER (WHERE lease_expires_at IS NOT NULL AND lease_expires_at < 1000),
        count(*) FILTER (WHERE run_token IS NULL OR worker_id IS NULL OR lease_expires_at IS NULL))
        = (3::bigint, 1::bigint, 1::bigint) FROM jobs WHERE status = 'running'), 'read_220');
-- read.rs:236 (INDEXED BY dropped; ?max is the parameter's number).
PREPARE read_236 AS SELECT count(*) FROM jobs WHERE status = 'failed' AND recovery_count > $1
    AND (lower(coalesce(last_error, '')) LIKE 'lease expired after missing heartbeat;%'
         OR lower(coalesce(last_error, '')) LIKE 'lease metadata missing for running job;%');
-- read.rs:252 (EXISTS with the queue filter).
PREPARE read_252 AS SELECT EXISTS (SELECT 1 FROM jobs WHERE status IN ('pending', 'running')
    AND queue IN ($1));

-- reclaim.rs:184 (`?1 IS NULL`, boolean ?2, json_each, LIMIT (SELECT ?5), and NULLs first:
-- SQLite sorts NULL lease_expires_at first, PostgreSQL last unless told).
PREPARE reclaim_184 AS SELECT id, attempt, run_token, worker_id, pgid, proc_start_time,
        lease_expires_at, on_lost, recovery_count, keeper_pid, keeper_start_time, started_at,
        timeout_ms, idle_timeout_ms, queue
    FROM jobs
    WHERE status = 'running'
      AND ($1::text IS NULL OR worker_id IS NULL OR worker_id != $1
           OR ($6::text[] IS NOT NULL AND $2::boolean AND lease_expires_at < $3
               AND run_token <> ALL($6::text[])))
      AND (run_token IS NULL OR worker_id IS NULL OR lease_expires_at IS NULL
           OR ($2 AND lease_expires_at < $3)
           OR worker_id = ANY($4::text[]))
    ORDER BY lease_expires_at NULLS FIRST, id LIMIT $5;
SELECT pg_temp.check((SELECT array_agg(id ORDER BY lease_expires_at NULLS FIRST, id)
                      FROM jobs WHERE status = 'running') = '{3,6,4}', 'reclaim order');
EXECUTE reclaim_184(NULL, true, 1000, '{}', 10, NULL);
-- reclaim.rs:346 (`run_token IS ?2`, CASE ... THEN ?6 END).
PREPARE reclaim_346 AS UPDATE jobs SET status = $3, recovery_count = $4, last_error = $5,
        scheduled_at = CASE WHEN $3 = 'pending' THEN $6::bigint ELSE scheduled_at END,
        completed_at = CASE WHEN $3 = 'failed' THEN $6::bigint END,
        error_kind = CASE WHEN $3 = 'failed' THEN 'lost' END,
        started_at = CASE WHEN $3 = 'pending' THEN NULL ELSE started_at END,
        heartbeat_at = CASE WHEN $3 = 'pending' THEN NULL ELSE heartbeat_at END,
        lease_expires_at = NULL,
        run_token = CASE WHEN $3 = 'pending' THEN NULL ELSE run_token END,
        worker_id = CASE WHEN $3 = 'pending' THEN NULL ELSE worker_id END,
        teardown_token = $7, teardown_pgid = pgid,
        teardown_start_time = proc_start_time, teardown_worker = worker_id
    WHERE id = $1 AND status = 'running' AND run_token IS NOT DISTINCT FROM $2;
BEGIN;
EXECUTE reclaim_346(3, NULL, 'pending', 1, 'lease metadata missing for running job; x', 500, 'td');
SELECT pg_temp.check((SELECT (status, scheduled_at, teardown_token, teardown_worker)
                             = ('pending', 500::bigint, 'td', 'w1') FROM jobs WHERE id = 3),
                     'reclaim_346 matches a NULL run_token');
ROLLBACK;
-- reclaim.rs:504/535 ({index} is INDEXED BY jobs_teardown: empty on PostgreSQL).
PREPARE reclaim_535 AS SELECT j.id, j.attempt, j.teardown_token, j.teardown_pgid,
        j.teardown_start_time, j.teardown_worker, r.host, r.boot_id, r.pid_ns
    FROM jobs j LEFT JOIN runners r ON r.worker_id = j.teardown_worker
    WHERE j.teardown_token IS NOT NULL AND j.id > $1 ORDER BY j.id LIMIT $2;

-- retention.rs:330 (LIMIT (SELECT ?4); the row comparison is the same).
PREPARE retention_330 AS SELECT id FROM jobs
    WHERE status = $1 AND completed_at IS NOT NULL AND (completed_at, id) <= ($2, $3)
      AND teardown_token IS NULL
    ORDER BY completed_at, id LIMIT $4;
EXECUTE retention_330('succeeded', 1000, 100, 10);
-- retention.rs:375, :378, :384 (json_each of ids).
PREPARE retention_375 AS DELETE FROM job_events WHERE job_id = ANY($1::bigint[]);
PREPARE retention_378 AS DELETE FROM job_output WHERE job_id = ANY($1::bigint[]);
PREPARE retention_384 AS DELETE FROM jobs WHERE id = ANY($1::bigint[])
    AND status IN ('succeeded', 'failed', 'cancelled') AND teardown_token IS NULL;

-- row.rs:10 (json_group_array; teardown_token IS NOT NULL is a boolean).
PREPARE row_10 AS SELECT id, teardown_token IS NOT NULL,
        (SELECT coalesce(array_agg(after_id ORDER BY after_id), '{}') FROM job_deps
         WHERE job_id = jobs.id),
        (SELECT coalesce(array_agg(d.after_id ORDER BY d.after_id), '{}') FROM job_deps d
             LEFT JOIN jobs p ON p.id = d.after_id
         WHERE d.job_id = jobs.id AND p.status IS NOT NULL AND p.status != 'succeeded'),
        (SELECT coalesce(json_agg(after_id ORDER BY after_id), '[]')::text FROM job_deps
         WHERE job_id = jobs.id)
    FROM jobs WHERE id = $1;
EXECUTE row_10(1);
SELECT pg_temp.check((SELECT (SELECT coalesce(array_agg(after_id ORDER BY after_id), '{}')
                              FROM job_deps WHERE job_id = jobs.id) = '{4,5}'
                      FROM jobs WHERE id = 1), 'row_10 deps');
SELECT pg_temp.check((SELECT (SELECT coalesce(array_agg(after_id ORDER BY after_id), '{}')
                              FROM job_deps WHERE job_id = jobs.id) = '{}'
                      FROM jobs WHERE id = 3), 'row_10 no deps');

-- runners.rs:159 (rowid).
PREPARE runners_159 AS SELECT worker_id, pid, proc_start_time, boot_id, host, started_at,
        heartbeat_at, stopped_at, lease_ttl_ms, heartbeat_interval_ms, max_recovery_attempts, pid_ns
    FROM runners ORDER BY started_at DESC, seq DESC LIMIT 1;

-- sample.rs:22, :132, :138, :163 (sums).
PREPARE sample_22 AS SELECT coalesce(sum((SELECT count(*) FROM jobs
        WHERE queue = q.queue AND status = 'pending' AND teardown_token IS NULL AND waiting = 0
          AND scheduled_at <= $1)), 0)::bigint
    FROM (SELECT queue FROM job_counts WHERE status = 'pending' AND n > 0) q;
EXECUTE sample_22(1000);
PREPARE sample_94 AS INSERT INTO metric_samples (at, coarse, running, ready, succeeded, failed,
        lost, cancelled, retried, wait, run)
    VALUES ($1, $2::boolean::int, $3, $4, $5, $6, $7, $8, $9, $10, $11);
PREPARE sample_132 AS SELECT coalesce(sum(n), 0)::bigint FROM job_counts WHERE status = 'running';
PREPARE sample_138 AS SELECT name, outcome, sum(value)::bigint FROM metric_counters
    WHERE name = 'jobs_ended' OR name = 'retries_scheduled' GROUP BY name, outcome;
PREPARE sample_163 AS SELECT le_ms, sum(count)::bigint FROM metric_histograms WHERE name = $1
    GROUP BY le_ms;
PREPARE sample_191 AS SELECT at, coarse <> 0, running, ready, succeeded, failed, lost, cancelled,
        retried, wait, run FROM metric_samples ORDER BY at;

-- schedule.rs:93 COLUMNS (paused into a Rust bool), :233 (paused from one).
PREPARE schedule_233 AS UPDATE schedules SET paused = $2::boolean::int, next_slot_at = $3,
    updated_at = $4 WHERE name = $1;

-- ready.rs:54 (an index's text in sqlite_master): PostgreSQL keeps the predicate normalized.
SELECT pg_temp.check(pg_get_expr(i.indpred, i.indrelid)
    = '((status = ''pending''::text) AND (teardown_token IS NULL) AND (waiting = 0) AND (deferred = 0))',
    'claim index predicate') FROM pg_index i WHERE i.indexrelid = 'jobs_claim'::regclass;
PREPARE ready_54 AS SELECT pg_get_expr(i.indpred, i.indrelid) FROM pg_index i
    WHERE i.indexrelid = to_regclass($1);

\o
SELECT 'dialect texts ok' AS result;
