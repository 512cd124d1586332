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
//! does to the jobs that run after it); `row` turns rows into records, and `tx` holds what every write shares (the
//! transaction, the savepoint that lets one write of a shared transaction fail alone, the
//! event every transition appends). This file holds [`Store`], whose methods open a
//! transaction and call into those files; the files import `tx` and `row` and each other
//! downward, never this file, so there is no import circle.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::store::db::Connection;

#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::job::{Event, Job, JobRecord, Output};
use crate::metrics::Metrics;
use crate::schedule::Schedule;

// First: its macro is used by the files below.
#[macro_use]
mod ready;

mod attempts;
mod batch;
mod clock;
mod counter;
pub(crate) mod db;
mod dependency;
mod enqueue;
mod failure;
pub(crate) mod handoff;
pub(crate) mod hosts;
mod leader;
pub(crate) mod lease;
mod maintenance;
mod metrics;
mod open;
mod operator;
pub(crate) mod pg;
mod queue;
mod read;
mod reclaim;
mod retention;
mod row;
mod runners;
mod sample;
mod schedule;
mod tx;
pub(crate) mod wake;

/// Test support shared with the runner's unit tests.
#[cfg(test)]
pub(crate) use tx::tests::cap as cap_at_present_size;

pub use crate::metrics::DatabaseSize;
pub use clock::{Clock, ManualClock};
pub use enqueue::Enqueued;
pub use failure::RecentFailure;
pub use lease::{AttemptStart, ClaimRequest, Claimed, Ending, Finish, Finished, Renewal};
pub(crate) use lease::{
    claim, finish_attempt, finish_group, finish_started, lock_dependents, lock_running, next_due,
    record_start,
};
pub use maintenance::VacuumReport;
pub use open::{
    DEFAULT_BUSY_TIMEOUT, Durability, MAX_BUSY_TIMEOUT, Migration, OpenOptions, SCHEMA_VERSION,
};
pub use pg::redacted_db;
pub use queue::QueueInfo;
pub use read::{Counts, LeaseCounts, ListFilter};
pub use reclaim::{
    KeptAttempt, KeptVerdict, LostAttempt, ReclaimReport, ReclaimRequest, Reclaimed,
};
pub use reclaim::{LEASE_EXPIRED_PREFIX, LEASE_MISSING_PREFIX};
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
        if let Some(clock) = crate::testing::registered_clock(path) {
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

    /// The database's size on disk: the main file, its free pages and its WAL.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the file cannot be read, [`Error::Io`] when its size cannot.
    pub fn size(&self) -> Result<DatabaseSize> {
        metrics::size(&self.conn, &self.path)
    }

    /// Compacts the whole file with a full `VACUUM`, then checkpoints the WAL so that the main
    /// file shrinks now. A VACUUM rewrites the file: its folder needs free space of about the
    /// file's size plus its WAL's, which is checked first. It holds the database's write lock
    /// for as long as it runs, which no runner's renewal can wait out on a large file: it is
    /// refused while a runner is live on the file (registered, not stopped, and its last
    /// heartbeat within its lease TTL). [`Store::vacuum_forced`] goes ahead anyway.
    ///
    /// # Errors
    ///
    /// [`Error::RunnerLive`] naming a live runner (the file is unchanged), [`Error::NoSpace`]
    /// when the folder has too little free space (the file is unchanged), [`Error::Busy`]
    /// when another connection held the database for longer than the busy timeout,
    /// [`Error::Sqlite`] or [`Error::Io`] otherwise.
    pub fn vacuum(&self) -> Result<VacuumReport> {
        maintenance::vacuum(
            self.conn.sqlite_only("vacuum")?,
            &self.path,
            self.busy_timeout,
            false,
            self.now(),
        )
    }

    /// [`Store::vacuum`] even beside a live runner, whose attempts may then be killed when it
    /// cannot renew their leases in time (`on_lost = fail` jobs fail for good).
    ///
    /// # Errors
    ///
    /// As [`Store::vacuum`], but never [`Error::RunnerLive`].
    pub fn vacuum_forced(&self) -> Result<VacuumReport> {
        maintenance::vacuum(
            self.conn.sqlite_only("vacuum")?,
            &self.path,
            self.busy_timeout,
            true,
            self.now(),
        )
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

    /// Wakes every runner on this database (but this store's own) at once, best-effort: after
    /// a commit that made a job ready. A runner that misses it finds the job on its next poll.
    ///
    /// On SQLite through the sockets beside the file; on PostgreSQL by `NOTIFY`, which reaches
    /// the runners of every host (this one's too: its runners listen rather than bind
    /// sockets for pokes).
    pub(crate) fn poke(&self) {
        self.announce("jobs");
    }

    /// [`Store::poke`] after a schedule was put or resumed: runners' schedule firers read the
    /// schedules again (on SQLite every poke wakes them).
    pub(crate) fn poke_firers(&self) {
        self.announce("schedules");
    }

    fn announce(&self, what: &str) {
        if self.conn.sqlite().is_some() {
            self.poker
                .poke(&wake::folder(&self.path), self.own_socket.as_deref());
        } else if let Err(e) = self.conn.announce(what) {
            log::debug!("cannot announce {what} to the runners (they find it on their poll): {e}");
        }
    }

    /// Marks `socket` as the wake-up socket of the runner this store belongs to.
    pub(crate) fn set_own_socket(&mut self, socket: Option<PathBuf>) {
        self.own_socket = socket;
    }

    pub(crate) fn conn(&self) -> &Connection {
        &self.conn
    }

    /// Enqueues one job; returns its id. A job whose [`Job::unique_key`] matches an existing
    /// job creates nothing and returns that job's id ([`Store::enqueue_unique`] also says so).
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] for a job that cannot run (an empty command, zero attempts, a bad
    /// variable name), and [`Error::Sqlite`] when the database cannot be written.
    pub fn enqueue(&self, job: &Job) -> Result<i64> {
        self.enqueue_at(job, self.now())
    }

    /// [`Store::enqueue`] at `now` rather than the store's clock: for a test of a boundary in
    /// time that passes each time rather than moving a [`ManualClock`].
    ///
    /// # Errors
    ///
    /// As [`Store::enqueue`].
    pub fn enqueue_at(&self, job: &Job, now: i64) -> Result<i64> {
        job.validate_at(now)?;
        let id = self.write(|c| enqueue::insert_job(c, job, now))?;
        self.poke();
        Ok(id)
    }

    /// Enqueues one job and says whether it was a duplicate: a job with a
    /// [`Job::unique_key`] that matches a pending or running job of that key (or, with a
    /// [`Job::unique_window`], any job of that key created within the window) creates nothing
    /// and returns that job's id. The check and the insert are one IMMEDIATE transaction, so
    /// concurrent enqueues from any number of threads and processes create one job.
    /// [`Store::enqueue`] does the same and returns only the id.
    ///
    /// # Errors
    ///
    /// As [`Store::enqueue`].
    pub fn enqueue_unique(&self, job: &Job) -> Result<Enqueued> {
        self.enqueue_unique_at(job, self.now())
    }

    /// [`Store::enqueue_unique`] at `now` rather than the store's clock.
    ///
    /// # Errors
    ///
    /// As [`Store::enqueue`].
    pub fn enqueue_unique_at(&self, job: &Job, now: i64) -> Result<Enqueued> {
        job.validate_at(now)?;
        let enqueued = self.write(|c| enqueue::enqueue(c, job, now, None))?;
        if !enqueued.duplicate {
            self.poke();
        }
        Ok(enqueued)
    }

    /// Enqueues one job, at the time on `options`' clock, into the database at `path` from a process that does not
    /// keep it open: a command, a script, a second program. When a runner is running on the
    /// file, the job is handed to it over its wake-up socket, and the runner stores it with a
    /// durable (FULL) commit of its own connection and answers with the id: this process
    /// opens no SQLite connection, and the job is on disk when this returns. Otherwise, or
    /// when the runner declines or does not answer within 3 s, this opens the file with
    /// `options` and enqueues the job itself, once: a runner that stored it before it stopped
    /// answering is found by the request's token (see docs/cross-process.md, *A `jobs add`
    /// handed to a running runner*). Returns what [`Store::enqueue_unique`] would.
    ///
    /// # Errors
    ///
    /// As [`Store::open_with`] and [`Store::enqueue_unique`]; a job the store refuses is
    /// refused the same way, whichever path it took.
    pub fn hand_off(path: impl AsRef<Path>, options: &OpenOptions, job: &Job) -> Result<Enqueued> {
        let path = path.as_ref();
        let now = Store::clock_for(path, options).now_ms();
        job.validate_at(now)?;
        match handoff::hand_off(path, job, now) {
            handoff::HandOff::Stored(done) => Ok(done),
            handoff::HandOff::NotSent | handoff::HandOff::Declined => {
                Store::open_with(path, options)?.enqueue_unique_at(job, now)
            }
            handoff::HandOff::Unanswered(token) => {
                let store = Store::open_with(path, options)?;
                // Without a deadline, the token's job is found or enqueued: never None.
                let (done, new) =
                    store
                        .enqueue_handed(job, &token, None, now)?
                        .ok_or_else(|| {
                            crate::error::Error::invalid("deadline", "a handed job was refused")
                        })?;
                if new {
                    store.poke();
                }
                Ok(done)
            }
        }
    }

    /// Enqueues a job that a command handed to a runner under `token` (see
    /// [`handoff`](self::handoff)), once: the job the token names when a transaction already
    /// stored it, else the job enqueued now, with its token. `None`, with nothing enqueued,
    /// when `deadline` (the runner's, for a request) has passed at `now` or at the clock read
    /// once the transaction holds the write lock; the command, which
    /// stores the job itself when the runner did not answer, passes none.
    ///
    /// # Errors
    ///
    /// As [`Store::enqueue`].
    ///
    /// The bool says whether this call enqueued the job. Unlike [`Store::enqueue`], this wakes
    /// no runner: the caller pokes ([`Store::poke`]) once it has answered whoever waits.
    pub(crate) fn enqueue_handed(
        &self,
        job: &Job,
        token: &str,
        deadline: Option<i64>,
        now: i64,
    ) -> Result<Option<(Enqueued, bool)>> {
        job.validate_at(now)?;
        self.write(|c| handoff::enqueue(c, job, token, deadline, now))
    }

    /// Enqueues many jobs, all or none. Returns their ids in order, once every job is ready to
    /// be claimed.
    ///
    /// The jobs are written in transactions that hold the write lock for about 50 ms each,
    /// never for the whole list, so that runners on the file keep renewing their leases. Until
    /// the last of them commits, the jobs written so far exist but wait (pending, never
    /// claimed, and no job can be enqueued after them); when a write fails, or this process
    /// dies or stalls for 60 s between two of them, they are deleted, by this call
    /// or by the next runner's sweep. See *Bulk enqueue* in docs/commands.md.
    ///
    /// # Errors
    ///
    /// As [`Store::enqueue`]; nothing is kept when any job is invalid or refused, or when the
    /// database cannot be written.
    pub fn enqueue_many(&self, jobs: &[Job]) -> Result<Vec<i64>> {
        self.enqueue_many_at(jobs, self.now())
    }

    /// [`Store::enqueue_many`] at `now` rather than the store's clock.
    ///
    /// # Errors
    ///
    /// As [`Store::enqueue_many`].
    pub fn enqueue_many_at(&self, jobs: &[Job], now: i64) -> Result<Vec<i64>> {
        self.enqueue_many_with_progress_at(jobs, now, &mut |_| {})
    }

    /// [`Store::enqueue_many`], telling `progress` how many jobs are in so far (after every
    /// transaction), for a progress bar. Still all or none: a count told before a failure is
    /// not kept.
    ///
    /// # Errors
    ///
    /// As [`Store::enqueue_many`].
    pub fn enqueue_many_with_progress(
        &self,
        jobs: &[Job],
        progress: &mut dyn FnMut(usize),
    ) -> Result<Vec<i64>> {
        self.enqueue_many_with_progress_at(jobs, self.now(), progress)
    }

    fn enqueue_many_with_progress_at(
        &self,
        jobs: &[Job],
        now: i64,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Vec<i64>> {
        for job in jobs {
            job.validate_at(now)?;
        }
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let batch = self.write(|c| batch::open(c, self.now()))?;
        let mut ids = Vec::with_capacity(jobs.len());
        let written = (|| {
            while ids.len() < jobs.len() {
                let started = Instant::now();
                let rest = &jobs[ids.len()..];
                let slice = self.write(|c| batch::insert_slice(c, batch, rest, now, self.now()))?;
                ids.extend(slice);
                progress(ids.len());
                retention::yield_lock(started.elapsed());
            }
            self.write(|c| batch::commit(c, batch))
        })();
        if let Err(e) = written {
            // Best-effort: a batch left open is abandoned at its expiry, and every tidy
            // deletes an abandoned batch's jobs.
            if self.write(|c| batch::abandon(c, batch)).is_ok() {
                let _ = self.tidy_batches(Some(batch), None);
            }
            return Err(e);
        }
        self.tidy_batches(Some(batch), None)?;
        self.poke();
        Ok(ids)
    }

    /// Continues the fan-outs that endings left as cascades (see [`dependency`]): a success's
    /// dependents counted down, a failure's cancelled, down the chain, in slices that each
    /// hold the write lock for a few tens of milliseconds, until none is left or `deadline`.
    /// Returns whether it did anything. Cheap when there is none: one read.
    pub(crate) fn continue_cascades(&self, now: i64, deadline: Option<Instant>) -> Result<bool> {
        let mut did = false;
        while dependency::has_cascades(&self.conn)? {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
            let started = Instant::now();
            did = true;
            if !self.write(|c| dependency::continue_cascades(c, now))? {
                break;
            }
            retention::yield_lock(started.elapsed());
        }
        if did {
            // A success's dependents may be ready now.
            self.poke();
        }
        Ok(did)
    }

    /// Finishes bulk enqueues ([`Store::enqueue_many`]) left behind, batch `only` or all, in
    /// slices that each hold the write lock about 50 ms: lifts the gates of committed ones, and
    /// deletes the jobs of abandoned ones (those whose process failed, or died or stalled for
    /// 60 s). Runners call it from their sweeps, with a `deadline` past which it
    /// starts no slice. Returns the gates lifted and the jobs deleted.
    pub(crate) fn tidy_batches(
        &self,
        only: Option<i64>,
        deadline: Option<Instant>,
    ) -> Result<(u64, u64)> {
        let (mut released, mut deleted) = (0, 0);
        loop {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok((released, deleted));
            }
            let started = Instant::now();
            let done = self.write(|c| batch::tidy(c, only, self.now()))?;
            released += done.released;
            deleted += done.deleted;
            if !done.more {
                return Ok((released, deleted));
            }
            retention::yield_lock(started.elapsed());
        }
    }

    /// Stores a new schedule under `name`; its first slot is the first after `now` (an
    /// interval counts from `now`). Returns it as stored.
    ///
    /// # Errors
    ///
    /// [`Error::ScheduleExists`] when the name is taken (see [`Store::replace_schedule`]);
    /// [`Error::Invalid`] naming `name`, `tz`, `every` or the job's setting for an empty
    /// name, an unknown zone, an interval under a second or a job that cannot run. Nothing
    /// is written then.
    pub fn put_schedule(&self, name: &str, schedule: &Schedule) -> Result<ScheduleRecord> {
        self.put_schedule_at(name, schedule, self.now())
    }

    /// [`Store::put_schedule`] at `now` rather than the store's clock.
    ///
    /// # Errors
    ///
    /// As [`Store::put_schedule`].
    pub fn put_schedule_at(
        &self,
        name: &str,
        schedule: &Schedule,
        now: i64,
    ) -> Result<ScheduleRecord> {
        self.store_schedule(name, schedule, false, now)
    }

    /// Stores a schedule under `name`, replacing one of that name if there is one (its
    /// history, pause and last slot stay; its next slot is the first after `now`).
    ///
    /// # Errors
    ///
    /// As [`Store::put_schedule`], without [`Error::ScheduleExists`].
    pub fn replace_schedule(&self, name: &str, schedule: &Schedule) -> Result<ScheduleRecord> {
        self.store_schedule(name, schedule, true, self.now())
    }

    /// [`Store::put_schedule`], or with `replace` [`Store::replace_schedule`].
    fn store_schedule(
        &self,
        name: &str,
        schedule: &Schedule,
        replace: bool,
        now: i64,
    ) -> Result<ScheduleRecord> {
        schedule::check_name(name)?;
        schedule.validate(now)?;
        let record = self.write(|c| schedule::put(c, name, schedule, replace, now))?;
        // Wakes the firers of the runners on this database: the new schedule may be due first.
        self.poke_firers();
        Ok(record)
    }

    /// Removes a schedule and its history; the jobs it enqueued stay.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchSchedule`].
    pub fn remove_schedule(&self, name: &str) -> Result<()> {
        self.write(|c| schedule::remove(c, name))
    }

    /// Pauses a schedule: no slot fires until it is resumed.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchSchedule`].
    pub fn pause_schedule(&self, name: &str) -> Result<ScheduleRecord> {
        let now = self.now();
        self.write(|c| schedule::set_paused(c, name, true, now))
    }

    /// Resumes a paused schedule at its next slot after `now`: slots that passed while it was
    /// paused are not caught up.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchSchedule`].
    pub fn resume_schedule(&self, name: &str) -> Result<ScheduleRecord> {
        let now = self.now();
        let record = self.write(|c| schedule::set_paused(c, name, false, now))?;
        self.poke_firers();
        Ok(record)
    }

    /// One schedule.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchSchedule`].
    pub fn schedule(&self, name: &str) -> Result<ScheduleRecord> {
        schedule::get(&self.conn, name)
    }

    /// Every schedule, by name.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn schedules(&self) -> Result<Vec<ScheduleRecord>> {
        schedule::list(&self.conn)
    }

    /// The next `count` slots of a schedule strictly after `after`.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchSchedule`].
    pub fn next_slots(&self, name: &str, after: i64, count: usize) -> Result<Vec<i64>> {
        schedule::get(&self.conn, name)?
            .schedule
            .slots_after(after, count)
    }

    /// A schedule's history of missed and skipped slots, oldest first.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn schedule_events(&self, name: &str) -> Result<Vec<ScheduleEvent>> {
        schedule::events(&self.conn, name)
    }

    /// Fires every slot due on the store's clock: see [`Store::fire_due_at`].
    ///
    /// # Errors
    ///
    /// As [`Store::fire_due_at`].
    pub fn fire_due(&self) -> Result<FireReport> {
        self.fire_due_at(self.now())
    }

    /// Fires every slot due at `now`: per schedule, one IMMEDIATE transaction enqueues the
    /// slot's job (or what the catch-up and overlap policies say) and moves the schedule past
    /// `now`, so two processes never fire a slot twice and a crash never loses one.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written, or a schedule's row cannot be
    /// read; the other schedules are fired all the same, and what was fired stays fired.
    pub fn fire_due_at(&self, now: i64) -> Result<FireReport> {
        let mut report = FireReport::default();
        // One schedule that cannot be fired (a damaged row) does not hold the others back.
        let mut failed = None;
        for name in schedule::due(&self.conn, now)? {
            match self.write(|c| schedule::fire(c, &name, now)) {
                Ok(r) => {
                    report.enqueued += r.enqueued;
                    report.missed += r.missed;
                    report.skipped += r.skipped;
                }
                Err(e) => {
                    log::warn!("schedule {name:?}: cannot fire its due slots: {e:#}");
                    failed.get_or_insert(e);
                }
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        if report.enqueued > 0 {
            self.poke();
        }
        report.next_due = schedule::next_due(&self.conn)?;
        Ok(report)
    }

    /// Claims up to `limit` ready jobs for `worker_id`, taking a lease of `lease_ttl` on each.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written.
    pub fn claim(&self, req: &ClaimRequest<'_>, now: i64) -> Result<Vec<Claimed>> {
        self.write(|c| lease::claim(c, req, now))
    }

    /// Records the process an attempt started, if the caller still holds the attempt's lease.
    /// Returns false (and changes nothing) when it does not.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written.
    pub fn record_start(&self, start: &AttemptStart, now: i64) -> Result<bool> {
        self.write(|c| lease::record_start(c, start, now))
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
        self.write(|c| lease::renew(c, worker_id, tokens, lease_ttl, now))
    }

    /// Records how an attempt ended, fenced by its run token.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written.
    pub fn finish(&self, finish: &Finish, now: i64) -> Result<Finished> {
        let finished = self.write(|c| lease::finish_attempt(c, finish, now))?;
        self.continue_cascades(now, None)?;
        Ok(finished)
    }

    /// Records several attempts' endings in one transaction, as a runner's writer does, in
    /// the order given; each is fenced by its run token as [`Store::finish`] is. Returns what
    /// each did, in the same order. Nothing is recorded when one of them cannot be written.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written.
    pub fn finish_many(&self, finishes: &[Finish], now: i64) -> Result<Vec<Finished>> {
        let finished = self.write(|c| lease::finish_many(c, finishes, now))?;
        self.continue_cascades(now, None)?;
        Ok(finished)
    }

    /// Reclaims lost attempts: expired leases, running jobs without lease metadata, and the
    /// running jobs of runners known to be dead.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written.
    pub fn reclaim(&self, req: &ReclaimRequest<'_>, now: i64) -> Result<ReclaimReport> {
        let report = self.write(|c| reclaim::reclaim(c, req, now))?;
        self.continue_cascades(now, None)?;
        Ok(report)
    }

    /// Cancels a job: a pending one at once; a running one by revoking its lease, so that its
    /// runner stops the attempt. Returns the job as it now is.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchJob`], and [`Error::WrongState`] for a job that already ended.
    pub fn cancel(&self, id: i64) -> Result<JobRecord> {
        self.cancel_at(id, self.now())
    }

    /// [`Store::cancel`] at `now` rather than the store's clock.
    ///
    /// # Errors
    ///
    /// As [`Store::cancel`].
    pub fn cancel_at(&self, id: i64, now: i64) -> Result<JobRecord> {
        let job = self.write(|c| operator::cancel(c, id, now))?;
        // The jobs after it, when more than one transaction's worth: cancelled by now.
        self.continue_cascades(now, None)?;
        Ok(job)
    }

    /// An operator's retry of one job: failed and cancelled jobs, and running jobs whose lease
    /// is missing or expired, go back to pending with their counters reset.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchJob`], and [`Error::WrongState`] for a pending, succeeded or live
    /// running job, with the reason.
    pub fn retry(&self, id: i64, reason: Option<&str>) -> Result<JobRecord> {
        self.retry_at(id, reason, self.now())
    }

    /// [`Store::retry`] at `now` rather than the store's clock.
    ///
    /// # Errors
    ///
    /// As [`Store::retry`].
    pub fn retry_at(&self, id: i64, reason: Option<&str>, now: i64) -> Result<JobRecord> {
        let job = self.write(|c| operator::retry(c, id, reason, now))?;
        self.poke();
        Ok(job)
    }

    /// An operator's retry of the failed jobs that exhausted the recovery budget: `limit` of
    /// them, most recently failed first, or all when `limit` is None. Returns the ids retried.
    ///
    /// The jobs are retried in transactions that hold the write lock for about 50 ms each, so
    /// that runners on the file keep renewing their leases; each job's retry is whole. A job
    /// that another operator retried meanwhile is passed over.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written; the jobs retried before the
    /// failure stay retried.
    pub fn retry_failed_stale(
        &self,
        limit: Option<u64>,
        max_recovery_attempts: u32,
        reason: Option<&str>,
    ) -> Result<Vec<i64>> {
        let now = self.now();
        let ids = operator::failed_stale(&self.conn, limit, max_recovery_attempts)?;
        let mut retried = Vec::with_capacity(ids.len());
        let mut done = 0;
        while done < ids.len() {
            let started = Instant::now();
            let (seen, slice) =
                self.write(|c| operator::retry_slice(c, &ids[done..], reason, now))?;
            done += seen;
            retried.extend(slice);
            if !retried.is_empty() {
                // The first ones can run now.
                self.poke();
            }
            retention::yield_lock(started.elapsed());
        }
        Ok(retried)
    }

    /// Lost attempts whose processes still have to be torn down.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn pending_teardowns(&self, limit: u64) -> Result<Vec<LostAttempt>> {
        reclaim::pending_teardowns(&self.conn, 0, limit, self.now())
    }

    /// As [`Store::pending_teardowns`], of jobs whose id is above `after`: the next page.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn pending_teardowns_after(&self, after: i64, limit: u64) -> Result<Vec<LostAttempt>> {
        reclaim::pending_teardowns(&self.conn, after, limit, self.now())
    }

    /// Job `id`'s lost attempt still to be torn down, if it has one, with its runner's
    /// namespace: what `jobs inspect` and the dashboard show of a job that waits.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn teardown_of(&self, id: i64) -> Result<Option<LostAttempt>> {
        reclaim::teardown_of(&self.conn, id, self.now())
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
        let recorded = self.write(|c| reclaim::record_teardown(c, job_id, token, detail, now))?;
        if recorded {
            // The job can be claimed again.
            self.poke();
        }
        Ok(recorded)
    }

    /// One job.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchJob`].
    pub fn job(&self, id: i64) -> Result<JobRecord> {
        read::job(&self.conn, id)
    }

    /// Jobs matching `filter`, newest first.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn list(&self, filter: &ListFilter) -> Result<Vec<JobRecord>> {
        read::list(&self.conn, filter)
    }

    /// A job's history, oldest first.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn events(&self, id: i64) -> Result<Vec<Event>> {
        read::events(&self.conn, id)
    }

    /// Events after `after_id` whose kind ends a job (succeeded, failed, lost, cancelled),
    /// oldest first, at most `limit`.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn endings_after(&self, after_id: i64, limit: u64) -> Result<Vec<Event>> {
        read::endings_after(&self.conn, after_id, limit)
    }

    /// The id of the newest event, or 0.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn last_event_id(&self) -> Result<i64> {
        read::last_event_id(&self.conn)
    }

    /// The captured output of one attempt of a job, or of its latest attempt.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn output(&self, id: i64, attempt: Option<i64>) -> Result<Option<Output>> {
        read::output(&self.conn, id, attempt)
    }

    /// How many jobs are in each status.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn counts(&self) -> Result<Counts> {
        read::counts(&self.conn)
    }

    /// A snapshot of the database's metrics at the store's clock: see [`Store::metrics_at`].
    ///
    /// # Errors
    ///
    /// As [`Store::metrics_at`].
    pub fn metrics(&self) -> Result<Metrics> {
        self.metrics_at(self.now())
    }

    /// A snapshot of the database's metrics at `now` (the time queue lags and runner liveness
    /// are measured against): jobs by queue and status, queue lags, the durable counters and
    /// histograms, live runners, the file's size. Read in one read transaction: it never takes
    /// the write lock, and its cost does not grow with the number of jobs. Render it with
    /// [`Metrics::to_prometheus`].
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read, [`Error::Io`] when the file's size
    /// cannot.
    pub fn metrics_at(&self, now: i64) -> Result<Metrics> {
        metrics::metrics(&self.conn, &self.path, now)
    }

    /// The runbook's lease counters at `now`.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn lease_counts(&self, max_recovery_attempts: u32, now: i64) -> Result<LeaseCounts> {
        read::lease_counts(&self.conn, max_recovery_attempts, now)
    }

    /// Registers a runner process.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written.
    pub(crate) fn register_runner(&self, runner: &RunnerRecord) -> Result<()> {
        self.write(|c| runners::register(c, runner))
    }

    /// Records a runner's clean shutdown.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written.
    pub(crate) fn stop_runner(&self, worker_id: &str, now: i64) -> Result<()> {
        self.write(|c| runners::stop(c, worker_id, now))
    }

    /// The runners that have not shut down cleanly, oldest first, and the most recently
    /// started runner of all (whose settings `status` reports).
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn runners(&self) -> Result<Vec<RunnerRecord>> {
        runners::unstopped(&self.conn)
    }

    /// The runners recorded as stopped that still hold running jobs: a runner that left its
    /// attempts to their keepers at shutdown, or could not record their endings. They renew
    /// nothing, so their jobs are adopted, recovered or reclaimed at once.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn stopped_runners_holding_jobs(&self) -> Result<Vec<String>> {
        runners::stopped_holding_jobs(&self.conn)
    }

    /// The most recently started runner, stopped or not.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn latest_runner(&self) -> Result<Option<RunnerRecord>> {
        runners::latest(&self.conn)
    }

    /// Marks a runner that is provably dead as stopped, so it is not examined again.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written.
    pub(crate) fn mark_runner_dead(&self, worker_id: &str, now: i64) -> Result<()> {
        self.write(|c| runners::mark_dead(c, worker_id, now))
    }

    /// Prunes every finished job past `policy` at the store's clock, with its events and output, in
    /// transactions of [`DEFAULT_PRUNE_BATCH`] jobs; then gives the freed pages back to the file
    /// system (on a file with `auto_vacuum = INCREMENTAL`) and truncates a WAL past
    /// [`WAL_CHECKPOINT_BYTES`]. Pending, running and teardown-marked jobs are never pruned.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written; the batches committed before
    /// stay pruned.
    pub fn prune(&self, policy: &Retention) -> Result<PruneReport> {
        self.prune_with(policy, &PruneOptions::default())
    }

    /// Takes or renews the lead of the maintenance `role` (`"prune"`) for the runner
    /// `holder` for `ttl`, unless another holds it unexpired; returns whether `holder` leads.
    /// On PostgreSQL, runners on many hosts share one database: the one that leads does the
    /// role's work, and another takes over once a lead is not renewed in time (its runner
    /// died or was cut off). The work stays safe if two do it (a lead taken over while its
    /// holder still runs). On SQLite always `true`.
    ///
    /// # Errors
    ///
    /// A database error.
    pub fn lead(&self, role: &str, holder: &str, ttl: Duration, now: i64) -> Result<bool> {
        let ttl = crate::job::duration_ms(ttl);
        self.write(|c| leader::lead(c, role, holder, ttl, now))
    }

    /// [`Store::prune`] with a batch size, a limit on batches, or as a dry run that only
    /// counts.
    ///
    /// # Errors
    ///
    /// As [`Store::prune`].
    pub fn prune_with(&self, policy: &Retention, options: &PruneOptions) -> Result<PruneReport> {
        self.prune_at(policy, options, self.now())
    }

    /// [`Store::prune_with`] at `now` rather than the store's clock: for a runner's sweeper,
    /// which reads the time once for a sweep.
    ///
    /// # Errors
    ///
    /// As [`Store::prune`].
    pub fn prune_at(
        &self,
        policy: &Retention,
        options: &PruneOptions,
        now: i64,
    ) -> Result<PruneReport> {
        let mut report = PruneReport {
            dry_run: options.is_dry_run(),
            ..PruneReport::default()
        };
        if options.is_dry_run() {
            report.jobs = retention::count_due(&self.conn, policy, now)?;
            return Ok(report);
        }
        if policy.prunes() {
            let bounds = retention::bounds(&self.conn, policy, now)?;
            while !bounds.is_empty() {
                if options
                    .batch_limit()
                    .is_some_and(|max| report.batches >= u64::from(max))
                    || options.past_deadline()
                {
                    report.more = true;
                    break;
                }
                let started = Instant::now();
                let (jobs, events, outputs) =
                    self.write(|c| retention::delete_batch(c, &bounds, options.batch_size()))?;
                retention::yield_lock(started.elapsed());
                report.batches += 1;
                report.jobs += jobs;
                report.events += events;
                report.outputs += outputs;
                if jobs < u64::from(options.batch_size()) {
                    break;
                }
            }
        }
        // Also when nothing was pruned: a bounded prune may have left free pages behind.
        if let Some(conn) = self.conn.sqlite() {
            report.bytes_freed = retention::incremental_vacuum(conn, options)?;
            // Never wait for another connection here: a checkpoint that finds one busy gives
            // up, and the next prune tries again.
            conn.busy_timeout(Duration::ZERO)?;
            let truncated = retention::checkpoint_if_large(conn, &self.path);
            conn.busy_timeout(self.busy_timeout)?;
            report.wal_truncated = truncated?;
        }
        Ok(report)
    }

    /// Limits `queue` to `limit` running jobs at once, over every runner and process on this
    /// file; `None` removes the limit. A claim counts the queue's running jobs and takes new
    /// ones in one transaction, so runners never exceed the limit together. Lowering a limit
    /// stops nothing that runs: new claims wait until the queue is under it.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] for an empty name, [`Error::Sqlite`] when the database cannot be
    /// written.
    pub fn set_queue_limit(&self, queue: &str, limit: Option<u32>) -> Result<()> {
        self.write(|c| queue::set_limit(c, queue, limit))?;
        // A raised or removed limit can make jobs claimable.
        self.poke();
        Ok(())
    }

    /// Pauses `queue` for every runner on this file: its pending jobs are not claimed until
    /// [`Store::resume_queue`]; its running jobs finish normally.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] for an empty name, [`Error::Sqlite`] when the database cannot be
    /// written.
    pub fn pause_queue(&self, queue: &str) -> Result<()> {
        self.write(|c| queue::set_paused(c, queue, true))
    }

    /// Resumes a paused `queue`; resuming one that is not paused does nothing.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] for an empty name, [`Error::Sqlite`] when the database cannot be
    /// written.
    pub fn resume_queue(&self, queue: &str) -> Result<()> {
        self.write(|c| queue::set_paused(c, queue, false))?;
        self.poke();
        Ok(())
    }

    /// Every queue that has an unfinished job, a limit or a pause, by name, with its counts at
    /// the store's clock.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn queues(&self) -> Result<Vec<QueueInfo>> {
        queue::list(&self.conn, self.now(), false)
    }

    /// Every queue that has any job (finished ones included), a limit or a pause, by name,
    /// with its counts at the store's clock: what the dashboard's overview lists. As cheap as
    /// [`queues`](Store::queues): the counts come from the counters the transitions keep.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn all_queues(&self) -> Result<Vec<QueueInfo>> {
        queue::list(&self.conn, self.now(), true)
    }

    /// The newest `limit` failed or lost attempts, newest first: what the dashboard lists as
    /// recent failures. Reads the tail of an index of failure events (schema version 12),
    /// whatever the number of events. Pruning a job removes its failures with it.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn recent_failures(&self, limit: u32) -> Result<Vec<RecentFailure>> {
        failure::recent(&self.conn, limit)
    }

    /// The samples of the counters and gauges that runners took for the dashboard's charts,
    /// oldest first: at most [`FINE_SAMPLES`] plus [`COARSE_SAMPLES`] rows.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn samples(&self) -> Result<Vec<Sample>> {
        sample::all(&self.conn)
    }

    /// Takes a sample at `now` unless one was taken in the same interval of `interval_ms`;
    /// returns whether it wrote one. A runner's sweeper calls it.
    pub(crate) fn take_sample(&self, now: i64, interval_ms: i64) -> Result<bool> {
        sample::take(self, now, interval_ms)
    }

    /// Whether any job of `queues` (all queues when empty) is pending (due or not) or running.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn has_unfinished(&self, queues: &[String]) -> Result<bool> {
        read::has_unfinished(&self.conn, queues)
    }
}

#[cfg(test)]
mod statements;
#[cfg(test)]
mod tests;
