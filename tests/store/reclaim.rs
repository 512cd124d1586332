//! Reclaims: expired leases, missing lease metadata, dead runners, the recovery budget, and
//! the teardown that must come before the next claim.

use std::sync::Barrier;
use std::thread;

use leasehold::protocol::{AttemptStart, ReclaimRequest};
use leasehold::{
    ErrorKind, Job, LEASE_EXPIRED_PREFIX, LEASE_MISSING_PREFIX, ListFilter, OnLost, Status,
};

use crate::helper::{
    EXPIRED, TTL_MS, claim, claim_and_lose, claim_one, enqueue, last_event, sweep,
};
use crate::util::{T0, TestDb, kinds, raw_job_row};

#[test]
fn a_lease_not_yet_expired_is_untouched() {
    let db = TestDb::new();
    let store = db.store();
    let bare = db.bare();
    let id = enqueue(&store, &Job::shell("true"));
    claim_one(&store, "w", T0);
    let before = raw_job_row(&bare, id);
    for now in [T0 + 1, T0 + TTL_MS - 1, T0 + TTL_MS] {
        assert!(
            store
                .reclaim(&sweep(3, 10), now)
                .unwrap()
                .reclaimed
                .is_empty()
        );
    }
    assert_eq!(raw_job_row(&bare, id), before);
    assert_eq!(kinds(&store, id), ["enqueued", "claimed"]);
}

#[test]
fn a_running_row_without_lease_metadata_is_requeued() {
    let db = TestDb::new();
    let store = db.store();
    let bare = db.bare();
    let no_expiry = enqueue(&store, &Job::shell("true"));
    let nothing = enqueue(&store, &Job::shell("true"));
    bare.execute(
        "UPDATE jobs SET status = 'running', attempt = 1, run_token = 'abc', worker_id = 'old',
             lease_expires_at = NULL WHERE id = ?1",
        [no_expiry],
    )
    .unwrap();
    bare.execute(
        "UPDATE jobs SET status = 'running', attempt = 1 WHERE id = ?1",
        [nothing],
    )
    .unwrap();
    let counts = store.lease_counts(3, T0).unwrap();
    assert_eq!((counts.running, counts.running_without_lease), (2, 2));

    let report = store.reclaim(&sweep(3, 10), T0).unwrap();
    assert_eq!(report.pending(), 2);
    for (id, absent) in [
        (no_expiry, "lease_expires_at"),
        (nothing, "run_token, worker_id, lease_expires_at"),
    ] {
        let job = store.job(id).unwrap();
        assert_eq!((job.status, job.recovery_count), (Status::Pending, 1));
        let error = job.last_error.unwrap();
        assert!(error.starts_with(LEASE_MISSING_PREFIX), "{error}");
        assert!(error.ends_with(absent), "{error}");
        assert!(job.teardown_pending);
    }
    let teardowns = store.pending_teardowns(10).unwrap();
    let tokens: Vec<&str> = teardowns.iter().map(|t| t.run_token.as_str()).collect();
    assert_eq!(tokens, ["abc", ""]);
}

#[test]
fn reclaim_without_expired_skips_expired_leases_but_takes_leaseless_rows_and_dead_runners() {
    let db = TestDb::new();
    let store = db.store();
    let expired = enqueue(&store, &Job::shell("true"));
    let dead_job = enqueue(&store, &Job::shell("true"));
    let leaseless = enqueue(&store, &Job::shell("true"));
    claim_one(&store, "slept", T0);
    claim_one(&store, "dead", EXPIRED);
    db.bare()
        .execute(
            "UPDATE jobs SET status = 'running', attempt = 1 WHERE id = ?1",
            [leaseless],
        )
        .unwrap();
    let dead = [("dead".to_string(), "boot id changed".to_string())];
    let settling = ReclaimRequest {
        dead_workers: &dead,
        expired: false,
        ..sweep(3, 10)
    };
    let report = store.reclaim(&settling, EXPIRED + 1).unwrap();
    let mut ids: Vec<i64> = report.reclaimed.iter().map(|r| r.lost.job_id).collect();
    ids.sort();
    assert_eq!(ids, [dead_job, leaseless]);
    assert_eq!(store.job(expired).unwrap().status, Status::Running);

    let report = store.reclaim(&sweep(3, 10), EXPIRED + 1).unwrap();
    let ids: Vec<i64> = report.reclaimed.iter().map(|r| r.lost.job_id).collect();
    assert_eq!(ids, [expired]);
}

/// A dead runner's attempts that ran under keepers: one whose keeper left its outcome is
/// recorded as the keeper saw it (no rerun), one whose keeper is alive moves to the sweeping
/// runner under the same token, and one with neither is reclaimed as before.
#[test]
fn a_dead_runners_kept_attempts_are_recovered_adopted_or_reclaimed_as_judged() {
    use leasehold::protocol::{Ending, KeptAttempt, KeptVerdict};
    let db = TestDb::new();
    let store = db.store();
    let ids: Vec<i64> = (0..3)
        .map(|_| enqueue(&store, &Job::shell("true")))
        .collect();
    let claims = claim(&store, "dead", 3, T0);
    for (i, c) in claims.iter().enumerate() {
        let start = AttemptStart {
            job_id: c.id,
            run_token: c.run_token.clone(),
            pid: 7000 + i as i32,
            pgid: 7000 + i as i32,
            start_time: 500,
            keeper: Some((6000 + i as i32, 400)),
        };
        assert!(store.record_start(&start, T0 + 1).unwrap());
    }
    let verdict_of = |k: &KeptAttempt| match k.keeper.map(|(pid, _)| pid) {
        Some(6000) => KeptVerdict::Recovered {
            ending: Ending::Succeeded,
            output: None,
            detail: "exit 0 at T0+5".into(),
        },
        Some(6001) => KeptVerdict::Adopt,
        _ => KeptVerdict::Reclaim,
    };
    let judged = std::sync::Mutex::new(Vec::new());
    let judge = |k: &KeptAttempt| {
        judged.lock().unwrap().push((k.job_id, k.keeper, k.pgid));
        verdict_of(k)
    };
    let dead = [("dead".to_string(), "its pid is gone".to_string())];
    let req = ReclaimRequest {
        exclude_worker: Some("me"),
        dead_workers: &dead,
        expired: false,
        keepers: Some(&judge),
        ..sweep(3, 10)
    };
    let report = store.reclaim(&req, T0 + 10).unwrap();
    assert_eq!(judged.lock().unwrap().len(), 3);
    assert_eq!(report.recovered.len(), 1);
    assert_eq!(report.recovered[0].1, Status::Succeeded);
    assert_eq!(report.adopted.len(), 1);
    assert_eq!(report.reclaimed.len(), 1);
    let by_keeper = |pid: i32| {
        claims
            .iter()
            .zip(&ids)
            .find(|(c, _)| store.job(c.id).unwrap().keeper_pid == Some(i64::from(pid)))
            .map(|(c, _)| c.clone())
            .expect("a job with that keeper")
    };

    let recovered = store.job(by_keeper(6000).id).unwrap();
    assert_eq!(recovered.status, Status::Succeeded);
    assert_eq!(recovered.attempt, 1, "no rerun");
    let k = kinds(&store, recovered.id);
    assert!(k.contains(&"outcome_recovered".to_string()), "{k:?}");
    // Whatever of the attempt is left alive (an escaped descendant) is torn down.
    assert!(
        recovered.teardown_pending,
        "the recovered attempt keeps a teardown marker"
    );

    let adopted_claim = by_keeper(6001);
    let adopted = store.job(adopted_claim.id).unwrap();
    assert_eq!(adopted.status, Status::Running);
    assert_eq!(adopted.worker_id.as_deref(), Some("me"));
    assert_eq!(adopted.run_token, Some(adopted_claim.run_token.clone()));
    assert_eq!(adopted.lease_expires_at, Some(T0 + 10 + TTL_MS));
    assert_eq!(last_event(&store, adopted.id).kind.as_str(), "adopted");
    assert!(
        !adopted.teardown_pending,
        "an adopted attempt is not torn down"
    );

    let reclaimed = store.job(by_keeper(6002).id).unwrap();
    assert_eq!(reclaimed.status, Status::Pending);
    assert_eq!(reclaimed.recovery_count, 1);
    assert!(reclaimed.teardown_pending);
}

crate::on_both! {
    fn an_expired_lease_is_requeued_with_one_more_recovery(db) {
        let store = db.store();
        let id = enqueue(&store, &Job::shell("true"));
        let c = claim_one(&store, "w", T0);
        let report = store.reclaim(&sweep(3, 10), EXPIRED).unwrap();
        assert_eq!((report.pending(), report.failed()), (1, 0));
        let r = &report.reclaimed[0];
        assert_eq!((r.lost.job_id, r.lost.attempt), (id, 1));
        assert_eq!(r.lost.run_token, c.run_token);
        assert_eq!(r.worker_id.as_deref(), Some("w"));

        let job = store.job(id).unwrap();
        assert_eq!(job.status, Status::Pending);
        assert_eq!(job.recovery_count, 1);
        assert_eq!(job.scheduled_at, EXPIRED);
        assert_eq!(
            (job.run_token, job.worker_id, job.lease_expires_at),
            (None, None, None)
        );
        let error = job.last_error.unwrap();
        assert!(error.starts_with(LEASE_EXPIRED_PREFIX), "{error}");
        assert_eq!(error, r.message);
        let event = last_event(&store, id);
        assert_eq!((event.kind.as_str(), event.attempt), ("reclaimed", 1));
    }

    fn the_fourth_reclaim_with_a_budget_of_three_fails_the_job_as_lost(db) {
        let store = db.store();
        let id = enqueue(&store, &Job::shell("true"));
        let mut now = T0;
        for round in 1..=4 {
            let c = claim_and_lose(&store, now, 3);
            now += TTL_MS + 1;
            let job = store.job(id).unwrap();
            assert_eq!(job.recovery_count, round);
            let expected = if round <= 3 {
                Status::Pending
            } else {
                Status::Failed
            };
            assert_eq!(job.status, expected, "after reclaim {round}");
            assert!(
                store
                    .record_teardown(id, &c.run_token, "group gone", now)
                    .unwrap()
            );
            now += 1;
        }
        let job = store.job(id).unwrap();
        assert_eq!(job.error_kind, Some(ErrorKind::Lost));
        assert!(job.completed_at.is_some());
        assert!(
            job.last_error
                .as_deref()
                .unwrap()
                .starts_with(LEASE_EXPIRED_PREFIX)
        );
        assert_eq!(last_event(&store, id).kind, "torn_down");
        assert_eq!(
            kinds(&store, id)
                .iter()
                .filter(|k| *k == "reclaimed")
                .count(),
            3
        );
        assert!(kinds(&store, id).contains(&"lost".to_string()));

        assert_eq!(
            store
                .lease_counts(3, now)
                .unwrap()
                .recovery_exhausted_failed,
            1
        );
        assert_eq!(
            store
                .lease_counts(4, now)
                .unwrap()
                .recovery_exhausted_failed,
            0
        );
        let stale = |max| ListFilter {
            failed_stale: Some(max),
            ..ListFilter::default()
        };
        let listed: Vec<i64> = store
            .list(&stale(3))
            .unwrap()
            .iter()
            .map(|j| j.id)
            .collect();
        assert_eq!(listed, [id]);
        assert!(store.list(&stale(4)).unwrap().is_empty());
    }

    fn on_lost_fail_fails_at_once_and_is_not_run_again(db) {
        let store = db.store();
        let id = enqueue(&store, &Job::shell("charge card").on_lost(OnLost::Fail));
        claim_and_lose(&store, T0, 3);
        let job = store.job(id).unwrap();
        assert_eq!(job.status, Status::Failed);
        assert_eq!(job.recovery_count, 1);
        assert_eq!(job.error_kind, Some(ErrorKind::Lost));
        let error = job.last_error.unwrap();
        assert!(error.starts_with(LEASE_EXPIRED_PREFIX));
        assert!(error.contains("not executed again"), "{error}");
        assert_eq!(last_event(&store, id).kind, "lost");
    }

    fn reclaim_honours_its_batch_size_and_zero_reclaims_nothing(db) {
        let store = db.store();
        store
            .enqueue_many_at(&vec![Job::shell("true"); 5], T0)
            .unwrap();
        claim(&store, "w", 5, T0);
        assert!(
            store
                .reclaim(&sweep(3, 0), EXPIRED)
                .unwrap()
                .reclaimed
                .is_empty()
        );
        assert_eq!(store.counts().unwrap().running, 5);
        assert_eq!(
            store
                .reclaim(&sweep(3, 2), EXPIRED)
                .unwrap()
                .reclaimed
                .len(),
            2
        );
        assert_eq!(
            store
                .reclaim(&sweep(3, 10), EXPIRED)
                .unwrap()
                .reclaimed
                .len(),
            3
        );
        assert_eq!(store.counts().unwrap().pending, 5);
    }

    fn reclaim_never_takes_the_excluded_workers_jobs(db) {
        let store = db.store();
        let mine = enqueue(&store, &Job::shell("true"));
        let theirs = enqueue(&store, &Job::shell("true"));
        claim_one(&store, "me", T0);
        claim_one(&store, "them", T0);
        let req = ReclaimRequest {
            exclude_worker: Some("me"),
            ..sweep(3, 10)
        };
        let report = store.reclaim(&req, EXPIRED + 60_000).unwrap();
        let ids: Vec<i64> = report.reclaimed.iter().map(|r| r.lost.job_id).collect();
        assert_eq!(ids, [theirs]);
        assert_eq!(store.job(mine).unwrap().status, Status::Running);
    }

    /// A runner's own expired lease whose token none of its workers holds (an ending it gave
    /// up on) is reclaimed by its own sweep; the leases it holds are not, expired or not.
    fn reclaim_takes_the_excluded_workers_expired_leases_that_it_no_longer_holds(db) {
        let store = db.store();
        let held = enqueue(&store, &Job::shell("true"));
        let given_up = enqueue(&store, &Job::shell("true"));
        let fresh = enqueue(&store, &Job::shell("true"));
        let held_token = claim_one(&store, "me", T0).run_token;
        claim_one(&store, "me", T0);
        claim_one(&store, "me", EXPIRED + 59_000);
        let tokens = [held_token];
        let req = ReclaimRequest {
            exclude_worker: Some("me"),
            held_tokens: Some(&tokens),
            ..sweep(3, 10)
        };
        let report = store.reclaim(&req, EXPIRED + 60_000).unwrap();
        let ids: Vec<i64> = report.reclaimed.iter().map(|r| r.lost.job_id).collect();
        assert_eq!(ids, [given_up]);
        assert_eq!(store.job(given_up).unwrap().status, Status::Pending);
        assert_eq!(store.job(held).unwrap().status, Status::Running);
        assert_eq!(store.job(fresh).unwrap().status, Status::Running);
    }

    fn a_dead_runners_jobs_are_reclaimed_before_their_lease_expires(db) {
        let store = db.store();
        let dead_job = enqueue(&store, &Job::shell("true"));
        let live_job = enqueue(&store, &Job::shell("true"));
        claim_one(&store, "dead", T0);
        claim_one(&store, "alive", T0);
        let dead = [("dead".to_string(), "pid 4321 is gone".to_string())];
        let req = ReclaimRequest {
            dead_workers: &dead,
            ..sweep(3, 10)
        };
        let report = store.reclaim(&req, T0 + 1000).unwrap();
        let ids: Vec<i64> = report.reclaimed.iter().map(|r| r.lost.job_id).collect();
        assert_eq!(ids, [dead_job]);
        let error = store.job(dead_job).unwrap().last_error.unwrap();
        assert!(error.starts_with(LEASE_EXPIRED_PREFIX), "{error}");
        assert!(error.contains("pid 4321 is gone"), "{error}");
        assert_eq!(store.job(live_job).unwrap().status, Status::Running);
    }

    fn a_reclaimed_job_is_not_claimable_until_its_teardown_is_recorded(db) {
        let store = db.store();
        let id = enqueue(&store, &Job::shell("sleep 100"));
        let c = claim_one(&store, "w", T0);
        let start = AttemptStart {
            job_id: id,
            run_token: c.run_token.clone(),
            pid: 5000,
            pgid: 5000,
            start_time: 123_456,
            keeper: None,
        };
        assert!(store.record_start(&start, T0 + 1).unwrap());
        store.reclaim(&sweep(3, 10), EXPIRED).unwrap();

        let job = store.job(id).unwrap();
        assert_eq!(job.status, Status::Pending);
        assert!(job.teardown_pending);
        assert!(claim(&store, "w", 10, EXPIRED + 3_600_000).is_empty());
        let teardowns = store.pending_teardowns(10).unwrap();
        assert_eq!(teardowns.len(), 1);
        let t = &teardowns[0];
        assert_eq!((t.job_id, t.attempt), (id, 1));
        assert_eq!(t.run_token, c.run_token);
        assert_eq!((t.pgid, t.start_time), (Some(5000), Some(123_456)));

        assert!(
            !store
                .record_teardown(id, "not-the-token", "x", EXPIRED + 1)
                .unwrap()
        );
        assert!(store.job(id).unwrap().teardown_pending);
        assert!(
            store
                .record_teardown(id, &c.run_token, "group 5000 killed", EXPIRED + 1)
                .unwrap()
        );
        assert!(
            !store
                .record_teardown(id, &c.run_token, "again", EXPIRED + 2)
                .unwrap()
        );
        let event = last_event(&store, id);
        assert_eq!(
            (event.kind.as_str(), event.detail.as_deref()),
            ("torn_down", Some("group 5000 killed"))
        );
        assert!(store.pending_teardowns(10).unwrap().is_empty());
        assert!(!store.job(id).unwrap().teardown_pending);
        assert_eq!(claim_one(&store, "w", EXPIRED + 3).attempt, 2);
    }

    fn two_sweeps_at_once_reclaim_an_expired_job_once(db) {
        let store = db.store();
        let mut stores = [db.store(), db.store()];
        for round in 0..10 {
            let id = enqueue(&store, &Job::shell("true"));
            let now = T0 + round * 100_000;
            claim_one(&store, "w", now);
            let barrier = Barrier::new(2);
            let reclaimed: usize = thread::scope(|s| {
                let sweeps: Vec<_> = stores
                    .iter_mut()
                    .map(|st| {
                        let barrier = &barrier;
                        s.spawn(move || {
                            barrier.wait();
                            st.reclaim(&sweep(3, 10), now + TTL_MS + 1)
                                .unwrap()
                                .reclaimed
                                .len()
                        })
                    })
                    .collect();
                sweeps.into_iter().map(|t| t.join().unwrap()).sum()
            });
            assert_eq!(reclaimed, 1, "round {round}");
            assert_eq!(kinds(&store, id), ["enqueued", "claimed", "reclaimed"]);
            assert_eq!(store.job(id).unwrap().recovery_count, 1);
        }
    }
}
