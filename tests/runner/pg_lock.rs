//! A PostgreSQL session that holds a row the runner must write and sits (a frozen process,
//! a forgotten `psql`): the runner's start and shutdown each return within their bound, as
//! its sessions wait for a lock for at most half a heartbeat (`lock_timeout`).

use std::sync::mpsc;
use std::time::{Duration, Instant};

use leasehold::{Job, Runner, RunnerBuilder};

use crate::util::{TestDb, wait_for};

fn builder(db: &TestDb) -> RunnerBuilder {
    Runner::builder(db.target())
        .workers(2)
        .lease_ttl(Duration::from_secs(3))
        .heartbeat_interval(Duration::from_millis(500))
        .sweep_interval(Duration::from_millis(500))
        .kill_grace(Duration::from_millis(300))
        .poll_interval(Duration::from_millis(20))
        .shutdown_grace(Duration::from_millis(500))
}

/// Runs `f` on a thread and waits up to `bound` for it; `None` when it is still running
/// then (the thread is left to end once what holds it lets go).
fn within<T: Send + 'static>(bound: Duration, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(bound).ok()
}

/// Locks job `id`'s row as a runner's write would (`FOR NO KEY UPDATE`) in a transaction
/// left open on a connection of its own, which is returned: the lock lasts until it is
/// dropped.
fn hold_row(db: &TestDb, id: i64) -> postgres::Client {
    let mut holder = db.pg.as_ref().expect("a PostgreSQL test").connect();
    holder
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM jobs WHERE id = {id} FOR NO KEY UPDATE"
        ))
        .expect("the row is locked");
    holder
}

/// A dead runner's job, its lease expired, whose row another session holds: the start's
/// first sweep, which reclaims it, gives up on it within its busy timeout (a lease TTL, 3
/// s here) rather than waiting for the lock, and the runner starts (before, the start
/// waited for as long as the lock was held).
#[test]
fn a_start_is_not_held_by_a_locked_row() {
    let db = TestDb::postgres("lock_start");
    let id = db.store().enqueue(&Job::shell("exit 0")).expect("enqueue");
    db.exec(&format!(
        "UPDATE jobs SET status = 'running', attempt = 1, worker_id = 'gone:1:00000000',
             run_token = 'aaaa', started_at = leasehold_now_ms() - 60000,
             heartbeat_at = leasehold_now_ms() - 60000,
             lease_expires_at = leasehold_now_ms() - 30000
         WHERE id = {id}"
    ));
    let holder = hold_row(&db, id);
    let started = Instant::now();
    let runner = within(Duration::from_secs(20), move || {
        builder(&db).start().map(|r| (r, db))
    });
    let Some(result) = runner else {
        drop(holder);
        panic!("the start was held by the locked row for 20 s");
    };
    let (runner, db) = result.expect("the runner starts");
    eprintln!("started in {:.1?} beside the locked row", started.elapsed());
    // Once the row is let go, the sweeper reclaims the job and the runner runs it.
    drop(holder);
    wait_for(
        "the reclaimed job succeeds",
        Duration::from_secs(30),
        || (db.job(id).status == leasehold::Status::Succeeded).then_some(()),
    );
    runner.shutdown().expect("the runner stops");
}

/// A running job's row is held by another session when the runner shuts down: its
/// interrupted ending cannot be written, and the shutdown gives up on it within its
/// documented bound (grace + kill grace + about two lease TTLs: under 8 s here) instead of
/// waiting for the lock (before, for as long as it was held).
#[test]
fn a_shutdown_is_not_held_by_a_locked_row() {
    let db = TestDb::postgres("lock_shutdown");
    let runner = builder(&db).start().expect("the runner starts");
    let id = runner.enqueue(&Job::shell("sleep 60")).expect("enqueue");
    wait_for("the job runs", Duration::from_secs(30), || {
        let job = db.job(id);
        (job.status == leasehold::Status::Running && job.pid.is_some()).then_some(())
    });
    let holder = hold_row(&db, id);
    let started = Instant::now();
    let stopped = within(Duration::from_secs(30), move || {
        let result = runner.shutdown().map_err(|e| e.to_string());
        drop(runner);
        result
    });
    let took = started.elapsed();
    drop(holder);
    let Some(result) = stopped else {
        panic!("the shutdown was held by the locked row for 30 s");
    };
    eprintln!("shut down in {took:.1?} beside the locked row: {result:?}");
}
