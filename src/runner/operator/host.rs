//! The operator's view of hosts: the runners of each, their leases and the lost attempts
//! that wait there ([`hosts`]), and the declaration that a host is gone for good
//! ([`host_gone`]).

use std::collections::HashMap;

use crate::error::{Error, Result};

use crate::process::{self, AttemptIdentity};
use crate::store::{LostAttempt, Namespace, ReclaimRequest, Reclaimed, RunnerRecord, Store};

use super::{
    DEFAULT_KILL_GRACE, HeldLease, Liveness, Reach, lease_settings, liveness_from, teardown_reach,
    unverified,
};

/// A host as this process sees it: its registered runners, the leases they hold and the lost
/// attempts that wait for a runner there ([`hosts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Host {
    /// Its name, as its runners recorded it.
    pub name: String,
    /// Whether it is the host this process runs on.
    pub this_host: bool,
    /// Its runners not recorded stopped, oldest first.
    pub runners: Vec<HostRunner>,
    /// The running jobs held by its runners (stopped ones too), by job id.
    pub leases: Vec<HeldLease>,
    /// The lost attempts whose processes only a runner there can see, waiting for their
    /// teardown (their jobs are not claimed until then), by job id.
    pub lost: Vec<LostAttempt>,
}

impl Host {
    /// The newest heartbeat of its runners (None: no runner is registered there).
    pub fn heartbeat_at(&self) -> Option<i64> {
        self.runners.iter().map(|r| r.record.heartbeat_at).max()
    }
}

/// One registered runner of a [`Host`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HostRunner {
    /// Its row.
    pub record: RunnerRecord,
    /// Alive, dead or not checkable, as judged from here.
    pub liveness: Liveness,
    /// How many running jobs its workers hold.
    pub running: u64,
}

/// Every host with a registered runner, a running job held by one of its runners, or a lost
/// attempt waiting for a runner there, by name; at most `lost_limit` lost attempts are read.
///
/// # Errors
///
/// A database error.
pub fn hosts(store: &Store, lost_limit: u64) -> Result<Vec<Host>> {
    let here = Namespace::here();
    let mut hosts: Vec<Host> = Vec::new();
    fn entry<'a>(hosts: &'a mut Vec<Host>, name: &str, here: &Namespace) -> &'a mut Host {
        match hosts.iter().position(|h| h.name == name) {
            Some(i) => &mut hosts[i],
            None => {
                hosts.push(Host {
                    name: name.to_string(),
                    this_host: name == here.host,
                    runners: Vec::new(),
                    leases: Vec::new(),
                    lost: Vec::new(),
                });
                hosts.last_mut().expect("a host was just pushed")
            }
        }
    }
    let leases = store.held_leases()?;
    let mut running: HashMap<&str, u64> = HashMap::new();
    for l in &leases {
        *running.entry(l.worker_id.as_str()).or_default() += 1;
    }
    for r in store.runners()? {
        let runner = HostRunner {
            liveness: liveness_from(&r, &here),
            running: running.get(r.worker_id.as_str()).copied().unwrap_or(0),
            record: r,
        };
        entry(&mut hosts, &runner.record.host.clone(), &here)
            .runners
            .push(runner);
    }
    for l in &leases {
        entry(&mut hosts, &l.host, &here).leases.push(l.clone());
    }
    for lost in store.pending_teardowns(lost_limit)? {
        let Some(ns) = &lost.namespace else { continue };
        if matches!(teardown_reach(Some(ns), &here), Reach::Elsewhere(_)) {
            let host = ns.host.clone();
            entry(&mut hosts, &host, &here).lost.push(lost);
        }
    }
    hosts.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(hosts)
}

/// What [`host_gone`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HostGone {
    /// The host.
    pub host: String,
    /// Its running jobs whose leases were ended, and where each went (pending within the
    /// recovery budget, else failed as lost).
    pub reclaimed: Vec<Reclaimed>,
    /// Running jobs of no host (no lease metadata) that the same reclaim took, as any
    /// runner's sweep would.
    pub others: Vec<Reclaimed>,
    /// The lost attempts recorded torn down, with what their `torn_down` events say.
    pub torn_down: Vec<ForcedTeardown>,
    /// Its runners recorded stopped now.
    pub stopped: Vec<String>,
    /// Its runners left registered (only with `force`): they renewed their leases within
    /// their lease TTL, or took a job since the reclaim, so they may be alive; `status` keeps
    /// listing them, and each kills its attempts whose leases were ended at its next renewal.
    pub left: Vec<String>,
}

/// A lost attempt's teardown recorded by [`host_gone`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ForcedTeardown {
    /// The attempt.
    pub lost: LostAttempt,
    /// The `torn_down` event's detail: what was done, and what could not be verified.
    pub detail: String,
    /// Whether its processes were seen gone (false for every attempt on another host's
    /// kernel: nothing there can be seen from here).
    pub verified: bool,
}

/// How many running jobs one reclaim of [`host_gone`] takes, and how many teardown markers
/// one read pages.
const HOST_GONE_PAGE: u32 = 500;

/// An operator's declaration that `host` is gone for good (its machine destroyed, its disk
/// wiped): what its runners would never do again is done now, without seeing its processes.
///
/// - The leases of the running jobs its runners hold end now, through the sweeper's reclaim
///   (the runner counts as dead, "its host was declared gone by the operator"): each job goes
///   back to pending within the recovery budget of [`lease_settings`], or fails as lost.
/// - Every lost attempt whose runner ran there (those just reclaimed, and those that waited
///   for a runner there) is recorded torn down, its event saying that its processes were not
///   verified gone, and why; an attempt whose processes this process can see (the same boot
///   and PID namespace) is torn down for real first.
/// - Its runners are recorded stopped, so that `status` and the dashboard no longer list them
///   (not one that still renews, with `force`: see [`HostGone::left`]).
///
/// Nothing guarantees that the host's processes are gone: only the operator knows. A runner
/// there that is alive after all kills its attempts at its next renewal, which no longer
/// matches; that is why a host whose runner renewed its leases within its lease TTL, or whose
/// jobs' leases have not expired, is refused unless `force`.
///
/// # Errors
///
/// [`Error::HostGoneRefused`], with nothing changed: the host this process runs on
/// (its runners are judged by their pids, and tear down their own attempts), a host with no
/// runner recorded on this database, or (without `force`) a host not silent for a lease TTL.
/// A database error otherwise; what was done before it stays done, and a second call
/// finishes the rest.
pub fn host_gone(store: &Store, host: &str, force: bool) -> Result<HostGone> {
    let refuse = |reason: String| Error::HostGoneRefused {
        host: host.to_string(),
        reason,
    };
    let here = Namespace::here();
    if host == here.host {
        return Err(refuse(
            "is the host this command runs on: its runners are proven dead by their pids here, \
             and their sweeps tear down its lost attempts"
                .to_string(),
        ));
    }
    let runners = store.host_runners(host)?;
    if runners.is_empty() {
        return Err(refuse(
            "has no runner recorded on this database (`leasehold hosts ls` lists the hosts)"
                .to_string(),
        ));
    }
    let by_worker: HashMap<&str, &RunnerRecord> =
        runners.iter().map(|r| (r.worker_id.as_str(), r)).collect();
    let leases: Vec<HeldLease> = store
        .held_leases()?
        .into_iter()
        .filter(|l| l.host == host)
        .collect();
    if !force {
        if let Some(why) = not_silent(&runners, &leases, store.db_now()?) {
            return Err(refuse(format!(
                "is not silent: {why}; it may be alive, and a runner cut off from the database \
                 kills its own attempts within a lease TTL: wait until then, or force it (--force)"
            )));
        }
    }
    let mut report = HostGone {
        host: host.to_string(),
        ..HostGone::default()
    };
    // The leases: the sweeper's reclaim, with the host's runners as the dead.
    let why = format!("its host {host} was declared gone by the operator (not verified)");
    let mut dead: Vec<(String, String)> = Vec::new();
    for l in &leases {
        if !dead.iter().any(|(w, _)| *w == l.worker_id) {
            dead.push((l.worker_id.clone(), why.clone()));
        }
    }
    if !dead.is_empty() {
        let settings = lease_settings(store)?;
        loop {
            let done = store.reclaim(
                &ReclaimRequest {
                    max_recovery_attempts: settings.max_recovery_attempts,
                    batch: HOST_GONE_PAGE,
                    exclude_worker: None,
                    held_tokens: None,
                    dead_workers: &dead,
                    expired: false,
                    keepers: None,
                    lease_ttl: settings.lease_ttl,
                },
                store.now(),
            )?;
            let n = done.reclaimed.len();
            for r in done.reclaimed {
                log::info!(
                    "job {} attempt {} reclaimed ({}): {}",
                    r.lost.job_id,
                    r.lost.attempt,
                    r.status,
                    r.message
                );
                let ours = r
                    .worker_id
                    .as_deref()
                    .is_some_and(|w| by_worker.contains_key(w));
                if ours {
                    report.reclaimed.push(r);
                } else {
                    report.others.push(r);
                }
            }
            if n < HOST_GONE_PAGE as usize {
                break;
            }
        }
    }
    // The lost attempts of its runners, just reclaimed or waiting before.
    let mut lost = Vec::new();
    let mut after = 0;
    loop {
        let page = store.pending_teardowns_after(after, u64::from(HOST_GONE_PAGE))?;
        let Some(last) = page.last() else { break };
        after = last.job_id;
        lost.extend(page.into_iter().filter(|l| {
            l.worker_id
                .as_deref()
                .is_some_and(|w| by_worker.contains_key(w))
        }));
    }
    let who = format!("forced by the operator, host {host} declared gone");
    for l in lost {
        // Its runner's row gives the namespace, even one registered before it was recorded.
        let ns = l
            .worker_id
            .as_deref()
            .and_then(|w| by_worker.get(w))
            .map(|r| r.namespace());
        let (detail, verified) = match teardown_reach(ns.as_ref(), &here) {
            Reach::Here => {
                let t = process::teardown(
                    &AttemptIdentity {
                        pgid: l.pgid,
                        start_time: l.start_time,
                        token: l.run_token.clone(),
                    },
                    DEFAULT_KILL_GRACE,
                );
                (t.describe(), t.unverified.is_empty())
            }
            Reach::Gone(why) => (why, true),
            Reach::Elsewhere(_) => (unverified(&who, &l, ns.as_ref(), &here), false),
        };
        if store.record_teardown(l.job_id, &l.run_token, &detail, store.now())? {
            log::info!("job {} attempt {} torn down: {detail}", l.job_id, l.attempt);
            report.torn_down.push(ForcedTeardown {
                lost: l,
                detail,
                verified,
            });
        }
    }
    // Its runners: recorded stopped, but not one that renews (forced): a runner recorded
    // stopped renews nothing as far as the others know, and their sweeps would reclaim at
    // once every job it takes from now on. Nor one that took a job since (the store's guard).
    let now = store.db_now()?;
    for r in runners.iter().filter(|r| r.stopped_at.is_none()) {
        if !renews(r, now) {
            store.mark_runner_dead(&r.worker_id, store.now())?;
        }
    }
    for r in store.host_runners(host)? {
        let was_running = by_worker
            .get(r.worker_id.as_str())
            .is_some_and(|before| before.stopped_at.is_none());
        if !was_running {
            continue;
        }
        if r.stopped_at.is_some() {
            report.stopped.push(r.worker_id);
        } else {
            report.left.push(r.worker_id);
        }
    }
    Ok(report)
}

/// Whether runner `r`, not stopped, renewed its leases within its lease TTL before `now`
/// (database time).
fn renews(r: &RunnerRecord, now: i64) -> bool {
    r.stopped_at.is_none() && r.heartbeat_at.saturating_add(r.lease_ttl_ms) > now
}

/// Why a host is not silent at `now` (database time): a runner there renewed within its lease
/// TTL, or a job's lease there has not expired; the longest wait. None when silent.
fn not_silent(runners: &[RunnerRecord], leases: &[HeldLease], now: i64) -> Option<String> {
    let secs = |ms: i64| format!("{:.1}s", ms as f64 / 1000.0);
    let mut worst: Option<(i64, String)> = None;
    for r in runners.iter().filter(|r| renews(r, now)) {
        let until = r.heartbeat_at.saturating_add(r.lease_ttl_ms);
        if worst.as_ref().is_none_or(|(w, _)| until > *w) {
            let why = format!(
                "runner {} renewed its leases {} ago (its lease TTL is {}; silent in {})",
                r.worker_id,
                secs(now - r.heartbeat_at),
                secs(r.lease_ttl_ms),
                secs(until - now)
            );
            worst = Some((until, why));
        }
    }
    for l in leases {
        let Some(until) = l.lease_expires_at else {
            continue;
        };
        if until > now && worst.as_ref().is_none_or(|(w, _)| until > *w) {
            let why = format!(
                "job {}'s lease (runner {}) expires in {}",
                l.job_id,
                l.worker_id,
                secs(until - now)
            );
            worst = Some((until, why));
        }
    }
    worst.map(|(_, why)| why)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runner(heartbeat_at: i64) -> RunnerRecord {
        RunnerRecord {
            worker_id: "elsewhere:1:abc".into(),
            pid: 1,
            proc_start_time: 1,
            boot_id: "b".into(),
            host: "elsewhere".into(),
            started_at: 1_000,
            heartbeat_at,
            stopped_at: None,
            lease_ttl_ms: 3_000,
            heartbeat_interval_ms: 1_000,
            max_recovery_attempts: 3,
            pid_ns: Some(1),
            containment: None,
            conditions_held: None,
            conditions_note: None,
        }
    }

    /// Issue 34: a refusal was `Error::Invalid { setting: "host" }`, as if an argument were
    /// malformed; it is an error of its own, naming the host, and changes nothing.
    #[test]
    fn a_host_gone_refusal_is_its_own_error_naming_the_host() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let store = Store::open(dir.path().join("jobs.db")).expect("the store opens");
        let here = Namespace::here().host;
        for (host, why) in [
            (here.as_str(), "is the host this command runs on"),
            ("nowhere", "has no runner recorded"),
        ] {
            match host_gone(&store, host, true) {
                Err(Error::HostGoneRefused {
                    host: named,
                    reason,
                }) => {
                    assert_eq!(named, host);
                    assert!(reason.starts_with(why), "{reason}");
                }
                other => panic!("{host}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_host_is_silent_once_its_runners_and_leases_are_a_lease_ttl_old() {
        let r = runner(10_000);
        let lease = HeldLease {
            job_id: 7,
            attempt: 1,
            worker_id: r.worker_id.clone(),
            host: r.host.clone(),
            lease_expires_at: Some(13_500),
        };
        // Renewed at 10 s with a 3 s TTL: not silent before 13 s, nor its lease before 13.5 s.
        let why = not_silent(std::slice::from_ref(&r), &[], 12_000).expect("not silent");
        assert!(why.contains("renewed its leases 2.0s ago"), "{why}");
        assert!(not_silent(std::slice::from_ref(&r), &[], 13_000).is_none());
        let why = not_silent(
            std::slice::from_ref(&r),
            std::slice::from_ref(&lease),
            12_000,
        )
        .expect("not silent");
        assert!(why.contains("job 7's lease"), "{why}");
        assert!(
            not_silent(
                std::slice::from_ref(&r),
                std::slice::from_ref(&lease),
                13_500
            )
            .is_none()
        );
        let stopped = RunnerRecord {
            stopped_at: Some(11_000),
            ..r
        };
        assert!(not_silent(&[stopped], &[], 12_000).is_none());
    }
}
