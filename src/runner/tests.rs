//! The runner's unit tests: thread faults injected by panic, and the builder's bounds.

use super::builder::validate;
use super::*;
use crate::error::Error;
use crate::job::Status;
use crate::store::OpenOptions;

/// A runner with short timings on a new file in `dir`.
fn fast(dir: &Path) -> RunnerBuilder {
    Runner::builder(dir.join("jobs.db"))
        .workers(2)
        .lease_ttl(Duration::from_secs(3))
        .heartbeat_interval(Duration::from_millis(200))
        .sweep_interval(Duration::from_millis(200))
        .kill_grace(Duration::from_millis(300))
        .drain_timeout(Duration::from_millis(300))
        .poll_interval(Duration::from_millis(20))
        .shutdown_grace(Duration::from_millis(200))
}

fn wait_until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn event_kinds(store: &Store, id: i64) -> Vec<String> {
    let events = store.events(id).expect("events");
    events.into_iter().map(|e| e.kind.to_string()).collect()
}

/// A thread of the runner panics while a job runs: the runner fences itself (kills the
/// attempt's group, records the attempt as lost, refuses every later call) instead of
/// running on half-alive.
fn a_dead_thread_fences_the_runner(thread: &'static str) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let runner = fast(dir.path()).start().expect("the runner starts");
    let store = Store::open(dir.path().join("jobs.db")).expect("the store opens");
    let id = runner.enqueue(&Job::shell("sleep 30")).expect("enqueue");
    let pgid = wait_until("the job to start", || {
        let job = store.job(id).expect("job");
        job.pgid.filter(|_| job.status == Status::Running)
    });
    runner.inject_panic(thread);
    if thread == "writer" {
        // The writer runs only when there is something to write: a second job's claim.
        let _ = runner.enqueue(&Job::shell("true"));
    }
    let err = wait_until("the runner to fence itself", || runner.health().err());
    match &err {
        Error::RunnerFailed { thread: t, cause } => {
            assert_eq!(*t, thread);
            assert!(cause.contains("injected panic"), "{cause}");
        }
        other => panic!("{other:?}"),
    }
    wait_until("the attempt's group to be killed", || {
        (!crate::process::group_has_live_members(pgid as i32)).then_some(())
    });
    assert!(matches!(
        runner.enqueue(&Job::shell("true")),
        Err(Error::RunnerFailed { .. })
    ));
    assert!(matches!(
        runner.wait(id, Duration::MAX),
        Err(Error::RunnerFailed { .. })
    ));
    assert!(matches!(runner.shutdown(), Err(Error::RunnerFailed { .. })));
    // Recorded as a lost attempt (a self-fence), whichever thread was left to write it:
    // back to pending within the recovery budget, with a `reclaimed` event.
    let job = store.job(id).expect("job");
    assert_eq!(job.status, Status::Pending, "{job:?}");
    assert_eq!(job.recovery_count, 1, "{job:?}");
    assert_eq!(
        event_kinds(&store, id),
        ["enqueued", "claimed", "started", "reclaimed"]
    );
}

#[test]
fn a_panicking_heartbeat_fences_the_runner() {
    a_dead_thread_fences_the_runner("heartbeat");
}

#[test]
fn a_panicking_writer_fences_the_runner_and_its_endings_are_recorded_at_shutdown() {
    a_dead_thread_fences_the_runner("writer");
}

#[test]
fn a_panicking_dispatcher_fences_the_runner() {
    a_dead_thread_fences_the_runner("dispatcher");
}

#[test]
fn a_panicking_sweeper_fences_the_runner() {
    a_dead_thread_fences_the_runner("sweeper");
}

#[test]
fn a_panicking_notifier_fences_the_runner() {
    a_dead_thread_fences_the_runner("notifier");
}

#[test]
fn a_panicking_firer_fences_the_runner() {
    a_dead_thread_fences_the_runner("firer");
}

#[test]
fn a_panicking_worker_loses_only_its_attempt_and_goes_on() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let runner = fast(dir.path())
        .workers(1)
        .start()
        .expect("the runner starts");
    let store = Store::open(dir.path().join("jobs.db")).expect("the store opens");
    // The panic comes once the first attempt has left a child in its group, a child that
    // dropped the run token from its environment: only a kill of the whole group reaches it.
    let marker = dir.path().join("child.pid");
    runner.inject_panic_after("worker", &marker);
    let id = runner
        .enqueue(&Job::shell(format!(
            "m={m}; if [ ! -e $m ]; then env -u LEASEHOLD_RUN_TOKEN sleep 30 & \
             echo $! > $m.new && mv $m.new $m; fi; sleep 0.3; echo done",
            m = marker.display()
        )))
        .expect("enqueue");
    assert_eq!(
        runner.wait(id, Duration::from_secs(30)).expect("wait"),
        Some(Outcome::Succeeded)
    );
    runner.health().expect("the runner is healthy");
    let job = store.job(id).expect("job");
    assert_eq!(job.recovery_count, 1, "{job:?}");
    let events = store.events(id).expect("events");
    let lost = events
        .iter()
        .find(|e| e.kind == "reclaimed")
        .expect("a reclaimed event for the lost attempt");
    assert!(
        lost.detail.as_deref().unwrap_or("").contains("panicked"),
        "{lost:?}"
    );
    let child: i32 = std::fs::read_to_string(&marker)
        .expect("the first attempt's child pid")
        .trim()
        .parse()
        .expect("a pid");
    // Should the teardown miss it, the child is killed when the test ends, failed or not.
    struct KillOnDrop(i32);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            if crate::process::is_alive(self.0) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(self.0),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
    let _child = KillOnDrop(child);
    wait_until("the first attempt's child to be killed", || {
        (!crate::process::is_alive(child)).then_some(())
    });
    runner.shutdown().expect("shutdown");
}

#[test]
fn extreme_durations_in_wait_and_shutdown_do_not_panic() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let runner = fast(dir.path()).start().expect("the runner starts");
    let id = runner.enqueue(&Job::shell("true")).expect("enqueue");
    assert_eq!(
        runner.wait(id, Duration::MAX).expect("wait"),
        Some(Outcome::Succeeded)
    );
    runner.shutdown_within(Duration::MAX).expect("shutdown");
}

#[test]
fn settings_beyond_what_the_runner_can_represent_are_refused_by_name() {
    let b = || Runner::builder("/nonexistent/x.db");
    let cases: Vec<(RunnerBuilder, &str)> = vec![
        (b().workers(0), "workers"),
        (b().workers(MAX_WORKERS + 1), "workers"),
        (b().workers(usize::MAX), "workers"),
        (b().lease_ttl(Duration::from_secs(10_000_000)), "lease_ttl"),
        (b().lease_ttl(Duration::MAX), "lease_ttl"),
        (b().heartbeat_interval(Duration::MAX), "heartbeat_interval"),
        (b().sweep_interval(Duration::MAX), "sweep_interval"),
        (b().kill_grace(Duration::MAX), "kill_grace"),
        (b().shutdown_grace(Duration::MAX), "shutdown_grace"),
        (b().drain_timeout(Duration::MAX), "drain_timeout"),
        (b().poll_interval(Duration::MAX), "poll_interval"),
        (b().poll_interval(Duration::ZERO), "poll_interval"),
        (b().output_tail(usize::MAX), "output_tail"),
    ];
    for (builder, name) in cases {
        match builder.start() {
            Err(Error::Invalid { setting, .. }) => assert_eq!(setting, name),
            other => panic!("{name}: {other:?}"),
        }
    }
}

/// A duration from a mix of the interesting values (0, 1 ns, around each bound, huge)
/// and ordinary ones.
fn any_duration() -> impl proptest::strategy::Strategy<Value = Duration> {
    use proptest::prelude::*;
    // Weighted so that about a third of the runs start a runner (every setting in range
    // and the ladder in order); the rest probe the edges.
    prop_oneof![
        1 => Just(Duration::ZERO),
        1 => Just(Duration::from_nanos(1)),
        1 => Just(MAX_SETTING_DURATION),
        1 => Just(MAX_SETTING_DURATION + Duration::from_millis(1)),
        1 => Just(Duration::MAX),
        1 => (0u64..u64::MAX).prop_map(Duration::from_nanos),
        1 => (0u64..u64::MAX).prop_map(Duration::from_millis),
        1 => (0u64..u64::MAX, 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        80 => (1u64..2_000).prop_map(Duration::from_millis),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config {
        cases: 48,
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    })]

    /// Whatever the settings, `start` either refuses them with `Error::Invalid` or starts
    /// a runner whose threads all keep working and that shuts down cleanly: no panic, in
    /// this thread or in one of the runner's.
    #[test]
    fn any_builder_settings_start_cleanly_or_are_refused_by_name(
        workers in proptest::prop_oneof![
            1 => proptest::strategy::Just(0usize),
            1 => proptest::strategy::Just(usize::MAX),
            1 => 0usize..5000,
            20 => 1usize..4,
        ],
        lease_ttl in any_duration(),
        // Mostly a fraction of the lease, as a sane ladder has it; sometimes anything.
        heartbeat in (any_duration(), proptest::option::weighted(0.75, 3u32..10)),
        sweep in (any_duration(), proptest::option::weighted(0.75, 1u32..10)),
        kill_grace in any_duration(),
        shutdown_grace in any_duration(),
        drain in any_duration(),
        poll in any_duration(),
        output_tail in proptest::prop_oneof![
            1 => proptest::strategy::Just(usize::MAX),
            1 => 0usize..(2 * MAX_OUTPUT_TAIL),
            10 => 0usize..100_000,
        ],
        max_recovery in proptest::num::u32::ANY,
        reclaim_batch in proptest::num::u32::ANY,
    ) {
        let dir = tempfile::tempdir().expect("a temp dir");
        let started = Runner::builder(dir.path().join("jobs.db"))
            .workers(workers)
            .lease_ttl(lease_ttl)
            .heartbeat_interval(heartbeat.1.map_or(heartbeat.0, |k| lease_ttl / k))
            .sweep_interval(sweep.1.map_or(sweep.0, |k| lease_ttl / k))
            .kill_grace(kill_grace)
            .shutdown_grace(shutdown_grace)
            .drain_timeout(drain)
            .poll_interval(poll)
            .output_tail(output_tail)
            .max_recovery_attempts(max_recovery)
            .reclaim_batch(reclaim_batch)
            .start();
        match started {
            Ok(runner) => {
                runner.health().expect("a started runner is healthy");
                runner.shutdown().expect("a started runner shuts down cleanly");
            }
            Err(Error::Invalid { setting, reason }) => {
                proptest::prop_assert!(!setting.is_empty() && !reason.is_empty());
            }
            Err(other) => proptest::prop_assert!(false, "unexpected error: {other:?}"),
        }
    }
}

#[test]
fn a_lease_shorter_than_the_least_renewal_budget_still_renews() {
    // 0.2 s lease, 0.05 s heartbeat: the renewal budget's bounds cross (250 ms least,
    // 200 ms lease); the heartbeat must go on renewing, not panic.
    let dir = tempfile::tempdir().expect("a temp dir");
    let runner = Runner::builder(dir.path().join("jobs.db"))
        .lease_ttl(Duration::from_millis(200))
        .heartbeat_interval(Duration::from_millis(50))
        .kill_grace(Duration::from_millis(50))
        .sweep_interval(Duration::from_millis(100))
        .poll_interval(Duration::from_millis(20))
        .start()
        .expect("the runner starts");
    let id = runner.enqueue(&Job::shell("sleep 0.6")).expect("enqueue");
    assert_eq!(
        runner.wait(id, Duration::from_secs(20)).expect("wait"),
        Some(Outcome::Succeeded)
    );
    runner.health().expect("no thread failed");
    let job = runner.job(id).expect("job");
    assert_eq!(job.recovery_count, 0, "{job:?}");
    runner.shutdown().expect("shutdown");
}

#[test]
fn misordered_timing_ladder_names_the_setting() {
    let b = || Runner::builder("/nonexistent/x.db").lease_ttl(Duration::from_secs(3));
    match b().heartbeat_interval(Duration::from_secs(2)).start() {
        Err(Error::Invalid { setting, .. }) => assert_eq!(setting, "heartbeat_interval"),
        other => panic!("{other:?}"),
    }
    // A 3 s lease, a 1 s heartbeat and a 2 s kill grace, where one slow renewal would kill
    // every attempt.
    match b()
        .heartbeat_interval(Duration::from_secs(1))
        .kill_grace(Duration::from_secs(2))
        .start()
    {
        Err(Error::Invalid { setting, reason }) => {
            assert_eq!(setting, "kill_grace");
            assert!(reason.contains("two heartbeats"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    match b()
        .heartbeat_interval(Duration::from_secs(1))
        .kill_grace(Duration::from_secs(1))
        .sweep_interval(Duration::from_secs(4))
        .start()
    {
        Err(Error::Invalid { setting, .. }) => assert_eq!(setting, "sweep_interval"),
        other => panic!("{other:?}"),
    }
}

/// Issue 34: given only the lease TTL, the heartbeat, the sweep and the kill grace take a
/// sixth of it (between 100 ms and their 5 s defaults), whichever order the setters come in,
/// so `lease_ttl(10 s)` alone starts (it was refused: "heartbeat 5s × 3 exceeds the lease TTL
/// of 10s"), and so does a 5 s lease with a 0.5 s heartbeat (refused for the 5 s kill grace).
#[test]
fn settings_not_given_follow_the_lease_ttl() {
    let ms = Duration::from_millis;
    let b = || Runner::builder("/nonexistent/x.db");
    let ladder = |r: RunnerBuilder| {
        let c = &r.config;
        validate(c).map(|()| (c.heartbeat_interval, c.sweep_interval, c.kill_grace))
    };
    let ok = |r| ladder(r).expect("the ladder is in order");
    assert_eq!(ok(b()), (ms(5000), ms(5000), ms(5000)));
    assert_eq!(
        ok(b().lease_ttl(Duration::from_secs(10))).0,
        Duration::from_secs(10) / 6
    );
    assert_eq!(
        ok(b().lease_ttl(Duration::from_secs(60))),
        (ms(5000), ms(5000), ms(5000))
    );
    assert_eq!(ok(b().lease_ttl(ms(300))), (ms(100), ms(100), ms(100)));
    // Given settings are kept, before or after the lease TTL; the others still follow it.
    let given = ok(b()
        .heartbeat_interval(ms(500))
        .lease_ttl(Duration::from_secs(5)));
    assert_eq!(
        given,
        (
            ms(500),
            Duration::from_secs(5) / 6,
            Duration::from_secs(5) / 6
        )
    );
    let given = ok(b().lease_ttl(Duration::from_secs(5)).kill_grace(ms(2000)));
    assert_eq!(given.2, ms(2000));
    // The lease TTL given after a setting does not undo it.
    let given = ok(b()
        .sweep_interval(ms(700))
        .lease_ttl(Duration::from_secs(12)));
    assert_eq!(given.1, ms(700));
    // A start with only a short lease works.
    let dir = tempfile::tempdir().expect("a temp dir");
    let runner = Runner::builder(dir.path().join("jobs.db"))
        .lease_ttl(Duration::from_secs(2))
        .start()
        .expect("a runner with only a 2 s lease starts");
    runner.shutdown().expect("shutdown");
}

/// A given setting that breaks the ladder is refused naming it; a default that cannot fit
/// (a lease shorter than three of the heartbeat's 100 ms floor) names the lease TTL.
#[test]
fn a_ladder_broken_by_a_given_setting_names_it_and_by_a_default_names_the_lease() {
    let b = || Runner::builder("/nonexistent/x.db").lease_ttl(Duration::from_secs(10));
    let refused = |r: RunnerBuilder| match validate(&r.config) {
        Err(Error::Invalid { setting, reason }) => (setting, reason),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        refused(b().heartbeat_interval(Duration::from_secs(4))).0,
        "heartbeat_interval"
    );
    assert_eq!(
        refused(b().kill_grace(Duration::from_secs(9))).0,
        "kill_grace"
    );
    assert_eq!(
        refused(b().sweep_interval(Duration::from_secs(11))).0,
        "sweep_interval"
    );
    let (setting, reason) =
        refused(Runner::builder("/nonexistent/x.db").lease_ttl(Duration::from_millis(200)));
    assert_eq!(setting, "lease_ttl");
    assert!(reason.contains("its default for this lease"), "{reason}");
}

/// A command that hands a job to a runner that is shutting down is declined at once, and
/// stores the job itself without a token (the path of a refused hand-off), instead of waiting
/// out its deadline and storing it under its token.
#[test]
fn a_runner_shutting_down_declines_a_handed_job_which_the_command_stores_itself() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("jobs.db");
    let runner = fast(dir.path()).start().expect("the runner starts");
    let store = Store::open(&path).expect("the store opens");
    // A running job holds the shutdown (and the runner's socket open) until it is cancelled.
    let long = runner.enqueue(&Job::shell("sleep 30")).expect("enqueue");
    wait_until("the job to run", || {
        (store.job(long).expect("job").status == Status::Running).then_some(())
    });
    std::thread::scope(|s| {
        let stopping = s.spawn(|| runner.shutdown_within(Duration::from_secs(30)));
        wait_until("the shutdown to begin", || {
            runner
                .shared
                .shutting_down
                .load(Ordering::SeqCst)
                .then_some(())
        });
        let handed = Store::hand_off(&path, &OpenOptions::new(), &Job::shell("true"))
            .expect("the job is stored");
        let tokens: i64 = store
            .conn()
            .query_row(
                "SELECT count(*) FROM handoffs",
                crate::store::db::params![],
                |r| r.get(0),
            )
            .expect("count");
        assert_eq!(tokens, 0, "declined, not left unanswered");
        assert_eq!(
            store.job(handed.id).expect("job").status,
            Status::Pending,
            "stored by the command, for a later runner"
        );
        store.cancel(long).expect("cancel the long job");
        stopping
            .join()
            .expect("the shutdown does not panic")
            .expect("the runner shuts down");
    });
}

/// A subscriber that does not read is dropped once its channel is full, instead of the
/// runner holding every ending for it; a subscriber that reads gets them all.
#[test]
fn a_subscriber_that_falls_behind_is_dropped_and_its_channel_closes() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let runner = fast(dir.path()).start().expect("the runner starts");
    let reader = runner.subscribe();
    let from = runner.api.lock().last_event_id().expect("the last event");
    // A subscriber as `subscribe` makes them, with room for two endings.
    let (tx, slow) = crossbeam_channel::bounded(2);
    runner.subscribers.lock().push(notifier::Subscriber {
        tx,
        from: Some(from),
    });
    let ids: Vec<i64> = (0..3)
        .map(|_| runner.enqueue(&Job::shell("true")).expect("enqueue"))
        .collect();
    for _ in &ids {
        reader
            .recv_timeout(Duration::from_secs(20))
            .expect("the reading subscriber gets every ending");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while runner.subscribers.lock().len() > 1 {
        assert!(Instant::now() < deadline, "the slow subscriber is dropped");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(slow.try_iter().count(), 2, "it holds what it had room for");
    assert!(
        matches!(
            slow.try_recv(),
            Err(crossbeam_channel::TryRecvError::Disconnected)
        ),
        "then its channel is closed"
    );
    runner.shutdown().expect("shutdown");
}

/// The firer's wake channel holds one wake-up at most: while the firer does not read it (it
/// waits for a write lock another connection holds, to fire a due slot), a flood of wakes
/// from the API neither queues up nor blocks the sender, and the firer still gets woken once
/// the lock is released.
#[test]
fn wakes_sent_while_the_firer_does_not_read_are_not_queued_and_do_not_block() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("jobs.db");
    // A long lease, so that the lock held below does not fence the runner; the firer's busy
    // wait is then the default 10 s.
    let runner = fast(dir.path())
        .lease_ttl(Duration::from_secs(30))
        .start()
        .expect("the runner starts");
    // A slot due every second gives the firer something to write.
    let every_second = Schedule::every(Duration::from_secs(1)).job(Job::shell("true"));
    Store::open(&path)
        .expect("the store opens")
        .put_schedule("tick", &every_second)
        .expect("the schedule is stored");
    let holder = rusqlite::Connection::open(&path).expect("a second connection");
    holder
        .execute_batch("BEGIN IMMEDIATE")
        .expect("the write lock");
    let wake = &runner.firer_wake;
    // Once the firer waits for the lock to fire the next slot, a wake sent stays unread.
    wait_until("the firer to stop reading its wakes", || {
        let _ = wake.try_send(());
        std::thread::sleep(Duration::from_millis(100));
        (wake.len() == 1).then_some(())
    });
    const WAKES: usize = 100_000;
    let mut most_queued = 0;
    for _ in 0..WAKES {
        // `try_send` returns at once, full or not; a full channel drops the wake, as the
        // one pending says all a wake says.
        let _ = wake.try_send(());
        most_queued = most_queued.max(wake.len());
    }
    assert!(
        most_queued <= 1,
        "{most_queued} wakes queued for a firer that does not read"
    );
    assert_eq!(wake.capacity(), Some(1), "the wake channel is bounded");
    holder
        .execute_batch("COMMIT")
        .expect("the lock is released");
    wait_until("the firer to read its pending wake", || {
        wake.is_empty().then_some(())
    });
    runner.shutdown().expect("shutdown");
}
