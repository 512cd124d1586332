//! Raw operating-system facts about processes (read from Linux `/proc`) and
//! the signals leasehold sends to them.
//!
//! Everything here is a thin, allocation-light reader of `/proc` plus
//! `kill(2)`/`killpg(2)`. The identity checks exist because pids are
//! recycled: a pid or process-group id recorded by a runner that later
//! crashed may, by the time anyone looks, belong to an unrelated process.
//! A pid is therefore only trusted together with the process start time
//! recorded at spawn (pid + start time is unique for the life of a boot), or
//! when the process carries the attempt's run token in its environment.

use std::collections::BTreeSet;
use std::io;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// The environment variable through which every attempt's processes carry
/// their run token; descendants inherit it, which is what lets us find them
/// even after they leave the attempt's process group.
pub(crate) const RUN_TOKEN_VAR: &str = "LEASEHOLD_RUN_TOKEN";

/// How often teardown re-checks whether its targets have died. Short enough
/// that a cooperative process is noticed promptly, long enough that waiting
/// costs next to no CPU.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// How long to wait, after SIGKILL, for the kernel to finish killing the
/// targets before calling them survivors. SIGKILL cannot be caught, so only a
/// process stuck in uninterruptible sleep takes longer than this.
const AFTER_KILL_WAIT: Duration = Duration::from_secs(2);

/// The current boot's id (`/proc/sys/kernel/random/boot_id`), trimmed.
///
/// Start times are counted from boot, so a recorded (pid, start time) pair is
/// only meaningful if the boot id is still the same.
pub(crate) fn boot_id() -> io::Result<String> {
    let raw = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?;
    Ok(raw.trim().to_owned())
}

/// A process as described by `/proc/PID/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcInfo {
    /// The process id.
    pub pid: i32,
    /// The parent's process id.
    pub ppid: i32,
    /// The process group id.
    pub pgid: i32,
    /// The one-letter state (`R`, `S`, `D`, `Z`, `T`, ...).
    pub state: char,
    /// Start time, in clock ticks since boot.
    pub start_time: u64,
}

impl ProcInfo {
    /// Whether the process has finished running: a zombie (`Z`) or dead
    /// (`X`) process holds no resources worth killing and cannot be signalled
    /// into doing anything.
    pub(crate) fn is_dead(&self) -> bool {
        matches!(self.state, 'Z' | 'X')
    }
}

/// Parses the contents of `/proc/PID/stat`.
///
/// The second field (the command name) is in parentheses and may itself
/// contain spaces and parentheses, so the fixed-position fields are taken
/// after the LAST `)`.
fn parse_stat(pid: i32, stat: &str) -> Option<ProcInfo> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After the command name, fields are numbered from 3 (state); the start
    // time is field 22, i.e. the 20th field here.
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgid = fields.next()?.parse().ok()?;
    let start_time = fields.nth(16)?.parse().ok()?;
    Some(ProcInfo {
        pid,
        ppid,
        pgid,
        state,
        start_time,
    })
}

/// Facts about process `pid`, or `None` if it does not exist (or `/proc`
/// cannot be read for it).
pub(crate) fn proc_info(pid: i32) -> Option<ProcInfo> {
    if pid <= 0 {
        return None;
    }
    let mut file = std::fs::File::open(format!("/proc/{pid}/stat")).ok()?;
    // One read into a stack buffer: the line is generated whole on the first
    // read and is far shorter than the buffer (a 16-byte name and 50 numbers),
    // so this costs one read where `read_to_string` takes a statx, a probe
    // read, the read and the read of the end, plus the allocations.
    let mut buf = [0u8; 2048];
    let mut len = 0;
    while len < buf.len() && !buf[..len].ends_with(b"\n") {
        match io::Read::read(&mut file, &mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    if len == buf.len() && !buf.ends_with(b"\n") {
        // Longer than any stat line seen; read it the general way.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        return parse_stat(pid, &stat);
    }
    let stat = &buf[..len];
    // Only the part from the last `)` on is parsed: the command name before it
    // may be any bytes, not only UTF-8.
    let rest = &stat[stat.iter().rposition(|&b| b == b')')?..];
    parse_stat(pid, std::str::from_utf8(rest).ok()?)
}

/// The start time of process `pid` in clock ticks since boot (field 22 of
/// `/proc/PID/stat`), or `None` if the process does not exist.
pub(crate) fn start_time(pid: i32) -> Option<u64> {
    proc_info(pid).map(|p| p.start_time)
}

/// The start time of the calling process, in clock ticks since boot.
pub(crate) fn self_start_time() -> io::Result<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let pid = i32::try_from(std::process::id()).map_err(io::Error::other)?;
    parse_stat(pid, &stat)
        .map(|p| p.start_time)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unparsable /proc/self/stat"))
}

/// Whether process `pid` exists and is not a zombie.
pub(crate) fn is_alive(pid: i32) -> bool {
    proc_info(pid).is_some_and(|p| !p.is_dead())
}

/// Every process listed in `/proc` (only thread-group leaders are listed,
/// so each process appears once). Processes that vanish while we read are
/// skipped.
fn all_processes() -> impl Iterator<Item = ProcInfo> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            proc_info(pid)
        })
}

/// Every non-zombie process whose process group is `pgid`.
pub(crate) fn group_members(pgid: i32) -> Vec<ProcInfo> {
    if pgid <= 0 {
        return Vec::new();
    }
    all_processes()
        .filter(|p| p.pgid == pgid && !p.is_dead())
        .collect()
}

/// Whether the process group `pgid` has any non-zombie member.
///
/// A `killpg(pgid, 0)` probe answers the common "group is gone" case without
/// scanning `/proc`; only when the group still exists do we scan, because the
/// probe also counts zombies that are waiting to be reaped.
pub(crate) fn group_has_live_members(pgid: i32) -> bool {
    if pgid <= 1 {
        return false;
    }
    match killpg(Pid::from_raw(pgid), None) {
        Err(Errno::ESRCH) => false,
        _ => !group_members(pgid).is_empty(),
    }
}

/// Whether a NUL-separated environment block contains exactly `entry`.
fn environ_contains(environ: &[u8], entry: &[u8]) -> bool {
    environ.split(|b| *b == 0).any(|e| e == entry)
}

/// Every non-zombie process (other than the caller) whose environment holds
/// exactly `LEASEHOLD_RUN_TOKEN=<token>`. Processes whose environment cannot
/// be read (gone, or not ours) are skipped.
pub(crate) fn processes_with_token(token: &str) -> Vec<ProcInfo> {
    let entry = format!("{RUN_TOKEN_VAR}={token}");
    let me = i32::try_from(std::process::id()).unwrap_or(-1);
    all_processes()
        .filter(|p| p.pid != me && !p.is_dead())
        .filter(|p| {
            std::fs::read(format!("/proc/{}/environ", p.pid))
                .is_ok_and(|env| environ_contains(&env, entry.as_bytes()))
        })
        .collect()
}

/// Refuses the ids whose signalling would hit init or (through the special
/// meanings of 0 and negative ids in `kill(2)`) a whole set of unrelated
/// processes.
fn check_target(what: &str, id: i32) -> io::Result<Pid> {
    if id <= 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("refusing to signal {what} {id}"),
        ));
    }
    Ok(Pid::from_raw(id))
}

/// Sends `sig` to every process of group `pgid`. A group that no longer
/// exists is not an error: whatever we wanted to stop is already gone.
pub(crate) fn signal_group(pgid: i32, sig: Signal) -> io::Result<()> {
    match killpg(check_target("process group", pgid)?, sig) {
        Ok(()) | Err(Errno::ESRCH) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Sends `sig` to process `pid`. A process that no longer exists is not an
/// error.
pub(crate) fn signal_pid(pid: i32, sig: Signal) -> io::Result<()> {
    match kill(check_target("pid", pid)?, sig) {
        Ok(()) | Err(Errno::ESRCH) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

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

/// Sends `sig` to the group (when verified) and to each pid in `pids`.
/// Errors other than "already gone" (only EPERM is possible) are logged:
/// teardown is best effort and reports what is left in `survivors`.
fn send(group: Option<i32>, pids: &BTreeSet<i32>, sig: Signal) {
    if let Some(pgid) = group
        && let Err(e) = signal_group(pgid, sig)
    {
        log::warn!("teardown: {sig} to process group {pgid}: {e}");
    }
    for &pid in pids {
        if let Err(e) = signal_pid(pid, sig) {
            log::warn!("teardown: {sig} to pid {pid}: {e}");
        }
    }
}

/// Kills whatever is left of a LOST attempt: a process group left behind by a
/// runner that crashed or froze. The caller need not be the process that
/// spawned the attempt.
///
/// The recorded group is signalled only if its identity is verified (see
/// `verify_group`); every process carrying the attempt's token is signalled
/// regardless, since the token itself proves identity. Targets get SIGTERM,
/// then SIGKILL once `grace` has passed if any is still alive.
pub(crate) fn teardown(id: &AttemptIdentity, grace: Duration) -> Teardown {
    let mut result = Teardown::default();
    let carriers = || -> Vec<ProcInfo> {
        if id.token.is_empty() {
            // An empty token would match every process with an empty
            // LEASEHOLD_RUN_TOKEN; never treat that as proof.
            return Vec::new();
        }
        processes_with_token(&id.token)
    };

    let first_carriers = carriers();
    let group = match id.pgid.filter(|&p| p > 1) {
        None => None,
        Some(p) => match verify_group(p, id.start_time) {
            Ok(()) => Some(p),
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
    // The processes to signal one by one: token carriers outside the
    // verified group (those inside get the group's signal; signalling them
    // twice could read as "terminate now" to a process handling SIGTERM), and
    // the verified leader if it moved itself out of its group.
    let individuals = |found: Vec<ProcInfo>| -> BTreeSet<i32> {
        let mut pids: BTreeSet<i32> = found
            .iter()
            .filter(|p| Some(p.pgid) != group)
            .map(|p| p.pid)
            .collect();
        if let Some(g) = group
            && let Some(leader) = proc_info(g)
            && Some(leader.start_time) == id.start_time
            && leader.pgid != g
            && !leader.is_dead()
        {
            pids.insert(g);
        }
        pids
    };
    let add_members = |killed: &mut BTreeSet<i32>| {
        if let Some(g) = group {
            killed.extend(group_members(g).iter().map(|p| p.pid));
        }
    };

    let mut targets = individuals(first_carriers);
    let mut killed = targets.clone();
    add_members(&mut killed);
    if killed.is_empty() {
        return result;
    }
    send(group, &targets, Signal::SIGTERM);

    let all_gone = |killed: &BTreeSet<i32>| {
        group.is_none_or(|g| !group_has_live_members(g)) && killed.iter().all(|&p| !is_alive(p))
    };
    let wait = |killed: &BTreeSet<i32>, limit: Duration| {
        let deadline = Instant::now().checked_add(limit);
        while !all_gone(killed) {
            let left = deadline.map_or(POLL_INTERVAL, |d| {
                d.saturating_duration_since(Instant::now())
            });
            if left.is_zero() {
                return;
            }
            std::thread::sleep(POLL_INTERVAL.min(left));
        }
    };
    wait(&killed, grace);

    if !all_gone(&killed) {
        // Members forked and carriers started during the grace are ours too.
        add_members(&mut killed);
        targets.extend(individuals(carriers()));
        killed.extend(&targets);
        send(group, &targets, Signal::SIGKILL);
        wait(&killed, AFTER_KILL_WAIT);
    }

    result.survivors = killed.iter().copied().filter(|&p| is_alive(p)).collect();
    result.killed = killed.into_iter().collect();
    result
}

/// This host's name, or "localhost" when it cannot be read.
pub(crate) fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::process::{Child, Command, Stdio};

    /// Polls `cond` every 10 ms until it holds or `limit` passes.
    fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            if cond() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A unique run token for one test.
    fn token(name: &str) -> String {
        format!("test-process-{}-{name}", std::process::id())
    }

    /// Kills, on drop, the test's process group and every process carrying
    /// its token, then reaps the child, so a failing assertion leaks nothing.
    struct Cleanup {
        child: Child,
        token: String,
    }

    impl Drop for Cleanup {
        fn drop(&mut self) {
            let pid = self.child.id() as i32;
            let _ = signal_group(pid, Signal::SIGKILL);
            for p in processes_with_token(&self.token) {
                let _ = signal_pid(p.pid, Signal::SIGKILL);
            }
            let _ = self.child.wait();
        }
    }

    /// Spawns `sh -c script` as the leader of a new process group, carrying
    /// `token` in its environment.
    fn spawn_group(script: &str, token: &str) -> Cleanup {
        let child = Command::new("sh")
            .args(["-c", script])
            .env(RUN_TOKEN_VAR, token)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("spawn sh");
        Cleanup {
            child,
            token: token.to_owned(),
        }
    }

    #[test]
    fn parses_stat_after_last_paren_even_with_odd_command_names() {
        let line = "42 (a) b (c) d) S 7 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 98765 1 2";
        let info = parse_stat(42, line).expect("parses");
        assert_eq!(
            info,
            ProcInfo {
                pid: 42,
                ppid: 7,
                pgid: 42,
                state: 'S',
                start_time: 98765
            }
        );
    }

    #[test]
    fn start_time_of_self_is_known_and_matches() {
        let me = std::process::id() as i32;
        let st = start_time(me).expect("own start time");
        assert_eq!(self_start_time().expect("self start time"), st);
        assert!(is_alive(me));
        assert_eq!(boot_id().expect("boot id").len(), 36);
    }

    #[test]
    fn missing_process_has_no_start_time() {
        // pid_max is at most 2^22, so this pid cannot exist.
        assert_eq!(start_time(i32::MAX), None);
        assert!(!is_alive(i32::MAX));
    }

    #[test]
    fn refuses_to_signal_init_or_special_ids() {
        for id in [-1, 0, 1] {
            assert!(signal_group(id, Signal::SIGTERM).is_err());
            assert!(signal_pid(id, Signal::SIGTERM).is_err());
        }
        // A group that does not exist is not an error.
        assert!(signal_group(i32::MAX, Signal::SIGTERM).is_ok());
    }

    #[test]
    fn finds_group_members_and_token_carriers() {
        let tok = token("members");
        let g = spawn_group("sleep 300 & sleep 300", &tok);
        let pgid = g.child.id() as i32;
        assert!(wait_until(Duration::from_secs(3), || group_members(pgid)
            .len()
            == 3));
        assert!(group_has_live_members(pgid));
        let carriers = processes_with_token(&tok);
        assert_eq!(carriers.len(), 3, "{carriers:?}");
        assert!(carriers.iter().all(|p| p.pgid == pgid));
        drop(g);
    }

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
    fn describe_reports_nothing_found() {
        let t = Teardown::default();
        assert_eq!(t.describe(), "no process of the attempt was found alive");
    }
}
