//! The `runners` table: one row per runner process, its heartbeat and how it ended.

#[cfg(doc)]
use crate::error::Error;
use crate::store::db::{Connection, OptionalExtension, Row, params, sql};

use super::Store;
use crate::condition::{ALL_CONDITIONS, Condition, from_mask};
use crate::error::Result;

/// One runner process, as registered in the `runners` table.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunnerRecord {
    /// Its worker id, written on every lease it takes.
    pub worker_id: String,
    /// Its process id.
    pub pid: i64,
    /// Its start time, in clock ticks since boot.
    pub proc_start_time: u64,
    /// The boot it ran in (`/proc/sys/kernel/random/boot_id`).
    pub boot_id: String,
    /// Its host name.
    pub host: String,
    /// When it started.
    pub started_at: i64,
    /// Its last sign of life.
    pub heartbeat_at: i64,
    /// When it shut down cleanly.
    pub stopped_at: Option<i64>,
    /// Its lease TTL.
    pub lease_ttl_ms: i64,
    /// Its heartbeat interval.
    pub heartbeat_interval_ms: i64,
    /// Its recovery budget.
    pub max_recovery_attempts: i64,
    /// Its PID namespace: the inode of `/proc/self/ns/pid` (None: registered before schema
    /// version 9, or unreadable). Its pid means something only in this namespace.
    pub pid_ns: Option<u64>,
    /// How it contains its attempts: `cgroup <node>` (each attempt in a cgroup of its own),
    /// `process groups (why)`, or `None` (registered before schema version 18).
    pub containment: Option<String>,
    /// The conditions on jobs that held at its last look ([`Condition`]; None: it has not
    /// looked yet, or registered before schema version 20).
    pub conditions_held: Option<Vec<Condition>>,
    /// What it assumed at that look where it could not tell (no NetworkManager, no logind).
    pub conditions_note: Option<String>,
}

/// Where a process's pid means something: a host, a boot of its kernel, and a PID namespace.
///
/// Containers share their host's boot id (it is not namespaced), so two processes with the
/// same boot id run on one kernel, and with the same PID namespace as well they see the same
/// pids. Namespace inodes repeat across boots (the initial one is the same number on every
/// Linux system), so the namespace alone identifies nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Namespace {
    /// The host name.
    pub host: String,
    /// The boot id (`/proc/sys/kernel/random/boot_id`; empty when unreadable).
    pub boot_id: String,
    /// The inode of `/proc/self/ns/pid` (None: unknown).
    pub pid_ns: Option<u64>,
}

impl Namespace {
    /// A namespace from its parts.
    pub fn new(host: impl Into<String>, boot_id: impl Into<String>, pid_ns: Option<u64>) -> Self {
        Namespace {
            host: host.into(),
            boot_id: boot_id.into(),
            pid_ns,
        }
    }
}

impl RunnerRecord {
    /// Where this runner's pid means something.
    pub fn namespace(&self) -> Namespace {
        Namespace::new(self.host.clone(), self.boot_id.clone(), self.pid_ns)
    }
}

/// A runner's row from a query that selects, in this order: worker_id, pid, proc_start_time,
/// boot_id, host, started_at, heartbeat_at, stopped_at, lease_ttl_ms, heartbeat_interval_ms,
/// max_recovery_attempts, pid_ns, containment, conditions_held, conditions_note (every query
/// of runner rows: `unstopped`, `latest`, and `Store::host_runners` in hosts.rs).
pub(super) fn runner_row(r: &Row<'_>) -> Result<RunnerRecord> {
    Ok(RunnerRecord {
        worker_id: r.get(0)?,
        pid: r.get(1)?,
        proc_start_time: r.get::<_, i64>(2)? as u64,
        boot_id: r.get(3)?,
        host: r.get(4)?,
        started_at: r.get(5)?,
        heartbeat_at: r.get(6)?,
        stopped_at: r.get(7)?,
        lease_ttl_ms: r.get(8)?,
        heartbeat_interval_ms: r.get(9)?,
        max_recovery_attempts: r.get(10)?,
        pid_ns: r.get::<_, Option<i64>>(11)?.map(|n| n as u64),
        containment: r.get(12)?,
        conditions_held: r
            .get::<_, Option<i64>>(13)?
            .map(|m| from_mask(u32::try_from(m).unwrap_or(0))),
        conditions_note: r.get(14)?,
    })
}

/// Records a runner at its start.
///
/// A worker id is new at each start (the pid and a random suffix), so a row that has it
/// already is this start's own, committed though the reply to its COMMIT was lost (a cut
/// connection; the start then runs again): it is written again, not refused.
pub(super) fn register(conn: &Connection, runner: &RunnerRecord) -> Result<()> {
    conn.execute(
        sql!(
            "INSERT INTO runners (worker_id, pid, proc_start_time, boot_id, host, started_at,
                     heartbeat_at, stopped_at, lease_ttl_ms, heartbeat_interval_ms,
                     max_recovery_attempts, pid_ns, containment)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)
                 ON CONFLICT (worker_id) DO UPDATE SET pid = excluded.pid,
                     proc_start_time = excluded.proc_start_time, boot_id = excluded.boot_id,
                     host = excluded.host, started_at = excluded.started_at,
                     heartbeat_at = excluded.heartbeat_at, stopped_at = excluded.stopped_at,
                     lease_ttl_ms = excluded.lease_ttl_ms,
                     heartbeat_interval_ms = excluded.heartbeat_interval_ms,
                     max_recovery_attempts = excluded.max_recovery_attempts,
                     pid_ns = excluded.pid_ns, containment = excluded.containment"
        ),
        params![
            runner.worker_id,
            runner.pid,
            runner.proc_start_time as i64,
            runner.boot_id,
            runner.host,
            runner.started_at,
            runner.heartbeat_at,
            runner.stopped_at,
            runner.lease_ttl_ms,
            runner.heartbeat_interval_ms,
            runner.max_recovery_attempts,
            runner.pid_ns.map(|n| n as i64),
            runner.containment,
        ],
    )?;
    Ok(())
}

pub(super) fn stop(conn: &Connection, worker_id: &str, now: i64) -> Result<()> {
    let now = conn.now(now)?;
    conn.execute(
        sql!("UPDATE runners SET stopped_at = ?2, heartbeat_at = ?2 WHERE worker_id = ?1"),
        params![worker_id, now],
    )?;
    Ok(())
}

pub(super) fn mark_dead(conn: &Connection, worker_id: &str, now: i64) -> Result<()> {
    let now = conn.now(now)?;
    conn.execute(
        sql!(
            "UPDATE runners SET stopped_at = ?2 WHERE worker_id = ?1 AND stopped_at IS NULL
                   AND NOT EXISTS (SELECT 1 FROM jobs WHERE status = 'running' AND worker_id = ?1)"
        ),
        params![worker_id, now],
    )?;
    Ok(())
}

/// The conditions ([`Condition`]'s bits) that no runner that has not stopped saw hold at its
/// last look.
fn not_held(conn: &Connection) -> Result<u32> {
    let mut stmt = conn.prepare_cached(sql!(
        "SELECT conditions_held FROM runners
         WHERE stopped_at IS NULL AND conditions_held IS NOT NULL"
    ))?;
    let rows = stmt.query_map(params![], |r| r.get::<_, i64>(0))?;
    let mut held = 0;
    for m in rows {
        held |= u32::try_from(m?).unwrap_or(0);
    }
    Ok(ALL_CONDITIONS & !held)
}

/// For each condition, the pending jobs that need it while no running runner saw it hold:
/// what `status`, the dashboard and the metrics' gauge show. Reads the pending jobs that
/// have conditions, grouped by their mask.
pub(super) fn waiting_for_conditions(conn: &Connection) -> Result<Vec<(Condition, u64)>> {
    let not_held = not_held(conn)?;
    let mut stmt = conn.prepare_cached(sql!(
        "SELECT conditions, count(*) FROM jobs
         WHERE status = 'pending' AND conditions != 0 GROUP BY conditions"
    ))?;
    let rows = stmt.query_map(params![], |r| {
        Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
    })?;
    let mut counts: Vec<(Condition, u64)> = Condition::ALL.iter().map(|&c| (c, 0)).collect();
    for row in rows {
        let (mask, n) = row?;
        let mask = u32::try_from(mask).unwrap_or(0);
        for (c, count) in &mut counts {
            if mask & not_held & c.bit() != 0 {
                *count += u64::try_from(n).unwrap_or(0);
            }
        }
    }
    Ok(counts)
}

/// Records what a runner saw of the conditions on jobs.
pub(super) fn record_conditions(
    conn: &Connection,
    worker_id: &str,
    held: u32,
    note: &str,
) -> Result<()> {
    conn.execute(
        sql!("UPDATE runners SET conditions_held = ?2, conditions_note = ?3 WHERE worker_id = ?1"),
        params![
            worker_id,
            i64::from(held),
            (!note.is_empty()).then_some(note)
        ],
    )?;
    Ok(())
}

pub(super) fn runner_heartbeat(conn: &Connection, worker_id: &str, now: i64) -> Result<()> {
    let now = conn.now(now)?;
    conn.prepare_cached(sql!(
        "UPDATE runners SET heartbeat_at = ?2 WHERE worker_id = ?1"
    ))?
    .execute(params![worker_id, now])?;
    Ok(())
}

/// The runners recorded as stopped that still hold running jobs: they renew nothing.
pub(super) fn stopped_holding_jobs(conn: &Connection) -> Result<Vec<String>> {
    let mut stmt = conn.prepare_cached(sql!(
        "SELECT DISTINCT j.worker_id FROM jobs j JOIN runners r ON r.worker_id = j.worker_id
         WHERE j.status = 'running' AND r.stopped_at IS NOT NULL"
    ))?;
    let rows = stmt.query_map(params![], |r| r.get(0))?;
    rows.collect::<Result<_>>()
}

pub(super) fn unstopped(conn: &Connection) -> Result<Vec<RunnerRecord>> {
    let mut stmt = conn.prepare_cached(sql!(
        "SELECT worker_id, pid, proc_start_time, boot_id, host, started_at, heartbeat_at,
                    stopped_at, lease_ttl_ms, heartbeat_interval_ms, max_recovery_attempts, pid_ns,
                    containment, conditions_held, conditions_note
             FROM runners WHERE stopped_at IS NULL ORDER BY started_at, worker_id"
    ))?;
    let rows = stmt.query_map(params![], runner_row)?;
    rows.collect::<Result<_>>()
}

pub(super) fn latest(conn: &Connection) -> Result<Option<RunnerRecord>> {
    let mut stmt = conn.prepare_cached(sql!(
        sqlite: "SELECT worker_id, pid, proc_start_time, boot_id, host, started_at, heartbeat_at,
                    stopped_at, lease_ttl_ms, heartbeat_interval_ms, max_recovery_attempts, pid_ns,
                    containment, conditions_held, conditions_note
             FROM runners ORDER BY started_at DESC, rowid DESC LIMIT 1",
        postgres: "SELECT worker_id, pid, proc_start_time, boot_id, host, started_at, heartbeat_at,
                    stopped_at, lease_ttl_ms, heartbeat_interval_ms, max_recovery_attempts, pid_ns,
                    containment, conditions_held, conditions_note
             FROM runners ORDER BY started_at DESC, seq DESC LIMIT 1",
    ))?;
    stmt.query_row(params![], runner_row).optional()
}

impl Store {
    /// Registers a runner process.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written.
    pub(crate) fn register_runner(&self, runner: &RunnerRecord) -> Result<()> {
        self.write(|c| register(c, runner))
    }

    /// Records a runner's clean shutdown.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written.
    pub(crate) fn stop_runner(&self, worker_id: &str, now: i64) -> Result<()> {
        self.write(|c| stop(c, worker_id, now))
    }

    /// The runners that have not shut down cleanly, oldest first, and the most recently
    /// started runner of all (whose settings `status` reports).
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn runners(&self) -> Result<Vec<RunnerRecord>> {
        unstopped(&self.conn)
    }

    /// The runners recorded as stopped that still hold running jobs: a runner that left its
    /// attempts to their keepers at shutdown, or could not record their endings. They renew
    /// nothing, so their jobs are adopted, recovered or reclaimed at once.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn stopped_runners_holding_jobs(&self) -> Result<Vec<String>> {
        stopped_holding_jobs(&self.conn)
    }

    /// The most recently started runner, stopped or not.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn latest_runner(&self) -> Result<Option<RunnerRecord>> {
        latest(&self.conn)
    }

    /// Records what runner `worker_id` saw of the conditions on jobs: the bits that hold, and
    /// what it assumed (empty: nothing).
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written.
    pub(crate) fn record_conditions(&self, worker_id: &str, held: u32, note: &str) -> Result<()> {
        self.write(|c| record_conditions(c, worker_id, held, note))
    }

    /// The conditions on jobs ([`Condition`]) that no running runner saw hold at its last
    /// look: what a pending job that needs one of them waits for. Every condition when no
    /// runner has looked (none runs): nothing has seen them hold.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn conditions_not_held(&self) -> Result<Vec<Condition>> {
        Ok(from_mask(not_held(&self.conn)?))
    }

    /// For each condition, how many pending jobs need it while no running runner saw it
    /// hold (a job that needs two such counts under both).
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn jobs_waiting_for_conditions(&self) -> Result<Vec<(Condition, u64)>> {
        waiting_for_conditions(&self.conn)
    }

    /// Marks a runner that is provably dead as stopped, so it is not examined again.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written.
    pub(crate) fn mark_runner_dead(&self, worker_id: &str, now: i64) -> Result<()> {
        self.write(|c| mark_dead(c, worker_id, now))
    }
}
