//! Renewals under stress: a runner that cannot renew kills its attempt in time, and one whose
//! renewal is late never reaps its own job.

use std::time::{Duration, Instant};

use leasehold::{Job, Status, now_ms};

use crate::helper::{Case, PID_SCRIPT, WAIT, args};
use crate::util::{alive, bare, group_alive, wait_until};

#[test]
fn runner_that_cannot_renew_kills_its_attempt_before_the_lease_runs_out() {
    let mut c = Case::new();
    let id = c.enqueue(Job::shell(PID_SCRIPT));
    let r = c.start_runner(&args(&["--lease-ttl", "3"]));
    let first = c.running(id, 1);
    c.wait_for("the first pid", |c| {
        (!c.file("pids").is_empty()).then_some(())
    });
    let pid = first.pid.unwrap();

    let lock = bare(&c.db.path);
    lock.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let expires: i64 = lock
        .query_row(
            "SELECT lease_expires_at FROM jobs WHERE id = ?1",
            [id],
            |r| r.get(0),
        )
        .unwrap();
    let held = Instant::now();
    assert!(
        wait_until(WAIT, || !alive(pid)),
        "the attempt was never fenced"
    );
    let killed_at = now_ms();
    assert!(
        killed_at < expires,
        "killed {}ms after its lease ran out",
        killed_at - expires
    );
    // Hold the lock for twice the lease TTL in all.
    std::thread::sleep(Duration::from_secs(6).saturating_sub(held.elapsed()));
    lock.execute_batch("COMMIT").unwrap();
    drop(lock);

    let done = c.ended(id);
    assert_eq!(done.status, Status::Succeeded, "{done:?}");
    assert_eq!(done.recovery_count, 1);
    assert_eq!(c.file("overlap"), "");
    assert!(c.runners[r].running(), "the runner survived");
    assert!(
        c.log(r).contains("cannot renew its lease"),
        "the runner says why: {}",
        c.log(r)
    );
}

#[test]
fn runner_whose_renewal_is_late_never_reaps_its_own_job() {
    let mut c = Case::new();
    let id = c.enqueue(Job::shell("sleep 300"));
    // Renewals every 3 s, sweeps every 0.2 s: many of the runner's own sweeps fall between a
    // lease that looks expired and the renewal that fixes it.
    c.start_runner(&[
        "--workers",
        "1",
        "--lease-ttl",
        "9",
        "--heartbeat",
        "3",
        "--sweep",
        "0.2",
        "--kill-grace",
        "0.5",
        "--shutdown-grace",
        "0.5",
    ]);
    let first = c.running(id, 1);
    // Just after a renewal, make the lease look expired, as a renewal that comes late would
    // leave it.
    let renewed = c.wait_for("a renewal", |c| {
        let j = c.job(id);
        (j.heartbeat_at != first.heartbeat_at).then_some(j.heartbeat_at)
    });
    let expired_at = now_ms();
    rusqlite::Connection::open(&c.db.path)
        .unwrap()
        .execute(
            "UPDATE jobs SET lease_expires_at = ?2 WHERE id = ?1",
            rusqlite::params![id, expired_at - 1_000],
        )
        .unwrap();
    let renewal = c.wait_for("the next renewal", |c| {
        let j = c.job(id);
        (j.heartbeat_at != renewed).then_some(j)
    });
    eprintln!(
        "the lease looked expired for {} ms of sweeps every 200 ms",
        now_ms() - expired_at
    );
    assert_eq!(renewal.status, Status::Running, "{renewal:?}");
    assert_eq!(renewal.attempt, 1);
    assert_eq!(renewal.run_token, first.run_token);
    assert_eq!(renewal.recovery_count, 0);
    assert!(renewal.lease_expires_at.unwrap() > expired_at);
    assert!(!c.kinds(id).iter().any(|k| k == "reclaimed"));
    assert!(group_alive(first.pgid.unwrap()), "the attempt runs on");
}
