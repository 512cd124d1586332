//! Files and migrations: schema.sql, versions old and new, files that are not ours, and
//! file modes.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use leasehold::{Error, Job, ListFilter, Migration, OpenOptions, SCHEMA_VERSION, Store};
use rusqlite::types::Value;

use crate::helper::files_in;
use crate::util::{T0, TestDb, bare};

/// What opening a file of version 0 (empty, or new) does.
const FROM_EMPTY: Migration = Migration {
    from: 0,
    to: SCHEMA_VERSION,
};

/// `sql` with `--` comments stripped and runs of whitespace collapsed.
fn normalise_sql(sql: &str) -> String {
    let stripped: Vec<&str> = sql
        .lines()
        .map(|line| line.find("--").map_or(line, |i| &line[..i]))
        .collect();
    stripped
        .join(" ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

fn schema_of(conn: &rusqlite::Connection) -> (Vec<[String; 4]>, i64) {
    let mut stmt = conn
        .prepare("SELECT type, name, tbl_name, coalesce(sql, '') FROM sqlite_master ORDER BY name")
        .unwrap();
    let rows = stmt
        .query_map([], |r| {
            Ok([
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                normalise_sql(&r.get::<_, String>(3)?),
            ])
        })
        .unwrap()
        .collect::<rusqlite::Result<Vec<_>>>()
        .unwrap();
    let version = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    (rows, version)
}

#[test]
fn schema_sql_equals_what_migrating_an_empty_file_gives() {
    let db = TestDb::new();
    let store = db.store();
    assert_eq!(store.migration(), FROM_EMPTY);
    drop(store);
    let migrated = schema_of(&db.bare());

    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("schema.sql"))
        .expect("schema.sql is readable");
    let written = db.sibling("from-schema-sql.db");
    let conn = bare(&written);
    conn.execute_batch(&text)
        .expect("schema.sql runs on an empty file");
    let (tables, _) = schema_of(&conn);
    // schema.sql states its version in its first line: "(PRAGMA user_version = N)".
    let stated: i64 = text
        .lines()
        .next()
        .and_then(|l| l.split("user_version = ").nth(1))
        .and_then(|v| {
            v.trim_end_matches(|c: char| !c.is_ascii_digit())
                .parse()
                .ok()
        })
        .expect("schema.sql's first line states its user_version");

    assert_eq!(migrated.0, tables);
    assert_eq!(migrated.1, stated);
    assert_eq!(stated, SCHEMA_VERSION);
    assert!(
        tables.iter().any(|t| t[1] == "jobs_claim"),
        "the comparison sees the indexes"
    );
}

#[test]
fn an_empty_file_of_version_zero_is_migrated() {
    let db = TestDb::new();
    let zero_bytes = db.sibling("zero.db");
    std::fs::File::create(&zero_bytes).unwrap();
    let no_tables = db.sibling("no-tables.db");
    {
        let conn = bare(&no_tables);
        conn.execute_batch("CREATE TABLE scratch (x); DROP TABLE scratch;")
            .unwrap();
    }
    assert!(std::fs::metadata(&no_tables).unwrap().len() > 0);
    for path in [zero_bytes, no_tables] {
        let store = Store::open(&path).unwrap();
        assert_eq!(store.migration(), FROM_EMPTY);
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        // The file with pages already is converted by a VACUUM; the zero-byte one is created so.
        assert_eq!(auto_vacuum(&path), INCREMENTAL, "{}", path.display());
        store.enqueue_at(&Job::shell("true"), T0).unwrap();
        drop(store);
        let again = Store::open(&path).unwrap();
        let current = Migration {
            from: SCHEMA_VERSION,
            to: SCHEMA_VERSION,
        };
        assert_eq!(again.migration(), current);
        assert_eq!(again.counts().unwrap().pending, 1);
    }
}

/// Files of older versions live in `tests/fixtures/vN.db` (N = their user_version), made by the
/// last build of version N with a few jobs in them (`tests/fixtures/README.md` says how).
#[test]
fn fixture_files_of_older_versions_are_migrated_with_their_jobs() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let Ok(entries) = std::fs::read_dir(&fixtures) else {
        return;
    };
    let db = TestDb::new();
    for entry in entries {
        let source = entry.unwrap().path();
        let Some(version) = source.file_name().and_then(|n| n.to_str()).and_then(|n| {
            n.strip_prefix('v')?
                .strip_suffix(".db")?
                .parse::<i64>()
                .ok()
        }) else {
            continue;
        };
        let copy = db.sibling(&format!("v{version}.db"));
        std::fs::copy(&source, &copy).unwrap();
        let jobs: i64 = bare(&copy)
            .query_row("SELECT count(*) FROM jobs", [], |r| r.get(0))
            .unwrap();
        let store = Store::open(&copy).unwrap();
        assert_eq!(
            store.migration(),
            Migration {
                from: version,
                to: SCHEMA_VERSION
            }
        );
        assert_eq!(
            store.list(&ListFilter::default()).unwrap().len() as i64,
            jobs
        );
    }
}

/// Version 9: a runner registered before it has no recorded PID namespace (its pid proves
/// nothing: only its leases' expiry), and neither has a teardown marker written before it.
#[test]
fn runners_and_markers_from_before_version_9_have_no_namespace() {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1.db");
    let db = TestDb::new();
    let copy = db.sibling("v1.db");
    std::fs::copy(&source, &copy).unwrap();
    let store = Store::open(&copy).unwrap();
    let runner = store
        .latest_runner()
        .unwrap()
        .expect("the fixture has a runner");
    assert_eq!(runner.pid_ns, None);
    drop(store);
    // A marker as an older build wrote it (or the runbook's SQL by hand).
    bare(&copy)
        .execute("UPDATE jobs SET teardown_token = 'old' WHERE id = 6", [])
        .unwrap();
    let store = Store::open(&copy).unwrap();
    let lost = store.teardown_of(6).unwrap().expect("a marker");
    assert_eq!((lost.worker_id, lost.namespace), (None, None));
}

#[test]
fn a_newer_schema_is_refused_naming_both_versions() {
    let db = TestDb::new();
    bare(&db.path)
        .pragma_update(None, "user_version", 99)
        .unwrap();
    let before = std::fs::read(&db.path).unwrap();
    match Store::open(&db.path) {
        Err(e @ Error::SchemaTooNew { .. }) => {
            let message = e.to_string();
            assert!(message.contains("version 99"), "{message}");
            assert!(
                message.contains(&format!("version {SCHEMA_VERSION}")),
                "{message}"
            );
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
    assert_eq!(std::fs::read(&db.path).unwrap(), before);
}

#[test]
fn a_garbage_file_is_refused_and_left_byte_for_byte_unchanged() {
    let db = TestDb::new();
    let mut garbage = vec![0u8; 4096];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut garbage)
        .unwrap();
    std::fs::write(&db.path, &garbage).unwrap();
    match Store::open(&db.path) {
        Err(e @ Error::NotADatabase { .. }) => {
            assert!(e.to_string().contains("not a leasehold database"), "{e}");
        }
        other => panic!("expected NotADatabase, got {other:?}"),
    }
    assert_eq!(std::fs::read(&db.path).unwrap(), garbage);
    assert_eq!(files_in(db.dir.path()), ["jobs.db"]);
}

#[test]
fn a_sqlite_file_with_foreign_tables_is_refused_and_left_unchanged() {
    let db = TestDb::new();
    bare(&db.path)
        .execute_batch("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL); INSERT INTO invoices VALUES (1, 9.5);")
        .unwrap();
    let before = std::fs::read(&db.path).unwrap();
    match Store::open(&db.path) {
        Err(Error::NotADatabase { reason, .. }) => {
            assert!(reason.contains("other tables"), "{reason}");
        }
        other => panic!("expected NotADatabase, got {other:?}"),
    }
    assert_eq!(std::fs::read(&db.path).unwrap(), before);
    assert_eq!(files_in(db.dir.path()), ["jobs.db"]);
}

#[test]
fn a_read_only_open_of_a_missing_file_creates_nothing() {
    let db = TestDb::new();
    match Store::open_with(&db.path, &OpenOptions::read_only()) {
        Err(Error::Missing(path)) => assert_eq!(path, db.path),
        other => panic!("expected Missing, got {other:?}"),
    }
    assert!(!db.path.exists());
    assert!(files_in(db.dir.path()).is_empty());
}

#[test]
fn a_read_only_open_of_an_older_file_is_refused_and_leaves_it_unchanged() {
    let db = TestDb::new();
    std::fs::File::create(&db.path).unwrap();
    match Store::open_with(&db.path, &OpenOptions::read_only()) {
        Err(e @ Error::SchemaTooOld { found: 0, .. }) => {
            assert!(e.to_string().contains("leasehold db migrate"), "{e}");
        }
        other => panic!("expected SchemaTooOld, got {other:?}"),
    }
    assert_eq!(std::fs::metadata(&db.path).unwrap().len(), 0);
    assert_eq!(files_in(db.dir.path()), ["jobs.db"]);
    // A current file opens read-only.
    drop(db.store());
    let store = db.store_with(&OpenOptions::read_only());
    assert_eq!(
        store.migration(),
        Migration {
            from: SCHEMA_VERSION,
            to: SCHEMA_VERSION
        }
    );
}

#[test]
fn a_created_file_is_readable_by_its_owner_only() {
    let db = TestDb::new();
    let store = db.store();
    store.enqueue_at(&Job::shell("true"), T0).unwrap();
    for name in files_in(db.dir.path()) {
        let mode = std::fs::metadata(db.dir.path().join(&name))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{name} has mode {:o}", mode & 0o777);
    }
}

/// `PRAGMA auto_vacuum`'s value for INCREMENTAL.
const INCREMENTAL: i64 = 2;

/// The fixture of schema version 1 (see `tests/fixtures/README.md`).
fn v1_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1.db")
}

fn auto_vacuum(path: &Path) -> i64 {
    bare(path)
        .query_row("PRAGMA auto_vacuum", [], |r| r.get(0))
        .unwrap()
}

/// Every row of every leasehold table, as SQLite stores it, in rowid order: the columns of
/// version 1 (later versions add columns, with their defaults).
fn all_rows(path: &Path) -> Vec<(String, Vec<Vec<Value>>)> {
    let conn = bare(path);
    let fixture = rusqlite::Connection::open_with_flags(
        v1_fixture(),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    ["jobs", "job_events", "job_output", "runners"]
        .into_iter()
        .map(|table| {
            let columns: Vec<String> = fixture
                .prepare(&format!(
                    "SELECT name FROM pragma_table_info('{table}') ORDER BY cid"
                ))
                .unwrap()
                .query_map([], |r| r.get(0))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap();
            let mut stmt = conn
                .prepare(&format!(
                    "SELECT {} FROM {table} ORDER BY rowid",
                    columns.join(", ")
                ))
                .unwrap();
            let n = stmt.column_count();
            let rows = stmt
                .query_map([], |r| (0..n).map(|i| r.get(i)).collect())
                .unwrap()
                .collect::<rusqlite::Result<Vec<Vec<Value>>>>()
                .unwrap();
            (table.to_string(), rows)
        })
        .collect()
}

/// `after` cut to the columns each table had in `before`: later versions only add columns at
/// the end, and those must be NULL in a migrated row.
fn as_before(
    after: Vec<(String, Vec<Vec<Value>>)>,
    before: &[(String, Vec<Vec<Value>>)],
) -> Vec<(String, Vec<Vec<Value>>)> {
    after
        .into_iter()
        .zip(before)
        .map(|((table, rows), (_, old))| {
            let width = old.first().map_or(usize::MAX, Vec::len);
            let rows = rows
                .into_iter()
                .map(|mut row| {
                    if row.len() > width {
                        let added = row.split_off(width);
                        assert!(
                            added.iter().all(|v| *v == Value::Null),
                            "{table}: a column added by a migration is not NULL: {added:?}"
                        );
                    }
                    row
                })
                .collect();
            (table, rows)
        })
        .collect()
}

#[test]
fn a_new_file_is_created_with_incremental_auto_vacuum() {
    let db = TestDb::new();
    drop(db.store());
    assert_eq!(auto_vacuum(&db.path), INCREMENTAL);
}

#[test]
fn the_v1_fixture_upgrades_to_v2_with_every_job_event_and_output_intact() {
    let db = TestDb::new();
    let copy = db.sibling("v1.db");
    std::fs::copy(v1_fixture(), &copy).unwrap();
    let before = all_rows(&copy);
    assert_eq!(auto_vacuum(&copy), 0, "the fixture is a version-1 file");
    let counts: Vec<usize> = before.iter().map(|(_, rows)| rows.len()).collect();
    assert_eq!(
        counts,
        [7, 28, 6, 1],
        "jobs, events, outputs, runners in the fixture"
    );
    match Store::open_with(&copy, &OpenOptions::read_only()) {
        Err(Error::SchemaTooOld { found: 1, .. }) => {}
        other => panic!("expected SchemaTooOld, got {other:?}"),
    }

    let store = Store::open(&copy).unwrap();
    assert_eq!(
        store.migration(),
        Migration {
            from: 1,
            to: SCHEMA_VERSION
        }
    );
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    // The job counts the metrics read (kept by triggers since version 4) start from the
    // fixture's rows.
    let metrics = store.metrics().unwrap();
    // Counted from the rows themselves, not from job_counts, which both of the library's
    // counts read.
    let by_status: Vec<u64> = ["pending", "running", "succeeded", "failed", "cancelled"]
        .iter()
        .map(|status| {
            bare(&copy)
                .query_row(
                    "SELECT count(*) FROM jobs WHERE status = ?1",
                    [status],
                    |r| r.get::<_, i64>(0),
                )
                .unwrap() as u64
        })
        .collect();
    let sum = |status: &str| -> u64 {
        metrics
            .jobs
            .iter()
            .filter(|c| c.status == status)
            .map(|c| c.jobs)
            .sum()
    };
    assert_eq!(
        vec![
            sum("pending"),
            sum("running"),
            sum("succeeded"),
            sum("failed"),
            sum("cancelled")
        ],
        by_status
    );
    let c = store.counts().unwrap();
    assert_eq!(
        vec![c.pending, c.running, c.succeeded, c.failed, c.cancelled],
        by_status
    );
    // What the library reads of it: a failed job's output and a retried job's history.
    let output = store
        .output(2, None)
        .unwrap()
        .expect("job 2 kept its output");
    assert!(String::from_utf8_lossy(&output.stdout).contains("out line"));
    assert!(String::from_utf8_lossy(&output.stderr).contains("err line"));
    assert_eq!(store.events(3).unwrap().len(), 10);
    drop(store);

    assert_eq!(
        as_before(all_rows(&copy), &before),
        before,
        "every row is as it was"
    );
    assert_eq!(auto_vacuum(&copy), INCREMENTAL);
    let check: String = bare(&copy)
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    // The fixture itself is never changed.
    assert_eq!(Store::probe_version(v1_fixture()).unwrap(), 1);
}

#[test]
fn two_connections_upgrading_one_v1_file_at_once_both_succeed_and_keep_every_row() {
    let db = TestDb::new();
    let copy = db.sibling("v1.db");
    for round in 0..5 {
        std::fs::copy(v1_fixture(), &copy).unwrap();
        let before = all_rows(&copy);
        let barrier = std::sync::Barrier::new(4);
        let migrations: Vec<Migration> = std::thread::scope(|s| {
            let openers: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        Store::open(&copy).map(|store| store.migration())
                    })
                })
                .collect();
            openers
                .into_iter()
                .map(|h| h.join().unwrap().unwrap())
                .collect()
        });
        for m in &migrations {
            assert_eq!(m.to, SCHEMA_VERSION, "round {round}: {migrations:?}");
        }
        assert!(
            migrations.iter().any(|m| m.from == 1),
            "round {round}: someone migrated: {migrations:?}"
        );
        assert_eq!(as_before(all_rows(&copy), &before), before, "round {round}");
        assert_eq!(auto_vacuum(&copy), INCREMENTAL);
        assert_eq!(Store::probe_version(&copy).unwrap(), SCHEMA_VERSION);
        for suffix in ["-wal", "-shm"] {
            let _ = std::fs::remove_file(db.sibling(&format!("v1.db{suffix}")));
        }
    }
}

#[test]
fn size_reports_the_file_its_free_pages_and_its_wal() {
    let db = TestDb::new();
    let store = db.store();
    let jobs: Vec<Job> = (0..300).map(|i| Job::shell(format!("echo {i}"))).collect();
    store.enqueue_many_at(&jobs, T0).unwrap();
    let size = store.size().unwrap();
    assert_eq!(size.path, db.path);
    assert_eq!(size.schema_version, SCHEMA_VERSION);
    assert_eq!(size.bytes, std::fs::metadata(&db.path).unwrap().len());
    let wal = db.sibling("jobs.db-wal");
    assert_eq!(size.wal_bytes, std::fs::metadata(&wal).unwrap().len());
    assert!(size.wal_bytes > 0, "the enqueue went to the WAL");
    assert_eq!(size.free_bytes, 0);

    // Deleted rows leave free pages behind (auto_vacuum INCREMENTAL keeps them until asked).
    bare(&db.path).execute("DELETE FROM jobs", []).unwrap();
    let size = store.size().unwrap();
    assert!(size.free_bytes > 0, "{size:?}");
    assert_eq!(size.free_bytes % 4096, 0, "whole pages: {size:?}");
}

#[test]
fn vacuum_gives_free_pages_back_and_keeps_the_rest() {
    let db = TestDb::new();
    let store = db.store();
    let jobs: Vec<Job> = (0..2000).map(|i| Job::shell(format!("echo {i}"))).collect();
    let ids = store.enqueue_many_at(&jobs, T0).unwrap();
    bare(&db.path)
        .execute("DELETE FROM jobs WHERE id > ?1", [ids[9]])
        .unwrap();
    let before = store.size().unwrap();
    let report = store.vacuum().unwrap();
    assert_eq!(report.bytes_before, before.bytes + before.wal_bytes);
    assert!(
        report.bytes_after < report.bytes_before,
        "the file shrank: {report:?}"
    );
    let size = store.size().unwrap();
    assert_eq!(size.bytes + size.wal_bytes, report.bytes_after);
    assert_eq!(size.wal_bytes, 0, "the WAL was checkpointed and truncated");
    assert_eq!(size.free_bytes, 0);
    assert_eq!(store.counts().unwrap().pending, 10);
    assert_eq!(
        auto_vacuum(&db.path),
        INCREMENTAL,
        "a VACUUM keeps the mode"
    );
}

#[test]
fn vacuum_of_a_database_held_busy_is_an_error_not_a_wait() {
    let db = TestDb::new();
    let store = db.store_with(&OpenOptions::new().busy_timeout(Duration::from_millis(100)));
    let holder = db.bare();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    match store.vacuum() {
        Err(e @ Error::Busy { .. }) => {
            assert!(e.is_busy());
            assert!(e.to_string().contains("busy"), "{e}");
        }
        other => panic!("expected Busy, got {other:?}"),
    }
    holder.execute_batch("ROLLBACK").unwrap();
    store.vacuum().unwrap();
}

/// A tmpfs of a given size mounted on a temporary folder, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts one, or says why it cannot (not root, no permission, no `mount`).
    fn mount(kib: u64) -> Result<Tmpfs, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs refused: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The bytes free in it.
    fn free(&self) -> u64 {
        let stat = nix::sys::statvfs::statvfs(self.path()).unwrap();
        stat.blocks_available() * stat.fragment_size()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let unmounted = Command::new("umount")
            .arg(self.path())
            .status()
            .is_ok_and(|s| s.success());
        if !unmounted {
            // Busy (a file still open): detach it now; the kernel frees it when it is closed.
            let _ = Command::new("umount").arg("-l").arg(self.path()).status();
        }
    }
}

#[test]
fn a_v1_file_without_room_for_the_vacuum_is_refused_and_left_byte_for_byte_unchanged() {
    let _db = TestDb::new(); // the watchdog
    let fs = match Tmpfs::mount(1024) {
        Ok(fs) => fs,
        Err(reason) => {
            eprintln!("skipped (no tmpfs, so no real small filesystem): {reason}");
            return;
        }
    };
    eprintln!("ran on a real tmpfs of 1 MiB");
    let path = fs.path().join("v1.db");
    std::fs::copy(v1_fixture(), &path).unwrap();
    let original = std::fs::read(&path).unwrap();
    // Leave 40 KiB: room for SQLite's -shm (32 KiB) and an empty -wal, not for a rewrite of
    // the 72 KiB file.
    let filler = fs.path().join("filler");
    let keep = 40 * 1024;
    std::fs::write(&filler, vec![0u8; (fs.free() - keep) as usize]).unwrap();
    assert_eq!(fs.free(), keep);

    match Store::open(&path) {
        Err(e @ Error::NoSpace { .. }) => {
            let Error::NoSpace { needed, free, .. } = e else {
                unreachable!()
            };
            assert!(needed > original.len() as u64, "{e}");
            assert!(free < needed, "{e}");
            let message = e.to_string();
            assert!(
                message.contains(&format!("needs {needed} bytes")),
                "{message}"
            );
            assert!(message.contains(&format!("{free} are free")), "{message}");
            assert!(message.contains("schema version 2"), "{message}");
        }
        other => panic!("expected NoSpace, got {other:?}"),
    }
    assert_eq!(
        std::fs::read(&path).unwrap(),
        original,
        "byte-for-byte unchanged"
    );
    assert_eq!(Store::probe_version(&path).unwrap(), 1);

    // With the room back, the same file upgrades.
    std::fs::remove_file(&filler).unwrap();
    let store = Store::open(&path).unwrap();
    assert_eq!(
        store.migration(),
        Migration {
            from: 1,
            to: SCHEMA_VERSION
        }
    );
    assert_eq!(store.list(&ListFilter::default()).unwrap().len(), 7);
    drop(store);
    assert_eq!(auto_vacuum(&path), INCREMENTAL);
}

/// Version 8 rewrites two CHECK constraints of `jobs` in the table's stored definition (see
/// `0008_check_lists.sql`): on a file with jobs, the file stays sound and the constraints
/// still refuse what they refused.
#[test]
fn the_list_checks_of_an_older_file_become_equalities_that_refuse_the_same_values() {
    let db = TestDb::new();
    let copy = db.sibling("v1.db");
    std::fs::copy(v1_fixture(), &copy).unwrap();
    let before = bare(&copy)
        .query_row(
            "SELECT sql FROM sqlite_schema WHERE name = 'jobs'",
            [],
            |r| r.get::<_, String>(0),
        )
        .unwrap();
    assert!(before.contains("status IN ("), "{before}");
    let store = Store::open(&copy).unwrap();
    assert_eq!(store.migration().to, SCHEMA_VERSION);
    drop(store);

    let conn = bare(&copy);
    let after: String = conn
        .query_row(
            "SELECT sql FROM sqlite_schema WHERE name = 'jobs'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(!after.contains(" IN ('pending'"), "{after}");
    assert!(
        after.contains("status = 'pending' OR status = 'running'"),
        "{after}"
    );
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    for (column, value) in [("status", "done"), ("error_kind", "oops")] {
        let err = conn
            .execute(&format!("UPDATE jobs SET {column} = '{value}'"), [])
            .expect_err("a value outside the list is refused");
        assert!(
            err.to_string().contains("CHECK constraint failed"),
            "{column}: {err}"
        );
    }
    for (column, value) in [("status", "cancelled"), ("error_kind", "spawn")] {
        conn.execute(&format!("UPDATE jobs SET {column} = '{value}'"), [])
            .expect("a value of the list is taken");
    }
}

#[test]
fn a_postgres_database_of_version_15_is_migrated_with_its_marker_lease_and_name_columns() {
    let db = TestDb::postgres("migrate_15");
    drop(db.store());
    db.exec(
        "ALTER TABLE jobs DROP COLUMN teardown_lease_expires_at;
         ALTER TABLE jobs DROP COLUMN name;
         ALTER TABLE runners DROP COLUMN containment;
         ALTER TABLE jobs DROP COLUMN conditions;
         ALTER TABLE jobs DROP COLUMN when_lost;
         ALTER TABLE runners DROP COLUMN conditions_held;
         ALTER TABLE runners DROP COLUMN conditions_note;
         ALTER TABLE jobs DROP COLUMN limits;
         ALTER TABLE jobs DROP COLUMN tempfail_max;
         ALTER TABLE jobs DROP COLUMN tempfails;
         ALTER TABLE jobs DROP CONSTRAINT jobs_error_kind_check;
         ALTER TABLE jobs ADD CONSTRAINT jobs_error_kind_check
             CHECK (error_kind = 'exit' OR error_kind = 'signal' OR error_kind = 'timeout'
                    OR error_kind = 'idle_timeout' OR error_kind = 'lost'
                    OR error_kind = 'spawn');
         DELETE FROM leasehold_migrations;
         INSERT INTO leasehold_migrations (version, applied_at) VALUES (15, 0);",
    );
    drop(db.store());
    assert_eq!(
        db.scalar("SELECT max(version) FROM leasehold_migrations"),
        leasehold::SCHEMA_VERSION
    );
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM information_schema.columns
             WHERE table_name = 'jobs' AND column_name = 'teardown_lease_expires_at'"
        ),
        1
    );
    // Version 20: the job's conditions and when_lost, before version 21's columns.
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM information_schema.columns
             WHERE table_name = 'jobs' AND column_name = 'when_lost'"
        ),
        1
    );
    // Version 21: tempfails, last, as the fresh schema has it (name, version 17's, before).
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM information_schema.columns
             WHERE table_name = 'jobs' AND column_name = 'tempfails'
               AND ordinal_position = (SELECT max(ordinal_position)
                                       FROM information_schema.columns
                                       WHERE table_name = 'jobs')"
        ),
        1
    );
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM leasehold_migrations WHERE version IN (16, 17, 18, 19, 20, 21)"
        ),
        6
    );
    // Version 21: error_kind admits 'memory'.
    db.exec("UPDATE jobs SET error_kind = 'memory' WHERE false");
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM pg_constraint WHERE conname = 'jobs_error_kind_check'
               AND pg_get_constraintdef(oid) LIKE '%memory%'"
        ),
        1
    );
    // Its tables' columns are those of a database made from pg/schema.sql, in order.
    let columns = "SELECT hashtext(string_agg(table_name || '.' || column_name || ':' || data_type
                       || ':' || coalesce(column_default, ''), ','
                       ORDER BY table_name, ordinal_position))::bigint
                   FROM information_schema.columns WHERE table_schema = current_schema()";
    let fresh = TestDb::postgres("migrate_15_fresh");
    drop(fresh.store());
    assert_eq!(db.scalar(columns), fresh.scalar(columns));
}

/// The shape of a PostgreSQL database that decides its WAL a job (version 18): the indexes
/// with their predicates, the triggers, the constraints and the trigger functions' bodies,
/// as one hash.
const PG_SHAPE: &str = "SELECT hashtext(string_agg(d, E'\\n' ORDER BY d))::bigint FROM (
        SELECT pg_get_indexdef(indexrelid) AS d FROM pg_index
        WHERE indrelid IN (SELECT oid FROM pg_class
                           WHERE relnamespace = current_schema()::regnamespace)
        UNION ALL
        SELECT tgname || ': ' || pg_get_triggerdef(oid) FROM pg_trigger
        WHERE NOT tgisinternal AND tgrelid IN (SELECT oid FROM pg_class
                           WHERE relnamespace = current_schema()::regnamespace)
        UNION ALL
        SELECT conrelid::regclass::text || ': ' || pg_get_constraintdef(oid) FROM pg_constraint
        WHERE connamespace = current_schema()::regnamespace
        UNION ALL
        SELECT proname || ': ' || prosrc FROM pg_proc
        WHERE pronamespace = current_schema()::regnamespace) AS shape";

/// Whether `job_counts` equals a count of `jobs`.
const PG_COUNTS_DIFFER: &str = "SELECT count(*) FROM (
        (SELECT queue, status, n FROM job_counts WHERE n <> 0
         EXCEPT ALL SELECT queue, status, count(*) FROM jobs GROUP BY 1, 2)
        UNION ALL
        (SELECT queue, status, count(*) FROM jobs GROUP BY 1, 2
         EXCEPT ALL SELECT queue, status, n FROM job_counts WHERE n <> 0)) AS d";

#[test]
fn a_postgres_database_of_version_17_is_migrated_to_counts_per_statement_without_the_event_key() {
    use leasehold::protocol::{ClaimRequest, Ending, Finish, Finished};

    // A database made by the version-17 file, with jobs of every status counted by its row
    // triggers and events under its foreign key.
    let db = TestDb::postgres("migrate_17");
    db.exec(include_str!("pg_schema_17.sql"));
    db.exec(
        "INSERT INTO jobs (queue, argv, status, created_at, scheduled_at)
             SELECT CASE WHEN i % 3 = 0 THEN 'mail' ELSE 'default' END, '[\"true\"]',
                    (ARRAY['pending', 'running', 'succeeded', 'failed', 'cancelled'])[1 + i % 5],
                    0, 0
             FROM generate_series(1, 40) AS i;
         UPDATE jobs SET run_token = 'old' || id, worker_id = 'gone', lease_expires_at = 1
             WHERE status = 'running';
         INSERT INTO job_events (job_id, at, kind, attempt) SELECT id, 0, 'enqueued', 0 FROM jobs;",
    );
    assert_eq!(db.scalar(PG_COUNTS_DIFFER), 0);
    // The count trigger of UPDATEs runs once a row (tgtype's bit 0) or once a statement.
    let update_per_row = "SELECT count(*) FROM pg_trigger
                          WHERE tgname = 'job_counts_update' AND tgtype & 1 = 1";
    assert_eq!(db.scalar(update_per_row), 1);

    let store = db.store();
    assert_eq!(store.migration().from, 17);
    assert_eq!(
        db.scalar("SELECT max(version) FROM leasehold_migrations"),
        SCHEMA_VERSION
    );
    assert_eq!(
        db.scalar(update_per_row),
        0,
        "the UPDATEs' count trigger is per statement"
    );
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM pg_trigger WHERE tgname = 'job_counts_insert' AND tgtype & 1 = 1"
        ),
        0,
        "the INSERTs' count trigger is per statement (version 22)"
    );
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM pg_constraint
             WHERE conrelid = 'job_events'::regclass AND contype = 'f'"
        ),
        0,
        "job_events has no foreign key"
    );
    // The counts carried over, and kept by the new triggers through the store's grouped claim
    // and grouped successes, an enqueue and a delete.
    assert_eq!(db.scalar(PG_COUNTS_DIFFER), 0);
    for _ in 0..5 {
        store
            .enqueue_at(&Job::shell("true").queue("mail"), T0)
            .unwrap();
    }
    let claimed = store
        .claim(
            &ClaimRequest {
                worker_id: "w",
                limit: 16,
                queues: &[],
                lease_ttl: Duration::from_secs(30),
                queue_caps: &[],
                unheld: 0,
            },
            T0,
        )
        .unwrap();
    assert_eq!(
        claimed.len(),
        13,
        "8 pending jobs made by the old file and 5 new"
    );
    assert_eq!(db.scalar(PG_COUNTS_DIFFER), 0);
    let finishes: Vec<Finish> = claimed
        .iter()
        .map(|c| Finish {
            job_id: c.id,
            run_token: c.run_token.clone(),
            attempt: c.attempt,
            ending: Ending::Succeeded,
            output: None,
            notes: Vec::new(),
            max_recovery_attempts: 3,
        })
        .collect();
    let done = store.finish_many(&finishes, T0 + 5).unwrap();
    assert!(
        done.iter().all(|d| matches!(d, Finished::Recorded(_))),
        "{done:?}"
    );
    assert_eq!(db.scalar(PG_COUNTS_DIFFER), 0);
    assert_eq!(
        db.scalar("SELECT n FROM job_counts WHERE queue = 'mail' AND status = 'succeeded'"),
        // 12 and 27 were succeeded in the old file; 15, 30 and the 5 new ones pending.
        2 + 2 + 5
    );
    // A deleted job's events go with it, as ON DELETE CASCADE did.
    let first = claimed[0].id;
    assert!(
        db.scalar(&format!(
            "SELECT count(*) FROM job_events WHERE job_id = {first}"
        )) > 0
    );
    db.exec(&format!("DELETE FROM jobs WHERE id = {first}"));
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM job_events WHERE job_id = {first}"
        )),
        0
    );
    assert_eq!(db.scalar(PG_COUNTS_DIFFER), 0);
    drop(store);

    // The migrated database has the shape of one made from pg/schema.sql.
    let fresh = TestDb::postgres("migrate_17_fresh");
    drop(fresh.store());
    assert_eq!(db.scalar(PG_SHAPE), fresh.scalar(PG_SHAPE));
}

#[test]
fn a_newer_postgres_schema_is_refused_and_left_unchanged() {
    let db = TestDb::postgres("too_new");
    drop(db.store());
    let next = SCHEMA_VERSION + 1;
    db.exec(&format!(
        "INSERT INTO leasehold_migrations (version, applied_at) VALUES ({next}, 0)"
    ));
    let shape = db.scalar(PG_SHAPE);
    match Store::open(db.target()) {
        Err(Error::SchemaTooNew { found, supported }) => {
            assert_eq!((found, supported), (next, SCHEMA_VERSION));
        }
        other => panic!("expected SchemaTooNew, got {:?}", other.map(|_| ())),
    }
    assert_eq!(db.scalar(PG_SHAPE), shape);
    assert_eq!(
        db.scalar("SELECT max(version) FROM leasehold_migrations"),
        next
    );
}
