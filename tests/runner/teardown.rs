//! Tearing down lost attempts: an operator's retry or cancel acts on the job asked about
//! only, and several attempts torn down together share one kill grace.
//!
//! Each lost attempt is a real shell in a process group of its own, carrying its attempt's
//! run token, recorded as the attempt's start on a job claimed by a runner that is gone.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold::protocol::{AttemptStart, ClaimRequest};
use leasehold::{Job, Status, Store, operator};

use crate::util::{T0, TestDb, wait_for, wait_until};

/// The lease of the claims below: long expired by the time the tests run (they claim at T0).
const TTL: Duration = Duration::from_secs(30);
/// A moment at which a lease taken at `T0` has expired.
const EXPIRED: i64 = T0 + 30_001;

/// A lost attempt's shell, ended with its process group when the test is over.
struct Attempt {
    job: i64,
    child: Child,
}

impl Attempt {
    fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.pid())])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.wait();
    }
}

/// `/proc/<pid>/stat`'s state and start time (field 22).
fn stat(pid: i32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    Some((state, fields.get(19)?.parse().ok()?))
}

/// Whether `pid` (a child of this test, so a zombie until reaped) has died.
fn dead(pid: i32) -> bool {
    stat(pid).is_none_or(|(state, _)| matches!(state, 'Z' | 'X'))
}

/// A job claimed at `T0` by a runner that never registered, whose attempt runs `script` in
/// a process group of its own with the attempt's token, its start recorded.
fn lost_attempt(store: &Store, script: &str) -> Attempt {
    let job = store.enqueue_at(&Job::shell("sleep 100"), T0).unwrap();
    let req = ClaimRequest {
        worker_id: "gone",
        limit: 1,
        queues: &[],
        lease_ttl: TTL,
        queue_caps: &[],
        unheld: 0,
    };
    let claimed = store.claim(&req, T0).unwrap().remove(0);
    assert_eq!(claimed.id, job);
    let child = Command::new("sh")
        .args(["-c", script])
        .env("LEASEHOLD_RUN_TOKEN", &claimed.run_token)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("sh runs");
    let attempt = Attempt { job, child };
    let pid = attempt.pid();
    let start_time = wait_for("the shell's start time", Duration::from_secs(5), || {
        stat(pid).map(|(_, t)| t)
    });
    let start = AttemptStart {
        job_id: job,
        run_token: claimed.run_token,
        pid,
        pgid: pid,
        start_time,
        keeper: None,
    };
    assert!(store.record_start(&start, T0 + 1).unwrap());
    attempt
}

/// A script that ignores SIGTERM, and has started its first child once `ready` exists.
fn stubborn(ready: &Path) -> String {
    format!(
        "trap '' TERM; touch {}; while :; do sleep 1; done",
        ready.display()
    )
}

#[test]
fn an_operators_retry_or_cancel_leaves_another_jobs_lost_attempt_alone() {
    let db = TestDb::new();
    let store = db.store();
    let dir = tempfile::tempdir().unwrap();
    // The other job: lost, retried in the store (its marker set), its processes ignoring
    // SIGTERM, so that a teardown of it would show as its death only after a grace.
    let other = lost_attempt(&store, &stubborn(&dir.path().join("other")));
    assert!(wait_until(Duration::from_secs(5), || dir
        .path()
        .join("other")
        .exists()));
    store
        .retry_at(other.job, Some("runner gone"), EXPIRED)
        .unwrap();
    assert!(store.job(other.job).unwrap().teardown_pending);

    // Retried, then cancelled, by the operator: each tears down its own attempt only.
    let retried = lost_attempt(&store, "while :; do sleep 1; done");
    let job = operator::retry(&store, retried.job, Some("operator")).unwrap();
    assert_eq!(job.status, Status::Pending);
    let cancelled = lost_attempt(&store, "while :; do sleep 1; done");
    let job = operator::cancel(&store, cancelled.job).unwrap();
    assert_eq!(job.status, Status::Cancelled);

    for asked in [&retried, &cancelled] {
        assert!(
            wait_until(Duration::from_secs(5), || dead(asked.pid())),
            "job {}'s attempt was not torn down",
            asked.job
        );
        assert!(!store.job(asked.job).unwrap().teardown_pending);
    }
    assert!(
        !dead(other.pid()),
        "another job's lost attempt was torn down by an operator's action on jobs {} and {}",
        retried.job,
        cancelled.job
    );
    assert!(store.job(other.job).unwrap().teardown_pending);
    assert_eq!(store.pending_teardowns(10).unwrap().len(), 1);
}

/// Nanoseconds since the epoch, as `date +%s%N` writes them.
fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

#[test]
fn attempts_torn_down_together_all_get_sigterm_before_any_gets_sigkill() {
    const N: usize = 4;
    let db = TestDb::new();
    let store = db.store();
    let dir = tempfile::tempdir().unwrap();
    // Each shell logs when it gets SIGTERM, and goes on: only SIGKILL ends it.
    let attempts: Vec<Attempt> = (0..N)
        .map(|i| {
            let log = dir.path().join(format!("term-{i}"));
            let ready = dir.path().join(format!("ready-{i}"));
            let script = format!(
                "trap 'date +%s%N >> {}' TERM; touch {}; while :; do sleep 1; done",
                log.display(),
                ready.display()
            );
            let attempt = lost_attempt(&store, &script);
            assert!(wait_until(Duration::from_secs(5), || ready.exists()));
            store
                .retry_at(attempt.job, Some("runner gone"), EXPIRED)
                .unwrap();
            attempt
        })
        .collect();

    let path = db.path.clone();
    let sweep = std::thread::spawn(move || {
        let store = Store::open(&path).unwrap();
        operator::tear_down_lost_attempts(&store, 10, Duration::from_secs(1)).unwrap()
    });
    // The first death, as seen by polling: SIGKILL has been sent by then.
    let first_death = wait_for(
        "a torn-down attempt's death",
        Duration::from_secs(30),
        || attempts.iter().any(|a| dead(a.pid())).then(now_ns),
    );
    assert_eq!(sweep.join().unwrap(), (N as u64, 0));
    for a in &attempts {
        assert!(dead(a.pid()), "job {}'s attempt survived", a.job);
        assert!(!store.job(a.job).unwrap().teardown_pending);
    }
    let terms: Vec<u128> = (0..N)
        .map(|i| {
            let log = dir.path().join(format!("term-{i}"));
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let first = text.lines().next().unwrap_or_else(|| {
                panic!("attempt {i} never logged a SIGTERM");
            });
            first.trim().parse().unwrap()
        })
        .collect();
    let late: Vec<String> = terms
        .iter()
        .filter(|&&t| t > first_death)
        .map(|t| format!("{} ms", (t - first_death) / 1_000_000))
        .collect();
    assert!(
        late.is_empty(),
        "SIGTERM reached {} of {N} attempts only after the first was killed (after it by {}): \
         each waited for a grace of its own",
        late.len(),
        late.join(", ")
    );
}
