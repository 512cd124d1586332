//! What the store tests share: claims, endings and sweeps with the test's lease TTL.

use std::path::Path;
use std::time::Duration;

use leasehold::protocol::{ClaimRequest, Claimed, Ending, Finish, Finished, ReclaimRequest};
use leasehold::{Error, ErrorKind, Job, Store};

use crate::util::T0;

pub const TTL: Duration = Duration::from_secs(30);
pub const TTL_MS: i64 = 30_000;
/// A moment at which a lease taken at `T0` has expired.
pub const EXPIRED: i64 = T0 + TTL_MS + 1;

pub fn claim_in(
    store: &Store,
    worker: &str,
    limit: u32,
    queues: &[String],
    now: i64,
) -> Vec<Claimed> {
    let req = ClaimRequest {
        worker_id: worker,
        limit,
        queues,
        lease_ttl: TTL,
        queue_caps: &[],
        unheld: 0,
    };
    store.claim(&req, now).expect("claim")
}

pub fn claim(store: &Store, worker: &str, limit: u32, now: i64) -> Vec<Claimed> {
    claim_in(store, worker, limit, &[], now)
}

pub fn claim_one(store: &Store, worker: &str, now: i64) -> Claimed {
    let mut claimed = claim(store, worker, 1, now);
    assert_eq!(claimed.len(), 1, "one job is ready at {now}");
    claimed.remove(0)
}

pub fn enqueue(store: &Store, job: &Job) -> i64 {
    store.enqueue_at(job, T0).expect("enqueue")
}

pub fn finish_with(store: &Store, c: &Claimed, ending: Ending, budget: u32, now: i64) -> Finished {
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

pub fn finish(store: &Store, c: &Claimed, ending: Ending, now: i64) -> Finished {
    finish_with(store, c, ending, 3, now)
}

pub fn exit(code: i32) -> Ending {
    Ending::Failed {
        kind: ErrorKind::Exit,
        exit_code: Some(code),
        signal: None,
        message: format!("exit {code}"),
    }
}

pub fn sweep(budget: u32, batch: u32) -> ReclaimRequest<'static> {
    ReclaimRequest {
        max_recovery_attempts: budget,
        batch,
        exclude_worker: None,
        held_tokens: None,
        dead_workers: &[],
        expired: true,
        keepers: None,
        lease_ttl: std::time::Duration::from_secs(30),
    }
}

pub fn last_event(store: &Store, id: i64) -> leasehold::Event {
    let events = store.events(id).expect("events");
    events.last().cloned().expect("the job has events")
}

/// Claims the job at `at`, lets its lease expire and reclaims it; returns the lost claim.
pub fn claim_and_lose(store: &Store, at: i64, budget: u32) -> Claimed {
    let c = claim_one(store, "w", at);
    let report = store
        .reclaim(&sweep(budget, 10), at + TTL_MS + 1)
        .expect("reclaim");
    assert_eq!(report.reclaimed.len(), 1);
    c
}

pub fn expect_wrong_state(result: leasehold::Result<impl std::fmt::Debug>, status: &str) -> String {
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

pub fn is_token(t: &str) -> bool {
    t.len() == 32
        && t.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The names of the files in `dir`, sorted.
pub fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Runs the ignored test `test` (its full name in this binary, e.g.
/// `multiprocess::child_process`) in a child process of this test binary, with `envs` set;
/// its stdout and stderr are piped back.
pub fn spawn_test_child(test: &str, envs: &[(&str, &str)]) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--ignored", "--nocapture"])
        .envs(envs.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the test binary can run itself")
}

/// Ends the children still running, by pid, when a test fails half-way.
pub struct Children(pub Vec<std::process::Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
