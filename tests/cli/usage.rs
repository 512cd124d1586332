//! Usage errors: help and version, refused arguments and settings (exit 2, one line, nothing
//! created or written), and arguments that are not UTF-8.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::helper::{add, bin, cli, fails, inspect, json, ok, run_until_idle};
use crate::util::{self, RUN_VARS, TestDb, bare};

#[test]
fn help_and_version_exit_zero() {
    let _watchdog = util::Watchdog::new();
    for args in [
        vec!["--help"],
        vec!["--version"],
        vec!["jobs", "--help"],
        vec!["jobs", "add", "--help"],
        vec!["run", "--help"],
        vec!["help"],
    ] {
        let stdout = ok(bin().args(&args));
        assert!(stdout.contains("leasehold"), "{args:?}: {stdout}");
    }
    let help = ok(bin().args(["run", "--help"]));
    for flag in RUN_VARS.into_iter().chain(["--until-idle"]) {
        assert!(help.contains(flag), "run --help does not mention {flag}");
    }
}

#[test]
fn usage_errors_exit_two_with_one_line_and_create_nothing() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let cases: Vec<Vec<&str>> = vec![
        vec![],
        vec!["frobnicate"],
        vec!["jobs"],
        vec!["jobs", "ls", "--bogus"],
        vec!["jobs", "add"],
        vec!["jobs", "add", "--queue", "q"],
        vec!["jobs", "add", "--from-file", "x.txt", "--", "true"],
        vec!["jobs", "add", "--timeout", "0", "--", "true"],
        vec!["jobs", "add", "--timeout", "-1", "--", "true"],
        vec!["jobs", "add", "--timeout", "abc", "--", "true"],
        vec!["jobs", "add", "--timeout", "inf", "--", "true"],
        vec!["jobs", "add", "--timeout", "nan", "--", "true"],
        vec!["jobs", "add", "--idle-timeout", "0", "--", "true"],
        vec!["jobs", "add", "--delay", "-0.5", "--", "true"],
        vec!["jobs", "add", "--timeout", "--", "true"],
        vec!["jobs", "add", "--max-attempts", "0", "--", "true"],
        vec!["jobs", "add", "--max-attempts", "x", "--", "true"],
        vec!["jobs", "add", "--priority", "high", "--", "true"],
        vec!["jobs", "add", "--env", "NOVALUE", "--", "true"],
        vec!["jobs", "add", "--env", "=value", "--", "true"],
        vec!["jobs", "add", "--on-lost", "maybe", "--", "true"],
        vec!["jobs", "add", "--queue", "", "--", "true"],
        vec!["jobs", "ls", "--status", "done"],
        vec!["jobs", "ls", "--limit", "-1"],
        vec!["jobs", "inspect"],
        vec!["jobs", "inspect", "abc"],
        vec!["jobs", "logs", "1", "--attempt", "0"],
        vec!["jobs", "retry"],
        vec!["jobs", "retry", "--failed-stale"],
        vec!["jobs", "retry", "--failed-stale", "--limit", "1", "--all"],
        vec!["jobs", "retry", "1", "--failed-stale", "--all"],
        vec!["jobs", "retry", "1", "--all"],
        vec!["jobs", "cancel"],
        vec!["run", "--workers", "0"],
        vec!["run", "--lease-ttl", "0"],
        vec!["run", "--heartbeat", "abc"],
        vec!["run", "--sweep", "-1"],
        vec!["run", "--kill-grace", "0"],
        vec!["run", "--shutdown-grace", "nan"],
        vec!["run", "--max-recovery", "-1"],
        vec!["run", "--reclaim-batch", "many"],
    ];
    for args in &cases {
        fails(&mut cli(db, args), 2);
    }
    assert!(!db.exists(), "a usage error created the database");
}

#[test]
fn misordered_timing_ladder_is_a_usage_error_naming_the_setting() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let line = fails(
        &mut cli(db, &["run", "--lease-ttl", "3", "--heartbeat", "1.5"]),
        2,
    );
    assert!(line.contains("heartbeat"), "{line}");
    let line = fails(
        &mut cli(
            db,
            &[
                "run",
                "--lease-ttl",
                "3",
                "--heartbeat",
                "1",
                "--kill-grace",
                "1",
                "--sweep",
                "4",
            ],
        ),
        2,
    );
    assert!(line.contains("sweep"), "{line}");
    // A 2 s kill grace given does not fit a 3 s lease beside two 1 s heartbeats.
    let line = fails(
        &mut cli(
            db,
            &[
                "run",
                "--lease-ttl",
                "3",
                "--heartbeat",
                "1",
                "--kill-grace",
                "2",
            ],
        ),
        2,
    );
    assert!(line.contains("--kill-grace"), "{line}");
    // The environment variables are read, and checked the same way.
    let line = fails(
        cli(db, &["run", "--until-idle"])
            .env("LEASEHOLD_LEASE_TTL", "2")
            .env("LEASEHOLD_HEARTBEAT", "1"),
        2,
    );
    assert!(line.contains("heartbeat"), "{line}");
    fails(
        cli(db, &["run", "--until-idle"]).env("LEASEHOLD_KILL_GRACE", "0"),
        2,
    );
    assert!(!db.exists());
}

/// The kill grace alone breaks the ladder: a 3 s lease with 1 s heartbeats and a 3 s sweep
/// fits every other rule, and only a 5 s grace given does not (a renewal that misses one
/// beat would kill every attempt). Without it, the grace follows the lease (0.5 s) and the
/// same settings start, as they do with a 1 s grace.
#[test]
fn a_kill_grace_that_alone_breaks_the_ladder_is_a_usage_error_naming_it() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let ladder = [
        "run",
        "--until-idle",
        "--lease-ttl",
        "3",
        "--heartbeat",
        "1",
        "--sweep",
        "3",
    ];
    let mut broken = ladder.to_vec();
    broken.extend(["--kill-grace", "5"]);
    let line = fails(&mut cli(db, &broken), 2);
    assert!(line.contains("--kill-grace"), "{line}");
    assert!(line.contains("kill grace 5s"), "{line}");
    assert!(!db.exists(), "a refused run created the database");
    // Only the grace was wrong: with one that fits, the runner starts and, with nothing to
    // run, exits 0.
    let mut fits = ladder.to_vec();
    fits.extend(["--kill-grace", "1"]);
    ok(&mut cli(db, &fits));
    ok(&mut cli(db, &ladder));
}

/// How many jobs the file holds.
fn job_count(db: &Path) -> i64 {
    bare(db)
        .query_row("SELECT count(*) FROM jobs", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn a_mistyped_option_before_the_command_is_a_usage_error_not_the_job() {
    let t = TestDb::new();
    let db = t.path.as_path();
    ok(&mut cli(db, &["db", "migrate"]));
    for args in [
        vec!["jobs", "add", "--tmeout", "5", "--", "sleep", "1"],
        vec!["jobs", "add", "--tmeout", "5", "sleep", "1"],
        vec!["jobs", "add", "--tmeout=5", "--", "sleep", "1"],
        vec!["jobs", "add", "-x", "--", "true"],
        vec!["jobs", "add", "--queue", "q", "--bogus", "--", "true"],
    ] {
        let line = fails(&mut cli(db, &args), 2);
        assert!(line.contains("unexpected argument"), "{args:?}: {line}");
    }
    assert_eq!(job_count(db), 0, "a refused jobs add enqueued something");

    // The command starts at `--`, or at the first word that is not an option: what follows
    // is the command's, options or not.
    let argv = |args: &[&str]| {
        let mut all = vec!["jobs", "add", "--json"];
        all.extend_from_slice(args);
        let id = json(&mut cli(db, &all))["id"].as_i64().unwrap();
        inspect(db, id)
    };
    let job = argv(&["echo", "--tmeout"]);
    assert_eq!(job["argv"], serde_json::json!(["echo", "--tmeout"]));
    let job = argv(&["--", "--weird-program", "x"]);
    assert_eq!(job["argv"], serde_json::json!(["--weird-program", "x"]));
    let job = argv(&["--queue", "q", "echo", "--queue", "r", "--", "x"]);
    assert_eq!(job["queue"], "q");
    assert_eq!(
        job["argv"],
        serde_json::json!(["echo", "--queue", "r", "--", "x"])
    );
    let job = argv(&["--priority", "-5", "--", "-"]);
    assert_eq!(job["priority"], -5);
    assert_eq!(job["argv"], serde_json::json!(["-"]));
}

#[test]
fn arguments_that_are_not_utf8_are_refused_and_nothing_is_written() {
    let t = TestDb::new();
    let db = t.path.as_path();
    ok(&mut cli(db, &["db", "migrate"]));
    let bad = OsStr::from_bytes(b"caf\xe9\xff");
    let with = |before: &[&str], value: &OsStr, after: &[&str]| {
        let mut cmd = cli(db, before);
        cmd.arg(value).args(after);
        cmd
    };
    let mut env_value = b"A=".to_vec();
    env_value.extend_from_slice(bad.as_bytes());
    let mut env_name = bad.as_bytes().to_vec();
    env_name.extend_from_slice(b"=1");
    let mut cwd = t.dir.path().as_os_str().as_bytes().to_vec();
    cwd.extend_from_slice(b"/");
    cwd.extend_from_slice(bad.as_bytes());
    std::fs::create_dir(OsStr::from_bytes(&cwd)).unwrap();
    // `jobs add OPTION VALUE -- true`.
    let option = |name: &str, value: &[u8]| {
        with(
            &["jobs", "add", name],
            OsStr::from_bytes(value),
            &["--", "true"],
        )
    };
    let cases = [
        (with(&["jobs", "add", "--"], bad, &[]), "CMD"),
        (with(&["jobs", "add"], bad, &["x"]), "CMD"),
        (with(&["jobs", "add", "--", "echo"], bad, &["x"]), "CMD"),
        (option("--env", &env_value), "--env"),
        (option("--env", &env_name), "--env"),
        (option("--cwd", &cwd), "--cwd"),
        (option("--queue", bad.as_bytes()), "--queue"),
    ];
    for (mut cmd, name) in cases {
        let line = fails(&mut cmd, 2);
        assert!(line.contains(name), "{cmd:?}: {line}");
        assert!(line.contains("UTF-8"), "{cmd:?}: {line}");
    }
    // A relative --cwd resolved in a folder whose name is not UTF-8: the library refuses it.
    let line = fails(
        cli(db, &["jobs", "add", "--cwd", ".", "--", "true"]).current_dir(OsStr::from_bytes(&cwd)),
        2,
    );
    assert!(line.contains("cwd") && line.contains("UTF-8"), "{line}");

    // A file or stdin with a line that is not UTF-8: nothing of it is enqueued.
    let file = t.sibling("jobs.txt");
    let mut lines = b"echo one\necho ".to_vec();
    lines.extend_from_slice(bad.as_bytes());
    lines.extend_from_slice(b"\necho three\n");
    std::fs::write(&file, &lines).unwrap();
    let line = fails(
        &mut cli(db, &["jobs", "add", "--from-file", file.to_str().unwrap()]),
        1,
    );
    assert!(line.contains("line 2") && line.contains("UTF-8"), "{line}");
    let line = fails(
        cli(db, &["jobs", "add", "--from-file", "-"]).write_stdin(lines),
        1,
    );
    assert!(line.contains("line 2 of stdin"), "{line}");
    assert_eq!(job_count(db), 0, "a refused jobs add enqueued something");

    // Text that is UTF-8 is stored as given, and the job runs with exactly it.
    let dir = t.sibling("caf\u{e9}");
    std::fs::create_dir(&dir).unwrap();
    let id = add(
        db,
        &["--cwd", dir.to_str().unwrap(), "--env", "V=\u{e9}\u{1F600}"],
        &[
            "sh",
            "-c",
            "printf '%s|%s|%s' \"$PWD\" \"$V\" \"$1\"",
            "sh",
            "x\u{e9}",
        ],
    );
    run_until_idle(db, &[]);
    let job = inspect(db, id);
    assert_eq!(job["status"], "succeeded", "{job}");
    let out = ok(&mut cli(db, &["jobs", "logs", &id.to_string()]));
    assert_eq!(
        out,
        format!("{}|\u{e9}\u{1F600}|x\u{e9}", dir.to_str().unwrap())
    );
}
