//! The `leasehold` binary, run as an operator or a script would run it: every command, every
//! JSON shape, every error with its exit code, and the runbook's plain SQL.

mod util;

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use assert_cmd::Command;
use leasehold::now_ms;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

use util::{TestDb, bare, wait_until};

/// The runner settings that make a test fast: a short lease, quick heartbeats and sweeps.
const FAST: [&str; 8] = [
    "--lease-ttl",
    "3",
    "--heartbeat",
    "1",
    "--sweep",
    "1",
    "--kill-grace",
    "0.5",
];

/// How long any one command may take before the test fails (and the command is killed).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// The job object's fields that scripts depend on.
const JOB_FIELDS: [&str; 22] = [
    "id",
    "queue",
    "argv",
    "status",
    "priority",
    "attempt",
    "max_attempts",
    "recovery_count",
    "on_lost",
    "exit_code",
    "signal",
    "error_kind",
    "last_error",
    "run_token",
    "worker_id",
    "pid",
    "created_at",
    "scheduled_at",
    "started_at",
    "heartbeat_at",
    "lease_expires_at",
    "completed_at",
];

/// The binary, with none of the caller's leasehold settings or log filter.
fn bin() -> Command {
    let mut cmd = Command::cargo_bin("leasehold").expect("the leasehold binary is built");
    for var in [
        "LEASEHOLD_DB",
        "LEASEHOLD_WORKERS",
        "LEASEHOLD_LEASE_TTL",
        "LEASEHOLD_HEARTBEAT",
        "LEASEHOLD_SWEEP",
        "LEASEHOLD_KILL_GRACE",
        "LEASEHOLD_SHUTDOWN_GRACE",
        "LEASEHOLD_MAX_RECOVERY",
        "LEASEHOLD_RECLAIM_BATCH",
        "RUST_LOG",
    ] {
        cmd.env_remove(var);
    }
    cmd.timeout(COMMAND_TIMEOUT);
    cmd
}

/// The binary on the database `db`, with `args`.
fn cli(db: &Path, args: &[&str]) -> Command {
    let mut cmd = bin();
    cmd.arg("--db").arg(db).args(args);
    cmd
}

/// Runs the command and checks it succeeded; returns its stdout.
fn ok(cmd: &mut Command) -> String {
    let out = cmd.output().expect("the command runs");
    assert!(
        out.status.success(),
        "{cmd:?} failed with {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("stdout is UTF-8")
}

/// Runs the command and parses its stdout as JSON.
fn json(cmd: &mut Command) -> Value {
    let stdout = ok(cmd);
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{cmd:?}: {e}: {stdout}"))
}

/// Runs the command, checks it exits with `code` and says why in exactly one line on stderr,
/// without a panic; returns that line.
fn fails(cmd: &mut Command, code: i32) -> String {
    let out = cmd.output().expect("the command runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(code),
        "{cmd:?}: stdout {:?}, stderr {stderr:?}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(!stderr.contains("panicked"), "{cmd:?} panicked: {stderr}");
    assert!(!stderr.contains("backtrace"), "{cmd:?}: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "{cmd:?}: not one line on stderr: {stderr:?}"
    );
    assert!(lines[0].starts_with("leasehold: "), "{cmd:?}: {stderr:?}");
    lines[0].to_string()
}

/// Enqueues `argv` with `options`; returns the id.
fn add(db: &Path, options: &[&str], argv: &[&str]) -> i64 {
    let mut args = vec!["jobs", "add", "--json"];
    args.extend_from_slice(options);
    args.push("--");
    args.extend_from_slice(argv);
    json(&mut cli(db, &args))["id"]
        .as_i64()
        .expect("jobs add --json prints an id")
}

/// `jobs inspect ID --json`.
fn inspect(db: &Path, id: i64) -> Value {
    json(&mut cli(
        db,
        &["jobs", "inspect", &id.to_string(), "--json"],
    ))
}

/// Runs a runner with the fast settings until no job is left.
fn run_until_idle(db: &Path, extra: &[&str]) {
    let mut args = vec!["run", "--until-idle"];
    args.extend_from_slice(&FAST);
    args.extend_from_slice(extra);
    ok(&mut cli(db, &args));
}

/// Whether `pid` is a live process (zombies are not).
fn alive(pid: i64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

/// A `leasehold run` in the background, killed by pid if the test ends before it does.
struct Background {
    child: Child,
}

impl Background {
    fn start(db: &Path, args: &[&str]) -> Background {
        let child = std::process::Command::new(assert_cmd::cargo::cargo_bin("leasehold"))
            .arg("--db")
            .arg(db)
            .arg("run")
            .args(args)
            .env_remove("LEASEHOLD_DB")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("leasehold run starts");
        Background { child }
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    /// Waits for the process to exit, up to `timeout`; returns its exit code and stderr.
    fn wait(&mut self, timeout: Duration) -> (Option<i32>, String) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("the runner can be waited for") {
                let mut stderr = String::new();
                if let Some(mut e) = self.child.stderr.take() {
                    std::io::Read::read_to_string(&mut e, &mut stderr).expect("stderr is readable");
                }
                return (status.code(), stderr);
            }
            assert!(
                Instant::now() < deadline,
                "the runner did not exit within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = kill(self.pid(), Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

/// Polls `jobs inspect` until the job is running with its process started.
fn wait_running(db: &Path, id: i64) -> Value {
    let mut job = Value::Null;
    let started = wait_until(Duration::from_secs(15), || {
        job = inspect(db, id);
        job["status"] == "running" && job["pid"].is_i64()
    });
    assert!(started, "job {id} did not start: {job}");
    job
}

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
    for flag in [
        "LEASEHOLD_WORKERS",
        "LEASEHOLD_LEASE_TTL",
        "LEASEHOLD_HEARTBEAT",
        "LEASEHOLD_SWEEP",
        "LEASEHOLD_KILL_GRACE",
        "LEASEHOLD_SHUTDOWN_GRACE",
        "LEASEHOLD_MAX_RECOVERY",
        "LEASEHOLD_RECLAIM_BATCH",
        "--until-idle",
    ] {
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
fn a_lease_shorter_than_the_least_renewal_budget_runs_jobs_without_losing_them() {
    // Once made the heartbeat thread panic on a clamp whose bounds crossed, after which the
    // runner went on without renewing and exited 0.
    let t = TestDb::new();
    let db = t.path.as_path();
    let id = add(db, &[], &["sleep", "0.5"]);
    ok(&mut cli(
        db,
        &[
            "run",
            "--until-idle",
            "--lease-ttl",
            "0.2",
            "--heartbeat",
            "0.05",
            "--sweep",
            "0.1",
            "--kill-grace",
            "0.05",
        ],
    ));
    let job = inspect(db, id);
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(job["recovery_count"], 0, "{job}");
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
                "--sweep",
                "4",
            ],
        ),
        2,
    );
    assert!(line.contains("sweep"), "{line}");
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

#[test]
fn db_migrate_creates_an_owner_only_file_and_is_idempotent() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let first = ok(&mut cli(db, &["db", "migrate"]));
    assert!(first.contains("version 1"), "{first}");
    let mode = std::fs::metadata(db).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the new database is owner-only");
    let again = ok(&mut cli(db, &["db", "migrate"]));
    assert!(again.contains("up to date"), "{again}");
    let v = json(&mut cli(db, &["db", "migrate", "--json"]));
    assert_eq!(v["from"], 1);
    assert_eq!(v["to"], 1);
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
    assert!(out.contains("version 1"), "{out}");
    let v = json(&mut cli(db, &["db", "version", "--json"]));
    assert_eq!(v["schema_version"], leasehold::SCHEMA_VERSION);
}

#[test]
fn jobs_add_stores_every_option_and_prints_the_id() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let id: i64 = ok(&mut cli(db, &["jobs", "add", "--", "echo", "hello"]))
        .trim()
        .parse()
        .expect("jobs add prints the id alone");
    let job = inspect(db, id);
    assert_eq!(job["argv"], serde_json::json!(["echo", "hello"]));
    assert_eq!(job["queue"], "default");
    assert_eq!(job["priority"], 0);
    assert_eq!(job["max_attempts"], 1);
    assert_eq!(job["on_lost"], "requeue");

    let before = now_ms();
    let id2 = add(
        db,
        &[
            "--queue",
            "reports",
            "--priority",
            "-5",
            "--timeout",
            "2.5",
            "--idle-timeout",
            "0.2",
            "--delay",
            "60",
            "--max-attempts",
            "3",
            "--on-lost",
            "fail",
            "--env",
            "A=1",
            "--env",
            "B=x=y",
            "--cwd",
            ".",
        ],
        &["sh", "-c", "echo --not-a-flag"],
    );
    assert_eq!(id2, id + 1);
    let job = inspect(db, id2);
    assert_eq!(
        job["argv"],
        serde_json::json!(["sh", "-c", "echo --not-a-flag"])
    );
    assert_eq!(job["queue"], "reports");
    assert_eq!(job["priority"], -5);
    assert_eq!(job["timeout_ms"], 2500);
    assert_eq!(job["idle_timeout_ms"], 200);
    assert_eq!(job["max_attempts"], 3);
    assert_eq!(job["on_lost"], "fail");
    assert_eq!(job["env"], serde_json::json!({"A": "1", "B": "x=y"}));
    let cwd = job["cwd"].as_str().expect("the cwd is stored");
    assert!(Path::new(cwd).is_absolute(), "{cwd}");
    let scheduled = job["scheduled_at"].as_i64().unwrap();
    assert!(scheduled >= before + 60_000, "delay not applied: {job}");
    assert_eq!(
        scheduled - job["created_at"].as_i64().unwrap(),
        60_000,
        "{job}"
    );
}

#[test]
fn jobs_add_from_a_file_or_stdin_enqueues_one_shell_job_per_line() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let file = t.sibling("jobs.txt");
    std::fs::write(&file, "echo one\n\n   \necho two\r\necho three").unwrap();
    let out = ok(&mut cli(
        db,
        &[
            "jobs",
            "add",
            "--queue",
            "batch",
            "--from-file",
            file.to_str().unwrap(),
        ],
    ));
    assert_eq!(out.trim(), "3");
    let jobs = json(&mut cli(db, &["jobs", "ls", "--json", "--queue", "batch"]));
    let mut argvs: Vec<Value> = jobs
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["argv"].clone())
        .collect();
    argvs.reverse();
    assert_eq!(
        argvs,
        vec![
            serde_json::json!(["sh", "-c", "echo one"]),
            serde_json::json!(["sh", "-c", "echo two"]),
            serde_json::json!(["sh", "-c", "echo three"]),
        ]
    );
    let v =
        json(cli(db, &["jobs", "add", "--from-file", "-", "--json"]).write_stdin("true\nfalse\n"));
    let ids = v["ids"].as_array().expect("{\"ids\": [...]}");
    assert_eq!(ids.len(), 2);
    assert_eq!(ids[1].as_i64().unwrap(), ids[0].as_i64().unwrap() + 1);
    // A missing file is an operation error; nothing is enqueued.
    fails(
        &mut cli(
            db,
            &[
                "jobs",
                "add",
                "--from-file",
                t.sibling("nope.txt").to_str().unwrap(),
            ],
        ),
        1,
    );
    assert_eq!(
        json(&mut cli(db, &["status", "--json"]))["jobs"]["pending"],
        5
    );
}

#[test]
fn jobs_add_from_file_enqueues_a_hundred_thousand_lines_in_one_go() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let file = t.sibling("many.txt");
    let text: String = (0..100_000).map(|i| format!("echo {i}\n")).collect();
    std::fs::write(&file, text).unwrap();
    let started = Instant::now();
    let out = ok(&mut cli(
        db,
        &["jobs", "add", "--from-file", file.to_str().unwrap()],
    ));
    eprintln!("100000 lines enqueued in {:?}", started.elapsed());
    assert_eq!(out.trim(), "100000");
    let v = json(&mut cli(db, &["status", "--json"]));
    assert_eq!(v["jobs"]["pending"], 100_000);
}

#[test]
fn job_objects_have_every_field_with_null_for_unset_values() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let id = add(db, &[], &["true"]);
    for job in [
        inspect(db, id),
        json(&mut cli(db, &["jobs", "ls", "--json"]))[0].clone(),
    ] {
        for field in JOB_FIELDS {
            assert!(job.get(field).is_some(), "no {field} in {job}");
        }
        assert_eq!(job["id"], id);
        assert_eq!(job["status"], "pending");
        assert_eq!(job["attempt"], 0);
        assert_eq!(job["recovery_count"], 0);
        for unset in [
            "exit_code",
            "signal",
            "error_kind",
            "last_error",
            "run_token",
            "worker_id",
            "pid",
            "started_at",
            "heartbeat_at",
            "lease_expires_at",
            "completed_at",
        ] {
            assert!(job[unset].is_null(), "{unset} is set in {job}");
        }
        let created = job["created_at"].as_i64().expect("times are integers");
        assert!(
            (created - now_ms()).abs() < 60_000,
            "not ms since the epoch"
        );
        assert!(job["scheduled_at"].is_i64());
    }
    let job = inspect(db, id);
    assert_eq!(job["output"], Value::Null);
    assert_eq!(job["events"].as_array().unwrap().len(), 1);
}

#[test]
fn run_until_idle_runs_a_success_a_failure_and_a_timeout() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let good = add(
        db,
        &[],
        &["sh", "-c", "echo hello; printf 'bad \\377 byte' >&2"],
    );
    let bad = add(db, &[], &["sh", "-c", "echo oops >&2; exit 3"]);
    let slow = add(db, &["--timeout", "0.5"], &["sleep", "30"]);
    let started = Instant::now();
    run_until_idle(db, &[]);
    assert!(started.elapsed() < Duration::from_secs(15));

    let job = inspect(db, good);
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(job["exit_code"], 0);
    assert_eq!(job["attempt"], 1);
    assert!(job["completed_at"].as_i64().unwrap() >= job["started_at"].as_i64().unwrap());
    assert_eq!(job["output"]["stdout"], "hello\n");
    assert_eq!(job["output"]["stderr"], "bad \u{fffd} byte");
    assert_eq!(job["output"]["truncated"], false);
    let events = job["events"].as_array().unwrap();
    let kinds: Vec<&str> = events.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds.first(), Some(&"enqueued"));
    assert_eq!(kinds.last(), Some(&"succeeded"));
    for e in events {
        assert!(e["at"].is_i64() && e["attempt"].is_i64() && e.get("detail").is_some());
    }
    let ats: Vec<i64> = events.iter().map(|e| e["at"].as_i64().unwrap()).collect();
    assert!(ats.windows(2).all(|w| w[0] <= w[1]), "events oldest first");

    let job = inspect(db, bad);
    assert_eq!(job["status"], "failed", "{job}");
    assert_eq!(job["exit_code"], 3);
    assert_eq!(job["error_kind"], "exit");
    assert_eq!(job["output"]["stderr"], "oops\n");

    let job = inspect(db, slow);
    assert_eq!(job["status"], "failed", "{job}");
    assert_eq!(job["error_kind"], "timeout");
    assert!(
        job["last_error"].as_str().unwrap().contains("timed out"),
        "{job}"
    );

    // The logs, raw: invalid UTF-8 stays as it was written.
    let out = cli(db, &["jobs", "logs", &good.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(out.stdout, b"hello\n");
    let out = cli(
        db,
        &[
            "jobs",
            "logs",
            &good.to_string(),
            "--stderr",
            "--attempt",
            "1",
        ],
    )
    .output()
    .unwrap();
    assert!(out.status.success());
    assert_eq!(out.stdout, b"bad \xff byte");
    let line = fails(
        &mut cli(db, &["jobs", "logs", &good.to_string(), "--attempt", "2"]),
        1,
    );
    assert!(line.contains("attempt 2"), "{line}");

    // The human forms.
    let human = ok(&mut cli(db, &["jobs", "inspect", &bad.to_string()]));
    assert!(
        human.contains("failed") && human.contains("oops"),
        "{human}"
    );
    let table = ok(&mut cli(db, &["jobs", "ls"]));
    assert_eq!(table.lines().count(), 4, "{table}");
    assert!(
        table.contains("succeeded") && table.contains("timeout"),
        "{table}"
    );
}

#[test]
fn jobs_ls_filters_by_status_queue_and_limit() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let a = add(db, &["--queue", "a"], &["true"]);
    let b = add(db, &["--queue", "b"], &["true"]);
    let c = add(db, &["--queue", "b"], &["true"]);
    ok(&mut cli(db, &["jobs", "cancel", &a.to_string()]));
    let ids = |args: &[&str]| -> Vec<i64> {
        let mut full = vec!["jobs", "ls", "--json"];
        full.extend_from_slice(args);
        json(&mut cli(db, &full))
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["id"].as_i64().unwrap())
            .collect()
    };
    assert_eq!(ids(&[]), vec![c, b, a]);
    assert_eq!(ids(&["--queue", "b"]), vec![c, b]);
    assert_eq!(ids(&["--status", "cancelled"]), vec![a]);
    assert_eq!(ids(&["--status", "pending", "--limit", "1"]), vec![c]);
    assert_eq!(ids(&["--queue", "none"]), Vec::<i64>::new());
    assert_eq!(ids(&["--failed-stale"]), Vec::<i64>::new());
}

#[test]
fn run_takes_only_its_queues_and_until_idle_ignores_the_others() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let mine = add(db, &["--queue", "mine"], &["true"]);
    let other = add(db, &["--queue", "other"], &["true"]);
    run_until_idle(db, &["--queue", "mine", "--workers", "1"]);
    assert_eq!(inspect(db, mine)["status"], "succeeded");
    assert_eq!(inspect(db, other)["status"], "pending");
}

#[test]
fn retry_and_cancel_follow_the_rules() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let good = add(db, &[], &["true"]);
    let bad = add(db, &[], &["false"]);
    run_until_idle(db, &[]);
    let waiting = add(db, &[], &["true"]);

    let line = fails(&mut cli(db, &["jobs", "retry", &good.to_string()]), 1);
    assert!(line.contains("succeeded"), "{line}");
    let line = fails(&mut cli(db, &["jobs", "retry", &waiting.to_string()]), 1);
    assert!(line.contains("pending"), "{line}");
    let line = fails(&mut cli(db, &["jobs", "cancel", &good.to_string()]), 1);
    assert!(line.contains("succeeded"), "{line}");
    let line = fails(&mut cli(db, &["jobs", "cancel", &bad.to_string()]), 1);
    assert!(line.contains("failed"), "{line}");
    for args in [
        vec!["jobs", "retry", "999"],
        vec!["jobs", "cancel", "999"],
        vec!["jobs", "inspect", "999"],
        vec!["jobs", "logs", "999"],
    ] {
        let line = fails(&mut cli(db, &args), 1);
        assert!(line.contains("999"), "{args:?}: {line}");
    }

    let v = json(&mut cli(
        db,
        &[
            "jobs",
            "retry",
            &bad.to_string(),
            "--reason",
            "fixed the env",
            "--json",
        ],
    ));
    assert_eq!(v, serde_json::json!({"retried": [bad]}));
    let job = inspect(db, bad);
    assert_eq!(job["status"], "pending");
    assert!(
        job["last_error"]
            .as_str()
            .unwrap()
            .contains("fixed the env")
    );
    assert_eq!(
        job["events"].as_array().unwrap().last().unwrap()["kind"],
        "manual_retry"
    );

    let v = json(&mut cli(
        db,
        &["jobs", "cancel", &waiting.to_string(), "--json"],
    ));
    assert_eq!(v, serde_json::json!({"id": waiting, "status": "cancelled"}));
    let line = fails(&mut cli(db, &["jobs", "cancel", &waiting.to_string()]), 1);
    assert!(line.contains("cancelled"), "{line}");
    let out = ok(&mut cli(db, &["jobs", "retry", &waiting.to_string()]));
    assert!(out.contains(&waiting.to_string()), "{out}");
    assert_eq!(inspect(db, waiting)["status"], "pending");
}

#[test]
fn retry_refuses_a_live_running_job_and_takes_one_whose_lease_expired() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let id = add(db, &[], &["true"]);
    let conn = bare(db);
    conn.execute(
        "UPDATE jobs SET status = 'running', attempt = 1, run_token = 'tok', worker_id = 'elsewhere:1:x',
             started_at = ?2, heartbeat_at = ?2, lease_expires_at = ?2 + 60000 WHERE id = ?1",
        rusqlite::params![id, now_ms()],
    )
    .unwrap();
    let line = fails(&mut cli(db, &["jobs", "retry", &id.to_string()]), 1);
    assert!(line.contains("running") && line.contains("lease"), "{line}");
    let v = json(&mut cli(db, &["status", "--json"]));
    assert_eq!(v["job_leases"]["running"], 1);
    assert_eq!(v["job_leases"]["stale_running"], 0);

    conn.execute(
        "UPDATE jobs SET lease_expires_at = ?2 - 1000 WHERE id = ?1",
        rusqlite::params![id, now_ms()],
    )
    .unwrap();
    let v = json(&mut cli(db, &["status", "--json"]));
    assert_eq!(v["job_leases"]["stale_running"], 1);
    let v = json(&mut cli(db, &["jobs", "retry", &id.to_string(), "--json"]));
    assert_eq!(v["retried"], serde_json::json!([id]));
    let job = inspect(db, id);
    assert_eq!(job["status"], "pending");
    assert_eq!(job["recovery_count"], 0);
    assert_eq!(
        job["teardown_pending"], false,
        "the tool tore it down: {job}"
    );
}

#[test]
fn retry_of_a_lost_running_job_kills_its_processes_at_once() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let id = add(db, &[], &["sleep", "30"]);
    let mut runner = Background::start(db, &FAST);
    let job = wait_running(db, id);
    let pid = job["pid"].as_i64().unwrap();
    assert!(alive(pid));
    // The runner dies without a word; its job keeps running, its lease runs out.
    kill(runner.pid(), Signal::SIGKILL).unwrap();
    runner.wait(Duration::from_secs(10));
    let line = fails(&mut cli(db, &["jobs", "retry", &id.to_string()]), 1);
    assert!(line.contains("lease"), "{line}");
    let mut last = String::new();
    let retried = wait_until(Duration::from_secs(10), || {
        let out = cli(db, &["jobs", "retry", &id.to_string()])
            .output()
            .unwrap();
        last = String::from_utf8_lossy(&out.stderr).into_owned();
        if !out.status.success() {
            // Poll the operator's way, a few times a second, until the lease runs out.
            std::thread::sleep(Duration::from_millis(100));
        }
        out.status.success()
    });
    assert!(retried, "the expired lease was not retried: {last}");
    assert!(
        !alive(pid),
        "the lost attempt's process {pid} survived the retry"
    );
    assert_eq!(inspect(db, id)["status"], "pending");
}

#[test]
fn failed_stale_jobs_are_listed_counted_and_retried() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let ids: Vec<i64> = (0..3).map(|_| add(db, &[], &["true"])).collect();
    let plain_failure = add(db, &[], &["true"]);
    let conn = bare(db);
    for (i, id) in ids.iter().enumerate() {
        conn.execute(
            "UPDATE jobs SET status = 'failed', recovery_count = 4, error_kind = 'lost',
                 completed_at = ?2, last_error = ?3 WHERE id = ?1",
            rusqlite::params![
                id,
                now_ms() + i as i64,
                if i == 0 {
                    "lease expired after missing heartbeat; test"
                } else {
                    "Lease metadata missing for running job; test"
                }
            ],
        )
        .unwrap();
    }
    conn.execute(
        "UPDATE jobs SET status = 'failed', recovery_count = 4, last_error = 'exited with code 1'
         WHERE id = ?1",
        [plain_failure],
    )
    .unwrap();

    let listed: Vec<i64> = json(&mut cli(db, &["jobs", "ls", "--failed-stale", "--json"]))
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_i64().unwrap())
        .collect();
    assert_eq!(
        listed,
        vec![ids[2], ids[1], ids[0]],
        "most recently failed first"
    );
    let table = ok(&mut cli(db, &["jobs", "ls", "--failed-stale"]));
    assert_eq!(table.lines().count(), 4, "{table}");
    let v = json(&mut cli(db, &["status", "--json"]));
    assert_eq!(v["job_leases"]["recovery_exhausted_failed"], 3);
    let human = ok(&mut cli(db, &["status"]));
    assert!(human.contains("recovery_exhausted_failed=3"), "{human}");

    let v = json(&mut cli(
        db,
        &["jobs", "retry", "--failed-stale", "--limit", "1", "--json"],
    ));
    assert_eq!(v, serde_json::json!({"retried": [ids[2]]}));
    let v = json(&mut cli(
        db,
        &[
            "jobs",
            "retry",
            "--failed-stale",
            "--all",
            "--reason",
            "host fixed",
            "--json",
        ],
    ));
    assert_eq!(v, serde_json::json!({"retried": [ids[1], ids[0]]}));
    let v = json(&mut cli(
        db,
        &["jobs", "retry", "--failed-stale", "--all", "--json"],
    ));
    assert_eq!(v, serde_json::json!({"retried": []}));
    for id in &ids {
        let job = inspect(db, *id);
        assert_eq!(job["status"], "pending");
        assert_eq!(job["recovery_count"], 0);
    }
    assert_eq!(inspect(db, plain_failure)["status"], "failed");
}

#[test]
fn status_reports_counts_leases_settings_and_runners() {
    let t = TestDb::new();
    let db = t.path.as_path();
    add(db, &[], &["true"]);
    let v = json(&mut cli(db, &["status", "--json"]));
    assert_eq!(v["schema_version"], leasehold::SCHEMA_VERSION);
    assert_eq!(
        v["jobs"],
        serde_json::json!({"pending": 1, "running": 0, "succeeded": 0, "failed": 0, "cancelled": 0})
    );
    assert_eq!(
        v["job_leases"],
        serde_json::json!({
            "running": 0, "stale_running": 0, "running_without_lease": 0,
            "recovery_exhausted_failed": 0,
            "lease_ttl_seconds": leasehold::DEFAULT_LEASE_TTL.as_secs_f64(),
            "heartbeat_interval_seconds": leasehold::DEFAULT_HEARTBEAT_INTERVAL.as_secs_f64(),
            "max_recovery_attempts": leasehold::DEFAULT_MAX_RECOVERY_ATTEMPTS,
        })
    );
    assert_eq!(v["runners"], serde_json::json!([]));

    // The settings of the most recently started runner, read from the environment here.
    ok(cli(db, &["run", "--until-idle"])
        .env("LEASEHOLD_LEASE_TTL", "3")
        .env("LEASEHOLD_HEARTBEAT", "0.5")
        .env("LEASEHOLD_SWEEP", "1")
        .env("LEASEHOLD_MAX_RECOVERY", "2")
        .env("LEASEHOLD_WORKERS", "1"));
    let v = json(&mut cli(db, &["status", "--json"]));
    assert_eq!(v["jobs"]["succeeded"], 1);
    assert_eq!(v["job_leases"]["lease_ttl_seconds"], 3.0);
    assert_eq!(v["job_leases"]["heartbeat_interval_seconds"], 0.5);
    assert_eq!(v["job_leases"]["max_recovery_attempts"], 2);
    assert_eq!(
        v["runners"],
        serde_json::json!([]),
        "a stopped runner is not listed"
    );
    let human = ok(&mut cli(db, &["status"]));
    for word in [
        "succeeded=1",
        "stale_running=0",
        "running_without_lease=0",
        "recovery_exhausted_failed=0",
        "lease_ttl_seconds=3",
        "heartbeat_interval_seconds=0.5",
        "max_recovery_attempts=2",
    ] {
        assert!(human.contains(word), "no {word} in {human}");
    }
}

#[test]
fn sigterm_shuts_the_runner_down_and_requeues_its_job_without_spending_recovery() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let id = add(db, &[], &["sleep", "30"]);
    let mut args = FAST.to_vec();
    args.extend(["--shutdown-grace", "0.5"]);
    let mut runner = Background::start(db, &args);
    let job = wait_running(db, id);
    let pid = job["pid"].as_i64().unwrap();

    let v = json(&mut cli(db, &["status", "--json"]));
    assert_eq!(v["job_leases"]["running"], 1);
    let runners = v["runners"].as_array().unwrap();
    assert_eq!(runners.len(), 1, "{v}");
    let r = &runners[0];
    assert_eq!(r["pid"], i64::from(runner.pid().as_raw()));
    assert_eq!(r["alive"], true);
    assert!(r["worker_id"].is_string() && r["host"].is_string() && r["heartbeat_at"].is_i64());
    assert_eq!(job["worker_id"], r["worker_id"]);

    let sent = Instant::now();
    kill(runner.pid(), Signal::SIGTERM).unwrap();
    let (code, stderr) = runner.wait(Duration::from_secs(10));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        sent.elapsed() < Duration::from_secs(5),
        "{:?}",
        sent.elapsed()
    );
    assert!(stderr.contains("SIGTERM"), "{stderr}");
    let job = inspect(db, id);
    assert_eq!(job["status"], "pending", "{job}");
    assert_eq!(job["recovery_count"], 0);
    assert!(!alive(pid), "the job's process {pid} survived the shutdown");
    assert_eq!(
        json(&mut cli(db, &["status", "--json"]))["runners"],
        serde_json::json!([])
    );
}

#[test]
fn cancel_of_a_running_job_kills_its_processes() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let id = add(db, &[], &["sleep", "30"]);
    let mut runner = Background::start(db, &FAST);
    let pid = wait_running(db, id)["pid"].as_i64().unwrap();
    let v = json(&mut cli(db, &["jobs", "cancel", &id.to_string(), "--json"]));
    assert_eq!(v, serde_json::json!({"id": id, "status": "cancelled"}));
    assert!(
        wait_until(Duration::from_secs(5), || !alive(pid)),
        "the cancelled job's process {pid} is still alive"
    );
    assert_eq!(inspect(db, id)["status"], "cancelled");
    kill(runner.pid(), Signal::SIGTERM).unwrap();
    let (code, stderr) = runner.wait(Duration::from_secs(10));
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn a_new_runner_reclaims_a_dead_runners_job_and_logs_the_sweep() {
    let t = TestDb::new();
    let db = t.path.as_path();
    // Runs long the first time, succeeds the second.
    let id = add(
        db,
        &["--cwd", t.dir.path().to_str().unwrap()],
        &[
            "sh",
            "-c",
            "if [ -e marker ]; then exit 0; fi; touch marker; sleep 30",
        ],
    );
    let mut first = Background::start(db, &FAST);
    let pid = wait_running(db, id)["pid"].as_i64().unwrap();
    kill(first.pid(), Signal::SIGKILL).unwrap();
    first.wait(Duration::from_secs(10));
    let v = json(&mut cli(db, &["status", "--json"]));
    assert_eq!(v["runners"][0]["alive"], false, "{v}");

    let mut args = vec!["run", "--until-idle"];
    args.extend_from_slice(&FAST);
    let out = cli(db, &args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("reclaimed_pending=1") && stderr.contains("reclaimed_failed=0"),
        "no sweep line: {stderr}"
    );
    let job = inspect(db, id);
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(job["recovery_count"], 1);
    assert!(!alive(pid), "the lost attempt's process {pid} survived");
}

#[test]
fn sigint_shuts_an_idle_runner_down() {
    let t = TestDb::new();
    let db = t.path.as_path();
    ok(&mut cli(db, &["db", "migrate"]));
    let mut runner = Background::start(db, &FAST);
    let registered = wait_until(Duration::from_secs(10), || {
        json(&mut cli(db, &["status", "--json"]))["runners"]
            .as_array()
            .is_some_and(|r| r.len() == 1)
    });
    assert!(registered);
    kill(runner.pid(), Signal::SIGINT).unwrap();
    let (code, stderr) = runner.wait(Duration::from_secs(10));
    assert_eq!(code, Some(0), "{stderr}");
}

/// The runbook's fallback query, with leasehold's table name and without the columns
/// leasehold does not have.
const RUNBOOK_FALLBACK_SELECT: &str = "
SELECT
  id,
  status,
  recovery_count,
  started_at,
  completed_at,
  last_error
FROM jobs
WHERE status = 'failed'
  AND recovery_count > 3
  AND (
    lower(coalesce(last_error, '')) LIKE 'lease expired after missing heartbeat;%'
    OR lower(coalesce(last_error, '')) LIKE 'lease metadata missing for running job;%'
  )
ORDER BY completed_at DESC NULLS LAST, created_at DESC;
";

/// The runbook's manual requeue, with leasehold's table name and times.
const RUNBOOK_MANUAL_REQUEUE: &str = "
UPDATE jobs
SET
  status = 'pending',
  scheduled_at = ?2,
  started_at = NULL,
  completed_at = NULL,
  heartbeat_at = NULL,
  lease_expires_at = NULL,
  run_token = NULL,
  worker_id = NULL,
  recovery_count = 0,
  last_error = 'manual retry after lease recovery'
WHERE id = ?1;
";

#[test]
fn the_runbooks_plain_sql_works_on_a_database_the_cli_made() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let id = add(db, &[], &["sh", "-c", "echo recovered"]);
    let by_sql_clock = add(db, &[], &["true"]);
    let bystander = add(db, &[], &["true"]);
    let conn = bare(db);
    for job in [id, by_sql_clock] {
        conn.execute(
            "UPDATE jobs SET status='failed', recovery_count=4, \
             last_error='lease expired after missing heartbeat; test' WHERE id=?",
            [job],
        )
        .unwrap();
    }

    let mut stmt = conn.prepare(RUNBOOK_FALLBACK_SELECT).unwrap();
    let found: Vec<(i64, String, i64)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    drop(stmt);
    let mut found_ids: Vec<i64> = found.iter().map(|f| f.0).collect();
    found_ids.sort_unstable();
    assert_eq!(found_ids, vec![id, by_sql_clock]);
    assert!(
        found.iter().all(|f| f.1 == "failed" && f.2 == 4),
        "{found:?}"
    );
    // The tool agrees with the plain SQL.
    let listed = json(&mut cli(db, &["jobs", "ls", "--failed-stale", "--json"]));
    assert_eq!(listed.as_array().unwrap().len(), 2);

    let changed = conn
        .execute(RUNBOOK_MANUAL_REQUEUE, rusqlite::params![id, now_ms()])
        .unwrap();
    assert_eq!(changed, 1);
    // The README's form, with the current time computed by SQLite itself.
    let sql_clock = RUNBOOK_MANUAL_REQUEUE.replace(
        "?2",
        "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)",
    );
    let before = now_ms();
    assert_eq!(conn.execute(&sql_clock, [by_sql_clock]).unwrap(), 1);
    let scheduled = inspect(db, by_sql_clock)["scheduled_at"].as_i64().unwrap();
    assert!(
        (scheduled - before).abs() < 5_000,
        "{scheduled} vs {before}"
    );
    drop(conn);

    run_until_idle(db, &[]);
    let job = inspect(db, id);
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(job["output"]["stdout"], "recovered\n");
    assert_eq!(inspect(db, by_sql_clock)["status"], "succeeded");
    assert_eq!(inspect(db, bystander)["status"], "succeeded");
}

#[test]
fn logs_of_a_job_without_output_are_empty() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let id = add(db, &[], &["true"]);
    assert_eq!(ok(&mut cli(db, &["jobs", "logs", &id.to_string()])), "");
    assert_eq!(
        ok(&mut cli(db, &["jobs", "logs", &id.to_string(), "--stderr"])),
        ""
    );
}

/// Every row of every table, and the schema version, as text: two equal snapshots mean that
/// nothing was written in between.
fn snapshot(db: &Path) -> String {
    let conn = bare(db);
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let mut out = format!("version {version}\n");
    for table in tables {
        let mut stmt = conn.prepare(&format!("SELECT * FROM \"{table}\"")).unwrap();
        let n = stmt.column_count();
        let mut rows: Vec<String> = stmt
            .query_map([], |r| {
                (0..n)
                    .map(|i| r.get::<_, rusqlite::types::Value>(i))
                    .collect::<Result<Vec<_>, _>>()
            })
            .unwrap()
            .map(|row| format!("{:?}", row.unwrap()))
            .collect();
        rows.sort();
        out.push_str(&format!("{table}: {rows:?}\n"));
    }
    out
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
fn out_of_range_counts_and_durations_are_usage_errors_naming_the_flag() {
    let t = TestDb::new();
    let db = t.path.as_path();
    for (args, flag) in [
        (vec!["run", "--workers", "9223372036854775808"], "--workers"),
        (vec!["run", "--workers", "1025"], "--workers"),
        (vec!["run", "--heartbeat", "1e19"], "--heartbeat"),
        (vec!["run", "--lease-ttl", "1e19"], "--lease-ttl"),
        (vec!["run", "--sweep", "NaN"], "--sweep"),
        (vec!["run", "--kill-grace", "inf"], "--kill-grace"),
        (vec!["run", "--shutdown-grace", ""], "--shutdown-grace"),
        (
            vec!["jobs", "add", "--timeout", "1e19", "--", "true"],
            "--timeout",
        ),
        (
            vec!["jobs", "add", "--idle-timeout", "-inf", "--", "true"],
            "--idle-timeout",
        ),
        (
            vec!["jobs", "add", "--delay", "9223372036854776", "--", "true"],
            "--delay",
        ),
        (
            vec!["jobs", "add", "--delay", "1e-9", "--", "true"],
            "--delay",
        ),
    ] {
        let line = fails(&mut cli(db, &args), 2);
        assert!(line.contains(flag), "{args:?}: {line}");
    }
    let line = fails(&mut cli(db, &["run", "--workers", "2000"]), 2);
    assert!(line.contains("1 to 1024"), "{line}");
    let line = fails(
        cli(db, &["run", "--until-idle"]).env("LEASEHOLD_WORKERS", "99999999999999999999"),
        2,
    );
    assert!(line.contains("--workers"), "{line}");
    assert!(!db.exists(), "a usage error created the database");

    // A delay that fits is stored exactly.
    let before = now_ms();
    let id = add(db, &["--delay", "1e9"], &["true"]);
    let job = inspect(db, id);
    assert_eq!(
        job["scheduled_at"].as_i64().unwrap() - job["created_at"].as_i64().unwrap(),
        1_000_000_000_000
    );
    assert!(job["created_at"].as_i64().unwrap() >= before);
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
    let cases = [
        (with(&["jobs", "add", "--"], bad, &[]), "CMD"),
        (with(&["jobs", "add"], bad, &["x"]), "CMD"),
        (with(&["jobs", "add", "--", "echo"], bad, &["x"]), "CMD"),
        (
            with(
                &["jobs", "add", "--env"],
                OsStr::from_bytes(&env_value),
                &["--", "true"],
            ),
            "--env",
        ),
        (
            with(
                &["jobs", "add", "--env"],
                OsStr::from_bytes(&env_name),
                &["--", "true"],
            ),
            "--env",
        ),
        (
            with(
                &["jobs", "add", "--cwd"],
                OsStr::from_bytes(&cwd),
                &["--", "true"],
            ),
            "--cwd",
        ),
        (
            with(&["jobs", "add", "--queue"], bad, &["--", "true"]),
            "--queue",
        ),
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

/// Every option or argument that takes a number, by command, as `--help` shows it. When a
/// command gains one, add it here: the test below fails until it is listed.
const NUMERIC: [(&str, &str); 20] = [
    ("jobs add", "--priority"),
    ("jobs add", "--timeout"),
    ("jobs add", "--idle-timeout"),
    ("jobs add", "--delay"),
    ("jobs add", "--max-attempts"),
    ("jobs ls", "--limit"),
    ("jobs inspect", "ID"),
    ("jobs logs", "ID"),
    ("jobs logs", "--attempt"),
    ("jobs retry", "ID"),
    ("jobs retry", "--limit"),
    ("jobs cancel", "ID"),
    ("run", "--workers"),
    ("run", "--lease-ttl"),
    ("run", "--heartbeat"),
    ("run", "--sweep"),
    ("run", "--kill-grace"),
    ("run", "--shutdown-grace"),
    ("run", "--max-recovery"),
    ("run", "--reclaim-batch"),
];

/// The value names that `--help` gives a number.
const NUMERIC_VALUE_NAMES: [&str; 3] = ["N", "SECS", "ID"];

/// The commands that take no subcommand, as `--help` lists them (`jobs add`, `run`, ...).
fn leaf_commands() -> Vec<String> {
    let mut leaves = Vec::new();
    let mut todo = vec![String::new()];
    while let Some(path) = todo.pop() {
        let help = ok(bin().args(path.split_whitespace()).arg("--help"));
        let commands: Vec<String> = help
            .lines()
            .skip_while(|l| !l.starts_with("Commands:"))
            .skip(1)
            .take_while(|l| l.starts_with("  "))
            .filter_map(|l| l.split_whitespace().next())
            .filter(|c| *c != "help")
            .map(|c| format!("{path} {c}").trim().to_string())
            .collect();
        if commands.is_empty() {
            leaves.push(path);
        } else {
            todo.extend(commands);
        }
    }
    leaves.sort();
    leaves
}

/// The options and arguments of `command` whose value `--help` names as a number.
fn numeric_inputs(command: &str) -> Vec<String> {
    let help = ok(bin().args(command.split_whitespace()).arg("--help"));
    let mut found = Vec::new();
    for line in help.lines().map(str::trim_start) {
        let words: Vec<&str> = line.split_whitespace().collect();
        // An argument: `<ID>  The job's id` or `[ID]  ...`.
        if let Some(first) = words.first()
            && (first.starts_with('<') || first.starts_with('['))
        {
            let name = first.trim_matches(|c| "<>[].".contains(c));
            if NUMERIC_VALUE_NAMES.contains(&name) {
                found.push(name.to_string());
            }
            continue;
        }
        // An option: `--limit <N>  ...` or `-h, --help  ...`.
        if let Some(i) = words.iter().position(|w| w.starts_with("--"))
            && let Some(value) = words.get(i + 1)
            && let Some(name) = value.strip_prefix('<').and_then(|v| v.strip_suffix('>'))
            && NUMERIC_VALUE_NAMES.contains(&name)
        {
            found.push(words[i].to_string());
        }
    }
    found
}

#[test]
fn every_numeric_input_is_listed_for_the_extreme_values_test() {
    let listed: BTreeSet<(String, String)> = NUMERIC
        .iter()
        .map(|(c, f)| (c.to_string(), f.to_string()))
        .collect();
    let mut shown = BTreeSet::new();
    for command in leaf_commands() {
        for input in numeric_inputs(&command) {
            shown.insert((command.clone(), input));
        }
    }
    assert!(shown.len() >= 20, "the help was not parsed: {shown:?}");
    assert_eq!(
        shown, listed,
        "a numeric option is missing from NUMERIC (or gone from --help)"
    );
}

/// The environment variable that sets a `run` flag, if any.
fn run_env(flag: &str) -> Option<&'static str> {
    Some(match flag {
        "--workers" => "LEASEHOLD_WORKERS",
        "--lease-ttl" => "LEASEHOLD_LEASE_TTL",
        "--heartbeat" => "LEASEHOLD_HEARTBEAT",
        "--sweep" => "LEASEHOLD_SWEEP",
        "--kill-grace" => "LEASEHOLD_KILL_GRACE",
        "--shutdown-grace" => "LEASEHOLD_SHUTDOWN_GRACE",
        "--max-recovery" => "LEASEHOLD_MAX_RECOVERY",
        "--reclaim-batch" => "LEASEHOLD_RECLAIM_BATCH",
        _ => return None,
    })
}

#[test]
fn every_numeric_input_takes_extreme_values_without_a_panic() {
    const EXTREMES: [&str; 16] = [
        "0",
        "0.05",
        "1e7",
        "-1",
        "1e-9",
        "1e19",
        "9223372036854775807",
        "-9223372036854775808",
        "18446744073709551616",
        "NaN",
        "inf",
        "-inf",
        "",
        " ",
        "1.5",
        "0x10",
    ];
    let t = TestDb::new();
    let db = t.path.as_path();
    ok(&mut cli(db, &["db", "migrate"]));
    // A job no runner below takes (they run queue "idle" only), so a refused command has
    // something it could have changed.
    add(db, &["--queue", "parked"], &["true"]);

    let mut commands: Vec<(String, Command)> = Vec::new();
    for (command, input) in NUMERIC {
        for value in EXTREMES {
            // The ways a value reaches the input: its own word, `--flag=value`, and for an
            // argument after `--`; for `run`, its environment variable too.
            let forms: Vec<Vec<String>> = if input.starts_with("--") {
                vec![
                    vec![input.to_string(), value.to_string()],
                    vec![format!("{input}={value}")],
                ]
            } else {
                vec![
                    vec![value.to_string()],
                    vec!["--".into(), value.to_string()],
                ]
            };
            let (before, after): (&[&str], &[&str]) = match (command, input) {
                ("jobs add", _) => (&["jobs", "add"], &["--", "true"]),
                ("jobs logs", "--attempt") => (&["jobs", "logs", "1"], &[]),
                ("jobs retry", "--limit") => (&["jobs", "retry", "--failed-stale"], &[]),
                ("run", _) => (&["run", "--until-idle", "--queue", "idle"], &[]),
                _ => (&[], &[]),
            };
            let before: Vec<&str> = if before.is_empty() {
                command.split_whitespace().collect()
            } else {
                before.to_vec()
            };
            for form in forms {
                let mut cmd = cli(db, &before);
                // An argument after `--` must come last.
                if form[0] == "--" {
                    cmd.args(after).args(&form);
                } else {
                    cmd.args(&form).args(after);
                }
                commands.push((format!("{command} {form:?}"), cmd));
            }
            if let Some(var) = run_env(input) {
                let mut cmd = cli(db, &before);
                cmd.env(var, value);
                commands.push((format!("{command} {var}={value:?}"), cmd));
            }
        }
    }

    let (mut accepted, mut refused) = (0, 0);
    for (what, mut cmd) in commands {
        let before = snapshot(db);
        let out = cmd
            .timeout(Duration::from_secs(20))
            .output()
            .unwrap_or_else(|e| panic!("{what}: did not finish: {e}"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.code().is_some() && out.status.code() != Some(101),
            "{what}: {:?}: {stderr}",
            out.status
        );
        assert!(!stderr.contains("panicked"), "{what}: {stderr}");
        match out.status.code() {
            Some(0) => accepted += 1,
            Some(1 | 2) => {
                refused += 1;
                let lines: Vec<&str> = stderr.lines().collect();
                assert_eq!(lines.len(), 1, "{what}: not one line: {stderr:?}");
                assert!(lines[0].starts_with("leasehold: "), "{what}: {stderr:?}");
                assert_eq!(snapshot(db), before, "{what} was refused but wrote");
            }
            other => panic!("{what}: exit {other:?}: {stderr}"),
        }
    }
    // Some values are legitimately valid (`--priority 9223372036854775807`,
    // `--reclaim-batch 0`), most are not.
    assert!(accepted > 0 && refused > accepted, "{accepted} {refused}");
}
