//! `leasehold hosts ...`: the hosts whose runners share this database (ls), and the operator's
//! declaration that one is gone for good (gone). Also how `status` prints runners by host.

use std::io::Write;
use std::path::Path;

use leasehold::operator::{self, ForcedTeardown, Host, HostGone, HostRunner, Liveness};
use leasehold::protocol::Reclaimed;
use leasehold::{Status, now_ms};
use serde_json::{Value, json};

use super::render::{self, print_json};
use super::{Usage, open_existing, open_read_only};

/// How many lost attempts waiting for a teardown `hosts ls`, `status` and the dashboard read
/// at most.
pub const LOST_READ: u64 = 1000;

pub fn ls(db: &Path, json: bool) -> anyhow::Result<()> {
    let store = open_read_only(db)?;
    let hosts = operator::hosts(&store, LOST_READ)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if json {
        let all: Vec<Value> = hosts.iter().map(|h| host_json(h, true)).collect();
        print_json(&mut out, &Value::Array(all))?;
    } else if hosts.is_empty() {
        writeln!(
            out,
            "no host: no runner is registered, and no job waits for one"
        )?;
    } else {
        let now = now_ms();
        for h in &hosts {
            print_host(&mut out, h, "", now)?;
            for l in &h.leases {
                let when = match l.lease_expires_at {
                    Some(at) if at > now => format!("expires in {}", secs(at - now)),
                    Some(at) => format!("expired {} ago", secs(now - at)),
                    None => "no lease metadata".to_string(),
                };
                writeln!(
                    out,
                    "  lease: job {} attempt {} runner {} {when}",
                    l.job_id, l.attempt, l.worker_id
                )?;
            }
            for l in &h.lost {
                writeln!(
                    out,
                    "  teardown: job {} attempt {} waits for a runner there",
                    l.job_id, l.attempt
                )?;
            }
        }
    }
    out.flush()?;
    Ok(())
}

pub fn gone(db: &Path, host: &str, yes: bool, force: bool, json: bool) -> anyhow::Result<()> {
    if !yes {
        return Err(Usage(format!(
            "hosts gone ends the leases of host {host:?}'s jobs and records their processes torn \
             down without seeing them: check `leasehold hosts ls`, then add --yes"
        ))
        .into());
    }
    let store = open_existing(db)?;
    // A refusal (`Error::HostGoneRefused`) names the host and changes nothing: an operation
    // refused (exit 1), not a malformed argument.
    let report = operator::host_gone(&store, host, force)?;
    let mut out = std::io::stdout().lock();
    if json {
        print_json(&mut out, &gone_json(&report))?;
    } else {
        print_gone(&mut out, &report)?;
    }
    Ok(())
}

/// `hosts gone --json`: one entry per job it acted on, then the runners.
fn gone_json(r: &HostGone) -> Value {
    let jobs: Vec<Value> = job_ids(r)
        .into_iter()
        .map(|id| {
            let reclaimed = r
                .reclaimed
                .iter()
                .chain(&r.others)
                .find(|x| x.lost.job_id == id);
            let torn = r.torn_down.iter().find(|t| t.lost.job_id == id);
            json!({
                "id": id,
                "attempt": reclaimed.map(|x| x.lost.attempt).or(torn.map(|t| t.lost.attempt)),
                "worker_id": reclaimed.and_then(|x| x.worker_id.clone())
                    .or(torn.and_then(|t| t.lost.worker_id.clone())),
                "lease_ended": reclaimed.is_some(),
                "status": reclaimed.map(|x| x.status.as_str()),
                "last_error": reclaimed.map(|x| x.message.as_str()),
                "teardown": torn.map(|t| t.detail.as_str()),
                "verified": torn.map(|t| t.verified),
            })
        })
        .collect();
    json!({
        "host": r.host,
        "jobs": jobs,
        "runners_stopped": r.stopped,
        "runners_left": r.left,
    })
}

/// The jobs `hosts gone` acted on, in id order.
fn job_ids(r: &HostGone) -> Vec<i64> {
    let mut ids: Vec<i64> = r
        .reclaimed
        .iter()
        .chain(&r.others)
        .map(|x| x.lost.job_id)
        .chain(r.torn_down.iter().map(|t| t.lost.job_id))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

fn print_gone(out: &mut impl Write, r: &HostGone) -> std::io::Result<()> {
    let unverified = r.torn_down.iter().filter(|t| !t.verified).count();
    writeln!(
        out,
        "host {}: {} lease{} ended, {} lost attempt{} recorded torn down ({} not verified), \
         {} runner{} recorded stopped",
        r.host,
        r.reclaimed.len(),
        plural(r.reclaimed.len()),
        r.torn_down.len(),
        plural(r.torn_down.len()),
        unverified,
        r.stopped.len(),
        plural(r.stopped.len()),
    )?;
    for x in &r.reclaimed {
        writeln!(out, "{}", reclaimed_line(x, "lease of runner"))?;
    }
    for x in &r.others {
        writeln!(
            out,
            "{} (it had no lease metadata: any runner's sweep reclaims it)",
            reclaimed_line(x, "running row of")
        )?;
    }
    for t in &r.torn_down {
        writeln!(out, "{}", teardown_line(t))?;
    }
    for w in &r.stopped {
        writeln!(out, "runner {w}: recorded stopped")?;
    }
    for w in &r.left {
        writeln!(
            out,
            "runner {w}: NOT recorded stopped: it renewed within its lease TTL, or took a job \
             since, so it may be alive (it kills the attempts whose leases ended at its next \
             renewal)"
        )?;
    }
    Ok(())
}

/// `job 3 attempt 1: lease of runner W ended; the job is pending again`.
fn reclaimed_line(x: &Reclaimed, what: &str) -> String {
    let went = match x.status {
        Status::Pending => "the job is pending again (within its recovery budget)".to_string(),
        // The verdict's reason is the last part of the message (on_lost=fail, the budget).
        s => format!(
            "the job is {s}: {}",
            x.message.rsplit("; ").next().unwrap_or(&x.message)
        ),
    };
    format!(
        "job {} attempt {}: {what} {} ended; {went}",
        x.lost.job_id,
        x.lost.attempt,
        x.worker_id.as_deref().unwrap_or("-")
    )
}

/// `job 3 attempt 1: recorded torn down, NOT verified: <the event's detail>`.
fn teardown_line(t: &ForcedTeardown) -> String {
    format!(
        "job {} attempt {}: recorded torn down, {}: {}",
        t.lost.job_id,
        t.lost.attempt,
        if t.verified {
            "verified"
        } else {
            "NOT verified"
        },
        t.detail
    )
}

/// A host's JSON: its runners, with their running jobs; with `detail`, also its leases and
/// the lost attempts that wait there (`hosts ls`), else their counts (`status`).
pub fn host_json(h: &Host, detail: bool) -> Value {
    let runners: Vec<Value> = h.runners.iter().map(runner_json).collect();
    let mut v = json!({
        "host": h.name,
        "this_host": h.this_host,
        "runners": runners,
        "running_jobs": h.leases.len(),
        "heartbeat_at": h.heartbeat_at(),
        "teardown_waits": h.lost.len(),
    });
    if detail {
        v["leases"] = h
            .leases
            .iter()
            .map(|l| {
                json!({
                    "job": l.job_id,
                    "attempt": l.attempt,
                    "worker_id": l.worker_id,
                    "lease_expires_at": l.lease_expires_at,
                })
            })
            .collect();
        v["lost"] = h
            .lost
            .iter()
            .map(|l| json!({"job": l.job_id, "attempt": l.attempt, "worker_id": l.worker_id}))
            .collect();
    }
    v
}

fn runner_json(r: &HostRunner) -> Value {
    let rec = &r.record;
    json!({
        "worker_id": rec.worker_id,
        "pid": rec.pid,
        "pid_ns": rec.pid_ns,
        "boot_id": rec.boot_id,
        "alive": r.liveness.may_be_alive(),
        "checked": !matches!(r.liveness, Liveness::Unchecked(_)),
        "liveness": r.liveness.to_string(),
        "running_jobs": r.running,
        "started_at": rec.started_at,
        "heartbeat_at": rec.heartbeat_at,
        "containment": rec.containment,
    })
}

/// A host's lines: a heading with its counts, then one line per runner, indented by
/// `indent`.
pub fn print_host(out: &mut impl Write, h: &Host, indent: &str, now: i64) -> std::io::Result<()> {
    let n = h.runners.len();
    let running = h.leases.len();
    let mut heading = format!(
        "{indent}host {}{}: {n} runner{}, {running} running job{}",
        h.name,
        if h.this_host { " (this host)" } else { "" },
        plural(n),
        plural(running),
    );
    if let Some(at) = h.heartbeat_at() {
        heading.push_str(&format!(
            ", last heartbeat {} ({} ago)",
            render::time(at),
            secs(now - at)
        ));
    }
    if !h.lost.is_empty() {
        heading.push_str(&format!(
            ", {} lost attempt{} waiting for a teardown there",
            h.lost.len(),
            plural(h.lost.len())
        ));
    }
    writeln!(out, "{heading}")?;
    for r in &h.runners {
        let rec = &r.record;
        let alive = match &r.liveness {
            Liveness::Alive => "yes".to_string(),
            Liveness::Dead(why) => format!("no ({why})"),
            Liveness::Unchecked(why) => format!("unknown (cannot be checked from here: {why})"),
            other => other.to_string(),
        };
        writeln!(
            out,
            "{indent}  {} pid={} pid_ns={} running={} heartbeat_at={} alive={alive}",
            rec.worker_id,
            rec.pid,
            rec.pid_ns.map_or("-".to_string(), |n| n.to_string()),
            r.running,
            render::time(rec.heartbeat_at),
        )?;
        if let Some(how) = &rec.containment {
            writeln!(out, "{indent}    attempts contained by {how}")?;
        }
    }
    Ok(())
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// Milliseconds as `1.5s`.
fn secs(ms: i64) -> String {
    format!("{:.1}s", ms as f64 / 1000.0)
}
