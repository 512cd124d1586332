//! The operator's actions, one call each: what `leasehold jobs retry|cancel` and `status`
//! need beyond the store (tearing down lost attempts, telling live runners from dead ones,
//! the settings that describe a database's leases). The sweeper shares the liveness and
//! teardown rules with them.

use std::time::Duration;

use crate::error::Result;
use crate::process::{self, AttemptIdentity};
use crate::store::{RunnerRecord, Store};

/// Tears down the processes of up to `limit` lost attempts still marked in the database
/// (reclaimed, cancelled while running, or retried by an operator), and records a
/// `torn_down` event for each, which lets its job be claimed again. A group is signalled only
/// when its identity is verified (pgid and start time); processes carrying the attempt's run
/// token are killed wherever they are. Returns how many attempts were torn down, and how
/// many processes were left alone because they could not be verified.
///
/// Runners do this on every sweep; an operator's tool may do it at once after a retry.
///
/// # Errors
///
/// A database error; the attempts not yet recorded are retried by the next call.
pub fn tear_down_lost_attempts(
    store: &Store,
    limit: u64,
    kill_grace: Duration,
) -> Result<(u64, u64)> {
    let (mut torn, mut unverified) = (0, 0);
    for lost in store.pending_teardowns(limit)? {
        let id = AttemptIdentity {
            pgid: lost.pgid,
            start_time: lost.start_time,
            token: lost.run_token.clone(),
        };
        let teardown = process::teardown(&id, kill_grace);
        unverified += teardown.unverified.len() as u64;
        let detail = teardown.describe();
        if store.record_teardown(lost.job_id, &lost.run_token, &detail, crate::job::now_ms())? {
            torn += 1;
            log::info!(
                "job {} attempt {} torn down: {detail}",
                lost.job_id,
                lost.attempt
            );
        }
    }
    Ok((torn, unverified))
}

/// Whether the runner `r` may still be alive, as far as this host can tell: a runner on
/// another host, or one whose process is still the one that registered, may be; a runner of
/// this host whose boot id differs, whose pid is gone, or whose pid now belongs to another
/// process is dead. Stopped runners are not alive.
pub fn runner_alive(r: &RunnerRecord) -> bool {
    r.stopped_at.is_none()
        && runner_death_evidence(
            r,
            &crate::process::hostname(),
            &process::boot_id().unwrap_or_default(),
        )
        .is_none()
}

/// Why the runner `r` is provably dead, seen from this host in boot `boot_id`; None when it
/// may be alive (or runs on another host, where nothing can be proven from here).
pub(crate) fn runner_death_evidence(r: &RunnerRecord, host: &str, boot_id: &str) -> Option<String> {
    if r.host != host {
        return None;
    }
    if !boot_id.is_empty() && r.boot_id != boot_id {
        return Some(format!(
            "it ran in boot {} and this host is now in boot {boot_id}",
            r.boot_id
        ));
    }
    let pid = i32::try_from(r.pid).ok()?;
    // One read of /proc/PID/stat gives both the state and the start time.
    match process::proc_info(pid) {
        None => Some(format!("its process {pid} is gone")),
        Some(p) if p.is_dead() => Some(format!("its process {pid} has exited")),
        Some(p) if p.start_time != r.proc_start_time => Some(format!(
            "its pid {pid} now belongs to another process (start time {}, not {})",
            p.start_time, r.proc_start_time
        )),
        Some(_) => None,
    }
}
