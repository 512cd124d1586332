//! `run`: jobs run until idle, queues, short leases, signals that shut a runner down, and a
//! new runner reclaiming a dead one's job.

use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};

use crate::helper::{FAST, add, cli, fails, inspect, json, ok, run_until_idle, wait_running};
use crate::util::{RunnerProcess, TestDb, alive, wait_until};

#[test]
fn a_lease_shorter_than_the_least_renewal_budget_runs_jobs_without_losing_them() {
    // Once made the heartbeat thread panic on a clamp whose bounds crossed, after which the
    // runner went on without renewing and exited 0.
    let t = TestDb::new();
    let db = t.path.as_path();
    let id = add(db, &[], &["sleep", "0.5"]);
    ok(&mut cli(
        db,
        &[
            "run",
            "--until-idle",
            "--lease-ttl",
            "0.2",
            "--heartbeat",
            "0.05",
            "--sweep",
            "0.1",
            "--kill-grace",
            "0.05",
        ],
    ));
    let job = inspect(db, id);
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(job["recovery_count"], 0, "{job}");
}

/// Issue 34: `--lease-ttl 10` alone was refused ("heartbeat 5s × 3 exceeds the lease TTL of
/// 10s"); the heartbeat, sweep and kill grace not given now follow the lease. A flag given
/// that breaks the ladder is still refused, naming it.
#[test]
fn a_lease_ttl_given_alone_brings_a_ladder_that_fits_it() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let id = add(db, &[], &["true"]);
    ok(&mut cli(db, &["run", "--until-idle", "--lease-ttl", "10"]));
    assert_eq!(inspect(db, id)["status"], "succeeded");
    ok(&mut cli(
        db,
        &[
            "run",
            "--until-idle",
            "--lease-ttl",
            "5",
            "--heartbeat",
            "0.5",
        ],
    ));
    let line = fails(
        &mut cli(
            db,
            &[
                "run",
                "--until-idle",
                "--lease-ttl",
                "10",
                "--heartbeat",
                "4",
            ],
        ),
        2,
    );
    assert!(line.contains("invalid --heartbeat"), "{line}");
    let line = fails(
        &mut cli(
            db,
            &[
                "run",
                "--until-idle",
                "--lease-ttl",
                "10",
                "--kill-grace",
                "9",
            ],
        ),
        2,
    );
    assert!(line.contains("invalid --kill-grace"), "{line}");
    let line = fails(
        &mut cli(db, &["run", "--until-idle", "--lease-ttl", "0.2"]),
        2,
    );
    assert!(line.contains("invalid --lease-ttl"), "{line}");
}

#[test]
fn sigterm_shuts_the_runner_down_and_requeues_its_job_without_spending_recovery() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let id = add(db, &[], &["sleep", "30"]);
    let mut args = FAST.to_vec();
    args.extend(["--shutdown-grace", "0.5"]);
    let mut runner = RunnerProcess::start(db, &args);
    let job = wait_running(db, id);
    let pid = job["pid"].as_i64().unwrap();

    let v = json(&mut cli(db, &["status", "--json"]));
    assert_eq!(v["job_leases"]["running"], 1);
    let runners = v["runners"].as_array().unwrap();
    assert_eq!(runners.len(), 1, "{v}");
    let r = &runners[0];
    assert_eq!(r["pid"], i64::from(runner.pid().as_raw()));
    assert_eq!(r["alive"], true);
    assert!(r["worker_id"].is_string() && r["host"].is_string() && r["heartbeat_at"].is_i64());
    assert_eq!(job["worker_id"], r["worker_id"]);

    let sent = Instant::now();
    kill(runner.pid(), Signal::SIGTERM).unwrap();
    let (code, stderr) = runner.wait(Duration::from_secs(10));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        sent.elapsed() < Duration::from_secs(5),
        "{:?}",
        sent.elapsed()
    );
    assert!(stderr.contains("SIGTERM"), "{stderr}");
    let job = inspect(db, id);
    assert_eq!(job["status"], "pending", "{job}");
    assert_eq!(job["recovery_count"], 0);
    assert!(!alive(pid), "the job's process {pid} survived the shutdown");
    assert_eq!(
        json(&mut cli(db, &["status", "--json"]))["runners"],
        serde_json::json!([])
    );
}

/// Without keepers, a killed runner's attempt dies with nothing to record its end: the next
/// runner tears it down and runs it again. (With keepers, see `keepers.rs`.)
#[test]
fn a_new_runner_reclaims_a_dead_runners_job_and_logs_the_sweep() {
    let t = TestDb::new();
    let db = t.path.as_path();
    // Runs long the first time, succeeds the second.
    let id = add(
        db,
        &["--cwd", t.dir.path().to_str().unwrap()],
        &[
            "sh",
            "-c",
            "if [ -e marker ]; then exit 0; fi; touch marker; sleep 30",
        ],
    );
    let no_keepers: Vec<&str> = FAST.iter().copied().chain(["--no-keepers"]).collect();
    let mut first = RunnerProcess::start(db, &no_keepers);
    let pid = wait_running(db, id)["pid"].as_i64().unwrap();
    kill(first.pid(), Signal::SIGKILL).unwrap();
    first.wait(Duration::from_secs(10));
    let v = json(&mut cli(db, &["status", "--json"]));
    assert_eq!(v["runners"][0]["alive"], false, "{v}");

    let mut args = vec!["run", "--until-idle"];
    args.extend_from_slice(&no_keepers);
    let out = cli(db, &args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("reclaimed_pending=1") && stderr.contains("reclaimed_failed=0"),
        "no sweep line: {stderr}"
    );
    let job = inspect(db, id);
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(job["recovery_count"], 1);
    assert!(!alive(pid), "the lost attempt's process {pid} survived");
}

#[test]
fn sigint_shuts_an_idle_runner_down() {
    let t = TestDb::new();
    let db = t.path.as_path();
    ok(&mut cli(db, &["db", "migrate"]));
    let mut runner = RunnerProcess::start(db, &FAST);
    let registered = wait_until(Duration::from_secs(10), || {
        json(&mut cli(db, &["status", "--json"]))["runners"]
            .as_array()
            .is_some_and(|r| r.len() == 1)
    });
    assert!(registered);
    kill(runner.pid(), Signal::SIGINT).unwrap();
    let (code, stderr) = runner.wait(Duration::from_secs(10));
    assert_eq!(code, Some(0), "{stderr}");
}

/// A runner started by a parent that ignores SIGCHLD (inherited across exec) would have its
/// jobs reaped by the kernel and lose every exit status: it refuses to start, naming the
/// cause, and runs nothing. Before this was fixed it started, and its jobs' endings were
/// whatever `waitpid` failing made of them.
#[test]
fn a_runner_that_inherits_an_ignored_sigchld_refuses_to_start() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let id = add(db, &[], &["true"]);
    let bin = assert_cmd::cargo::cargo_bin("leasehold");
    // dash does not pass an ignored SIGCHLD on to what it execs; bash does.
    let mut cmd = assert_cmd::Command::new("bash");
    for var in crate::util::leasehold_vars() {
        cmd.env_remove(var);
    }
    cmd.timeout(crate::helper::COMMAND_TIMEOUT)
        .arg("-c")
        .arg("trap '' CHLD; exec \"$0\" --db \"$1\" run --until-idle")
        .arg(&bin)
        .arg(db);
    let err = fails(&mut cmd, 2);
    assert!(err.contains("SIGCHLD is ignored"), "{err}");
    assert_eq!(inspect(db, id)["status"], "pending");
}

crate::on_both! {
    fn run_until_idle_runs_a_success_a_failure_and_a_timeout(t) {
        let target = t.target();
        let db = target.as_path();
        let good = add(
            db,
            &[],
            &["sh", "-c", "echo hello; printf 'bad \\377 byte' >&2"],
        );
        let bad = add(db, &[], &["sh", "-c", "echo oops >&2; exit 3"]);
        let slow = add(db, &["--timeout", "0.5"], &["sleep", "30"]);
        let started = Instant::now();
        run_until_idle(db, &[]);
        assert!(started.elapsed() < Duration::from_secs(15));

        let job = inspect(db, good);
        assert_eq!(job["status"], "succeeded", "{job}");
        assert_eq!(job["exit_code"], 0);
        assert_eq!(job["attempt"], 1);
        assert!(job["completed_at"].as_i64().unwrap() >= job["started_at"].as_i64().unwrap());
        assert_eq!(job["output"]["stdout"], "hello\n");
        assert_eq!(job["output"]["stderr"], "bad \u{fffd} byte");
        assert_eq!(job["output"]["truncated"], false);
        let events = job["events"].as_array().unwrap();
        let kinds: Vec<&str> = events.iter().map(|e| e["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds.first(), Some(&"enqueued"));
        assert_eq!(kinds.last(), Some(&"succeeded"));
        for e in events {
            assert!(e["at"].is_i64() && e["attempt"].is_i64() && e.get("detail").is_some());
        }
        let ats: Vec<i64> = events.iter().map(|e| e["at"].as_i64().unwrap()).collect();
        assert!(ats.windows(2).all(|w| w[0] <= w[1]), "events oldest first");

        let job = inspect(db, bad);
        assert_eq!(job["status"], "failed", "{job}");
        assert_eq!(job["exit_code"], 3);
        assert_eq!(job["error_kind"], "exit");
        assert_eq!(job["output"]["stderr"], "oops\n");

        let job = inspect(db, slow);
        assert_eq!(job["status"], "failed", "{job}");
        assert_eq!(job["error_kind"], "timeout");
        assert!(
            job["last_error"].as_str().unwrap().contains("timed out"),
            "{job}"
        );

        // The logs, raw: invalid UTF-8 stays as it was written.
        let out = cli(db, &["jobs", "logs", &good.to_string()])
            .output()
            .unwrap();
        assert!(out.status.success());
        assert_eq!(out.stdout, b"hello\n");
        let out = cli(
            db,
            &[
                "jobs",
                "logs",
                &good.to_string(),
                "--stderr",
                "--attempt",
                "1",
            ],
        )
        .output()
        .unwrap();
        assert!(out.status.success());
        assert_eq!(out.stdout, b"bad \xff byte");
        let line = fails(
            &mut cli(db, &["jobs", "logs", &good.to_string(), "--attempt", "2"]),
            1,
        );
        assert!(line.contains("attempt 2"), "{line}");

        // The human forms.
        let human = ok(&mut cli(db, &["jobs", "inspect", &bad.to_string()]));
        assert!(
            human.contains("failed") && human.contains("oops"),
            "{human}"
        );
        let table = ok(&mut cli(db, &["jobs", "ls"]));
        assert_eq!(table.lines().count(), 4, "{table}");
        assert!(
            table.contains("succeeded") && table.contains("timeout"),
            "{table}"
        );
    }

    fn run_takes_only_its_queues_and_until_idle_ignores_the_others(t) {
        let target = t.target();
        let db = target.as_path();
        let mine = add(db, &["--queue", "mine"], &["true"]);
        let other = add(db, &["--queue", "other"], &["true"]);
        run_until_idle(db, &["--queue", "mine", "--workers", "1"]);
        assert_eq!(inspect(db, mine)["status"], "succeeded");
        assert_eq!(inspect(db, other)["status"], "pending");
    }
}
