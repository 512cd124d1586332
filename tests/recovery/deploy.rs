//! Where deployments run (docs/deploy.md): a runner that is PID 1 of its PID namespace warns
//! that its keepers die with it, and the systemd unit the page gives is one systemd accepts.

use std::process::{Child, Command, Stdio};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::helper::{Case, WAIT, args};
use crate::util::{leasehold_vars, poll};

/// What the warning says, in part.
const WARNING: &str = "is PID 1 of its PID namespace";

/// A child killed by pid and reaped when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.0.id() as i32), Signal::SIGKILL);
        let _ = self.0.wait();
    }
}

#[test]
fn a_runner_that_is_pid_1_of_its_namespace_warns_that_its_keepers_die_with_it() {
    let mut c = Case::new();
    let log_path = c.db.sibling("pid1.log");
    let mut cmd = Command::new("unshare");
    // `--fork`: unshare's child, which becomes the runner, is PID 1 of the namespace.
    cmd.args(["--pid", "--fork", "--kill-child", "--mount-proc"])
        .arg(assert_cmd::cargo::cargo_bin("leasehold"))
        .arg("--db")
        .arg(&c.db.path)
        .arg("run")
        .args(args(&[]));
    for var in leasehold_vars() {
        cmd.env_remove(var);
    }
    let (k, v) = c.marker.split_once('=').unwrap();
    let spawned = cmd
        .env(k, v)
        .env("RUST_LOG", "leasehold=info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).expect("the log file can be created"))
        .spawn();
    let mut unshare = match spawned {
        Ok(child) => Killed(child),
        Err(e) => return eprintln!("SKIPPED: cannot run unshare: {e}"),
    };
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let started = poll(WAIT, || {
        if let Ok(Some(status)) = unshare.0.try_wait() {
            return Some(Err(status));
        }
        log().contains("started:").then_some(Ok(()))
    });
    match started {
        Some(Ok(())) => {}
        Some(Err(status)) if !nix::unistd::geteuid().is_root() => {
            return eprintln!(
                "SKIPPED: unshare --pid is refused here ({status}): {}",
                log()
            );
        }
        other => panic!("the runner did not start ({other:?}):\n{}", log()),
    }
    let text = log();
    for part in [WARNING, "--init", "tini", "shareProcessNamespace"] {
        assert!(text.contains(part), "no {part:?} in:\n{text}");
    }
    // Its own runner's pid is not 1: the same runner outside a namespace says nothing.
    let plain = c.start_runner(&args(&[]));
    let plain_log = poll(WAIT, || {
        let l = c.log(plain);
        l.contains("started:").then_some(l)
    })
    .unwrap_or_else(|| panic!("the plain runner did not start:\n{}", c.log(plain)));
    assert!(!plain_log.contains(WARNING), "{plain_log}");
}

/// The first ```ini block of docs/deploy.md: the unit the page gives.
fn documented_unit() -> String {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/deploy.md"))
        .expect("docs/deploy.md is readable");
    let start = page
        .find("```ini\n")
        .expect("docs/deploy.md has an ```ini block")
        + 7;
    let len = page[start..].find("```").expect("the ```ini block ends");
    page[start..start + len].to_string()
}

#[test]
fn the_documented_systemd_unit_passes_systemd_analyze_verify() {
    let unit = documented_unit();
    for line in ["KillMode=process", "Delegate=yes", "--on-exit leave"] {
        assert!(unit.contains(line), "no {line:?} in the unit:\n{unit}");
    }
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        return eprintln!("SKIPPED: no systemd-analyze here to verify the unit with");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    // The unit's program must exist for verify: this build's.
    let binary = assert_cmd::cargo::cargo_bin("leasehold");
    let unit = unit.replace("/usr/local/bin/leasehold", &binary.to_string_lossy());
    let path = dir.path().join("leasehold.service");
    std::fs::write(&path, &unit).expect("the unit can be written");
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // verify exits 0 with a setting it ignores; it names the unit's file in what it says of it.
    let about_unit: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("leasehold.service"))
        .collect();
    assert!(
        out.status.success() && about_unit.is_empty(),
        "systemd-analyze verify ({}):\n{stderr}\nunit:\n{unit}",
        out.status
    );
}
