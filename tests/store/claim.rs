//! Claims: who gets which job, in what order, and what a claim writes; a claim's cost does
//! not grow with the number of pending jobs.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use leasehold::protocol::{Claimed, Ending};
use leasehold::{Job, OpenOptions, Status, Store};

use crate::helper::{TTL_MS, claim, claim_in, claim_one, enqueue, finish, is_token, last_event};
use crate::util::{T0, TestDb};

/// The number of jobs still deferred (out of the claim indexes), read with plain SQL.
fn deferred(db: &TestDb) -> i64 {
    db.scalar("SELECT count(*) FROM jobs WHERE deferred = 1")
}

// A claim's cost at 1,000 and 100,000 pending jobs is counted in SQLite VM steps by the
// store's unit test `a_claim_does_the_same_work_from_a_thousand_or_a_hundred_thousand_pending_jobs`
// (a count, not a timing), and timed at 1,000,000 in the benchmark.

crate::on_both! {
    /// Two connections claim batches at once until none is left: each job is taken once,
    /// with one claimed event (on PostgreSQL the claims skip each other's locked rows).
    fn two_connections_claiming_at_once_take_each_job_exactly_once(db) {
        let ids = db
            .store()
            .enqueue_many_at(&vec![Job::shell("true"); 1000], T0)
            .unwrap();
        let barrier = Arc::new(Barrier::new(2));
        let threads: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|worker| {
                let (target, barrier) = (db.target(), Arc::clone(&barrier));
                thread::spawn(move || {
                    let options = OpenOptions::default().given_times(true);
                    let store = Store::open_with(target, &options).unwrap();
                    barrier.wait();
                    let mut got = Vec::new();
                    loop {
                        let batch = claim(&store, worker, 7, T0);
                        if batch.is_empty() {
                            return got;
                        }
                        got.extend(batch);
                    }
                })
            })
            .collect();
        let claimed: Vec<Claimed> = threads
            .into_iter()
            .flat_map(|t| t.join().expect("the claiming thread does not panic"))
            .collect();

        let mut times: HashMap<i64, usize> = HashMap::new();
        for c in &claimed {
            *times.entry(c.id).or_default() += 1;
            assert_eq!(c.attempt, 1);
        }
        assert_eq!(times.len(), 1000);
        assert!(times.values().all(|&n| n == 1), "a job was claimed twice");
        assert_eq!(
            times.keys().copied().collect::<HashSet<_>>(),
            ids.into_iter().collect()
        );
        let tokens: HashSet<&str> = claimed.iter().map(|c| c.run_token.as_str()).collect();
        assert_eq!(tokens.len(), 1000, "tokens are distinct");
        assert_eq!(db.store().counts().unwrap().running, 1000);
        // One claimed event each, written by the claim that took it.
        assert_eq!(
            db.scalar("SELECT count(*) FROM job_events WHERE kind = 'claimed'"),
            1000
        );
        assert_eq!(
            db.scalar("SELECT count(DISTINCT job_id) FROM job_events WHERE kind = 'claimed'"),
            1000
        );
    }

    /// Claims of several jobs at once from two connections while 1,200 deferred jobs fall due
    /// (more than one claim promotes): each job is taken once, with one claimed event, and
    /// none is left deferred (on PostgreSQL a claim that finds deferred jobs due promotes
    /// them and runs again, while the other promotes and claims beside it).
    fn two_connections_claiming_as_deferred_jobs_fall_due_take_each_once(db) {
        let jobs = vec![Job::shell("true").delay(Duration::from_secs(1)); 1_200];
        let ids = db.store().enqueue_many_at(&jobs, T0).unwrap();
        let barrier = Arc::new(Barrier::new(2));
        let threads: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|worker| {
                let (target, barrier) = (db.target(), Arc::clone(&barrier));
                thread::spawn(move || {
                    let options = OpenOptions::default().given_times(true);
                    let store = Store::open_with(target, &options).unwrap();
                    barrier.wait();
                    let mut got = Vec::new();
                    loop {
                        let batch = claim(&store, worker, 7, T0 + 1_000);
                        if batch.is_empty() {
                            return got;
                        }
                        got.extend(batch.into_iter().map(|c| c.id));
                    }
                })
            })
            .collect();
        let mut claimed: Vec<i64> = threads
            .into_iter()
            .flat_map(|t| t.join().expect("the claiming thread does not panic"))
            .collect();
        claimed.sort_unstable();
        assert_eq!(claimed, ids, "each job once");
        assert_eq!(deferred(&db), 0);
        assert_eq!(
            db.scalar("SELECT count(DISTINCT job_id) FROM job_events WHERE kind = 'claimed'"),
            1_200
        );
        assert_eq!(
            db.scalar("SELECT count(*) FROM job_events WHERE kind = 'claimed'"),
            1_200
        );
    }

    fn claim_takes_highest_priority_then_oldest_schedule_then_lowest_id(db) {
        let store = db.store();
        let at = |job: Job, t: i64| store.enqueue_at(&job, t).unwrap();
        let a = at(Job::shell("a"), T0 - 1000);
        let b = at(Job::shell("b").priority(5), T0);
        let c = at(Job::shell("c"), T0 - 2000);
        let d = at(Job::shell("d").priority(5), T0);
        let e = at(Job::shell("e"), T0 - 1000);
        let _future = at(
            Job::shell("f").priority(9).delay(Duration::from_secs(60)),
            T0,
        );

        let order: Vec<i64> = (0..5).map(|_| claim_one(&store, "w", T0).id).collect();
        assert_eq!(order, [b, d, c, a, e]);
        assert!(claim(&store, "w", 10, T0).is_empty());
    }

    fn a_batch_claim_returns_its_jobs_in_claim_order(db) {
        let store = db.store();
        let low = store.enqueue_at(&Job::shell("low"), T0 - 5000).unwrap();
        let high = store.enqueue_at(&Job::shell("high").priority(1), T0).unwrap();
        let old = store.enqueue_at(&Job::shell("old"), T0 - 9000).unwrap();
        let ids: Vec<i64> = claim(&store, "w", 10, T0).iter().map(|c| c.id).collect();
        assert_eq!(ids, [high, old, low]);
    }

    fn claim_skips_jobs_scheduled_in_the_future(db) {
        let store = db.store();
        let id = enqueue(&store, &Job::shell("later").delay(Duration::from_secs(60)));
        assert_eq!(store.job(id).unwrap().scheduled_at, T0 + 60_000);
        assert!(claim(&store, "w", 10, T0).is_empty());
        assert!(claim(&store, "w", 10, T0 + 59_999).is_empty());
        assert_eq!(claim_one(&store, "w", T0 + 60_000).id, id);
    }

    fn a_job_due_later_joins_the_claim_order_at_its_priority_once_due(db) {
        let store = db.store();
        let high = enqueue(
            &store,
            &Job::shell("high")
                .priority(9)
                .delay(Duration::from_secs(60)),
        );
        let low = [
            enqueue(&store, &Job::shell("low")),
            enqueue(&store, &Job::shell("low")),
        ];
        assert_eq!(
            deferred(&db),
            1,
            "the delayed job waits out of the claim indexes"
        );
        assert_eq!(claim_one(&store, "w", T0 + 59_999).id, low[0]);
        // The claim that finds it due promotes it and takes it first, by its priority.
        assert_eq!(claim_one(&store, "w", T0 + 60_000).id, high);
        assert_eq!(deferred(&db), 0);
        assert_eq!(claim_one(&store, "w", T0 + 60_000).id, low[1]);
    }

    fn a_retry_after_its_backoff_waits_out_of_the_claim_indexes(db) {
        let store = db.store();
        let id = enqueue(&store, &Job::shell("flaky").max_attempts(2));
        let c = claim_one(&store, "w", T0);
        assert_eq!(
            finish(&store, &c, crate::helper::exit(1), T0),
            leasehold::protocol::Finished::Recorded(Status::Pending)
        );
        assert_eq!(deferred(&db), 1);
        let due = store.job(id).unwrap().scheduled_at;
        assert!(due > T0, "a backoff: {due}");
        assert!(claim(&store, "w", 1, due - 1).is_empty());
        assert_eq!(claim_one(&store, "w", due).id, id);
    }

    fn a_claim_promotes_a_bounded_slice_of_the_jobs_falling_due_at_once(db) {
        let store = db.store();
        let jobs = vec![Job::shell("true").delay(Duration::from_secs(1)); 1_200];
        let ids = store.enqueue_many_at(&jobs, T0).unwrap();
        assert_eq!(deferred(&db), 1_200);
        // Each claim promotes at most 500, earliest due first (here: by id), and takes the best
        // of what it promoted.
        assert_eq!(claim_one(&store, "w", T0 + 1_000).id, ids[0]);
        assert_eq!(deferred(&db), 700);
        assert_eq!(claim_one(&store, "w", T0 + 1_000).id, ids[1]);
        assert_eq!(deferred(&db), 200);
        let rest = claim(&store, "w", 2_000, T0 + 1_000);
        assert_eq!(rest.len(), 1_198);
        assert_eq!(deferred(&db), 0);
    }

    fn claim_takes_only_from_the_requested_queues(db) {
        let store = db.store();
        let mut by_queue: HashMap<&str, Vec<i64>> = HashMap::new();
        for q in ["a", "b", "c", "a", "b", "c"] {
            let id = enqueue(&store, &Job::shell("true").queue(q));
            by_queue.entry(q).or_default().push(id);
        }
        let ids = |claimed: Vec<Claimed>| -> Vec<i64> { claimed.iter().map(|c| c.id).collect() };

        let only_a = ids(claim_in(&store, "w", 10, &["a".into()], T0));
        assert_eq!(only_a, by_queue["a"]);
        let mut b_and_c = ids(claim_in(&store, "w", 10, &["b".into(), "c".into()], T0));
        b_and_c.sort();
        let mut expected = [by_queue["b"].clone(), by_queue["c"].clone()].concat();
        expected.sort();
        assert_eq!(b_and_c, expected);
        assert!(claim_in(&store, "w", 10, &["nope".into()], T0).is_empty());

        let rest = enqueue(&store, &Job::shell("true").queue("d"));
        assert_eq!(
            ids(claim(&store, "w", 10, T0)),
            [rest],
            "no queue means every queue"
        );
    }

    fn claim_honours_its_limit(db) {
        let store = db.store();
        store
            .enqueue_many_at(&vec![Job::shell("true"); 10], T0)
            .unwrap();
        assert!(claim(&store, "w", 0, T0).is_empty());
        assert_eq!(claim(&store, "w", 3, T0).len(), 3);
        assert_eq!(claim(&store, "w", 100, T0).len(), 7);
        assert_eq!(store.counts().unwrap().running, 10);
    }

    fn claim_writes_the_lease_a_fresh_token_the_attempt_and_an_event(db) {
        let store = db.store();
        let id = enqueue(&store, &Job::shell("true"));
        let now = T0 + 500;
        let c = claim_one(&store, "worker-1", now);
        assert_eq!((c.id, c.attempt), (id, 1));
        assert!(is_token(&c.run_token), "{:?} is 32 hex digits", c.run_token);
        assert_eq!(c.lease_expires_at, now + TTL_MS);

        let job = store.job(id).unwrap();
        assert_eq!(job.status, Status::Running);
        assert_eq!(job.attempt, 1);
        assert_eq!(job.worker_id.as_deref(), Some("worker-1"));
        assert_eq!(job.run_token.as_deref(), Some(c.run_token.as_str()));
        assert_eq!(job.started_at, Some(now));
        assert_eq!(job.heartbeat_at, Some(now));
        assert_eq!(job.lease_expires_at, Some(now + TTL_MS));
        let event = last_event(&store, id);
        assert_eq!(
            (event.kind.as_str(), event.attempt, event.at),
            ("claimed", 1, now)
        );
        assert!(event.detail.unwrap().contains("worker-1"));

        // The next attempt gets the next number and another token.
        let interrupted = Ending::Interrupted {
            message: "shutdown".into(),
        };
        finish(&store, &c, interrupted, now + 1);
        let again = claim_one(&store, "worker-2", now + 2);
        assert_eq!(again.attempt, 2);
        assert!(is_token(&again.run_token));
        assert_ne!(again.run_token, c.run_token);
    }


    fn the_due_time_written_by_hand_is_obeyed_in_both_directions(db) {
        let store = db.store();
        let later = enqueue(
            &store,
            &Job::shell("later").delay(Duration::from_secs(3600)),
        );
        let now = enqueue(&store, &Job::shell("now"));
        // The runbook's plain SQL: run the delayed job now, and put off the ready one. The first
        // stays deferred until a claim finds it due; the second stays in the claim indexes, where
        // the claim's own due-time filter skips it.
        db.exec(&format!(
            "UPDATE jobs SET scheduled_at = {T0} WHERE id = {later};
             UPDATE jobs SET scheduled_at = {} WHERE id = {now};",
            T0 + 3_600_000
        ));
        assert_eq!(claim_one(&store, "w", T0).id, later);
        assert!(claim(&store, "w", 10, T0).is_empty());
        assert_eq!(claim_one(&store, "w", T0 + 3_600_000).id, now);
    }
}

/// On PostgreSQL a claim skips the jobs whose rows another transaction holds (another claim's
/// pick, before it commits) and takes the next ones, without waiting for that transaction:
/// concurrent claims take different jobs side by side instead of taking turns.
#[test]
fn a_postgres_claim_takes_other_jobs_without_waiting_for_a_row_another_holds() {
    let db = TestDb::postgres("claim_skips_held_rows");
    let pg = db.pg.as_ref().expect("a PostgreSQL test");
    let store = db.store();
    let ids = store
        .enqueue_many_at(&vec![Job::shell("true"); 3], T0)
        .unwrap();
    let mut holder = pg.connect();
    holder
        .batch_execute(&format!(
            "BEGIN; SELECT id FROM jobs WHERE id = {} FOR UPDATE",
            ids[0]
        ))
        .unwrap();
    let claimer = db.store();
    let (waited, claimed) =
        crate::util::pg::behind_lock(pg, &mut holder, move || claim(&claimer, "w", 3, T0));
    assert!(
        !waited,
        "the claim waited for job {}'s row, which another transaction held",
        ids[0]
    );
    let taken: Vec<i64> = claimed.iter().map(|c| c.id).collect();
    assert_eq!(taken, ids[1..], "the jobs nobody held");
    assert_eq!(
        claim_one(&store, "w", T0).id,
        ids[0],
        "the held job, once released"
    );
}

mod conditions {
    use super::*;

    crate::on_both! {
        /// A claim leaves out the jobs that need a condition the runner says does not hold, and
        /// reads past them to those it may take, in every path of the claim: without queue
        /// rules, and with a queue limit (the rules' path); a claim with nothing unheld takes
        /// them. A schedule's template carries the conditions to each slot's job.
        fn a_claim_leaves_out_the_jobs_whose_conditions_do_not_hold(db) {
            use leasehold::protocol::ClaimRequest;
            use leasehold::{Condition, WhenLost};
            let store = db.store();
            let ac = store
                .enqueue_at(
                    &Job::shell("true").priority(9).when(Condition::AcPower).when_lost(WhenLost::Stop),
                    T0,
                )
                .unwrap();
            let idle = store.enqueue_at(&Job::shell("true").priority(5).when(Condition::Idle), T0).unwrap();
            let plain = store.enqueue_at(&Job::shell("true"), T0).unwrap();
            let request = |unheld: u32, caps: &'static [(String, u32)]| ClaimRequest {
                worker_id: "w",
                limit: 10,
                queues: &[],
                lease_ttl: crate::helper::TTL,
                queue_caps: caps,
                unheld,
            };
            // ac-power (1) does not hold: the idle job and the plain one, best first.
            let ids: Vec<i64> = store.claim(&request(1, &[]), T0).unwrap().iter().map(|c| c.id).collect();
            assert_eq!(ids, [idle, plain]);
            let job = store.job(ac).unwrap();
            assert_eq!((job.status, job.conditions.as_slice(), job.when_lost), (Status::Pending, &[Condition::AcPower][..], WhenLost::Stop));
            // The rules' path: a queue limit in the file.
            store.set_queue_limit("default", Some(5)).unwrap();
            assert!(store.claim(&request(1 | 16, &[]), T0).unwrap().is_empty());
            let taken = store.claim(&request(0, &[]), T0).unwrap();
            assert_eq!(taken.len(), 1);
            assert_eq!((taken[0].id, taken[0].conditions, taken[0].when_lost), (ac, 1, WhenLost::Stop));
        }
    }
}
