//! The store: the only code that speaks SQL.
//!
//! Every transition of a job is one conditional UPDATE guarded by what the writer believes (the
//! job's id, its status and, for a running job, its run token), in one IMMEDIATE transaction
//! that also appends the job's event. A write whose guard no longer holds changes nothing: that
//! is the fence. The functions that do the work take a `&Connection`, so the runner's writer
//! thread can run many of them in one transaction (group commit); [`Store`]'s methods wrap each
//! in a transaction of its own.
//!
//! The caller of a guarded statement checks how many rows it changed (or what its RETURNING
//! gave back) and decides from that: nothing changed means the guard no longer held.
//!
//! One file per concern, each with its SQL beside the code that runs it: `open` (creating,
//! refusing and migrating a file), `enqueue`, `lease` (claim, start, renew and the ending),
//! `reclaim` (lost attempts and their teardown markers), `operator` (cancel and retry), `read`,
//! `runners`, `queue` (limits and pauses stored in the file) and `dependency` (what an ending
//! does to the jobs that run after it); `row` turns rows into records, and `tx` holds what every
//! write shares (the transaction, the savepoint that lets one write of a shared transaction
//! fail alone, the event every transition appends). This file holds [`Store`] itself: opening
//! and closing it, its transaction and its re-exports. Each concern's file holds its own
//! `impl Store` block, the entry points of that concern (each a transaction around the
//! concern's functions), beside the SQL they run.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::store::db::Connection;

#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;

// First: its macro is used by the files below.
#[macro_use]
mod ready;

mod attempts;
mod batch;
mod clock;
mod counter;
pub(crate) mod db;
mod dependency;
mod ending;
mod enqueue;
mod failure;
pub(crate) mod handoff;
pub(crate) mod hosts;
mod leader;
pub(crate) mod lease;
mod lost;
mod maintenance;
mod metrics;
mod open;
mod operator;
mod options;
pub(crate) mod pg;
mod queue;
mod read;
mod reclaim;
mod retention;
mod row;
mod runners;
mod sample;
mod schedule;
mod slice;
mod tx;
pub(crate) mod wake;

#[cfg(feature = "fuzzing")]
pub(crate) use row::fuzz_columns;

/// Test support shared with the runner's unit tests.
#[cfg(test)]
pub(crate) use tx::tests::cap as cap_at_present_size;

pub use crate::metrics::DatabaseSize;
pub use clock::{Clock, ManualClock};
#[cfg(feature = "testing")]
pub(crate) use clock::{register_test_clock, unregister_test_clock};
pub use ending::Ending;
pub use enqueue::Enqueued;
pub use failure::RecentFailure;
pub use lease::{AttemptStart, ClaimRequest, Claimed, Finish, Finished, Renewal};
pub(crate) use lease::{
    claim, finish_attempt, finish_group, finish_started, lock_dependents, lock_running, next_due,
    record_start,
};
pub use lost::{LEASE_EXPIRED_PREFIX, LEASE_MISSING_PREFIX};
pub use maintenance::VacuumReport;
pub use options::{
    DEFAULT_BUSY_TIMEOUT, Durability, MAX_BUSY_TIMEOUT, Migration, OpenOptions, SCHEMA_VERSION,
};
pub use pg::redacted_db;
pub use queue::QueueInfo;
pub use read::{Counts, LeaseCounts, ListFilter};
pub use reclaim::{
    KeptAttempt, KeptVerdict, LostAttempt, ReclaimReport, ReclaimRequest, Reclaimed,
};
pub use retention::{
    DEFAULT_KEEP_CANCELLED, DEFAULT_KEEP_FAILED, DEFAULT_KEEP_SUCCEEDED, DEFAULT_PRUNE_BATCH,
    PruneOptions, PruneReport, Retention, WAL_CHECKPOINT_BYTES,
};
pub use runners::{Namespace, RunnerRecord};
pub use sample::{COARSE_SAMPLES, FINE_SAMPLES, HISTOGRAM_BOUNDS_MS, Sample};
pub use schedule::{FireReport, MAX_SCHEDULE_EVENTS, ScheduleEvent, ScheduleRecord};
pub(crate) use tx::{savepoint, transaction};

/// A lost attempt is reclaimed this many times before its job fails as lost.
pub const DEFAULT_MAX_RECOVERY_ATTEMPTS: u32 = 3;
/// A connection to a leasehold database, with its typed operations.
///
/// ```
/// # fn main() -> leasehold::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// use leasehold::{Job, Status, Store};
///
/// let store = Store::open(dir.path().join("jobs.db"))?;
/// let id = store.enqueue(&Job::shell("echo hello"))?;
/// assert_eq!(store.job(id)?.status, Status::Pending);
/// # Ok(())
/// # }
/// ```
pub struct Store {
    conn: Connection,
    path: PathBuf,
    busy_timeout: Duration,
    migration: Migration,
    /// Wakes the runners on this file after a write that made work ready.
    poker: wake::Poker,
    /// The wake-up socket of the runner this store belongs to, if any: not poked, as that
    /// runner wakes its dispatcher itself.
    own_socket: Option<PathBuf>,
    /// Whether SQLite checkpoints when this, the last connection, closes; if not, the store
    /// keeps the WAL short itself (see [`OpenOptions::checkpoint_on_close`]).
    checkpoint_on_close: bool,
    /// Where the time every method acts at comes from (see [`Clock`]).
    clock: Clock,
}

impl Drop for Store {
    fn drop(&mut self) {
        if !self.checkpoint_on_close {
            if let Some(conn) = self.conn.sqlite() {
                open::trim_wal(conn, &self.path);
            }
        }
    }
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
        let path = path.as_ref();
        if pg::is_url(path) {
            return Store::open_url(path.to_str().unwrap_or_default(), options);
        }
        let clock = Store::clock_for(path, options);
        let opened = open::open(path, options).map_err(crate::Error::full_if_so)?;
        Ok(Store {
            conn: opened.conn.into(),
            path: opened.path,
            busy_timeout: opened.busy_timeout,
            migration: opened.migration,
            poker: wake::Poker::default(),
            own_socket: None,
            checkpoint_on_close: options.checkpoints_on_close(),
            clock,
        })
    }

    /// The clock a store opened on `path` with `options` reads: the options' manual clock;
    /// in a build with the `testing` feature, that of the `leasehold::testing::TestDb`
    /// whose database `path` is, so that an application under test opens its store as in
    /// production; else the system's. Read once, at open.
    fn clock_for(path: &Path, options: &OpenOptions) -> Clock {
        let given = options.clock_source();
        if given.is_manual() {
            return given.clone();
        }
        #[cfg(feature = "testing")]
        if let Some(clock) = clock::registered_clock(path) {
            return clock;
        }
        let _ = path;
        given.clone()
    }

    /// The clock this store reads the time from: the system's, unless it was opened with a
    /// [`ManualClock`]'s ([`OpenOptions::clock`]).
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The time on this store's clock, in milliseconds since the Unix epoch.
    pub(crate) fn now(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Opens the PostgreSQL database at `url`.
    #[cfg(feature = "postgres")]
    fn open_url(url: &str, options: &OpenOptions) -> Result<Store> {
        let clock = Store::clock_for(Path::new(url), options);
        let options = &options.clone().clock(clock.clone());
        let (conn, migration) = pg::open(url, options)?;
        Ok(Store {
            conn,
            path: pg::redacted(url).into(),
            busy_timeout: options.busy_timeout,
            migration,
            poker: wake::Poker::default(),
            own_socket: None,
            checkpoint_on_close: true,
            clock,
        })
    }

    /// A URL in a build without the PostgreSQL backend: [`Error::NoPostgres`].
    #[cfg(not(feature = "postgres"))]
    fn open_url(url: &str, _: &OpenOptions) -> Result<Store> {
        pg::open(url).map(|never| match never {})
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
        if pg::is_url(path) {
            let url = path.to_str().unwrap_or_default();
            #[cfg(feature = "postgres")]
            return pg::probe_version(url);
            #[cfg(not(feature = "postgres"))]
            return pg::open(url).map(|never| match never {});
        }
        open::probe_version(path)
    }

    /// SQLite's integrity check of the file at `path` (`PRAGMA integrity_check`, or with
    /// `quick` the cheaper `quick_check`, which skips the indexes' agreement with their
    /// tables), read-only: what `leasehold db check` reports. `["ok"]` when it found nothing;
    /// else what it found, a line each (at most 100). A file so damaged that the check
    /// cannot start gets SQLite's error as its one line.
    ///
    /// # Errors
    ///
    /// [`Error::Missing`], [`Error::NotADatabase`], [`Error::SqliteOnly`] on PostgreSQL (the
    /// server keeps its own pages), or [`Error::Sqlite`].
    pub fn check(path: impl AsRef<Path>, quick: bool) -> Result<Vec<String>> {
        let path = path.as_ref();
        if pg::is_url(path) {
            return Err(crate::Error::SqliteOnly("db check"));
        }
        open::check(path, quick)
    }

    /// Refuses a damaged file before a runner writes to it: SQLite's quick check reads
    /// every page of the file (about as long as reading it), so that nothing is written to a
    /// file that cannot be read back. Nothing to do on PostgreSQL.
    ///
    /// # Errors
    ///
    /// [`Error::Damaged`](crate::Error::Damaged) with the check's first finding.
    pub(crate) fn refuse_if_damaged(&self) -> Result<()> {
        let Some(conn) = self.conn().sqlite() else {
            return Ok(());
        };
        let first: String = conn.query_row("PRAGMA quick_check(1)", [], |r| r.get(0))?;
        if first == "ok" {
            Ok(())
        } else {
            Err(crate::Error::Damaged { reason: first })
        }
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
        match self.conn.sqlite() {
            Some(conn) => open::schema_version(conn),
            #[cfg(feature = "postgres")]
            None => pg::schema_version(&self.conn),
            #[cfg(not(feature = "postgres"))]
            None => Err(crate::Error::SqliteOnly("reading the schema version")),
        }
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
        let Some(conn) = self.conn.sqlite() else {
            return;
        };
        if let Err(e) = conn.busy_timeout(timeout) {
            log::warn!("cannot set the busy timeout: {e}");
        }
    }

    /// Marks `socket` as the wake-up socket of the runner this store belongs to.
    pub(crate) fn set_own_socket(&mut self, socket: Option<PathBuf>) {
        self.own_socket = socket;
    }

    pub(crate) fn conn(&self) -> &Connection {
        &self.conn
    }
}

#[cfg(test)]
mod statements;
#[cfg(test)]
mod tests;
