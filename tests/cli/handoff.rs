//! A `jobs add` handed to a running runner (see `Store::hand_off`): when the runner does not
//! answer, is dead or refuses the job, the command stores the job itself, once, with the errors it would
//! have had without a runner.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::helper::{add, cli, fails, idle_runner, inspect, json, ok, stop};
use crate::util::{TestDb, bare, leasehold_vars, wait_until};

/// The job ids a `handoffs` row names: the jobs stored under a command's token.
fn handed(db: &Path) -> Vec<i64> {
    let conn = bare(db);
    let mut stmt = conn
        .prepare("SELECT job_id FROM handoffs ORDER BY job_id")
        .unwrap();
    stmt.query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn job_ids(db: &Path) -> Vec<i64> {
    let v = json(&mut cli(db, &["jobs", "ls", "--json"]));
    let mut ids: Vec<i64> = v
        .as_array()
        .expect("a list")
        .iter()
        .map(|j| j["id"].as_i64().expect("an id"))
        .collect();
    ids.sort_unstable();
    ids
}

/// A socket in the wake-up folder of `db` that takes requests and never answers, as a frozen
/// or hung runner's does, and the folder. (A real runner frozen by SIGSTOP would do the same,
/// but may freeze inside a transaction, and then no process can write to the file until it
/// thaws, whatever path it takes.)
fn silent_runner(db: &Path) -> (PathBuf, UnixDatagram) {
    let folder = PathBuf::from(format!("{}-wake", db.display()));
    // Owner-only, as a runner makes it: a folder others could use is never sent a job.
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&folder)
        .unwrap();
    let silent = UnixDatagram::bind(folder.join("1-silent.sock")).unwrap();
    (folder, silent)
}

#[test]
fn a_runner_that_does_not_answer_leaves_the_job_to_the_command_which_stores_it_once() {
    let t = TestDb::new();
    let db = t.path.as_path();
    ok(&mut cli(db, &["db", "migrate"]));
    let (folder, silent) = silent_runner(db);

    let first = add(db, &["--queue", "here"], &["true"]);
    assert_eq!(
        handed(db),
        [first],
        "stored by the command, under its token"
    );
    assert_eq!(job_ids(db), [first]);

    // The request the silent runner got, read only now: as a runner that thaws would.
    let mut request = vec![0u8; 64 * 1024];
    silent.set_nonblocking(true).unwrap();
    let n = silent
        .recv(&mut request)
        .expect("the command sent its request");
    request.truncate(n);
    drop(silent);
    std::fs::remove_file(folder.join("1-silent.sock")).unwrap();

    // A real runner given that request late finds its token and stores nothing.
    let runner = idle_runner(db);
    let runner_socket = std::fs::read_dir(&folder)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "sock"))
        .expect("the runner's socket");
    let us = UnixDatagram::bind_addr(
        &SocketAddr::from_abstract_name(format!("leasehold-test-{}", std::process::id())).unwrap(),
    )
    .unwrap();
    us.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    us.send_to(&request, &runner_socket).unwrap();
    let mut answer = vec![0u8; 512];
    let n = us.recv(&mut answer).expect("the runner answers");
    let answer: serde_json::Value = serde_json::from_slice(&answer[..n]).unwrap();
    assert_eq!(answer["id"], first, "{answer}");
    assert_eq!(answer["duplicate"], false, "{answer}");
    assert_eq!(job_ids(db), [first], "no job twice");

    // And the runner takes the next command's job itself.
    let second = add(db, &["--queue", "here"], &["true"]);
    assert_eq!(handed(db), [first, second]);
    assert_eq!(job_ids(db), [first, second]);
    stop(runner);
}

#[test]
fn a_dead_runners_socket_is_passed_over_and_deleted() {
    let t = TestDb::new();
    let db = t.path.as_path();
    ok(&mut cli(db, &["db", "migrate"]));
    let mut runner = idle_runner(db);
    runner.crash();
    let folder = format!("{}-wake", db.display());
    let sockets = || std::fs::read_dir(&folder).unwrap().count();
    assert_eq!(sockets(), 1, "a SIGKILLed runner leaves its socket behind");

    let id = add(db, &["--queue", "here"], &["true"]);
    assert_eq!(inspect(db, id)["status"], "pending");
    assert_eq!(sockets(), 0, "the refusing socket was deleted");
    assert!(handed(db).is_empty(), "nothing was handed over: no token");
}

#[test]
fn a_job_the_store_refuses_is_refused_as_without_a_runner() {
    let t = TestDb::new();
    let db = t.path.as_path();
    ok(&mut cli(db, &["db", "migrate"]));
    let args = ["jobs", "add", "--after", "4242", "--", "true"];
    let alone = fails(&mut cli(db, &args), 1);

    let runner = idle_runner(db);
    let beside = fails(&mut cli(db, &args), 1);
    assert_eq!(beside, alone);
    assert!(job_ids(db).is_empty(), "nothing is stored");
    assert!(handed(db).is_empty());
    stop(runner);
}

#[test]
fn a_job_too_large_to_hand_over_is_stored_by_the_command() {
    let t = TestDb::new();
    let db = t.path.as_path();
    ok(&mut cli(db, &["db", "migrate"]));
    let runner = idle_runner(db);
    let big = format!("BIG={}", "x".repeat(70_000));
    let id = add(db, &["--queue", "here", "--env", &big], &["true"]);
    assert!(handed(db).is_empty(), "stored by the command itself");
    let job = json(&mut cli(
        db,
        &["jobs", "inspect", &id.to_string(), "--json", "--show-env"],
    ));
    assert_eq!(job["env"]["BIG"].as_str().map(str::len), Some(70_000));
    stop(runner);
}

#[test]
fn an_answer_from_anyone_but_the_runner_is_ignored() {
    let t = TestDb::new();
    let db = t.path.as_path();
    ok(&mut cli(db, &["db", "migrate"]));
    let (_, silent) = silent_runner(db);
    silent
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();

    let mut command = std::process::Command::new(assert_cmd::cargo::cargo_bin("leasehold"));
    for var in leasehold_vars() {
        command.env_remove(var);
    }
    let child = command
        .arg("--db")
        .arg(db)
        .args(["jobs", "add", "--queue", "here", "--", "true"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The command's socket is abstract: any local process can learn its name and send to it.
    // One that is not the runner answers first, with a job that was never stored.
    let mut request = vec![0u8; 64 * 1024];
    let n = silent
        .recv(&mut request)
        .expect("the command sent its request");
    let request: serde_json::Value = serde_json::from_slice(&request[..n]).unwrap();
    let token = request["token"].as_str().unwrap();
    let forger = UnixDatagram::unbound().unwrap();
    let forged = serde_json::json!({"token": token, "id": 4242, "duplicate": false});
    forger
        .send_to_addr(
            forged.to_string().as_bytes(),
            &SocketAddr::from_abstract_name(format!("leasehold-{token}")).unwrap(),
        )
        .unwrap();

    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let id: i64 = String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_ne!(id, 4242, "the forged answer was taken");
    assert_eq!(job_ids(db), [id], "the command stored the job itself");
    assert_eq!(handed(db), [id]);
}

/// The frozen-runner tests start this many `jobs add` at once: more than a socket's queue of
/// datagrams holds (`/proc/sys/net/unix/max_dgram_qlen`, 10 by default).
const MORE_THAN_A_QUEUE: usize = 15;

/// How long each of those adds may take before the test counts it as hung and kills it: the
/// 3 s wait, then the command's own commit, with room for a loaded machine.
const ADD_DEADLINE: Duration = Duration::from_secs(20);

/// Starts `n` `jobs add -- true` on `db` at once, each with `env` set, and waits up to
/// [`ADD_DEADLINE`] for them; returns the ids printed by those that ended, and how many were
/// still running then (each killed by its pid).
fn adds_at_once(db: &Path, n: usize, env: &[(&str, &str)]) -> (Vec<i64>, usize) {
    let mut children: Vec<std::process::Child> = (0..n)
        .map(|_| {
            let mut command = std::process::Command::new(assert_cmd::cargo::cargo_bin("leasehold"));
            for var in leasehold_vars() {
                command.env_remove(var);
            }
            command
                .envs(env.iter().copied())
                .arg("--db")
                .arg(db)
                .args(["jobs", "add", "--queue", "here", "--", "true"])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut ended = vec![false; n];
    wait_until(ADD_DEADLINE, || {
        for (child, ended) in children.iter_mut().zip(ended.iter_mut()) {
            *ended = *ended || child.try_wait().unwrap().is_some();
        }
        ended.iter().all(|e| *e)
    });
    let mut hung = 0;
    let mut ids = Vec::new();
    for (mut child, ended) in children.drain(..).zip(ended) {
        if !ended && child.try_wait().unwrap().is_none() {
            hung += 1;
            // By its pid, not by name.
            child.kill().unwrap();
        }
        let out = child.wait_with_output().unwrap();
        if ended {
            assert!(out.status.success(), "an add failed: {out:?}");
            let id = String::from_utf8(out.stdout)
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            ids.push(id);
        }
    }
    (ids, hung)
}

/// Checks that every add ended with a job of its own, each stored once.
fn each_stored_once(db: &Path, mut ids: Vec<i64>, n: usize) {
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), n, "each add printed an id of its own: {ids:?}");
    assert_eq!(job_ids(db), ids, "each job stored once, and nothing else");
}

/// Whether the process `pid` is stopped (state `T`).
fn is_stopped(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
    })
}

/// SIGSTOPs `runner` at a moment it holds no write lock on `db` (a runner frozen inside a
/// transaction blocks every writer until it thaws, whatever path an add takes; the README
/// says so): stops it, checks the lock is free, and if not continues it and tries again.
fn freeze_between_transactions(runner: &crate::util::RunnerProcess, db: &Path) {
    let pid = runner.pid().as_raw();
    for _ in 0..50 {
        runner.signal(Signal::SIGSTOP);
        assert!(
            wait_until(Duration::from_secs(5), || is_stopped(pid)),
            "the runner stops"
        );
        let conn = rusqlite::Connection::open(db).unwrap();
        conn.busy_timeout(Duration::from_millis(100)).unwrap();
        if conn.execute_batch("BEGIN IMMEDIATE; ROLLBACK;").is_ok() {
            return;
        }
        runner.signal(Signal::SIGCONT);
        assert!(wait_until(Duration::from_secs(5), || !is_stopped(pid)));
    }
    panic!("the runner always froze holding the write lock");
}

#[test]
fn a_frozen_runner_does_not_make_jobs_add_hang() {
    let t = TestDb::new();
    let db = t.path.as_path();
    ok(&mut cli(db, &["db", "migrate"]));
    let mut runner = idle_runner(db);
    freeze_between_transactions(&runner, db);

    // More adds than the frozen runner's socket queues: each either waits out its answer
    // and stores its job itself, or finds the queue full and stores its job at once.
    let (ids, hung) = adds_at_once(db, MORE_THAN_A_QUEUE, &[]);
    runner.signal(Signal::SIGCONT);
    assert_eq!(hung, 0, "adds hung beside a frozen runner");
    each_stored_once(db, ids.clone(), MORE_THAN_A_QUEUE);

    // Thawed, the runner reads the requests queued in its socket, all past their deadline:
    // it stores none of them again, and ends when asked.
    runner.signal(Signal::SIGTERM);
    let (code, log) = runner.wait(Duration::from_secs(20));
    assert!(code.is_some(), "the runner ends: {log}");
    each_stored_once(db, ids, MORE_THAN_A_QUEUE);
}

#[test]
fn a_runner_socket_nobody_reads_does_not_make_jobs_add_hang() {
    // As a runner's socket whose listener loop died: bound, never read.
    let t = TestDb::new();
    let db = t.path.as_path();
    ok(&mut cli(db, &["db", "migrate"]));
    let (_folder, _unread) = silent_runner(db);

    let (ids, hung) = adds_at_once(db, MORE_THAN_A_QUEUE, &[]);
    assert_eq!(hung, 0, "adds hung on a socket nobody reads");
    each_stored_once(db, ids, MORE_THAN_A_QUEUE);
}

#[test]
fn a_database_path_spelled_differently_is_still_handed_to_the_runner() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let dir = db.parent().unwrap();
    ok(&mut cli(db, &["db", "migrate"]));
    let runner = idle_runner(db);

    // `../jobs.db` from a folder beside it; a symlink to the file from another folder; the
    // file through a symlink to its folder.
    let sub = dir.join("sub");
    std::fs::create_dir(&sub).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let file_link = elsewhere.path().join("link.db");
    std::os::unix::fs::symlink(db, &file_link).unwrap();
    let dir_link = elsewhere.path().join("dir");
    std::os::unix::fs::symlink(dir, &dir_link).unwrap();
    let spellings: [(&Path, PathBuf); 3] = [
        (&sub, PathBuf::from("../jobs.db")),
        (elsewhere.path(), file_link.clone()),
        (elsewhere.path(), dir_link.join("jobs.db")),
    ];
    let mut ids = Vec::new();
    for (cwd, spelled) in &spellings {
        let mut command = std::process::Command::new(assert_cmd::cargo::cargo_bin("leasehold"));
        for var in leasehold_vars() {
            command.env_remove(var);
        }
        let out = command
            .env("RUST_LOG", "leasehold=debug")
            .current_dir(cwd)
            .arg("--db")
            .arg(spelled)
            .args(["jobs", "add", "--queue", "here", "--", "true"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{spelled:?}: {out:?}");
        // The answering path: the runner's answer was taken, not waited out.
        assert!(
            stderr.contains("stored by the runner"),
            "{spelled:?} from {cwd:?}: the runner's answer was not taken: {stderr}"
        );
        assert!(!stderr.contains("no answer"), "{spelled:?}: {stderr}");
        ids.push(
            String::from_utf8(out.stdout)
                .unwrap()
                .trim()
                .parse()
                .unwrap(),
        );
    }
    assert_eq!(
        handed(db),
        ids,
        "each stored by the runner, under its token"
    );
    each_stored_once(db, ids, spellings.len());
    stop(runner);
}

/// The descriptors of process `pid` open on `file`, by number.
fn fds_on(pid: i32, file: &Path) -> Vec<i32> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|target| target == file))
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

#[test]
fn a_runner_whose_start_fails_after_its_listener_started_unwinds_it() {
    let t = TestDb::new();
    let db = t.path.as_path();
    ok(&mut cli(db, &["db", "migrate"]));
    let db = std::fs::canonicalize(db).unwrap();
    let wal = PathBuf::from(format!("{}-wal", db.display()));
    let runner_args = |mut args: Vec<String>| {
        args.extend(["--db".into(), db.display().to_string(), "run".into()]);
        args.extend(crate::helper::FAST.iter().map(|s| s.to_string()));
        args.extend(["--queue".into(), "elsewhere".into()]);
        args
    };

    // A runner that starts: its last connection, the writer's, opened after the listener
    // thread started, holds the highest descriptor on the WAL.
    let measured = idle_runner(&db);
    assert!(
        wait_until(Duration::from_secs(10), || measured
            .log()
            .contains(" started: ")),
        "the runner starts"
    );
    let last = *fds_on(measured.pid().as_raw(), &wal)
        .iter()
        .max()
        .expect("the runner has the WAL open");
    stop(measured);

    // The same runner with one descriptor fewer: its writer cannot open its WAL, and its
    // start fails after the wake-up listener is up.
    let mut command = std::process::Command::new("prlimit");
    for var in leasehold_vars() {
        command.env_remove(var);
    }
    let log_path = db.with_file_name("failed-runner.log");
    let mut child = command
        .args(runner_args(vec![
            format!("--nofile={last}:{last}"),
            "--".into(),
            assert_cmd::cargo::cargo_bin("leasehold")
                .display()
                .to_string(),
        ]))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let status = crate::util::poll(Duration::from_secs(20), || child.try_wait().unwrap());
    if status.is_none() {
        // By its pid, not by name.
        child.kill().unwrap();
        child.wait().unwrap();
    }
    let stderr = std::fs::read_to_string(&log_path).unwrap();
    let status = status.unwrap_or_else(|| panic!("the runner started anyway: {stderr}"));
    assert_eq!(status.code(), Some(1), "start fails: {stderr}");
    assert!(stderr.contains("leasehold: "), "{stderr}");

    // Nothing it set up is left: no socket bound (a command would hand it jobs), its
    // registration marked stopped.
    let folder = PathBuf::from(format!("{}-wake", db.display()));
    let sockets: Vec<_> = std::fs::read_dir(&folder)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(sockets.is_empty(), "sockets left: {sockets:?}: {stderr}");
    let conn = bare(&db);
    let live: i64 = conn
        .query_row(
            "SELECT count(*) FROM runners WHERE stopped_at IS NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let all: i64 = conn
        .query_row("SELECT count(*) FROM runners", [], |r| r.get(0))
        .unwrap();
    assert_eq!(all, 2, "the failed runner had registered: {stderr}");
    assert_eq!(live, 0, "the failed runner is not marked stopped: {stderr}");
}
