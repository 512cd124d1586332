//! The writer when the database does not take its writes: an ending that fails is held and
//! retried (the job is not left running to be run again), and a shutdown beside another
//! process's write lock returns.

use std::time::Duration;

use leasehold::{Job, Outcome, Status, now_ms};

use crate::helper::{WAIT, fast, outcome, running};
use crate::util::{TestDb, group_members, kinds, wait_for};

/// An ending that fails to write (here a trigger that refuses every success, as a flaky disk
/// refuses a write) is held and retried while its lease is renewed, and recorded once the
/// database takes it: the job succeeds once, never runs again, and spends no budget.
#[test]
fn an_ending_that_fails_to_write_is_held_and_recorded_once_it_can_be() {
    let db = TestDb::new();
    let marker = db.sibling("ran");
    let runner = fast(&db.path).start().expect("start");
    let flaky = db.bare();
    flaky
        .execute_batch(
            "CREATE TRIGGER flaky BEFORE UPDATE OF status ON jobs
             WHEN NEW.status = 'succeeded'
             BEGIN SELECT RAISE(ABORT, 'flaky disk'); END;",
        )
        .expect("the trigger is made");
    let id = runner
        .enqueue(&Job::shell(format!("echo >> {}", marker.display())))
        .expect("enqueue");
    wait_for("the attempt to run", WAIT, || marker.exists().then_some(()));
    // The attempt has ended and its ending failed. The lease is renewed past a whole TTL
    // after that: the runner still vouches for the attempt. Before this was fixed, the
    // ending was given up on, the lease never renewed again, and the job stayed running
    // under its own runner until another runner reclaimed and reran it.
    let ended_by = now_ms();
    let ttl_ms = 3_000;
    wait_for("a renewal after the ending failed", WAIT, || {
        let j = db.job(id);
        assert_eq!(j.status, Status::Running, "{j:?}");
        (j.lease_expires_at.is_some_and(|e| e > ended_by + ttl_ms)).then_some(())
    });
    flaky
        .execute_batch("DROP TRIGGER flaky")
        .expect("the trigger is dropped");
    assert_eq!(outcome(&runner, id), Outcome::Succeeded);
    let j = db.job(id);
    assert_eq!((j.attempt, j.recovery_count), (1, 0), "{j:?}");
    let kinds = kinds(&db.store(), id);
    assert_eq!(
        kinds.iter().filter(|k| *k == "succeeded").count(),
        1,
        "{kinds:?}"
    );
    assert!(
        !kinds.iter().any(|k| k == "reclaimed" || k == "lost"),
        "{kinds:?}"
    );
    let runs = std::fs::read_to_string(&marker).expect("the marker");
    assert_eq!(runs.lines().count(), 1, "the job ran once");
    runner.shutdown().expect("shutdown");
}

/// Another process holds the write lock (an `sqlite3` shell left in `BEGIN IMMEDIATE`, a
/// stopped runner): a shutdown still returns, once its writes have waited a lease TTL, and
/// the running attempt is killed. Before this was fixed, the writer retried the busy
/// database for ever and the shutdown never returned.
#[test]
fn shutdown_returns_while_another_connection_holds_the_write_lock() {
    let db = TestDb::new();
    let runner = fast(&db.path).start().expect("start");
    let id = runner.enqueue(&Job::shell("sleep 300")).expect("enqueue");
    let pgid = running(&db, id).pgid.expect("a group");
    let holder = db.bare();
    holder
        .execute_batch("BEGIN IMMEDIATE")
        .expect("the lock is taken");
    let (tx, rx) = crossbeam_channel::bounded(1);
    let stopper = std::thread::spawn(move || {
        let stopped = runner.shutdown_within(Duration::from_millis(100));
        let _ = tx.send(stopped.map_err(|e| (e.is_busy(), format!("{e:?}"))));
    });
    // Bounded by the lease TTL (3 s) for the writer and the busy timeout (10 s) of the final
    // record of the stop; "never" is what this guards against.
    let stopped = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the shutdown returns while the lock is held");
    // The stop itself cannot be recorded while the lock is held: busy, and nothing else.
    if let Err((busy, e)) = &stopped {
        assert!(busy, "{e}");
    }
    stopper.join().expect("the stopper does not panic");
    assert!(group_members(pgid).is_empty(), "the attempt was killed");
    holder.execute_batch("ROLLBACK").expect("rollback");
}

/// Short jobs' starts and endings share commits: such a job's ending row carries its start,
/// so a stream of `/bin/true` jobs costs fewer than four event rows a job (enqueued, claimed,
/// started, succeeded were four), while every job's history still reads those four events,
/// the start before the ending at the same time, and the job keeps its attempt's pid.
#[test]
fn short_jobs_write_fewer_event_rows_and_read_the_same_history() {
    const N: usize = 200;
    let db = TestDb::new();
    let runner = fast(&db.path).workers(8).start().expect("start");
    let jobs = vec![Job::command(["/bin/true"]); N];
    let ids = runner.enqueue_many(&jobs).expect("enqueue");
    let store = db.store();
    wait_for("every job to succeed", WAIT, || {
        (store.counts().expect("counts").succeeded == N as u64).then_some(())
    });
    runner.shutdown().expect("shutdown");

    let rows: i64 = db
        .bare()
        .query_row("SELECT count(*) FROM job_events", [], |r| r.get(0))
        .expect("count");
    let folded: i64 = db
        .bare()
        .query_row(
            "SELECT count(*) FROM job_events WHERE start_detail IS NOT NULL",
            [],
            |r| r.get(0),
        )
        .expect("count");
    eprintln!(
        "{N} jobs: {rows} event rows ({:.2} a job), {folded} starts on their ending's row",
        rows as f64 / N as f64
    );
    assert!(rows < 4 * N as i64, "{rows} rows for {N} jobs");
    for &id in &ids {
        let events = store.events(id).expect("events");
        let kinds: Vec<String> = events.iter().map(|e| e.kind.to_string()).collect();
        assert_eq!(
            kinds,
            ["enqueued", "claimed", "started", "succeeded"],
            "job {id}"
        );
        let (started, ended) = (&events[2], &events[3]);
        assert!(started.at <= ended.at, "{events:?}");
        assert_eq!(started.attempt, 1);
        let job = store.job(id).expect("job");
        let pid = job.pid.expect("the attempt's pid");
        assert_eq!(
            started.detail.as_deref(),
            Some(format!("pid {pid} pgid {}", job.pgid.expect("its group")).as_str()),
            "{job:?}"
        );
    }
}
