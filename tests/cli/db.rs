//! The database file: `db migrate`, `db version`, where the path comes from, and files that are
//! missing, in a missing folder, not ours, newer or older.

use std::os::unix::fs::PermissionsExt;

use crate::helper::{bin, cli, fails, json, ok};
use crate::util::{TestDb, bare};

#[test]
fn db_migrate_creates_an_owner_only_file_and_is_idempotent() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let first = ok(&mut cli(db, &["db", "migrate"]));
    assert!(
        first.contains(&format!("version {}", leasehold::SCHEMA_VERSION)),
        "{first}"
    );
    let mode = std::fs::metadata(db).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the new database is owner-only");
    let again = ok(&mut cli(db, &["db", "migrate"]));
    assert!(again.contains("up to date"), "{again}");
    let v = json(&mut cli(db, &["db", "migrate", "--json"]));
    assert_eq!(v["from"], leasehold::SCHEMA_VERSION);
    assert_eq!(v["to"], leasehold::SCHEMA_VERSION);
}

#[test]
fn db_version_prints_the_file_and_supported_versions() {
    let t = TestDb::new();
    let db = t.path.as_path();
    ok(&mut cli(db, &["db", "migrate"]));
    let v = json(&mut cli(db, &["db", "version", "--json"]));
    assert_eq!(
        v,
        serde_json::json!({"schema_version": leasehold::SCHEMA_VERSION, "supported": leasehold::SCHEMA_VERSION})
    );
    let human = ok(&mut cli(db, &["db", "version"]));
    assert!(human.contains(&leasehold::SCHEMA_VERSION.to_string()));
}

#[test]
fn db_path_comes_from_the_flag_then_the_environment_then_the_current_folder() {
    let t = TestDb::new();
    let from_env = t.sibling("env.db");
    ok(bin()
        .args(["jobs", "add", "--", "true"])
        .env("LEASEHOLD_DB", &from_env));
    assert!(from_env.exists());
    ok(bin()
        .args(["jobs", "add", "--", "true"])
        .current_dir(t.dir.path()));
    assert!(t.dir.path().join("leasehold.db").exists());
    // The flag wins over the environment, and may come after the subcommand.
    let flagged = t.sibling("flag.db");
    ok(bin()
        .args(["jobs", "add", "--db"])
        .arg(&flagged)
        .args(["--", "true"])
        .env("LEASEHOLD_DB", &from_env));
    let v = json(
        bin()
            .args(["status", "--json"])
            .env("LEASEHOLD_DB", &from_env),
    );
    assert_eq!(v["jobs"]["pending"], 1);
    let v = json(cli(&flagged, &["status", "--json"]).env("LEASEHOLD_DB", &from_env));
    assert_eq!(v["jobs"]["pending"], 1);
}

#[test]
fn read_only_commands_on_a_missing_file_fail_and_create_nothing() {
    let t = TestDb::new();
    let db = t.path.as_path();
    for args in [
        vec!["db", "version"],
        vec!["db", "version", "--json"],
        vec!["jobs", "ls"],
        vec!["jobs", "ls", "--failed-stale", "--json"],
        vec!["jobs", "inspect", "1"],
        vec!["jobs", "logs", "1"],
        vec!["status"],
        vec!["status", "--json"],
        vec!["jobs", "retry", "1"],
        vec!["jobs", "retry", "--failed-stale", "--all"],
        vec!["jobs", "cancel", "1"],
    ] {
        let line = fails(&mut cli(db, &args), 1);
        assert!(line.contains("does not exist"), "{args:?}: {line}");
        assert!(!db.exists(), "{args:?} created the database");
    }
}

#[test]
fn a_database_in_a_missing_folder_is_an_operation_error() {
    let t = TestDb::new();
    let db = t.dir.path().join("no-such-folder").join("jobs.db");
    for args in [
        vec!["db", "migrate"],
        vec!["jobs", "add", "--", "true"],
        vec!["run", "--until-idle"],
        vec!["status"],
    ] {
        let line = fails(&mut cli(&db, &args), 1);
        assert!(line.contains("does not exist"), "{args:?}: {line}");
    }
    assert!(!db.parent().unwrap().exists());
}

#[test]
fn a_file_that_is_not_a_database_is_refused_and_left_unchanged() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let garbage: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(db, &garbage).unwrap();
    for args in [
        vec!["db", "version"],
        vec!["db", "migrate"],
        vec!["jobs", "add", "--", "true"],
        vec!["jobs", "ls"],
        vec!["jobs", "inspect", "1"],
        vec!["jobs", "logs", "1"],
        vec!["jobs", "retry", "1"],
        vec!["jobs", "cancel", "1"],
        vec!["status", "--json"],
        vec!["run", "--until-idle"],
    ] {
        let line = fails(&mut cli(db, &args), 1);
        assert!(
            line.contains("not a leasehold database"),
            "{args:?}: {line}"
        );
    }
    assert_eq!(std::fs::read(db).unwrap(), garbage, "the file was changed");
}

#[test]
fn a_newer_database_is_refused_naming_both_versions() {
    let t = TestDb::new();
    let db = t.path.as_path();
    ok(&mut cli(db, &["db", "migrate"]));
    bare(db).pragma_update(None, "user_version", 99).unwrap();
    // `db version` is how an operator finds out: it reports, and refuses nothing.
    let v = json(&mut cli(db, &["db", "version", "--json"]));
    assert_eq!(v["schema_version"], 99);
    assert_eq!(v["supported"], leasehold::SCHEMA_VERSION);
    for args in [
        vec!["db", "migrate"],
        vec!["jobs", "add", "--", "true"],
        vec!["jobs", "ls"],
        vec!["status"],
        vec!["jobs", "retry", "1"],
        vec!["run", "--until-idle"],
    ] {
        let line = fails(&mut cli(db, &args), 1);
        assert!(
            line.contains("99") && line.contains(&leasehold::SCHEMA_VERSION.to_string()),
            "{args:?}: {line}"
        );
    }
    let version: i64 = bare(db)
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, 99);
}

#[test]
fn read_only_commands_on_an_older_database_say_to_migrate_and_change_nothing() {
    let t = TestDb::new();
    let db = t.path.as_path();
    // A zero-byte file is a SQLite database of version 0.
    std::fs::write(db, b"").unwrap();
    let v = json(&mut cli(db, &["db", "version", "--json"]));
    assert_eq!(v["schema_version"], 0);
    for args in [
        vec!["jobs", "ls"],
        vec!["jobs", "inspect", "1"],
        vec!["jobs", "logs", "1"],
        vec!["status", "--json"],
    ] {
        let line = fails(&mut cli(db, &args), 1);
        assert!(line.contains("leasehold db migrate"), "{args:?}: {line}");
        assert_eq!(
            std::fs::metadata(db).unwrap().len(),
            0,
            "{args:?} changed it"
        );
    }
    let out = ok(&mut cli(db, &["db", "migrate"]));
    assert!(
        out.contains(&format!("version {}", leasehold::SCHEMA_VERSION)),
        "{out}"
    );
    let v = json(&mut cli(db, &["db", "version", "--json"]));
    assert_eq!(v["schema_version"], leasehold::SCHEMA_VERSION);
}
