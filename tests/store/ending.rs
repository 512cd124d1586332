//! Endings: success, failure with and without retries, spawn failures, lost and interrupted
//! attempts, and the output tail.

use std::time::Duration;

use leasehold::protocol::{Ending, Finish, Finished};
use leasehold::{ErrorKind, Job, LEASE_EXPIRED_PREFIX, OnLost, Output, Status};

use crate::helper::{claim, claim_one, enqueue, exit, finish, finish_with, last_event};
use crate::util::{T0, kinds};

crate::on_both! {
    fn a_successful_attempt_succeeds_the_job_and_releases_its_lease(db) {
        let store = db.store();
        let id = enqueue(&store, &Job::shell("true"));
        let c = claim_one(&store, "w", T0);
        assert_eq!(
            finish(&store, &c, Ending::Succeeded, T0 + 10),
            Finished::Recorded(Status::Succeeded)
        );
        let job = store.job(id).unwrap();
        assert_eq!(job.status, Status::Succeeded);
        assert_eq!(job.exit_code, Some(0));
        assert_eq!(job.completed_at, Some(T0 + 10));
        assert_eq!(job.lease_expires_at, None);
        assert_eq!(job.error_kind, None);
        assert_eq!(kinds(&store, id), ["enqueued", "claimed", "succeeded"]);
        assert!(store.job(id).unwrap().outcome().is_some());
    }

    fn a_failure_with_attempts_left_is_retried_after_a_doubling_backoff(db) {
        let store = db.store();
        let id = enqueue(&store, &Job::shell("false").max_attempts(3));

        let mut now = T0;
        for (failures, base_wait) in [(1, 1000), (2, 2000)] {
            let c = claim_one(&store, "w", now);
            now += 100;
            assert_eq!(
                finish(&store, &c, exit(2), now),
                Finished::Recorded(Status::Pending)
            );
            let job = store.job(id).unwrap();
            assert_eq!(job.status, Status::Pending);
            assert_eq!(job.failed_attempts, failures);
            assert_eq!(
                (job.exit_code, job.error_kind),
                (Some(2), Some(ErrorKind::Exit))
            );
            assert_eq!(job.last_error.as_deref(), Some("exit 2"));
            assert_eq!((job.run_token, job.lease_expires_at), (None, None));
            let wait = job.scheduled_at - now;
            let (low, high) = (base_wait * 8 / 10, base_wait * 12 / 10);
            assert!(
                (low..=high).contains(&wait),
                "retry {failures} waits {wait} ms"
            );
            let event = last_event(&store, id);
            assert_eq!(event.kind, "retry_scheduled");
            assert!(event.detail.unwrap().contains("exit 2"));

            assert!(claim(&store, "w", 1, job.scheduled_at - 1).is_empty());
            now = job.scheduled_at;
        }
        let c = claim_one(&store, "w", now);
        assert_eq!(c.attempt, 3);
        assert_eq!(
            finish(&store, &c, exit(2), now + 1),
            Finished::Recorded(Status::Failed)
        );
        assert_eq!(store.job(id).unwrap().failed_attempts, 3);
    }

    fn a_failure_past_the_backoff_cap_waits_about_the_cap_and_never_beyond_its_jitter(db) {
        let store = db.store();
        let (base, cap) = (100, 400);
        let id = enqueue(
            &store,
            &Job::shell("false")
                .max_attempts(12)
                .backoff(Duration::from_millis(100), Duration::from_millis(400)),
        );
        let mut now = T0;
        let mut past_cap = Vec::new();
        for failures in 1..=10i64 {
            let c = claim_one(&store, "w", now);
            now += 10;
            assert_eq!(
                finish(&store, &c, exit(1), now),
                Finished::Recorded(Status::Pending)
            );
            let wait = store.job(id).unwrap().scheduled_at - now;
            let unjittered = (base << (failures - 1)).min(cap);
            let (low, high) = (unjittered * 8 / 10, unjittered * 12 / 10);
            assert!(
                (low..=high).contains(&wait),
                "retry {failures} waits {wait} ms, not within {low}..={high}"
            );
            if base << (failures - 1) > cap {
                past_cap.push(wait);
            }
            now += wait;
        }
        // Seven retries past the cap: jittered around the cap, not pinned to one value (such as
        // the upper bound of the jitter).
        assert_eq!(past_cap.len(), 7);
        assert!(past_cap.iter().any(|&w| w != past_cap[0]), "{past_cap:?}");
    }

    fn a_failure_with_no_attempts_left_fails_with_its_exit_code(db) {
        let store = db.store();
        let id = enqueue(&store, &Job::shell("exit 3"));
        let c = claim_one(&store, "w", T0);
        assert_eq!(
            finish(&store, &c, exit(3), T0 + 5),
            Finished::Recorded(Status::Failed)
        );
        let job = store.job(id).unwrap();
        assert_eq!(job.status, Status::Failed);
        assert_eq!(job.exit_code, Some(3));
        assert_eq!(job.error_kind, Some(ErrorKind::Exit));
        assert_eq!(job.completed_at, Some(T0 + 5));
        assert_eq!(job.lease_expires_at, None);
        assert_eq!(job.failed_attempts, 1);
        assert_eq!(last_event(&store, id).kind, "failed");
    }

    fn a_spawn_failure_is_never_retried_even_with_attempts_left(db) {
        let store = db.store();
        let id = enqueue(&store, &Job::command(["/no/such/program"]).max_attempts(5));
        let c = claim_one(&store, "w", T0);
        let spawn = Ending::Failed {
            kind: ErrorKind::Spawn,
            exit_code: None,
            signal: None,
            message: "No such file or directory (os error 2)".into(),
        };
        assert_eq!(
            finish(&store, &c, spawn, T0 + 1),
            Finished::Recorded(Status::Failed)
        );
        let job = store.job(id).unwrap();
        assert_eq!(job.error_kind, Some(ErrorKind::Spawn));
        assert!(job.last_error.unwrap().contains("No such file"));
    }

    fn a_lost_ending_follows_the_recovery_budget_and_on_lost(db) {
        let store = db.store();
        let lost = || Ending::Lost {
            message: "could not renew in time".into(),
        };

        let requeue = enqueue(&store, &Job::shell("true").max_attempts(2));
        let c = claim_one(&store, "w", T0);
        assert_eq!(
            finish_with(&store, &c, lost(), 3, T0 + 1),
            Finished::Recorded(Status::Pending)
        );
        let job = store.job(requeue).unwrap();
        assert_eq!(
            (job.status, job.recovery_count, job.failed_attempts),
            (Status::Pending, 1, 0)
        );
        assert!(job.last_error.unwrap().starts_with(LEASE_EXPIRED_PREFIX));
        assert!(!job.teardown_pending, "the runner killed its own attempt");
        assert_eq!(last_event(&store, requeue).kind, "reclaimed");

        // The budget is spent: recovery 2 > 1.
        let c = claim_one(&store, "w", T0 + 2);
        assert_eq!(
            finish_with(&store, &c, lost(), 1, T0 + 3),
            Finished::Recorded(Status::Failed)
        );
        let job = store.job(requeue).unwrap();
        assert_eq!(
            (job.recovery_count, job.error_kind),
            (2, Some(ErrorKind::Lost))
        );
        assert!(job.last_error.unwrap().contains("exhausted"));
        assert_eq!(last_event(&store, requeue).kind, "lost");

        let fail = enqueue(&store, &Job::shell("true").on_lost(OnLost::Fail));
        let c = claim_one(&store, "w", T0 + 4);
        assert_eq!(
            finish_with(&store, &c, lost(), 3, T0 + 5),
            Finished::Recorded(Status::Failed)
        );
        let job = store.job(fail).unwrap();
        assert_eq!(
            (job.recovery_count, job.error_kind),
            (1, Some(ErrorKind::Lost))
        );
        assert!(job.last_error.unwrap().contains("not executed again"));
    }

    fn an_interrupted_attempt_goes_back_to_pending_without_spending_the_budget(db) {
        let store = db.store();
        let id = enqueue(&store, &Job::shell("sleep 100"));
        let c = claim_one(&store, "w", T0);
        let ending = Ending::Interrupted {
            message: "runner shut down".into(),
        };
        assert_eq!(
            finish(&store, &c, ending, T0 + 7),
            Finished::Recorded(Status::Pending)
        );
        let job = store.job(id).unwrap();
        assert_eq!(job.status, Status::Pending);
        assert_eq!((job.recovery_count, job.failed_attempts), (0, 0));
        assert_eq!(job.scheduled_at, T0 + 7);
        assert_eq!((job.run_token, job.worker_id), (None, None));
        assert_eq!(last_event(&store, id).kind, "interrupted");
        assert_eq!(claim_one(&store, "w", T0 + 7).attempt, 2);
    }

    fn finish_stores_the_output_tail_with_its_truncated_flags(db) {
        let store = db.store();
        let id = enqueue(&store, &Job::shell("echo").max_attempts(2));
        assert_eq!(store.output(id, None).unwrap(), None);
        for (attempt, ending) in [(1, exit(1)), (2, Ending::Succeeded)] {
            let c = claim_one(&store, "w", T0 + 10_000 * attempt);
            let out = format!("out {attempt}").into_bytes();
            let finish = Finish {
                job_id: id,
                run_token: c.run_token.clone(),
                attempt,
                ending,
                output: Some(Output::new(attempt, out, b"err".to_vec(), true, false)),
                notes: vec![(leasehold::EventKind::Leaked, "1 process".into())],
                max_recovery_attempts: 3,
            };
            assert!(matches!(
                store.finish(&finish, T0 + 10_000 * attempt + 1).unwrap(),
                Finished::Recorded(_)
            ));
        }
        let latest = store.output(id, None).unwrap().expect("output stored");
        assert_eq!(latest.attempt, 2);
        assert_eq!(latest.stdout, b"out 2");
        assert_eq!(latest.stderr, b"err");
        assert!(latest.stdout_truncated && !latest.stderr_truncated);
        let first = store
            .output(id, Some(1))
            .unwrap()
            .expect("first attempt's output");
        assert_eq!(first.stdout, b"out 1");
        assert!(kinds(&store, id).contains(&"leaked".to_string()));
    }

    /// Endings recorded together (`finish_many`, as a runner's writer records a batch; on
    /// PostgreSQL the successes in one statement): the one whose lease was lost meanwhile
    /// changes nothing but its `late_result_discarded` event and counter; the others are
    /// recorded with their events, output, counters and histograms, and a dependent released.
    fn endings_recorded_together_fence_only_the_one_whose_lease_is_gone(db) {
        use crate::helper::{EXPIRED, TTL, TTL_MS, sweep};
        let store = db.store();
        let ids: Vec<i64> = (0..4).map(|_| enqueue(&store, &Job::shell("true"))).collect();
        let dependent = enqueue(&store, &Job::shell("true").after([ids[0]]));
        let claimed = claim(&store, "w", 10, T0);
        assert_eq!(claimed.len(), 4, "the dependent waits");
        // Three leases renewed; the last one's expires and a sweep requeues its job.
        let kept: Vec<String> = claimed[..3].iter().map(|c| c.run_token.clone()).collect();
        store.renew("w", &kept, TTL, T0 + TTL_MS - 1).unwrap();
        let report = store.reclaim(&sweep(3, 10), EXPIRED).unwrap();
        assert_eq!(report.reclaimed.len(), 1);
        let finishes: Vec<Finish> = claimed
            .iter()
            .enumerate()
            .map(|(i, c)| Finish {
                job_id: c.id,
                run_token: c.run_token.clone(),
                attempt: c.attempt,
                ending: Ending::Succeeded,
                output: (i == 1).then(|| {
                    Output::new(c.attempt, b"hi\n\x00\xff".to_vec(), Vec::new(), true, false)
                }),
                notes: Vec::new(),
                max_recovery_attempts: 3,
            })
            .collect();

        let done = store.finish_many(&finishes, EXPIRED + 5).unwrap();

        let ok = Finished::Recorded(Status::Succeeded);
        assert_eq!(done, [ok, ok, ok, Finished::Fenced]);
        for c in &claimed[..3] {
            let job = store.job(c.id).unwrap();
            assert_eq!(job.status, Status::Succeeded);
            assert_eq!((job.exit_code, job.completed_at), (Some(0), Some(EXPIRED + 5)));
            assert_eq!(job.lease_expires_at, None);
            assert_eq!(kinds(&store, c.id), ["enqueued", "claimed", "succeeded"]);
        }
        let lost = store.job(claimed[3].id).unwrap();
        assert_eq!(lost.status, Status::Pending);
        assert_eq!(last_event(&store, lost.id).kind.as_str(), "late_result_discarded");
        let out = store.output(claimed[1].id, None).unwrap().expect("its output");
        assert_eq!(out.stdout, b"hi\n\x00\xff");
        assert!(out.stdout_truncated && !out.stderr_truncated);
        assert!(store.output(claimed[0].id, None).unwrap().is_none());
        let counter = |name: &str, outcome: &str| {
            db.scalar(&format!(
                "SELECT CAST(coalesce(sum(value), 0) AS BIGINT) FROM metric_counters
                 WHERE name = '{name}' AND outcome = '{outcome}'"
            ))
        };
        assert_eq!(counter("jobs_ended", "succeeded"), 3);
        assert_eq!(counter("late_results_discarded", ""), 1);
        for histogram in ["wait", "run"] {
            assert_eq!(
                db.scalar(&format!(
                    "SELECT CAST(coalesce(sum(count), 0) AS BIGINT) FROM metric_histograms
                     WHERE name = '{histogram}' AND outcome = 'succeeded'"
                )),
                3,
                "{histogram}"
            );
        }
        // The run histogram's sum: each attempt ran from T0 to EXPIRED + 5.
        assert_eq!(
            db.scalar(
                "SELECT CAST(coalesce(sum(sum_ms), 0) AS BIGINT) FROM metric_histograms
                 WHERE name = 'run' AND outcome = 'succeeded'"
            ),
            3 * (EXPIRED + 5 - T0)
        );
        // The first job's success released its dependent.
        let next = claim(&store, "w", 10, EXPIRED + 6);
        let next: Vec<i64> = next.iter().map(|c| c.id).collect();
        assert!(next.contains(&dependent), "{next:?}");
        assert_eq!(store.counts().unwrap().succeeded, 3);
    }
}
