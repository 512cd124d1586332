//! Shutdown: running jobs are killed and requeued without spending their budget.

use std::time::{Duration, Instant};

use leasehold::{Status, Store};

use crate::helper::stubborn_job;
use crate::util::{TestDb, group_members, kinds};

#[test]
fn shutdown_kills_running_jobs_and_requeues_them_without_spending_budget() {
    let db = TestDb::new();
    let (runner, id, pgid) = stubborn_job(&db);
    let started = Instant::now();
    runner
        .shutdown_within(Duration::from_millis(200))
        .expect("shutdown");
    // Grace, then TERM and KILL after the kill grace, with room for a slow machine.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(group_members(pgid).is_empty());
    let rec = db.job(id);
    assert_eq!(rec.status, Status::Pending);
    assert_eq!(rec.recovery_count, 0);
    assert!(kinds(&db.store(), id).contains(&"interrupted".to_string()));
    let runners = Store::open(&db.path).unwrap().runners().unwrap();
    assert!(
        runners.is_empty(),
        "the runner is recorded as stopped: {runners:?}"
    );
}

/// `Runner::abort` returns only once each killed attempt's ending is committed: a caller
/// that exits right after it (as `leasehold run` does on a second signal) leaves its jobs
/// pending, not running until their leases run out. Before this was fixed, abort could
/// return when the worker had queued its ending, inside the writer's linger, and the job was
/// still running in the file (seen in about 1 round of 20, so the test takes several).
#[test]
fn abort_returns_once_the_killed_attempts_are_given_back() {
    for round in 0..4 {
        let db = TestDb::new();
        let (runner, id, pgid) = stubborn_job(&db);
        assert!(runner.abort(Duration::from_secs(20)), "the attempt ended");
        // Read before the runner is dropped: nothing after abort may do the write.
        let rec = db.job(id);
        assert_eq!(
            (rec.status, rec.recovery_count),
            (Status::Pending, 0),
            "round {round}: {rec:?}"
        );
        assert!(group_members(pgid).is_empty());
        drop(runner);
    }
}
