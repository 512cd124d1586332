//! Metrics of a real runner running real subprocesses: a known mix of successes, failures, a
//! retry, a spawn failure, a reclaim and a cancel; the exposition agrees with the database,
//! and no counter goes down across a runner's restart or a prune.

use std::time::Duration;

use leasehold::protocol::ClaimRequest;
use leasehold::{Job, Outcome, Retention, Runner, Store, now_ms};

use crate::helper::{WAIT, fast, outcome, running};
use crate::util::exposition::{Exposition, parse};
use crate::util::{TestDb, wait_for};

fn scrape(runner: &Runner) -> Exposition {
    parse(&runner.metrics().expect("metrics").to_prometheus())
}

/// How many events of `kind` the database holds.
fn events(db: &TestDb, kind: &str) -> f64 {
    db.bare()
        .query_row(
            "SELECT count(*) FROM job_events WHERE kind = ?1",
            [kind],
            |r| r.get::<_, i64>(0),
        )
        .unwrap() as f64
}

/// Jobs of `queue` in `status`, counted in the table.
fn jobs(db: &TestDb, queue: &str, status: &str) -> f64 {
    db.bare()
        .query_row(
            "SELECT count(*) FROM jobs WHERE queue = ?1 AND status = ?2",
            [queue, status],
            |r| r.get::<_, i64>(0),
        )
        .unwrap() as f64
}

/// Every counter and histogram sample of `before` is in `after`, at least as high.
fn none_went_down(before: &Exposition, after: &Exposition) {
    let durable = before.durable_in(after);
    for (s, now) in &durable {
        let now = now.unwrap_or_else(|| panic!("{} {:?} is gone", s.name, s.labels));
        assert!(
            now >= s.value,
            "{} {:?}: {} -> {now}",
            s.name,
            s.labels,
            s.value
        );
    }
    assert!(durable.len() > 50, "{}", durable.len());
}

#[test]
fn the_exposition_agrees_with_the_database_and_survives_a_restart_and_a_prune() {
    let db = TestDb::new();
    // A lost attempt left by a runner that is gone: claimed a minute ago under a 3 s lease.
    let lost = {
        let store = Store::open(&db.path).unwrap();
        let id = store
            .enqueue_at(&Job::shell("echo again").queue("c"), now_ms() - 60_000)
            .unwrap();
        let req = ClaimRequest {
            worker_id: "ghost",
            limit: 1,
            queues: &[],
            queue_caps: &[],
            unheld: 0,
            lease_ttl: Duration::from_secs(3),
        };
        assert_eq!(store.claim(&req, now_ms() - 60_000).unwrap().len(), 1);
        id
    };
    let runner = fast(&db.path).start().expect("start");
    let ok: Vec<i64> = (0..3)
        .map(|_| runner.enqueue(&Job::shell("true").queue("a")).unwrap())
        .collect();
    let flaky = runner
        .enqueue(
            &Job::shell("exit 3")
                .queue("b")
                .max_attempts(2)
                .backoff(Duration::from_millis(100), Duration::from_millis(100)),
        )
        .unwrap();
    let spawn = runner
        .enqueue(&Job::command(["/no/such/command"]).queue("b"))
        .unwrap();
    let sleeper = runner.enqueue(&Job::shell("sleep 300").queue("c")).unwrap();

    running(&db, sleeper);
    let m = scrape(&runner);
    assert!(m.value("leasehold_runner_busy_workers", &[]) >= 1.0);
    assert_eq!(m.value("leasehold_runner_workers", &[]), 4.0);
    assert_eq!(
        m.value("leasehold_jobs", &[("queue", "c"), ("status", "running")]),
        jobs(&db, "c", "running")
    );
    runner.cancel(sleeper).unwrap();

    for id in ok.iter().chain([&lost]) {
        assert_eq!(outcome(&runner, *id), Outcome::Succeeded);
    }
    assert!(matches!(outcome(&runner, flaky), Outcome::Failed { .. }));
    assert!(matches!(outcome(&runner, spawn), Outcome::Failed { .. }));
    assert_eq!(outcome(&runner, sleeper), Outcome::Cancelled);
    // The cancelled attempt's own ending is recorded as the cancel's (not a late result),
    // and a sweep tears down its processes (as it did the ghost's).
    wait_for("the cancelled attempt's ending", WAIT, || {
        events(&db, "attempt_stopped").eq(&1.0).then_some(())
    });
    let m = wait_for("the cancel's teardown", WAIT, || {
        let m = scrape(&runner);
        (m.value("leasehold_teardowns_total", &[]) >= 2.0).then_some(m)
    });

    let ended = |q: &str, o: &str| {
        m.value(
            "leasehold_jobs_ended_total",
            &[("queue", q), ("outcome", o)],
        )
    };
    assert_eq!(ended("a", "succeeded"), 3.0);
    assert_eq!(ended("b", "failed"), 2.0);
    assert_eq!(ended("c", "succeeded"), 1.0);
    assert_eq!(ended("c", "cancelled"), 1.0);
    assert_eq!(
        m.value("leasehold_retries_scheduled_total", &[("queue", "b")]),
        1.0
    );
    assert_eq!(
        m.value("leasehold_spawn_failures_total", &[("queue", "b")]),
        1.0
    );
    assert_eq!(
        m.value(
            "leasehold_reclaims_total",
            &[("queue", "c"), ("outcome", "requeued")]
        ),
        1.0
    );
    assert_eq!(m.value("leasehold_teardowns_total", &[]), 2.0);
    assert_eq!(m.value("leasehold_late_results_discarded_total", &[]), 0.0);
    assert_eq!(m.sum("leasehold_self_fences_total"), 0.0);
    // The counters agree with the history the database kept.
    assert_eq!(
        m.sum("leasehold_jobs_ended_total"),
        events(&db, "succeeded")
            + events(&db, "failed")
            + events(&db, "lost")
            + events(&db, "cancelled")
    );
    assert_eq!(
        m.sum("leasehold_retries_scheduled_total"),
        events(&db, "retry_scheduled")
    );
    assert_eq!(
        m.sum("leasehold_reclaims_total"),
        events(&db, "reclaimed") + events(&db, "lost")
    );
    assert_eq!(
        m.value("leasehold_teardowns_total", &[]),
        events(&db, "torn_down")
    );
    assert_eq!(
        m.value("leasehold_late_results_discarded_total", &[]),
        events(&db, "late_result_discarded")
    );
    // Every attempt that ran is in the run-time histogram once: four successes, the retried
    // and the failed attempt of one job, the spawn failure, the cancelled one, the ghost's.
    assert_eq!(m.sum("leasehold_attempt_run_seconds_count"), 9.0);
    assert_eq!(
        m.value(
            "leasehold_attempt_run_seconds_count",
            &[("queue", "c"), ("outcome", "lost")]
        ),
        1.0
    );
    // The gauges are the table's counts.
    for q in ["a", "b", "c"] {
        for s in ["pending", "running", "succeeded", "failed", "cancelled"] {
            assert_eq!(
                m.value("leasehold_jobs", &[("queue", q), ("status", s)]),
                jobs(&db, q, s),
                "{q} {s}"
            );
        }
    }
    assert_eq!(m.value("leasehold_runners_alive", &[]), 1.0);
    assert_eq!(m.value("leasehold_runner_busy_workers", &[]), 0.0);
    assert!(m.get("leasehold_runner_writer_queue_depth", &[]).is_some());
    wait_for("a lease renewal", WAIT, || {
        scrape(&runner)
            .get("leasehold_runner_last_renewal_seconds", &[])
            .filter(|s| *s > 0.0)
    });

    // A restart: nothing goes down, and the new runner counts on from there.
    runner.shutdown().unwrap();
    drop(runner);
    let runner = fast(&db.path).start().expect("restart");
    let after_restart = scrape(&runner);
    none_went_down(&m, &after_restart);
    let id = runner.enqueue(&Job::shell("true").queue("a")).unwrap();
    assert_eq!(outcome(&runner, id), Outcome::Succeeded);
    let m2 = scrape(&runner);
    none_went_down(&after_restart, &m2);
    assert_eq!(
        m2.value(
            "leasehold_jobs_ended_total",
            &[("queue", "a"), ("outcome", "succeeded")]
        ),
        4.0
    );

    // A prune of every finished job: the counters stay, the gauges follow the table.
    let report = Store::open(&db.path)
        .unwrap()
        .prune_at(
            &Retention::default()
                .succeeded(Some(Duration::ZERO))
                .failed(Some(Duration::ZERO))
                .cancelled(Some(Duration::ZERO)),
            &leasehold::PruneOptions::default(),
            now_ms() + 1,
        )
        .unwrap();
    assert!(report.jobs >= 7, "{report:?}");
    let m3 = scrape(&runner);
    none_went_down(&m2, &m3);
    for q in ["a", "b", "c"] {
        for s in ["succeeded", "failed", "cancelled"] {
            assert_eq!(
                m3.value("leasehold_jobs", &[("queue", q), ("status", s)]),
                jobs(&db, q, s),
                "{q} {s}"
            );
        }
    }
    runner.shutdown().unwrap();
}
