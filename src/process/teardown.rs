//! Tearing down a lost attempt: its processes, found from what was recorded
//! about it, possibly by another process than the one that spawned it.
//!
//! A pid is trusted only with its start time or the run token: the recorded
//! group is signalled only once its identity is verified, and a process
//! carrying the attempt's token is the attempt's whatever its group.

use std::collections::BTreeMap;
use std::time::Duration;

use nix::sys::signal::Signal;

use super::cgroup;
use super::kill::{Targets, kill_all};
use super::pidfd::Held;
use super::proc::{ProcInfo, group_members, proc_info, processes_with_token};

/// What was recorded about an attempt, used to recognise its processes after
/// the runner that spawned it is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AttemptIdentity {
    /// The attempt's process group (== the main process's pid), if it was
    /// recorded before the runner died.
    pub pgid: Option<i32>,
    /// The main process's start time in clock ticks since boot, if recorded.
    pub start_time: Option<u64>,
    /// The run token every process of the attempt carries in its environment.
    pub token: String,
}

/// What [`teardown`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Teardown {
    /// Pids that were signalled, deduplicated and sorted.
    pub killed: Vec<i32>,
    /// Pids of a group whose identity could not be verified; never signalled.
    pub unverified: Vec<i32>,
    /// Why `unverified` could not be verified, when it is not empty.
    pub unverified_reason: Option<&'static str>,
    /// Signalled pids still alive after SIGKILL and a short wait (expected to
    /// be empty; a process in uninterruptible sleep can linger).
    pub survivors: Vec<i32>,
}

/// Formats pids as `pid 5` or `pids 5, 6`.
fn pid_list(pids: &[i32]) -> String {
    let joined = pids
        .iter()
        .map(i32::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if pids.len() == 1 {
        format!("pid {joined}")
    } else {
        format!("pids {joined}")
    }
}

impl Teardown {
    /// A one-line human description for an event log, e.g.
    /// `killed 2 processes (pids 123, 124); not signalled: pid 99 (start time
    /// does not match the attempt)`.
    pub(crate) fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.killed.is_empty() {
            parts.push("no process of the attempt was found alive".to_owned());
        } else {
            let n = self.killed.len();
            let noun = if n == 1 { "process" } else { "processes" };
            parts.push(format!("killed {n} {noun} ({})", pid_list(&self.killed)));
        }
        if !self.unverified.is_empty() {
            let reason = self.unverified_reason.unwrap_or("identity not verified");
            parts.push(format!(
                "not signalled: {} ({reason})",
                pid_list(&self.unverified)
            ));
        }
        if !self.survivors.is_empty() {
            parts.push(format!(
                "still alive after SIGKILL: {}",
                pid_list(&self.survivors)
            ));
        }
        parts.join("; ")
    }
}

/// Why a recorded group could not be trusted.
const LEADER_MISMATCH: &str = "start time does not match the attempt";
/// Why a recorded group without a leader could not be trusted.
const MEMBERS_TOO_OLD: &str = "all members started before the attempt";
/// Why a recorded group without a start time could not be trusted.
const NO_START_TIME: &str = "no start time was recorded for the attempt";

/// Decides whether process group `pgid` is the attempt's. Returns `Ok(())`
/// when it is (or when there is nothing to decide: the group is empty), or
/// the pids that must not be touched and why.
fn verify_group(pgid: i32, start: Option<u64>) -> Result<(), (Vec<i32>, &'static str)> {
    let members = group_members(pgid);
    let member_pids = || members.iter().map(|p| p.pid).collect::<Vec<_>>();
    let Some(start) = start else {
        return if members.is_empty() {
            Ok(())
        } else {
            Err((member_pids(), NO_START_TIME))
        };
    };
    match proc_info(pgid) {
        // The leader still exists: pid + start time identify it exactly.
        Some(leader) if leader.start_time == start => Ok(()),
        Some(leader) => {
            // The pid was recycled. The group members (if any) belong to the
            // newcomer; report the leader even if it is in another group.
            let mut pids = member_pids();
            if !leader.is_dead() && !pids.contains(&leader.pid) {
                pids.push(leader.pid);
            }
            pids.sort_unstable();
            if pids.is_empty() {
                Ok(())
            } else {
                Err((pids, LEADER_MISMATCH))
            }
        }
        // The leader has exited. A pgid cannot be reused while its group has
        // members, so a member that started no earlier than the attempt is
        // one of the attempt's descendants.
        None if members.is_empty() || members.iter().any(|m| m.start_time >= start) => Ok(()),
        None => Err((member_pids(), MEMBERS_TOO_OLD)),
    }
}

/// A lost attempt's processes, as the targets of the kill sequence. Every one is held by a
/// pidfd opened and verified (start time) before its first signal, and signalled only
/// through it: never a bare pid or a group id, which may have been recycled by the time the
/// grace is over.
struct Lost<'a> {
    /// What was recorded about the attempt.
    id: &'a AttemptIdentity,
    /// The recorded process group, once verified; an unverified group is
    /// never signalled.
    group: Option<i32>,
    /// The start time the group was verified with: the recorded one, or the
    /// token-carrying leader's.
    group_start: Option<u64>,
    /// Every process signalled, by pid.
    held: BTreeMap<i32, Held>,
    /// The attempt's cgroups (the cgroup mode): every process in them is the attempt's.
    cgroups: Vec<std::path::PathBuf>,
}

impl Lost<'_> {
    /// The processes carrying the attempt's token.
    fn carriers(&self) -> Vec<ProcInfo> {
        if self.id.token.is_empty() {
            // An empty token would match every process with an empty
            // LEASEHOLD_RUN_TOKEN; never treat that as proof.
            return Vec::new();
        }
        processes_with_token(&self.id.token)
    }

    /// The attempt's processes: `carriers`, the verified group's live members and its
    /// verified leader if it moved itself out of its group.
    fn found(&self, carriers: Vec<ProcInfo>) -> Vec<ProcInfo> {
        let mut found = carriers;
        if let Some(g) = self.group {
            // Verified again: a group whose leader was replaced since is not the attempt's.
            if verify_group(g, self.group_start).is_ok() {
                found.extend(group_members(g));
            }
            if let Some(leader) = proc_info(g)
                && Some(leader.start_time) == self.group_start
                && leader.pgid != g
                && !leader.is_dead()
            {
                found.push(leader);
            }
        }
        for cg in &self.cgroups {
            found.extend(cgroup::members(cg).into_iter().filter_map(proc_info));
        }
        found
    }

    /// Holds every process of `found` not held yet, through a pidfd verified against the
    /// start time it was found with.
    fn hold(&mut self, found: Vec<ProcInfo>) {
        for p in found {
            if p.is_dead() || p.pid <= 1 || self.held.contains_key(&p.pid) {
                continue;
            }
            if let Some(h) = Held::open(&p) {
                self.held.insert(p.pid, h);
            }
        }
    }
}

impl Targets for Lost<'_> {
    fn signal(&mut self, sig: Signal) {
        if sig == Signal::SIGKILL {
            // Members forked and carriers started during the grace are ours too.
            let found = self.found(self.carriers());
            self.hold(found);
        }
        for h in self.held.values() {
            if let Err(e) = h.signal(sig) {
                log::warn!("teardown: {sig} to pid {}: {e}", h.pid);
            }
        }
        if sig == Signal::SIGKILL {
            for cg in &self.cgroups {
                if let Err(e) = cgroup::kill(cg) {
                    log::warn!("teardown: SIGKILL to cgroup {}: {e}", cg.display());
                }
            }
        }
    }

    fn gone(&mut self) -> bool {
        self.held.values().all(Held::exited) && !self.cgroups.iter().any(|c| cgroup::populated(c))
    }

    fn pause(&mut self, step: Duration) {
        std::thread::sleep(step);
    }
}

/// Kills whatever is left of a LOST attempt: a process group left behind by a
/// runner that crashed or froze. The caller need not be the process that
/// spawned the attempt. As [`teardown_many`] of this one attempt.
pub(crate) fn teardown(id: &AttemptIdentity, grace: Duration) -> Teardown {
    teardown_many(std::slice::from_ref(id), grace)
        .pop()
        .unwrap_or_default()
}

/// Kills whatever is left of several LOST attempts at once, and says what it did to each,
/// in the order of `ids`.
///
/// For each attempt, the recorded group is signalled only if its identity is verified (see
/// `verify_group`); every process carrying the attempt's token is signalled regardless,
/// since the token itself proves identity. With no recorded group, the group led by a token
/// carrier (the attempt's main process) is the attempt's, and is signalled as a group. Every
/// target is held by a verified pidfd before the first signal.
///
/// Then ONE kill sequence ([`kill_all`]) for all of them together: SIGTERM to every target
/// of every attempt, one `grace` shared by all, then SIGKILL to whatever of any attempt is
/// still alive. Attempts whose processes ignore SIGTERM cost one grace together, not one
/// each. Each attempt's targets stay open as pidfds until the sequence ends: callers bound
/// how many attempts they pass at once.
pub(crate) fn teardown_many(ids: &[AttemptIdentity], grace: Duration) -> Vec<Teardown> {
    let mut prepared: Vec<(Lost<'_>, Teardown)> = ids.iter().map(prepare).collect();
    let mut batch = Batch(
        prepared
            .iter_mut()
            .map(|(lost, _)| lost)
            .filter(|lost| !lost.held.is_empty() || !lost.cgroups.is_empty())
            .collect(),
    );
    if !batch.0.is_empty() {
        kill_all(&mut batch, grace);
    }
    for (lost, _) in &prepared {
        for cg in &lost.cgroups {
            if let Err(e) = cgroup::remove(cg) {
                log::debug!("teardown: removing cgroup {}: {e}", cg.display());
            }
        }
    }
    prepared
        .into_iter()
        .map(|(lost, mut result)| {
            result.survivors = lost
                .held
                .values()
                .filter(|h| !h.exited())
                .map(|h| h.pid)
                .collect();
            result.killed = lost.held.into_keys().collect();
            result
        })
        .collect()
}

/// One attempt's processes, found, verified and held, ready for the kill sequence; and
/// what could not be verified.
fn prepare(id: &AttemptIdentity) -> (Lost<'_>, Teardown) {
    let mut result = Teardown::default();
    let mut lost = Lost {
        id,
        group: None,
        group_start: None,
        held: BTreeMap::new(),
        cgroups: Vec::new(),
    };

    let first_carriers = lost.carriers();
    // With no group recorded (the runner died before it recorded the attempt's start), the
    // attempt's main process names it, found by its token: the spawn made it its group's
    // leader. Its group then takes the group's signal, and with it the children that left
    // the token out of their environment (or were in the middle of an exec).
    let recorded = id.pgid.filter(|&p| p > 1).map(|p| (p, id.start_time));
    let from_token = || {
        first_carriers
            .iter()
            .filter(|c| c.pgid == c.pid && c.pid > 1)
            .min_by_key(|c| c.start_time)
            .map(|c| (c.pid, Some(c.start_time)))
    };
    lost.group = match recorded.or_else(from_token) {
        None => None,
        Some((p, start)) => match verify_group(p, start) {
            Ok(()) => {
                lost.group_start = start;
                Some(p)
            }
            Err((pids, reason)) => {
                // Token carriers are proven ours even inside an unverified
                // group; only the others are left alone.
                result.unverified = pids
                    .into_iter()
                    .filter(|pid| !first_carriers.iter().any(|c| c.pid == *pid))
                    .collect();
                if !result.unverified.is_empty() {
                    result.unverified_reason = Some(reason);
                }
                None
            }
        },
    };

    let found = lost.found(first_carriers);
    // In the cgroup mode the attempt's cgroup holds all that is left of it, found by its
    // token's name beside this runner's keepers, or from any process already found.
    if !id.token.is_empty() {
        let pids: Vec<i32> = found.iter().map(|p| p.pid).collect();
        lost.cgroups = cgroup::of_attempt(&id.token, &pids);
    }
    let more: Vec<ProcInfo> = lost
        .cgroups
        .iter()
        .flat_map(|cg| cgroup::members(cg))
        .filter_map(proc_info)
        .collect();
    lost.hold(found);
    lost.hold(more);
    (lost, result)
}

/// Several lost attempts as the targets of one kill sequence: each signal goes to every
/// attempt (each through its own verified pidfds) before the sequence waits.
struct Batch<'a, 'b>(Vec<&'b mut Lost<'a>>);

impl Targets for Batch<'_, '_> {
    fn signal(&mut self, sig: Signal) {
        for lost in &mut self.0 {
            lost.signal(sig);
        }
    }

    fn gone(&mut self) -> bool {
        self.0.iter_mut().all(|lost| lost.gone())
    }

    fn pause(&mut self, step: Duration) {
        std::thread::sleep(step);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    use crate::process::proc::tests::{spawn_group, token, wait_until};
    use crate::process::proc::{group_has_live_members, is_alive, proc_info, start_time};

    #[test]
    fn teardown_kills_a_verified_group() {
        let tok = token("verified");
        let mut g = spawn_group("sleep 300 & sleep 300", &tok);
        let pgid = g.child.id() as i32;
        let st = start_time(pgid).expect("leader start time");
        assert!(wait_until(Duration::from_secs(3), || group_members(pgid)
            .len()
            == 3));
        let id = AttemptIdentity {
            pgid: Some(pgid),
            start_time: Some(st),
            token: "some-other-token".to_owned(),
        };
        let t = teardown(&id, Duration::from_millis(300));
        assert_eq!(t.killed.len(), 3, "{t:?}");
        assert!(t.killed.contains(&pgid));
        assert!(t.unverified.is_empty() && t.survivors.is_empty(), "{t:?}");
        assert!(!group_has_live_members(pgid));
        assert!(
            t.describe().starts_with("killed 3 processes (pids "),
            "{}",
            t.describe()
        );
        let status = g.child.wait().expect("reap");
        assert!(!status.success());
    }

    #[test]
    fn teardown_kills_a_group_whose_leader_exited_when_members_are_younger() {
        let tok = token("leaderless");
        // The background sleep has its own stdio so the leader can exit.
        let mut g = spawn_group("sleep 300 & exit 0", &tok);
        let pgid = g.child.id() as i32;
        let st = start_time(pgid).expect("leader start time");
        g.child.wait().expect("leader exits");
        assert!(wait_until(Duration::from_secs(3), || group_members(pgid)
            .len()
            == 1));
        let id = AttemptIdentity {
            pgid: Some(pgid),
            start_time: Some(st),
            token: String::new(),
        };
        let t = teardown(&id, Duration::from_millis(300));
        assert_eq!(t.killed.len(), 1, "{t:?}");
        assert!(!group_has_live_members(pgid));
    }

    #[test]
    fn teardown_escalates_to_sigkill_after_grace() {
        let tok = token("stubborn");
        let g = spawn_group("trap '' TERM; sleep 300", &tok);
        let pgid = g.child.id() as i32;
        let st = start_time(pgid).expect("leader start time");
        assert!(wait_until(Duration::from_secs(3), || group_members(pgid)
            .len()
            == 2));
        let begun = Instant::now();
        let id = AttemptIdentity {
            pgid: Some(pgid),
            start_time: Some(st),
            token: tok.clone(),
        };
        let t = teardown(&id, Duration::from_millis(200));
        assert!(begun.elapsed() >= Duration::from_millis(200));
        assert_eq!(t.killed.len(), 2, "{t:?}");
        assert!(t.survivors.is_empty(), "{t:?}");
        assert!(!group_has_live_members(pgid));
        drop(g);
    }

    #[test]
    fn teardown_never_signals_a_group_with_the_wrong_start_time() {
        let tok = token("unverified");
        let mut g = spawn_group("sleep 300", &tok);
        let pgid = g.child.id() as i32;
        let st = start_time(pgid).expect("leader start time");
        let id = AttemptIdentity {
            pgid: Some(pgid),
            start_time: Some(st + 1),
            token: "not-the-token".to_owned(),
        };
        let t = teardown(&id, Duration::from_millis(100));
        assert!(t.killed.is_empty(), "{t:?}");
        assert!(t.unverified.contains(&pgid), "{t:?}");
        assert_eq!(t.unverified_reason, Some(LEADER_MISMATCH));
        assert!(
            t.describe()
                .contains("(start time does not match the attempt)"),
            "{}",
            t.describe()
        );
        assert!(is_alive(pgid));
        assert!(g.child.try_wait().expect("try_wait").is_none());
        drop(g);
    }

    #[test]
    fn teardown_finds_a_setsid_escapee_by_token_without_a_pgid() {
        let tok = token("escapee");
        let mut g = spawn_group("setsid sleep 300 & exit 0", &tok);
        let pgid = g.child.id() as i32;
        g.child.wait().expect("leader exits");
        let mut escapee = None;
        assert!(wait_until(Duration::from_secs(3), || {
            escapee = processes_with_token(&tok)
                .into_iter()
                .find(|p| p.pgid != pgid && p.pgid == p.pid);
            escapee.is_some()
        }));
        let escapee = escapee.map(|p| p.pid).unwrap_or_default();
        let id = AttemptIdentity {
            pgid: None,
            start_time: None,
            token: tok.clone(),
        };
        let t = teardown(&id, Duration::from_millis(300));
        assert_eq!(t.killed, vec![escapee], "{t:?}");
        assert!(processes_with_token(&tok).is_empty());
        assert_eq!(t.describe(), format!("killed 1 process (pid {escapee})"));
    }

    #[test]
    fn without_a_pgid_the_token_carrying_leader_names_the_group_and_its_tokenless_members_die() {
        let tok = token("leader");
        let mut g = spawn_group(
            "env -u LEASEHOLD_RUN_TOKEN sleep 300 & env -u LEASEHOLD_RUN_TOKEN sleep 300 & wait",
            &tok,
        );
        let pgid = g.child.id() as i32;
        // Only the leader carries the token, once both children have run `env -u` (a child
        // forked but not yet exec'd still shows the shell's environment, token included).
        let token_holders = || {
            processes_with_token(&tok)
                .iter()
                .map(|p| p.pid)
                .collect::<Vec<_>>()
        };
        assert!(
            wait_until(Duration::from_secs(3), || group_members(pgid).len() == 3
                && token_holders() == [pgid]),
            "members {:?}, token holders {:?}",
            group_members(pgid),
            token_holders()
        );
        let id = AttemptIdentity {
            pgid: None,
            start_time: None,
            token: tok.clone(),
        };
        let t = teardown(&id, Duration::from_millis(300));
        assert_eq!(t.killed.len(), 3, "{t:?}");
        assert!(t.unverified.is_empty() && t.survivors.is_empty(), "{t:?}");
        assert!(!group_has_live_members(pgid));
        let status = g.child.wait().expect("reap");
        assert!(!status.success());
    }

    #[test]
    fn a_listed_process_whose_start_time_no_longer_matches_is_never_signalled() {
        let tok = token("replaced");
        let g = spawn_group("trap '' TERM; sleep 300", &tok);
        let pid = g.child.id() as i32;
        // As if the pid had been recycled since it was found: the list says another start time.
        let mut listed = proc_info(pid).expect("the shell runs");
        listed.start_time += 1;
        let id = AttemptIdentity {
            pgid: None,
            start_time: None,
            token: "not-this-token".to_owned(),
        };
        let mut lost = Lost {
            id: &id,
            group: None,
            group_start: None,
            held: BTreeMap::new(),
            cgroups: Vec::new(),
        };
        lost.hold(vec![listed]);
        assert!(lost.held.is_empty());
        // The kill sequence, SIGKILL included, has nothing to send it.
        assert!(kill_all(&mut lost, Duration::from_millis(50)));
        assert!(
            is_alive(pid),
            "a process that was not verified was signalled"
        );
        drop(g);
    }

    #[test]
    fn teardown_many_reports_each_attempt_in_order() {
        let tok = [token("many-a"), token("many-b")];
        let groups: Vec<_> = tok
            .iter()
            .map(|t| spawn_group("trap '' TERM; sleep 300", t))
            .collect();
        let mut ids: Vec<AttemptIdentity> = groups
            .iter()
            .zip(&tok)
            .map(|(g, t)| {
                let pgid = g.child.id() as i32;
                assert!(wait_until(Duration::from_secs(3), || group_members(pgid)
                    .len()
                    == 2));
                AttemptIdentity {
                    pgid: Some(pgid),
                    start_time: start_time(pgid),
                    token: t.clone(),
                }
            })
            .collect();
        // Nothing of this one is alive: it is reported so, in its place.
        ids.insert(
            1,
            AttemptIdentity {
                pgid: None,
                start_time: None,
                token: token("many-none"),
            },
        );
        let t = teardown_many(&ids, Duration::from_millis(200));
        assert_eq!(t.len(), 3);
        assert_eq!(t[1], Teardown::default());
        for (i, g) in [(0, &groups[0]), (2, &groups[1])] {
            let pgid = g.child.id() as i32;
            assert_eq!(t[i].killed.len(), 2, "{:?}", t[i]);
            assert!(t[i].killed.contains(&pgid));
            assert!(t[i].survivors.is_empty(), "{:?}", t[i]);
            assert!(!group_has_live_members(pgid));
        }
        drop(groups);
    }

    #[test]
    fn describe_reports_nothing_found() {
        let t = Teardown::default();
        assert_eq!(t.describe(), "no process of the attempt was found alive");
    }
}
