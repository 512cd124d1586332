-- Migration 9: reserved for the `runners.pid_ns` column (issue 18, another branch); this
-- placeholder changes nothing and is replaced by that migration when the branches merge.
SELECT 1;
