//! Queue limits and pauses stored in the file: what a claim takes under them, from one
//! connection or several, and what `queues()` reports.

use std::sync::{Arc, Barrier};
use std::thread;

use leasehold::protocol::{ClaimRequest, Claimed, Ending};
use leasehold::{Error, Job, Status, Store};

use crate::helper::{TTL, claim, claim_in, enqueue, finish};
use crate::util::{T0, TestDb};

fn in_queue(store: &Store, queue: &str, n: usize) -> Vec<i64> {
    store
        .enqueue_many_at(&vec![Job::shell("true").queue(queue); n], T0)
        .unwrap()
}

fn queues_of(claimed: &[Claimed]) -> Vec<&str> {
    claimed.iter().map(|c| c.queue.as_str()).collect()
}

fn count(claimed: &[Claimed], queue: &str) -> usize {
    claimed.iter().filter(|c| c.queue == queue).count()
}

#[test]
fn connections_claiming_at_once_never_exceed_a_limit_together() {
    let db = TestDb::new();
    let store = db.store();
    in_queue(&store, "media", 200);
    store.set_queue_limit("media", Some(3)).unwrap();
    let barrier = Arc::new(Barrier::new(4));
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let (path, barrier) = (db.path.clone(), Arc::clone(&barrier));
            thread::spawn(move || {
                let store = Store::open(path).unwrap();
                barrier.wait();
                (0..20)
                    .flat_map(|_| claim(&store, &format!("w{i}"), 2, T0))
                    .collect()
            })
        })
        .collect();
    let claimed: Vec<Vec<Claimed>> = threads.into_iter().map(|h| h.join().unwrap()).collect();
    let total: usize = claimed.iter().map(Vec::len).sum();
    assert_eq!(total, 3, "{claimed:?}");
    assert_eq!(store.counts().unwrap().running, 3);
}

#[test]
fn extreme_priorities_keep_their_order_with_and_without_limits() {
    for limited in [false, true] {
        let db = TestDb::new();
        let store = db.store();
        let lowest = enqueue(&store, &Job::shell("true").priority(i64::MIN));
        let highest = enqueue(&store, &Job::shell("true").queue("b").priority(i64::MAX));
        let zero = enqueue(&store, &Job::shell("true"));
        if limited {
            store.set_queue_limit("b", Some(1)).unwrap();
        }
        let ids: Vec<i64> = claim(&store, "w", 10, T0).iter().map(|c| c.id).collect();
        assert_eq!(ids, [highest, zero, lowest], "limited: {limited}");
    }
}

crate::on_both! {
    fn a_paused_queue_is_not_claimed_until_resumed_and_others_run_meanwhile(db) {
        let store = db.store();
        let sync = in_queue(&store, "sync", 3);
        let other = in_queue(&store, "default", 2);
        store.pause_queue("sync").unwrap();

        let claimed = claim(&store, "w", 10, T0);
        assert_eq!(
            claimed.iter().map(|c| c.id).collect::<Vec<_>>(),
            other,
            "only the other queue's jobs"
        );
        // Naming the paused queue does not get around the pause either.
        assert!(claim_in(&store, "w", 10, &["sync".into()], T0).is_empty());
        for id in &sync {
            assert_eq!(store.job(*id).unwrap().status, Status::Pending);
        }

        store.resume_queue("sync").unwrap();
        let claimed = claim(&store, "w", 10, T0);
        assert_eq!(claimed.iter().map(|c| c.id).collect::<Vec<_>>(), sync);
    }

    fn a_running_job_of_a_queue_paused_under_it_finishes_normally(db) {
        let store = db.store();
        in_queue(&store, "sync", 2);
        let running = claim(&store, "w", 1, T0).remove(0);
        store.pause_queue("sync").unwrap();
        assert_eq!(
            finish(&store, &running, Ending::Succeeded, T0 + 5),
            leasehold::protocol::Finished::Recorded(Status::Succeeded)
        );
        assert!(claim(&store, "w", 10, T0 + 6).is_empty());
    }

    fn a_queue_limit_caps_what_runs_at_once_and_the_rest_of_the_claim_goes_elsewhere(db) {
        let store = db.store();
        // The limited queue's jobs come first in claim order.
        in_queue(&store, "media", 5);
        in_queue(&store, "default", 5);
        store.set_queue_limit("media", Some(2)).unwrap();

        let first = claim(&store, "w", 6, T0);
        assert_eq!(count(&first, "media"), 2, "{:?}", queues_of(&first));
        assert_eq!(count(&first, "default"), 4);
        // At the limit: nothing more of media, whoever asks.
        let second = claim_in(&store, "w2", 10, &["media".into()], T0);
        assert!(second.is_empty(), "{:?}", queues_of(&second));

        // One ends: one place is free again.
        let media: Vec<&Claimed> = first.iter().filter(|c| c.queue == "media").collect();
        finish(&store, media[0], Ending::Succeeded, T0 + 1);
        let third = claim(&store, "w", 10, T0 + 2);
        assert_eq!(count(&third, "media"), 1, "{:?}", queues_of(&third));

        // No limit: the rest goes.
        store.set_queue_limit("media", None).unwrap();
        let fourth = claim(&store, "w", 10, T0 + 3);
        assert_eq!(count(&fourth, "media"), 2, "{:?}", queues_of(&fourth));
    }

    fn a_limit_of_zero_holds_every_job_of_the_queue(db) {
        let store = db.store();
        in_queue(&store, "media", 2);
        store.set_queue_limit("media", Some(0)).unwrap();
        assert!(claim(&store, "w", 10, T0).is_empty());
    }

    fn limits_keep_the_claim_order_across_queues(db) {
        let store = db.store();
        let low = enqueue(&store, &Job::shell("true").queue("a"));
        let high = enqueue(&store, &Job::shell("true").queue("b").priority(5));
        let mid = enqueue(&store, &Job::shell("true").queue("a").priority(1));
        store.set_queue_limit("a", Some(5)).unwrap();
        let ids: Vec<i64> = claim(&store, "w", 10, T0).iter().map(|c| c.id).collect();
        assert_eq!(ids, [high, mid, low]);
    }

    fn a_runners_own_caps_bound_its_claim_per_queue(db) {
        let store = db.store();
        in_queue(&store, "media", 5);
        in_queue(&store, "default", 5);
        let caps = [("media".to_string(), 1)];
        let queues = ["media".to_string(), "default".to_string()];
        let req = ClaimRequest {
            worker_id: "w",
            limit: 4,
            queues: &queues,
            lease_ttl: TTL,
            queue_caps: &caps,
            unheld: 0,
        };
        let claimed = store.claim(&req, T0).unwrap();
        assert_eq!(count(&claimed, "media"), 1, "{:?}", queues_of(&claimed));
        assert_eq!(count(&claimed, "default"), 3);
    }

    fn queues_lists_counts_settings_and_the_oldest_ready_age(db) {
        let store = db.store();
        let first = enqueue(&store, &Job::shell("true").queue("media"));
        store
            .enqueue_at(&Job::shell("true").queue("media"), T0 + 1_000)
            .unwrap();
        enqueue(&store, &Job::shell("true").queue("media").after([first]));
        store.set_queue_limit("media", Some(2)).unwrap();
        store.pause_queue("upload").unwrap();
        claim_in(&store, "w", 1, &["media".into()], T0 + 2_000);

        // Read at T0 + 5 s on a clock of the test's own.
        let clock = leasehold::ManualClock::new(T0 + 5_000);
        let reader = db.store_with(&leasehold::OpenOptions::new().clock(&clock));
        let queues = reader.queues().unwrap();
        assert_eq!(queues.len(), 2, "{queues:?}");
        let media = &queues[0];
        assert_eq!(media.name, "media");
        assert_eq!((media.pending, media.waiting, media.running), (2, 1, 1));
        assert_eq!((media.limit, media.paused), (Some(2), false));
        // The job enqueued at T0 + 1 s is the oldest ready one.
        assert_eq!(media.oldest_ready_ms, Some(4_000));
        let upload = &queues[1];
        assert_eq!(upload.name, "upload");
        assert_eq!((upload.pending, upload.running), (0, 0));
        assert_eq!((upload.limit, upload.paused), (None, true));
        assert_eq!(upload.oldest_ready_ms, None);

        // A queue left with no setting and no job is no longer listed.
        store.resume_queue("upload").unwrap();
        assert_eq!(reader.queues().unwrap().len(), 1);
    }

    fn an_empty_queue_name_is_refused(db) {
        let store = db.store();
        for result in [
            store.pause_queue(""),
            store.resume_queue(""),
            store.set_queue_limit("", Some(1)),
        ] {
            assert!(
                matches!(
                    result,
                    Err(Error::Invalid {
                        setting: "queue",
                        ..
                    })
                ),
                "{result:?}"
            );
        }
    }

    fn a_claim_of_every_queue_under_a_pause_finds_every_other_queue(db) {
        let store = db.store();
        let names = ["a", "ab", "b", "b ", "zz", "ä"];
        for name in names {
            in_queue(&store, name, 2);
        }
        store.pause_queue("b").unwrap();
        let claimed = claim(&store, "w", 100, T0);
        let mut got: Vec<&str> = queues_of(&claimed);
        got.dedup();
        got.sort();
        assert_eq!(got, ["a", "ab", "b ", "zz", "ä"]);
        assert_eq!(claimed.len(), 10);
    }
}

/// On PostgreSQL the claim that takes chosen jobs one by id (when a queue is paused or capped)
/// locks each job's row and skips a row another claim holds: a job that claim moved to running
/// but has not committed yet is never taken a second time once it commits. Through both ways
/// into that path that take no lock on a queue's row: a pause elsewhere, and a runner's caps.
#[test]
fn a_postgres_claim_by_id_never_takes_a_job_another_claim_holds() {
    for capped in [false, true] {
        let db = TestDb::postgres("claim_by_id_held_row");
        let pg = db.pg.as_ref().expect("a PostgreSQL test");
        let store = db.store();
        let id = enqueue(&store, &Job::shell("true"));
        let caps = if capped {
            vec![("default".to_string(), 5)]
        } else {
            store.pause_queue("elsewhere").unwrap();
            Vec::new()
        };
        // Another claim's transaction: it took the job and has not committed yet.
        let mut holder = pg.connect();
        holder
            .batch_execute(&format!(
                "BEGIN;
                 UPDATE jobs SET status = 'running', attempt = attempt + 1,
                        run_token = '{}', worker_id = 'other', started_at = {T0},
                        heartbeat_at = {T0}, lease_expires_at = {}
                  WHERE id = {id} AND status = 'pending'",
                "0".repeat(32),
                T0 + 30_000
            ))
            .unwrap();
        let claimer = db.store();
        let (_, claimed) = crate::util::pg::behind_lock(pg, &mut holder, move || {
            let req = ClaimRequest {
                worker_id: "w",
                limit: 5,
                queues: &[],
                lease_ttl: TTL,
                queue_caps: &caps,
                unheld: 0,
            };
            claimer.claim(&req, T0).unwrap()
        });
        let job = store.job(id).unwrap();
        assert!(
            claimed.iter().all(|c| c.id != id),
            "capped: {capped}: job {id} claimed twice, by the other transaction and again by \
             this claim (attempt {}, token {})",
            job.attempt,
            job.run_token.as_deref().unwrap_or("none")
        );
        assert_eq!(
            (job.status, job.attempt, job.worker_id.as_deref()),
            (Status::Running, 1, Some("other")),
            "capped: {capped}"
        );
    }
}
