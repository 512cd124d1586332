//! Retention in a running runner: the sweeper prunes finished jobs on its cadence and says so
//! in one log line; running and pending jobs stay.

use std::time::Duration;

use leasehold::{Job, Retention, Status};

use crate::helper::fast;
use crate::util::{RunnerProcess, TestDb, wait_for};

#[test]
fn the_sweeper_prunes_finished_jobs_and_logs_a_line() {
    let t = TestDb::new();
    let store = t.store();
    let ids = store.enqueue_many(&vec![Job::shell("true"); 20]).unwrap();
    let sleeper = store.enqueue(&Job::shell("sleep 30")).unwrap();
    let later = store
        .enqueue(&Job::shell("true").delay(Duration::from_secs(3600)))
        .unwrap();
    let mut runner = RunnerProcess::start(
        &t.path,
        &[
            "--sweep",
            "0.2",
            "--keep-succeeded",
            "0",
            "--kill-grace",
            "0.1",
            "--shutdown-grace",
            "0.1",
        ],
    );
    wait_for(
        "the finished jobs to be pruned",
        Duration::from_secs(30),
        || {
            let left = ids.iter().filter(|&&id| store.job(id).is_ok()).count();
            (left == 0).then_some(())
        },
    );
    wait_for("the prune's log line", Duration::from_secs(10), || {
        runner
            .log()
            .lines()
            .any(|l| l.contains("prune jobs=") && l.contains("bytes_freed="))
            .then_some(())
    });
    // The running and the pending (delayed) jobs stay.
    wait_for("the sleeper to run", Duration::from_secs(10), || {
        (store.job(sleeper).ok()?.status == Status::Running).then_some(())
    });
    assert_eq!(store.job(later).unwrap().status, Status::Pending);
    runner.signal(nix::sys::signal::Signal::SIGTERM);
    let (code, log) = runner.wait(Duration::from_secs(30));
    assert_eq!(code, Some(0), "{log}");
}

#[test]
fn an_embedded_runner_prunes_with_its_builder_policy() {
    let t = TestDb::new();
    let runner = fast(&t.path)
        .retention(Retention::keep_all().keep_max(Some(3)))
        .start()
        .unwrap();
    let ids: Vec<i64> = (0..10)
        .map(|_| runner.enqueue(&Job::shell("true")).unwrap())
        .collect();
    for &id in &ids {
        let _ = runner.wait(id, Duration::from_secs(30));
    }
    let store = t.store();
    wait_for(
        "all but 3 finished jobs pruned",
        Duration::from_secs(30),
        || {
            let c = store.counts().ok()?;
            (c.succeeded <= 3 && c.pending == 0 && c.running == 0).then_some(())
        },
    );
    assert_eq!(store.counts().unwrap().succeeded, 3);
    runner.shutdown().unwrap();
}
