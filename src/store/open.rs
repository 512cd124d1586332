//! Opening a database: creating the file owner-only, refusing what is not ours or too new, and
//! migrating older schemas.

use std::fs::OpenOptions as FileOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};

use super::maintenance::{self, AUTO_VACUUM_INCREMENTAL};
use super::options::{
    DEFAULT_BUSY_TIMEOUT, Durability, MAX_BUSY_TIMEOUT, Migration, OpenOptions, SCHEMA_VERSION,
};
use crate::error::{Error, Result, is_busy};

/// Prepared statements a connection keeps (rusqlite's default is 16).
const STATEMENT_CACHE: usize = 128;

/// The WAL size past which a connection that does not checkpoint on close empties the WAL
/// when it closes (see [`OpenOptions::checkpoint_on_close`]): 64 frames of 4 KiB pages.
const ONE_SHOT_WAL_BYTES: u64 = 64 * (4096 + 24);

/// What [`open`] made: the parts of a [`Store`](super::Store).
pub(super) struct Opened {
    pub(super) conn: Connection,
    pub(super) path: PathBuf,
    pub(super) busy_timeout: Duration,
    pub(super) migration: Migration,
}

/// The migrations, in order: migration `i` takes a file from version `i` to `i + 1`.
/// A migration whose version needs `auto_vacuum = INCREMENTAL` is applied only to a converted
/// file: see [`migrate`].
const MIGRATIONS: [&str; 22] = [
    include_str!("../migrations/0001_initial.sql"),
    include_str!("../migrations/0002_auto_vacuum.sql"),
    include_str!("../migrations/0003_failed_stale.sql"),
    include_str!("../migrations/0004_counters.sql"),
    include_str!("../migrations/0005_schedules.sql"),
    include_str!("../migrations/0006_flow.sql"),
    include_str!("../migrations/0007_handoff.sql"),
    include_str!("../migrations/0008_check_lists.sql"),
    include_str!("../migrations/0009_pid_namespace.sql"),
    include_str!("../migrations/0010_bounded.sql"),
    include_str!("../migrations/0011_keyset.sql"),
    include_str!("../migrations/0012_dashboard.sql"),
    include_str!("../migrations/0013_keepers.sql"),
    include_str!("../migrations/0014_per_job_cost.sql"),
    include_str!("../migrations/0015_start_with_ending.sql"),
    include_str!("../migrations/0016_teardown_lease.sql"),
    include_str!("../migrations/0017_name.sql"),
    include_str!("../migrations/0018_wal.sql"),
    include_str!("../migrations/0019_containment.sql"),
    include_str!("../migrations/0020_conditions.sql"),
    include_str!("../migrations/0021_manners.sql"),
    include_str!("../migrations/0022_insert_counts.sql"),
];

/// The version whose migration is [`rewrite_check_lists`], done in code.
const CHECK_LISTS_AT: i64 = 8;

/// The CHECK constraints of `jobs` as versions 1 to 7 wrote them, and as version 8 has them:
/// see `0008_check_lists.sql`.
const CHECK_LISTS: [(&str, &str); 2] = [
    (
        "CHECK (status IN ('pending', 'running', 'succeeded', 'failed', 'cancelled'))",
        "CHECK (status = 'pending' OR status = 'running' OR status = 'succeeded' \
         OR status = 'failed' OR status = 'cancelled')",
    ),
    (
        "CHECK (error_kind IN ('exit', 'signal', 'timeout', 'idle_timeout', 'lost', 'spawn'))",
        "CHECK (error_kind = 'exit' OR error_kind = 'signal' OR error_kind = 'timeout' \
         OR error_kind = 'idle_timeout' OR error_kind = 'lost' OR error_kind = 'spawn')",
    ),
];

/// The version whose migration widens the `error_kind` CHECK with `'memory'`, done in code
/// as [`rewrite_check_lists`] is: see `0021_manners.sql`.
const ERROR_KIND_MEMORY_AT: i64 = 21;

/// The `error_kind` CHECK before version 21 (as version 8 wrote it) and from it on.
const ERROR_KIND_MEMORY: [(&str, &str); 1] = [(
    "OR error_kind = 'idle_timeout' OR error_kind = 'lost' OR error_kind = 'spawn')",
    "OR error_kind = 'idle_timeout' OR error_kind = 'lost' OR error_kind = 'spawn' \
     OR error_kind = 'memory')",
)];

/// The first version whose files are `auto_vacuum = INCREMENTAL`.
const INCREMENTAL_SINCE: i64 = 2;

pub(super) fn open(path: impl AsRef<Path>, options: &OpenOptions) -> Result<Opened> {
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
    let mut conn = Connection::open_with_flags(&path, flags)?;
    // The runner's writer alone cycles through more distinct statements than rusqlite's
    // default cache of 16 holds (a claim, the promotion, the next due time, an ending, its
    // events, counters, histograms and dependents, the triggers they compile): with 16, a
    // third of a runner's instructions went to preparing statements again.
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    conn.busy_timeout(options.busy_timeout)?;
    if options.busy_timeout == DEFAULT_BUSY_TIMEOUT {
        conn.busy_handler(Some(quick_busy))?;
    }
    let deadline = Instant::now() + options.busy_timeout;
    let not_a_db = |e: rusqlite::Error| match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::NotADatabase) => Error::NotADatabase {
            path: path.clone(),
            reason: e.to_string(),
        },
        _ => Error::from(e),
    };
    // Read before anything writes: a file that is not a database fails here, untouched.
    // One statement, so one snapshot: between two reads another process could migrate the
    // file, and version 0 with tables would look like someone else's database.
    let (version, tables): (i64, i64) = retry_busy(deadline, || {
        conn.query_row(
            "SELECT (SELECT user_version FROM pragma_user_version),
                        (SELECT count(*) FROM sqlite_master WHERE type = 'table')",
            [],
            |r| r.try_into(),
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
    if !options.checkpoint_on_close {
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            true,
        )?;
    }
    let mut migration = Migration {
        from: version,
        to: version,
    };
    if options.migrate {
        // Before anything writes the first page (even journal_mode): a new file is then created
        // incremental. Only on a new file: on one with pages the pragma is a write transaction
        // of its own (it rewrites page 1 even when the mode is already incremental), which
        // would make every open a commit; an older file is converted by the migration instead.
        let pages: i64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0))?;
        if pages == 0 {
            conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")?;
        }
        // Both report busy at once, without the busy handler, when another process is
        // doing the same to a new file: retry them until the deadline.
        retry_busy(deadline, || {
            conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0))
        })?;
        // A file just switched to WAL (a new one, or one from before WAL) has no WAL until
        // the next read opens it, and the next step must see it.
        if !wal_path(&path).exists() {
            schema_version(&conn)?;
        }
    }
    sync_folder_of_new_wal(&path);
    // A current file needs no migration: versions only go up, so the version read above
    // cannot have become older. That spares every open a write lock.
    if options.migrate && version < SCHEMA_VERSION {
        migration = migrate(&conn, &path, deadline, options.convert_beside_runners)?;
    }
    Ok(Opened {
        conn,
        path,
        busy_timeout: options.busy_timeout,
        migration,
    })
}

/// The WAL beside the database at `path`.
fn wal_path(path: &Path) -> PathBuf {
    let mut wal = path.as_os_str().to_os_string();
    wal.push("-wal");
    PathBuf::from(wal)
}

/// Makes a new WAL's entry in its folder durable before anything is committed into it.
///
/// A commit is durable once its frames in the WAL are flushed, and only if the WAL file
/// itself is still there after a power cut: a new file's entry in its folder needs a flush
/// of the folder. SQLite does that on every connection's first commit, since it cannot tell
/// whether the WAL it opened is new; for a one-shot `leasehold jobs add` beside a running
/// runner, that was the second of its two fsyncs, for a WAL the runner's connections had made
/// long before. leasehold's own builds compile SQLite without it (`SQLITE_DISABLE_DIRSYNC`,
/// set in `.cargo/config.toml`) and flush the folder here instead, when it can matter: when
/// the WAL is missing or empty as this connection opens it (the first read has opened or
/// created it by now). A WAL with frames in it was written by a connection that opened it
/// while it was empty and flushed the folder first, and it is the same file for as long as
/// any connection has it open, this one included. An empty WAL costs the flush again, as
/// after `db prune` or a one-shot command empties it, which SQLite's way pays every time.
/// Built by someone else's flags, SQLite flushes the folder too: twice is harmless.
///
/// Best effort, as SQLite's own: a folder that cannot be opened or flushed is logged.
fn sync_folder_of_new_wal(path: &Path) {
    let empty = std::fs::metadata(wal_path(path)).map_or(true, |m| m.len() == 0);
    if !empty {
        return;
    }
    let folder = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if let Err(e) = std::fs::File::open(folder).and_then(|f| f.sync_all()) {
        log::warn!("cannot flush folder {} to disk: {e}", folder.display());
    }
}

pub(super) fn probe_version(path: impl AsRef<Path>) -> Result<i64> {
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
            _ => Error::from(e),
        })
}

pub(super) fn check(path: &Path, quick: bool) -> Result<Vec<String>> {
    if !path.exists() {
        return Err(Error::Missing(path.to_path_buf()));
    }
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(DEFAULT_BUSY_TIMEOUT)?;
    let sql = if quick {
        "PRAGMA quick_check(100)"
    } else {
        "PRAGMA integrity_check(100)"
    };
    let found = conn.prepare(sql).and_then(|mut stmt| {
        stmt.query_map([], |r| r.get::<_, String>(0))?
            .collect::<rusqlite::Result<Vec<String>>>()
    });
    match found {
        Ok(lines) => Ok(lines),
        Err(e) => match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::NotADatabase) => Err(Error::NotADatabase {
                path: path.to_path_buf(),
                reason: e.to_string(),
            }),
            Some(rusqlite::ErrorCode::DatabaseCorrupt) => Ok(vec![e.to_string()]),
            _ => Err(Error::Sqlite(e)),
        },
    }
}

pub(super) fn schema_version(conn: &Connection) -> Result<i64> {
    Ok(conn.query_row("PRAGMA user_version", [], |r| r.get(0))?)
}

/// A busy handler that retries soon, for connections with the default busy timeout.
///
/// SQLite's own (what `busy_timeout` installs) sleeps 1, 2, 5, 10 ms and more between
/// tries. The locks leasehold's connections wait for are held for one short transaction,
/// a commit's fsync at most (a fraction of a millisecond here): a `jobs add` fed into a
/// busy runner slept a whole millisecond, often two, for a lock free again after 0.2.
/// This one tries every 0.1 ms for the first 2 ms, every millisecond up to 22 ms, then
/// every 10 ms, and gives up after [`DEFAULT_BUSY_TIMEOUT`] in all, as SQLite's would.
/// (A handler takes no state, so a connection with another timeout keeps SQLite's.)
fn quick_busy(tries: i32) -> bool {
    let tries = u32::try_from(tries).unwrap_or(0);
    let (slept, next) = match tries {
        0..20 => (
            Duration::from_micros(100) * tries,
            Duration::from_micros(100),
        ),
        20..40 => (
            Duration::from_millis(2) + Duration::from_millis(1) * (tries - 20),
            Duration::from_millis(1),
        ),
        _ => (
            Duration::from_millis(22) + Duration::from_millis(10) * (tries - 40),
            Duration::from_millis(10),
        ),
    };
    if slept >= DEFAULT_BUSY_TIMEOUT {
        return false;
    }
    std::thread::sleep(next);
    true
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

/// Creates or migrates the schema, and says what it did.
///
/// Each step is one transaction that reads the version inside it, so two processes migrating
/// one file at once do each step once. Version 2 needs `auto_vacuum = INCREMENTAL`, which an
/// older file gets only from a VACUUM, and a VACUUM cannot run in a transaction: the step stops
/// below version 2, the file is converted (after the free-space check, which refuses and leaves
/// the file as it was), and the next step reads the version and auto_vacuum again before it
/// bumps the version. Two processes may both convert: the second VACUUM is wasted, not harmful.
fn migrate(
    conn: &Connection,
    path: &Path,
    deadline: Instant,
    convert_beside_runners: bool,
) -> Result<Migration> {
    let started = Instant::now();
    let first = retry_busy(deadline, || migrate_step(conn))?;
    let mut step = first;
    if step.needs_conversion {
        maintenance::convert_to_incremental(conn, path, INCREMENTAL_SINCE, convert_beside_runners)?;
        step = retry_busy(deadline, || migrate_step(conn))?;
        if step.needs_conversion {
            return Err(Error::io(
                format!("cannot migrate {}", path.display()),
                std::io::Error::other("the file is still not auto_vacuum = INCREMENTAL"),
            ));
        }
    }
    let migration = Migration {
        from: first.from,
        to: step.to,
    };
    if migration.from != migration.to {
        log::info!(
            "migrated {} from schema version {} to {} in {} ms",
            path.display(),
            migration.from,
            migration.to,
            started.elapsed().as_millis()
        );
    }
    Ok(migration)
}

/// One transaction of [`migrate`].
#[derive(Debug, Clone, Copy)]
struct Step {
    /// The version read in the transaction.
    from: i64,
    /// The version at its commit.
    to: i64,
    /// The next version needs a VACUUM outside any transaction first.
    needs_conversion: bool,
}

/// Applies every migration it can in one transaction, reading the version inside it.
fn migrate_step(conn: &Connection) -> rusqlite::Result<Step> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let run = || -> rusqlite::Result<Step> {
        let from: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        let mut step = Step {
            from,
            to: from,
            needs_conversion: false,
        };
        for (i, sql) in MIGRATIONS.iter().enumerate() {
            let to = i as i64 + 1;
            if step.to >= to {
                continue;
            }
            if to == INCREMENTAL_SINCE && maintenance::auto_vacuum(conn)? != AUTO_VACUUM_INCREMENTAL
            {
                step.needs_conversion = true;
                break;
            }
            conn.execute_batch(sql)?;
            if to == CHECK_LISTS_AT {
                rewrite_check_lists(conn, &CHECK_LISTS)?;
            }
            if to == ERROR_KIND_MEMORY_AT {
                rewrite_check_lists(conn, &ERROR_KIND_MEMORY)?;
            }
            conn.pragma_update(None, "user_version", to)?;
            step.to = to;
        }
        Ok(step)
    };
    match run() {
        Ok(step) => {
            conn.execute_batch("COMMIT")?;
            Ok(step)
        }
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// Migration 8 (see `0008_check_lists.sql`): the list CHECKs of `jobs` become chains of
/// equalities, by an edit of the table's definition in the open migration transaction. A
/// definition that does not hold the old text (a file edited by hand) is left as it is: its
/// constraints still hold, only at the old cost.
/// Version 21 uses it too, for its widened `error_kind` CHECK.
fn rewrite_check_lists(conn: &Connection, edits: &[(&str, &str)]) -> rusqlite::Result<()> {
    let sql: String = conn.query_row(
        "SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = 'jobs'",
        [],
        |r| r.get(0),
    )?;
    let mut new = sql.clone();
    for (old, replacement) in edits {
        if new.matches(old).count() == 1 {
            new = new.replacen(old, replacement, 1);
        }
    }
    if new == sql {
        return Ok(());
    }
    let version: i64 = conn.query_row("PRAGMA schema_version", [], |r| r.get(0))?;
    conn.pragma_update(None, "writable_schema", true)?;
    let edited = conn
        .execute(
            "UPDATE sqlite_schema SET sql = ?1 WHERE type = 'table' AND name = 'jobs'",
            [&new],
        )
        // Other connections prepare their statements again, from the new definition.
        .and_then(|_| conn.pragma_update(None, "schema_version", version + 1));
    let off = conn.pragma_update(None, "writable_schema", false);
    edited.and(off)
}

/// What a connection that does not checkpoint on close does as it closes: empties a WAL past
/// [`ONE_SHOT_WAL_BYTES`], if no runner is on the file and no other connection is using it
/// (it never waits).
pub(super) fn trim_wal(conn: &Connection, path: &Path) {
    let big = std::fs::metadata(wal_path(path)).is_ok_and(|m| m.len() > ONE_SHOT_WAL_BYTES);
    // A runner's connections checkpoint the WAL as it grows (SQLite's autocheckpoint). A
    // one-shot command that emptied it while a runner ran, between the runner's transactions,
    // would cost two fsyncs of its own, and the next commit a third (a restarted WAL's
    // header is synced): with one `jobs add` per job, three times the disk work of its one
    // commit.
    if !big || super::wake::any_runner(&super::wake::folder(path)) {
        return;
    }
    if conn.busy_timeout(Duration::ZERO).is_err() {
        return;
    }
    // Busy when a runner or another reader holds the file: its connections keep the WAL
    // cycling themselves.
    let _ = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
}
