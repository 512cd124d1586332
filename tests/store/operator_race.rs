//! An operator's cancel and retry racing a runner's claim, its ending, or another retry: each
//! acts on what the job is when it writes, and says what it did. On SQLite the one writer
//! serialises them; on PostgreSQL the job's row lock does.

use std::sync::{Arc, Barrier};
use std::thread;

use leasehold::protocol::{Ending, Finished};
use leasehold::{Error, Job, Status, Store};

use crate::helper::{EXPIRED, claim_in, exit, finish};
use crate::util::{T0, TestDb};

/// Jobs raced, one at a time: each race starts both sides at one barrier.
const RACES: usize = 200;

/// Runs `a` and `b` for each of `0..RACES` on two threads, each race started together by a
/// barrier and ended by another; returns what each side returned, in order.
fn race<A: Send + 'static, B: Send + 'static>(
    db: &TestDb,
    a: impl Fn(&Store, usize) -> A + Send + 'static,
    b: impl Fn(&Store, usize) -> B + Send + 'static,
) -> (Vec<A>, Vec<B>) {
    let start = Arc::new(Barrier::new(2));
    let end = Arc::new(Barrier::new(2));
    let a = side(db.store(), start.clone(), end.clone(), a);
    let b = side(db.store(), start, end, b);
    (
        a.join().expect("side a does not panic"),
        b.join().expect("side b does not panic"),
    )
}

/// One side of [`race`]: `f` for each race, on a thread of its own with its own connection.
fn side<T: Send + 'static>(
    store: Store,
    start: Arc<Barrier>,
    end: Arc<Barrier>,
    f: impl Fn(&Store, usize) -> T + Send + 'static,
) -> thread::JoinHandle<Vec<T>> {
    thread::spawn(move || {
        (0..RACES)
            .map(|i| {
                start.wait();
                let out = f(&store, i);
                end.wait();
                out
            })
            .collect()
    })
}

fn queue(i: usize) -> String {
    format!("q{i}")
}

/// The kinds and details of job `id`'s events of kind `kind`.
fn events_of(store: &Store, id: i64, kind: &str) -> Vec<String> {
    store
        .events(id)
        .expect("events")
        .into_iter()
        .filter(|e| e.kind == kind)
        .map(|e| e.detail.unwrap_or_default())
        .collect()
}

fn manual_retries(db: &TestDb) -> i64 {
    db.scalar(
        "SELECT CAST(coalesce(sum(value), 0) AS BIGINT) FROM metric_counters
         WHERE name = 'manual_retries'",
    )
}

crate::on_both! {
    fn a_cancel_racing_a_claim_does_and_reports_what_happened(db) {
        let store = db.store();
        let jobs: Vec<i64> = (0..RACES)
            .map(|i| store.enqueue_at(&Job::shell("true").queue(queue(i)), T0).unwrap())
            .collect();
        let dependents: Vec<i64> = jobs
            .iter()
            .map(|&j| store.enqueue_at(&Job::shell("true").after([j]), T0).unwrap())
            .collect();
        let ids = jobs.clone();
        let (claims, cancels) = race(
            &db,
            |s, i| !claim_in(s, "w", 1, &[queue(i)], T0 + 1).is_empty(),
            move |s, i| s.cancel_at(ids[i], T0 + 1),
        );
        let mut raced = 0;
        for i in 0..RACES {
            let (id, claimed) = (jobs[i], claims[i]);
            let reported = cancels[i].as_ref().expect("a pending or running job is cancelled");
            // What the cancel returned is what the job is: cancelled, whichever came first.
            assert_eq!(reported.status, Status::Cancelled, "job {id}: {reported:?}");
            let now = store.job(id).unwrap();
            assert_eq!(now.status, Status::Cancelled, "job {id} runs on: {now:?}");
            // Its one event says which state it was cancelled in; a claimed job's attempt is
            // torn down.
            let detail = events_of(&store, id, "cancelled");
            let expected = if claimed { "while running" } else { "while pending" };
            assert!(
                detail.len() == 1 && detail[0].contains(expected),
                "job {id} (claimed: {claimed}): {detail:?}"
            );
            assert_eq!(now.teardown_pending, claimed, "job {id}");
            // Its dependent is cancelled because it was.
            assert_eq!(store.job(dependents[i]).unwrap().status, Status::Cancelled);
            raced += usize::from(claimed);
        }
        eprintln!("{raced} of {RACES} jobs were claimed before their cancel");
    }

    fn a_retry_racing_an_ending_does_and_reports_what_happened(db) {
        let store = db.store();
        let claimed: Vec<_> = (0..RACES)
            .map(|i| {
                store.enqueue_at(&Job::shell("true").queue(queue(i)), T0).unwrap();
                claim_in(&store, "w", 1, &[queue(i)], T0).remove(0)
            })
            .collect();
        let to_finish = claimed.clone();
        let ids: Vec<i64> = claimed.iter().map(|c| c.id).collect();
        let retry_ids = ids.clone();
        // At EXPIRED the lease is gone: the retry may take the job back while its attempt's
        // result is on its way.
        let (endings, retries) = race(
            &db,
            move |s, i| finish(s, &to_finish[i], Ending::Succeeded, EXPIRED),
            move |s, i| s.retry_at(retry_ids[i], None, EXPIRED),
        );
        let mut retried = 0;
        for i in 0..RACES {
            let id = ids[i];
            match (&retries[i], &endings[i]) {
                (Ok(job), Finished::Fenced) => {
                    assert_eq!(job.status, Status::Pending, "job {id}: {job:?}");
                    assert!(job.teardown_pending, "job {id}");
                    retried += 1;
                }
                (Err(Error::WrongState { status, .. }), Finished::Recorded(Status::Succeeded)) => {
                    assert_eq!(status, "succeeded", "job {id}");
                }
                (retry, ending) => panic!("job {id}: retry {retry:?} beside ending {ending:?}"),
            }
            let manual = events_of(&store, id, "manual_retry").len();
            assert_eq!(manual, usize::from(retries[i].is_ok()), "job {id}");
        }
        assert_eq!(manual_retries(&db), retried as i64);
        eprintln!("{retried} of {RACES} retries came first");
    }

    fn two_retries_at_once_retry_once_and_count_one(db) {
        let store = db.store();
        let ids: Vec<i64> = (0..RACES)
            .map(|i| {
                let id = store
                    .enqueue_at(&Job::shell("false").queue(queue(i)).max_attempts(1), T0)
                    .unwrap();
                let c = claim_in(&store, "w", 1, &[queue(i)], T0).remove(0);
                finish(&store, &c, exit(1), T0 + 1);
                id
            })
            .collect();
        let (a_ids, b_ids) = (ids.clone(), ids.clone());
        let (a, b) = race(
            &db,
            move |s, i| s.retry_at(a_ids[i], None, T0 + 2),
            move |s, i| s.retry_at(b_ids[i], None, T0 + 2),
        );
        for i in 0..RACES {
            let id = ids[i];
            let oks = [&a[i], &b[i]].iter().filter(|r| r.is_ok()).count();
            assert_eq!(oks, 1, "job {id}: {:?} and {:?}", a[i], b[i]);
            for r in [&a[i], &b[i]] {
                match r {
                    Ok(job) => assert_eq!(job.status, Status::Pending),
                    Err(Error::WrongState { status, .. }) => assert_eq!(status, "pending"),
                    Err(e) => panic!("job {id}: {e}"),
                }
            }
            assert_eq!(events_of(&store, id, "manual_retry").len(), 1, "job {id}");
        }
        assert_eq!(manual_retries(&db), RACES as i64);
    }
}
