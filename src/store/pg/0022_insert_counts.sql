-- PostgreSQL's migration 22: the count trigger of INSERTs per statement (issue 32). Its parts
-- are also in pg/schema.sql, which says why; src/migrations/0022_insert_counts.sql is
-- SQLite's (the version alone).
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
CREATE OR REPLACE FUNCTION job_counts_follow() RETURNS trigger
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

DROP TRIGGER IF EXISTS job_counts_insert ON jobs;
CREATE TRIGGER job_counts_insert AFTER INSERT ON jobs
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION job_counts_follow();
