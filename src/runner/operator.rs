//! The operator's actions, one call each: what `leasehold jobs retry|cancel|ls` and `status`
//! need beyond a single store call. A retry or a cancel also tears the lost attempt's
//! processes down at once; liveness and the lease settings are read the way a runner's
//! sweeper reads them, so the operator's view and the runner's agree.
//!
//! ```no_run
//! # fn main() -> leasehold::Result<()> {
//! use leasehold::{Store, operator};
//!
//! let store = Store::open("jobs.db")?;
//! let settings = operator::lease_settings(&store)?;
//! let retried = operator::retry_failed_stale(&store, None, Some("disk replaced"))?;
//! println!("retried {retried:?} under a recovery budget of {}", settings.max_recovery_attempts);
//! # Ok(())
//! # }
//! ```

use std::time::Duration;

use crate::error::Result;
use crate::job::{JobRecord, now_ms};
use crate::process::{self, AttemptIdentity};
use crate::store::{DEFAULT_MAX_RECOVERY_ATTEMPTS, RunnerRecord, Store};

use super::builder::{DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_KILL_GRACE, DEFAULT_LEASE_TTL};

/// How many lost attempts one operator's action tears down at most.
const TEARDOWN_BATCH: u64 = 1000;

/// The settings that describe a database's leases: those of the runner that started last,
/// or the defaults when none has run on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseSettings {
    /// How long a lease lasts unless renewed.
    pub lease_ttl: Duration,
    /// How often the runner renews its leases.
    pub heartbeat_interval: Duration,
    /// How often a lost job is run again before it fails as lost: a failed job whose
    /// `recovery_count` exceeds it is "failed stale".
    pub max_recovery_attempts: u32,
    /// Whether these are a runner's (true) or the defaults (false).
    pub from_runner: bool,
}

/// The lease settings of the runner that started last on `store`, or the defaults.
///
/// # Errors
///
/// A database error.
pub fn lease_settings(store: &Store) -> Result<LeaseSettings> {
    let ms = |v: i64| Duration::from_millis(u64::try_from(v).unwrap_or(0));
    Ok(match store.latest_runner()? {
        Some(r) => LeaseSettings {
            lease_ttl: ms(r.lease_ttl_ms),
            heartbeat_interval: ms(r.heartbeat_interval_ms),
            max_recovery_attempts: u32::try_from(r.max_recovery_attempts)
                .unwrap_or(DEFAULT_MAX_RECOVERY_ATTEMPTS),
            from_runner: true,
        },
        None => LeaseSettings {
            lease_ttl: DEFAULT_LEASE_TTL,
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            max_recovery_attempts: DEFAULT_MAX_RECOVERY_ATTEMPTS,
            from_runner: false,
        },
    })
}

/// An operator's retry of one job ([`Store::retry`]), then the teardown of its lost
/// attempt's processes at once rather than at some runner's next sweep. The teardown is best
/// effort: when it cannot be done now, it is logged, and a runner's sweep completes it (the
/// job is not claimed before).
///
/// # Errors
///
/// As [`Store::retry`].
pub fn retry(store: &Store, id: i64, reason: Option<&str>) -> Result<JobRecord> {
    let job = store.retry(id, reason, now_ms())?;
    tear_down_now(store, "retried");
    Ok(job)
}

/// An operator's retry of the failed jobs that exhausted the recovery budget of
/// [`lease_settings`]: `limit` of them, most recently failed first, or all; then the
/// teardown as [`retry`] does. Returns their ids.
///
/// # Errors
///
/// As [`Store::retry_failed_stale`].
pub fn retry_failed_stale(
    store: &Store,
    limit: Option<u64>,
    reason: Option<&str>,
) -> Result<Vec<i64>> {
    let budget = lease_settings(store)?.max_recovery_attempts;
    let ids = store.retry_failed_stale(limit, budget, reason, now_ms())?;
    tear_down_now(store, "retried");
    Ok(ids)
}

/// Cancels a job ([`Store::cancel`]); a running attempt's processes are torn down at once
/// (its runner would also kill them at its next renewal, but a dead runner never will).
///
/// # Errors
///
/// As [`Store::cancel`].
pub fn cancel(store: &Store, id: i64) -> Result<JobRecord> {
    let job = store.cancel(id, now_ms())?;
    tear_down_now(store, "cancelled");
    Ok(job)
}

/// The teardown after an operator's action; a failure is logged, not returned: the action is
/// done, and a runner's sweep finishes the teardown.
fn tear_down_now(store: &Store, action: &str) {
    if let Err(e) = tear_down_lost_attempts(store, TEARDOWN_BATCH, DEFAULT_KILL_GRACE) {
        log::warn!(
            "{action}, but the lost attempts' processes are not torn down yet (a runner's sweep \
             will): {e:#}"
        );
    }
}

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
