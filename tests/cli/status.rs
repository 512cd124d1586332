//! `status`: job counts, lease health, the last runner's settings, and live runners.

use crate::helper::{add, cli, fails, json, ok};
use crate::util::TestDb;
use crate::util::exposition::parse;

#[test]
fn status_reports_counts_leases_settings_and_runners() {
    let t = TestDb::new();
    let db = t.path.as_path();
    add(db, &[], &["true"]);
    // A one-shot `jobs add` leaves its commit in the WAL; the last reader to close folds it
    // into the main file. Fold it now, so that `status` finds the sizes it leaves behind.
    drop(t.store());
    let v = json(&mut cli(db, &["status", "--json"]));
    assert_eq!(v["schema_version"], leasehold::SCHEMA_VERSION);
    let file_bytes = std::fs::metadata(db).unwrap().len();
    let wal_bytes = std::fs::metadata(t.sibling("jobs.db-wal")).map_or(0, |m| m.len());
    assert_eq!(
        v["database"],
        serde_json::json!({
            "path": db.display().to_string(),
            "schema_version": leasehold::SCHEMA_VERSION,
            "bytes": file_bytes,
            "free_bytes": 0,
            "wal_bytes": wal_bytes,
        })
    );
    let human = ok(&mut cli(db, &["status"]));
    assert!(
        human.contains(&format!(
            "bytes={file_bytes} free_bytes=0 wal_bytes={wal_bytes}"
        )),
        "{human}"
    );
    assert_eq!(
        v["jobs"],
        serde_json::json!({"pending": 1, "running": 0, "succeeded": 0, "failed": 0, "cancelled": 0})
    );
    assert_eq!(
        v["job_leases"],
        serde_json::json!({
            "running": 0, "stale_running": 0, "running_without_lease": 0,
            "recovery_exhausted_failed": 0,
            "lease_ttl_seconds": leasehold::DEFAULT_LEASE_TTL.as_secs_f64(),
            "heartbeat_interval_seconds": leasehold::DEFAULT_HEARTBEAT_INTERVAL.as_secs_f64(),
            "max_recovery_attempts": leasehold::DEFAULT_MAX_RECOVERY_ATTEMPTS,
        })
    );
    assert_eq!(v["runners"], serde_json::json!([]));

    // The settings of the most recently started runner, read from the environment here.
    ok(cli(db, &["run", "--until-idle"])
        .env("LEASEHOLD_LEASE_TTL", "3")
        .env("LEASEHOLD_HEARTBEAT", "0.5")
        .env("LEASEHOLD_SWEEP", "1")
        .env("LEASEHOLD_KILL_GRACE", "0.5")
        .env("LEASEHOLD_MAX_RECOVERY", "2")
        .env("LEASEHOLD_WORKERS", "1"));
    let v = json(&mut cli(db, &["status", "--json"]));
    assert_eq!(v["jobs"]["succeeded"], 1);
    assert_eq!(v["job_leases"]["lease_ttl_seconds"], 3.0);
    assert_eq!(v["job_leases"]["heartbeat_interval_seconds"], 0.5);
    assert_eq!(v["job_leases"]["max_recovery_attempts"], 2);
    assert_eq!(
        v["runners"],
        serde_json::json!([]),
        "a stopped runner is not listed"
    );
    let human = ok(&mut cli(db, &["status"]));
    for word in [
        "succeeded=1",
        "stale_running=0",
        "running_without_lease=0",
        "recovery_exhausted_failed=0",
        "lease_ttl_seconds=3",
        "heartbeat_interval_seconds=0.5",
        "max_recovery_attempts=2",
    ] {
        assert!(human.contains(word), "no {word} in {human}");
    }
}

crate::on_both! {
    fn status_prometheus_prints_an_exposition_that_agrees_with_the_database(t) {
        let target = t.target();
        let db = target.as_path();
        let weird = "we\"ird\\q";
        add(db, &["--queue", weird], &["true"]);
        add(db, &["--queue", "mail"], &["sh", "-c", "exit 4"]);
        let printed = ok(&mut cli(db, &["run", "--until-idle", "--workers", "2"]));
        assert_eq!(printed, "", "run prints nothing on stdout");
        add(db, &["--queue", "mail", "--delay", "3600"], &["true"]);
        let text = ok(&mut cli(db, &["status", "--prometheus"]));
        let m = parse(&text);
        assert_eq!(m.types["leasehold_jobs"], "gauge");
        assert_eq!(m.types["leasehold_jobs_ended_total"], "counter");
        assert_eq!(m.types["leasehold_attempt_run_seconds"], "histogram");
        assert_eq!(
            m.value(
                "leasehold_jobs",
                &[("queue", weird), ("status", "succeeded")]
            ),
            1.0
        );
        assert_eq!(
            m.value(
                "leasehold_jobs_ended_total",
                &[("queue", weird), ("outcome", "succeeded")]
            ),
            1.0
        );
        assert_eq!(
            m.value(
                "leasehold_jobs_ended_total",
                &[("queue", "mail"), ("outcome", "failed")]
            ),
            1.0
        );
        assert_eq!(
            m.value(
                "leasehold_jobs",
                &[("queue", "mail"), ("status", "pending")]
            ),
            1.0
        );
        // The delayed job is not ready: no lag.
        assert_eq!(
            m.get("leasehold_queue_lag_seconds", &[("queue", "mail")]),
            Some(0.0)
        );
        let json = json(&mut cli(db, &["status", "--json"]));
        assert_eq!(
            m.value("leasehold_database_bytes", &[]),
            json["database"]["bytes"].as_f64().unwrap()
        );
        // The runner stopped: none alive, and a CLI scrape has no runner figures.
        assert_eq!(m.value("leasehold_runners_alive", &[]), 0.0);
        assert!(m.get("leasehold_runner_workers", &[]).is_none());
    }

    fn status_prometheus_refuses_what_status_refuses(t) {
        let target = t.target();
        let db = target.as_path();
        let line = fails(&mut cli(db, &["status", "--prometheus"]), 1);
        assert!(
            line.contains("does not exist") || line.contains("no such"),
            "{line}"
        );
        assert!(!db.exists(), "a read-only command never creates the file");
        add(db, &[], &["true"]);
        fails(&mut cli(db, &["status", "--prometheus", "--json"]), 2);
    }
}
