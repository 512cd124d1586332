//! The write lock is shared with renewals: an operator's bulk command beside a runner with a
//! short lease never holds it past the runner's renewal, so the runner's attempt runs on.

use std::process::Command;
use std::time::Instant;

use leasehold::{Job, OnLost, Status, now_ms};

use crate::helper::Case;
use crate::util::{bare, leasehold_vars};

/// Lines of the bulk `jobs add --from-file`: about 4 s in one transaction on the unfixed
/// code on a quiet machine (300,000 took 19.8 s on a busy one), past the runner's 2 s lease.
const LINES: usize = 60_000;
/// Failed jobs that exhausted their recovery budget, for `jobs retry --failed-stale --all`:
/// about 3 s in one transaction on the unfixed code (20,000 took 12.7 s).
const STALE: usize = 5_000;

/// Runs the CLI on the case's file; returns its stdout, failing with its stderr.
fn leasehold(c: &Case, args: &[&str]) -> String {
    let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("leasehold"));
    cmd.arg("--db").arg(&c.db.path).args(args);
    for var in leasehold_vars() {
        cmd.env_remove(var);
    }
    let started = Instant::now();
    let out = cmd.output().expect("the command runs");
    eprintln!("leasehold {args:?}: {:?}", started.elapsed());
    assert!(out.status.success(), "{args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn bulk_add_and_bulk_retry_beside_a_short_lease_do_not_fence_the_runner() {
    let mut c = Case::new();
    // The failed-stale jobs, in a queue the runner does not serve, before it starts.
    let store = c.store();
    let stale: Vec<Job> = (0..STALE)
        .map(|_| Job::shell("true").queue("bulk"))
        .collect();
    store.enqueue_many(&stale).unwrap();
    drop(store);
    bare(&c.db.path)
        .execute(
            "UPDATE jobs SET status = 'failed', completed_at = ?1, recovery_count = 4,
                 error_kind = 'lost',
                 last_error = 'lease expired after missing heartbeat; recovery budget spent'
             WHERE queue = 'bulk'",
            [now_ms()],
        )
        .unwrap();

    // Runs until the test is done with the bulk commands; a lost attempt fails for good.
    let id =
        c.enqueue(Job::shell("while [ ! -e done ]; do sleep 0.05; done").on_lost(OnLost::Fail));
    let r = c.start_runner(&[
        "--workers",
        "1",
        "--lease-ttl",
        "2",
        "--heartbeat",
        "0.5",
        "--sweep",
        "0.5",
        "--kill-grace",
        "0.5",
        "--queue",
        "default",
    ]);
    c.running(id, 1);

    let file = c.db.sibling("lines.txt");
    let lines: String = (0..LINES).map(|i| format!("true {i}\n")).collect();
    std::fs::write(&file, lines).unwrap();
    let added = leasehold(
        &c,
        &[
            "jobs",
            "add",
            "--queue",
            "bulk",
            "--from-file",
            file.to_str().unwrap(),
        ],
    );
    assert_eq!(added.trim(), LINES.to_string());
    let retried = leasehold(&c, &["jobs", "retry", "--failed-stale", "--all", "--json"]);
    let retried: serde_json::Value = serde_json::from_str(&retried).unwrap();
    assert_eq!(retried["retried"].as_array().map(Vec::len), Some(STALE));

    std::fs::write(c.db.dir.path().join("done"), "").unwrap();
    let done = c.ended(id);
    assert_eq!(
        (done.status, done.attempt, done.recovery_count),
        (Status::Succeeded, 1, 0),
        "{done:?}\nrunner log:\n{}",
        c.log(r)
    );
    assert!(c.runners[r].running(), "the runner survived");
    assert!(
        !c.log(r).contains("cannot renew its lease"),
        "the runner never fenced itself: {}",
        c.log(r)
    );
    let pending: i64 = bare(&c.db.path)
        .query_row(
            "SELECT count(*) FROM jobs WHERE queue = 'bulk' AND status = 'pending'
                 AND waiting = 0",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(pending, (LINES + STALE) as i64, "every bulk job is ready");
}
