//! `leasehold status`: the database's size, counts by status, the runbook's `job_leases`
//! counters, the runners by host; or, with `--prometheus`, the metrics' exposition.

use std::io::Write;
use std::path::Path;

use leasehold::{now_ms, operator};
use serde_json::{Value, json};

use super::hosts;
use super::open_read_only;
use super::render::print_json;

/// `status --prometheus`: the metrics in the Prometheus text format, read without a write.
pub fn prometheus(db: &Path) -> anyhow::Result<()> {
    let store = open_read_only(db)?;
    let text = store.metrics()?.to_prometheus();
    std::io::stdout().lock().write_all(text.as_bytes())?;
    Ok(())
}

pub fn status(db: &Path, json: bool) -> anyhow::Result<()> {
    let store = open_read_only(db)?;
    let version = store.schema_version()?;
    let size = store.size()?;
    let counts = store.counts()?;
    // The settings are those of the most recently started runner, or the defaults.
    let settings = operator::lease_settings(&store)?;
    let lease_ttl = settings.lease_ttl.as_secs_f64();
    let heartbeat = settings.heartbeat_interval.as_secs_f64();
    let max_recovery = settings.max_recovery_attempts;
    let leases = store.lease_counts(max_recovery, now_ms())?;
    let runners: Vec<(leasehold::RunnerRecord, bool)> = store
        .runners()?
        .into_iter()
        .map(|r| {
            let alive = operator::runner_alive(&r);
            (r, alive)
        })
        .collect();
    let waits = operator::teardown_waits(&store, TEARDOWN_WAITS_SHOWN)?;
    let hosts = operator::hosts(&store, hosts::LOST_READ)?;
    // Running jobs left to their keepers by a runner that stopped or died.
    let running = store.list(&leasehold::ListFilter {
        status: Some(leasehold::Status::Running),
        limit: Some(TEARDOWN_WAITS_SHOWN),
        ..Default::default()
    })?;
    let kept = operator::kept_without_runners(&store, &running)?;
    let waiting: Vec<(leasehold::Condition, u64)> = store
        .jobs_waiting_for_conditions()?
        .into_iter()
        .filter(|&(_, n)| n > 0)
        .collect();
    let mut out = std::io::stdout().lock();
    if json {
        let runners: Vec<Value> = runners
            .iter()
            .map(|(r, alive)| {
                json!({
                    "worker_id": r.worker_id,
                    "pid": r.pid,
                    "host": r.host,
                    "pid_ns": r.pid_ns,
                    "alive": alive,
                    "started_at": r.started_at,
                    "heartbeat_at": r.heartbeat_at,
                    "containment": r.containment,
                    "conditions_held": r.conditions_held.as_ref().map(|held| {
                        held.iter().map(|c| c.as_str()).collect::<Vec<_>>()
                    }),
                    "conditions_assumed": r.conditions_note,
                })
            })
            .collect();
        let value = json!({
            "schema_version": version,
            "database": {
                "path": size.path.display().to_string(),
                "schema_version": size.schema_version,
                "bytes": size.bytes,
                "free_bytes": size.free_bytes,
                "wal_bytes": size.wal_bytes,
            },
            "jobs": {
                "pending": counts.pending,
                "running": counts.running,
                "succeeded": counts.succeeded,
                "failed": counts.failed,
                "cancelled": counts.cancelled,
            },
            "job_leases": {
                "running": leases.running,
                "stale_running": leases.stale_running,
                "running_without_lease": leases.running_without_lease,
                "recovery_exhausted_failed": leases.recovery_exhausted_failed,
                "lease_ttl_seconds": lease_ttl,
                "heartbeat_interval_seconds": heartbeat,
                "max_recovery_attempts": max_recovery,
            },
            "runners": runners,
            "hosts": hosts
                .iter()
                .map(|h| hosts::host_json(h, false))
                .collect::<Vec<Value>>(),
            "teardown_waits": waits
                .iter()
                .map(|(why, ids)| json!({"why": why, "jobs": ids}))
                .collect::<Vec<Value>>(),
            "kept": kept
                .iter()
                .map(|(id, why)| json!({"job": id, "why": why}))
                .collect::<Vec<Value>>(),
            "waiting_for_conditions": waiting
                .iter()
                .map(|(c, n)| (c.as_str().to_owned(), json!(n)))
                .collect::<serde_json::Map<String, Value>>(),
        });
        print_json(&mut out, &value)?;
        return Ok(());
    }
    writeln!(
        out,
        "database: {} (schema version {version})",
        leasehold::redacted_db(db)
    )?;
    writeln!(
        out,
        "  bytes={} free_bytes={} wal_bytes={}",
        size.bytes, size.free_bytes, size.wal_bytes
    )?;
    writeln!(
        out,
        "jobs: pending={} running={} succeeded={} failed={} cancelled={}",
        counts.pending, counts.running, counts.succeeded, counts.failed, counts.cancelled
    )?;
    writeln!(out, "job_leases:")?;
    for (name, value) in [
        ("running", leases.running.to_string()),
        ("stale_running", leases.stale_running.to_string()),
        (
            "running_without_lease",
            leases.running_without_lease.to_string(),
        ),
        (
            "recovery_exhausted_failed",
            leases.recovery_exhausted_failed.to_string(),
        ),
        ("lease_ttl_seconds", lease_ttl.to_string()),
        ("heartbeat_interval_seconds", heartbeat.to_string()),
        ("max_recovery_attempts", max_recovery.to_string()),
    ] {
        writeln!(out, "  {name}={value}")?;
    }
    if hosts.is_empty() {
        writeln!(out, "runners: none")?;
    } else {
        writeln!(out, "runners by host:")?;
        let now = now_ms();
        for h in &hosts {
            hosts::print_host(&mut out, h, "  ", now)?;
        }
    }
    for (r, _) in &runners {
        if let Some(held) = &r.conditions_held {
            writeln!(
                out,
                "conditions: runner {} sees {} holding{}",
                r.worker_id,
                super::render::condition_names(held),
                r.conditions_note
                    .as_ref()
                    .map_or(String::new(), |note| format!("; {note}"))
            )?;
        }
    }
    for (c, n) in &waiting {
        writeln!(
            out,
            "waiting: {n} job{} for {c} (no running runner sees it hold)",
            if *n == 1 { "" } else { "s" }
        )?;
    }
    for (id, why) in &kept {
        writeln!(out, "running: job {id} {why}")?;
    }
    for (why, ids) in &waits {
        let ids: Vec<String> = ids.iter().map(i64::to_string).collect();
        writeln!(
            out,
            "teardown: job{} {} {why}",
            if ids.len() == 1 { "" } else { "s" },
            ids.join(" ")
        )?;
    }
    Ok(())
}

/// How many jobs with a lost attempt still to tear down `status` reads at most.
const TEARDOWN_WAITS_SHOWN: u64 = 1000;
