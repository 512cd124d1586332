//! Wake-up across processes: a job enqueued by another process starts at once, without
//! waiting for the runner's poll; without the wake-up sockets, the poll still runs it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use leasehold::{Job, Outcome, Runner, Status, Store};

use crate::helper::{WAIT, fast};
use crate::util::{RunnerProcess, TestDb, leasehold_vars, wait_for};

/// The folder of wake-up sockets beside `db`.
fn wake_folder(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_os_string();
    name.push("-wake");
    PathBuf::from(name)
}

/// The sockets in the wake-up folder of `db`.
fn sockets(db: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(wake_folder(db)) else {
        return Vec::new();
    };
    entries.flatten().map(|e| e.path()).collect()
}

/// `leasehold --db DB jobs add -- ARGV` in a process of its own; returns the job's id.
fn cli_add(db: &Path, argv: &[&str]) -> i64 {
    let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("leasehold"));
    for var in leasehold_vars() {
        cmd.env_remove(var);
    }
    let out = cmd
        .arg("--db")
        .arg(db)
        .args(["jobs", "add", "--json", "--"])
        .args(argv)
        .output()
        .expect("leasehold jobs add runs");
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    v["id"].as_i64().unwrap_or_else(|| panic!("an id in {v}"))
}

/// Waits until job `id` has started (been claimed); returns the milliseconds from its
/// enqueue's commit to its claim, both as the database recorded them.
fn enqueue_to_start(store: &Store, id: i64) -> i64 {
    let job = wait_for("the job to start", WAIT, || {
        let job = store.job(id).expect("job");
        job.started_at.map(|_| job)
    });
    job.started_at.expect("started") - job.created_at
}

#[test]
fn a_job_enqueued_by_another_process_starts_within_50_ms() {
    let db = TestDb::new();
    // A poll this slow cannot explain a start within 50 ms: only the wake-up can.
    let runner = fast(&db.path)
        .poll_interval(Duration::from_secs(30))
        .start()
        .expect("the runner starts");
    let store = db.store();
    let mut latencies: Vec<i64> = (0..5)
        .map(|_| {
            let id = cli_add(&db.path, &["true"]);
            let ms = enqueue_to_start(&store, id);
            assert_eq!(
                runner.wait(id, WAIT).expect("wait"),
                Some(Outcome::Succeeded)
            );
            ms
        })
        .collect();
    latencies.sort_unstable();
    // Every one well before the poll; the median within the 50 ms (a loaded
    // machine may deschedule one of them).
    assert!(latencies.iter().all(|&ms| ms < 5_000), "{latencies:?}");
    assert!(latencies[2] < 50, "{latencies:?}");
    runner.shutdown().expect("shutdown");
}

#[test]
fn a_job_enqueued_by_a_second_store_wakes_every_runner_on_the_file() {
    let db = TestDb::new();
    let slow = |b: leasehold::RunnerBuilder| b.poll_interval(Duration::from_secs(30)).workers(1);
    let a = slow(fast(&db.path)).start().expect("runner a starts");
    let b = slow(fast(&db.path)).start().expect("runner b starts");
    assert_eq!(sockets(&db.path).len(), 2, "one socket per runner");
    // Two long jobs: each runner must be woken to take one (one worker each).
    let store = db.store();
    let ids: Vec<i64> = (0..2)
        .map(|_| store.enqueue(&Job::shell("sleep 1")).expect("enqueue"))
        .collect();
    for id in &ids {
        enqueue_to_start(&store, *id);
    }
    let workers: std::collections::HashSet<String> = ids
        .iter()
        .map(|id| store.job(*id).expect("job").worker_id.expect("a worker"))
        .collect();
    assert_eq!(workers.len(), 2, "both runners took a job");
    a.shutdown().expect("shutdown");
    b.shutdown().expect("shutdown");
    assert!(
        sockets(&db.path).is_empty(),
        "each runner removes its socket"
    );
}

#[test]
fn without_the_wake_up_sockets_jobs_still_run_by_the_poll() {
    let db = TestDb::new();
    let runner = fast(&db.path)
        .poll_interval(Duration::from_millis(300))
        .start()
        .expect("the runner starts");
    let store = db.store();
    // The socket deleted: pokes find nobody.
    std::fs::remove_dir_all(wake_folder(&db.path)).expect("the folder is removed");
    let id = cli_add(&db.path, &["true"]);
    assert_eq!(
        runner.wait(id, WAIT).expect("wait"),
        Some(Outcome::Succeeded)
    );
    // The folder replaced by a file: every poke fails.
    std::fs::write(wake_folder(&db.path), "not a folder").expect("a file");
    let id = store.enqueue(&Job::shell("true")).expect("enqueue");
    assert_eq!(
        runner.wait(id, WAIT).expect("wait"),
        Some(Outcome::Succeeded)
    );
    runner.shutdown().expect("shutdown");
}

#[test]
fn a_crashed_runners_socket_is_removed_by_the_next_poke() {
    let db = TestDb::new();
    db.store();
    let mut crashed = RunnerProcess::start(&db.path, &["--workers", "1"]);
    let stale = wait_for("the runner's socket", WAIT, || sockets(&db.path).pop());
    crashed.crash();
    assert!(stale.exists(), "a crash leaves the socket behind");
    // Any enqueue pokes; the dead socket refuses, and the poker deletes it.
    let store = db.store();
    let id = store.enqueue(&Job::shell("true")).expect("enqueue");
    assert!(!stale.exists(), "the stale socket is gone");
    assert_eq!(store.job(id).expect("job").status, Status::Pending);
}

#[test]
fn an_idle_runner_starts_and_stops_in_under_200_ms() {
    let db = TestDb::new();
    // Once to create the file, so that what is timed is a start on an existing empty file.
    Runner::builder(&db.path)
        .start()
        .expect("the runner starts")
        .shutdown()
        .expect("shutdown");
    let started = Instant::now();
    let runner = Runner::builder(&db.path)
        .start()
        .expect("the runner starts");
    runner.shutdown().expect("shutdown");
    let took = started.elapsed();
    assert!(took < Duration::from_millis(200), "{took:?}");
}

/// A one-shot writer (the CLI's `jobs add`) beside a running runner leaves the WAL alone when
/// it closes, however long it is: the runner's connections checkpoint it as it grows, and
/// emptying it would cost the one-shot write two more fsyncs and the next commit a third.
#[test]
fn a_one_shot_write_beside_a_runner_leaves_the_wal_to_the_runner() {
    let db = TestDb::new();
    // The runner serves another queue: the jobs below stay pending, its WAL only grows.
    let runner = fast(&db.path)
        .queue("elsewhere", None)
        .poll_interval(Duration::from_secs(30))
        .start()
        .expect("the runner starts");
    let wal = {
        let mut name = db.path.as_os_str().to_os_string();
        name.push("-wal");
        PathBuf::from(name)
    };
    let wal_len = || std::fs::metadata(&wal).map_or(0, |m| m.len());
    let store = db.store();
    let big = "x".repeat(4000);
    let jobs: Vec<Job> = (0..150)
        .map(|_| Job::shell("true").env("BIG", &big))
        .collect();
    store.enqueue_many(&jobs).expect("enqueue");
    let before = wal_len();
    // Past the 64 frames a one-shot writer alone on the file would empty.
    assert!(before > 80 * (4096 + 24), "the WAL is {before} bytes");
    {
        let one_shot = Store::open_with(
            &db.path,
            &leasehold::OpenOptions::new().checkpoint_on_close(false),
        )
        .expect("open");
        one_shot.enqueue(&Job::shell("true")).expect("enqueue");
    }
    assert!(wal_len() >= before, "the one-shot writer emptied the WAL");
    assert_eq!(store.counts().expect("counts").pending, 151);
    runner.shutdown().expect("shutdown");
}
