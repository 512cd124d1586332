//! The operator's actions, one call each: what `leasehold jobs retry|cancel|ls` and `status`
//! need beyond a single store call. A retry or a cancel also tears down at once the lost
//! attempt of the job it acted on (and of no other job); liveness and the lease settings are read the way a runner's
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
use crate::job::{JobRecord, Status};
use crate::process::{self, AttemptIdentity};
use crate::store::{DEFAULT_MAX_RECOVERY_ATTEMPTS, LostAttempt, Namespace, RunnerRecord, Store};

pub use crate::store::hosts::HeldLease;
pub use host::{ForcedTeardown, Host, HostGone, HostRunner, host_gone, hosts};

mod host;

use super::builder::{DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_KILL_GRACE, DEFAULT_LEASE_TTL};

/// How many lost attempts are torn down together, in one kill sequence (SIGTERM to all, one
/// grace, SIGKILL to what is left): each holds a pidfd per process until its grace is over,
/// so this bounds the descriptors a teardown holds at once.
const TEARDOWN_CHUNK: usize = 64;

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
/// attempt's processes at once rather than at some runner's next sweep: that job's only,
/// other jobs' lost attempts are left to the runners' sweeps. The teardown is best effort:
/// when it cannot be done now, it is logged, and a runner's sweep completes it (the job is not
/// claimed before).
///
/// # Errors
///
/// As [`Store::retry`].
pub fn retry(store: &Store, id: i64, reason: Option<&str>) -> Result<JobRecord> {
    let job = store.retry(id, reason)?;
    tear_down_now(store, &[id], "retried");
    Ok(job)
}

/// An operator's retry of the failed jobs that exhausted the recovery budget of
/// [`lease_settings`]: `limit` of them, most recently failed first, or all; then the
/// teardown as [`retry`] does, of the lost attempts of the jobs retried (and no others), all
/// together under one grace. Returns their ids.
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
    let ids = store.retry_failed_stale(limit, budget, reason)?;
    tear_down_now(store, &ids, "retried");
    Ok(ids)
}

/// Cancels a job ([`Store::cancel`]); a running attempt's processes are torn down at once
/// (its runner would also kill them at its next renewal, but a dead runner never will): that
/// job's only, as [`retry`] does.
///
/// # Errors
///
/// As [`Store::cancel`].
pub fn cancel(store: &Store, id: i64) -> Result<JobRecord> {
    let job = store.cancel(id)?;
    tear_down_now(store, &[id], "cancelled");
    Ok(job)
}

/// The teardown after an operator's action on the jobs `ids`: their lost attempts only (as
/// far as this process can see them). A failure is logged, not returned: the action is done,
/// and a runner's sweep finishes the teardown.
fn tear_down_now(store: &Store, ids: &[i64], action: &str) {
    let here = Namespace::here();
    let teardown = || -> Result<(u64, u64)> {
        let mut lost = Vec::new();
        for &id in ids {
            if let Some(one) = store.teardown_of(id)?.and_then(|l| reachable(l, &here)) {
                lost.push(one);
            }
        }
        tear_down(store, lost, DEFAULT_KILL_GRACE)
    };
    if let Err(e) = teardown() {
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
/// Only attempts whose processes this process can see (same boot and PID namespace) are
/// touched: one that ran in another PID namespace keeps its marker, and so its job waits,
/// until a runner in that namespace tears it down or an operator forces it
/// ([`force_teardown`], `jobs retry --force`).
///
/// The attempts are torn down together, up to 64 at a time: SIGTERM to the
/// processes of every one, one `kill_grace` for all of them, then SIGKILL to what is left;
/// attempts that ignore SIGTERM cost one grace together, not one each.
///
/// Runners do this on every sweep.
///
/// # Errors
///
/// A database error; the attempts not yet recorded are retried by the next call.
pub fn tear_down_lost_attempts(
    store: &Store,
    limit: u64,
    kill_grace: Duration,
) -> Result<(u64, u64)> {
    tear_down_lost_attempts_at(store, limit, kill_grace, true)
}

/// [`tear_down_lost_attempts`], trusting a keeper's lease fence only when `keeper_fences`: a
/// sweeper that distrusts lease expiry after a clock step (its own, or the database
/// server's) trusts no lease's end either.
pub(crate) fn tear_down_lost_attempts_at(
    store: &Store,
    limit: u64,
    kill_grace: Duration,
    keeper_fences: bool,
) -> Result<(u64, u64)> {
    let here = Namespace::here();
    let (mut torn, mut unverified, mut done, mut after) = (0, 0, 0, 0);
    // Markers this process cannot act on are skipped, so pages go on past them: they must
    // not take the places of those it can.
    while done < limit {
        let page = store.pending_teardowns_after(after, limit)?;
        let Some(last) = page.last() else { break };
        after = last.job_id;
        let left = usize::try_from(limit - done).unwrap_or(usize::MAX);
        let lost: Vec<_> = page
            .into_iter()
            .map(|mut l| {
                l.fenced_by_keeper &= keeper_fences;
                l
            })
            .filter_map(|l| reachable(l, &here))
            .take(left)
            .collect();
        done += lost.len() as u64;
        let (t, u) = tear_down(store, lost, kill_grace)?;
        torn += t;
        unverified += u;
    }
    Ok((torn, unverified))
}

/// A lost attempt this process can act on, with what to record for it when there is nothing
/// to signal (its processes ended with their boot); None when it ran where this process cannot
/// see, and keeps its marker.
fn reachable(lost: LostAttempt, here: &Namespace) -> Option<(LostAttempt, Option<String>)> {
    match teardown_reach(lost.namespace.as_ref(), here) {
        // The lease it held when marked ended, by the server's clock, a slack ago (the store
        // judges it: a cancel or a retry marks a live lease), and its keeper stops a lease's
        // attempt by then, frozen or cut-off runner or not: nothing is left to signal.
        Reach::Elsewhere(why) if lost.fenced_by_keeper => {
            let detail = format!(
                "stopped by its keeper at the end of its lease ({why}; not verified from here)"
            );
            Some((lost, Some(detail)))
        }
        Reach::Elsewhere(why) => {
            log::debug!("job {} attempt {}: {why}", lost.job_id, lost.attempt);
            None
        }
        Reach::Gone(why) => Some((lost, Some(why))),
        Reach::Here => Some((lost, None)),
    }
}

/// Tears down `lost` ([`reachable`]'s) [`TEARDOWN_CHUNK`] at a time, each chunk together
/// ([`process::teardown_many`]: SIGTERM to every attempt's processes, one `kill_grace` for all,
/// then SIGKILL to what is left), and records a `torn_down` event for each. Returns how many
/// were recorded, and how many processes were left alone because they could not be verified.
fn tear_down(
    store: &Store,
    mut lost: Vec<(LostAttempt, Option<String>)>,
    kill_grace: Duration,
) -> Result<(u64, u64)> {
    let (mut torn, mut unverified) = (0, 0);
    for chunk in lost.chunks_mut(TEARDOWN_CHUNK) {
        let ids: Vec<AttemptIdentity> = chunk
            .iter()
            .filter(|(_, detail)| detail.is_none())
            .map(|(l, _)| AttemptIdentity {
                pgid: l.pgid,
                start_time: l.start_time,
                token: l.run_token.clone(),
            })
            .collect();
        let mut teardowns = process::teardown_many(&ids, kill_grace).into_iter();
        for (l, detail) in chunk.iter_mut() {
            if detail.is_none() {
                // teardown_many returns one teardown per identity, in order.
                let t = teardowns.next().unwrap_or_default();
                unverified += t.unverified.len() as u64;
                *detail = Some(t.describe());
            }
            let detail = detail.as_deref().unwrap_or_default();
            if store.record_teardown(l.job_id, &l.run_token, detail, store.now())? {
                torn += 1;
                log::info!("job {} attempt {} torn down: {detail}", l.job_id, l.attempt);
            }
        }
    }
    Ok((torn, unverified))
}

/// Whether this process can act on a lost attempt's processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reach {
    /// Its pids mean here what they meant to its runner: tear it down.
    Here,
    /// Its processes ended with the boot they ran in: nothing to signal; the reason.
    Gone(String),
    /// It ran where this process cannot see: leave its marker; why, for the job's display.
    Elsewhere(String),
}

/// Whether a process in `here` can act on the processes of an attempt whose runner ran in
/// `attempt` (None: its runner is unknown or registered before schema version 9, and it is
/// treated as before, as this process's own).
///
/// Same boot and same PID namespace: here. Another boot of the same host: its processes
/// ended with that boot (a WAL database is shared by the processes of one kernel only, so a
/// runner of another boot is no longer on this file). Anything else (another namespace, another
/// host's boot, a namespace not known on either side) cannot be seen from here; a parent
/// namespace could see a child's processes, under other pids, but "the same namespace only" is
/// the rule that needs no translation.
pub(crate) fn teardown_reach(attempt: Option<&Namespace>, here: &Namespace) -> Reach {
    let Some(a) = attempt else {
        return Reach::Here;
    };
    let known_boots = !a.boot_id.is_empty() && !here.boot_id.is_empty();
    if known_boots && a.boot_id == here.boot_id && a.pid_ns.is_some() && a.pid_ns == here.pid_ns {
        return Reach::Here;
    }
    if known_boots && a.boot_id != here.boot_id && a.host == here.host {
        return Reach::Gone(format!(
            "its runner ran in boot {} and this host is now in boot {}: its processes ended \
             with that boot, nothing was signalled",
            a.boot_id, here.boot_id
        ));
    }
    Reach::Elsewhere(waits_for(a))
}

/// Why a lost attempt of a runner in `ns` waits: the line `jobs inspect`, `status` and the
/// dashboard show.
pub fn waits_for(ns: &Namespace) -> String {
    format!("teardown waits for a runner in {}", place(ns))
}

/// "PID namespace N on host H (boot B)".
fn place(ns: &Namespace) -> String {
    let pid_ns = ns.pid_ns.map_or("(unknown)".to_string(), |n| n.to_string());
    format!(
        "PID namespace {pid_ns} on host {} (boot {})",
        ns.host, ns.boot_id
    )
}

/// Why a running job has no runner following it while its keeper runs it on (or has run it
/// to its end), if so: what `jobs inspect`, `status` and the dashboard say of a job left
/// running at a runner's exit (`--on-exit leave`) or whose runner died, until the next runner
/// on the file adopts it or records its outcome. `None` for any other job.
///
/// # Errors
///
/// [`Error::Sqlite`](crate::Error::Sqlite) when the database cannot be read.
pub fn kept_without_runner(store: &Store, job: &JobRecord) -> Result<Option<String>> {
    Ok(kept_without_runners(store, std::slice::from_ref(job))?
        .pop()
        .map(|(_, why)| why))
}

/// [`kept_without_runner`] for each of `jobs`, reading the runners once: the ids and reasons
/// of those kept with no runner, in `jobs`' order.
///
/// # Errors
///
/// [`Error::Sqlite`](crate::Error::Sqlite) when the database cannot be read.
pub fn kept_without_runners(store: &Store, jobs: &[JobRecord]) -> Result<Vec<(i64, String)>> {
    let mut runners = None;
    let here = Namespace::here();
    let mut kept = Vec::new();
    for job in jobs {
        let (Status::Running, Some(_), Some(_), Some(_)) =
            (job.status, job.keeper_pid, &job.worker_id, &job.run_token)
        else {
            continue;
        };
        let runners = match &runners {
            Some(r) => r,
            None => runners.insert(store.runners()?),
        };
        if let Some(why) = kept_reason(runners, &here, job) {
            kept.push((job.id, why));
        }
    }
    Ok(kept)
}

/// Why `job`, running with a keeper, has no runner, given the live `runners`.
fn kept_reason(runners: &[RunnerRecord], here: &Namespace, job: &JobRecord) -> Option<String> {
    let (keeper, worker) = (job.keeper_pid?, job.worker_id.as_ref()?);
    let why = match runners.iter().find(|r| &r.worker_id == worker) {
        None => format!("its runner {worker} stopped"),
        Some(r) => format!(
            "its runner {worker} is dead ({})",
            runner_death_evidence(r, here)?
        ),
    };
    let keeper_alive = i32::try_from(keeper).is_ok_and(process::keeper_running);
    Some(if keeper_alive {
        format!(
            "kept, no runner: {why}; its keeper pid {keeper} runs it on, and the next runner \
             on this file adopts it"
        )
    } else {
        format!(
            "kept, no runner: {why}; its keeper pid {keeper} has ended, and the next runner \
             on this file records its outcome"
        )
    })
}

/// Why job `job`'s lost attempt is not torn down yet, when its runner's namespace is known:
/// the namespace it waits for, and whether a registered runner is there. None when the job
/// has no lost attempt to tear down, or its runner's namespace is not recorded, or it ran in
/// an earlier boot of this host (any runner tears those down at its next sweep).
///
/// # Errors
///
/// A database error.
pub fn teardown_wait(store: &Store, job: i64) -> Result<Option<String>> {
    let Some(ns) = store.teardown_of(job)?.and_then(|lost| lost.namespace) else {
        return Ok(None);
    };
    let here = Namespace::here();
    if ended_with_its_boot(&ns, &here) {
        return Ok(None);
    }
    let now = store.db_now()?;
    Ok(Some(wait_line(&ns, &store.runners()?, &here, now)))
}

/// Whether an attempt of a runner in `ns` ended with its boot, as seen from here: any runner
/// of this host records it at its next sweep, and it waits for no namespace.
fn ended_with_its_boot(ns: &Namespace, here: &Namespace) -> bool {
    matches!(teardown_reach(Some(ns), here), Reach::Gone(_))
}

/// The jobs whose lost attempts wait for a runner in a known namespace, by the line that says
/// why ([`teardown_wait`]'s), in job id order; at most `limit` jobs are read.
///
/// # Errors
///
/// A database error.
pub fn teardown_waits(store: &Store, limit: u64) -> Result<Vec<(String, Vec<i64>)>> {
    let runners = store.runners()?;
    let now = store.db_now()?;
    let here = Namespace::here();
    let mut waits: Vec<(String, Vec<i64>)> = Vec::new();
    for lost in store.pending_teardowns(limit)? {
        let Some(ns) = lost.namespace.filter(|ns| !ended_with_its_boot(ns, &here)) else {
            continue;
        };
        let line = wait_line(&ns, &runners, &here, now);
        match waits.iter_mut().find(|(l, _)| *l == line) {
            Some((_, ids)) => ids.push(lost.job_id),
            None => waits.push((line, vec![lost.job_id])),
        }
    }
    Ok(waits)
}

/// [`waits_for`], and whether one of `runners` that may be alive ([`runner_alive`]) is in
/// that namespace, and renews (at `now`, database time); for another host than `here`, the
/// operator's command for a host gone for good.
fn wait_line(ns: &Namespace, runners: &[RunnerRecord], here: &Namespace, now: i64) -> String {
    let there: Vec<&RunnerRecord> = runners
        .iter()
        .filter(|r| {
            runner_alive(r)
                && !r.boot_id.is_empty()
                && r.boot_id == ns.boot_id
                && r.pid_ns.is_some()
                && r.pid_ns == ns.pid_ns
        })
        .collect();
    let gone = if ns.host == here.host {
        String::new()
    } else {
        format!(
            "; for every job of a host gone for good, `leasehold hosts gone {} --yes`",
            ns.host
        )
    };
    if there.is_empty() {
        return format!(
            "{}: no runner is registered there (start one there, or force it with \
             `leasehold jobs retry --force`{gone})",
            waits_for(ns),
        );
    }
    let names = there
        .iter()
        .map(|r| r.worker_id.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    // A runner there that has not renewed for a lease TTL cannot be seen to be alive: it may
    // be frozen, cut off, or gone with its host.
    if there
        .iter()
        .all(|r| now.saturating_sub(r.heartbeat_at) > r.lease_ttl_ms)
    {
        let silent = there
            .iter()
            .map(|r| now - r.heartbeat_at)
            .min()
            .unwrap_or(0);
        return format!(
            "{}: runner {names} is registered there but silent for {:.1}s, longer than its \
             lease TTL (it tears it down if it comes back{gone})",
            waits_for(ns),
            silent as f64 / 1000.0
        );
    }
    format!(
        "{}: runner {names} is there and tears it down at its next sweep",
        waits_for(ns),
    )
}

/// An operator's forced teardown of job `id`'s lost attempt: records `torn_down` without
/// verifying that its processes are gone, and says what could not be verified. None when the
/// job has no lost attempt to tear down. Processes this process can see are torn down first,
/// as a runner would.
///
/// # Errors
///
/// A database error.
pub fn force_teardown(store: &Store, id: i64) -> Result<Option<String>> {
    let Some(lost) = store.teardown_of(id)? else {
        return Ok(None);
    };
    let here = Namespace::here();
    let detail = match teardown_reach(lost.namespace.as_ref(), &here) {
        Reach::Elsewhere(_) => unverified(
            "forced by the operator",
            &lost,
            lost.namespace.as_ref(),
            &here,
        ),
        Reach::Gone(why) => why,
        Reach::Here => {
            let identity = AttemptIdentity {
                pgid: lost.pgid,
                start_time: lost.start_time,
                token: lost.run_token.clone(),
            };
            process::teardown(&identity, DEFAULT_KILL_GRACE).describe()
        }
    };
    if store.record_teardown(lost.job_id, &lost.run_token, &detail, store.now())? {
        log::info!("job {id} attempt {} torn down: {detail}", lost.attempt);
        Ok(Some(detail))
    } else {
        Ok(None)
    }
}

/// The detail of a `torn_down` event recorded without seeing the processes of `lost`, whose
/// runner ran in `ns`: who forced it, and that it is not verified, and why.
fn unverified(who: &str, lost: &LostAttempt, ns: Option<&Namespace>, here: &Namespace) -> String {
    format!(
        "{who}: not verified that attempt {} is gone (it ran in {}; this command runs in {})",
        lost.attempt,
        ns.map_or("an unknown namespace".to_string(), place),
        place(here)
    )
}

/// Whether the runner `r` may still be alive, as far as this process can tell: a runner on
/// another host, or one whose process is still the one that registered, may be; a runner of
/// this host whose boot id differs is dead, and one in this boot and PID namespace whose pid
/// is gone or now belongs to another process. Stopped runners are not alive. [`liveness`]
/// says which, and why.
pub fn runner_alive(r: &RunnerRecord) -> bool {
    liveness(r).may_be_alive()
}

/// What this process can tell of a runner's life ([`liveness`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Liveness {
    /// Its process is the one that registered, checked here: the same host, boot and PID
    /// namespace.
    Alive,
    /// It stopped, or it is dead by evidence this process can see: which.
    Dead(String),
    /// It may be alive: its process cannot be checked from here (another host, another PID
    /// namespace, a namespace not recorded); why.
    Unchecked(String),
}

impl Liveness {
    /// Whether the runner may be alive ([`runner_alive`]): alive, or not checkable from here.
    pub fn may_be_alive(&self) -> bool {
        !matches!(self, Liveness::Dead(_))
    }
}

impl std::fmt::Display for Liveness {
    /// `alive`, `dead: <evidence>`, or `cannot be checked from here: <why>`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Liveness::Alive => f.write_str("alive"),
            Liveness::Dead(why) => write!(f, "dead: {why}"),
            Liveness::Unchecked(why) => write!(f, "cannot be checked from here: {why}"),
        }
    }
}

/// Whether the runner `r` is alive, dead, or cannot be checked from here, and why: the
/// judgement of [`runner_alive`], which a sweeper makes too (see `runner_death_evidence`).
pub fn liveness(r: &RunnerRecord) -> Liveness {
    liveness_from(r, &Namespace::here())
}

fn liveness_from(r: &RunnerRecord, here: &Namespace) -> Liveness {
    if r.stopped_at.is_some() {
        return Liveness::Dead("it stopped".to_string());
    }
    if let Some(why) = runner_death_evidence(r, here) {
        return Liveness::Dead(why);
    }
    // Not dead by evidence: either its process was found (same host, boot and namespace),
    // or nothing about it can be seen from here.
    let why = if r.host != here.host {
        "another host".to_string()
    } else if r.boot_id.is_empty() || here.boot_id.is_empty() {
        "a boot id is unknown".to_string()
    } else if r.pid_ns.is_none() || here.pid_ns.is_none() {
        "its PID namespace is not recorded".to_string()
    } else if r.pid_ns != here.pid_ns {
        format!(
            "another PID namespace ({}, this process is in {})",
            r.pid_ns.unwrap_or_default(),
            here.pid_ns.unwrap_or_default()
        )
    } else {
        return Liveness::Alive;
    };
    Liveness::Unchecked(why)
}

impl Namespace {
    /// Where this process's pids mean something.
    pub(crate) fn here() -> Namespace {
        Namespace::new(
            process::hostname(),
            process::boot_id().unwrap_or_default(),
            process::pid_namespace().ok(),
        )
    }
}

/// Why the runner `r` is provably dead, judged by a process in `here`; None when it may be
/// alive, or when nothing can be proven from here.
///
/// Evidence is what the judge can see. Another host: nothing. Another boot of this host: the
/// runner ended with it (a WAL database is shared by the processes of one kernel only;
/// containers share their host's boot id, so a different one is a different kernel). Its pid
/// (gone, or reused by another process) counts only in the same boot and the same PID
/// namespace: in a container or under `unshare --pid`, pid 1 is not this host's pid 1. A
/// runner registered before schema version 9 has no recorded namespace: only the expiry of
/// its leases then.
pub(crate) fn runner_death_evidence(r: &RunnerRecord, here: &Namespace) -> Option<String> {
    if r.host != here.host {
        return None;
    }
    let known_boots = !r.boot_id.is_empty() && !here.boot_id.is_empty();
    if known_boots && r.boot_id != here.boot_id {
        return Some(format!(
            "it ran in boot {} and this host is now in boot {}",
            r.boot_id, here.boot_id
        ));
    }
    if !known_boots || r.pid_ns.is_none() || r.pid_ns != here.pid_ns {
        return None;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn runner(host: &str, boot: &str, pid_ns: Option<u64>) -> RunnerRecord {
        RunnerRecord {
            worker_id: format!("{host}:1:abc"),
            pid: i64::from(std::process::id()),
            proc_start_time: process::proc_info(std::process::id() as i32)
                .map_or(0, |p| p.start_time),
            boot_id: boot.to_string(),
            host: host.to_string(),
            started_at: 1_000,
            heartbeat_at: 10_000,
            stopped_at: None,
            lease_ttl_ms: 3_000,
            heartbeat_interval_ms: 1_000,
            max_recovery_attempts: 3,
            pid_ns,
            containment: None,
            conditions_held: None,
            conditions_note: None,
        }
    }

    #[test]
    fn liveness_is_checked_only_in_this_boot_and_pid_namespace() {
        let here = Namespace::here();
        let me = runner(&here.host, &here.boot_id, here.pid_ns);
        assert_eq!(liveness_from(&me, &here), Liveness::Alive);
        let other = runner("elsewhere", &here.boot_id, here.pid_ns);
        assert_eq!(
            liveness_from(&other, &here),
            Liveness::Unchecked("another host".into())
        );
        assert_eq!(
            liveness_from(&other, &here).to_string(),
            "cannot be checked from here: another host"
        );
        assert!(liveness_from(&other, &here).may_be_alive());
        let contained = runner(&here.host, &here.boot_id, here.pid_ns.map(|n| n + 1));
        assert!(matches!(
            liveness_from(&contained, &here),
            Liveness::Unchecked(why) if why.starts_with("another PID namespace")
        ));
        let old = runner(&here.host, "an-earlier-boot", here.pid_ns);
        assert!(matches!(liveness_from(&old, &here), Liveness::Dead(_)));
        let stopped = RunnerRecord {
            stopped_at: Some(20_000),
            ..other
        };
        assert_eq!(
            liveness_from(&stopped, &here),
            Liveness::Dead("it stopped".into())
        );
        assert!(!runner_alive(&stopped));
    }
}
