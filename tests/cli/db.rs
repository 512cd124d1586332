//! The database file: `db migrate`, `db version`, `db vacuum`, where the path comes from, and files that are
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
        vec!["db", "vacuum"],
        vec!["db", "vacuum", "--json"],
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

/// The version-1 fixture (see `tests/fixtures/README.md`), copied to `to`.
fn copy_v1_fixture(to: &std::path::Path) {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1.db");
    std::fs::copy(fixture, to).unwrap();
}

#[test]
fn db_migrate_upgrades_a_version_1_file_and_logs_how_long_it_took() {
    let t = TestDb::new();
    let db = t.path.as_path();
    copy_v1_fixture(db);
    let out = cli(db, &["db", "migrate"])
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let newest = leasehold::SCHEMA_VERSION;
    assert!(
        stdout.contains(&format!("migrated schema from version 1 to {newest} in ")),
        "{stdout}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("from schema version 1 to {newest} in "))
            && stderr.contains(" ms"),
        "{stderr}"
    );
    let v = json(&mut cli(db, &["status", "--json"]));
    assert_eq!(v["database"]["schema_version"], newest);
    assert_eq!(v["jobs"]["failed"], 2);
    let auto_vacuum: i64 = bare(db)
        .query_row("PRAGMA auto_vacuum", [], |r| r.get(0))
        .unwrap();
    assert_eq!(auto_vacuum, 2, "incremental");
}

#[test]
fn db_vacuum_prints_the_bytes_before_and_after_and_keeps_the_jobs() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let lines: String = (0..2000).map(|i| format!("echo {i}\n")).collect();
    let file = t.sibling("jobs.txt");
    std::fs::write(&file, lines).unwrap();
    ok(cli(db, &["jobs", "add", "--from-file"]).arg(&file));
    bare(db)
        .execute("DELETE FROM jobs WHERE id > 10", [])
        .unwrap();
    let before = json(&mut cli(db, &["status", "--json"]));
    assert!(
        before["database"]["free_bytes"].as_u64().unwrap() > 0,
        "{before}"
    );

    let v = json(&mut cli(db, &["db", "vacuum", "--json"]));
    let (bytes_before, bytes_after) = (
        v["bytes_before"].as_u64().unwrap(),
        v["bytes_after"].as_u64().unwrap(),
    );
    assert!(bytes_after < bytes_before, "{v}");
    let after = json(&mut cli(db, &["status", "--json"]));
    assert_eq!(after["database"]["free_bytes"], 0, "{after}");
    assert_eq!(after["jobs"]["pending"], 10);

    let human = ok(&mut cli(db, &["db", "vacuum"]));
    assert!(
        human.contains("bytes before") && human.contains("bytes after"),
        "{human}"
    );
}

/// The worker id of the one runner `status` lists.
fn only_runner(db: &std::path::Path) -> String {
    let v = json(&mut cli(db, &["status", "--json"]));
    v["runners"][0]["worker_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"))
        .to_string()
}

#[test]
fn db_vacuum_is_refused_beside_a_live_runner_naming_it_unless_forced() {
    let t = TestDb::new();
    let db = t.path.as_path();
    ok(&mut cli(db, &["db", "migrate"]));
    let runner = crate::helper::idle_runner(db);
    let worker = only_runner(db);

    // A VACUUM holds the write lock for as long as it runs: past the runner's renewal.
    let refused = fails(&mut cli(db, &["db", "vacuum"]), 1);
    assert!(
        refused.contains(&worker) && refused.contains("--force"),
        "{refused}"
    );
    let forced = json(&mut cli(db, &["db", "vacuum", "--force", "--json"]));
    assert!(forced["bytes_after"].as_u64().is_some(), "{forced}");
    crate::helper::stop(runner);
    // A runner that stopped is no reason to refuse.
    ok(&mut cli(db, &["db", "vacuum"]));
}

#[test]
fn db_migrate_of_a_version_1_file_is_refused_beside_a_live_runner_unless_forced() {
    let t = TestDb::new();
    let db = t.path.as_path();
    copy_v1_fixture(db);
    // A runner of the old build on the file: registered, heartbeat now, lease 60 s. (This
    // build cannot run on a version-1 file without converting it, so its row stands in.)
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    bare(db)
        .execute(
            "INSERT INTO runners (worker_id, pid, proc_start_time, boot_id, host, started_at,
                 heartbeat_at, stopped_at, lease_ttl_ms, heartbeat_interval_ms,
                 max_recovery_attempts)
             VALUES ('old-runner', ?1, 1, 'boot', 'host', ?2, ?2, NULL, 60000, 1000, 3)",
            rusqlite::params![std::process::id(), now],
        )
        .unwrap();
    let refused = fails(&mut cli(db, &["db", "migrate"]), 1);
    assert!(
        refused.contains("old-runner") && refused.contains("--force"),
        "{refused}"
    );
    let v = json(&mut cli(db, &["db", "version", "--json"]));
    assert_eq!(v["schema_version"], 1, "nothing converted");
    let out = ok(&mut cli(db, &["db", "migrate", "--force"]));
    assert!(out.contains("migrated schema from version 1"), "{out}");
}
