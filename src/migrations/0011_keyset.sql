-- Migration 11: the dashboard's job list pages by id (`/jobs?before=ID`), newest first, with
-- an optional status and queue filter. `jobs_status (status, id)` serves the status filter;
-- this index serves the queue filter, which otherwise read the whole table to find a rare
-- queue's jobs. A job's queue never changes after its insert, so the index costs an insert
-- and a delete, not every transition.
CREATE INDEX jobs_queue ON jobs (queue, id);
