//! Raw operating-system facts about processes, read from Linux `/proc`.
//!
//! Everything here is a thin, allocation-light reader of `/proc`. The
//! identity checks exist because pids are recycled: a pid or process-group id
//! recorded by a runner that later crashed may, by the time anyone looks,
//! belong to an unrelated process.
//! A pid is therefore only trusted together with the process start time
//! recorded at spawn (pid + start time is unique for the life of a boot), or
//! when the process carries the attempt's run token in its environment.

use std::io;

use nix::errno::Errno;
use nix::libc;
use nix::sys::signal::killpg;
use nix::unistd::Pid;

/// The environment variable through which every attempt's processes carry
/// their run token; descendants inherit it, which is what lets us find them
/// even after they leave the attempt's process group.
pub(crate) const RUN_TOKEN_VAR: &str = "LEASEHOLD_RUN_TOKEN";

/// The current boot's id (`/proc/sys/kernel/random/boot_id`), trimmed.
///
/// Start times are counted from boot, so a recorded (pid, start time) pair is
/// only meaningful if the boot id is still the same.
pub(crate) fn boot_id() -> io::Result<String> {
    let raw = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?;
    Ok(raw.trim().to_owned())
}

/// The PID namespace of the calling process: the inode number of `/proc/self/ns/pid`, read
/// from its link text `pid:[N]`.
///
/// A pid names a process only within one PID namespace, and `/proc` shows the processes of
/// the namespace it was mounted in (and those of its descendants, under other numbers). Two
/// processes on one kernel (one boot id) with the same number here see the same pids.
pub(crate) fn pid_namespace() -> io::Result<u64> {
    let link = std::fs::read_link("/proc/self/ns/pid")?;
    parse_namespace_link(&link.to_string_lossy()).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unexpected /proc/self/ns/pid link {}", link.display()),
        )
    })
}

/// The inode of a namespace link's text (`pid:[4026531836]`).
fn parse_namespace_link(link: &str) -> Option<u64> {
    link.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
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

/// The boot-time clock (`CLOCK_BOOTTIME`) now, in nanoseconds: the clock that
/// `/proc/PID/stat`'s start times count.
pub(crate) fn boot_clock_ns() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec that outlives the call.
    let ret = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    if ret != 0 {
        return None;
    }
    let secs = u64::try_from(ts.tv_sec).ok()?;
    let nanos = u64::try_from(ts.tv_nsec).ok()?;
    secs.checked_mul(1_000_000_000)?.checked_add(nanos)
}

/// The clock ticks per second of `/proc`'s times (`USER_HZ`), when it divides
/// a second into whole nanoseconds (it is 100 on Linux).
fn clock_ticks() -> Option<u64> {
    static TICKS: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        // SAFETY: sysconf only reads a system constant.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        u64::try_from(hz)
            .ok()
            .filter(|&hz| hz > 0 && 1_000_000_000 % hz == 0)
    })
}

/// The start time, in clock ticks since boot as `/proc/PID/stat` gives it, of a
/// process created between two readings of [`boot_clock_ns`]; None when the
/// readings fall in different ticks (the caller then reads `/proc`).
///
/// The kernel stamps a new process with the boot clock when it clones it and
/// reports that stamp divided down to whole ticks, so when both readings fall in
/// one tick the process's start time is that tick, exactly. A spawn takes a
/// fraction of a 10 ms tick, so this spares nearly every spawn the open, read
/// and parse of `/proc/PID/stat`.
pub(crate) fn start_time_between(before_ns: u64, after_ns: u64) -> Option<u64> {
    let per_tick = 1_000_000_000 / clock_ticks()?;
    let tick = before_ns / per_tick;
    (before_ns <= after_ns && after_ns / per_tick == tick).then_some(tick)
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
#[cfg(test)]
pub(crate) fn is_alive(pid: i32) -> bool {
    proc_info(pid).is_some_and(|p| !p.is_dead())
}

/// Every process listed in `/proc` (only thread-group leaders are listed,
/// so each process appears once). Processes that vanish while we read are
/// skipped.
pub(super) fn all_processes() -> impl Iterator<Item = ProcInfo> {
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
///
/// Each process's group is asked of the kernel first (`getpgid`, one system call), and only
/// the group's members have their `stat` read: a runner ending 200 attempts at once, each
/// with its leader held unreaped, otherwise read every process's `stat` 200 times (about
/// 2 ms of CPU per attempt on a host of 400 processes).
pub(crate) fn group_members(pgid: i32) -> Vec<ProcInfo> {
    if pgid <= 0 {
        return Vec::new();
    }
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let pid: i32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            // A process that is gone, or whose group is another, is passed over unread.
            let group = nix::unistd::getpgid(Some(Pid::from_raw(pid))).ok()?;
            (group.as_raw() == pgid).then_some(pid)
        })
        .filter_map(proc_info)
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

/// This host's name, or "localhost" when it cannot be read.
pub(crate) fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".to_string())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    use nix::sys::signal::Signal;

    use crate::process::kill::{signal_group, signal_pid};

    /// Polls `cond` every 10 ms until it holds or `limit` passes.
    pub(in crate::process) fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
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
    pub(in crate::process) fn token(name: &str) -> String {
        format!("test-process-{}-{name}", std::process::id())
    }

    /// Kills, on drop, the test's process group and every process carrying
    /// its token, then reaps the child, so a failing assertion leaks nothing.
    pub(in crate::process) struct Cleanup {
        pub(in crate::process) child: Child,
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
    pub(in crate::process) fn spawn_group(script: &str, token: &str) -> Cleanup {
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
    fn pid_namespace_is_the_inode_of_the_namespace_link() {
        use std::os::unix::fs::MetadataExt;
        let ns = pid_namespace().expect("own PID namespace");
        let inode = std::fs::metadata("/proc/self/ns/pid").expect("stat").ino();
        assert_eq!(ns, inode);
        assert_eq!(parse_namespace_link("pid:[4026531836]"), Some(4026531836));
        assert_eq!(parse_namespace_link("net:[4026531836]"), None);
        assert_eq!(parse_namespace_link("pid:[x]"), None);
    }

    #[test]
    fn missing_process_has_no_start_time() {
        // pid_max is at most 2^22, so this pid cannot exist.
        assert_eq!(start_time(i32::MAX), None);
        assert!(!is_alive(i32::MAX));
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
}
