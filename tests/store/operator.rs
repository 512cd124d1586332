//! Operator actions: cancel and retry, and which states each refuses.

use leasehold::protocol::Ending;
use leasehold::{Error, Job, Status};

use crate::helper::{
    EXPIRED, TTL, TTL_MS, claim, claim_and_lose, claim_one, enqueue, exit, expect_wrong_state,
    finish, last_event,
};
use crate::util::T0;

crate::on_both! {
    fn cancel_moves_a_pending_job_to_cancelled(db) {
        let store = db.store();
        let id = enqueue(&store, &Job::shell("true"));
        let job = store.cancel_at(id, T0 + 3).unwrap();
        assert_eq!(
            (job.status, job.completed_at),
            (Status::Cancelled, Some(T0 + 3))
        );
        assert!(!job.teardown_pending);
        assert_eq!(last_event(&store, id).kind, "cancelled");
        assert!(claim(&store, "w", 10, T0 + 4).is_empty());
    }

    fn cancelling_a_running_job_revokes_its_lease(db) {
        let store = db.store();
        let id = enqueue(&store, &Job::shell("sleep 100"));
        let c = claim_one(&store, "w", T0);
        let job = store.cancel_at(id, T0 + 3).unwrap();
        assert_eq!(job.status, Status::Cancelled);
        assert_eq!(job.lease_expires_at, None);
        assert!(job.teardown_pending, "its processes must be torn down");
        let renewal = store
            .renew("w", std::slice::from_ref(&c.run_token), TTL, T0 + 4)
            .unwrap();
        assert_eq!(renewal.lost, [c.run_token]);
        assert!(renewal.renewed.is_empty());
        assert!(
            last_event(&store, id)
                .detail
                .unwrap()
                .contains("lease revoked")
        );
    }

    fn cancelling_a_finished_job_is_refused(db) {
        let store = db.store();
        let id = enqueue(&store, &Job::shell("true"));
        let c = claim_one(&store, "w", T0);
        finish(&store, &c, Ending::Succeeded, T0 + 1);
        let message = expect_wrong_state(store.cancel_at(id, T0 + 2), "succeeded");
        assert!(message.contains("already finished"), "{message}");
        let cancelled = enqueue(&store, &Job::shell("true"));
        store.cancel_at(cancelled, T0).unwrap();
        expect_wrong_state(store.cancel_at(cancelled, T0), "cancelled");
        assert!(matches!(
            store.cancel_at(9999, T0),
            Err(Error::NoSuchJob(9999))
        ));
    }

    fn retry_refuses_pending_succeeded_and_live_running_jobs_with_the_reason(db) {
        let store = db.store();
        let pending = enqueue(&store, &Job::shell("true").priority(-1));
        let succeeded = enqueue(&store, &Job::shell("true"));
        let running = enqueue(&store, &Job::shell("true"));
        let c = claim_one(&store, "w", T0);
        assert_eq!(c.id, succeeded);
        finish(&store, &c, Ending::Succeeded, T0);
        assert_eq!(claim_one(&store, "w", T0).id, running);

        let m = expect_wrong_state(store.retry_at(pending, None, T0 + 1), "pending");
        assert!(m.contains("already waiting"), "{m}");
        let m = expect_wrong_state(store.retry_at(succeeded, None, T0 + 1), "succeeded");
        assert!(m.contains("enqueue a new job"), "{m}");
        let m = expect_wrong_state(store.retry_at(running, None, T0 + 1), "running");
        assert!(
            m.contains("lease is live") && m.contains("cancel it instead"),
            "{m}"
        );
        assert_eq!(store.job(running).unwrap().status, Status::Running);
    }

    fn retry_resets_a_failed_or_cancelled_job_to_pending(db) {
        let store = db.store();
        let failed = enqueue(&store, &Job::shell("false"));
        let c = claim_one(&store, "w", T0);
        finish(&store, &c, exit(1), T0 + 1);
        let cancelled = enqueue(&store, &Job::shell("true"));
        store.cancel_at(cancelled, T0 + 2).unwrap();

        let now = T0 + 50_000;
        for (id, reason, last_error) in [
            (failed, Some("  disk fixed "), "manual retry: disk fixed"),
            (cancelled, None, "manual retry after lease recovery"),
        ] {
            let job = store.retry_at(id, reason, now).unwrap();
            assert_eq!(job.status, Status::Pending);
            assert_eq!(job.scheduled_at, now);
            assert_eq!(
                (job.started_at, job.completed_at, job.heartbeat_at),
                (None, None, None)
            );
            assert_eq!(
                (job.lease_expires_at, job.run_token, job.worker_id),
                (None, None, None)
            );
            assert_eq!(
                (job.recovery_count, job.attempt, job.failed_attempts),
                (0, 0, 0)
            );
            assert_eq!((job.exit_code, job.error_kind), (None, None));
            assert_eq!(job.last_error.as_deref(), Some(last_error));
            assert!(!job.teardown_pending);
            let event = last_event(&store, id);
            assert_eq!(
                (event.kind.as_str(), event.detail.as_deref()),
                ("manual_retry", Some(last_error))
            );
        }
        let again = claim_one(&store, "w", now);
        assert_eq!(again.attempt, 1);
    }

    fn retry_of_a_running_job_with_an_expired_lease_tears_the_attempt_down_first(db) {
        let store = db.store();
        let id = enqueue(&store, &Job::shell("sleep 100"));
        let c = claim_one(&store, "w", T0);
        let job = store.retry_at(id, Some("runner host died"), EXPIRED).unwrap();
        assert_eq!(job.status, Status::Pending);
        assert_eq!((job.attempt, job.recovery_count), (0, 0));
        assert!(job.teardown_pending);
        let teardowns = store.pending_teardowns(10).unwrap();
        assert_eq!(teardowns.len(), 1);
        assert_eq!(teardowns[0].run_token, c.run_token);
        assert!(claim(&store, "w", 1, EXPIRED).is_empty());
        assert!(
            store
                .record_teardown(id, &c.run_token, "gone", EXPIRED)
                .unwrap()
        );
        assert_eq!(claim_one(&store, "w", EXPIRED).id, id);
    }

    fn retry_failed_stale_retries_exhausted_jobs_newest_failure_first_up_to_a_limit(db) {
        let store = db.store();
        // A budget of 0: the first reclaim fails the job.
        let mut exhausted = Vec::new();
        for i in 0..3 {
            let id = enqueue(&store, &Job::shell("true"));
            let c = claim_and_lose(&store, T0 + i * 100_000, 0);
            store
                .record_teardown(id, &c.run_token, "gone", T0 + i * 100_000 + TTL_MS + 2)
                .unwrap();
            assert_eq!(store.job(id).unwrap().status, Status::Failed);
            exhausted.push(id);
        }
        let ordinary = enqueue(&store, &Job::shell("false"));
        let c = claim_one(&store, "w", T0 + 500_000);
        finish(&store, &c, exit(1), T0 + 500_001);

        let first = store
            .retry_failed_stale(Some(2), 0, Some("fixed"))
            .unwrap();
        assert_eq!(first, [exhausted[2], exhausted[1]]);
        let rest = store.retry_failed_stale(None, 0, None).unwrap();
        assert_eq!(rest, [exhausted[0]]);
        assert!(
            store
                .retry_failed_stale(None, 0, None)
                .unwrap()
                .is_empty()
        );
        for id in &exhausted {
            let job = store.job(*id).unwrap();
            assert_eq!((job.status, job.recovery_count), (Status::Pending, 0));
        }
        assert_eq!(
            store.job(first[0]).unwrap().last_error.as_deref(),
            Some("manual retry: fixed")
        );
        assert_eq!(store.job(ordinary).unwrap().status, Status::Failed);
    }
}
