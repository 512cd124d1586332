//! The store: the only code that speaks SQL.
//!
//! Every transition of a job is one conditional UPDATE guarded by what the writer believes (the
//! job's id, its status and, for a running job, its run token), in one IMMEDIATE transaction
//! that also appends the job's event. A write whose guard no longer holds changes nothing: that
//! is the fence. The functions that do the work take a `&Connection`, so the runner's writer
//! thread can run many of them in one transaction (group commit); [`Store`]'s methods wrap each
//! in a transaction of its own.

use std::collections::HashSet;
use std::fs::OpenOptions as FileOptions;
use std::hash::{BuildHasher, Hasher};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, params, params_from_iter};

use crate::error::{Error, Result, is_busy};
use crate::job::{
    ErrorKind, Event, EventKind, Job, JobRecord, OnLost, Output, Status, duration_ms,
};

/// The schema version this build writes and reads: `PRAGMA user_version`.
pub const SCHEMA_VERSION: i64 = 1;

/// The migrations, in order: migration `i` takes a file from version `i` to `i + 1`.
const MIGRATIONS: [&str; 1] = [include_str!("../migrations/0001_initial.sql")];

/// How long a connection waits for another to release the database before giving up.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest busy timeout SQLite can take: a C `int` of milliseconds (about 24.8 days).
pub const MAX_BUSY_TIMEOUT: Duration = Duration::from_millis(i32::MAX as u64);
/// A lost attempt is reclaimed this many times before its job fails as lost.
pub const DEFAULT_MAX_RECOVERY_ATTEMPTS: u32 = 3;
/// The start of `last_error` for a job whose lease expired (or whose runner is dead).
pub const LEASE_EXPIRED_PREFIX: &str = "lease expired after missing heartbeat; ";
/// The start of `last_error` for a running job with no lease metadata.
pub const LEASE_MISSING_PREFIX: &str = "lease metadata missing for running job; ";

/// How hard SQLite pushes each commit to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// `synchronous = FULL`: a committed transition survives a power cut. The default.
    #[default]
    Full,
    /// `synchronous = NORMAL`: in WAL mode, a power cut may lose the last transitions, never
    /// corrupt the file. Faster.
    Normal,
}

/// How to open a database: see [`Store::open_with`].
#[derive(Debug, Clone)]
pub struct OpenOptions {
    create: bool,
    migrate: bool,
    durability: Durability,
    busy_timeout: Duration,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            create: true,
            migrate: true,
            durability: Durability::Full,
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
        }
    }
}

impl OpenOptions {
    /// Options that create and migrate: the library's default.
    pub fn new() -> Self {
        Self::default()
    }

    /// Options for a reader that must not change the file: no creation, no migration.
    pub fn read_only() -> Self {
        OpenOptions {
            create: false,
            migrate: false,
            ..Self::default()
        }
    }

    /// Creates the file (owner-only permissions) when it does not exist. By default, true.
    pub fn create(mut self, create: bool) -> Self {
        self.create = create;
        self
    }

    /// Migrates an older schema to this build's. When false, an older file is refused with
    /// [`Error::SchemaTooOld`]. By default, true.
    pub fn migrate(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }

    /// How hard commits are pushed to disk. By default, [`Durability::Full`].
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// How long to wait for a lock held by another connection, at most
    /// [`MAX_BUSY_TIMEOUT`]. By default, 10 s.
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }
}

/// What [`Store::open_with`] found and did to the schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    /// The version before opening (0 for a new file).
    pub from: i64,
    /// The version after.
    pub to: i64,
}

/// A connection to a leasehold database, with its typed operations.
///
/// ```
/// # fn main() -> leasehold::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// use leasehold::{Job, Status, Store, now_ms};
///
/// let store = Store::open(dir.path().join("jobs.db"))?;
/// let id = store.enqueue(&Job::shell("echo hello"), now_ms())?;
/// assert_eq!(store.job(id)?.status, Status::Pending);
/// # Ok(())
/// # }
/// ```
pub struct Store {
    conn: Connection,
    path: PathBuf,
    busy_timeout: Duration,
    migration: Migration,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

impl Store {
    /// Opens (creating and migrating as needed) the database at `path`, with durability FULL.
    ///
    /// # Errors
    ///
    /// [`Error::NotADatabase`] for a file that is not a leasehold database (it is left
    /// untouched), [`Error::SchemaTooNew`] for a file from a newer build, and
    /// [`Error::Sqlite`] or [`Error::Io`] when the file cannot be opened.
    pub fn open(path: impl AsRef<Path>) -> Result<Store> {
        Store::open_with(path, &OpenOptions::default())
    }

    /// Opens the database at `path` with `options`.
    ///
    /// # Errors
    ///
    /// As [`Store::open`], plus [`Error::Missing`] when the file does not exist and
    /// `create` is off, and [`Error::SchemaTooOld`] when it is older and `migrate` is off.
    pub fn open_with(path: impl AsRef<Path>, options: &OpenOptions) -> Result<Store> {
        check_busy_timeout(options.busy_timeout)?;
        let path = path.as_ref().to_path_buf();
        if !path.exists() {
            if !options.create {
                return Err(Error::Missing(path));
            }
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
                && !dir.is_dir()
            {
                return Err(Error::io(
                    format!("cannot create database {}", path.display()),
                    std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("folder {} does not exist", dir.display()),
                    ),
                ));
            }
            // Create the file owner-only before SQLite opens it (no connection is open yet,
            // so this cannot disturb SQLite's locks); SQLite gives the -wal and -shm files
            // the same permissions. Losing the race to another creator is fine.
            match FileOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
            {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(Error::io(
                        format!("cannot create database {}", path.display()),
                        e,
                    ));
                }
            }
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(&path, flags)?;
        conn.busy_timeout(options.busy_timeout)?;
        let deadline = Instant::now() + options.busy_timeout;
        let not_a_db = |e: rusqlite::Error| match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::NotADatabase) => Error::NotADatabase {
                path: path.clone(),
                reason: e.to_string(),
            },
            _ => Error::Sqlite(e),
        };
        // Read before anything writes: a file that is not a database fails here, untouched.
        // One statement, so one snapshot: between two reads another process could migrate the
        // file, and version 0 with tables would look like someone else's database.
        let (version, tables): (i64, i64) = retry_busy(deadline, || {
            conn.query_row(
                "SELECT (SELECT user_version FROM pragma_user_version),
                        (SELECT count(*) FROM sqlite_master WHERE type = 'table')",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
        })
        .map_err(not_a_db)?;
        if version > SCHEMA_VERSION {
            return Err(Error::SchemaTooNew {
                found: version,
                supported: SCHEMA_VERSION,
            });
        }
        if version == 0 && tables > 0 {
            return Err(Error::NotADatabase {
                path,
                reason: "it holds other tables and no leasehold schema version".into(),
            });
        }
        if version < SCHEMA_VERSION && !options.migrate {
            return Err(Error::SchemaTooOld {
                found: version,
                supported: SCHEMA_VERSION,
            });
        }
        let sync = match options.durability {
            Durability::Full => "FULL",
            Durability::Normal => "NORMAL",
        };
        conn.pragma_update(None, "synchronous", sync)?;
        conn.pragma_update(None, "foreign_keys", true)?;
        let mut migration = Migration {
            from: version,
            to: version,
        };
        if options.migrate {
            // Both report busy at once, without the busy handler, when another process is
            // doing the same to a new file: retry them until the deadline.
            retry_busy(deadline, || {
                conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0))
            })?;
            migration = retry_busy(deadline, || migrate(&conn))?;
        }
        Ok(Store {
            conn,
            path,
            busy_timeout: options.busy_timeout,
            migration,
        })
    }

    /// The schema version of the database at `path`, read without creating, migrating or
    /// refusing it for its version: what `leasehold db version` reports.
    ///
    /// # Errors
    ///
    /// [`Error::Missing`], [`Error::NotADatabase`] (the file is left untouched), or
    /// [`Error::Sqlite`].
    pub fn probe_version(path: impl AsRef<Path>) -> Result<i64> {
        let path = path.as_ref();
        if !path.exists() {
            return Err(Error::Missing(path.to_path_buf()));
        }
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(DEFAULT_BUSY_TIMEOUT)?;
        conn.query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| match e.sqlite_error_code() {
                Some(rusqlite::ErrorCode::NotADatabase) => Error::NotADatabase {
                    path: path.to_path_buf(),
                    reason: e.to_string(),
                },
                _ => Error::Sqlite(e),
            })
    }

    /// The file this store opened.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What opening did to the schema.
    pub fn migration(&self) -> Migration {
        self.migration
    }

    /// The schema version of the file.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the file cannot be read.
    pub fn schema_version(&self) -> Result<i64> {
        Ok(self
            .conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))?)
    }

    /// Runs `f` in one IMMEDIATE transaction, retrying while another connection holds the
    /// database, up to the busy timeout.
    pub(crate) fn write<T>(&self, mut f: impl FnMut(&Connection) -> Result<T>) -> Result<T> {
        let deadline = Instant::now() + self.busy_timeout;
        loop {
            match transaction(&self.conn, &mut f) {
                Err(e) if e.is_busy() && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                other => return other,
            }
        }
    }

    /// Changes how long this connection waits for a lock held by another; a timeout beyond
    /// [`MAX_BUSY_TIMEOUT`] waits that long.
    pub(crate) fn set_busy_timeout(&mut self, timeout: Duration) {
        let timeout = timeout.min(MAX_BUSY_TIMEOUT);
        self.busy_timeout = timeout;
        if let Err(e) = self.conn.busy_timeout(timeout) {
            log::warn!("cannot set the busy timeout: {e}");
        }
    }

    pub(crate) fn conn(&self) -> &Connection {
        &self.conn
    }

    /// Enqueues one job; returns its id.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] for a job that cannot run (an empty command, zero attempts, a bad
    /// variable name), and [`Error::Sqlite`] when the database cannot be written.
    pub fn enqueue(&self, job: &Job, now: i64) -> Result<i64> {
        job.validate()?;
        self.write(|c| insert_job(c, job, now))
    }

    /// Enqueues many jobs in one transaction: all or none. Returns their ids in order.
    ///
    /// # Errors
    ///
    /// As [`Store::enqueue`]; nothing is stored when any job is invalid.
    pub fn enqueue_many(&self, jobs: &[Job], now: i64) -> Result<Vec<i64>> {
        for job in jobs {
            job.validate()?;
        }
        self.write(|c| {
            let ids = jobs
                .iter()
                .map(|j| insert_row(c, j, now))
                .collect::<Result<Vec<i64>>>()?;
            // One statement for all the `enqueued` events: the ids of this transaction's rows
            // are consecutive, as no other writer can insert while it holds the lock.
            if let (Some(first), Some(last)) = (ids.first(), ids.last()) {
                c.prepare_cached(
                    "INSERT INTO job_events (job_id, at, kind, attempt, detail)
                     SELECT id, ?3, 'enqueued', 0, queue FROM jobs WHERE id BETWEEN ?1 AND ?2",
                )?
                .execute(params![first, last, now])?;
            }
            Ok(ids)
        })
    }

    /// Claims up to `limit` ready jobs for `worker_id`, taking a lease of `lease_ttl` on each.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written.
    pub fn claim(&self, req: &ClaimRequest<'_>, now: i64) -> Result<Vec<Claimed>> {
        self.write(|c| claim(c, req, now))
    }

    /// Records the process an attempt started, if the caller still holds the attempt's lease.
    /// Returns false (and changes nothing) when it does not.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written.
    pub fn record_start(&self, start: &AttemptStart, now: i64) -> Result<bool> {
        self.write(|c| record_start(c, start, now))
    }

    /// Renews, in one statement, the leases that `worker_id` holds under `tokens`, and reports
    /// the tokens that no longer hold one.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written.
    pub fn renew(
        &self,
        worker_id: &str,
        tokens: &[String],
        lease_ttl: Duration,
        now: i64,
    ) -> Result<Renewal> {
        self.write(|c| renew(c, worker_id, tokens, lease_ttl, now))
    }

    /// Records how an attempt ended, fenced by its run token.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written.
    pub fn finish(&self, finish: &Finish, now: i64) -> Result<Finished> {
        self.write(|c| finish_attempt(c, finish, now))
    }

    /// Reclaims lost attempts: expired leases, running jobs without lease metadata, and the
    /// running jobs of runners known to be dead.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written.
    pub fn reclaim(&self, req: &ReclaimRequest<'_>, now: i64) -> Result<ReclaimReport> {
        self.write(|c| reclaim(c, req, now))
    }

    /// Cancels a job: a pending one at once; a running one by revoking its lease, so that its
    /// runner stops the attempt. Returns the job as it now is.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchJob`], and [`Error::WrongState`] for a job that already ended.
    pub fn cancel(&self, id: i64, now: i64) -> Result<JobRecord> {
        self.write(|c| cancel(c, id, now))
    }

    /// An operator's retry of one job: failed and cancelled jobs, and running jobs whose lease
    /// is missing or expired, go back to pending with their counters reset.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchJob`], and [`Error::WrongState`] for a pending, succeeded or live
    /// running job, with the reason.
    pub fn retry(&self, id: i64, reason: Option<&str>, now: i64) -> Result<JobRecord> {
        self.write(|c| retry(c, id, reason, now))
    }

    /// An operator's retry of the failed jobs that exhausted the recovery budget: `limit` of
    /// them, most recently failed first, or all when `limit` is None. Returns their ids.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written.
    pub fn retry_failed_stale(
        &self,
        limit: Option<u64>,
        max_recovery_attempts: u32,
        reason: Option<&str>,
        now: i64,
    ) -> Result<Vec<i64>> {
        self.write(|c| {
            let filter = ListFilter {
                failed_stale: Some(max_recovery_attempts),
                limit,
                ..ListFilter::default()
            };
            let ids: Vec<i64> = list(c, &filter)?.into_iter().map(|j| j.id).collect();
            for &id in &ids {
                retry(c, id, reason, now)?;
            }
            Ok(ids)
        })
    }

    /// Lost attempts whose processes still have to be torn down.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn pending_teardowns(&self, limit: u64) -> Result<Vec<LostAttempt>> {
        pending_teardowns(&self.conn, limit)
    }

    /// Records that a lost attempt's processes were dealt with (`detail` says how), which
    /// lets its job be claimed again. Returns false when another caller recorded it first.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written.
    pub fn record_teardown(
        &self,
        job_id: i64,
        token: &str,
        detail: &str,
        now: i64,
    ) -> Result<bool> {
        self.write(|c| record_teardown(c, job_id, token, detail, now))
    }

    /// One job.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchJob`].
    pub fn job(&self, id: i64) -> Result<JobRecord> {
        job(&self.conn, id)
    }

    /// Jobs matching `filter`, newest first.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn list(&self, filter: &ListFilter) -> Result<Vec<JobRecord>> {
        list(&self.conn, filter)
    }

    /// A job's history, oldest first.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn events(&self, id: i64) -> Result<Vec<Event>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, job_id, at, kind, attempt, detail FROM job_events
             WHERE job_id = ?1 ORDER BY id",
        )?;
        let rows = stmt.query_map([id], event_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Events after `after_id` whose kind ends a job (succeeded, failed, lost, cancelled),
    /// oldest first, at most `limit`.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn endings_after(&self, after_id: i64, limit: u64) -> Result<Vec<Event>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, job_id, at, kind, attempt, detail FROM job_events
             WHERE id > ?1 AND kind IN ('succeeded', 'failed', 'lost', 'cancelled')
             ORDER BY id LIMIT (SELECT ?2)",
        )?;
        let rows = stmt.query_map(params![after_id, limit as i64], event_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// The id of the newest event, or 0.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn last_event_id(&self) -> Result<i64> {
        Ok(self
            .conn
            .query_row("SELECT coalesce(max(id), 0) FROM job_events", [], |r| {
                r.get(0)
            })?)
    }

    /// The captured output of one attempt of a job, or of its latest attempt.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn output(&self, id: i64, attempt: Option<i64>) -> Result<Option<Output>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT attempt, stdout, stderr, stdout_truncated, stderr_truncated
             FROM job_output WHERE job_id = ?1 AND (?2 IS NULL OR attempt = ?2)
             ORDER BY id DESC LIMIT 1",
        )?;
        Ok(stmt
            .query_row(params![id, attempt], |r| {
                Ok(Output {
                    attempt: r.get(0)?,
                    stdout: r.get(1)?,
                    stderr: r.get(2)?,
                    stdout_truncated: r.get(3)?,
                    stderr_truncated: r.get(4)?,
                })
            })
            .optional()?)
    }

    /// How many jobs are in each status.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn counts(&self) -> Result<Counts> {
        let mut counts = Counts::default();
        let mut stmt = self
            .conn
            .prepare_cached("SELECT status, count(*) FROM jobs GROUP BY status")?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            let status: String = row.get(0)?;
            let n = row.get::<_, i64>(1)? as u64;
            match status.parse::<Status>()? {
                Status::Pending => counts.pending = n,
                Status::Running => counts.running = n,
                Status::Succeeded => counts.succeeded = n,
                Status::Failed => counts.failed = n,
                Status::Cancelled => counts.cancelled = n,
            }
        }
        Ok(counts)
    }

    /// The runbook's lease counters at `now`.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn lease_counts(&self, max_recovery_attempts: u32, now: i64) -> Result<LeaseCounts> {
        let (running, stale_running, running_without_lease) = self.conn.query_row(
            "SELECT count(*),
                    coalesce(sum(lease_expires_at IS NOT NULL AND lease_expires_at < ?1), 0),
                    coalesce(sum(run_token IS NULL OR worker_id IS NULL
                                 OR lease_expires_at IS NULL), 0)
             FROM jobs WHERE status = 'running'",
            [now],
            |r| {
                Ok((
                    r.get::<_, i64>(0)? as u64,
                    r.get::<_, i64>(1)? as u64,
                    r.get::<_, i64>(2)? as u64,
                ))
            },
        )?;
        let recovery_exhausted_failed = self.conn.query_row(
            &format!(
                "SELECT count(*) FROM jobs WHERE {}",
                FAILED_STALE_WHERE.replace("?max", "?1")
            ),
            [i64::from(max_recovery_attempts)],
            |r| r.get::<_, i64>(0),
        )?;
        Ok(LeaseCounts {
            running,
            stale_running,
            running_without_lease,
            recovery_exhausted_failed: recovery_exhausted_failed as u64,
        })
    }

    /// Registers a runner process.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written.
    pub(crate) fn register_runner(&self, runner: &RunnerRecord) -> Result<()> {
        self.write(|c| {
            c.execute(
                "INSERT INTO runners (worker_id, pid, proc_start_time, boot_id, host, started_at,
                     heartbeat_at, stopped_at, lease_ttl_ms, heartbeat_interval_ms,
                     max_recovery_attempts)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
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
                ],
            )?;
            Ok(())
        })
    }

    /// Records a runner's clean shutdown.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written.
    pub(crate) fn stop_runner(&self, worker_id: &str, now: i64) -> Result<()> {
        self.write(|c| {
            c.execute(
                "UPDATE runners SET stopped_at = ?2, heartbeat_at = ?2 WHERE worker_id = ?1",
                params![worker_id, now],
            )?;
            Ok(())
        })
    }

    /// The runners that have not shut down cleanly, oldest first, and the most recently
    /// started runner of all (whose settings `status` reports).
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn runners(&self) -> Result<Vec<RunnerRecord>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT worker_id, pid, proc_start_time, boot_id, host, started_at, heartbeat_at,
                    stopped_at, lease_ttl_ms, heartbeat_interval_ms, max_recovery_attempts
             FROM runners WHERE stopped_at IS NULL ORDER BY started_at, worker_id",
        )?;
        let rows = stmt.query_map([], runner_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// The most recently started runner, stopped or not.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn latest_runner(&self) -> Result<Option<RunnerRecord>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT worker_id, pid, proc_start_time, boot_id, host, started_at, heartbeat_at,
                    stopped_at, lease_ttl_ms, heartbeat_interval_ms, max_recovery_attempts
             FROM runners ORDER BY started_at DESC, rowid DESC LIMIT 1",
        )?;
        Ok(stmt.query_row([], runner_row).optional()?)
    }

    /// Marks a runner that is provably dead as stopped, so it is not examined again.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written.
    pub(crate) fn mark_runner_dead(&self, worker_id: &str, now: i64) -> Result<()> {
        self.write(|c| {
            c.execute(
                "UPDATE runners SET stopped_at = ?2 WHERE worker_id = ?1 AND stopped_at IS NULL
                   AND NOT EXISTS (SELECT 1 FROM jobs WHERE status = 'running' AND worker_id = ?1)",
                params![worker_id, now],
            )?;
            Ok(())
        })
    }

    /// Whether any job of `queues` (all queues when empty) is pending (due or not) or running.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn has_unfinished(&self, queues: &[String]) -> Result<bool> {
        let sql = format!(
            "SELECT EXISTS (SELECT 1 FROM jobs WHERE status IN ('pending', 'running') {})",
            queue_filter(queues, 1)
        );
        Ok(self
            .conn
            .query_row(&sql, params_from_iter(queues.iter()), |r| r.get(0))?)
    }
}

/// Refuses a busy timeout that SQLite cannot take (rusqlite would panic on it).
fn check_busy_timeout(timeout: Duration) -> Result<()> {
    if timeout > MAX_BUSY_TIMEOUT {
        return Err(Error::invalid(
            "busy_timeout",
            format!(
                "{}s is more than SQLite can wait: at most {} ms (about 24.8 days)",
                timeout.as_secs_f64(),
                MAX_BUSY_TIMEOUT.as_millis()
            ),
        ));
    }
    Ok(())
}

/// Retries `f` while SQLite reports busy, until `deadline`.
fn retry_busy<T>(
    deadline: Instant,
    mut f: impl FnMut() -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    loop {
        match f() {
            Err(e) if is_busy(&e) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            other => return other,
        }
    }
}

/// Runs `f` in one IMMEDIATE transaction, rolled back when `f` fails.
pub(crate) fn transaction<T>(
    conn: &Connection,
    f: &mut impl FnMut(&Connection) -> Result<T>,
) -> Result<T> {
    conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
    let result = f(conn).and_then(|v| {
        conn.prepare_cached("COMMIT")?.execute([])?;
        Ok(v)
    });
    if result.is_err() && !conn.is_autocommit() {
        // The rollback's own failure adds nothing to the error already returned.
        let _ = conn.execute_batch("ROLLBACK");
    }
    result
}

/// Creates or migrates the schema in one transaction; reads the version inside it, so two
/// processes migrating one new file at once do the work once.
fn migrate(conn: &Connection) -> rusqlite::Result<Migration> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let run = || -> rusqlite::Result<Migration> {
        let from: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        for (i, sql) in MIGRATIONS.iter().enumerate() {
            let to = i as i64 + 1;
            if from < to {
                conn.execute_batch(sql)?;
                conn.pragma_update(None, "user_version", to)?;
            }
        }
        Ok(Migration {
            from,
            to: SCHEMA_VERSION.max(from),
        })
    };
    match run() {
        Ok(m) => {
            conn.execute_batch("COMMIT")?;
            Ok(m)
        }
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// Appends one event to a job's history.
fn event(
    conn: &Connection,
    job_id: i64,
    at: i64,
    kind: EventKind,
    attempt: i64,
    detail: &str,
) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO job_events (job_id, at, kind, attempt, detail) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![job_id, at, kind.as_str(), attempt, detail])?;
    Ok(())
}

fn insert_job(conn: &Connection, job: &Job, now: i64) -> Result<i64> {
    let id = insert_row(conn, job, now)?;
    event(conn, id, now, EventKind::Enqueued, 0, job.queue_name())?;
    Ok(id)
}

/// Inserts a job's row without its event.
fn insert_row(conn: &Connection, job: &Job, now: i64) -> Result<i64> {
    let f = job.fields();
    let scheduled_at = job.scheduled_at(now);
    conn.prepare_cached(
        "INSERT INTO jobs (queue, argv, env, cwd, priority, status, max_attempts,
             backoff_base_ms, backoff_max_ms, on_lost, timeout_ms, idle_timeout_ms,
             created_at, scheduled_at)
         VALUES (?1, ?2, ?3, ?4, ?5, 'pending', ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
    )?
    .execute(params![
        f.queue,
        f.argv,
        f.env,
        f.cwd,
        f.priority,
        f.max_attempts,
        f.backoff_base_ms,
        f.backoff_max_ms,
        f.on_lost,
        f.timeout_ms,
        f.idle_timeout_ms,
        now,
        scheduled_at,
    ])?;
    Ok(conn.last_insert_rowid())
}

/// `AND queue IN (?n, ...)` for a non-empty list of queues, numbering from `first`.
fn queue_filter(queues: &[String], first: usize) -> String {
    if queues.is_empty() {
        return String::new();
    }
    let marks: Vec<String> = (0..queues.len())
        .map(|i| format!("?{}", first + i))
        .collect();
    format!("AND queue IN ({})", marks.join(", "))
}

/// What a runner asks of [`Store::claim`].
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    /// The runner that will hold the leases.
    pub worker_id: &'a str,
    /// Claim at most this many.
    pub limit: u32,
    /// Only from these queues; all when empty.
    pub queues: &'a [String],
    /// The lease each claim takes.
    pub lease_ttl: Duration,
}

/// A job a runner claimed: what it needs to run the attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Claimed {
    /// The job.
    pub id: i64,
    /// The attempt number this claim started.
    pub attempt: i64,
    /// The lease's token, which fences every later write of this attempt.
    pub run_token: String,
    /// The command.
    pub argv: Vec<String>,
    /// Extra environment.
    pub env: Vec<(String, String)>,
    /// The folder to run in.
    pub cwd: Option<String>,
    /// The attempt's timeout.
    pub timeout: Option<Duration>,
    /// The attempt's idle timeout.
    pub idle_timeout: Option<Duration>,
    /// When the lease runs out unless renewed.
    pub lease_expires_at: i64,
    priority: i64,
    scheduled_at: i64,
}

/// The claim, with `{index}` and `{queues}` to fill: see [`claim_sql`]. Parameters: worker id,
/// now, lease expiry, limit, then the queues from `?5`.
///
/// Limits go through a subquery here and below: a bare parameter in LIMIT makes SQLite (built
/// with STAT4) prepare the statement again on every run.
const CLAIM_SQL: &str = "UPDATE jobs SET status = 'running', attempt = attempt + 1,
         run_token = lower(hex(randomblob(16))), worker_id = ?1, started_at = ?2,
         heartbeat_at = ?2, lease_expires_at = ?3, completed_at = NULL, pid = NULL,
         pgid = NULL, proc_start_time = NULL, exit_code = NULL, signal = NULL,
         error_kind = NULL
     WHERE id IN (SELECT id FROM jobs INDEXED BY {index}
                  WHERE status = 'pending' AND teardown_token IS NULL AND scheduled_at <= ?2
                  {queues}
                  ORDER BY priority DESC, scheduled_at, id LIMIT (SELECT ?4))
     RETURNING id, attempt, run_token, argv, env, cwd, timeout_ms, idle_timeout_ms,
               priority, scheduled_at";

/// The claim statement for `queues` (all queues when empty).
fn claim_sql(queues: &[String]) -> String {
    // Without statistics the planner prefers jobs_status (an equality on status) and then
    // sorts every pending row: a claim costs O(pending) instead of reading an index head.
    let index = if queues.is_empty() {
        "jobs_claim"
    } else {
        "jobs_claim_queue"
    };
    CLAIM_SQL
        .replace("{index}", index)
        .replace("{queues}", &queue_filter(queues, 5))
}

pub(crate) fn claim(conn: &Connection, req: &ClaimRequest<'_>, now: i64) -> Result<Vec<Claimed>> {
    if req.limit == 0 {
        return Ok(Vec::new());
    }
    let expires = now.saturating_add(duration_ms(req.lease_ttl));
    let sql = claim_sql(req.queues);
    let mut values: Vec<rusqlite::types::Value> = vec![
        req.worker_id.to_string().into(),
        now.into(),
        expires.into(),
        i64::from(req.limit).into(),
    ];
    values.extend(req.queues.iter().map(|q| q.clone().into()));
    let mut claimed = {
        let mut stmt = conn.prepare_cached(&sql)?;
        let rows = stmt.query_map(params_from_iter(values), |r| {
            Ok(Claimed {
                id: r.get(0)?,
                attempt: r.get(1)?,
                run_token: r.get(2)?,
                argv: json_column(r, 3)?,
                env: json_column(r, 4)?,
                cwd: r.get(5)?,
                timeout: r.get::<_, Option<i64>>(6)?.map(ms_duration),
                idle_timeout: r.get::<_, Option<i64>>(7)?.map(ms_duration),
                lease_expires_at: expires,
                priority: r.get(8)?,
                scheduled_at: r.get(9)?,
            })
        })?;
        rows.collect::<rusqlite::Result<Vec<_>>>()?
    };
    claimed.sort_by_key(|c| (-c.priority, c.scheduled_at, c.id));
    for c in &claimed {
        event(
            conn,
            c.id,
            now,
            EventKind::Claimed,
            c.attempt,
            &format!("worker {}", req.worker_id),
        )?;
    }
    Ok(claimed)
}

fn ms_duration(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// Reads a JSON column (argv or env) into its Rust type.
fn json_column<T: JsonColumn>(r: &Row<'_>, i: usize) -> rusqlite::Result<T> {
    let text: String = r.get(i)?;
    T::parse(&text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, e.into())
    })
}

trait JsonColumn: Sized {
    fn parse(text: &str) -> serde_json::Result<Self>;
}

impl JsonColumn for Vec<String> {
    fn parse(text: &str) -> serde_json::Result<Self> {
        serde_json::from_str(text)
    }
}

impl JsonColumn for Vec<(String, String)> {
    fn parse(text: &str) -> serde_json::Result<Self> {
        serde_json::from_str(text)
    }
}

/// The process an attempt started, to record under its lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptStart {
    /// The job.
    pub job_id: i64,
    /// The attempt's run token.
    pub run_token: String,
    /// The main process.
    pub pid: i32,
    /// Its process group.
    pub pgid: i32,
    /// Its start time, in clock ticks since boot.
    pub start_time: u64,
}

pub(crate) fn record_start(conn: &Connection, s: &AttemptStart, now: i64) -> Result<bool> {
    let attempt: Option<i64> = conn
        .prepare_cached(
            "UPDATE jobs SET pid = ?3, pgid = ?4, proc_start_time = ?5
             WHERE id = ?1 AND status = 'running' AND run_token = ?2 RETURNING attempt",
        )?
        .query_row(
            params![s.job_id, s.run_token, s.pid, s.pgid, s.start_time as i64],
            |r| r.get(0),
        )
        .optional()?;
    match attempt {
        Some(attempt) => {
            event(
                conn,
                s.job_id,
                now,
                EventKind::Started,
                attempt,
                &format!("pid {} pgid {}", s.pid, s.pgid),
            )?;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// What [`Store::renew`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Renewal {
    /// Tokens whose leases were renewed.
    pub renewed: Vec<String>,
    /// Tokens that no longer hold a lease: reclaimed, cancelled or retried under the runner.
    pub lost: Vec<String>,
}

/// A runner's renewal of its leases. Parameters: worker id, now, new expiry, tokens (JSON).
const RENEW_SQL: &str = "UPDATE jobs SET heartbeat_at = ?2, lease_expires_at = ?3
     WHERE status = 'running' AND worker_id = ?1
       AND run_token IN (SELECT value FROM json_each(?4))
     RETURNING run_token";

fn renew(
    conn: &Connection,
    worker_id: &str,
    tokens: &[String],
    lease_ttl: Duration,
    now: i64,
) -> Result<Renewal> {
    runner_heartbeat(conn, worker_id, now)?;
    if tokens.is_empty() {
        return Ok(Renewal::default());
    }
    let list = serde_json::to_string(tokens).unwrap_or_default();
    let expires = now.saturating_add(duration_ms(lease_ttl));
    let renewed: HashSet<String> = {
        let mut stmt = conn.prepare_cached(RENEW_SQL)?;
        let rows = stmt.query_map(params![worker_id, now, expires, list], |r| r.get(0))?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    let (renewed, lost) = tokens
        .iter()
        .cloned()
        .partition(|t| renewed.contains(t.as_str()));
    Ok(Renewal { renewed, lost })
}

fn runner_heartbeat(conn: &Connection, worker_id: &str, now: i64) -> Result<()> {
    conn.prepare_cached("UPDATE runners SET heartbeat_at = ?2 WHERE worker_id = ?1")?
        .execute(params![worker_id, now])?;
    Ok(())
}

/// How an attempt ended, as its worker reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// Exit code 0.
    Succeeded,
    /// The command failed; retried while attempts are left, unless it could not start.
    Failed {
        /// Why.
        kind: ErrorKind,
        /// The exit code, when it exited.
        exit_code: Option<i32>,
        /// The signal, when one killed it.
        signal: Option<i32>,
        /// In words.
        message: String,
    },
    /// The runner fenced itself: it could not renew the lease in time and killed the
    /// attempt. Follows the recovery budget and `on_lost`, like a reclaim.
    Lost {
        /// Why, after the lease-expired prefix.
        message: String,
    },
    /// The runner shut down and killed the attempt: back to pending, without spending the
    /// recovery budget or an attempt.
    Interrupted {
        /// Why.
        message: String,
    },
}

/// An attempt's ending with what it left behind, for [`Store::finish`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finish {
    /// The job.
    pub job_id: i64,
    /// The attempt's run token: the fence.
    pub run_token: String,
    /// The attempt number.
    pub attempt: i64,
    /// How it ended.
    pub ending: Ending,
    /// The captured output, if any.
    pub output: Option<Output>,
    /// Extra events to record with the ending (kind, detail), such as leaked processes.
    pub notes: Vec<(EventKind, String)>,
    /// The recovery budget to apply to a [`Ending::Lost`].
    pub max_recovery_attempts: u32,
}

/// What [`Store::finish`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finished {
    /// The ending was recorded; the job is now in this status.
    Recorded(Status),
    /// The attempt no longer held its lease: nothing changed but a `late_result_discarded`
    /// event.
    Fenced,
}

/// The wait before retry number `failures` (1 for the first retry), with ±20% jitter.
pub(crate) fn backoff_ms(base_ms: i64, max_ms: i64, failures: i64) -> i64 {
    let shift = u32::try_from(failures.saturating_sub(1).clamp(0, 40)).unwrap_or(40);
    let wait = base_ms.saturating_mul(1i64 << shift).min(max_ms).max(0);
    // A fresh random key per call: std's hasher seeds are random, which is all jitter needs.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_i64(wait);
    let unit = (h.finish() % 10_001) as f64 / 10_000.0; // 0.0..=1.0
    let jittered = wait as f64 * (0.8 + 0.4 * unit);
    (jittered.round() as i64).min(max_ms.saturating_add(max_ms / 5))
}

pub(crate) fn finish_attempt(conn: &Connection, f: &Finish, now: i64) -> Result<Finished> {
    if f.ending == Ending::Succeeded {
        return finish_succeeded(conn, f, now);
    }
    let row: Option<(i64, i64, i64, i64, i64, String, i64)> = conn
        .prepare_cached(
            "SELECT failed_attempts, max_attempts, backoff_base_ms, backoff_max_ms,
                    recovery_count, on_lost, attempt
             FROM jobs WHERE id = ?1 AND status = 'running' AND run_token = ?2",
        )?
        .query_row(params![f.job_id, f.run_token], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
                r.get(6)?,
            ))
        })
        .optional()?;
    let Some((failed, max_attempts, base, cap, recovery, on_lost, attempt)) = row else {
        return fenced(conn, f, now);
    };
    // Every UPDATE below repeats the fence, though the IMMEDIATE transaction already holds it.
    const FENCE: &str = "WHERE id = ?1 AND status = 'running' AND run_token = ?2";
    const RELEASE: &str = "lease_expires_at = NULL, heartbeat_at = ?3";
    let (status, kind, detail) = match &f.ending {
        // Taken by the early return above, which needs no SELECT.
        Ending::Succeeded => return finish_succeeded(conn, f, now),
        Ending::Failed {
            kind,
            exit_code,
            signal,
            message,
        } => {
            let failed = failed + 1;
            let retry = *kind != ErrorKind::Spawn && failed < max_attempts;
            if retry {
                let wait = backoff_ms(base, cap, failed);
                conn.prepare_cached(&format!(
                    "UPDATE jobs SET status = 'pending', failed_attempts = ?4,
                         scheduled_at = ?3 + ?5, exit_code = ?6, signal = ?7, error_kind = ?8,
                         last_error = ?9, started_at = NULL, completed_at = NULL,
                         heartbeat_at = NULL, lease_expires_at = NULL, run_token = NULL,
                         worker_id = NULL {FENCE}"
                ))?
                .execute(params![
                    f.job_id,
                    f.run_token,
                    now,
                    failed,
                    wait,
                    exit_code,
                    signal,
                    kind.as_str(),
                    message
                ])?;
                let detail = format!(
                    "{message}; retry in {:.1}s (failed {failed} of {max_attempts} attempts)",
                    wait as f64 / 1000.0
                );
                (Status::Pending, EventKind::RetryScheduled, detail)
            } else {
                conn.prepare_cached(&format!(
                    "UPDATE jobs SET status = 'failed', failed_attempts = ?4, completed_at = ?3,
                         exit_code = ?5, signal = ?6, error_kind = ?7, last_error = ?8,
                         {RELEASE} {FENCE}"
                ))?
                .execute(params![
                    f.job_id,
                    f.run_token,
                    now,
                    failed,
                    exit_code,
                    signal,
                    kind.as_str(),
                    message
                ])?;
                (Status::Failed, EventKind::Failed, message.clone())
            }
        }
        Ending::Lost { message } => {
            let recovery = recovery + 1;
            let message = format!("{LEASE_EXPIRED_PREFIX}{message}");
            let (status, message) =
                lost_verdict(&on_lost, recovery, f.max_recovery_attempts, message);
            conn.prepare_cached(&format!(
                "UPDATE jobs SET status = ?4, recovery_count = ?5, last_error = ?6,
                     scheduled_at = CASE WHEN ?4 = 'pending' THEN ?3 ELSE scheduled_at END,
                     completed_at = CASE WHEN ?4 = 'failed' THEN ?3 END,
                     error_kind = CASE WHEN ?4 = 'failed' THEN 'lost' END,
                     run_token = CASE WHEN ?4 = 'pending' THEN NULL ELSE run_token END,
                     worker_id = CASE WHEN ?4 = 'pending' THEN NULL ELSE worker_id END,
                     started_at = CASE WHEN ?4 = 'pending' THEN NULL ELSE started_at END,
                     lease_expires_at = NULL,
                     heartbeat_at = CASE WHEN ?4 = 'pending' THEN NULL ELSE ?3 END {FENCE}"
            ))?
            .execute(params![
                f.job_id,
                f.run_token,
                now,
                status.as_str(),
                recovery,
                message
            ])?;
            let kind = if status == Status::Failed {
                EventKind::Lost
            } else {
                EventKind::Reclaimed
            };
            (status, kind, message)
        }
        Ending::Interrupted { message } => {
            conn.prepare_cached(&format!(
                "UPDATE jobs SET status = 'pending', scheduled_at = ?3, last_error = ?4,
                     started_at = NULL, completed_at = NULL, heartbeat_at = NULL,
                     lease_expires_at = NULL, run_token = NULL, worker_id = NULL {FENCE}"
            ))?
            .execute(params![f.job_id, f.run_token, now, message])?;
            (Status::Pending, EventKind::Interrupted, message.clone())
        }
    };
    finish_rest(conn, f, now, attempt)?;
    event(conn, f.job_id, now, kind, attempt, &detail)?;
    Ok(Finished::Recorded(status))
}

/// A successful ending: the fenced UPDATE returns the attempt, so the common case needs no
/// read before it; no row back means the lease is gone, and only the fenced event is written.
fn finish_succeeded(conn: &Connection, f: &Finish, now: i64) -> Result<Finished> {
    let attempt: Option<i64> = conn
        .prepare_cached(
            "UPDATE jobs SET status = 'succeeded', completed_at = ?3, exit_code = 0,
                 signal = NULL, error_kind = NULL, lease_expires_at = NULL, heartbeat_at = ?3
             WHERE id = ?1 AND status = 'running' AND run_token = ?2 RETURNING attempt",
        )?
        .query_row(params![f.job_id, f.run_token, now], |r| r.get(0))
        .optional()?;
    let Some(attempt) = attempt else {
        return fenced(conn, f, now);
    };
    finish_rest(conn, f, now, attempt)?;
    event(conn, f.job_id, now, EventKind::Succeeded, attempt, "exit 0")?;
    Ok(Finished::Recorded(Status::Succeeded))
}

/// An ending whose attempt no longer holds its lease: nothing changes but the
/// `late_result_discarded` event.
fn fenced(conn: &Connection, f: &Finish, now: i64) -> Result<Finished> {
    let what = match &f.ending {
        Ending::Succeeded => "exit 0",
        Ending::Failed { message, .. } => message,
        Ending::Lost { message } | Ending::Interrupted { message } => message,
    };
    let mut detail = format!("attempt no longer holds its lease; discarded result: {what}");
    for (kind, note) in &f.notes {
        detail.push_str(&format!("; {kind}: {note}"));
    }
    event(
        conn,
        f.job_id,
        now,
        EventKind::LateResultDiscarded,
        f.attempt,
        &detail,
    )?;
    Ok(Finished::Fenced)
}

/// What every recorded ending writes after its UPDATE and before its own event: the output
/// (if any) and the notes' events.
fn finish_rest(conn: &Connection, f: &Finish, now: i64, attempt: i64) -> Result<()> {
    // An attempt that wrote nothing leaves no row: `output` then finds none, which reads as
    // empty, and a stream of quiet jobs costs one write less each.
    if let Some(out) = f
        .output
        .as_ref()
        .filter(|o| !o.stdout.is_empty() || !o.stderr.is_empty())
    {
        conn.prepare_cached(
            "INSERT INTO job_output
                 (job_id, attempt, stdout, stderr, stdout_truncated, stderr_truncated)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?
        .execute(params![
            f.job_id,
            attempt,
            out.stdout,
            out.stderr,
            out.stdout_truncated,
            out.stderr_truncated
        ])?;
    }
    for (kind, note) in &f.notes {
        event(conn, f.job_id, now, *kind, attempt, note)?;
    }
    Ok(())
}

/// Where a lost attempt's job goes: back to pending while the budget lasts and the job asks
/// for it, failed otherwise, with the message saying which.
fn lost_verdict(on_lost: &str, recovery: i64, max: u32, message: String) -> (Status, String) {
    if on_lost == OnLost::Fail.as_str() {
        (
            Status::Failed,
            format!(
                "{message}; on_lost=fail: not executed again, and its side effects may already have happened"
            ),
        )
    } else if recovery > i64::from(max) {
        (
            Status::Failed,
            format!("{message}; recovery budget of {max} exhausted (reclaimed {recovery} times)"),
        )
    } else {
        (Status::Pending, message)
    }
}

/// What a sweeper asks of [`Store::reclaim`].
#[derive(Debug, Clone)]
pub struct ReclaimRequest<'a> {
    /// The recovery budget.
    pub max_recovery_attempts: u32,
    /// At most this many reclaims; 0 disables reclaiming.
    pub batch: u32,
    /// Never reclaim this runner's jobs: the caller's own, which it renews itself.
    pub exclude_worker: Option<&'a str>,
    /// Runners known to be dead, with the evidence: their running jobs are reclaimed at once.
    pub dead_workers: &'a [(String, String)],
    /// Reclaim expired leases (false while a runner settles after a clock jump: only dead
    /// runners' jobs and lease-less rows are reclaimed then).
    pub expired: bool,
}

/// A lost attempt: what is needed to find and tear down its processes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LostAttempt {
    /// The job.
    pub job_id: i64,
    /// The attempt that was lost.
    pub attempt: i64,
    /// Its run token ("" when the row had none).
    pub run_token: String,
    /// Its recorded process group.
    pub pgid: Option<i32>,
    /// Its recorded start time.
    pub start_time: Option<u64>,
}

/// One reclaimed job.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reclaimed {
    /// The lost attempt.
    pub lost: LostAttempt,
    /// The runner that held it.
    pub worker_id: Option<String>,
    /// Where the job went: pending or failed.
    pub status: Status,
    /// The `last_error` written.
    pub message: String,
}

/// What [`Store::reclaim`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReclaimReport {
    /// Every reclaimed job.
    pub reclaimed: Vec<Reclaimed>,
}

impl ReclaimReport {
    /// Jobs moved back to pending.
    pub fn pending(&self) -> usize {
        self.reclaimed
            .iter()
            .filter(|r| r.status == Status::Pending)
            .count()
    }

    /// Jobs failed as lost.
    pub fn failed(&self) -> usize {
        self.reclaimed
            .iter()
            .filter(|r| r.status == Status::Failed)
            .count()
    }
}

/// The running rows a sweep may reclaim. Parameters: the excluded worker (or NULL), whether
/// expired leases count, now, dead workers (JSON), batch size.
const RECLAIM_CANDIDATES_SQL: &str =
    "SELECT id, attempt, run_token, worker_id, pgid, proc_start_time, lease_expires_at,
            on_lost, recovery_count
     FROM jobs
     WHERE status = 'running'
       AND (?1 IS NULL OR worker_id IS NULL OR worker_id != ?1)
       AND (run_token IS NULL OR worker_id IS NULL OR lease_expires_at IS NULL
            OR (?2 AND lease_expires_at < ?3)
            OR worker_id IN (SELECT value FROM json_each(?4)))
     ORDER BY lease_expires_at, id LIMIT (SELECT ?5)";

fn reclaim(conn: &Connection, req: &ReclaimRequest<'_>, now: i64) -> Result<ReclaimReport> {
    let mut report = ReclaimReport::default();
    if req.batch == 0 {
        return Ok(report);
    }
    let dead: Vec<&str> = req.dead_workers.iter().map(|(w, _)| w.as_str()).collect();
    let dead_json = serde_json::to_string(&dead).unwrap_or_default();
    /// A running row that may be reclaimed: id, attempt, run_token, worker_id, pgid,
    /// proc_start_time, lease_expires_at, on_lost, recovery_count.
    type Candidate = (
        i64,
        i64,
        Option<String>,
        Option<String>,
        Option<i32>,
        Option<i64>,
        Option<i64>,
        String,
        i64,
    );
    let candidates: Vec<Candidate> = {
        let mut stmt = conn.prepare_cached(RECLAIM_CANDIDATES_SQL)?;
        let rows = stmt.query_map(
            params![req.exclude_worker, req.expired, now, dead_json, req.batch],
            |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get(6)?,
                    r.get(7)?,
                    r.get(8)?,
                ))
            },
        )?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    for (id, attempt, token, worker, pgid, start, expires, on_lost, recovery) in candidates {
        let missing = token.is_none() || worker.is_none() || expires.is_none();
        let message = if missing {
            let absent: Vec<&str> = [
                ("run_token", token.is_none()),
                ("worker_id", worker.is_none()),
                ("lease_expires_at", expires.is_none()),
            ]
            .into_iter()
            .filter_map(|(n, a)| a.then_some(n))
            .collect();
            format!("{LEASE_MISSING_PREFIX}no {}", absent.join(", "))
        } else if let Some((w, why)) = req
            .dead_workers
            .iter()
            .find(|(w, _)| Some(w.as_str()) == worker.as_deref())
        {
            format!("{LEASE_EXPIRED_PREFIX}runner {w} is dead: {why}")
        } else {
            let late = now - expires.unwrap_or(now);
            format!(
                "{LEASE_EXPIRED_PREFIX}worker {} held it until {} ({:.1}s ago)",
                worker.as_deref().unwrap_or("?"),
                expires.unwrap_or(0),
                late as f64 / 1000.0
            )
        };
        let recovery = recovery + 1;
        let (status, message) =
            lost_verdict(&on_lost, recovery, req.max_recovery_attempts, message);
        let token_text = token.clone().unwrap_or_default();
        let changed = conn
            .prepare_cached(
                "UPDATE jobs SET status = ?3, recovery_count = ?4, last_error = ?5,
                     scheduled_at = CASE WHEN ?3 = 'pending' THEN ?6 ELSE scheduled_at END,
                     completed_at = CASE WHEN ?3 = 'failed' THEN ?6 END,
                     error_kind = CASE WHEN ?3 = 'failed' THEN 'lost' END,
                     started_at = CASE WHEN ?3 = 'pending' THEN NULL ELSE started_at END,
                     heartbeat_at = CASE WHEN ?3 = 'pending' THEN NULL ELSE heartbeat_at END,
                     lease_expires_at = NULL,
                     run_token = CASE WHEN ?3 = 'pending' THEN NULL ELSE run_token END,
                     worker_id = CASE WHEN ?3 = 'pending' THEN NULL ELSE worker_id END,
                     teardown_token = ?7, teardown_pgid = pgid,
                     teardown_start_time = proc_start_time
                 WHERE id = ?1 AND status = 'running' AND run_token IS ?2",
            )?
            .execute(params![
                id,
                token,
                status.as_str(),
                recovery,
                message,
                now,
                token_text
            ])?;
        if changed == 0 {
            continue;
        }
        let kind = if status == Status::Failed {
            EventKind::Lost
        } else {
            EventKind::Reclaimed
        };
        event(conn, id, now, kind, attempt, &message)?;
        report.reclaimed.push(Reclaimed {
            lost: LostAttempt {
                job_id: id,
                attempt,
                run_token: token_text,
                pgid,
                start_time: start.map(|s| s as u64),
            },
            worker_id: worker,
            status,
            message,
        });
    }
    Ok(report)
}

fn pending_teardowns(conn: &Connection, limit: u64) -> Result<Vec<LostAttempt>> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, attempt, teardown_token, teardown_pgid, teardown_start_time FROM jobs
         WHERE teardown_token IS NOT NULL ORDER BY id LIMIT (SELECT ?1)",
    )?;
    let rows = stmt.query_map([limit as i64], |r| {
        Ok(LostAttempt {
            job_id: r.get(0)?,
            attempt: r.get(1)?,
            run_token: r.get(2)?,
            pgid: r.get(3)?,
            start_time: r.get::<_, Option<i64>>(4)?.map(|s| s as u64),
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

fn record_teardown(
    conn: &Connection,
    id: i64,
    token: &str,
    detail: &str,
    now: i64,
) -> Result<bool> {
    let attempt: Option<i64> = conn
        .prepare_cached(
            "UPDATE jobs SET teardown_token = NULL, teardown_pgid = NULL,
                 teardown_start_time = NULL
             WHERE id = ?1 AND teardown_token = ?2 RETURNING attempt",
        )?
        .query_row(params![id, token], |r| r.get(0))
        .optional()?;
    match attempt {
        Some(attempt) => {
            event(conn, id, now, EventKind::TornDown, attempt, detail)?;
            Ok(true)
        }
        None => Ok(false),
    }
}

fn cancel(conn: &Connection, id: i64, now: i64) -> Result<JobRecord> {
    let current = job(conn, id)?;
    let detail = match current.status {
        Status::Pending => {
            conn.execute(
                "UPDATE jobs SET status = 'cancelled', completed_at = ?2
                 WHERE id = ?1 AND status = 'pending'",
                params![id, now],
            )?;
            "cancelled while pending".to_string()
        }
        Status::Running => {
            // Revoke the lease: the runner's next renewal reports it lost and it kills the
            // attempt; the teardown marker lets any runner kill it if that runner is gone.
            conn.execute(
                "UPDATE jobs SET status = 'cancelled', completed_at = ?2, lease_expires_at = NULL,
                     teardown_token = coalesce(run_token, ''), teardown_pgid = pgid,
                     teardown_start_time = proc_start_time
                 WHERE id = ?1 AND status = 'running'",
                params![id, now],
            )?;
            format!(
                "cancelled while running attempt {}; lease revoked",
                current.attempt
            )
        }
        s => {
            return Err(Error::WrongState {
                id,
                status: s.to_string(),
                reason: "it has already finished and cannot be cancelled".into(),
            });
        }
    };
    event(
        conn,
        id,
        now,
        EventKind::Cancelled,
        current.attempt,
        &detail,
    )?;
    job(conn, id)
}

fn retry(conn: &Connection, id: i64, reason: Option<&str>, now: i64) -> Result<JobRecord> {
    let current = job(conn, id)?;
    let refuse = |reason: String| Error::WrongState {
        id,
        status: current.status.to_string(),
        reason,
    };
    let lease_gone = current.run_token.is_none()
        || current.worker_id.is_none()
        || current.lease_expires_at.is_none_or(|t| t < now);
    match current.status {
        Status::Failed | Status::Cancelled => {}
        Status::Running if lease_gone => {}
        Status::Running => {
            return Err(refuse(format!(
                "its lease is live (worker {}, expires in {:.1}s): a runner is executing it; cancel it instead",
                current.worker_id.as_deref().unwrap_or("?"),
                (current.lease_expires_at.unwrap_or(now) - now) as f64 / 1000.0
            )));
        }
        Status::Pending => return Err(refuse("it is already waiting to run".into())),
        Status::Succeeded => {
            return Err(refuse(
                "succeeded jobs are not run again; enqueue a new job".into(),
            ));
        }
    }
    let message = match reason {
        Some(r) if !r.trim().is_empty() => format!("manual retry: {}", r.trim()),
        _ => "manual retry after lease recovery".to_string(),
    };
    conn.execute(
        "UPDATE jobs SET
             teardown_token = CASE WHEN status = 'running' THEN coalesce(run_token, '')
                                   ELSE teardown_token END,
             teardown_pgid = CASE WHEN status = 'running' THEN pgid ELSE teardown_pgid END,
             teardown_start_time = CASE WHEN status = 'running' THEN proc_start_time
                                        ELSE teardown_start_time END,
             status = 'pending', scheduled_at = ?2, started_at = NULL, completed_at = NULL,
             heartbeat_at = NULL, lease_expires_at = NULL, run_token = NULL, worker_id = NULL,
             recovery_count = 0, attempt = 0, failed_attempts = 0, exit_code = NULL,
             signal = NULL, error_kind = NULL, last_error = ?3
         WHERE id = ?1 AND status = ?4",
        params![id, now, message, current.status.as_str()],
    )?;
    event(
        conn,
        id,
        now,
        EventKind::ManualRetry,
        current.attempt,
        &message,
    )?;
    job(conn, id)
}

/// Filters for [`Store::list`].
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// Only jobs in this status.
    pub status: Option<Status>,
    /// Only jobs of this queue.
    pub queue: Option<String>,
    /// Only failed jobs that exhausted this recovery budget (the runbook's `--failed-stale`).
    pub failed_stale: Option<u32>,
    /// At most this many.
    pub limit: Option<u64>,
}

/// The runbook's definition of a job that exhausted the recovery budget.
const FAILED_STALE_WHERE: &str = "status = 'failed' AND recovery_count > ?max
    AND (lower(coalesce(last_error, '')) LIKE 'lease expired after missing heartbeat;%'
         OR lower(coalesce(last_error, '')) LIKE 'lease metadata missing for running job;%')";

const JOB_COLUMNS: &str = "id, queue, argv, env, cwd, priority, status, attempt, max_attempts,
    failed_attempts, recovery_count, on_lost, timeout_ms, idle_timeout_ms, created_at,
    scheduled_at, started_at, completed_at, heartbeat_at, lease_expires_at, run_token, worker_id,
    pid, pgid, exit_code, signal, error_kind, last_error, teardown_token IS NOT NULL";

fn job_row(r: &Row<'_>) -> rusqlite::Result<JobRecord> {
    let status: String = r.get(6)?;
    let on_lost: String = r.get(11)?;
    let kind: Option<String> = r.get(26)?;
    let bad = |i: usize, what: String| {
        rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, what.into())
    };
    Ok(JobRecord {
        id: r.get(0)?,
        queue: r.get(1)?,
        argv: json_column(r, 2)?,
        env: json_column(r, 3)?,
        cwd: r.get(4)?,
        priority: r.get(5)?,
        status: status
            .parse()
            .map_err(|_| bad(6, format!("status {status:?}")))?,
        attempt: r.get(7)?,
        max_attempts: r.get(8)?,
        failed_attempts: r.get(9)?,
        recovery_count: r.get(10)?,
        on_lost: on_lost
            .parse()
            .map_err(|_| bad(11, format!("on_lost {on_lost:?}")))?,
        timeout_ms: r.get(12)?,
        idle_timeout_ms: r.get(13)?,
        created_at: r.get(14)?,
        scheduled_at: r.get(15)?,
        started_at: r.get(16)?,
        completed_at: r.get(17)?,
        heartbeat_at: r.get(18)?,
        lease_expires_at: r.get(19)?,
        run_token: r.get(20)?,
        worker_id: r.get(21)?,
        pid: r.get(22)?,
        pgid: r.get(23)?,
        exit_code: r.get(24)?,
        signal: r.get(25)?,
        error_kind: kind.as_deref().and_then(ErrorKind::parse),
        last_error: r.get(27)?,
        teardown_pending: r.get(28)?,
    })
}

fn job(conn: &Connection, id: i64) -> Result<JobRecord> {
    conn.prepare_cached(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1"))?
        .query_row([id], job_row)
        .optional()?
        .ok_or(Error::NoSuchJob(id))
}

fn list(conn: &Connection, filter: &ListFilter) -> Result<Vec<JobRecord>> {
    let mut sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE 1");
    let mut values: Vec<rusqlite::types::Value> = Vec::new();
    if let Some(s) = filter.status {
        values.push(s.as_str().to_string().into());
        sql.push_str(&format!(" AND status = ?{}", values.len()));
    }
    if let Some(q) = &filter.queue {
        values.push(q.clone().into());
        sql.push_str(&format!(" AND queue = ?{}", values.len()));
    }
    if let Some(max) = filter.failed_stale {
        values.push(i64::from(max).into());
        sql.push_str(&format!(
            " AND {}",
            FAILED_STALE_WHERE.replace("?max", &format!("?{}", values.len()))
        ));
        sql.push_str(" ORDER BY completed_at DESC NULLS LAST, created_at DESC, id DESC");
    } else {
        sql.push_str(" ORDER BY id DESC");
    }
    if let Some(limit) = filter.limit {
        values.push((limit.min(i64::MAX as u64) as i64).into());
        sql.push_str(&format!(" LIMIT ?{}", values.len()));
    }
    let mut stmt = conn.prepare(&sql)?;
    let rows = stmt.query_map(params_from_iter(values), job_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

fn event_row(r: &Row<'_>) -> rusqlite::Result<Event> {
    Ok(Event {
        id: r.get(0)?,
        job_id: r.get(1)?,
        at: r.get(2)?,
        kind: {
            let text: String = r.get(3)?;
            EventKind::parse(&text).ok_or_else(|| {
                rusqlite::Error::FromSqlConversionFailure(
                    3,
                    rusqlite::types::Type::Text,
                    format!("unknown event kind {text:?}").into(),
                )
            })?
        },
        attempt: r.get(4)?,
        detail: r.get(5)?,
    })
}

/// How many jobs are in each status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Counts {
    /// Waiting to run.
    pub pending: u64,
    /// Being run.
    pub running: u64,
    /// Exited 0.
    pub succeeded: u64,
    /// Failed for good.
    pub failed: u64,
    /// Cancelled.
    pub cancelled: u64,
}

/// The runbook's lease counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseCounts {
    /// Running jobs.
    pub running: u64,
    /// Running jobs whose lease has expired.
    pub stale_running: u64,
    /// Running jobs missing run_token, worker_id or lease_expires_at.
    pub running_without_lease: u64,
    /// Failed jobs that exhausted the recovery budget.
    pub recovery_exhausted_failed: u64,
}

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
}

fn runner_row(r: &Row<'_>) -> rusqlite::Result<RunnerRecord> {
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
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wait before jitter, as `backoff_ms` computes it.
    fn unjittered(base: i64, cap: i64, failures: i64) -> i64 {
        let doublings = failures.saturating_sub(1).clamp(0, 40);
        base.saturating_mul(1i64 << doublings).min(cap).max(0)
    }

    fn samples(base: i64, cap: i64, failures: i64) -> Vec<i64> {
        (0..200).map(|_| backoff_ms(base, cap, failures)).collect()
    }

    #[test]
    fn backoff_never_overflows_and_stays_within_the_jittered_cap() {
        let counts = [
            i64::MIN,
            -1,
            0,
            1,
            2,
            10,
            40,
            41,
            62,
            63,
            64,
            1000,
            i64::MAX,
        ];
        for (base, cap) in [
            (1_000, 3_600_000),
            (250, 4_000),
            (1, 1),
            (0, 0),
            (i64::MAX, i64::MAX),
            (i64::MAX / 2, i64::MAX),
        ] {
            for failures in counts {
                let wait = unjittered(base, cap, failures);
                // ±20% of the wait, and never more than 120% of the cap.
                let low = (wait as f64 * 0.8).floor() as i64;
                let high = ((wait as f64 * 1.2).ceil() as i64).min(cap.saturating_add(cap / 5));
                for got in samples(base, cap, failures) {
                    assert!(
                        (low..=high).contains(&got),
                        "backoff_ms({base}, {cap}, {failures}) = {got}, not in {low}..={high}"
                    );
                }
            }
        }
    }

    #[test]
    fn backoff_is_jittered_at_every_failure_count() {
        for failures in [1, 2, 5] {
            let s = samples(1_000, 3_600_000, failures);
            assert!(
                s.iter().any(|&w| w != s[0]),
                "no jitter at {failures}: {s:?}"
            );
        }
    }

    #[test]
    fn backoff_past_the_cap_is_jittered_around_the_cap_not_pinned_above_it() {
        let cap = 4_000;
        for failures in [6, 10, 63, 64, 1000, i64::MAX] {
            let s = samples(250, cap, failures);
            assert!(
                s.iter().all(|w| (cap * 8 / 10..=cap * 12 / 10).contains(w)),
                "{failures}: {s:?}"
            );
            // The cap is the centre of the jitter: some waits fall below it, some above.
            assert!(s.iter().any(|&w| w < cap), "{failures}: {s:?}");
            assert!(s.iter().any(|&w| w > cap), "{failures}: {s:?}");
        }
    }

    /// The rendered query plan of `sql` with `values` bound.
    fn plan(conn: &Connection, sql: &str, values: Vec<rusqlite::types::Value>) -> String {
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let mut rows = stmt.query(params_from_iter(values)).unwrap();
        let mut lines = Vec::new();
        while let Some(row) = rows.next().unwrap() {
            lines.push(row.get::<_, String>(3).unwrap());
        }
        lines.join("\n")
    }

    /// Whether a line of `plan` reads the index `name`.
    fn uses_index(plan: &str, name: &str) -> bool {
        plan.lines().any(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            words.windows(2).any(|w| w == ["INDEX", name])
        })
    }

    #[test]
    fn claim_reclaim_and_renew_statements_read_their_indexes() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("jobs.db")).unwrap();
        // No ANALYZE: a user's file has no statistics, and the planner's choice is what it is
        // then.
        let conn = store.conn();
        let now = 1_700_000_000_000i64;
        let v = |x: &str| rusqlite::types::Value::from(x.to_string());
        // The claim names its index; the index must serve the claim's order without a sort,
        // for all queues or one queue. (For several queues SQLite reads the index once per
        // queue and sorts what it read: only the index use is checked then.)
        for queues in [vec![], vec!["a".to_string()], vec!["a".into(), "b".into()]] {
            let mut values = vec![v("w"), now.into(), (now + 30_000).into(), 8i64.into()];
            values.extend(queues.iter().map(|q| v(q)));
            let p = plan(conn, &claim_sql(&queues), values);
            let index = if queues.is_empty() {
                "jobs_claim"
            } else {
                "jobs_claim_queue"
            };
            assert!(uses_index(&p, index), "{queues:?}: {p}");
            if queues.len() <= 1 {
                assert!(!p.contains("TEMP B-TREE"), "{queues:?}: {p}");
            }
        }
        // The sweeper's query reads the running rows only (through either index on them):
        // their number is bounded by the runners' workers, whatever the size of the table.
        for (exclude, expired) in [(Some("me"), true), (None, false)] {
            let values = vec![
                exclude.map(v).unwrap_or(rusqlite::types::Value::Null),
                i64::from(expired).into(),
                now.into(),
                v(r#"["dead"]"#),
                100i64.into(),
            ];
            let p = plan(conn, RECLAIM_CANDIDATES_SQL, values);
            let running_only = uses_index(&p, "jobs_running_lease")
                || uses_index(&p, "jobs_running_worker")
                || p.contains("INDEX jobs_status (status=?)");
            let full_scan = p.lines().any(|l| l.trim() == "SCAN jobs");
            assert!(running_only && !full_scan, "{p}");
        }
        let values = vec![
            v("w"),
            now.into(),
            (now + 30_000).into(),
            v(r#"["t1","t2"]"#),
        ];
        let p = plan(conn, RENEW_SQL, values);
        assert!(uses_index(&p, "jobs_running_worker"), "{p}");
    }
}
