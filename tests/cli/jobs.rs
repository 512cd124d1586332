//! The `jobs` commands: add (options, files, stdin), the job object's fields, ls, logs, retry
//! and cancel, including of jobs a runner holds.

use std::path::Path;
use std::time::{Duration, Instant};

use leasehold::now_ms;
use nix::sys::signal::{Signal, kill};
use serde_json::Value;

use crate::helper::{FAST, add, cli, fails, inspect, json, ok, run_until_idle, wait_running};
use crate::util::{RunnerProcess, TestDb, alive, bare, wait_until};

/// The job object's fields that scripts depend on.
const JOB_FIELDS: [&str; 22] = [
    "id",
    "queue",
    "argv",
    "status",
    "priority",
    "attempt",
    "max_attempts",
    "recovery_count",
    "on_lost",
    "exit_code",
    "signal",
    "error_kind",
    "last_error",
    "run_token",
    "worker_id",
    "pid",
    "created_at",
    "scheduled_at",
    "started_at",
    "heartbeat_at",
    "lease_expires_at",
    "completed_at",
];

#[test]
fn jobs_add_from_a_file_or_stdin_enqueues_one_shell_job_per_line() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let file = t.sibling("jobs.txt");
    std::fs::write(&file, "echo one\n\n   \necho two\r\necho three").unwrap();
    let out = ok(&mut cli(
        db,
        &[
            "jobs",
            "add",
            "--queue",
            "batch",
            "--from-file",
            file.to_str().unwrap(),
        ],
    ));
    assert_eq!(out.trim(), "3");
    let jobs = json(&mut cli(db, &["jobs", "ls", "--json", "--queue", "batch"]));
    let mut argvs: Vec<Value> = jobs
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["argv"].clone())
        .collect();
    argvs.reverse();
    assert_eq!(
        argvs,
        vec![
            serde_json::json!(["sh", "-c", "echo one"]),
            serde_json::json!(["sh", "-c", "echo two"]),
            serde_json::json!(["sh", "-c", "echo three"]),
        ]
    );
    let v =
        json(cli(db, &["jobs", "add", "--from-file", "-", "--json"]).write_stdin("true\nfalse\n"));
    let ids = v["ids"].as_array().expect("{\"ids\": [...]}");
    assert_eq!(ids.len(), 2);
    assert_eq!(ids[1].as_i64().unwrap(), ids[0].as_i64().unwrap() + 1);
    // A missing file is an operation error; nothing is enqueued.
    fails(
        &mut cli(
            db,
            &[
                "jobs",
                "add",
                "--from-file",
                t.sibling("nope.txt").to_str().unwrap(),
            ],
        ),
        1,
    );
    assert_eq!(
        json(&mut cli(db, &["status", "--json"]))["jobs"]["pending"],
        5
    );
}

#[test]
fn jobs_add_from_file_enqueues_a_hundred_thousand_lines_in_one_go() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let file = t.sibling("many.txt");
    let text: String = (0..100_000).map(|i| format!("echo {i}\n")).collect();
    std::fs::write(&file, text).unwrap();
    let started = Instant::now();
    let out = ok(&mut cli(
        db,
        &["jobs", "add", "--from-file", file.to_str().unwrap()],
    ));
    eprintln!("100000 lines enqueued in {:?}", started.elapsed());
    assert_eq!(out.trim(), "100000");
    let v = json(&mut cli(db, &["status", "--json"]));
    assert_eq!(v["jobs"]["pending"], 100_000);
}

#[test]
fn retry_refuses_a_live_running_job_and_takes_one_whose_lease_expired() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let id = add(db, &[], &["true"]);
    let conn = bare(db);
    conn.execute(
        "UPDATE jobs SET status = 'running', attempt = 1, run_token = 'tok', worker_id = 'elsewhere:1:x',
             started_at = ?2, heartbeat_at = ?2, lease_expires_at = ?2 + 60000 WHERE id = ?1",
        rusqlite::params![id, now_ms()],
    )
    .unwrap();
    let line = fails(&mut cli(db, &["jobs", "retry", &id.to_string()]), 1);
    assert!(line.contains("running") && line.contains("lease"), "{line}");
    let v = json(&mut cli(db, &["status", "--json"]));
    assert_eq!(v["job_leases"]["running"], 1);
    assert_eq!(v["job_leases"]["stale_running"], 0);

    conn.execute(
        "UPDATE jobs SET lease_expires_at = ?2 - 1000 WHERE id = ?1",
        rusqlite::params![id, now_ms()],
    )
    .unwrap();
    let v = json(&mut cli(db, &["status", "--json"]));
    assert_eq!(v["job_leases"]["stale_running"], 1);
    let v = json(&mut cli(db, &["jobs", "retry", &id.to_string(), "--json"]));
    assert_eq!(v["retried"], serde_json::json!([id]));
    let job = inspect(db, id);
    assert_eq!(job["status"], "pending");
    assert_eq!(job["recovery_count"], 0);
    assert_eq!(
        job["teardown_pending"], false,
        "the tool tore it down: {job}"
    );
}

#[test]
fn retry_of_a_lost_running_job_kills_its_processes_at_once() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let id = add(db, &[], &["sleep", "30"]);
    let mut runner = RunnerProcess::start(db, &FAST);
    let job = wait_running(db, id);
    let pid = job["pid"].as_i64().unwrap();
    assert!(alive(pid));
    // The runner dies without a word; its job keeps running, its lease runs out.
    kill(runner.pid(), Signal::SIGKILL).unwrap();
    runner.wait(Duration::from_secs(10));
    let line = fails(&mut cli(db, &["jobs", "retry", &id.to_string()]), 1);
    assert!(line.contains("lease"), "{line}");
    let mut last = String::new();
    let retried = wait_until(Duration::from_secs(10), || {
        let out = cli(db, &["jobs", "retry", &id.to_string()])
            .output()
            .unwrap();
        last = String::from_utf8_lossy(&out.stderr).into_owned();
        if !out.status.success() {
            // Poll the operator's way, a few times a second, until the lease runs out.
            std::thread::sleep(Duration::from_millis(100));
        }
        out.status.success()
    });
    assert!(retried, "the expired lease was not retried: {last}");
    assert!(
        !alive(pid),
        "the lost attempt's process {pid} survived the retry"
    );
    assert_eq!(inspect(db, id)["status"], "pending");
}

#[test]
fn failed_stale_jobs_are_listed_counted_and_retried() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let ids: Vec<i64> = (0..3).map(|_| add(db, &[], &["true"])).collect();
    let plain_failure = add(db, &[], &["true"]);
    let conn = bare(db);
    for (i, id) in ids.iter().enumerate() {
        conn.execute(
            "UPDATE jobs SET status = 'failed', recovery_count = 4, error_kind = 'lost',
                 completed_at = ?2, last_error = ?3 WHERE id = ?1",
            rusqlite::params![
                id,
                now_ms() + i as i64,
                if i == 0 {
                    "lease expired after missing heartbeat; test"
                } else {
                    "Lease metadata missing for running job; test"
                }
            ],
        )
        .unwrap();
    }
    conn.execute(
        "UPDATE jobs SET status = 'failed', recovery_count = 4, last_error = 'exited with code 1'
         WHERE id = ?1",
        [plain_failure],
    )
    .unwrap();

    let listed: Vec<i64> = json(&mut cli(db, &["jobs", "ls", "--failed-stale", "--json"]))
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_i64().unwrap())
        .collect();
    assert_eq!(
        listed,
        vec![ids[2], ids[1], ids[0]],
        "most recently failed first"
    );
    let table = ok(&mut cli(db, &["jobs", "ls", "--failed-stale"]));
    assert_eq!(table.lines().count(), 4, "{table}");
    let v = json(&mut cli(db, &["status", "--json"]));
    assert_eq!(v["job_leases"]["recovery_exhausted_failed"], 3);
    let human = ok(&mut cli(db, &["status"]));
    assert!(human.contains("recovery_exhausted_failed=3"), "{human}");

    let v = json(&mut cli(
        db,
        &["jobs", "retry", "--failed-stale", "--limit", "1", "--json"],
    ));
    assert_eq!(v, serde_json::json!({"retried": [ids[2]]}));
    let v = json(&mut cli(
        db,
        &[
            "jobs",
            "retry",
            "--failed-stale",
            "--all",
            "--reason",
            "host fixed",
            "--json",
        ],
    ));
    assert_eq!(v, serde_json::json!({"retried": [ids[1], ids[0]]}));
    let v = json(&mut cli(
        db,
        &["jobs", "retry", "--failed-stale", "--all", "--json"],
    ));
    assert_eq!(v, serde_json::json!({"retried": []}));
    for id in &ids {
        let job = inspect(db, *id);
        assert_eq!(job["status"], "pending");
        assert_eq!(job["recovery_count"], 0);
    }
    assert_eq!(inspect(db, plain_failure)["status"], "failed");
}

#[test]
fn cancel_of_a_running_job_kills_its_processes() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let id = add(db, &[], &["sleep", "30"]);
    let mut runner = RunnerProcess::start(db, &FAST);
    let pid = wait_running(db, id)["pid"].as_i64().unwrap();
    let v = json(&mut cli(db, &["jobs", "cancel", &id.to_string(), "--json"]));
    assert_eq!(v, serde_json::json!({"id": id, "status": "cancelled"}));
    assert!(
        wait_until(Duration::from_secs(5), || !alive(pid)),
        "the cancelled job's process {pid} is still alive"
    );
    assert_eq!(inspect(db, id)["status"], "cancelled");
    kill(runner.pid(), Signal::SIGTERM).unwrap();
    let (code, stderr) = runner.wait(Duration::from_secs(10));
    assert_eq!(code, Some(0), "{stderr}");
}

crate::on_both! {
    fn jobs_add_stores_every_option_and_prints_the_id(t) {
        let target = t.target();
        let db = target.as_path();
        let id: i64 = ok(&mut cli(db, &["jobs", "add", "--", "echo", "hello"]))
            .trim()
            .parse()
            .expect("jobs add prints the id alone");
        let job = inspect(db, id);
        assert_eq!(job["argv"], serde_json::json!(["echo", "hello"]));
        assert_eq!(job["queue"], "default");
        assert_eq!(job["priority"], 0);
        assert_eq!(job["max_attempts"], 1);
        assert_eq!(job["on_lost"], "requeue");

        let before = now_ms();
        let id2 = add(
            db,
            &[
                "--queue",
                "reports",
                "--priority",
                "-5",
                "--timeout",
                "2.5",
                "--idle-timeout",
                "0.2",
                "--delay",
                "60",
                "--max-attempts",
                "3",
                "--on-lost",
                "fail",
                "--env",
                "A=1",
                "--env",
                "B=x=y",
                "--cwd",
                ".",
            ],
            &["sh", "-c", "echo --not-a-flag"],
        );
        assert_eq!(id2, id + 1);
        let job = json(&mut cli(
            db,
            &["jobs", "inspect", &id2.to_string(), "--json", "--show-env"],
        ));
        assert_eq!(
            job["argv"],
            serde_json::json!(["sh", "-c", "echo --not-a-flag"])
        );
        assert_eq!(job["queue"], "reports");
        assert_eq!(job["priority"], -5);
        assert_eq!(job["timeout_ms"], 2500);
        assert_eq!(job["idle_timeout_ms"], 200);
        assert_eq!(job["max_attempts"], 3);
        assert_eq!(job["on_lost"], "fail");
        assert_eq!(job["env"], serde_json::json!({"A": "1", "B": "x=y"}));
        let cwd = job["cwd"].as_str().expect("the cwd is stored");
        assert!(Path::new(cwd).is_absolute(), "{cwd}");
        let scheduled = job["scheduled_at"].as_i64().unwrap();
        assert!(scheduled >= before + 60_000, "delay not applied: {job}");
        assert_eq!(
            scheduled - job["created_at"].as_i64().unwrap(),
            60_000,
            "{job}"
        );
    }

    fn env_values_are_masked_unless_show_env_is_asked_for(t) {
        let target = t.target();
        let db = target.as_path();
        let id = add(db, &["--env", "API_KEY=s3cret", "--env", "N=1"], &["true"]).to_string();
        let secret = "s3cret";

        // The text, the JSON of inspect and of ls: the names, never the values.
        let text = ok(&mut cli(db, &["jobs", "inspect", &id]));
        assert!(text.contains("API_KEY=") && text.contains("N="), "{text}");
        assert!(!text.contains(secret), "{text}");
        let inspected = ok(&mut cli(db, &["jobs", "inspect", &id, "--json"]));
        let listed = ok(&mut cli(db, &["jobs", "ls", "--json"]));
        for out in [&inspected, &listed] {
            assert!(!out.contains(secret), "{out}");
        }
        let inspected: Value = serde_json::from_str(&inspected).unwrap();
        let listed: Value = serde_json::from_str(&listed).unwrap();
        for env in [&inspected["env"], &listed[0]["env"]] {
            let env = env.as_object().expect("env is an object");
            assert_eq!(env.len(), 2, "{env:?}");
            // One mask for every value, so that not even a value's length shows.
            let mask = &env["API_KEY"];
            assert!(mask.as_str().is_some_and(|m| !m.is_empty()), "{env:?}");
            assert_eq!(&env["N"], mask, "{env:?}");
            assert!(text.contains(&format!("API_KEY={}", mask.as_str().unwrap())));
        }
        assert!(!ok(&mut cli(db, &["jobs", "ls"])).contains(secret));

        // Asked for, the values.
        let text = ok(&mut cli(db, &["jobs", "inspect", &id, "--show-env"]));
        assert!(text.contains("API_KEY=s3cret N=1"), "{text}");
        let shown = serde_json::json!({"API_KEY": "s3cret", "N": "1"});
        let inspected = json(&mut cli(
            db,
            &["jobs", "inspect", &id, "--json", "--show-env"],
        ));
        assert_eq!(inspected["env"], shown);
        let listed = json(&mut cli(db, &["jobs", "ls", "--json", "--show-env"]));
        assert_eq!(listed[0]["env"], shown);
        let help = ok(&mut cli(db, &["jobs", "inspect", "--help"]));
        assert!(help.contains("--show-env"), "{help}");
    }

    fn job_objects_have_every_field_with_null_for_unset_values(t) {
        let target = t.target();
        let db = target.as_path();
        let id = add(db, &[], &["true"]);
        for job in [
            inspect(db, id),
            json(&mut cli(db, &["jobs", "ls", "--json"]))[0].clone(),
        ] {
            for field in JOB_FIELDS {
                assert!(job.get(field).is_some(), "no {field} in {job}");
            }
            assert_eq!(job["id"], id);
            assert_eq!(job["status"], "pending");
            assert_eq!(job["attempt"], 0);
            assert_eq!(job["recovery_count"], 0);
            for unset in [
                "exit_code",
                "signal",
                "error_kind",
                "last_error",
                "run_token",
                "worker_id",
                "pid",
                "started_at",
                "heartbeat_at",
                "lease_expires_at",
                "completed_at",
            ] {
                assert!(job[unset].is_null(), "{unset} is set in {job}");
            }
            let created = job["created_at"].as_i64().expect("times are integers");
            assert!(
                (created - now_ms()).abs() < 60_000,
                "not ms since the epoch"
            );
            assert!(job["scheduled_at"].is_i64());
        }
        let job = inspect(db, id);
        assert_eq!(job["output"], Value::Null);
        assert_eq!(job["events"].as_array().unwrap().len(), 1);
    }

    fn jobs_ls_filters_by_status_queue_and_limit(t) {
        let target = t.target();
        let db = target.as_path();
        let a = add(db, &["--queue", "a"], &["true"]);
        let b = add(db, &["--queue", "b"], &["true"]);
        let c = add(db, &["--queue", "b"], &["true"]);
        ok(&mut cli(db, &["jobs", "cancel", &a.to_string()]));
        let ids = |args: &[&str]| -> Vec<i64> {
            let mut full = vec!["jobs", "ls", "--json"];
            full.extend_from_slice(args);
            json(&mut cli(db, &full))
                .as_array()
                .unwrap()
                .iter()
                .map(|j| j["id"].as_i64().unwrap())
                .collect()
        };
        assert_eq!(ids(&[]), vec![c, b, a]);
        assert_eq!(ids(&["--queue", "b"]), vec![c, b]);
        assert_eq!(ids(&["--status", "cancelled"]), vec![a]);
        assert_eq!(ids(&["--status", "pending", "--limit", "1"]), vec![c]);
        assert_eq!(ids(&["--queue", "none"]), Vec::<i64>::new());
        assert_eq!(ids(&["--failed-stale"]), Vec::<i64>::new());
    }

    fn logs_of_a_job_without_output_are_empty(t) {
        let target = t.target();
        let db = target.as_path();
        let id = add(db, &[], &["true"]);
        assert_eq!(ok(&mut cli(db, &["jobs", "logs", &id.to_string()])), "");
        assert_eq!(
            ok(&mut cli(db, &["jobs", "logs", &id.to_string(), "--stderr"])),
            ""
        );
    }

    fn retry_and_cancel_follow_the_rules(t) {
        let target = t.target();
        let db = target.as_path();
        let good = add(db, &[], &["true"]);
        let bad = add(db, &[], &["false"]);
        run_until_idle(db, &[]);
        let waiting = add(db, &[], &["true"]);

        let line = fails(&mut cli(db, &["jobs", "retry", &good.to_string()]), 1);
        assert!(line.contains("succeeded"), "{line}");
        let line = fails(&mut cli(db, &["jobs", "retry", &waiting.to_string()]), 1);
        assert!(line.contains("pending"), "{line}");
        let line = fails(&mut cli(db, &["jobs", "cancel", &good.to_string()]), 1);
        assert!(line.contains("succeeded"), "{line}");
        let line = fails(&mut cli(db, &["jobs", "cancel", &bad.to_string()]), 1);
        assert!(line.contains("failed"), "{line}");
        for args in [
            vec!["jobs", "retry", "999"],
            vec!["jobs", "cancel", "999"],
            vec!["jobs", "inspect", "999"],
            vec!["jobs", "logs", "999"],
        ] {
            let line = fails(&mut cli(db, &args), 1);
            assert!(line.contains("999"), "{args:?}: {line}");
        }

        let v = json(&mut cli(
            db,
            &[
                "jobs",
                "retry",
                &bad.to_string(),
                "--reason",
                "fixed the env",
                "--json",
            ],
        ));
        assert_eq!(v, serde_json::json!({"retried": [bad]}));
        let job = inspect(db, bad);
        assert_eq!(job["status"], "pending");
        assert!(
            job["last_error"]
                .as_str()
                .unwrap()
                .contains("fixed the env")
        );
        assert_eq!(
            job["events"].as_array().unwrap().last().unwrap()["kind"],
            "manual_retry"
        );

        let v = json(&mut cli(
            db,
            &["jobs", "cancel", &waiting.to_string(), "--json"],
        ));
        assert_eq!(v, serde_json::json!({"id": waiting, "status": "cancelled"}));
        let line = fails(&mut cli(db, &["jobs", "cancel", &waiting.to_string()]), 1);
        assert!(line.contains("cancelled"), "{line}");
        let out = ok(&mut cli(db, &["jobs", "retry", &waiting.to_string()]));
        assert!(out.contains(&waiting.to_string()), "{out}");
        assert_eq!(inspect(db, waiting)["status"], "pending");
    }
}

#[test]
fn a_jobs_name_is_shown_by_ls_inspect_and_wait() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let id = add(db, &["--name", "unit: parser"], &["true"]);
    add(db, &[], &["true"]);
    let ls = ok(&mut cli(db, &["jobs", "ls"]));
    assert!(ls.contains("[unit: parser] true"), "{ls}");
    let v = inspect(db, id);
    assert_eq!(v["name"], "unit: parser", "{v}");
    let text = ok(&mut cli(db, &["jobs", "inspect", &id.to_string()]));
    assert!(text.contains("unit: parser"), "{text}");
    run_until_idle(db, &[]);
    let waited = ok(&mut cli(db, &["jobs", "wait", &id.to_string()]));
    assert_eq!(
        waited.trim(),
        format!("{id} succeeded (exit 0) \"unit: parser\"")
    );
    let line = fails(
        &mut cli(db, &["jobs", "add", "--name", "", "--", "true"]),
        2,
    );
    assert!(line.contains("name"), "{line}");
}

#[test]
fn manners_caps_and_the_try_later_bound_are_added_and_inspected() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let id = add(
        db,
        &[
            "--nice",
            "5",
            "--io-class",
            "best-effort:2",
            "--memory-max",
            "512M",
            "--cpu-weight",
            "50",
            "--pids-max",
            "10",
            "--tempfail-max",
            "3",
        ],
        &["true"],
    );
    let v = inspect(db, id);
    assert_eq!(
        (
            &v["nice"],
            &v["io_class"],
            &v["memory_max"],
            &v["cpu_weight"],
            &v["pids_max"],
            &v["tempfail_max"],
            &v["tempfails"]
        ),
        (
            &5.into(),
            &"best-effort:2".into(),
            &(512u64 << 20).into(),
            &50.into(),
            &10.into(),
            &3.into(),
            &0.into()
        ),
        "{v}"
    );
    let text = ok(&mut cli(db, &["jobs", "inspect", &id.to_string()]));
    assert!(text.contains("nice 5, io best-effort:2"), "{text}");
    assert!(text.contains("0 of 3"), "{text}");
    for (flag, value) in [
        ("--nice", "20"),
        ("--io-class", "realtime"),
        ("--memory-max", "12X"),
        ("--cpu-weight", "0"),
        ("--pids-max", "0"),
    ] {
        let line = fails(&mut cli(db, &["jobs", "add", flag, value, "--", "true"]), 2);
        assert!(line.contains(flag), "{flag} {value}: {line}");
    }
}
