-- Migration 10: bulk writes in bounded transactions, so that no write holds the lock past a
-- runner's lease renewal. First, bulk enqueues, all or nothing to their caller.
--
-- A bulk enqueue (`jobs add --from-file`, `Store::enqueue_many`) writes its jobs a slice at a
-- time, each gated by its batch: a `job_deps` row naming `-id` (no job has a negative id),
-- counted in the job's `waiting`, so the job is never claimed before its batch commits. A
-- batch is open while its writer works (it pushes `expires_at` at every slice), committed by
-- one short final transaction (its gates are then lifted), or abandoned (its writer failed,
-- died or stalled past `expires_at`; its jobs are then deleted). The row goes with its last
-- gate. AUTOINCREMENT: an id is never reused, so a gate always names its own batch.
CREATE TABLE batches (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    -- 0 open, 1 committed, 2 abandoned.
    state       INTEGER NOT NULL CHECK (state = 0 OR state = 1 OR state = 2),
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL
);

-- Fan-outs in bounded transactions: an ending handles a few hundred of its dependents in its
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
