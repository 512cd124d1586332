//! What opening a database is told and what it tells back: [`OpenOptions`], [`Durability`],
//! the busy timeouts, [`Migration`] and the schema version this build writes. Both backends'
//! openers read them.

use std::time::Duration;

#[cfg(doc)]
use crate::error::Error;

/// The schema version this build writes and reads: `PRAGMA user_version`.
pub const SCHEMA_VERSION: i64 = 22;

/// How long a connection waits for another to release the database before giving up.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest busy timeout SQLite can take: a C `int` of milliseconds (about 24.8 days).
pub const MAX_BUSY_TIMEOUT: Duration = Duration::from_millis(i32::MAX as u64);

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

/// How to open a database: see [`Store::open_with`](crate::Store::open_with).
#[derive(Debug, Clone)]
pub struct OpenOptions {
    pub(super) create: bool,
    pub(super) migrate: bool,
    pub(super) durability: Durability,
    pub(super) busy_timeout: Duration,
    pub(super) checkpoint_on_close: bool,
    pub(super) convert_beside_runners: bool,
    given_times: bool,
    clock: super::clock::Clock,
    /// A runner's lease TTL and heartbeat, which its PostgreSQL sessions' timeouts follow.
    lease: Option<(Duration, Duration)>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            create: true,
            migrate: true,
            durability: Durability::Full,
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
            checkpoint_on_close: true,
            convert_beside_runners: false,
            given_times: false,
            clock: super::clock::Clock::system(),
            lease: None,
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

    /// Whether the last connection to the file to close copies the WAL into the main file
    /// and deletes it (SQLite's default). A short-lived process that makes one write (a
    /// command-line enqueue) turns it off: closing then costs nothing, where a checkpoint
    /// costs two more flushes to disk and the next write one more to make a new WAL. Every
    /// commit is as durable either way: the WAL is flushed at commit, and the next
    /// connection checkpoints it. The next process to open the file alone reads the whole
    /// WAL to rebuild its index, and cannot tell which frames were already copied (that
    /// record lives in the `-shm` file, which it resets), so such a connection empties the
    /// WAL when it closes once it is past 64 pages, if nobody else is using the file (a
    /// TRUNCATE checkpoint that does not wait). By default, true.
    pub fn checkpoint_on_close(mut self, checkpoint: bool) -> Self {
        self.checkpoint_on_close = checkpoint;
        self
    }

    /// Whether [`OpenOptions::checkpoint_on_close`] is on.
    /// Converts a version-1 file (a VACUUM that holds the write lock for as long as it
    /// rewrites the file) even while a runner is live on it, instead of refusing with
    /// [`Error::RunnerLive`](crate::Error::RunnerLive). By default, off.
    pub fn convert_beside_runners(mut self, force: bool) -> Self {
        self.convert_beside_runners = force;
        self
    }

    /// On PostgreSQL, act at the times passed to each call (`now`) rather than at the
    /// server's clock: for tests that drive time. Off by default: runners on several hosts
    /// share leases, and only the server's clock is the same for all of them. SQLite always
    /// acts at the times passed, as its database has one host.
    pub fn given_times(mut self, given: bool) -> Self {
        self.given_times = given;
        self
    }

    /// The clock the store reads the time from: a [`ManualClock`](crate::ManualClock)'s for a
    /// test that moves time (on PostgreSQL too, as [`OpenOptions::given_times`] does). By
    /// default, the system's clock (on PostgreSQL, the server's).
    pub fn clock(mut self, clock: impl Into<super::clock::Clock>) -> Self {
        self.clock = clock.into();
        self
    }

    /// The clock given to [`OpenOptions::clock`].
    pub(crate) fn clock_source(&self) -> &super::clock::Clock {
        &self.clock
    }

    /// A runner's connection: its PostgreSQL sessions' timeouts follow its lease TTL and
    /// heartbeat (see `store::pg::Timeouts::runner`) rather than the busy timeout.
    pub(crate) fn lease(mut self, lease_ttl: Duration, heartbeat: Duration) -> Self {
        self.lease = Some((lease_ttl, heartbeat));
        self
    }

    /// The lease TTL and heartbeat given to [`OpenOptions::lease`].
    #[cfg_attr(
        not(feature = "postgres"),
        expect(dead_code, reason = "read by the PostgreSQL backend only")
    )]
    pub(crate) fn runner_lease(&self) -> Option<(Duration, Duration)> {
        self.lease
    }

    /// Whether the store acts at the caller's times on PostgreSQL.
    #[cfg(feature = "postgres")]
    pub(crate) fn uses_given_times(&self) -> bool {
        self.given_times || self.clock.is_manual()
    }

    /// Whether opening makes a database that is missing (or, on PostgreSQL, empty).
    #[cfg(feature = "postgres")]
    pub(crate) fn creates(&self) -> bool {
        self.create
    }

    /// Whether opening brings an older schema to the newest.
    #[cfg(feature = "postgres")]
    pub(crate) fn migrates(&self) -> bool {
        self.migrate
    }

    pub(crate) fn checkpoints_on_close(&self) -> bool {
        self.checkpoint_on_close
    }
}

/// What [`Store::open_with`](crate::Store::open_with) found and did to the schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    /// The version before opening (0 for a new file).
    pub from: i64,
    /// The version after.
    pub to: i64,
}
