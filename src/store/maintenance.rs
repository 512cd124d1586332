//! The file on disk: its size, and VACUUM (a full one on request, and the one-time conversion of
//! an older file to `auto_vacuum = INCREMENTAL`), which rewrites the file and so needs free space
//! beside it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::Connection;

use super::Store;
use crate::error::{Error, Result, is_busy};
use crate::metrics::DatabaseSize;

/// `PRAGMA auto_vacuum`'s value for INCREMENTAL: freed pages wait on the freelist until
/// `PRAGMA incremental_vacuum` gives them back to the filesystem.
pub(super) const AUTO_VACUUM_INCREMENTAL: i64 = 2;

/// What a WAL frame adds to each page it holds: a VACUUM in WAL mode writes every page of the
/// new file to the WAL before the checkpoint copies it back.
const WAL_FRAME_HEADER: u64 = 24;

/// What [`Store::vacuum`](crate::Store::vacuum) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VacuumReport {
    /// The bytes of the main file and its WAL before.
    pub bytes_before: u64,
    /// The bytes of the main file and its WAL after (the WAL checkpointed and truncated,
    /// unless a reader of an older snapshot held it).
    pub bytes_after: u64,
}

pub(super) fn size(conn: &Connection, path: &Path) -> Result<DatabaseSize> {
    let (schema_version, free_pages, page_size): (i64, i64, i64) = conn.query_row(
        "SELECT (SELECT user_version FROM pragma_user_version),
                (SELECT freelist_count FROM pragma_freelist_count),
                (SELECT page_size FROM pragma_page_size)",
        [],
        |r| r.try_into(),
    )?;
    Ok(DatabaseSize {
        path: path.to_path_buf(),
        schema_version,
        bytes: file_len(path)?,
        free_bytes: count(free_pages) * count(page_size),
        wal_bytes: wal_bytes(path)?,
    })
}

/// A full VACUUM, after checking that its folder has the space for it; then a checkpoint, so
/// that the main file shrinks now rather than at the last connection's close.
/// Refuses beside a live runner unless `force`: see [`refuse_beside_live_runners`].
pub(super) fn vacuum(
    conn: &Connection,
    path: &Path,
    busy_timeout: Duration,
    force: bool,
    now: i64,
) -> Result<VacuumReport> {
    let on_disk = || -> Result<u64> { Ok(file_len(path)? + wal_bytes(path)?) };
    let bytes_before = on_disk()?;
    refuse_beside_live_runners(conn, "vacuum", force, now)?;
    check_space(conn, path, "vacuum")?;
    let busy = |e: rusqlite::Error| {
        if is_busy(&e) {
            Error::Busy {
                operation: "vacuum",
                waited: busy_timeout,
            }
        } else {
            Error::from(e)
        }
    };
    conn.execute_batch("VACUUM").map_err(busy)?;
    // A reader of an older snapshot may keep the checkpoint from finishing (it reports that in
    // its first column rather than failing): the WAL is then copied back later.
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
        r.get::<_, i64>(0)
    })
    .map_err(busy)?;
    Ok(VacuumReport {
        bytes_before,
        bytes_after: on_disk()?,
    })
}

/// Converts a file to `auto_vacuum = INCREMENTAL`: a VACUUM, which cannot run in a
/// transaction. Its caller bumps the schema version afterwards, in a transaction that reads
/// the version again. Refused beside a live runner unless `force`.
pub(super) fn convert_to_incremental(
    conn: &Connection,
    path: &Path,
    to: i64,
    force: bool,
) -> Result<()> {
    refuse_beside_live_runners(conn, upgrade_operation(to), force, crate::job::now_ms())?;
    check_space(conn, path, upgrade_operation(to))?;
    conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")?;
    conn.execute_batch("VACUUM")?;
    let found = auto_vacuum(conn)?;
    if found != AUTO_VACUUM_INCREMENTAL {
        // VACUUM applies the pending auto_vacuum setting: anything else is SQLite's bug or
        // another process's doing, and the migration must not claim a conversion it lacks.
        return Err(Error::io(
            format!(
                "cannot convert {} to auto_vacuum = INCREMENTAL",
                path.display()
            ),
            std::io::Error::other(format!("VACUUM left auto_vacuum = {found}")),
        ));
    }
    Ok(())
}

pub(super) fn auto_vacuum(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("PRAGMA auto_vacuum", [], |r| r.get(0))
}

fn upgrade_operation(to: i64) -> &'static str {
    match to {
        2 => "the upgrade to schema version 2 (a one-time VACUUM)",
        _ => "the upgrade of the schema (a VACUUM)",
    }
}

/// Refuses with [`Error::NoSpace`] unless the file's folder has room for a rewrite of it: its
/// pages as WAL frames, plus the WAL it already has.
fn check_space(conn: &Connection, path: &Path, operation: &'static str) -> Result<()> {
    let (pages, page_size): (i64, i64) = conn.query_row(
        "SELECT (SELECT page_count FROM pragma_page_count),
                (SELECT page_size FROM pragma_page_size)",
        [],
        |r| r.try_into(),
    )?;
    let (pages, page_size) = (count(pages), count(page_size));
    let bytes = file_len(path)?.max(pages * page_size);
    let needed = bytes + pages * WAL_FRAME_HEADER + wal_bytes(path)?;
    let free = free_space(path)?;
    if free < needed {
        return Err(Error::NoSpace {
            operation,
            path: path.to_path_buf(),
            needed,
            free,
        });
    }
    Ok(())
}

/// The runners registered on the file that are live at `now`: not stopped, and their last
/// heartbeat within their lease TTL. Read with plain SQL that every schema version since 1
/// answers, so a file older than this build is checked before its conversion.
pub(super) fn live_runners(conn: &Connection, now: i64) -> Result<Vec<LiveRunner>> {
    let mut stmt = conn.prepare(
        "SELECT worker_id, pid, host, heartbeat_at FROM runners
         WHERE stopped_at IS NULL AND heartbeat_at + lease_ttl_ms >= ?1
         ORDER BY started_at, worker_id",
    )?;
    let rows = stmt.query_map([now], |r| {
        Ok(LiveRunner {
            worker_id: r.get(0)?,
            pid: r.get(1)?,
            host: r.get(2)?,
            heartbeat_ago_ms: now - r.get::<_, i64>(3)?,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Refuses `operation` (a VACUUM, which holds the write lock for as long as it rewrites the
/// file) while a runner is live on the file: it could not renew its leases meanwhile, and
/// would kill every attempt it runs. `force` goes ahead anyway.
pub(super) fn refuse_beside_live_runners(
    conn: &Connection,
    operation: &'static str,
    force: bool,
    now: i64,
) -> Result<()> {
    if force {
        return Ok(());
    }
    let live = live_runners(conn, now)?;
    match live.first() {
        None => Ok(()),
        Some(first) => {
            let more = match live.len() - 1 {
                0 => String::new(),
                n => format!(" (and {n} more)"),
            };
            Err(Error::RunnerLive {
                operation,
                runner: format!(
                    "runner {} (pid {} on host {}, last heartbeat {:.1} s ago){more}",
                    first.worker_id,
                    first.pid,
                    first.host,
                    first.heartbeat_ago_ms as f64 / 1000.0
                ),
            })
        }
    }
}

/// A live runner, as [`refuse_beside_live_runners`] names it.
#[derive(Debug, Clone)]
pub(super) struct LiveRunner {
    worker_id: String,
    pid: i64,
    host: String,
    heartbeat_ago_ms: i64,
}

/// The bytes this process may still write in the folder of `path`.
fn free_space(path: &Path) -> Result<u64> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let stat = nix::sys::statvfs::statvfs(dir).map_err(|e| {
        Error::io(
            format!("cannot read the free space of {}", dir.display()),
            e.into(),
        )
    })?;
    // Both are u64 on the 64-bit Linux targets this crate builds for.
    Ok(stat.blocks_available().saturating_mul(stat.fragment_size()))
}

/// A count SQLite reports as a signed integer, which is never negative.
fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// The bytes of the `-wal` file beside `path`; 0 when there is none.
pub(super) fn wal_bytes(path: &Path) -> Result<u64> {
    file_len(&wal_path(path))
}

fn wal_path(path: &Path) -> PathBuf {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    PathBuf::from(wal)
}

/// The length of a file; 0 when it does not exist.
fn file_len(path: &Path) -> Result<u64> {
    match std::fs::metadata(path) {
        Ok(m) => Ok(m.len()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(Error::io(
            format!("cannot read the size of {}", path.display()),
            e,
        )),
    }
}

impl Store {
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
        vacuum(
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
        vacuum(
            self.conn.sqlite_only("vacuum")?,
            &self.path,
            self.busy_timeout,
            true,
            self.now(),
        )
    }
}
