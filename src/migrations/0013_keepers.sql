-- Migration 13: attempts that outlive their runner.
--
-- Each attempt's command runs under a keeper: a small process that is the command's parent,
-- sits in a session of its own and writes the command's outcome to a file beside the
-- database (`<db>-attempts/`). The keeper's pid and start time (clock ticks since boot) are
-- recorded with the attempt's own, so that a runner finding the attempt's runner dead can
-- tell the keeper apart from a reused pid: a live keeper's attempt is adopted, a finished
-- one's outcome recorded, and only an attempt with neither is torn down and reclaimed.
ALTER TABLE jobs ADD COLUMN keeper_pid INTEGER;
ALTER TABLE jobs ADD COLUMN keeper_start_time INTEGER;
