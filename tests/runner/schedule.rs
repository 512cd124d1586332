//! Schedules through the runner's API: a schedule stored by the runner wakes its firer, and
//! its jobs run; a unique job enqueued twice runs once.

use std::time::Duration;

use leasehold::{Job, ListFilter, Outcome, Overlap, Schedule, Status, Store};

use crate::helper::{fast, outcome};
use crate::util::{TestDb, wait_for};

/// A runner that polls only every 30 s: whatever starts sooner was not found by the poll.
fn slow_poll(db: &TestDb) -> leasehold::Runner {
    fast(&db.target())
        .poll_interval(Duration::from_secs(30))
        .start()
        .expect("start")
}

#[test]
fn a_job_to_run_later_starts_on_time_without_a_poll() {
    let db = TestDb::new();
    let runner = slow_poll(&db);
    // Another job first, so that the dispatcher has claimed and gone to sleep before the
    // delayed job is enqueued by a second store (its poke wakes the dispatcher, which must
    // then sleep until the job is due, not for the poll).
    let first = runner.enqueue(&Job::shell("true")).unwrap();
    assert!(matches!(outcome(&runner, first), Outcome::Succeeded));
    let store = Store::open(&db.path).unwrap();
    let id = store
        .enqueue(&Job::shell("true").delay(Duration::from_millis(1200)))
        .unwrap();
    assert!(matches!(outcome(&runner, id), Outcome::Succeeded));
    let job = store.job(id).unwrap();
    let started = job.started_at.expect("started");
    let late = started - job.scheduled_at;
    // The goal is a few milliseconds; the deadline is generous, far below the 30 s poll.
    assert!(
        (0..1000).contains(&late),
        "started {late} ms after it was due"
    );
    runner.shutdown().unwrap();
}

crate::on_both! {
    fn a_schedule_put_through_the_runner_fires_and_its_jobs_run(db) {
        let runner = fast(&db.target()).start().expect("start");
        let s = Schedule::cron("*/1 * * * * *")
            .unwrap()
            .overlap(Overlap::Allow)
            .job(Job::shell("echo tick"));
        let rec = runner.put_schedule("tick", &s).unwrap();
        assert!(rec.next_slot_at.is_some());
        let store = Store::open(db.target()).unwrap();
        let done = wait_for("two slots to run", Duration::from_secs(20), || {
            let done: Vec<_> = store
                .list(&ListFilter {
                    status: Some(Status::Succeeded),
                    ..ListFilter::default()
                })
                .unwrap()
                .into_iter()
                .filter(|j| j.schedule.as_deref() == Some("tick"))
                .collect();
            (done.len() >= 2).then_some(done)
        });
        assert!(
            done.iter()
                .all(|j| j.slot_at.is_some_and(|s| s % 1000 == 0))
        );
        // Paused: nothing more is enqueued.
        runner.pause_schedule("tick").unwrap();
        let count = |store: &Store| {
            store
                .list(&ListFilter::default())
                .unwrap()
                .iter()
                .filter(|j| j.schedule.as_deref() == Some("tick"))
                .count()
        };
        let paused_at = count(&store);
        std::thread::sleep(Duration::from_millis(2500));
        assert_eq!(count(&store), paused_at, "a paused schedule fired");
        runner.remove_schedule("tick").unwrap();
        assert!(store.schedules().unwrap().is_empty());
        runner.shutdown().unwrap();
    }

    fn a_unique_job_enqueued_twice_through_the_runner_runs_once(db) {
        let runner = fast(&db.target()).start().expect("start");
        let job = Job::shell("sleep 1").unique_key("once");
        let first = runner.enqueue_unique(&job).unwrap();
        let second = runner.enqueue_unique(&job).unwrap();
        assert!(!first.duplicate);
        assert_eq!((second.id, second.duplicate), (first.id, true));
        assert_eq!(outcome(&runner, first.id), Outcome::Succeeded);
        let again = runner.enqueue_unique(&job).unwrap();
        assert!(!again.duplicate, "a finished job frees its key");
        runner.shutdown().unwrap();
    }

    fn a_retry_starts_when_its_backoff_ends_without_a_poll(db) {
        let runner = slow_poll(&db);
        let id = runner
            .enqueue(
                &Job::shell("exit 3")
                    .max_attempts(2)
                    .backoff(Duration::from_millis(1200), Duration::from_millis(1200)),
            )
            .unwrap();
        assert!(matches!(outcome(&runner, id), Outcome::Failed { .. }));
        let store = Store::open(db.target()).unwrap();
        let job = store.job(id).unwrap();
        assert_eq!(job.attempt, 2);
        // The second attempt's claim is when it started; the retry set scheduled_at to the end
        // of the backoff.
        let started = job.started_at.expect("started");
        let late = started - job.scheduled_at;
        assert!(
            (0..1000).contains(&late),
            "the retry started {late} ms after its backoff ended"
        );
        runner.shutdown().unwrap();
    }
}
