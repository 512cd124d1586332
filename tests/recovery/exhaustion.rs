//! A runner short of descriptors: a job that cannot start for want of the runner's own
//! resources is given back and runs later, never failed as `spawn`.

use std::process::{Child, Command, Stdio};

use leasehold::{ErrorKind, Job, Status};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::helper::Case;

/// A `leasehold run` started through `prlimit` (which sets the limit, then execs it, so the
/// pid is the runner's), killed by pid when dropped.
struct Limited(Child);

impl Drop for Limited {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.0.id() as i32), Signal::SIGKILL);
        let _ = self.0.wait();
    }
}

#[test]
fn jobs_that_cannot_start_for_want_of_descriptors_are_given_back_and_run_later() {
    let c = Case::new();
    if Command::new("prlimit").arg("--version").output().is_err() {
        eprintln!("skipped: no prlimit(1) to lower the runner's descriptor limit");
        return;
    }
    let ids: Vec<i64> = (0..30)
        .map(|_| c.enqueue(Job::shell("sleep 0.1")))
        .collect();
    let log_path = c.db.sibling("limited.log");
    let (k, v) = c.marker.split_once('=').unwrap();
    // 40 descriptors, soft and hard (the runner raises soft to hard): an idle runner uses
    // about 20, each running attempt 3 or 4, so 50 workers run out at once.
    let mut cmd = Command::new("prlimit");
    cmd.arg("--nofile=40:40")
        .arg("--")
        .arg(assert_cmd::cargo::cargo_bin("leasehold"))
        .arg("--db")
        .arg(&c.db.path)
        .args([
            "run",
            "--workers",
            "50",
            "--lease-ttl",
            "5",
            "--heartbeat",
            "1",
            "--kill-grace",
            "0.5",
        ]);
    for var in crate::util::leasehold_vars() {
        cmd.env_remove(var);
    }
    let _runner = Limited(
        cmd.env(k, v)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .expect("prlimit starts the runner"),
    );
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let mut spawn_failures = Vec::new();
    for &id in &ids {
        let done = c.wait_for(&format!("job {id} to end"), |c| {
            let j = c.job(id);
            j.status.is_terminal().then_some(j)
        });
        if done.error_kind == Some(ErrorKind::Spawn) {
            spawn_failures.push((id, done.last_error.clone()));
        }
        assert!(
            done.status == Status::Succeeded || done.error_kind == Some(ErrorKind::Spawn),
            "{done:?}\n{}",
            log()
        );
    }
    assert!(
        spawn_failures.is_empty(),
        "{} job(s) failed for good as `spawn` for want of the runner's descriptors: {:?}",
        spawn_failures.len(),
        &spawn_failures[..spawn_failures.len().min(3)]
    );
    assert!(log().contains("out of resources"), "{}", log());
}
