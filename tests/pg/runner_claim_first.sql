-- One runner-like transaction for pgbench (tests/pg/counts_concurrent.sh): enqueue, claim with
-- SKIP LOCKED, end some of this client's running jobs, retry a failed one, move a job to
-- another queue by hand, prune; counts change in several statements of one transaction.
BEGIN;
INSERT INTO jobs (queue, argv, created_at, scheduled_at)
    SELECT 'q' || (1 + floor(random() * 4)::int), '["true"]', leasehold_now_ms(), leasehold_now_ms()
    FROM generate_series(1, 3);
UPDATE jobs SET status = 'running', attempt = attempt + 1, worker_id = 'w' || :client_id
    WHERE id IN (SELECT id FROM jobs
                 WHERE status = 'pending' AND teardown_token IS NULL AND waiting = 0 AND deferred = 0
                 ORDER BY priority DESC, scheduled_at, id LIMIT 3 FOR UPDATE SKIP LOCKED);
UPDATE jobs SET status = CASE WHEN random() < 0.8 THEN 'succeeded' ELSE 'failed' END
    WHERE id IN (SELECT id FROM jobs WHERE status = 'running' AND worker_id = 'w' || :client_id
                 ORDER BY id LIMIT 2 FOR UPDATE SKIP LOCKED);
UPDATE jobs SET status = 'pending', worker_id = NULL
    WHERE id IN (SELECT id FROM jobs WHERE status = 'failed' LIMIT 1 FOR UPDATE SKIP LOCKED);
UPDATE jobs SET queue = 'q' || (1 + floor(random() * 6)::int)
    WHERE id IN (SELECT id FROM jobs WHERE status = 'pending' ORDER BY id DESC LIMIT 1
                 FOR UPDATE SKIP LOCKED);
DELETE FROM jobs
    WHERE id IN (SELECT id FROM jobs WHERE status = 'succeeded' OR status = 'cancelled'
                 ORDER BY id LIMIT 2 FOR UPDATE SKIP LOCKED);
COMMIT;
