-- job_counts is exact: random inserts, status changes, hand-written queue moves (alone and
-- with a status change), multi-row updates, deletes, rolled-back subtransactions and a
-- TRUNCATE, then the view is compared with a count of the table. Run on a database made from
-- src/store/pg/schema.sql:
--     psql -v ON_ERROR_STOP=1 -d DB -f tests/pg/counts_exact.sql
-- It ends with an error if a count differs, and prints `counts exact` otherwise.
\set QUIET on
SELECT setseed(0.23) \g /dev/null

CREATE FUNCTION pg_temp.counts_differ() RETURNS BIGINT LANGUAGE sql AS $$
    SELECT count(*) FROM (
        (SELECT queue, status, n FROM job_counts WHERE n <> 0
         EXCEPT ALL
         SELECT queue, status, count(*) FROM jobs GROUP BY 1, 2)
        UNION ALL
        (SELECT queue, status, count(*) FROM jobs GROUP BY 1, 2
         EXCEPT ALL
         SELECT queue, status, n FROM job_counts WHERE n <> 0)) AS d
$$;

CREATE FUNCTION pg_temp.random_ops(ops INT) RETURNS VOID LANGUAGE plpgsql AS $$
DECLARE
    statuses TEXT[] := ARRAY['pending', 'running', 'succeeded', 'failed', 'cancelled'];
    queues TEXT[] := ARRAY['default', 'a', 'b', 'Mail-1', 'mail_2', 'z'];
    r DOUBLE PRECISION;
    top BIGINT;
    victim BIGINT;
BEGIN
    FOR i IN 1 .. ops LOOP
        r := random();
        SELECT max(id) INTO top FROM jobs;
        SELECT id INTO victim FROM jobs
            WHERE id >= floor(random() * (top + 1)) ORDER BY id LIMIT 1;
        IF r < 0.25 OR victim IS NULL THEN
            -- an enqueue of 1 to 5 jobs in one statement
            INSERT INTO jobs (queue, argv, status, created_at, scheduled_at)
                SELECT queues[1 + floor(random() * 6)::int], '["true"]',
                       statuses[1 + floor(random() * 5)::int], 0, 0
                FROM generate_series(1, 1 + floor(random() * 5)::int);
        ELSIF r < 0.55 THEN
            -- a transition (sometimes to the status it already has)
            UPDATE jobs SET status = statuses[1 + floor(random() * 5)::int] WHERE id = victim;
        ELSIF r < 0.62 THEN
            -- a claim-like update of several rows at once
            UPDATE jobs SET status = 'running', attempt = attempt + 1
                WHERE id IN (SELECT id FROM jobs WHERE status = 'pending' AND id >= victim
                             ORDER BY id LIMIT 4);
        ELSIF r < 0.70 THEN
            -- a hand-written move to another queue, maybe new, maybe the same one
            UPDATE jobs SET queue = queues[1 + floor(random() * 6)::int] WHERE id = victim;
        ELSIF r < 0.74 THEN
            -- queue and status at once
            UPDATE jobs SET queue = 'q' || floor(random() * 3)::int,
                            status = statuses[1 + floor(random() * 5)::int]
                WHERE id = victim;
        ELSIF r < 0.78 THEN
            -- an update that names status but keeps it, and one that names neither
            UPDATE jobs SET status = status, heartbeat_at = i WHERE id = victim;
            UPDATE jobs SET heartbeat_at = i WHERE id = victim;
        ELSIF r < 0.90 THEN
            -- a deletion, sometimes of several (pruning)
            DELETE FROM jobs WHERE id >= victim AND id < victim + 1 + floor(random() * 3)::int;
        ELSE
            -- work undone by a rolled-back subtransaction
            BEGIN
                UPDATE jobs SET status = 'failed', queue = 'rolled_back' WHERE id = victim;
                INSERT INTO jobs (queue, argv, created_at, scheduled_at)
                    VALUES ('rolled_back', '[]', 0, 0);
                DELETE FROM jobs WHERE id = victim + 1;
                RAISE EXCEPTION 'undo';
            EXCEPTION WHEN raise_exception THEN
                NULL;
            END;
        END IF;
    END LOOP;
END
$$;

-- In 20 transactions (psql's autocommit): each takes a shard.
\o /dev/null
SELECT 'SELECT pg_temp.random_ops(1000)' FROM generate_series(1, 20) \gexec
\o
SELECT CASE WHEN pg_temp.counts_differ() = 0 THEN 'after 20,000 operations: counts exact'
            ELSE 'after 20,000 operations: ' || pg_temp.counts_differ() || ' rows differ' END AS result;
DO $$ BEGIN
    IF pg_temp.counts_differ() <> 0 THEN RAISE EXCEPTION 'job_counts differs from jobs'; END IF;
END $$;

-- Every queue that ever had a job reads as five rows, one per status, 0 when none.
DO $$ BEGIN
    IF EXISTS (SELECT queue FROM job_counts GROUP BY queue HAVING count(*) <> 5)
       OR (SELECT count(DISTINCT queue) FROM job_counts)
          < (SELECT count(DISTINCT queue) FROM jobs) THEN
        RAISE EXCEPTION 'job_counts lacks a row of a queue';
    END IF;
    IF (SELECT count(*) FROM job_counts WHERE queue = 'rolled_back') <> 0 THEN
        RAISE EXCEPTION 'a rolled-back queue has rows';
    END IF;
END $$;

-- A whole transaction rolled back leaves the counts as they were.
BEGIN;
SELECT pg_temp.random_ops(500) \g /dev/null
ROLLBACK;
DO $$ BEGIN
    IF pg_temp.counts_differ() <> 0 THEN RAISE EXCEPTION 'job_counts differs after ROLLBACK'; END IF;
END $$;

-- TRUNCATE (which fires no row trigger) sets every count to 0 and keeps the queues.
CREATE TEMP TABLE queues_before AS SELECT DISTINCT queue FROM job_counts;
SET client_min_messages = warning;
TRUNCATE jobs CASCADE;
DO $$ BEGIN
    IF EXISTS (SELECT 1 FROM job_counts WHERE n <> 0)
       OR (SELECT count(*) FROM job_counts) <> 5 * (SELECT count(*) FROM queues_before) THEN
        RAISE EXCEPTION 'job_counts after TRUNCATE';
    END IF;
END $$;
SELECT pg_temp.random_ops(2000) \g /dev/null
DO $$ BEGIN
    IF pg_temp.counts_differ() <> 0 THEN RAISE EXCEPTION 'job_counts differs after TRUNCATE'; END IF;
END $$;
SELECT 'counts exact' AS result;
