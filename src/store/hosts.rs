//! What the operator reads by host: a host's runner rows, and the running jobs with the host
//! of the runner that holds each. The writes of `hosts gone` are the store's own (the
//! reclaim, the teardown record, a runner recorded stopped): nothing here writes.

use crate::store::db::{params, sql};

use crate::error::Result;

use super::Store;
use super::runners::{RunnerRecord, runner_row};

/// A running job's lease, with the host of the runner that holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeldLease {
    /// The job.
    pub job_id: i64,
    /// Its running attempt.
    pub attempt: i64,
    /// The runner that holds the lease.
    pub worker_id: String,
    /// That runner's host.
    pub host: String,
    /// When the lease expires unless renewed (ms since the epoch; None: no lease metadata).
    pub lease_expires_at: Option<i64>,
}

impl Store {
    /// Every runner row of `host`, stopped or not, oldest first: empty when no runner of that
    /// host ever registered on this database.
    ///
    /// # Errors
    ///
    /// A database error.
    pub(crate) fn host_runners(&self, host: &str) -> Result<Vec<RunnerRecord>> {
        // No index on host: a runner row is written once per runner process, and only an
        // operator's command reads them by host.
        let mut stmt = self.conn.prepare_cached(sql!(
            "SELECT worker_id, pid, proc_start_time, boot_id, host, started_at, heartbeat_at,
                    stopped_at, lease_ttl_ms, heartbeat_interval_ms, max_recovery_attempts, pid_ns,
                    containment, conditions_held, conditions_note
             FROM runners WHERE host = ?1 ORDER BY started_at, worker_id"
        ))?;
        let rows = stmt.query_map(params![host], runner_row)?;
        rows.collect::<Result<_>>()
    }

    /// The running jobs held by a registered runner (stopped or not), with that runner's
    /// host, by job id. Running rows without a worker, or whose worker has no runner row,
    /// are left out: they belong to no host (a sweep reclaims those without lease metadata).
    ///
    /// # Errors
    ///
    /// A database error.
    pub(crate) fn held_leases(&self) -> Result<Vec<HeldLease>> {
        // Running rows are bounded by the runners' workers; the partial index
        // `jobs_running_worker` holds exactly them.
        let mut stmt = self.conn.prepare_cached(sql!(
            "SELECT j.id, j.attempt, j.worker_id, r.host, j.lease_expires_at
             FROM jobs j JOIN runners r ON r.worker_id = j.worker_id
             WHERE j.status = 'running' ORDER BY j.id"
        ))?;
        let rows = stmt.query_map(params![], |r| {
            Ok(HeldLease {
                job_id: r.get(0)?,
                attempt: r.get(1)?,
                worker_id: r.get(2)?,
                host: r.get(3)?,
                lease_expires_at: r.get(4)?,
            })
        })?;
        rows.collect::<Result<_>>()
    }

    /// The database's time: the store's clock on SQLite, whose times are the callers'; the
    /// server's clock on PostgreSQL (unless the store has a manual clock), where every
    /// heartbeat and lease is stamped by it. What a heartbeat's age is measured against.
    ///
    /// # Errors
    ///
    /// A database error (PostgreSQL).
    pub(crate) fn db_now(&self) -> Result<i64> {
        self.conn.now(self.now())
    }
}
