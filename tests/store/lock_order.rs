//! Runners at work on one database at once: each claims batches, renews every lease it holds
//! on a connection of its own, and records endings in batches in a random order, as a
//! runner's writer and heartbeat do; some jobs run after two others, so that endings recorded
//! by different runners release the same dependents. On PostgreSQL no two of those
//! transactions wait for each other in a circle (the server detects no deadlock), and every
//! job ends once, with its counts and counters exact.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use leasehold::protocol::{Claimed, Ending, Finish, Finished};
use leasehold::{CounterKind, Job, Status};

use crate::helper::{TTL, claim_in, exit};
use crate::util::{T0, TestDb, poll};

const JOBS: usize = 1_500;
/// Jobs that each run after two of the others, so that endings recorded by different runners
/// release shared dependents. At most `JOBS / 5`.
const JOINS: usize = 300;
const RUNNERS: usize = 4;
/// How many jobs a claim takes, and how many endings a batch records at most.
const BATCH: u32 = 8;
/// Every third job fails its first attempt and is retried (no backoff): its second attempt
/// succeeds.
fn fails_first(id: i64) -> bool {
    id % 3 == 0
}

/// A small generator for the order of each batch: xorshift64*, seeded per runner.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = usize::try_from(self.next() % (i as u64 + 1)).expect("a small index");
            v.swap(i, j);
        }
    }
}

/// The server's count of deadlocks in this database; with `alone`, once every other
/// connection to it has closed: a backend reports its statistics at the latest as it exits,
/// before it leaves `pg_stat_activity`.
fn deadlocks(db: &TestDb, alone: bool) -> i64 {
    let pg = db.pg.as_ref().expect("a PostgreSQL test");
    let mut client = pg.connect();
    poll(Duration::from_secs(30), || {
        if !alone {
            return Some(());
        }
        let others: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND pid <> pg_backend_pid()",
                &[],
            )
            .and_then(|r| r.try_get(0))
            .expect("pg_stat_activity");
        (others == 0).then_some(())
    })
    .expect("the test's other connections close");
    client
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .expect("a fresh statistics snapshot");
    client
        .query_one(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .and_then(|r| r.try_get(0))
        .expect("pg_stat_database")
}

/// One runner: a writer (this thread) that claims a batch, then records the endings of the
/// batch before it in a random order in one transaction; and a heartbeat (a thread of its
/// own, with its own connection) that renews every lease the runner holds, again and again.
/// Returns how many renewals ran.
fn runner(db: &TestDb, n: usize, seed: u64) -> u64 {
    let worker = format!("w{n}");
    let writer = db.store();
    let held: Arc<Mutex<HashMap<String, Claimed>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let renewals = Arc::new(AtomicU64::new(0));
    let heartbeat = {
        let (store, held, done, renewals) = (
            db.store(),
            Arc::clone(&held),
            Arc::clone(&done),
            Arc::clone(&renewals),
        );
        let worker = worker.clone();
        thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                let tokens: Vec<String> = held.lock().unwrap().keys().cloned().collect();
                // A token reported lost was ended by the writer since it was read: nobody
                // else ends this runner's jobs (checked at the end: no job ran more often
                // than planned).
                store.renew(&worker, &tokens, TTL, T0).expect("renew");
                renewals.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    // Stops the heartbeat however this thread leaves, a failed assertion included.
    struct Stop(Arc<AtomicBool>);
    impl Drop for Stop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let stop = Stop(Arc::clone(&done));
    let mut rng = Rng(seed | 1);
    let mut previous: Vec<Claimed> = Vec::new();
    loop {
        let claimed = claim_in(&writer, &worker, BATCH, &[], T0);
        {
            let mut held = held.lock().unwrap();
            for c in &claimed {
                held.insert(c.run_token.clone(), c.clone());
            }
        }
        if previous.is_empty() && claimed.is_empty() {
            break;
        }
        rng.shuffle(&mut previous);
        let finishes: Vec<Finish> = previous
            .iter()
            .map(|c| Finish {
                job_id: c.id,
                run_token: c.run_token.clone(),
                attempt: c.attempt,
                ending: if fails_first(c.id) && c.attempt == 1 {
                    exit(1)
                } else {
                    Ending::Succeeded
                },
                output: None,
                notes: Vec::new(),
                max_recovery_attempts: 3,
            })
            .collect();
        let finished = writer.finish_many(&finishes, T0).expect("finish_many");
        for (f, result) in finishes.iter().zip(&finished) {
            let expected = if matches!(f.ending, Ending::Succeeded) {
                Status::Succeeded
            } else {
                Status::Pending
            };
            assert_eq!(*result, Finished::Recorded(expected), "job {}", f.job_id);
        }
        {
            let mut held = held.lock().unwrap();
            for f in &finishes {
                held.remove(&f.run_token);
            }
        }
        previous = claimed;
    }
    drop(stop);
    heartbeat.join().expect("the heartbeat does not panic");
    renewals.load(Ordering::Relaxed)
}

crate::on_both! {
    fn runners_claiming_renewing_and_ending_in_batches_at_once_end_every_job_once(db) {
        let store = db.store();
        let jobs: Vec<Job> = (0..JOBS)
            .map(|i| {
                Job::shell("true")
                    .queue(if i % 2 == 0 { "a" } else { "b" })
                    .max_attempts(2)
                    .backoff(Duration::ZERO, Duration::ZERO)
            })
            .collect();
        let mut ids = store.enqueue_many_at(&jobs, T0).expect("enqueue");
        // In pairs: the first runs after jobs 10m + 1 and 10m + 9, the second after 10m and
        // 10m + 9. Claims take jobs in id order, 8 at a time, so 10m and 10m + 1 usually end
        // in one runner's batch, in either order, and 10m + 9 in another's at the same time:
        // the two batches release the same two jobs, the first in either order.
        let joins: Vec<Job> = (0..JOINS)
            .map(|k| {
                let base = 10 * (k / 2);
                let parents = [ids[base + 1 - k % 2], ids[base + 9]];
                Job::shell("true")
                    .queue(if k % 2 == 0 { "a" } else { "b" })
                    .max_attempts(2)
                    .backoff(Duration::ZERO, Duration::ZERO)
                    .after(parents)
            })
            .collect();
        ids.extend(store.enqueue_many_at(&joins, T0).expect("enqueue the joins"));
        let total = ids.len() as u64;
        let retried = ids.iter().filter(|&&id| fails_first(id)).count() as u64;
        let before = db.is_postgres().then(|| deadlocks(&db, false));

        let seed = u64::from(std::process::id()) << 16 ^ 0x9e37_79b9;
        let renewals: Vec<u64> = thread::scope(|s| {
            let runners: Vec<_> = (0..RUNNERS)
                .map(|n| {
                    let db = &db;
                    s.spawn(move || runner(db, n, seed + n as u64))
                })
                .collect();
            runners
                .into_iter()
                .map(|r| r.join().expect("a runner does not panic"))
                .collect()
        });
        eprintln!("seed {seed:#x}; renewals by runner: {renewals:?}");
        assert!(renewals.iter().all(|&n| n > 0), "{renewals:?}");

        // Every job ended once: succeeded, at the attempt planned, with one succeeded event.
        for &id in &ids {
            let job = store.job(id).expect("job");
            assert_eq!(job.status, Status::Succeeded, "{job:?}");
            assert_eq!(job.attempt, if fails_first(id) { 2 } else { 1 }, "{job:?}");
            let kinds: Vec<String> = store
                .events(id)
                .expect("events")
                .into_iter()
                .map(|e| e.kind.to_string())
                .collect();
            let succeeded = kinds.iter().filter(|k| *k == "succeeded").count();
            assert_eq!(succeeded, 1, "job {id}: {kinds:?}");
        }
        // The counts and the counters, exact.
        let counts = store.counts().expect("counts");
        assert_eq!(counts.succeeded, total, "{counts:?}");
        assert_eq!(
            counts.pending + counts.running + counts.failed + counts.cancelled,
            0,
            "{counts:?}"
        );
        let metrics = store.metrics().expect("metrics");
        let counter = |kind: CounterKind, outcome: &str| -> u64 {
            metrics
                .counters
                .iter()
                .filter(|c| c.kind == kind && c.outcome == outcome)
                .map(|c| c.value)
                .sum()
        };
        assert_eq!(counter(CounterKind::JobsEnded, "succeeded"), total);
        assert_eq!(counter(CounterKind::RetriesScheduled, ""), retried);
        for queue in ["a", "b"] {
            let ended = metrics
                .counters
                .iter()
                .find(|c| c.kind == CounterKind::JobsEnded && c.queue == queue)
                .map_or(0, |c| c.value);
            assert_eq!(ended, total / 2, "queue {queue}");
        }
        let observed = |outcome: &str| -> u64 {
            metrics
                .run
                .iter()
                .filter(|h| h.outcome == outcome)
                .map(|h| h.count)
                .sum()
        };
        assert_eq!(observed("succeeded"), total);
        assert_eq!(observed("retried"), retried);
        let waits: u64 = metrics.wait.iter().map(|h| h.count).sum();
        assert_eq!(waits, total + retried);
        drop(store);

        // No transaction of theirs waited for another in a circle.
        if let Some(before) = before {
            let after = deadlocks(&db, true);
            assert_eq!(after - before, 0, "the server detected {} deadlocks", after - before);
        }
    }
}
