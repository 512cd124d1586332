//! An attempt's output files: `jobs logs` reads them whole and follows a running attempt's,
//! the dashboard shows a running job's file tail, and the files go with their job when it is
//! pruned. Until runners write the files (the keeper), the tests write an attempt's folder by
//! hand, in the layout of `src/files.rs`, beside a real database made with `jobs add`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::helper::{FAST, add, cli, json, ok, run_until_idle, stop};
use crate::util::{RunnerProcess, TestDb, wait_until};

/// The folder of one job's attempts beside the database at `db`: `<db>-attempts/<id>/`.
fn job_dir(db: &Path, id: i64) -> PathBuf {
    let real = std::fs::canonicalize(db).expect("the database exists");
    let mut name = real.into_os_string();
    name.push("-attempts");
    PathBuf::from(name).join(id.to_string())
}

/// Writes an attempt's folder as its keeper would: `<db>-attempts/<id>/<attempt>-<token>/`
/// with `stdout` and `stderr`. Returns the folder.
fn write_attempt(
    db: &Path,
    id: i64,
    attempt: i64,
    token: &str,
    stdout: &[u8],
    stderr: &[u8],
) -> PathBuf {
    let dir = job_dir(db, id).join(format!("{attempt}-{token}"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("stdout"), stdout).unwrap();
    std::fs::write(dir.join("stderr"), stderr).unwrap();
    dir
}

/// Sets job `id` running attempt 1 with `token`, as a runner's claim and start would (plain
/// SQL: no runner holds it).
fn set_running(t: &TestDb, id: i64, token: &str) {
    let changed = t
        .bare()
        .execute(
            "UPDATE jobs SET status = 'running', attempt = 1, run_token = ?2, \
             started_at = ?3 WHERE id = ?1",
            rusqlite::params![id, token, leasehold::now_ms()],
        )
        .unwrap();
    assert_eq!(changed, 1);
}

/// `db prune` removes the folder of the job it pruned and keeps that of a job that stays; a
/// runner's sweeper does the same after a prune.
#[test]
fn pruning_a_job_removes_its_files_and_keeps_a_live_ones() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let done = add(db, &[], &["true"]);
    let failed = add(db, &[], &["false"]);
    run_until_idle(db, &[]);
    let live = add(db, &["--queue", "elsewhere"], &["true"]);
    set_running(&t, live, "tokl");
    for (id, token) in [(done, "a"), (failed, "b"), (live, "tokl")] {
        write_attempt(db, id, 1, token, b"out\n", b"");
    }
    let v = json(&mut cli(
        db,
        &["db", "prune", "--keep-succeeded", "0", "--json"],
    ));
    assert_eq!(v["pruned"], 1, "{v}");
    assert_eq!(v["files_removed"], 1, "{v}");
    assert!(
        !job_dir(db, done).exists(),
        "the pruned job's files are gone"
    );
    assert!(job_dir(db, failed).exists(), "a kept job keeps its files");
    assert!(job_dir(db, live).exists(), "a running job keeps its files");
    // A dry run removes nothing.
    let v = json(&mut cli(
        db,
        &["db", "prune", "--keep-failed", "0", "--dry-run", "--json"],
    ));
    assert_eq!(
        (v["pruned"].as_u64(), v["files_removed"].as_u64()),
        (Some(1), Some(0))
    );
    assert!(job_dir(db, failed).exists());

    // A runner's sweeper prunes the failed job and removes its folder. The running job's
    // stays: its queue is not served, and even if the sweeper reclaims it (it holds no
    // lease), the job still exists.
    let mut args = FAST.to_vec();
    args.extend(["--keep-failed", "0", "--queue", "default"]);
    let runner = RunnerProcess::start(db, &args);
    assert!(
        wait_until(Duration::from_secs(15), || !job_dir(db, failed).exists()),
        "the sweeper removes the pruned job's files: {}",
        runner.log()
    );
    assert!(job_dir(db, live).exists(), "the live job keeps its files");
    stop(runner);
    assert!(job_dir(db, live).exists());
    ok(&mut cli(db, &["jobs", "inspect", &live.to_string()]));
}
