//! Fences: a stale run token changes nothing, and its late result is only logged.

use leasehold::protocol::{AttemptStart, Ending, Finish, Finished};
use leasehold::{CounterKind, Job, Output, Status};

use crate::helper::{EXPIRED, claim_and_lose, claim_one, enqueue, exit, finish, last_event};
use crate::util::{T0, TestDb, kinds, raw_job_row};

/// Endings that a lost attempt may report late.
fn late_endings() -> [Ending; 3] {
    [
        Ending::Succeeded,
        exit(1),
        Ending::Lost {
            message: "late".into(),
        },
    ]
}

#[test]
fn a_stale_tokens_finish_changes_nothing_but_logs_the_late_result() {
    let db = TestDb::new();
    let store = db.store();
    let bare = db.bare();
    let id = enqueue(&store, &Job::shell("true").max_attempts(3));
    let stale = claim_and_lose(&store, T0, 3);
    assert!(
        store
            .record_teardown(id, &stale.run_token, "gone", EXPIRED)
            .unwrap()
    );
    let current = claim_one(&store, "w2", EXPIRED + 1);
    assert_ne!(current.run_token, stale.run_token);

    let interrupted = Ending::Interrupted {
        message: "late".into(),
    };
    for ending in late_endings().into_iter().chain([interrupted]) {
        let record_before = store.job(id).unwrap();
        let row_before = raw_job_row(&bare, id);
        let events_before = store.events(id).unwrap();
        let late = Finish {
            job_id: id,
            run_token: stale.run_token.clone(),
            attempt: stale.attempt,
            ending: ending.clone(),
            output: Some(Output::new(1, b"late".to_vec(), Vec::new(), false, false)),
            notes: Vec::new(),
            max_recovery_attempts: 3,
        };
        assert_eq!(store.finish(&late, EXPIRED + 2).unwrap(), Finished::Fenced);

        assert_eq!(store.job(id).unwrap(), record_before, "{ending:?}");
        assert_eq!(raw_job_row(&bare, id), row_before, "{ending:?}");
        let events_after = store.events(id).unwrap();
        assert_eq!(events_after.len(), events_before.len() + 1);
        assert_eq!(events_after[..events_before.len()], events_before[..]);
        let added = events_after.last().unwrap();
        assert_eq!(added.kind, "late_result_discarded");
        assert_eq!(added.attempt, stale.attempt);
    }
    assert_eq!(
        store.output(id, None).unwrap(),
        None,
        "no output was stored"
    );
}

#[test]
fn a_late_ending_of_a_lost_attempt_leaves_the_next_running_attempt_untouched() {
    for ending in late_endings() {
        let db = TestDb::new();
        let store = db.store();
        let bare = db.bare();
        let id = enqueue(&store, &Job::shell("true").max_attempts(3));
        // Attempt 1 (token A) loses its lease; attempt 2 (token B) runs on another worker.
        let a = claim_and_lose(&store, T0, 3);
        assert!(
            store
                .record_teardown(id, &a.run_token, "gone", EXPIRED)
                .unwrap()
        );
        let b = claim_one(&store, "w2", EXPIRED + 1);
        assert_ne!(a.run_token, b.run_token);
        let row_before = raw_job_row(&bare, id);

        assert_eq!(
            finish(&store, &a, ending.clone(), EXPIRED + 2),
            Finished::Fenced,
            "{ending:?}"
        );
        let job = store.job(id).unwrap();
        assert_eq!(job.status, Status::Running, "{ending:?}");
        assert_eq!(job.run_token.as_deref(), Some(b.run_token.as_str()));
        assert_eq!(job.worker_id.as_deref(), Some("w2"));
        assert_eq!(job.attempt, 2);
        assert_eq!(job.lease_expires_at, Some(b.lease_expires_at));
        assert_eq!(raw_job_row(&bare, id), row_before, "{ending:?}");
        assert_eq!(last_event(&store, id).kind, "late_result_discarded");
        // Attempt 2 still holds its lease: its own ending is recorded.
        assert_eq!(
            finish(&store, &b, Ending::Succeeded, EXPIRED + 3),
            Finished::Recorded(Status::Succeeded)
        );
    }
}

crate::on_both! {
    fn a_cancel_that_lands_before_a_late_finish_wins(db) {
        let store = db.store();
        let id = enqueue(&store, &Job::shell("true"));
        let c = claim_one(&store, "w", T0);
        assert_eq!(store.cancel_at(id, T0 + 1).unwrap().status, Status::Cancelled);
        assert_eq!(
            finish(&store, &c, Ending::Succeeded, T0 + 2),
            Finished::Stopped
        );
        let job = store.job(id).unwrap();
        assert_eq!(job.status, Status::Cancelled);
        assert_eq!(job.exit_code, None);
        // The cancel's own attempt ending is what the cancel asked for, not a late result: it
        // neither counts as one nor says so.
        assert_eq!(
            kinds(&store, id),
            ["enqueued", "claimed", "cancelled", "attempt_stopped"]
        );
        let m = store.metrics().unwrap();
        assert_eq!(m.counter_total(CounterKind::LateResultsDiscarded), 0);
    }

    fn record_start_is_fenced_by_the_run_token(db) {
        let store = db.store();
        let id = enqueue(&store, &Job::shell("true"));
        let c = claim_one(&store, "w", T0);
        let start = |token: &str| AttemptStart {
            job_id: id,
            run_token: token.to_string(),
            pid: 4242,
            pgid: 4242,
            start_time: 777,
            keeper: None,
        };
        assert!(!store.record_start(&start("0123"), T0 + 1).unwrap());
        assert_eq!(store.job(id).unwrap().pid, None);
        assert!(store.record_start(&start(&c.run_token), T0 + 1).unwrap());
        let job = store.job(id).unwrap();
        assert_eq!((job.pid, job.pgid), (Some(4242), Some(4242)));
        assert_eq!(last_event(&store, id).kind, "started");
    }
}
