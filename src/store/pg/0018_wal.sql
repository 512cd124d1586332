-- PostgreSQL's migration 18: less WAL a job (issue 32). Each part is also in pg/schema.sql,
-- which says why; src/migrations/0018_wal.sql is SQLite's (the version alone). Each part
-- may find itself done already (IF EXISTS, OR REPLACE): a database shaped by hand.
--
-- jobs_status without the rows of running and succeeded jobs.
DROP INDEX IF EXISTS jobs_status;
CREATE INDEX jobs_status ON jobs (status, id) WHERE status <> 'running' AND status <> 'succeeded';

-- No foreign key from job_events to jobs; a row trigger deletes a deleted job's events.
ALTER TABLE job_events DROP CONSTRAINT IF EXISTS job_events_job_id_fkey;

-- The count trigger of UPDATEs per statement, over transition tables (the function's text
-- is pg/schema.sql's; the row triggers of INSERT and DELETE call it as before).
-- The count changes of `jobs` (the same semantics as SQLite's job_counts_delete,
-- job_counts_status and job_counts_queue triggers, and the enqueue's own addition):
-- - per row, an INSERT adds its row to its (queue, status) and a DELETE takes it away: one
--   upsert of the transaction's shard row each, as versions 15 to 17 did (a bulk enqueue
--   inserts a row a statement, which a statement trigger would only slow);
-- - per UPDATE statement (version 18), over its transition tables: the rows' old (queue,
--   status) taken away and their new ones added, so that only the rows whose status or queue
--   (hand-written SQL only moves queues) changed count, with one upsert for each (queue,
--   status) whose count changed. A claim, or a batch of successes, of 16 jobs writes two
--   shard rows, not 32 row locks and 32 updates; a statement that moves no job between counts
--   (a lease's renewal) writes nothing and takes no shard.
-- The trigger functions keep the search_path they were created with (SET ... FROM CURRENT): a
-- hand-written `UPDATE myschema.jobs ...` from a session whose search_path lacks the schema
-- still counts into that schema's shards.
CREATE OR REPLACE FUNCTION job_counts_follow() RETURNS trigger
    LANGUAGE plpgsql SET search_path FROM CURRENT
AS $$
BEGIN
    IF TG_LEVEL = 'ROW' AND TG_OP = 'INSERT' THEN
        INSERT INTO job_count_shards AS c (queue, status, shard, n)
            VALUES (NEW.queue, NEW.status, job_count_shard(), 1)
            ON CONFLICT (queue, status, shard) DO UPDATE SET n = c.n + 1;
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

DROP TRIGGER IF EXISTS job_counts_update ON jobs;
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
CREATE OR REPLACE FUNCTION job_events_follow() RETURNS trigger
    LANGUAGE plpgsql SET search_path FROM CURRENT
AS $$
BEGIN
    DELETE FROM job_events WHERE job_id = OLD.id;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS job_events_follow ON jobs;
CREATE TRIGGER job_events_follow AFTER DELETE ON jobs
    FOR EACH ROW EXECUTE FUNCTION job_events_follow();
