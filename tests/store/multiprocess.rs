//! Processes sharing one file: children of this test binary create, write and lock the same
//! database at once.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::thread;
use std::time::{Duration, Instant};

use leasehold::{Job, SCHEMA_VERSION, Store};

use crate::helper::{Children, files_in, spawn_test_child};
use crate::util::{self, T0, TestDb, bare, wait_until};

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
                    .enqueue(&Job::shell(format!("echo {i}")))
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
    // libtest names a test by its path in the test binary: `multiprocess::child_process`.
    let (_crate, module) = module_path!()
        .split_once("::")
        .expect("this module is inside the test binary");
    spawn_test_child(
        &format!("{module}::child_process"),
        &[(CHILD_DB, &path.display().to_string()), (CHILD_MODE, mode)],
    )
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
    store.enqueue_at(&Job::shell("first"), T0).unwrap();
    let mut children = Children(vec![spawn_child(&db.path, "hold")]);
    let stdout = children.0[0].stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let locked = lines.any(|l| l.map(|l| l.contains("LOCKED")).unwrap_or(false));
    assert!(locked, "the child took the write lock");

    let started = Instant::now();
    store
        .enqueue_at(&Job::shell("second"), T0)
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

/// A one-shot writer (the CLI's `jobs add`) does not checkpoint when it closes: its commit
/// stays in the WAL, where the next connection, here a separate process's, reads it.
#[test]
fn a_write_without_checkpoint_on_close_stays_in_the_wal_and_is_read_by_the_next_opener() {
    let db = TestDb::new();
    drop(db.store());
    let id = {
        let store = Store::open_with(
            &db.path,
            &leasehold::OpenOptions::new().checkpoint_on_close(false),
        )
        .unwrap();
        store.enqueue_at(&Job::shell("true"), T0).unwrap()
    };
    let wal = db.sibling("jobs.db-wal");
    assert!(
        std::fs::metadata(&wal).is_ok_and(|m| m.len() > 0),
        "the commit is in the WAL"
    );
    // Another process reads it through a connection of its own.
    let out = Command::new(assert_cmd::cargo::cargo_bin("leasehold"))
        .arg("--db")
        .arg(&db.path)
        .args(["jobs", "inspect", "--json", &id.to_string()])
        .env_remove("LEASEHOLD_DB")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], "pending", "{v}");
}

/// One-shot writers one after another, each alone on the file: the WAL they leave stays
/// short (each next opener rebuilds its index from the whole WAL), not growing by every write.
#[test]
fn one_shot_writes_one_after_another_keep_the_wal_short() {
    let db = TestDb::new();
    drop(db.store());
    for _ in 0..200 {
        let store = Store::open_with(
            &db.path,
            &leasehold::OpenOptions::new().checkpoint_on_close(false),
        )
        .unwrap();
        store.enqueue_at(&Job::shell("true"), T0).unwrap();
    }
    let wal = std::fs::metadata(db.sibling("jobs.db-wal")).map_or(0, |m| m.len());
    // 64 frames of 4 KiB pages before it is emptied, and the last write's few frames.
    assert!(wal <= 80 * (4096 + 24), "the WAL is {wal} bytes");
    assert_eq!(db.store().counts().unwrap().pending, 200);
}
