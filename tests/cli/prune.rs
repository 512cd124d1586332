//! `leasehold db prune`: what it prints, that a dry run changes no byte, and that it never
//! creates a file.

use leasehold::{Job, Store, now_ms};

use crate::helper::{cli, fails, ok};
use crate::util::TestDb;

/// A file with `n` jobs cancelled just now and one pending job.
fn cancelled_jobs(t: &TestDb, n: usize) -> Store {
    let store = t.store();
    let now = now_ms();
    let ids = store
        .enqueue_many_at(&vec![Job::shell("true"); n], now)
        .unwrap();
    for id in ids {
        store.cancel_at(id, now).unwrap();
    }
    store.enqueue_at(&Job::shell("true"), now).unwrap();
    store
}

/// The main file and its WAL, byte for byte.
fn files(t: &TestDb) -> (Vec<u8>, Option<Vec<u8>>) {
    (
        std::fs::read(&t.path).unwrap(),
        std::fs::read(t.sibling("jobs.db-wal")).ok(),
    )
}

#[test]
fn a_dry_run_counts_and_leaves_the_file_byte_for_byte_unchanged() {
    let t = TestDb::new();
    drop(cancelled_jobs(&t, 50));
    let before = files(&t);
    let out = ok(&mut cli(
        &t.path,
        &[
            "db",
            "prune",
            "--dry-run",
            "--keep-cancelled",
            "0",
            "--json",
        ],
    ));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["pruned"], 50, "{out}");
    assert_eq!(v["dry_run"], true, "{out}");
    assert_eq!(v["bytes_before"], v["bytes_after"], "{out}");
    let human = ok(&mut cli(
        &t.path,
        &["db", "prune", "--dry-run", "--keep-cancelled", "0"],
    ));
    assert_eq!(human.trim(), "would prune 50 jobs");
    assert!(files(&t) == before, "a dry run changed the file");
}

#[test]
fn prune_deletes_what_the_rules_say_and_reports_the_sizes() {
    let t = TestDb::new();
    drop(cancelled_jobs(&t, 50));
    // The default rule keeps cancelled jobs 30 days: nothing goes.
    let out = ok(&mut cli(&t.path, &["db", "prune", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["pruned"], 0, "{out}");
    let out = ok(&mut cli(
        &t.path,
        &[
            "db",
            "prune",
            "--keep-cancelled",
            "forever",
            "--keep-max",
            "10",
            "--json",
        ],
    ));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["pruned"], 40, "{out}");
    assert_eq!(v["dry_run"], false, "{out}");
    assert!(v["bytes_before"].as_u64().unwrap() > 0, "{out}");
    assert!(v["bytes_after"].as_u64().is_some(), "{out}");
    let counts = t.store().counts().unwrap();
    assert_eq!((counts.cancelled, counts.pending), (10, 1));
}

#[test]
fn prune_never_creates_a_missing_file() {
    let t = TestDb::new();
    let line = fails(&mut cli(&t.path, &["db", "prune"]), 1);
    assert!(line.contains("does not exist"), "{line}");
    let line = fails(&mut cli(&t.path, &["db", "prune", "--dry-run"]), 1);
    assert!(line.contains("does not exist"), "{line}");
    assert!(!t.path.exists());
}

#[test]
fn bad_keep_values_are_usage_errors() {
    let t = TestDb::new();
    drop(cancelled_jobs(&t, 1));
    for args in [
        ["db", "prune", "--keep-succeeded", "-1"],
        ["db", "prune", "--keep-failed", "soon"],
        ["db", "prune", "--keep-cancelled", "1e19"],
        ["db", "prune", "--keep-max", "-5"],
    ] {
        let line = fails(&mut cli(&t.path, &args), 2);
        assert!(line.contains(args[2]), "{args:?}: {line}");
    }
}
