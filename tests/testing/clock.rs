//! Every clock-driven behaviour follows the test's clock: due times, delays, backoff, unique
//! windows, schedules, retention (a store's prune and a runner's sweeper), lease expiry and
//! reclaim.

use std::time::{Duration, Instant};

use leasehold::protocol::{ClaimRequest, ReclaimRequest};
use leasehold::testing::{Expected, Stub, TestDb};
use leasehold::{Job, ManualClock, OpenOptions, Retention, Runner, Schedule, Status, Store};

const HOUR: Duration = Duration::from_secs(3600);

#[test]
fn a_store_opened_on_the_test_path_reads_the_test_clock_and_others_do_not() {
    let db = TestDb::new();
    db.clock().set(1_000_000);
    let id = Store::open(db.path())
        .unwrap()
        .enqueue(&Job::shell("true"))
        .unwrap();
    assert_eq!(db.job(id).created_at, 1_000_000);
    let elsewhere = tempfile::tempdir().unwrap();
    let other = Store::open(elsewhere.path().join("jobs.db")).unwrap();
    assert!(!other.clock().is_manual());
    // A clock given as an option, on any file.
    let clock = ManualClock::new(42);
    let other = Store::open_with(
        elsewhere.path().join("jobs.db"),
        &OpenOptions::new().clock(&clock),
    )
    .unwrap();
    let id = other.enqueue(&Job::shell("true")).unwrap();
    assert_eq!(other.job(id).unwrap().created_at, 42);
}

#[test]
fn a_delayed_job_runs_once_the_clock_passes_its_delay() {
    let db = TestDb::new();
    let store = db.store();
    let id = store.enqueue(&Job::shell("true").delay(HOUR)).unwrap();
    db.assert_enqueued(&Expected::shell("true").due_at(db.clock().now_ms() + 3_600_000));
    assert!(db.drain_with(|_| Stub::Succeed).ended.is_empty());
    db.clock().advance(HOUR - Duration::from_millis(1));
    assert!(db.drain_with(|_| Stub::Succeed).ended.is_empty());
    db.clock().advance(Duration::from_millis(1));
    let drained = db.drain_with(|_| Stub::Succeed);
    assert_eq!(drained.outcome(id), Some(leasehold::Outcome::Succeeded));
}

#[test]
fn a_retry_waits_out_its_backoff_on_the_test_clock() {
    let db = TestDb::new();
    let id = db
        .store()
        .enqueue(
            &Job::shell("flaky")
                .max_attempts(3)
                .backoff(Duration::from_secs(60), HOUR),
        )
        .unwrap();
    let mut attempts = 0;
    let mut stub = |j: &leasehold::JobRecord| {
        attempts += 1;
        if j.attempt < 3 {
            Stub::Fail { exit_code: 1 }
        } else {
            Stub::Succeed
        }
    };
    assert!(db.drain_with(&mut stub).ended.is_empty());
    // The first retry waits 60 s ± 20%: not before 48 s, by 72 s.
    let due = db.job(id).scheduled_at - db.clock().now_ms();
    assert!((48_000..=72_000).contains(&due), "first backoff {due} ms");
    db.clock()
        .advance(Duration::from_millis(u64::try_from(due).unwrap() - 1));
    assert!(db.drain_with(&mut stub).ended.is_empty());
    db.clock().advance(Duration::from_millis(1));
    assert!(
        db.drain_with(&mut stub).ended.is_empty(),
        "the second attempt fails too"
    );
    db.clock().advance(Duration::from_secs(150));
    let drained = db.drain_with(&mut stub);
    assert_eq!(drained.outcome(id), Some(leasehold::Outcome::Succeeded));
    assert_eq!(attempts, 3);
}

#[test]
fn a_unique_window_closes_on_the_test_clock() {
    let db = TestDb::new();
    let store = db.store();
    let job = Job::shell("sync")
        .unique_key("sync")
        .unique_window(Duration::from_secs(30));
    let first = store.enqueue_unique(&job).unwrap();
    db.drain_with(|_| Stub::Succeed);
    db.clock().advance(Duration::from_secs(29));
    let again = store.enqueue_unique(&job).unwrap();
    assert!(again.duplicate);
    assert_eq!(again.id, first.id);
    db.clock().advance(Duration::from_secs(1));
    let later = store.enqueue_unique(&job).unwrap();
    assert!(!later.duplicate);
    db.assert_enqueued_times(&Expected::shell("sync").unique_key("sync"), 1);
}

#[test]
fn an_hourly_schedule_fires_24_times_over_a_day_advanced_in_steps() {
    let db = TestDb::new();
    let store = db.store();
    store
        .put_schedule("hourly", &Schedule::every(HOUR).job(Job::shell("report")))
        .unwrap();
    let started = Instant::now();
    let mut fired = 0;
    // A day in steps of 20 minutes: each hour's slot fires once, at the step that passes it.
    for _ in 0..72 {
        db.clock().advance(Duration::from_secs(20 * 60));
        fired += store.fire_due().unwrap().enqueued;
        db.drain_with(|_| Stub::Succeed);
    }
    assert_eq!(fired, 24);
    let ran = store
        .list(&leasehold::ListFilter {
            status: Some(Status::Succeeded),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(ran.len(), 24);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_runners_firer_fires_a_slot_the_test_clock_reaches() {
    let db = TestDb::new();
    db.store()
        .put_schedule("hourly", &Schedule::every(HOUR).job(Job::shell("true")))
        .unwrap();
    let runner = Runner::builder(db.path()).start().unwrap();
    db.clock().advance(HOUR);
    let deadline = Instant::now() + Duration::from_secs(60);
    while db.store().counts().unwrap().succeeded < 1 {
        assert!(
            Instant::now() < deadline,
            "the slot never fired: {:?} {:?}",
            db.store().schedules().unwrap(),
            db.enqueued()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    runner.shutdown().unwrap();
}

#[test]
fn retention_prunes_by_the_test_clock() {
    let db = TestDb::new();
    let store = db.store();
    let id = store.enqueue(&Job::shell("true")).unwrap();
    db.drain_with(|_| Stub::Succeed);
    let policy = Retention::keep_all().succeeded(Some(Duration::from_secs(86_400)));
    db.clock().advance(Duration::from_secs(86_399));
    assert_eq!(store.prune(&policy).unwrap().jobs, 0);
    db.clock().advance(Duration::from_secs(2));
    assert_eq!(store.prune(&policy).unwrap().jobs, 1);
    assert!(store.job(id).is_err());
}

#[test]
fn a_runners_sweeper_prunes_by_the_test_clock() {
    let db = TestDb::new();
    let store = db.store();
    let old = store.enqueue(&Job::shell("true")).unwrap();
    db.drain_with(|_| Stub::Succeed);
    db.clock().advance(Duration::from_secs(12 * 3600));
    let newer = store.enqueue(&Job::shell("true")).unwrap();
    db.drain_with(|_| Stub::Succeed);
    let runner = Runner::builder(db.path())
        .retention(Retention::keep_all().succeeded(Some(Duration::from_secs(86_400))))
        .sweep_interval(Duration::from_millis(100))
        .start()
        .unwrap();
    // A day and a second after the first ended, on the test clock: its sweeps prune it, and
    // not the one that ended 12 hours later, in the same statement.
    db.clock().advance(Duration::from_secs(12 * 3600 + 1));
    let deadline = Instant::now() + Duration::from_secs(60);
    while store.job(old).is_ok() {
        assert!(Instant::now() < deadline, "never pruned: {:?}", db.job(old));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(db.job(newer).status, Status::Succeeded);
    runner.shutdown().unwrap();
}

/// A lease taken by a worker that then vanished.
fn abandoned_claim(store: &Store, ttl: Duration) -> i64 {
    let claimed = store
        .claim(
            &ClaimRequest {
                worker_id: "gone",
                limit: 1,
                queues: &[],
                lease_ttl: ttl,
                queue_caps: &[],
                unheld: 0,
            },
            store.clock().now_ms(),
        )
        .unwrap();
    claimed[0].id
}

#[test]
fn a_lease_expires_on_the_test_clock_and_is_reclaimed() {
    let db = TestDb::new();
    let store = db.store();
    let id = store.enqueue(&Job::shell("true")).unwrap();
    let ttl = Duration::from_secs(30);
    abandoned_claim(&store, ttl);
    let reclaim = |store: &Store| {
        store
            .reclaim(
                &ReclaimRequest {
                    max_recovery_attempts: 3,
                    batch: 100,
                    exclude_worker: None,
                    held_tokens: None,
                    dead_workers: &[],
                    expired: true,
                    keepers: None,
                    lease_ttl: ttl,
                },
                store.clock().now_ms(),
            )
            .unwrap()
    };
    db.clock().advance(ttl);
    assert!(
        reclaim(&store).reclaimed.is_empty(),
        "a lease is live up to its expiry"
    );
    db.clock().advance(Duration::from_millis(1));
    assert_eq!(reclaim(&store).reclaimed.len(), 1);
    let job = db.job(id);
    assert_eq!((job.status, job.recovery_count), (Status::Pending, 1));
}

#[test]
fn a_runners_sweeper_reclaims_a_lease_the_test_clock_expired() {
    let db = TestDb::new();
    let store = db.store();
    let id = store.enqueue(&Job::shell("true")).unwrap();
    abandoned_claim(&store, Duration::from_secs(30));
    let runner = Runner::builder(db.path())
        .lease_ttl(Duration::from_secs(30))
        .sweep_interval(Duration::from_millis(100))
        .start()
        .unwrap();
    // Real seconds pass; the lease, on the test clock, does not run out.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(db.job(id).status, Status::Running);
    db.clock().advance(Duration::from_secs(31));
    let deadline = Instant::now() + Duration::from_secs(60);
    while db.job(id).status != Status::Succeeded {
        assert!(
            Instant::now() < deadline,
            "never reclaimed: {:?}",
            db.job(id)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(db.job(id).recovery_count, 1);
    runner.shutdown().unwrap();
}
