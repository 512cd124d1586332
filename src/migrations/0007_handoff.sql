-- Migration 7: jobs handed to a running runner by a command (`leasehold jobs add`).
--
-- A command that hands its job to a runner over the runner's wake-up socket, and gets no
-- answer, cannot tell whether the runner stored the job before it stopped answering. It then
-- stores the job itself, under the same token: whichever of the two commits first stores the
-- job and its token, and the other finds the token and stores nothing. Rows are kept for a
-- while after the command could still be waiting, then deleted by the next hand-off.
CREATE TABLE handoffs (
    token       TEXT    PRIMARY KEY,
    job_id      INTEGER NOT NULL,
    -- 1: the job's unique key matched a job, and job_id is that job.
    duplicate   INTEGER NOT NULL CHECK (duplicate IN (0, 1)),
    expires_at  INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX handoffs_expiry ON handoffs (expires_at);
