//! The runner on real SQLite files and real subprocesses: process groups, timeouts, output,
//! retries, revoked leases, completions and shutdown.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod util;

use util::{Watchdog, group_members, processes_with_env};

use leasehold::{
    Completion, ErrorKind, Job, JobRecord, OnLost, Outcome, Runner, RunnerBuilder, Status, Store,
    now_ms,
};

const WAIT: Duration = Duration::from_secs(20);

struct Db {
    _dir: tempfile::TempDir,
    path: PathBuf,
    _watchdog: Watchdog,
}

fn db() -> Db {
    let watchdog = Watchdog::new();
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("jobs.db");
    Db {
        _dir: dir,
        path,
        _watchdog: watchdog,
    }
}

/// A runner with short timings, for tests.
fn fast(path: &Path) -> RunnerBuilder {
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

fn wait_until<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn outcome(runner: &Runner, id: i64) -> Outcome {
    runner
        .wait(id, WAIT)
        .expect("wait")
        .unwrap_or_else(|| panic!("job {id} did not end"))
}

fn events(path: &Path, id: i64) -> Vec<(String, i64, String)> {
    Store::open(path)
        .expect("open")
        .events(id)
        .expect("events")
        .into_iter()
        .map(|e| (e.kind.to_string(), e.attempt, e.detail.unwrap_or_default()))
        .collect()
}

fn kinds(path: &Path, id: i64) -> Vec<String> {
    events(path, id).into_iter().map(|e| e.0).collect()
}

fn stdout(path: &Path, id: i64) -> String {
    let out = Store::open(path)
        .expect("open")
        .output(id, None)
        .expect("output")
        .expect("an output row");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every live process whose environment carries `LEASEHOLD_RUN_TOKEN=token`.
fn token_holders(token: &str) -> Vec<i32> {
    processes_with_env(&format!("LEASEHOLD_RUN_TOKEN={token}"))
}

fn job(path: &Path, id: i64) -> JobRecord {
    Store::open(path).expect("open").job(id).expect("job")
}

#[test]
fn job_sees_only_standard_descriptors_and_a_clean_signal_state() {
    let db = db();
    // Block SIGTERM in this thread before the runner starts: its threads inherit the mask,
    // and the job must not.
    let mut set = nix::sys::signal::SigSet::empty();
    set.add(nix::sys::signal::Signal::SIGTERM);
    set.thread_block().expect("block SIGTERM");
    let runner = fast(&db.path).start().expect("start");
    set.thread_unblock().expect("unblock SIGTERM");
    // Inspect the job's own process from outside: a shell would change its mask itself.
    let id = runner
        .enqueue(&Job::command(["sleep", "30"]))
        .expect("enqueue");
    let pid = running(&db.path, id).pid.unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(status.contains("SigBlk:\t0000000000000000"), "{status}");
    assert!(status.contains("SigIgn:\t0000000000000000"), "{status}");
    // sleep may open its locale files for a moment after it starts: wait for the fds it keeps.
    let fds = wait_until("only the standard descriptors", WAIT, || {
        let mut fds: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
            .collect();
        fds.sort();
        (fds == [0, 1, 2]).then_some(fds)
    });
    assert_eq!(fds, [0, 1, 2]);
    runner.cancel(id).unwrap();
    assert_eq!(outcome(&runner, id), Outcome::Cancelled);
}

#[test]
fn timeout_kills_the_whole_group() {
    let db = db();
    let runner = fast(&db.path).start().expect("start");
    let id = runner
        .enqueue(&Job::shell("sleep 300 & sleep 300").timeout(Duration::from_secs(1)))
        .expect("enqueue");
    match outcome(&runner, id) {
        Outcome::Failed { kind, message, .. } => {
            assert_eq!(kind, ErrorKind::Timeout);
            assert_eq!(message, "timed out after 1s");
        }
        other => panic!("{other:?}"),
    }
    let rec = job(&db.path, id);
    assert_eq!(rec.status, Status::Failed);
    assert_eq!(rec.error_kind, Some(ErrorKind::Timeout));
    assert_eq!(group_members(rec.pgid.expect("a pgid")), Vec::<i32>::new());
}

#[test]
fn sigterm_ignoring_job_is_killed_after_kill_grace() {
    let db = db();
    let runner = fast(&db.path).start().expect("start");
    let stubborn = runner
        .enqueue(&Job::shell("trap '' TERM; sleep 300").timeout(Duration::from_millis(300)))
        .expect("enqueue");
    // The leader exits at once; its background member ignores SIGTERM and holds no pipe.
    let orphan = runner
        .enqueue(
            &Job::shell("(trap '' TERM; exec sleep 300) >/dev/null 2>&1 & sleep 300")
                .timeout(Duration::from_millis(300)),
        )
        .expect("enqueue");
    for id in [stubborn, orphan] {
        let started = Instant::now();
        assert!(matches!(
            outcome(&runner, id),
            Outcome::Failed {
                kind: ErrorKind::Timeout,
                ..
            }
        ));
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(
            group_members(job(&db.path, id).pgid.unwrap()),
            Vec::<i32>::new()
        );
    }
}

#[test]
fn background_member_left_after_leader_exits_is_killed_and_recorded() {
    let db = db();
    let runner = fast(&db.path).start().expect("start");
    let id = runner
        .enqueue(&Job::shell(
            "(trap '' TERM; exec sleep 300) >/dev/null 2>&1 & exit 0",
        ))
        .expect("enqueue");
    assert_eq!(outcome(&runner, id), Outcome::Succeeded);
    assert_eq!(
        group_members(job(&db.path, id).pgid.unwrap()),
        Vec::<i32>::new()
    );
    assert!(kinds(&db.path, id).contains(&"leaked".to_string()));
}

#[test]
fn setsid_escapee_holding_stdout_does_not_hang_the_worker() {
    let db = db();
    let runner = fast(&db.path).start().expect("start");
    let started = Instant::now();
    let id = runner
        .enqueue(&Job::shell("setsid sleep 300 & exit 0"))
        .expect("enqueue");
    assert_eq!(outcome(&runner, id), Outcome::Succeeded);
    // Drain (0.3 s) plus kill grace (0.3 s), with room for a slow machine.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let rec = job(&db.path, id);
    assert_eq!(
        token_holders(rec.run_token.as_deref().unwrap()),
        Vec::<i32>::new()
    );
    let leaked: Vec<_> = events(&db.path, id)
        .into_iter()
        .filter(|e| e.0 == "leaked")
        .collect();
    assert!(
        leaked
            .iter()
            .any(|e| e.2.contains("outside its process group")),
        "{leaked:?}"
    );
}

#[test]
fn output_beyond_the_tail_keeps_the_last_bytes() {
    let db = db();
    let runner = fast(&db.path).output_tail(1000).start().expect("start");
    let id = runner
        .enqueue(&Job::shell(
            "head -c 100000 /dev/zero | tr '\\0' a; printf END; head -c 50000 /dev/zero >&2",
        ))
        .expect("enqueue");
    assert_eq!(outcome(&runner, id), Outcome::Succeeded);
    let out = Store::open(&db.path)
        .unwrap()
        .output(id, None)
        .unwrap()
        .unwrap();
    assert_eq!(out.stdout.len(), 1000);
    assert!(out.stdout.ends_with(b"aaaEND"));
    assert!(out.stdout_truncated);
    assert_eq!(out.stderr.len(), 1000);
    assert!(out.stderr_truncated);
}

#[test]
fn failing_job_is_retried_with_backoff_then_fails() {
    let db = db();
    let runner = fast(&db.path).start().expect("start");
    let id = runner
        .enqueue(
            &Job::shell("exit 3")
                .max_attempts(3)
                .backoff(Duration::from_millis(200), Duration::from_secs(10)),
        )
        .expect("enqueue");
    match outcome(&runner, id) {
        Outcome::Failed {
            kind, exit_code, ..
        } => {
            assert_eq!(kind, ErrorKind::Exit);
            assert_eq!(exit_code, Some(3));
        }
        other => panic!("{other:?}"),
    }
    let rec = job(&db.path, id);
    assert_eq!((rec.attempt, rec.exit_code), (3, Some(3)));
    let evs = Store::open(&db.path).unwrap().events(id).unwrap();
    let claims: Vec<i64> = evs
        .iter()
        .filter(|e| e.kind == "claimed")
        .map(|e| e.at)
        .collect();
    let retries: Vec<i64> = evs
        .iter()
        .filter(|e| e.kind == "retry_scheduled")
        .map(|e| e.at)
        .collect();
    assert_eq!((claims.len(), retries.len()), (3, 2));
    // Each claim waited out its backoff: 200 ms, then 400 ms, each within -20%.
    assert!(claims[1] - retries[0] >= 160, "{claims:?} {retries:?}");
    assert!(claims[2] - retries[1] >= 320, "{claims:?} {retries:?}");
}

#[test]
fn missing_command_fails_at_once_as_spawn_error() {
    let db = db();
    let runner = fast(&db.path).start().expect("start");
    let id = runner
        .enqueue(&Job::command(["/no/such/program"]).max_attempts(3))
        .expect("enqueue");
    match outcome(&runner, id) {
        Outcome::Failed { kind, message, .. } => {
            assert_eq!(kind, ErrorKind::Spawn);
            assert!(message.contains("No such file"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(job(&db.path, id).attempt, 1);
}

/// Waits until the job is running with its process recorded.
fn running(path: &Path, id: i64) -> JobRecord {
    wait_until("the job to run", WAIT, || {
        let j = job(path, id);
        (j.status == Status::Running && j.pgid.is_some()).then_some(j)
    })
}

#[test]
fn cancel_from_another_process_revokes_the_lease_and_kills_the_attempt() {
    let db = db();
    let runner = fast(&db.path).start().expect("start");
    let id = runner.enqueue(&Job::shell("sleep 300")).expect("enqueue");
    let rec = running(&db.path, id);
    // Cancel through a separate connection, as `leasehold jobs cancel` does: the runner learns
    // of it from its next renewal.
    Store::open(&db.path).unwrap().cancel(id, now_ms()).unwrap();
    let pgid = rec.pgid.unwrap();
    wait_until("the group to die", WAIT, || {
        group_members(pgid).is_empty().then_some(())
    });
    wait_until("the late result", WAIT, || {
        kinds(&db.path, id)
            .contains(&"late_result_discarded".to_string())
            .then_some(())
    });
    let after = job(&db.path, id);
    assert_eq!(after.status, Status::Cancelled);
    let kinds = kinds(&db.path, id);
    assert!(
        !kinds.iter().any(|k| k == "failed" || k == "succeeded"),
        "{kinds:?}"
    );
}

#[test]
fn cancel_through_the_runner_kills_within_kill_grace() {
    let db = db();
    let runner = fast(&db.path).start().expect("start");
    let id = runner
        .enqueue(&Job::shell("trap '' TERM; sleep 300"))
        .expect("enqueue");
    let pgid = running(&db.path, id).pgid.unwrap();
    let started = Instant::now();
    runner.cancel(id).unwrap();
    wait_until("the group to die", WAIT, || {
        group_members(pgid).is_empty().then_some(())
    });
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(outcome(&runner, id), Outcome::Cancelled);
}

#[test]
fn operator_retry_of_a_lost_running_job_kills_the_old_attempt_and_fences_it() {
    let db = db();
    let dir = db.path.parent().unwrap().to_path_buf();
    let runner = fast(&db.path).start().expect("start");
    // The first attempt leaves a mark and hangs; the second finds the mark and succeeds.
    let rec_id = runner
        .enqueue(
            &Job::shell("if [ -e retried ]; then exit 0; fi; touch retried; sleep 300").cwd(&dir),
        )
        .expect("enqueue");
    let first = running(&db.path, rec_id);
    // An operator may only retry a running job whose lease is gone: age it.
    rusqlite::Connection::open(&db.path)
        .unwrap()
        .execute(
            "UPDATE jobs SET lease_expires_at = 1 WHERE id = ?1",
            [rec_id],
        )
        .unwrap();
    Store::open(&db.path)
        .unwrap()
        .retry(rec_id, Some("test"), now_ms())
        .unwrap();
    assert_eq!(outcome(&runner, rec_id), Outcome::Succeeded);
    assert!(group_members(first.pgid.unwrap()).is_empty());
    let evs = events(&db.path, rec_id);
    let kinds: Vec<&str> = evs.iter().map(|e| e.0.as_str()).collect();
    assert!(kinds.contains(&"late_result_discarded"), "{kinds:?}");
    assert!(kinds.contains(&"torn_down"), "{kinds:?}");
    // The first attempt wrote no ending of its own: one `succeeded`, no `failed`.
    assert_eq!(kinds.iter().filter(|k| **k == "succeeded").count(), 1);
    assert!(!kinds.contains(&"failed"), "{kinds:?}");
    let torn = kinds.iter().position(|k| *k == "torn_down").unwrap();
    let second_claim = kinds.iter().rposition(|k| *k == "claimed").unwrap();
    assert!(
        torn < second_claim,
        "torn down before the job ran again: {kinds:?}"
    );
}

#[test]
fn completion_fires_exactly_once_for_every_kind_of_ending() {
    let db = db();
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
    running(&db.path, ids["cancelled"]);
    runner.cancel(ids["cancelled"]).unwrap();
    // A lost ending decided by the sweeper, for a job another (dead) runner held.
    let lost = Store::open(&db.path)
        .unwrap()
        .enqueue(
            &Job::shell("true")
                .on_lost(OnLost::Fail)
                .delay(Duration::from_secs(3600)),
            now_ms(),
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
    wait_until("every completion", WAIT, || {
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

#[test]
fn shutdown_kills_running_jobs_and_requeues_them_without_spending_budget() {
    let db = db();
    let runner = fast(&db.path).start().expect("start");
    let id = runner
        .enqueue(&Job::shell("trap '' TERM; sleep 300"))
        .expect("enqueue");
    let pgid = running(&db.path, id).pgid.unwrap();
    let started = Instant::now();
    runner
        .shutdown_within(Duration::from_millis(200))
        .expect("shutdown");
    // Grace, then TERM and KILL after the kill grace, with room for a slow machine.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(group_members(pgid).is_empty());
    let rec = job(&db.path, id);
    assert_eq!(rec.status, Status::Pending);
    assert_eq!(rec.recovery_count, 0);
    assert!(kinds(&db.path, id).contains(&"interrupted".to_string()));
    let runners = Store::open(&db.path).unwrap().runners().unwrap();
    assert!(
        runners.is_empty(),
        "the runner is recorded as stopped: {runners:?}"
    );
}

#[test]
fn enqueue_from_a_program_without_a_runner_is_picked_up() {
    let db = db();
    let id = Store::open(&db.path)
        .unwrap()
        .enqueue(
            &Job::shell("echo job $LEASEHOLD_JOB_ID in $PWD with $GREETING")
                .env("GREETING", "hello")
                .cwd("/tmp"),
            now_ms(),
        )
        .unwrap();
    let runner = fast(&db.path).start().expect("start");
    assert_eq!(outcome(&runner, id), Outcome::Succeeded);
    assert_eq!(
        stdout(&db.path, id),
        format!("job {id} in /tmp with hello\n")
    );
}

#[test]
fn enqueue_from_many_threads_while_running() {
    let db = db();
    let runner = Arc::new(fast(&db.path).start().expect("start"));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let r = Arc::clone(&runner);
            std::thread::spawn(move || {
                (0..10)
                    .map(|_| r.enqueue(&Job::shell("true")).unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let ids: Vec<i64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    for id in ids {
        assert_eq!(outcome(&runner, id), Outcome::Succeeded);
    }
}
