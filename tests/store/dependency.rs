//! Dependencies: a job runs only after the jobs it names succeeded; a failure or a cancel
//! cancels the jobs after it, down the chain, in the ending's own transaction; what cannot
//! be satisfied is refused with nothing written; waiting jobs cost a claim nothing.

use leasehold::protocol::{Claimed, Ending, Finished};
use leasehold::{Error, Job, ListFilter, Status, Store};

use crate::helper::{claim, claim_one, enqueue, exit, finish, sweep};
use crate::util::{T0, TestDb, kinds};

fn ids(claimed: &[Claimed]) -> Vec<i64> {
    claimed.iter().map(|c| c.id).collect()
}

fn job(after: &[i64]) -> Job {
    Job::shell("true").after(after.iter().copied())
}

/// Everything in the file, to compare before and after a refused enqueue.
fn snapshot(store: &Store) -> (Vec<i64>, usize) {
    let jobs = store.list(&ListFilter::default()).unwrap();
    let events: usize = jobs.iter().map(|j| store.events(j.id).unwrap().len()).sum();
    (jobs.iter().map(|j| j.id).collect(), events)
}

#[test]
fn a_hundred_thousand_waiting_jobs_do_not_change_which_ready_job_is_claimed_next() {
    let ready: Vec<Job> = (0..1_000)
        .map(|i| {
            Job::shell("true")
                .priority(i % 7)
                .queue(if i % 2 == 0 { "a" } else { "b" })
        })
        .collect();
    let order = |waiting: usize| -> Vec<i64> {
        let db = TestDb::new();
        let store = db.store();
        let blocker = enqueue(&store, &Job::shell("true").queue("blocker"));
        store.pause_queue("blocker").unwrap();
        // Waiting jobs first, at a higher priority than any ready one.
        let waiting: Vec<Job> = (0..waiting)
            .map(|_| Job::shell("true").priority(100).after([blocker]))
            .collect();
        let skip = store.enqueue_many_at(&waiting, T0).unwrap().len() as i64;
        store.enqueue_many_at(&ready, T0).unwrap();
        // The ids of the ready jobs, counted from the first of them.
        let first = 2 + skip;
        let mut taken = Vec::new();
        for i in 0..20 {
            taken.extend(claim(&store, "w", 3, T0 + i).iter().map(|c| c.id - first));
        }
        taken
    };
    let alone = order(0);
    assert_eq!(alone.len(), 60);
    assert_eq!(order(100_000), alone);
}

/// Prunes only the failed jobs, at once.
fn prune_failed(store: &Store, now: i64) {
    let policy = leasehold::Retention::keep_all().failed(Some(std::time::Duration::ZERO));
    assert!(
        store
            .prune_at(&policy, &leasehold::PruneOptions::default(), now)
            .unwrap()
            .jobs
            > 0
    );
}

crate::on_both! {
    fn a_chain_runs_in_order(db) {
        let store = db.store();
        let a = enqueue(&store, &job(&[]));
        let b = enqueue(&store, &job(&[a]));
        let c = enqueue(&store, &job(&[b]));
        assert_eq!(store.job(c).unwrap().waiting_for, [b]);

        for (step, expected) in [a, b, c].into_iter().enumerate() {
            let now = T0 + step as i64;
            let claimed = claim(&store, "w", 10, now);
            assert_eq!(ids(&claimed), [expected], "step {step}");
            assert_eq!(
                finish(&store, &claimed[0], Ending::Succeeded, now),
                Finished::Recorded(Status::Succeeded)
            );
        }
        assert!(claim(&store, "w", 10, T0 + 10).is_empty());
        let c = store.job(c).unwrap();
        assert_eq!((c.after, c.waiting_for), (vec![b], vec![]));
    }

    fn a_diamond_waits_for_both_parents(db) {
        let store = db.store();
        let root = enqueue(&store, &job(&[]));
        let left = enqueue(&store, &job(&[root]));
        let right = enqueue(&store, &job(&[root]));
        let join = enqueue(&store, &job(&[left, right]));

        let r = claim_one(&store, "w", T0);
        finish(&store, &r, Ending::Succeeded, T0);
        let both = claim(&store, "w", 10, T0 + 1);
        assert_eq!(ids(&both), [left, right]);
        finish(&store, &both[0], Ending::Succeeded, T0 + 2);
        assert!(claim(&store, "w", 10, T0 + 3).is_empty(), "one parent left");
        assert_eq!(store.job(join).unwrap().waiting_for, [right]);
        finish(&store, &both[1], Ending::Succeeded, T0 + 4);
        assert_eq!(ids(&claim(&store, "w", 10, T0 + 5)), [join]);
    }

    fn a_failure_cancels_the_chain_after_it_with_the_reason(db) {
        let store = db.store();
        let a = enqueue(&store, &job(&[]));
        let b = enqueue(&store, &job(&[a]));
        let c = enqueue(&store, &job(&[b]));
        let unrelated = enqueue(&store, &job(&[]));

        let claimed = claim_one(&store, "w", T0);
        assert_eq!(claimed.id, a);
        assert_eq!(
            finish(&store, &claimed, exit(3), T0 + 1),
            Finished::Recorded(Status::Failed)
        );
        let b = store.job(b).unwrap();
        assert_eq!(b.status, Status::Cancelled);
        assert_eq!(
            b.last_error.as_deref(),
            Some(format!("dependency job {a} failed").as_str())
        );
        assert_eq!(b.completed_at, Some(T0 + 1));
        assert_eq!(kinds(&store, b.id), ["enqueued", "cancelled"]);
        let c = store.job(c).unwrap();
        assert_eq!(c.status, Status::Cancelled);
        let reason = c.last_error.unwrap();
        assert!(
            reason.starts_with(&format!("dependency job {} cancelled", b.id))
                && reason.contains(&a.to_string()),
            "{reason}"
        );
        assert_eq!(store.job(unrelated).unwrap().status, Status::Pending);
    }

    fn a_retry_scheduled_after_a_failure_keeps_the_dependents_waiting(db) {
        let store = db.store();
        let a = enqueue(&store, &Job::shell("true").max_attempts(2));
        let b = enqueue(&store, &job(&[a]));
        let claimed = claim_one(&store, "w", T0);
        assert_eq!(
            finish(&store, &claimed, exit(1), T0 + 1),
            Finished::Recorded(Status::Pending)
        );
        let b = store.job(b).unwrap();
        assert_eq!((b.status, b.waiting_for), (Status::Pending, vec![a]));
    }

    fn a_cancel_or_a_lost_attempt_that_fails_cancels_the_dependents_too(db) {
        let store = db.store();
        let a = enqueue(&store, &job(&[]));
        let b = enqueue(&store, &job(&[a]));
        store.cancel_at(a, T0 + 1).unwrap();
        let b = store.job(b).unwrap();
        assert_eq!(b.status, Status::Cancelled);
        assert_eq!(
            b.last_error.as_deref(),
            Some(format!("dependency job {a} cancelled").as_str())
        );

        // Lost beyond a budget of 0: failed as lost, in the sweep's transaction.
        let x = enqueue(&store, &job(&[]));
        let y = enqueue(&store, &job(&[x]));
        claim_one(&store, "w", T0);
        let report = store
            .reclaim(&sweep(0, 10), crate::helper::EXPIRED)
            .unwrap();
        assert_eq!(report.reclaimed.len(), 1);
        assert_eq!(store.job(x).unwrap().status, Status::Failed);
        let y = store.job(y).unwrap();
        assert_eq!(y.status, Status::Cancelled);
        assert_eq!(
            y.last_error.as_deref(),
            Some(format!("dependency job {x} failed").as_str())
        );
    }

    fn a_retry_of_the_failed_dependency_does_not_revive_its_dependents(db) {
        let store = db.store();
        let a = enqueue(&store, &job(&[]));
        let b = enqueue(&store, &job(&[a]));
        let claimed = claim_one(&store, "w", T0);
        finish(&store, &claimed, exit(1), T0);

        // The dependent first: refused while its dependency cannot succeed.
        let e = store.retry_at(b, None, T0 + 1).unwrap_err();
        assert!(
            e.to_string().contains(&format!("retry job {a} first")),
            "{e}"
        );
        store.retry_at(a, None, T0 + 2).unwrap();
        assert_eq!(store.job(b).unwrap().status, Status::Cancelled);
        // Retried in turn, it waits for the dependency again.
        let b = store.retry_at(b, None, T0 + 3).unwrap();
        assert_eq!((b.status, b.waiting_for), (Status::Pending, vec![a]));
        assert_eq!(ids(&claim(&store, "w", 10, T0 + 4)), [a]);
    }

    fn a_dependency_that_already_succeeded_is_satisfied_at_once(db) {
        let store = db.store();
        let a = enqueue(&store, &job(&[]));
        let claimed = claim_one(&store, "w", T0);
        finish(&store, &claimed, Ending::Succeeded, T0);
        let b = enqueue(&store, &job(&[a]));
        let record = store.job(b).unwrap();
        assert_eq!((record.after, record.waiting_for), (vec![a], vec![]));
        assert_eq!(ids(&claim(&store, "w", 10, T0 + 1)), [b]);
    }

    fn a_dependency_that_is_running_is_waited_for(db) {
        let store = db.store();
        let a = enqueue(&store, &job(&[]));
        let running = claim_one(&store, "w", T0);
        let b = enqueue(&store, &job(&[a]));
        assert!(claim(&store, "w", 10, T0 + 1).is_empty());
        finish(&store, &running, Ending::Succeeded, T0 + 2);
        assert_eq!(ids(&claim(&store, "w", 10, T0 + 3)), [b]);
    }

    fn naming_an_unknown_failed_or_cancelled_job_or_itself_is_refused_with_nothing_written(db) {
        let store = db.store();
        let failed = enqueue(&store, &job(&[]));
        let claimed = claim_one(&store, "w", T0);
        finish(&store, &claimed, exit(1), T0);
        let cancelled = enqueue(&store, &job(&[]));
        store.cancel_at(cancelled, T0).unwrap();
        let pending = enqueue(&store, &job(&[]));
        let before = snapshot(&store);
        // The id the next job would get: naming it names the job itself. (A job can only name
        // jobs that exist before it, so no cycle can be made; naming itself is the one loop.)
        let itself = pending + 1;

        let mut cases = vec![
            (9_999, "no such job"),
            (failed, "it is failed"),
            (cancelled, "it is cancelled"),
        ];
        // PostgreSQL's id sequence is not transactional: a refused enqueue has used its id,
        // so the next id cannot be named in advance there. SQLite gives it again.
        if !db.is_postgres() {
            cases.push((itself, "a job cannot run after itself"));
        }
        for (dep, reason) in cases {
            for result in [
                store.enqueue_at(&job(&[pending, dep]), T0),
                store
                    .enqueue_many_at(&[job(&[dep]), job(&[pending])], T0)
                    .map(|ids| ids[0]),
            ] {
                match result {
                    Err(Error::Dependency { id, reason: r }) => {
                        assert_eq!(id, dep);
                        assert!(r.starts_with(reason), "{r}");
                    }
                    other => panic!("naming {dep}: expected a refusal, got {other:?}"),
                }
                assert_eq!(snapshot(&store), before, "nothing written for {dep}");
            }
        }
        // On SQLite the id was not used up: the next job gets it, and may name the others.
        let next = enqueue(&store, &job(&[pending]));
        if !db.is_postgres() {
            assert_eq!(next, itself);
        }
    }

    fn a_retry_after_a_pruned_failed_dependency_is_refused(db) {
        let store = db.store();
        let a = enqueue(&store, &job(&[]));
        let b = enqueue(&store, &job(&[a]));
        let claimed = claim_one(&store, "w", T0);
        finish(&store, &claimed, exit(1), T0);
        assert_eq!(store.job(b).unwrap().status, Status::Cancelled);
        prune_failed(&store, T0 + 10);
        assert!(matches!(store.job(a), Err(Error::NoSuchJob(_))));

        // Pruned while it had not succeeded: it counts as failed, as `--after` it is refused.
        let e = store.retry_at(b, None, T0 + 11).unwrap_err();
        assert!(
            e.to_string().contains(&format!("job {a}")) && e.to_string().contains("pruned"),
            "{e}"
        );
        assert_eq!(store.job(b).unwrap().status, Status::Cancelled);
        assert!(claim(&store, "w", 10, T0 + 12).is_empty());
    }

    fn a_retry_after_a_pruned_succeeded_dependency_runs(db) {
        let store = db.store();
        let a = enqueue(&store, &job(&[]));
        let c = enqueue(&store, &job(&[]));
        // Cancelled while still waiting for both; a then succeeds, c fails and is retried to success.
        let b = enqueue(&store, &job(&[a, c]));
        store.cancel_at(b, T0).unwrap();
        let first = claim(&store, "w", 10, T0 + 1);
        assert_eq!(ids(&first), [a, c]);
        finish(&store, &first[0], Ending::Succeeded, T0 + 2);
        finish(&store, &first[1], Ending::Succeeded, T0 + 2);
        let policy = leasehold::Retention::keep_all().succeeded(Some(std::time::Duration::ZERO));
        assert_eq!(store.prune_at(&policy, &leasehold::PruneOptions::default(), T0 + 10).unwrap().jobs, 2);

        let b = store.retry_at(b, None, T0 + 11).unwrap();
        assert_eq!((b.status, b.waiting_for), (Status::Pending, vec![]));
        assert_eq!(ids(&claim(&store, "w", 10, T0 + 12)), [b.id]);
    }

    fn a_bulk_enqueue_refused_after_many_slices_leaves_nothing(db) {
        let store = db.store();
        let before = snapshot(&store);
        // Enough jobs for many slices of the bulk enqueue; the last names an unknown job.
        // A slice holds the lock for 50 ms: about 2,000 rows on SQLite, and a few hundred
        // rows on PostgreSQL, a round trip each (40,000 there took over two minutes on a
        // loaded machine).
        let n = if db.is_postgres() { 5_000 } else { 40_000 };
        let mut jobs: Vec<Job> = (0..n)
            .map(|i| Job::shell(format!("true {i}")))
            .collect();
        jobs.push(job(&[1_000_000]));
        let e = store.enqueue_many_at(&jobs, T0).unwrap_err();
        assert!(matches!(e, Error::Dependency { id: 1_000_000, .. }), "{e}");
        assert_eq!(snapshot(&store), before, "nothing is kept");
        assert_eq!(store.counts().unwrap().pending, 0);
        assert!(claim(&store, "w", 10, T0).is_empty());

        // All of them, when nothing is refused, are ready when it returns.
        jobs.pop();
        let stored = store.enqueue_many_at(&jobs, T0).unwrap();
        assert_eq!(stored.len(), n);
        let record = store.job(stored[n - 1]).unwrap();
        assert_eq!((record.after, record.waiting_for), (vec![], vec![]));
        assert_eq!(ids(&claim(&store, "w", 1, T0)), [stored[0]]);
    }
}
