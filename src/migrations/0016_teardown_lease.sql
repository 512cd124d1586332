-- Migration 16: the lease a lost attempt held when its teardown marker was made.
--
-- On PostgreSQL, a runner on another host may record a lost attempt's teardown as its keeper's
-- (the keeper stops the command by the end of the lease its runner last wrote), but only once
-- that lease has run out by the server's clock. A cancel or an operator's retry makes its marker
-- while the lease may still be live, so the marker keeps the lease's expiry. Markers made before
-- this version have none: their teardown waits for a runner where the attempt ran, or the
-- operator (`jobs retry --force`, `hosts gone`).
ALTER TABLE jobs ADD COLUMN teardown_lease_expires_at INTEGER;
