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
