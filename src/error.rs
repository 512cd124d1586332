//! The library's error type.

use std::path::PathBuf;

/// What can go wrong in leasehold's own work: the database, its files, and misuse of the API.
///
/// A job's failure is not an error: a non-zero exit, a timeout or a lost lease is an outcome,
/// stored in the database and reported through [`Outcome`](crate::Outcome).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// SQLite reported an error. Its message is part of this one's (and not a source, which
    /// would say it twice).
    #[error("database error: {0}")]
    Sqlite(rusqlite::Error),
    /// The database file is damaged: SQLite found a page it cannot make sense of
    /// (`SQLITE_CORRUPT`), or a header that is not a database's in a file that opened as one
    /// (`SQLITE_NOTADB`). Nothing goes well on it: a runner that meets it stops at once, as
    /// a shutdown stops it, and writes nothing more to it. Stop every process on the file,
    /// copy it aside (with its `-wal` file), look at what is damaged (`leasehold db check`,
    /// [`Store::check`](crate::Store::check)), and restore a backup.
    #[error("the database file is damaged (SQLite: {reason})")]
    Damaged {
        /// What SQLite said.
        reason: String,
    },
    /// A write failed because the disk or the database is full (`SQLITE_FULL`, `ENOSPC`,
    /// `EFBIG`), or opening a file found no room for its WAL index (`Store::open` on a full
    /// disk). The transaction was rolled back: nothing of it was stored. SQLite's error is
    /// kept, but not as the source: its message says the same again.
    #[error("database or disk is full")]
    Full(rusqlite::Error),
    /// PostgreSQL reported an error.
    #[cfg(feature = "postgres")]
    #[error("PostgreSQL error")]
    Postgres(#[from] postgres::Error),
    /// The connection to the PostgreSQL server was lost in the middle of a transaction, which
    /// was lost with it: nothing of it was stored. Every later statement of that transaction,
    /// and its `COMMIT`, fail so too (the transaction is poisoned until its `ROLLBACK`); the
    /// first call after that connects again. [`Error::is_busy`] counts it: the whole
    /// transaction, run again, goes through.
    ///
    /// A `COMMIT` whose answer the connection lost is the one case where the server may have
    /// stored the transaction: a retried transaction must be one that a second run fences (a
    /// guarded write that finds its guard gone changes nothing).
    #[error("the connection to the PostgreSQL server was lost; the transaction was not stored")]
    ConnectionLost,
    /// A statement of a PostgreSQL transaction failed, which aborted the whole transaction,
    /// and its `COMMIT` was asked for all the same: PostgreSQL would have rolled it back and
    /// answered as if it had committed. It was rolled back; nothing of it was stored.
    #[error("the transaction was aborted by an earlier error in it; nothing of it was stored")]
    Aborted,
    /// A query that must return a row returned none.
    #[error("the query returned no row")]
    NoRows,
    /// A column held a value of the wrong type, or one out of range.
    #[error("a column could not be read: {0}")]
    Column(String),
    /// A `postgres://` URL was given to a build without the `postgres` feature.
    #[error(
        "{url} is a PostgreSQL URL, and this build of leasehold has no PostgreSQL backend: \
         build it with the `postgres` cargo feature"
    )]
    NoPostgres {
        /// The URL, without its password.
        url: String,
    },
    /// An operation on a SQLite file (its WAL, its free pages, a VACUUM) was asked of a
    /// PostgreSQL database, where the server does that work.
    #[error("{0} is for a SQLite file: it does not apply to a PostgreSQL database")]
    SqliteOnly(&'static str),
    /// The file is not a SQLite database (or is damaged); it was left untouched.
    #[error("{} is not a leasehold database: {reason}", path.display())]
    NotADatabase {
        /// The file that was opened.
        path: PathBuf,
        /// What SQLite said about it.
        reason: String,
    },
    /// The database was written by a newer leasehold than this one.
    #[error(
        "database schema version {found} is newer than this build of leasehold supports (version {supported})"
    )]
    SchemaTooNew {
        /// The version found in the file.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
    /// The database has an older schema and the caller asked not to migrate it.
    #[error(
        "database schema version {found} is older than this build's version {supported}: run `leasehold db migrate`"
    )]
    SchemaTooOld {
        /// The version found in the file.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
    /// The database file does not exist and the caller asked not to create it.
    #[error("database {} does not exist", .0.display())]
    Missing(PathBuf),
    /// Rewriting the file (a VACUUM) needs more free space in its folder than there is; the file
    /// was left unchanged.
    #[error(
        "{operation} of {} needs {needed} bytes free in its folder and {free} are free: the file was left unchanged",
        path.display()
    )]
    NoSpace {
        /// What needed the space: `vacuum`, or the upgrade to a schema version.
        operation: &'static str,
        /// The database file.
        path: PathBuf,
        /// About the file's size plus its WAL's, in bytes.
        needed: u64,
        /// The bytes free for this process in the file's folder.
        free: u64,
    },
    /// Another connection held the database busy for longer than the busy timeout.
    #[error(
        "{operation}: another connection (a runner?) held the database busy for {} ms",
        waited.as_millis()
    )]
    Busy {
        /// What could not get the database.
        operation: &'static str,
        /// How long it waited: the store's busy timeout.
        waited: std::time::Duration,
    },
    /// An operation that holds the write lock for as long as it runs (a VACUUM, the one-time
    /// conversion of a version-1 file) was refused because a runner is live on the file: it
    /// could not renew its leases meanwhile and would kill every attempt it runs. Stop the
    /// runner first, or force the operation (`--force`, [`Store::vacuum_forced`],
    /// [`OpenOptions::convert_beside_runners`]).
    ///
    /// [`Store::vacuum_forced`]: crate::Store::vacuum_forced
    /// [`OpenOptions::convert_beside_runners`]: crate::OpenOptions::convert_beside_runners
    #[error(
        "{operation} refused: {runner} is live on this file, and could not renew its leases \
         while {operation} holds the write lock; stop it first, or force it (--force)"
    )]
    RunnerLive {
        /// What was refused.
        operation: &'static str,
        /// The live runner: its worker id, pid, host and last heartbeat (and how many more).
        runner: String,
    },
    /// No job has this id.
    #[error("no job with id {0}")]
    NoSuchJob(i64),
    /// No schedule has this name.
    #[error("no schedule named {0:?}")]
    NoSuchSchedule(String),
    /// A schedule of this name exists already (replace it explicitly).
    #[error("a schedule named {0:?} exists already (replace it to change it)")]
    ScheduleExists(String),
    /// The operation does not apply to the job in its current state.
    #[error("job {id} is {status}: {reason}")]
    WrongState {
        /// The job.
        id: i64,
        /// Its current status.
        status: String,
        /// Why the operation is refused.
        reason: String,
    },
    /// A job cannot run after the job it names ([`Job::after`](crate::Job::after)): the id is
    /// unknown, names the job itself, or a job that already failed or was cancelled. Nothing
    /// was enqueued.
    #[error("cannot run after job {id}: {reason}")]
    Dependency {
        /// The dependency named.
        id: i64,
        /// Why it is refused.
        reason: String,
    },
    /// A setting or argument is out of range or inconsistent with another.
    #[error("invalid {setting}: {reason}")]
    Invalid {
        /// The setting or argument at fault.
        setting: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// [`operator::host_gone`](crate::operator::host_gone) (`leasehold hosts gone`) refused to
    /// declare a host gone, and changed nothing: it is the host this process runs on (its
    /// runners are judged by their pids, and tear down their own attempts), no runner is
    /// recorded there on this database, or (unless forced) it is not silent: a runner there
    /// renewed, or a lease of its jobs has not expired, within a lease TTL.
    #[error("host {host:?} {reason}")]
    HostGoneRefused {
        /// The host named.
        host: String,
        /// Why it is refused, and what to do.
        reason: String,
    },
    /// An I/O error outside SQLite (starting threads, reading /proc).
    #[error("{context}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The wake-up folder beside the database (`<db>-wake/`, through which commands hand
    /// their jobs, environment included, to runners) could be used by another user: it is
    /// not a directory (a symlink is refused too), is not owned by this process's effective
    /// user, or has a group or other permission bit. Nothing is sent to a socket in it, and a
    /// runner refuses to start. Remove it: a runner makes it anew, owner-only.
    #[error(
        "{} {problem}: the wake-up folder carries jobs to runners, so it must be this \
         user's alone; remove it",
        path.display()
    )]
    WakeFolder {
        /// The folder.
        path: PathBuf,
        /// What is wrong with it: `is owned by uid 1001, not 0`, `has mode 0777, not 0700`.
        problem: String,
    },
    /// The folder of attempts' files beside the database (`<db>-attempts`) is not this user's
    /// alone: as the wake-up folder, it must be a directory owned by this process's effective
    /// user with no group or other permission bit. A runner with keepers refuses to start.
    #[error(
        "{} {problem}: the attempts folder holds jobs' output and outcomes, so it must be \
         this user's alone",
        path.display()
    )]
    AttemptsFolder {
        /// The folder.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// A runner with keepers could not run the attempt keeper here: its start was refused
    /// before it took any job. The program could not be exec'ed from memory nor from its
    /// file in the attempts folder (a `noexec` mount with `vm.memfd_noexec=2` or a process
    /// that is not dumpable, a security policy, a keeper built for another machine), or it
    /// did not answer as a keeper does.
    #[error(
        "the attempt keeper cannot run here ({reason}): run without keepers (`--no-keepers`, \
         `RunnerBuilder::keepers(false)`) or keep the database where its attempts folder \
         allows exec"
    )]
    KeeperUnavailable {
        /// What failed.
        reason: String,
    },
    /// The runner has shut down and no longer accepts the request.
    #[error("the runner has shut down")]
    ShutDown,
    /// One of the runner's threads panicked or failed, and the runner fenced itself: it killed
    /// its running attempts, recorded them as lost, and refuses every later request.
    #[error("the runner stopped itself: its {thread} thread failed: {cause}")]
    RunnerFailed {
        /// The thread that failed (`heartbeat`, `writer`, `dispatcher`, `sweeper`, `notifier`, `firer`).
        thread: &'static str,
        /// Its panic message or error.
        cause: String,
    },
}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase) => {
                Error::Damaged {
                    reason: e.to_string(),
                }
            }
            _ => Error::Sqlite(e),
        }
    }
}

/// A `Result` with leasehold's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn invalid(setting: &'static str, reason: impl Into<String>) -> Self {
        Error::Invalid {
            setting,
            reason: reason.into(),
        }
    }

    /// True when the database file is damaged ([`Error::Damaged`]).
    pub fn is_damaged(&self) -> bool {
        matches!(self, Error::Damaged { .. })
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// True when the error is SQLite's "busy" or "locked": another connection holds the lock.
    ///
    /// On PostgreSQL: a deadlock broken by the server, a serialization failure, a lock not
    /// had within the session's `lock_timeout` (55P03), a statement cancelled by its
    /// `statement_timeout` (57014, not a cancel asked for), or [`Error::ConnectionLost`]. Each
    /// rolled the transaction back (or lost it with its connection) because of another's
    /// locks or of the network; the same transaction, run again from its start, goes through.
    pub fn is_busy(&self) -> bool {
        match self {
            Error::Sqlite(e) => is_busy(e),
            Error::Busy { .. } | Error::ConnectionLost => true,
            #[cfg(feature = "postgres")]
            Error::Postgres(e) => e.as_db_error().is_some_and(|db| {
                use postgres::error::SqlState;
                let code = db.code();
                *code == SqlState::T_R_DEADLOCK_DETECTED
                    || *code == SqlState::T_R_SERIALIZATION_FAILURE
                    || *code == SqlState::LOCK_NOT_AVAILABLE
                    || *code == SqlState::QUERY_CANCELED
                        && db.message().contains("statement timeout")
            }),
            _ => false,
        }
    }

    /// True when the error says that the PostgreSQL server could not be reached or that the
    /// connection to it was lost (refused, timed out, reset, closed, or ended by the server:
    /// an administrator's `pg_terminate_backend`, a shutdown, a server still starting): a
    /// state that passes, unlike a refusal (a wrong password, a missing database) that does
    /// not. Never on SQLite.
    pub(crate) fn is_connection(&self) -> bool {
        match self {
            Error::ConnectionLost => true,
            #[cfg(feature = "postgres")]
            Error::Postgres(e) => is_connection(e),
            _ => false,
        }
    }
}

/// See [`Error::is_connection`].
#[cfg(feature = "postgres")]
pub(crate) fn is_connection(e: &postgres::Error) -> bool {
    use postgres::error::SqlState;
    if e.is_closed() {
        return true;
    }
    if let Some(db) = e.as_db_error() {
        let code = db.code();
        return code.code().starts_with("08")
            || [
                SqlState::ADMIN_SHUTDOWN,
                SqlState::CRASH_SHUTDOWN,
                SqlState::CANNOT_CONNECT_NOW,
                SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
                SqlState::TOO_MANY_CONNECTIONS,
            ]
            .contains(code);
    }
    // No answer from the server: an I/O error (refused, reset, unreachable), or no answer
    // within the connect timeout.
    std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
        || e.to_string() == "timeout waiting for server"
}

impl Error {
    /// True when a write failed because the disk or the database is full. Nothing of the
    /// failed transaction was stored; the same write may succeed once space is freed.
    pub fn is_full(&self) -> bool {
        match self {
            Error::Full(_) => true,
            Error::Sqlite(e) => is_full(e),
            Error::Io { source, .. } => is_full_io(source),
            _ => false,
        }
    }

    /// The same error, as [`Error::Full`] when SQLite's says the disk or database is full.
    pub(crate) fn full_if_so(self) -> Self {
        match self {
            Error::Sqlite(e) if is_full(&e) => Error::Full(e),
            other => other,
        }
    }
}

/// SQLite reports a full disk (`ENOSPC`) and a full database (`max_page_count`) as
/// `SQLITE_FULL`; a full disk met while growing the WAL index (the `-shm` file, made anew by
/// the first connection to open the file) as `SQLITE_IOERR_SHMSIZE`, which SQLite documents
/// as a sign that the volume is out of space.
fn is_full(e: &rusqlite::Error) -> bool {
    match e {
        rusqlite::Error::SqliteFailure(f, _) => {
            f.code == rusqlite::ErrorCode::DiskFull
                || f.extended_code == rusqlite::ffi::SQLITE_IOERR_SHMSIZE
        }
        _ => false,
    }
}

fn is_full_io(e: &std::io::Error) -> bool {
    use nix::errno::Errno;
    e.raw_os_error()
        .is_some_and(|n| n == Errno::ENOSPC as i32 || n == Errno::EFBIG as i32)
}

pub(crate) fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}
