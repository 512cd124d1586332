-- Migration 2: files are `auto_vacuum = INCREMENTAL`, so that pages freed by pruning can be
-- given back to the filesystem with `PRAGMA incremental_vacuum` instead of a full VACUUM.
-- Frozen once released.
--
-- auto_vacuum is a pragma, not schema text: the code sets it before a new file's first table,
-- and converts an older file with a one-time VACUUM (after checking that its folder has the
-- free space) before this migration's transaction bumps the version.

-- What pruning reads: per status, finished rows in `completed_at` order, so that a retention
-- rule reads a range and a count cap walks the newest N, without sorting the table.
CREATE INDEX jobs_finished ON jobs (status, completed_at, id) WHERE completed_at IS NOT NULL;
