//! The store on real database files: claims, fences, endings, reclaims, operator actions,
//! migrations and concurrent connections. Time is a parameter: no test waits for a lease.

mod util;

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use leasehold::protocol::{
    AttemptStart, ClaimRequest, Claimed, Ending, Finish, Finished, ReclaimRequest,
};
use leasehold::{
    Error, ErrorKind, Job, LEASE_EXPIRED_PREFIX, LEASE_MISSING_PREFIX, ListFilter, Migration,
    OnLost, OpenOptions, Output, SCHEMA_VERSION, Status, Store, now_ms,
};
use rusqlite::params;

use util::{T0, TestDb, bare, raw_job_row, wait_until};

const TTL: Duration = Duration::from_secs(30);
const TTL_MS: i64 = 30_000;
/// A moment at which a lease taken at `T0` has expired.
const EXPIRED: i64 = T0 + TTL_MS + 1;

// ---------------------------------------------------------------------------------------------
// Helpers

fn claim_in(store: &Store, worker: &str, limit: u32, queues: &[String], now: i64) -> Vec<Claimed> {
    let req = ClaimRequest {
        worker_id: worker,
        limit,
        queues,
        lease_ttl: TTL,
    };
    store.claim(&req, now).expect("claim")
}

fn claim(store: &Store, worker: &str, limit: u32, now: i64) -> Vec<Claimed> {
    claim_in(store, worker, limit, &[], now)
}

fn claim_one(store: &Store, worker: &str, now: i64) -> Claimed {
    let mut claimed = claim(store, worker, 1, now);
    assert_eq!(claimed.len(), 1, "one job is ready at {now}");
    claimed.remove(0)
}

fn enqueue(store: &Store, job: &Job) -> i64 {
    store.enqueue(job, T0).expect("enqueue")
}

fn finish_with(store: &Store, c: &Claimed, ending: Ending, budget: u32, now: i64) -> Finished {
    let finish = Finish {
        job_id: c.id,
        run_token: c.run_token.clone(),
        attempt: c.attempt,
        ending,
        output: None,
        notes: Vec::new(),
        max_recovery_attempts: budget,
    };
    store.finish(&finish, now).expect("finish")
}

fn finish(store: &Store, c: &Claimed, ending: Ending, now: i64) -> Finished {
    finish_with(store, c, ending, 3, now)
}

fn exit(code: i32) -> Ending {
    Ending::Failed {
        kind: ErrorKind::Exit,
        exit_code: Some(code),
        signal: None,
        message: format!("exit {code}"),
    }
}

fn sweep(budget: u32, batch: u32) -> ReclaimRequest<'static> {
    ReclaimRequest {
        max_recovery_attempts: budget,
        batch,
        exclude_worker: None,
        dead_workers: &[],
        expired: true,
    }
}

fn kinds(store: &Store, id: i64) -> Vec<String> {
    let events = store.events(id).expect("events");
    events.into_iter().map(|e| e.kind.to_string()).collect()
}

fn last_event(store: &Store, id: i64) -> leasehold::Event {
    let events = store.events(id).expect("events");
    events.last().cloned().expect("the job has events")
}

/// Claims the job at `at`, lets its lease expire and reclaims it; returns the lost claim.
fn claim_and_lose(store: &Store, at: i64, budget: u32) -> Claimed {
    let c = claim_one(store, "w", at);
    let report = store
        .reclaim(&sweep(budget, 10), at + TTL_MS + 1)
        .expect("reclaim");
    assert_eq!(report.reclaimed.len(), 1);
    c
}

fn expect_wrong_state(result: leasehold::Result<impl std::fmt::Debug>, status: &str) -> String {
    match result {
        Err(e @ Error::WrongState { .. }) => {
            let Error::WrongState { status: s, .. } = &e else {
                unreachable!()
            };
            assert_eq!(s, status);
            e.to_string()
        }
        other => panic!("expected WrongState for a {status} job, got {other:?}"),
    }
}

fn is_token(t: &str) -> bool {
    t.len() == 32
        && t.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

// ---------------------------------------------------------------------------------------------
// Claims

#[test]
fn two_connections_claiming_at_once_take_each_job_exactly_once() {
    let db = TestDb::new();
    let ids = db
        .store()
        .enqueue_many(&vec![Job::shell("true"); 1000], T0)
        .unwrap();
    let barrier = Arc::new(Barrier::new(2));
    let threads: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|worker| {
            let (path, barrier) = (db.path.clone(), Arc::clone(&barrier));
            thread::spawn(move || {
                let store = Store::open(path).unwrap();
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
}

#[test]
fn claim_takes_highest_priority_then_oldest_schedule_then_lowest_id() {
    let db = TestDb::new();
    let store = db.store();
    let at = |job: Job, t: i64| store.enqueue(&job, t).unwrap();
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

#[test]
fn a_batch_claim_returns_its_jobs_in_claim_order() {
    let db = TestDb::new();
    let store = db.store();
    let low = store.enqueue(&Job::shell("low"), T0 - 5000).unwrap();
    let high = store.enqueue(&Job::shell("high").priority(1), T0).unwrap();
    let old = store.enqueue(&Job::shell("old"), T0 - 9000).unwrap();
    let ids: Vec<i64> = claim(&store, "w", 10, T0).iter().map(|c| c.id).collect();
    assert_eq!(ids, [high, old, low]);
}

#[test]
fn claim_skips_jobs_scheduled_in_the_future() {
    let db = TestDb::new();
    let store = db.store();
    let id = enqueue(&store, &Job::shell("later").delay(Duration::from_secs(60)));
    assert_eq!(store.job(id).unwrap().scheduled_at, T0 + 60_000);
    assert!(claim(&store, "w", 10, T0).is_empty());
    assert!(claim(&store, "w", 10, T0 + 59_999).is_empty());
    assert_eq!(claim_one(&store, "w", T0 + 60_000).id, id);
}

#[test]
fn claim_takes_only_from_the_requested_queues() {
    let db = TestDb::new();
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

#[test]
fn claim_honours_its_limit() {
    let db = TestDb::new();
    let store = db.store();
    store
        .enqueue_many(&vec![Job::shell("true"); 10], T0)
        .unwrap();
    assert!(claim(&store, "w", 0, T0).is_empty());
    assert_eq!(claim(&store, "w", 3, T0).len(), 3);
    assert_eq!(claim(&store, "w", 100, T0).len(), 7);
    assert_eq!(store.counts().unwrap().running, 10);
}

#[test]
fn claim_writes_the_lease_a_fresh_token_the_attempt_and_an_event() {
    let db = TestDb::new();
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

// ---------------------------------------------------------------------------------------------
// Fences

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

    let endings = [
        Ending::Succeeded,
        exit(1),
        Ending::Lost {
            message: "late".into(),
        },
        Ending::Interrupted {
            message: "late".into(),
        },
    ];
    for ending in endings {
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
    let endings = [
        Ending::Succeeded,
        exit(1),
        Ending::Lost {
            message: "late".into(),
        },
    ];
    for ending in endings {
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

#[test]
fn a_cancel_that_lands_before_a_late_finish_wins() {
    let db = TestDb::new();
    let store = db.store();
    let id = enqueue(&store, &Job::shell("true"));
    let c = claim_one(&store, "w", T0);
    assert_eq!(store.cancel(id, T0 + 1).unwrap().status, Status::Cancelled);
    assert_eq!(
        finish(&store, &c, Ending::Succeeded, T0 + 2),
        Finished::Fenced
    );
    let job = store.job(id).unwrap();
    assert_eq!(job.status, Status::Cancelled);
    assert_eq!(job.exit_code, None);
    assert_eq!(
        kinds(&store, id),
        ["enqueued", "claimed", "cancelled", "late_result_discarded"]
    );
}

#[test]
fn record_start_is_fenced_by_the_run_token() {
    let db = TestDb::new();
    let store = db.store();
    let id = enqueue(&store, &Job::shell("true"));
    let c = claim_one(&store, "w", T0);
    let start = |token: &str| AttemptStart {
        job_id: id,
        run_token: token.to_string(),
        pid: 4242,
        pgid: 4242,
        start_time: 777,
    };
    assert!(!store.record_start(&start("0123"), T0 + 1).unwrap());
    assert_eq!(store.job(id).unwrap().pid, None);
    assert!(store.record_start(&start(&c.run_token), T0 + 1).unwrap());
    let job = store.job(id).unwrap();
    assert_eq!((job.pid, job.pgid), (Some(4242), Some(4242)));
    assert_eq!(last_event(&store, id).kind, "started");
}

// ---------------------------------------------------------------------------------------------
// Endings

#[test]
fn a_successful_attempt_succeeds_the_job_and_releases_its_lease() {
    let db = TestDb::new();
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

#[test]
fn a_failure_with_attempts_left_is_retried_after_a_doubling_backoff() {
    let db = TestDb::new();
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

#[test]
fn a_failure_past_the_backoff_cap_waits_about_the_cap_and_never_beyond_its_jitter() {
    let db = TestDb::new();
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

#[test]
fn a_failure_with_no_attempts_left_fails_with_its_exit_code() {
    let db = TestDb::new();
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

#[test]
fn a_spawn_failure_is_never_retried_even_with_attempts_left() {
    let db = TestDb::new();
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

#[test]
fn a_lost_ending_follows_the_recovery_budget_and_on_lost() {
    let db = TestDb::new();
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

#[test]
fn an_interrupted_attempt_goes_back_to_pending_without_spending_the_budget() {
    let db = TestDb::new();
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

#[test]
fn finish_stores_the_output_tail_with_its_truncated_flags() {
    let db = TestDb::new();
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

// ---------------------------------------------------------------------------------------------
// Reclaims

#[test]
fn an_expired_lease_is_requeued_with_one_more_recovery() {
    let db = TestDb::new();
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
fn the_fourth_reclaim_with_a_budget_of_three_fails_the_job_as_lost() {
    let db = TestDb::new();
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
fn on_lost_fail_fails_at_once_and_is_not_run_again() {
    let db = TestDb::new();
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

#[test]
fn reclaim_honours_its_batch_size_and_zero_reclaims_nothing() {
    let db = TestDb::new();
    let store = db.store();
    store
        .enqueue_many(&vec![Job::shell("true"); 5], T0)
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

#[test]
fn reclaim_never_takes_the_excluded_workers_jobs() {
    let db = TestDb::new();
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

#[test]
fn a_dead_runners_jobs_are_reclaimed_before_their_lease_expires() {
    let db = TestDb::new();
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

#[test]
fn a_reclaimed_job_is_not_claimable_until_its_teardown_is_recorded() {
    let db = TestDb::new();
    let store = db.store();
    let id = enqueue(&store, &Job::shell("sleep 100"));
    let c = claim_one(&store, "w", T0);
    let start = AttemptStart {
        job_id: id,
        run_token: c.run_token.clone(),
        pid: 5000,
        pgid: 5000,
        start_time: 123_456,
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

#[test]
fn two_sweeps_at_once_reclaim_an_expired_job_once() {
    let db = TestDb::new();
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

// ---------------------------------------------------------------------------------------------
// Renewals

#[test]
fn renew_extends_a_workers_leases_in_one_call_and_reports_the_lost_ones() {
    let db = TestDb::new();
    let store = db.store();
    let ids = store
        .enqueue_many(&vec![Job::shell("true"); 4], T0)
        .unwrap();
    let held = claim(&store, "w", 4, T0);
    let tokens: Vec<String> = held.iter().map(|c| c.run_token.clone()).collect();
    store.cancel(ids[1], T0 + 1).unwrap();
    // Lose the last one to a sweeper: expire it by hand, as a runner asleep past its TTL.
    db.bare()
        .execute(
            "UPDATE jobs SET lease_expires_at = ?2 WHERE id = ?1",
            [ids[3], T0],
        )
        .unwrap();
    assert_eq!(
        store
            .reclaim(&sweep(3, 10), T0 + 2)
            .unwrap()
            .reclaimed
            .len(),
        1
    );

    let now = T0 + 10_000;
    let renewal = store.renew("w", &tokens, TTL, now).unwrap();
    assert_eq!(renewal.renewed, [tokens[0].clone(), tokens[2].clone()]);
    assert_eq!(renewal.lost, [tokens[1].clone(), tokens[3].clone()]);
    for id in [ids[0], ids[2]] {
        let job = store.job(id).unwrap();
        assert_eq!(job.lease_expires_at, Some(now + TTL_MS));
        assert_eq!(job.heartbeat_at, Some(now));
    }
    assert!(store.renew("w", &[], TTL, now).unwrap().renewed.is_empty());
}

#[test]
fn renew_never_renews_another_workers_token() {
    let db = TestDb::new();
    let store = db.store();
    let id = enqueue(&store, &Job::shell("true"));
    let theirs = claim_one(&store, "them", T0);
    let renewal = store
        .renew(
            "me",
            std::slice::from_ref(&theirs.run_token),
            TTL,
            T0 + 5000,
        )
        .unwrap();
    assert!(renewal.renewed.is_empty());
    assert_eq!(renewal.lost, [theirs.run_token]);
    assert_eq!(store.job(id).unwrap().lease_expires_at, Some(T0 + TTL_MS));
}

// ---------------------------------------------------------------------------------------------
// Operator actions

#[test]
fn cancel_moves_a_pending_job_to_cancelled() {
    let db = TestDb::new();
    let store = db.store();
    let id = enqueue(&store, &Job::shell("true"));
    let job = store.cancel(id, T0 + 3).unwrap();
    assert_eq!(
        (job.status, job.completed_at),
        (Status::Cancelled, Some(T0 + 3))
    );
    assert!(!job.teardown_pending);
    assert_eq!(last_event(&store, id).kind, "cancelled");
    assert!(claim(&store, "w", 10, T0 + 4).is_empty());
}

#[test]
fn cancelling_a_running_job_revokes_its_lease() {
    let db = TestDb::new();
    let store = db.store();
    let id = enqueue(&store, &Job::shell("sleep 100"));
    let c = claim_one(&store, "w", T0);
    let job = store.cancel(id, T0 + 3).unwrap();
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

#[test]
fn cancelling_a_finished_job_is_refused() {
    let db = TestDb::new();
    let store = db.store();
    let id = enqueue(&store, &Job::shell("true"));
    let c = claim_one(&store, "w", T0);
    finish(&store, &c, Ending::Succeeded, T0 + 1);
    let message = expect_wrong_state(store.cancel(id, T0 + 2), "succeeded");
    assert!(message.contains("already finished"), "{message}");
    let cancelled = enqueue(&store, &Job::shell("true"));
    store.cancel(cancelled, T0).unwrap();
    expect_wrong_state(store.cancel(cancelled, T0), "cancelled");
    assert!(matches!(
        store.cancel(9999, T0),
        Err(Error::NoSuchJob(9999))
    ));
}

#[test]
fn retry_refuses_pending_succeeded_and_live_running_jobs_with_the_reason() {
    let db = TestDb::new();
    let store = db.store();
    let pending = enqueue(&store, &Job::shell("true").priority(-1));
    let succeeded = enqueue(&store, &Job::shell("true"));
    let running = enqueue(&store, &Job::shell("true"));
    let c = claim_one(&store, "w", T0);
    assert_eq!(c.id, succeeded);
    finish(&store, &c, Ending::Succeeded, T0);
    assert_eq!(claim_one(&store, "w", T0).id, running);

    let m = expect_wrong_state(store.retry(pending, None, T0 + 1), "pending");
    assert!(m.contains("already waiting"), "{m}");
    let m = expect_wrong_state(store.retry(succeeded, None, T0 + 1), "succeeded");
    assert!(m.contains("enqueue a new job"), "{m}");
    let m = expect_wrong_state(store.retry(running, None, T0 + 1), "running");
    assert!(
        m.contains("lease is live") && m.contains("cancel it instead"),
        "{m}"
    );
    assert_eq!(store.job(running).unwrap().status, Status::Running);
}

#[test]
fn retry_resets_a_failed_or_cancelled_job_to_pending() {
    let db = TestDb::new();
    let store = db.store();
    let failed = enqueue(&store, &Job::shell("false"));
    let c = claim_one(&store, "w", T0);
    finish(&store, &c, exit(1), T0 + 1);
    let cancelled = enqueue(&store, &Job::shell("true"));
    store.cancel(cancelled, T0 + 2).unwrap();

    let now = T0 + 50_000;
    for (id, reason, last_error) in [
        (failed, Some("  disk fixed "), "manual retry: disk fixed"),
        (cancelled, None, "manual retry after lease recovery"),
    ] {
        let job = store.retry(id, reason, now).unwrap();
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

#[test]
fn retry_of_a_running_job_with_an_expired_lease_tears_the_attempt_down_first() {
    let db = TestDb::new();
    let store = db.store();
    let id = enqueue(&store, &Job::shell("sleep 100"));
    let c = claim_one(&store, "w", T0);
    let job = store.retry(id, Some("runner host died"), EXPIRED).unwrap();
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

#[test]
fn retry_failed_stale_retries_exhausted_jobs_newest_failure_first_up_to_a_limit() {
    let db = TestDb::new();
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

    let now = T0 + 1_000_000;
    let first = store
        .retry_failed_stale(Some(2), 0, Some("fixed"), now)
        .unwrap();
    assert_eq!(first, [exhausted[2], exhausted[1]]);
    let rest = store.retry_failed_stale(None, 0, None, now).unwrap();
    assert_eq!(rest, [exhausted[0]]);
    assert!(
        store
            .retry_failed_stale(None, 0, None, now)
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

// ---------------------------------------------------------------------------------------------
// Files and migrations

/// `sql` with `--` comments stripped and runs of whitespace collapsed.
fn normalise_sql(sql: &str) -> String {
    let stripped: Vec<&str> = sql
        .lines()
        .map(|line| line.find("--").map_or(line, |i| &line[..i]))
        .collect();
    stripped
        .join(" ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

fn schema_of(conn: &rusqlite::Connection) -> (Vec<[String; 4]>, i64) {
    let mut stmt = conn
        .prepare("SELECT type, name, tbl_name, coalesce(sql, '') FROM sqlite_master ORDER BY name")
        .unwrap();
    let rows = stmt
        .query_map([], |r| {
            Ok([
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                normalise_sql(&r.get::<_, String>(3)?),
            ])
        })
        .unwrap()
        .collect::<rusqlite::Result<Vec<_>>>()
        .unwrap();
    let version = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    (rows, version)
}

#[test]
fn schema_sql_equals_what_migrating_an_empty_file_gives() {
    let db = TestDb::new();
    let store = db.store();
    assert_eq!(
        store.migration(),
        Migration {
            from: 0,
            to: SCHEMA_VERSION
        }
    );
    drop(store);
    let migrated = schema_of(&db.bare());

    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("schema.sql"))
        .expect("schema.sql is readable");
    let written = db.sibling("from-schema-sql.db");
    let conn = bare(&written);
    conn.execute_batch(&text)
        .expect("schema.sql runs on an empty file");
    let (tables, _) = schema_of(&conn);
    // schema.sql states its version in its first line: "(PRAGMA user_version = N)".
    let stated: i64 = text
        .lines()
        .next()
        .and_then(|l| l.split("user_version = ").nth(1))
        .and_then(|v| {
            v.trim_end_matches(|c: char| !c.is_ascii_digit())
                .parse()
                .ok()
        })
        .expect("schema.sql's first line states its user_version");

    assert_eq!(migrated.0, tables);
    assert_eq!(migrated.1, stated);
    assert_eq!(stated, SCHEMA_VERSION);
    assert!(
        tables.iter().any(|t| t[1] == "jobs_claim"),
        "the comparison sees the indexes"
    );
}

#[test]
fn an_empty_file_of_version_zero_is_migrated() {
    let db = TestDb::new();
    let zero_bytes = db.sibling("zero.db");
    std::fs::File::create(&zero_bytes).unwrap();
    let no_tables = db.sibling("no-tables.db");
    {
        let conn = bare(&no_tables);
        conn.execute_batch("CREATE TABLE scratch (x); DROP TABLE scratch;")
            .unwrap();
    }
    assert!(std::fs::metadata(&no_tables).unwrap().len() > 0);
    for path in [zero_bytes, no_tables] {
        let store = Store::open(&path).unwrap();
        assert_eq!(
            store.migration(),
            Migration {
                from: 0,
                to: SCHEMA_VERSION
            }
        );
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        store.enqueue(&Job::shell("true"), T0).unwrap();
        drop(store);
        let again = Store::open(&path).unwrap();
        let current = Migration {
            from: SCHEMA_VERSION,
            to: SCHEMA_VERSION,
        };
        assert_eq!(again.migration(), current);
        assert_eq!(again.counts().unwrap().pending, 1);
    }
}

/// Files of older versions live in `tests/fixtures/vN.db` (N = their user_version), made by the
/// last build of version N with a few jobs in them. Version 1 is the first, so there are none
/// yet: when a migration 2 is added, save a version-1 file there and this test migrates it.
#[test]
fn fixture_files_of_older_versions_are_migrated_with_their_jobs() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let Ok(entries) = std::fs::read_dir(&fixtures) else {
        return;
    };
    let db = TestDb::new();
    for entry in entries {
        let source = entry.unwrap().path();
        let Some(version) = source.file_name().and_then(|n| n.to_str()).and_then(|n| {
            n.strip_prefix('v')?
                .strip_suffix(".db")?
                .parse::<i64>()
                .ok()
        }) else {
            continue;
        };
        let copy = db.sibling(&format!("v{version}.db"));
        std::fs::copy(&source, &copy).unwrap();
        let jobs: i64 = bare(&copy)
            .query_row("SELECT count(*) FROM jobs", [], |r| r.get(0))
            .unwrap();
        let store = Store::open(&copy).unwrap();
        assert_eq!(
            store.migration(),
            Migration {
                from: version,
                to: SCHEMA_VERSION
            }
        );
        assert_eq!(
            store.list(&ListFilter::default()).unwrap().len() as i64,
            jobs
        );
    }
}

#[test]
fn a_newer_schema_is_refused_naming_both_versions() {
    let db = TestDb::new();
    bare(&db.path)
        .pragma_update(None, "user_version", 99)
        .unwrap();
    let before = std::fs::read(&db.path).unwrap();
    match Store::open(&db.path) {
        Err(e @ Error::SchemaTooNew { .. }) => {
            let message = e.to_string();
            assert!(message.contains("version 99"), "{message}");
            assert!(
                message.contains(&format!("version {SCHEMA_VERSION}")),
                "{message}"
            );
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
    assert_eq!(std::fs::read(&db.path).unwrap(), before);
}

/// The names of the files in `dir`, sorted.
fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_garbage_file_is_refused_and_left_byte_for_byte_unchanged() {
    let db = TestDb::new();
    let mut garbage = vec![0u8; 4096];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut garbage)
        .unwrap();
    std::fs::write(&db.path, &garbage).unwrap();
    match Store::open(&db.path) {
        Err(e @ Error::NotADatabase { .. }) => {
            assert!(e.to_string().contains("not a leasehold database"), "{e}");
        }
        other => panic!("expected NotADatabase, got {other:?}"),
    }
    assert_eq!(std::fs::read(&db.path).unwrap(), garbage);
    assert_eq!(files_in(db.dir.path()), ["jobs.db"]);
}

#[test]
fn a_sqlite_file_with_foreign_tables_is_refused_and_left_unchanged() {
    let db = TestDb::new();
    bare(&db.path)
        .execute_batch("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL); INSERT INTO invoices VALUES (1, 9.5);")
        .unwrap();
    let before = std::fs::read(&db.path).unwrap();
    match Store::open(&db.path) {
        Err(Error::NotADatabase { reason, .. }) => {
            assert!(reason.contains("other tables"), "{reason}");
        }
        other => panic!("expected NotADatabase, got {other:?}"),
    }
    assert_eq!(std::fs::read(&db.path).unwrap(), before);
    assert_eq!(files_in(db.dir.path()), ["jobs.db"]);
}

#[test]
fn a_read_only_open_of_a_missing_file_creates_nothing() {
    let db = TestDb::new();
    match Store::open_with(&db.path, &OpenOptions::read_only()) {
        Err(Error::Missing(path)) => assert_eq!(path, db.path),
        other => panic!("expected Missing, got {other:?}"),
    }
    assert!(!db.path.exists());
    assert!(files_in(db.dir.path()).is_empty());
}

#[test]
fn a_read_only_open_of_an_older_file_is_refused_and_leaves_it_unchanged() {
    let db = TestDb::new();
    std::fs::File::create(&db.path).unwrap();
    match Store::open_with(&db.path, &OpenOptions::read_only()) {
        Err(e @ Error::SchemaTooOld { found: 0, .. }) => {
            assert!(e.to_string().contains("leasehold db migrate"), "{e}");
        }
        other => panic!("expected SchemaTooOld, got {other:?}"),
    }
    assert_eq!(std::fs::metadata(&db.path).unwrap().len(), 0);
    assert_eq!(files_in(db.dir.path()), ["jobs.db"]);
    // A current file opens read-only.
    drop(db.store());
    let store = db.store_with(&OpenOptions::read_only());
    assert_eq!(store.migration(), Migration { from: 1, to: 1 });
}

#[test]
fn a_created_file_is_readable_by_its_owner_only() {
    let db = TestDb::new();
    let store = db.store();
    store.enqueue(&Job::shell("true"), T0).unwrap();
    for name in files_in(db.dir.path()) {
        let mode = std::fs::metadata(db.dir.path().join(&name))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{name} has mode {:o}", mode & 0o777);
    }
}

/// `n` pending jobs written by bare SQL (fast), spread over `queues`, as leasehold writes them.
fn fill_pending(db: &TestDb, n: usize, queues: &[&str]) {
    drop(db.store());
    let mut conn = db.bare();
    let tx = conn.transaction().unwrap();
    {
        let mut insert = tx
            .prepare(
                "INSERT INTO jobs (queue, argv, status, created_at, scheduled_at)
                 VALUES (?1, '[\"true\"]', 'pending', ?2, ?2)",
            )
            .unwrap();
        for i in 0..n {
            insert
                .execute(params![queues[i % queues.len()], T0])
                .unwrap();
        }
    }
    tx.commit().unwrap();
}

/// The best time of a few rounds of claims of one job.
fn claim_cost(store: &Store, queues: &[String]) -> Duration {
    (0..3)
        .map(|_| {
            let started = Instant::now();
            for _ in 0..20 {
                assert_eq!(claim_in(store, "w", 1, queues, T0).len(), 1);
            }
            started.elapsed()
        })
        .min()
        .unwrap()
}

#[test]
fn a_claim_costs_the_same_from_a_thousand_or_a_hundred_thousand_pending_jobs() {
    let (small, large) = (TestDb::new(), TestDb::new());
    fill_pending(&small, 1_000, &["a", "b"]);
    fill_pending(&large, 100_000, &["a", "b"]);
    let normal = OpenOptions::new().durability(leasehold::Durability::Normal);
    let (small, large) = (small.store_with(&normal), large.store_with(&normal));
    for queues in [vec![], vec!["a".to_string()], vec!["a".into(), "b".into()]] {
        let (few, many) = (claim_cost(&small, &queues), claim_cost(&large, &queues));
        // Reading the head of an index: about the same. A claim that sorts the pending rows
        // costs a hundred times more here.
        assert!(
            many < few * 10,
            "queues {queues:?}: {many:?} from 100,000 jobs, {few:?} from 1,000"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Processes sharing one file

const CHILD_DB: &str = "LEASEHOLD_TEST_CHILD_DB";
const CHILD_MODE: &str = "LEASEHOLD_TEST_CHILD_MODE";
const CHILD_JOBS: usize = 50;

/// Not a test: what the tests below run in child processes of this test binary.
#[test]
#[ignore = "a helper that other tests run in a child process"]
fn child_process() {
    let Ok(path) = std::env::var(CHILD_DB) else {
        return;
    };
    let _watchdog = util::Watchdog::new();
    let path = PathBuf::from(path);
    match std::env::var(CHILD_MODE).as_deref() {
        Ok("enqueue") => {
            // Say we are ready, then start when the parent says go: all children at once.
            let ready = format!("{}.ready.{}", path.display(), std::process::id());
            std::fs::write(ready, b"").unwrap();
            let go = PathBuf::from(format!("{}.go", path.display()));
            assert!(wait_until(Duration::from_secs(30), || go.exists()));
            let store = Store::open(&path).unwrap_or_else(|e| panic!("open: {e:?}"));
            for i in 0..CHILD_JOBS {
                store
                    .enqueue(&Job::shell(format!("echo {i}")), now_ms())
                    .unwrap_or_else(|e| panic!("enqueue: {e:?}"));
            }
            println!("CHILD-DONE");
        }
        Ok("hold") => {
            let conn = bare(&path);
            conn.execute_batch("BEGIN IMMEDIATE").unwrap();
            conn.execute("UPDATE jobs SET priority = priority WHERE id = 1", [])
                .unwrap();
            println!("LOCKED");
            thread::sleep(Duration::from_millis(300));
            conn.execute_batch("COMMIT").unwrap();
            println!("CHILD-DONE");
        }
        other => panic!("unknown {CHILD_MODE}: {other:?}"),
    }
}

fn spawn_child(path: &Path, mode: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_process", "--ignored", "--nocapture"])
        .env(CHILD_DB, path)
        .env(CHILD_MODE, mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the test binary can run itself")
}

/// Ends the children still running, by pid, when a test fails half-way.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn expect_child_done(child: Child) {
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("CHILD-DONE"),
        "the helper did not run:\n{stdout}"
    );
    assert!(!format!("{stdout}{stderr}").contains("locked"));
}

#[test]
fn processes_creating_one_new_file_at_once_all_succeed() {
    const PROCESSES: usize = 4;
    for round in 0..3 {
        let db = TestDb::new();
        let mut children = Children(
            (0..PROCESSES)
                .map(|_| spawn_child(&db.path, "enqueue"))
                .collect(),
        );
        let ready = wait_until(Duration::from_secs(30), || {
            files_in(db.dir.path())
                .iter()
                .filter(|n| n.contains(".ready."))
                .count()
                == PROCESSES
        });
        assert!(ready, "round {round}: the children did not start");
        assert!(!db.path.exists(), "nobody created the file before go");
        std::fs::write(format!("{}.go", db.path.display()), b"").unwrap();
        for child in children.0.drain(..) {
            expect_child_done(child);
        }
        let conn = db.bare();
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        let jobs: i64 = conn
            .query_row("SELECT count(*) FROM jobs", [], |r| r.get(0))
            .unwrap();
        assert_eq!(jobs as usize, PROCESSES * CHILD_JOBS, "round {round}");
    }
}

#[test]
fn an_enqueue_waits_for_another_processes_write_transaction() {
    let db = TestDb::new();
    let store = db.store();
    store.enqueue(&Job::shell("first"), T0).unwrap();
    let mut children = Children(vec![spawn_child(&db.path, "hold")]);
    let stdout = children.0[0].stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let locked = lines.any(|l| l.map(|l| l.contains("LOCKED")).unwrap_or(false));
    assert!(locked, "the child took the write lock");

    let started = Instant::now();
    store
        .enqueue(&Job::shell("second"), T0)
        .expect("the enqueue waits for the lock");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(150),
        "waited only {waited:?}"
    );
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let child = children.0.pop().unwrap();
    let status = {
        let mut child = child;
        child.wait().unwrap()
    };
    assert!(status.success());
    assert!(rest.iter().any(|l| l.contains("CHILD-DONE")));
    assert_eq!(store.counts().unwrap().pending, 2);
}
