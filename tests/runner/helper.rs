//! What the runner tests share: a runner with short timings, and reading what it recorded.

use std::path::Path;
use std::time::Duration;

use leasehold::{Job, JobRecord, Outcome, Runner, RunnerBuilder, Status, Store};

use crate::util::{TestDb, wait_for};

/// How long a test waits for a job to start or end.
pub const WAIT: Duration = Duration::from_secs(20);

/// A runner with short timings, for tests.
pub fn fast(path: &Path) -> RunnerBuilder {
    Runner::builder(path)
        .workers(4)
        .lease_ttl(Duration::from_secs(3))
        .heartbeat_interval(Duration::from_millis(200))
        .sweep_interval(Duration::from_millis(200))
        .kill_grace(Duration::from_millis(300))
        .drain_timeout(Duration::from_millis(300))
        .poll_interval(Duration::from_millis(20))
        .shutdown_grace(Duration::from_millis(200))
}

/// Waits for job `id` to end; returns how.
pub fn outcome(runner: &Runner, id: i64) -> Outcome {
    runner
        .wait(id, WAIT)
        .expect("wait")
        .unwrap_or_else(|| panic!("job {id} did not end"))
}

/// Job `id`'s events as (kind, attempt, detail), oldest first.
pub fn events(store: &Store, id: i64) -> Vec<(String, i64, String)> {
    store
        .events(id)
        .expect("events")
        .into_iter()
        .map(|e| (e.kind.to_string(), e.attempt, e.detail.unwrap_or_default()))
        .collect()
}

/// The stdout of job `id`'s last attempt, as text.
pub fn stdout(path: &Path, id: i64) -> String {
    let out = Store::open(path)
        .expect("open")
        .output(id, None)
        .expect("output")
        .expect("an output row");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A runner running one job that ignores SIGTERM: the runner, the job's id and its process
/// group.
pub fn stubborn_job(db: &TestDb) -> (Runner, i64, i64) {
    let runner = fast(&db.path).start().expect("start");
    let id = runner
        .enqueue(&Job::shell("trap '' TERM; sleep 300"))
        .expect("enqueue");
    let pgid = running(db, id).pgid.unwrap();
    (runner, id, pgid)
}

/// Waits until the job is running with its process recorded.
pub fn running(db: &TestDb, id: i64) -> JobRecord {
    wait_for("the job to run", WAIT, || {
        let j = db.job(id);
        (j.status == Status::Running && j.pgid.is_some()).then_some(j)
    })
}
