-- Migration 21: a job's manners and caps, and "try me later" (see docs/manners.md).
-- limits: a JSON object of nice, io_class, memory_max, cpu_weight, pids_max (NULL: none).
-- tempfail_max: how many exits 75 requeue the job without spending an attempt (NULL: the
-- default, DEFAULT_TEMPFAIL_MAX); tempfails: how many did so far.
-- error_kind admits 'memory' (an attempt killed for its memory cap): the CHECK is widened by
-- an edit of the table's definition, done in code as version 8's (`widen_error_kind` in
-- src/store/open.rs), since it admits every row the old one did.
ALTER TABLE jobs ADD COLUMN limits TEXT;
ALTER TABLE jobs ADD COLUMN tempfail_max INTEGER;
ALTER TABLE jobs ADD COLUMN tempfails INTEGER NOT NULL DEFAULT 0;
