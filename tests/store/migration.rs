//! Files and migrations: schema.sql, versions old and new, files that are not ours, and
//! file modes.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use leasehold::{Error, Job, ListFilter, Migration, OpenOptions, SCHEMA_VERSION, Store};

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
        store.enqueue(&Job::shell("true"), T0).unwrap();
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
/// last build of version N with a few jobs in them. Version 1 is the first, so there are none
/// yet: when a migration 2 is added, save a version-1 file there and this test migrates it.
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
    assert_eq!(store.migration(), Migration { from: 1, to: 1 });
}

#[test]
fn a_created_file_is_readable_by_its_owner_only() {
    let db = TestDb::new();
    let store = db.store();
    store.enqueue(&Job::shell("true"), T0).unwrap();
    for name in files_in(db.dir.path()) {
        let mode = std::fs::metadata(db.dir.path().join(&name))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{name} has mode {:o}", mode & 0o777);
    }
}
