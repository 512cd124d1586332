-- Migration 9: identity across PID namespaces.
--
-- A pid names a process only within one PID namespace: a runner in a container (or under
-- `unshare --pid`) may be pid 1 there and something else entirely here. Each runner records
-- its PID namespace (the inode of /proc/self/ns/pid) beside its boot id and host, and its pid
-- is evidence of its death only to a judge in the same namespace; NULL (a runner registered
-- before this version) counts as unknown: only its leases' expiry then.
ALTER TABLE runners ADD COLUMN pid_ns INTEGER;

-- The runner that held a lost attempt still to be torn down (its namespace is that runner's).
-- A runner tears down only an attempt whose processes it can see; NULL (a marker written
-- before this version, or by hand) is torn down by any runner, as before.
ALTER TABLE jobs ADD COLUMN teardown_worker TEXT;
