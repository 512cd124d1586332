-- Migration 15: a short attempt's start recorded on its ending's row.
--
-- A runner commits an attempt's start and its ending in shared transactions; for a short job
-- both often fall in one. Such an ending's event row then carries the start's detail
-- (`pid N pgid N`) in start_detail, and the history reads it as two events: `started`, at the
-- same time and for the same attempt, then the ending. One row a job fewer to insert, index
-- and prune. Rows without it (every row written before this version, and a start committed
-- before its ending) read as before.
ALTER TABLE job_events ADD COLUMN start_detail TEXT;
