//! Flow control in one runner: its own per-queue limits, the pauses and dependencies stored
//! in the file, checked from the jobs' own clocks.

use leasehold::{Job, Outcome, Status};

use crate::helper::{fast, outcome, running};
use crate::util::{TestDb, max_overlap, spans, timed};

#[test]
fn a_limited_queue_never_runs_more_than_its_limit_and_the_others_fill_the_pool() {
    let db = TestDb::new();
    let times = db.sibling("times");
    std::fs::create_dir(&times).unwrap();
    let store = db.store();
    // Enqueued before the runner starts, the limited queue's jobs first in claim order.
    let media = store
        .enqueue_many(&vec![timed(&times, "0.4").queue("media"); 20])
        .unwrap();
    let other = store
        .enqueue_many(&vec![timed(&times, "0.4").queue("other"); 20])
        .unwrap();
    let runner = fast(&db.path)
        .workers(6)
        .queue("media", 2)
        .queue("other", None)
        .start()
        .unwrap();
    for &id in media.iter().chain(&other) {
        assert_eq!(outcome(&runner, id), Outcome::Succeeded, "job {id}");
    }
    runner.shutdown().unwrap();

    let media = spans(&times, &media);
    let other = spans(&times, &other);
    assert_eq!(
        max_overlap(&media),
        2,
        "the limited queue ran at its limit, not over it"
    );
    // The four other workers never idled while the limited queue held two.
    assert!(max_overlap(&other) >= 4, "{}", max_overlap(&other));
    let all: Vec<_> = media.iter().chain(&other).copied().collect();
    assert_eq!(max_overlap(&all), 6);
}

#[test]
fn a_paused_queue_waits_while_others_run_and_resume_releases_it() {
    let db = TestDb::new();
    let store = db.store();
    store.pause_queue("sync").unwrap();
    let runner = fast(&db.path).start().unwrap();
    let held: Vec<i64> = (0..3)
        .map(|_| runner.enqueue(&Job::shell("true").queue("sync")).unwrap())
        .collect();
    let free: Vec<i64> = (0..3)
        .map(|_| runner.enqueue(&Job::shell("true")).unwrap())
        .collect();
    for &id in &free {
        assert_eq!(outcome(&runner, id), Outcome::Succeeded);
    }
    // Enqueued before the free jobs, which all ran: the runner has claimed since, many times.
    for &id in &held {
        let job = db.job(id);
        assert_eq!((job.status, job.attempt), (Status::Pending, 0), "job {id}");
    }
    assert!(runner.has_unfinished().unwrap());

    // The runner's own call writes the same setting and wakes it.
    runner.resume_queue("sync").unwrap();
    for &id in &held {
        assert_eq!(outcome(&runner, id), Outcome::Succeeded);
    }
    runner.shutdown().unwrap();
}

crate::on_both! {
    fn a_running_job_of_a_queue_paused_under_it_finishes_normally(db) {
        let runner = fast(&db.target()).start().unwrap();
        let id = runner
            .enqueue(&Job::shell("sleep 0.5").queue("sync"))
            .unwrap();
        running(&db, id);
        runner.pause_queue("sync").unwrap();
        let next = runner.enqueue(&Job::shell("true").queue("sync")).unwrap();
        assert_eq!(outcome(&runner, id), Outcome::Succeeded);
        assert_eq!(db.job(next).status, Status::Pending);
        runner.shutdown().unwrap();
    }

    fn a_chain_and_a_diamond_run_after_their_parents(db) {
        let runner = fast(&db.target()).start().unwrap();
        let a = runner.enqueue(&Job::shell("sleep 0.2")).unwrap();
        let b = runner.enqueue(&Job::shell("true").after([a])).unwrap();
        let c = runner.enqueue(&Job::shell("true").after([b])).unwrap();
        let d = runner.enqueue(&Job::shell("sleep 0.3")).unwrap();
        let join = runner.enqueue(&Job::shell("true").after([c, d])).unwrap();
        assert_eq!(outcome(&runner, join), Outcome::Succeeded);
        runner.shutdown().unwrap();
        let job = |id| db.job(id);
        for (before, after) in [(a, b), (b, c), (c, join), (d, join)] {
            let (ended, started) = (
                job(before).completed_at.unwrap(),
                job(after).started_at.unwrap(),
            );
            assert!(
                ended <= started,
                "job {after} started at {started}, before job {before} ended at {ended}"
            );
        }
    }

    fn a_failure_cancels_the_jobs_after_it_with_the_reason(db) {
        let store = db.store();
        let runner = fast(&db.target()).start().unwrap();
        // Held until the chain is written: a job cannot name one that already failed.
        store.pause_queue("default").unwrap();
        let a = runner.enqueue(&Job::shell("exit 3")).unwrap();
        let b = runner.enqueue(&Job::shell("true").after([a])).unwrap();
        let c = runner.enqueue(&Job::shell("true").after([b])).unwrap();
        store.resume_queue("default").unwrap();
        assert_eq!(outcome(&runner, c), Outcome::Cancelled);
        assert!(matches!(outcome(&runner, a), Outcome::Failed { .. }));
        assert_eq!(outcome(&runner, b), Outcome::Cancelled);
        runner.shutdown().unwrap();
        let b = db.job(b);
        assert_eq!(b.last_error.unwrap(), format!("dependency job {a} failed"));
        assert_eq!(b.attempt, 0, "never ran");
        assert!(
            db.job(c)
                .last_error
                .unwrap()
                .starts_with(&format!("dependency job {} cancelled", b.id))
        );
    }
}
