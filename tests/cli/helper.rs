//! What the CLI tests share: the binary without the caller's settings, and running it for its
//! output, its JSON or its refusal.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use assert_cmd::Command;
use nix::sys::signal::Signal;
use serde_json::Value;

use crate::util::{RunnerProcess, leasehold_vars, wait_until};

/// The runner settings that make a test fast: a short lease, quick heartbeats and sweeps.
pub const FAST: [&str; 8] = [
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
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// The binary, with none of the caller's leasehold settings or log filter.
pub fn bin() -> Command {
    let mut cmd = Command::cargo_bin("leasehold").expect("the leasehold binary is built");
    for var in leasehold_vars() {
        cmd.env_remove(var);
    }
    cmd.timeout(COMMAND_TIMEOUT);
    cmd
}

/// The binary on the database `db`, with `args`.
pub fn cli(db: &Path, args: &[&str]) -> Command {
    let mut cmd = bin();
    cmd.arg("--db").arg(db).args(args);
    cmd
}

/// Runs the command and checks it succeeded; returns its stdout.
pub fn ok(cmd: &mut Command) -> String {
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
pub fn json(cmd: &mut Command) -> Value {
    let stdout = ok(cmd);
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{cmd:?}: {e}: {stdout}"))
}

/// Runs the command, checks it exits with `code` and says why in exactly one line on stderr,
/// without a panic; returns that line.
pub fn fails(cmd: &mut Command, code: i32) -> String {
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
pub fn add(db: &Path, options: &[&str], argv: &[&str]) -> i64 {
    let mut args = vec!["jobs", "add", "--json"];
    args.extend_from_slice(options);
    args.push("--");
    args.extend_from_slice(argv);
    json(&mut cli(db, &args))["id"]
        .as_i64()
        .expect("jobs add --json prints an id")
}

/// `jobs inspect ID --json`.
pub fn inspect(db: &Path, id: i64) -> Value {
    json(&mut cli(
        db,
        &["jobs", "inspect", &id.to_string(), "--json"],
    ))
}

/// Runs a runner with the fast settings until no job is left.
pub fn run_until_idle(db: &Path, extra: &[&str]) {
    let mut args = vec!["run", "--until-idle"];
    args.extend_from_slice(&FAST);
    args.extend_from_slice(extra);
    ok(&mut cli(db, &args));
}

/// Polls `jobs inspect` until the job is running with its process started.
pub fn wait_running(db: &Path, id: i64) -> Value {
    let mut job = Value::Null;
    let started = wait_until(Duration::from_secs(15), || {
        job = inspect(db, id);
        job["status"] == "running" && job["pid"].is_i64()
    });
    assert!(started, "job {id} did not start: {job}");
    job
}

/// A runner on `db` serving only the queue `elsewhere`, once it has registered (a commit into
/// the WAL its connections keep open).
pub fn idle_runner(db: &Path) -> RunnerProcess {
    let mut args = FAST.to_vec();
    args.extend(["--queue", "elsewhere"]);
    let runner = RunnerProcess::start(db, &args);
    assert!(
        wait_until(Duration::from_secs(10), || {
            let v: serde_json::Value =
                serde_json::from_str(&ok(&mut cli(db, &["status", "--json"]))).unwrap();
            v["runners"].as_array().is_some_and(|r| r.len() == 1)
        }),
        "the runner registers"
    );
    runner
}

/// Stops a runner with SIGTERM and checks it exits 0.
pub fn stop(mut runner: RunnerProcess) {
    runner.signal(Signal::SIGTERM);
    assert_eq!(runner.wait(Duration::from_secs(10)).0, Some(0));
}

/// A system user made for one test with `useradd`, removed with `userdel` when dropped, even
/// when the test fails.
pub struct OtherUser {
    pub name: String,
    pub uid: u32,
}

impl OtherUser {
    pub fn new() -> OtherUser {
        // Unique on the machine: this process's pid and a count (user names are at most 32
        // characters).
        static MADE: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "lh-test-{}-{}",
            std::process::id(),
            MADE.fetch_add(1, Ordering::Relaxed)
        );
        let out = std::process::Command::new("useradd")
            .args(["-M", "-r", "-s", "/usr/sbin/nologin", &name])
            .output()
            .expect("useradd runs");
        assert!(
            out.status.success(),
            "useradd {name} was refused (these tests need root, as CI runs them): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Made: from here on, dropping it removes it.
        let mut user = OtherUser { name, uid: 0 };
        let out = std::process::Command::new("id")
            .args(["-u", &user.name])
            .output()
            .expect("id runs");
        user.uid = String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("no uid for {}: {out:?}", user.name));
        assert_ne!(user.uid, nix::unistd::Uid::effective().as_raw());
        user
    }
    /// Runs `script` with bash as this user (`runuser`); returns its stdout.
    pub fn bash(&self, script: &str) -> String {
        let out = std::process::Command::new("runuser")
            .args(["-u", &self.name, "--", "bash", "-c", script])
            .output()
            .expect("runuser runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for OtherUser {
    fn drop(&mut self) {
        let out = std::process::Command::new("userdel")
            .arg(&self.name)
            .output();
        if !out.as_ref().is_ok_and(|o| o.status.success()) {
            eprintln!("userdel {} failed: {out:?}", self.name);
        }
    }
}
