//! Metrics from the store: every counter and histogram after a known mix of transitions, with
//! time as a parameter so that waits and run times are exact; counters that pruning does not
//! lower; a scrape while another connection holds the write lock.

use std::time::Duration;

use leasehold::protocol::Ending;
use leasehold::{CounterKind, ErrorKind, Job, OnLost, Retention, Store};

use crate::helper::{EXPIRED, claim_in, enqueue, exit, finish, sweep};
use crate::util::exposition::{Exposition, parse};
use crate::util::{T0, TestDb};

fn queue(q: &str) -> Vec<String> {
    vec![q.to_string()]
}

fn scrape(store: &Store, now: i64) -> Exposition {
    parse(&store.metrics_at(now).expect("metrics").to_prometheus())
}

/// Jobs of `queue` in `status`, counted from the table itself.
fn counted(store: &Store, queue: &str, status: &str) -> f64 {
    store
        .list(&leasehold::ListFilter {
            status: Some(status.parse().unwrap()),
            queue: Some(queue.to_string()),
            ..Default::default()
        })
        .unwrap()
        .len() as f64
}

/// A file after a known mix: in queue `a` a success (due at T0, claimed at T0+2 s, ended
/// 0.7 s later) and an `on_lost = fail` job lost for good; in `b` a job failed twice (one
/// retry) and a spawn failure; in `c` a job reclaimed, torn down, its late result discarded,
/// then run to success, and a cancelled pending job.
fn mixed(db: &TestDb) -> Store {
    let store = db.store();
    let ok = enqueue(&store, &Job::shell("true").queue("a"));
    let flaky = enqueue(
        &store,
        &Job::shell("exit 3")
            .queue("b")
            .max_attempts(2)
            .backoff(Duration::from_secs(1), Duration::from_secs(1)),
    );
    let _spawn = enqueue(&store, &Job::command(["/no/such/command"]).queue("b"));
    let lost = enqueue(&store, &Job::shell("true").queue("c"));
    let cancelled = enqueue(&store, &Job::shell("true").queue("c"));
    let fragile = enqueue(&store, &Job::shell("true").queue("a").on_lost(OnLost::Fail));

    // a: a success. Wait 2 s, run 0.7 s.
    let c = claim_in(&store, "w", 1, &queue("a"), T0 + 2_000);
    assert_eq!(c[0].id, ok);
    finish(&store, &c[0], Ending::Succeeded, T0 + 2_700);

    // b: one retry, then failed for good; and a spawn failure (failed at once, no retry).
    let c = claim_in(&store, "w", 2, &queue("b"), T0);
    let (first, spawn) = if c[0].id == flaky {
        (&c[0], &c[1])
    } else {
        (&c[1], &c[0])
    };
    finish(&store, first, exit(3), T0 + 500);
    let spawn_failure = Ending::Failed {
        kind: ErrorKind::Spawn,
        exit_code: None,
        signal: None,
        message: "No such file or directory".into(),
    };
    finish(&store, spawn, spawn_failure, T0 + 10);
    let c = claim_in(&store, "w", 1, &queue("b"), T0 + 60_000);
    assert_eq!(c[0].id, flaky);
    finish(&store, &c[0], exit(3), T0 + 61_000);

    // c: lost, reclaimed (requeued), torn down; the lost attempt's late result discarded.
    let c = claim_in(&store, "w", 1, &queue("c"), T0);
    assert_eq!(c[0].id, lost);
    let report = store.reclaim(&sweep(3, 10), EXPIRED).unwrap();
    assert_eq!(report.pending(), 1);
    assert!(
        store
            .record_teardown(lost, &c[0].run_token, "no process left", EXPIRED)
            .unwrap()
    );
    finish(&store, &c[0], Ending::Succeeded, EXPIRED + 1);
    store.cancel_at(cancelled, EXPIRED + 2).unwrap();
    let again = claim_in(&store, "w", 1, &queue("c"), EXPIRED + 3);
    assert_eq!(again[0].id, lost);
    finish(&store, &again[0], Ending::Succeeded, EXPIRED + 4);

    // a: on_lost = fail, lost: reclaimed as failed.
    let c = claim_in(&store, "w", 1, &queue("a"), EXPIRED + 10);
    assert_eq!(c[0].id, fragile);
    let report = store.reclaim(&sweep(3, 10), EXPIRED + 10 + 30_001).unwrap();
    assert_eq!(report.failed(), 1);
    store
}

#[test]
fn a_scrape_reads_while_another_connection_holds_the_write_lock() {
    let db = TestDb::new();
    let _store = mixed(&db);
    let other = db.bare();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    other
        .execute("UPDATE jobs SET priority = 5 WHERE id = 1", [])
        .unwrap();
    // No wait for the lock: a scrape takes none.
    let metrics = Store::open_with(
        &db.path,
        &leasehold::OpenOptions::read_only().busy_timeout(Duration::ZERO),
    )
    .unwrap()
    .metrics()
    .unwrap();
    assert_eq!(metrics.counter_total(CounterKind::JobsEnded), 6);
    other.execute_batch("COMMIT").unwrap();
}

#[test]
fn the_parser_refuses_what_the_format_does_not_allow() {
    let ok = "# HELP a_total A.\n# TYPE a_total counter\na_total{q=\"x\\\"y\"} 1\n";
    assert_eq!(parse(ok).value("a_total", &[("q", "x\"y")]), 1.0);
    for bad in [
        "a_total 1\n",                                     // no TYPE
        "# TYPE a gauge\na{q=x} 1\n",                      // unquoted
        "# TYPE a gauge\na 1\n# TYPE b gauge\nb 1\na 2\n", // split family
        "# TYPE a gauge\na one\n",                         // bad value
        "# TYPE 1a gauge\n",                               // bad name
        "# TYPE a gauge\n# TYPE a gauge\n",                // TYPE twice
        "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
        "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n", // no +Inf
        "# TYPE a gauge\na 1",                                            // no final newline
        "# random comment\n",
    ] {
        let result = std::panic::catch_unwind(|| parse(bad));
        assert!(result.is_err(), "accepted: {bad:?}");
    }
}

#[test]
fn hand_written_sql_keeps_the_job_counts_exact() {
    let db = TestDb::new();
    let store = mixed(&db);
    let bare = db.bare();
    // The runbook's manual retry, a move between queues, a delete by hand; and enqueues,
    // one and many.
    bare.execute_batch(
        "UPDATE jobs SET status = 'pending', recovery_count = 0 WHERE status = 'failed';
         UPDATE jobs SET queue = 'moved' WHERE queue = 'c' AND status = 'succeeded';
         DELETE FROM jobs WHERE status = 'cancelled';",
    )
    .unwrap();
    store
        .enqueue_at(&Job::shell("true").queue("new"), T0)
        .unwrap();
    let many: Vec<Job> = (0..5)
        .map(|i| Job::shell("true").queue(["new", "c"][i % 2]))
        .collect();
    store.enqueue_many_at(&many, T0).unwrap();
    let m = store.metrics_at(EXPIRED + 60_000).unwrap();
    let actual: Vec<(String, String, u64)> = {
        let mut stmt = bare
            .prepare("SELECT queue, status, count(*) FROM jobs GROUP BY queue, status")
            .unwrap();
        stmt.query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get::<_, i64>(2)? as u64))
        })
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
    };
    for (q, s, n) in &actual {
        assert_eq!(m.jobs(q, s), *n, "{q} {s}");
    }
    let total: u64 = m.jobs.iter().map(|c| c.jobs).sum();
    assert_eq!(total, actual.iter().map(|(_, _, n)| n).sum::<u64>());
    let counts = store.counts().unwrap();
    assert_eq!(counts.failed, 0);
    assert_eq!(counts.cancelled, 0);
    assert_eq!(m.jobs("new", "pending"), 4);
}

crate::on_both! {
    fn counters_and_histograms_agree_with_the_transitions_made(db) {
        let store = mixed(&db);
        let m = scrape(&store, EXPIRED + 60_000);

        let ended = |q: &str, o: &str| {
            m.value(
                "leasehold_jobs_ended_total",
                &[("queue", q), ("outcome", o)],
            )
        };
        assert_eq!(ended("a", "succeeded"), 1.0);
        assert_eq!(ended("a", "lost"), 1.0);
        assert_eq!(ended("b", "failed"), 2.0);
        assert_eq!(ended("c", "succeeded"), 1.0);
        assert_eq!(ended("c", "cancelled"), 1.0);
        assert_eq!(m.sum("leasehold_jobs_ended_total"), 6.0);
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
        assert_eq!(
            m.value(
                "leasehold_reclaims_total",
                &[("queue", "a"), ("outcome", "failed")]
            ),
            1.0
        );
        assert_eq!(m.value("leasehold_teardowns_total", &[]), 1.0);
        assert_eq!(m.value("leasehold_late_results_discarded_total", &[]), 1.0);
        assert_eq!(m.sum("leasehold_self_fences_total"), 0.0);

        // Queue a's success: waited exactly 2 s (bucket 2.5, not 1) and ran 0.7 s (bucket 1).
        let labels = |le: &'static str| [("queue", "a"), ("outcome", "succeeded"), ("le", le)];
        let wait = "leasehold_attempt_wait_seconds";
        let run = "leasehold_attempt_run_seconds";
        assert_eq!(m.value(&format!("{wait}_bucket"), &labels("1")), 0.0);
        assert_eq!(m.value(&format!("{wait}_bucket"), &labels("2.5")), 1.0);
        assert_eq!(m.value(&format!("{run}_bucket"), &labels("0.5")), 0.0);
        assert_eq!(m.value(&format!("{run}_bucket"), &labels("1")), 1.0);
        let ok = [("queue", "a"), ("outcome", "succeeded")];
        assert_eq!(m.value(&format!("{wait}_sum"), &ok), 2.0);
        assert_eq!(m.value(&format!("{run}_sum"), &ok), 0.7);
        // Every ended attempt is observed once, under what became of it.
        let count =
            |q: &str, o: &str| m.value(&format!("{run}_count"), &[("queue", q), ("outcome", o)]);
        assert_eq!(count("b", "retried"), 1.0);
        assert_eq!(count("b", "failed"), 2.0);
        assert_eq!(count("c", "lost"), 1.0);
        assert_eq!(count("a", "lost"), 1.0);
        assert_eq!(count("c", "succeeded"), 1.0);
        // The spawn failure ran 10 ms: bucket 0.01.
        assert_eq!(
            m.value(
                &format!("{run}_sum"),
                &[("queue", "b"), ("outcome", "failed")]
            ),
            1.01
        );

        // The gauges are the table's own counts.
        for q in ["a", "b", "c"] {
            for s in ["pending", "running", "succeeded", "failed", "cancelled"] {
                assert_eq!(
                    m.value("leasehold_jobs", &[("queue", q), ("status", s)]),
                    counted(&store, q, s),
                    "{q} {s}"
                );
            }
        }
        // The library's view matches the text.
        let snapshot = store.metrics_at(EXPIRED + 60_000).unwrap();
        assert_eq!(snapshot.counter(CounterKind::JobsEnded, "b", "failed"), 2);
        assert_eq!(snapshot.counter_total(CounterKind::Reclaims), 2);
    }

    fn queue_lag_is_the_age_of_the_oldest_ready_pending_job(db) {
        let store = db.store();
        store
            .enqueue_at(&Job::shell("true").queue("mail"), T0)
            .unwrap();
        store
            .enqueue_at(&Job::shell("true").queue("mail"), T0 + 1_000)
            .unwrap();
        // Due in an hour: not ready, no lag.
        store
            .enqueue_at(
                &Job::shell("true")
                    .queue("later")
                    .delay(Duration::from_secs(3600)),
                T0,
            )
            .unwrap();
        let m = scrape(&store, T0 + 5_000);
        assert_eq!(
            m.value("leasehold_queue_lag_seconds", &[("queue", "mail")]),
            5.0
        );
        assert_eq!(
            m.get("leasehold_queue_lag_seconds", &[("queue", "later")]),
            Some(0.0)
        );
        // Claimed, the oldest no longer counts.
        claim_in(&db.store(), "w", 1, &queue("mail"), T0 + 5_000);
        let m = scrape(&store, T0 + 5_000);
        assert_eq!(
            m.value("leasehold_queue_lag_seconds", &[("queue", "mail")]),
            4.0
        );
    }

    fn pruning_never_lowers_a_counter_and_the_job_gauges_follow_it(db) {
        let store = mixed(&db);
        let now = EXPIRED + 60_000;
        let before = scrape(&store, now);
        let report = store
            .prune_at(&Retention::default()
                    .succeeded(Some(Duration::ZERO))
                    .failed(Some(Duration::ZERO))
                    .cancelled(Some(Duration::ZERO)), &leasehold::PruneOptions::default(), now + 1)
            .unwrap();
        // All but the job lost for good, whose teardown marker keeps it.
        assert_eq!(report.jobs, 5, "{report:?}");
        let after = scrape(&store, now + 1);
        // Every counter and histogram sample is there after the prune, with the same value.
        let durable = before.durable_in(&after);
        for (s, now) in &durable {
            assert_eq!(*now, Some(s.value), "{} {:?}", s.name, s.labels);
        }
        assert!(durable.len() > 100, "{}", durable.len());
        assert!(before.sum("leasehold_jobs_ended_total") == 6.0);
        for q in ["a", "b", "c"] {
            for s in ["succeeded", "failed", "cancelled"] {
                assert_eq!(
                    after
                        .get("leasehold_jobs", &[("queue", q), ("status", s)])
                        .unwrap_or(0.0),
                    counted(&store, q, s),
                    "{q} {s}"
                );
            }
        }
    }

    fn self_fences_interruptions_and_manual_retries_are_counted_apart_from_reclaims(db) {
        let store = db.store();
        let fenced = enqueue(&store, &Job::shell("true").queue("q"));
        let spent = enqueue(&store, &Job::shell("true").queue("q"));
        let stopped = enqueue(&store, &Job::shell("true").queue("q"));
        let lost = |message: &str| Ending::Lost {
            message: message.into(),
        };
        // A self-fence within the budget requeues; with a budget of 0 it fails the job as lost.
        let c = claim_in(&store, "w", 1, &queue("q"), T0);
        assert_eq!(c[0].id, fenced);
        finish(&store, &c[0], lost("could not renew"), T0 + 100);
        let c = claim_in(&store, "w", 3, &queue("q"), T0 + 200);
        let by_id = |id: i64| c.iter().find(|x| x.id == id).unwrap();
        crate::helper::finish_with(&store, by_id(spent), lost("could not renew"), 0, T0 + 300);
        finish(
            &store,
            by_id(stopped),
            Ending::Interrupted {
                message: "shutdown".into(),
            },
            T0 + 300,
        );
        store.retry_at(spent, Some("try again"), T0 + 400).unwrap();

        let m = scrape(&store, T0 + 500);
        assert_eq!(
            m.value("leasehold_self_fences_total", &[("queue", "q")]),
            2.0
        );
        assert_eq!(m.sum("leasehold_reclaims_total"), 0.0);
        assert_eq!(
            m.value(
                "leasehold_jobs_ended_total",
                &[("queue", "q"), ("outcome", "lost")]
            ),
            1.0
        );
        assert_eq!(
            m.value("leasehold_attempts_interrupted_total", &[("queue", "q")]),
            1.0
        );
        assert_eq!(
            m.value("leasehold_manual_retries_total", &[("queue", "q")]),
            1.0
        );
        let run_count = |o: &str| {
            m.value(
                "leasehold_attempt_run_seconds_count",
                &[("queue", "q"), ("outcome", o)],
            )
        };
        assert_eq!(run_count("lost"), 2.0);
        assert_eq!(run_count("interrupted"), 1.0);
        // The retried and the interrupted job are pending again; the requeued one was claimed
        // again by the second claim.
        let jobs = |s: &str| m.value("leasehold_jobs", &[("queue", "q"), ("status", s)]);
        assert_eq!((jobs("pending"), jobs("running")), (2.0, 1.0));
    }
}
