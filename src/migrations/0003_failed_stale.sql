-- Migration 3: the runbook's "failed stale" jobs (failed, recovery_count past the budget)
-- are found from an index of the failed rows by recovery_count, so that `status`, the
-- dashboard's overview and `jobs ls --failed-stale` read only the jobs past the budget, not
-- every failed job (35 ms for 10,000 failed jobs before). Frozen once released.
CREATE INDEX jobs_failed_recovery ON jobs (recovery_count) WHERE status = 'failed';
