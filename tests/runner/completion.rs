//! Completions: the callback hears of every ending exactly once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::{Completion, ErrorKind, Job, OnLost, Outcome, Store};

use crate::helper::{WAIT, fast, running};
use crate::util::{TestDb, wait_for};

#[test]
fn completion_fires_exactly_once_for_every_kind_of_ending() {
    let db = TestDb::new();
    let seen: Arc<Mutex<Vec<Completion>>> = Arc::default();
    let sink = Arc::clone(&seen);
    let runner = fast(&db.path)
        .workers(8)
        .on_complete(move |c| sink.lock().unwrap().push(c.clone()))
        .start()
        .expect("start");
    let jobs = [
        ("succeeded", Job::shell("exit 0")),
        ("exit", Job::shell("exit 4")),
        ("signal", Job::shell("kill -9 $$")),
        (
            "timeout",
            Job::shell("sleep 300").timeout(Duration::from_millis(200)),
        ),
        (
            "idle",
            Job::shell("echo hi; sleep 300").idle_timeout(Duration::from_millis(300)),
        ),
        ("spawn", Job::command(["/no/such/program"])),
        ("cancelled", Job::shell("sleep 300")),
    ];
    let mut ids = HashMap::new();
    for (name, job) in &jobs {
        ids.insert(*name, runner.enqueue(job).unwrap());
    }
    running(&db, ids["cancelled"]);
    runner.cancel(ids["cancelled"]).unwrap();
    // A lost ending decided by the sweeper, for a job another (dead) runner held.
    let lost = Store::open(&db.path)
        .unwrap()
        .enqueue(
            &Job::shell("true")
                .on_lost(OnLost::Fail)
                .delay(Duration::from_secs(3600)),
        )
        .unwrap();
    rusqlite::Connection::open(&db.path)
        .unwrap()
        .execute(
            "UPDATE jobs SET status = 'running', attempt = 1, run_token = 'gone',
                 worker_id = 'elsewhere', lease_expires_at = 1 WHERE id = ?1",
            [lost],
        )
        .unwrap();
    ids.insert("lost", lost);
    for (&name, &id) in &ids {
        assert!(
            runner.wait(id, WAIT).unwrap().is_some(),
            "{name} did not end"
        );
    }
    // Endings reach the callback from the notifier: wait until all are in.
    wait_for("every completion", WAIT, || {
        (seen.lock().unwrap().len() >= ids.len()).then_some(())
    });
    drop(runner);
    let seen = seen.lock().unwrap();
    for (&name, &id) in &ids {
        let mine: Vec<_> = seen.iter().filter(|c| c.job_id == id).collect();
        assert_eq!(mine.len(), 1, "{name}: {mine:?}");
        let expect = match name {
            "succeeded" => None,
            "exit" => Some(ErrorKind::Exit),
            "signal" => Some(ErrorKind::Signal),
            "timeout" => Some(ErrorKind::Timeout),
            "idle" => Some(ErrorKind::IdleTimeout),
            "spawn" => Some(ErrorKind::Spawn),
            "lost" => Some(ErrorKind::Lost),
            _ => None,
        };
        match (&mine[0].outcome, name) {
            (Outcome::Succeeded, "succeeded") | (Outcome::Cancelled, "cancelled") => {}
            (Outcome::Failed { kind, .. }, _) => assert_eq!(Some(*kind), expect, "{name}"),
            (other, _) => panic!("{name}: {other:?}"),
        }
    }
    assert_eq!(seen.len(), ids.len(), "{seen:?}");
}
