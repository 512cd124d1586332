//! Graceful shutdown on SIGTERM: running jobs are killed and requeued.

use std::time::{Duration, Instant};

use leasehold::{Job, Status};
use nix::sys::signal::Signal;

use crate::helper::{Case, WAIT, args};
use crate::util::group_alive;

#[test]
fn sigterm_shuts_down_gracefully_and_requeues_running_jobs() {
    let mut c = Case::new();
    let ids: Vec<i64> = (0..2)
        .map(|_| c.enqueue(Job::shell("trap '' TERM; sleep 300")))
        .collect();
    let r = c.start_runner(&args(&["--lease-ttl", "30"]));
    let pgids: Vec<i64> = ids
        .iter()
        .map(|&id| c.running(id, 1).pgid.unwrap())
        .collect();
    let asked = Instant::now();
    c.signal(r, Signal::SIGTERM);
    let (code, log) = c.runners[r].wait(WAIT);
    let took = asked.elapsed();
    assert_eq!(code, Some(0), "{log}");
    // Shutdown grace 0.5 s plus kill grace 0.5 s, with room for a slow machine.
    assert!(took < Duration::from_secs(4), "took {took:?}");
    for (&id, &pgid) in ids.iter().zip(&pgids) {
        assert!(!group_alive(pgid));
        let j = c.job(id);
        assert_eq!(j.status, Status::Pending);
        assert_eq!(j.recovery_count, 0);
    }
}

/// A second SIGTERM while the shutdown waits out its grace forces the exit: the attempts'
/// groups are killed now and the command exits 1. Before this was fixed, the second signal
/// was ignored and the runner waited out the whole grace.
#[test]
fn a_second_sigterm_during_the_shutdown_kills_the_jobs_and_exits_1() {
    let mut c = Case::new();
    let id = c.enqueue(Job::shell("trap '' TERM; sleep 300"));
    let r = c.start_runner(&[
        "--lease-ttl",
        "30",
        "--heartbeat",
        "0.5",
        "--kill-grace",
        "0.5",
        "--shutdown-grace",
        "300",
    ]);
    let pgid = c.running(id, 1).pgid.unwrap();
    c.signal(r, Signal::SIGTERM);
    c.wait_for("the shutdown to begin", |c| {
        c.log(r).contains("shutting down").then_some(())
    });
    c.signal(r, Signal::SIGTERM);
    let (code, log) = c.runners[r].wait(WAIT);
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("received again"), "{log}");
    assert!(!group_alive(pgid), "the job's group was killed");
    // Given back without spending its recovery budget.
    let j = c.job(id);
    assert_eq!((j.status, j.recovery_count), (Status::Pending, 0), "{j:?}");
}
