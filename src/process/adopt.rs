//! Following an attempt whose runner is gone, under its keeper: the adopting runner is not
//! the keeper's parent and has no control socket to it, so it watches the keeper through a
//! pidfd (opened, then verified by start time and run token), enforces the attempt's limits
//! by signalling what is left of it through verified pidfds, and reads the outcome the keeper
//! writes before it exits.

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, poll};

use super::attempt::{AttemptResult, AttemptSpec, Exit, Leak, poll_timeout};
use super::child::pidfd_open;
use super::keeper;
use super::kept::OutputFiles;
use super::kill;
use super::proc;
use super::stop::{StopHandle, StopReason};
use crate::files::{self, Ended};

/// A keeper found alive and verified: held by a pidfd, so that its pid cannot be recycled
/// under the adopter.
pub(crate) struct LiveKeeper {
    /// Readable once the keeper exits.
    pidfd: OwnedFd,
    /// Its pid.
    pub pid: i32,
}

/// Opens a pidfd for `pid` and keeps it only if the process is the attempt's keeper: alive,
/// started at `start_time` (clock ticks since boot), and running the keeper for `token` (its
/// first argument). Checked after the open, so the pidfd holds the process that was checked.
pub(crate) fn live_keeper(pid: i32, start_time: u64, token: &str) -> Option<LiveKeeper> {
    let pidfd = pidfd_open(pid).ok()?;
    let info = proc::proc_info(pid)?;
    if info.is_dead() || info.start_time != start_time {
        return None;
    }
    runs_keeper_of(pid, token).then_some(LiveKeeper { pidfd, pid })
}

/// The live keeper of the attempt with `token`, found by its arguments among every process
/// (for an attempt whose runner died between the keeper's spawn and its record), held by a
/// pidfd and verified after the open as [`live_keeper`] does.
pub(crate) fn find_keeper(token: &str) -> Option<LiveKeeper> {
    proc::all_processes()
        .filter(|p| !p.is_dead())
        .find(|p| keeper_running(p.pid, token))
        .and_then(|p| live_keeper(p.pid, p.start_time, token))
}

/// Whether `pid` is alive and is the keeper of the attempt with `token` (its first
/// argument): what `jobs inspect` and `status` say of a job kept with no runner. Not a
/// verification to act on (see [`live_keeper`]).
pub(crate) fn keeper_running(pid: i32, token: &str) -> bool {
    proc::proc_info(pid).is_some_and(|p| !p.is_dead()) && runs_keeper_of(pid, token)
}

/// Whether `pid` runs the keeper of the attempt with `token` as a runner starts it: named
/// `leasehold-keeper` (its argv[0]), the token as its first argument, and this user's (real
/// and effective uid). Another user's process with the token among its arguments (`yes
/// TOKEN`) is none; one of this user's could pretend, but could as well signal the attempt.
fn runs_keeper_of(pid: i32, token: &str) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let mut args = cmdline.split(|&b| b == 0);
    if args.next() != Some(keeper::NAME.to_bytes()) || args.next() != Some(token.as_bytes()) {
        return false;
    }
    let me = nix::unistd::geteuid().as_raw();
    let uids = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
            let mut ids = line.split_whitespace().map(str::parse::<u32>);
            Some((ids.next()?.ok()?, ids.next()?.ok()?))
        });
    uids == Some((me, me))
}

/// Where an adopted attempt stands.
pub(crate) struct Adopted {
    /// The keeper.
    pub keeper: LiveKeeper,
    /// The command's pid (its process group), as recorded at its start.
    pub pgid: Option<i32>,
    /// The command's start time, as recorded.
    pub start_time: Option<u64>,
    /// How long ago (wall clock) the attempt started: its timeout runs from then.
    pub age: Duration,
}

/// How long to wait for the keeper to write the outcome and exit once the command was
/// killed: its drain, then a durable write.
const KEEPER_EXIT_WAIT: Duration = Duration::from_secs(10);

/// Follows `adopted` to its end and returns what became of it, as [`run`](super::run)
/// does for an attempt it started: the keeper's outcome, or a timeout, idle timeout or stop
/// enforced here. A stop for [`StopReason::Leave`] leaves the attempt running.
pub(crate) fn follow(spec: &AttemptSpec, adopted: Adopted, stop: &StopHandle) -> AttemptResult {
    let begun = Instant::now();
    let started = begun.checked_sub(adopted.age).unwrap_or(begun);
    let dir = spec
        .files
        .as_ref()
        .map(|f| files::attempt_dir(&f.folder, spec.job_id, spec.attempt, &spec.run_token));
    let mut out = dir.clone().map(OutputFiles::new);
    let deadline = spec.timeout.and_then(|t| started.checked_add(t));
    let mut last_output = begun;
    let killed: Option<Exit> = loop {
        if let Some(reason) = stop.reason() {
            if reason == StopReason::Leave {
                return result(spec, Exit::Stopped(reason), Vec::new(), begun, out.as_ref());
            }
            break Some(Exit::Stopped(reason));
        }
        let now = Instant::now();
        if let (Some(d), Some(t)) = (deadline, spec.timeout)
            && now >= d
        {
            break Some(Exit::TimedOut(t));
        }
        let mut idle_deadline = spec.idle_timeout.and_then(|i| last_output.checked_add(i));
        if let (Some(d), Some(out)) = (idle_deadline, &mut out)
            && now >= d
            && let Some(age) = out.new_change_age()
        {
            last_output = last_output.max(now.checked_sub(age).unwrap_or(now));
            idle_deadline = spec.idle_timeout.and_then(|i| last_output.checked_add(i));
        }
        if let (Some(d), Some(i)) = (idle_deadline, spec.idle_timeout)
            && now >= d
        {
            break Some(Exit::IdleTimedOut(i));
        }
        let wait = [deadline, idle_deadline]
            .into_iter()
            .flatten()
            .min()
            .map(|d| d.saturating_duration_since(now));
        if wait_keeper(&adopted.keeper, stop, wait) {
            break None;
        }
    };
    let mut leaked = Vec::new();
    if let Some(exit) = killed {
        kill_attempt(spec, &adopted);
        let _ = wait_keeper(&adopted.keeper, stop, Some(KEEPER_EXIT_WAIT));
        return result(spec, exit, leaked, begun, out.as_ref());
    }
    let exit = match dir.as_deref().map(files::read_outcome) {
        Some(Ok(Some(o))) if o.token == spec.run_token => match o.ended {
            Ended::Exited(code) => Exit::Exited(code),
            Ended::Signaled(sig) => Exit::Signaled(sig),
        },
        Some(Err(e)) => {
            log::error!("job {}: reading its outcome: {e}", spec.job_id);
            Exit::KeeperLost
        }
        _ => Exit::KeeperLost,
    };
    // Whatever outlived the command (its group, or escaped carrying the token) is killed.
    let left: Vec<i32> = leftovers(spec, &adopted);
    if !left.is_empty() {
        kill_attempt(spec, &adopted);
        leaked = left
            .into_iter()
            .map(|pid| Leak {
                pid,
                escaped_group: Some(pid) != adopted.pgid,
            })
            .collect();
    }
    result(spec, exit, leaked, begun, out.as_ref())
}

/// Waits up to `wait` (forever if `None`) for the keeper to exit or a stop request. Returns
/// whether the keeper exited.
fn wait_keeper(keeper: &LiveKeeper, stop: &StopHandle, wait: Option<Duration>) -> bool {
    let mut fds = [
        PollFd::new(keeper.pidfd.as_fd(), PollFlags::POLLIN),
        PollFd::new(stop.wake(), PollFlags::POLLIN),
    ];
    match poll(&mut fds, poll_timeout(wait)) {
        Ok(_) | Err(Errno::EINTR) => {}
        Err(e) => {
            log::error!("poll failed: {e}");
            std::thread::sleep(kill::POLL_INTERVAL);
        }
    }
    fds[0].revents().is_some_and(|r| !r.is_empty())
}

/// The processes of the attempt still alive: members of its group no older than it, and
/// carriers of its token.
fn leftovers(spec: &AttemptSpec, adopted: &Adopted) -> Vec<i32> {
    let mut pids: Vec<i32> = match (adopted.pgid, adopted.start_time) {
        (Some(pgid), Some(start)) => proc::group_members(pgid)
            .into_iter()
            .filter(|m| m.start_time >= start && !m.is_dead())
            .map(|m| m.pid)
            .collect(),
        _ => Vec::new(),
    };
    for p in proc::processes_with_token(&spec.run_token) {
        if !pids.contains(&p.pid) && !p.is_dead() {
            pids.push(p.pid);
        }
    }
    pids
}

/// Kills what is left of the attempt with the kill sequence, through the same verified
/// teardown a lost attempt gets (the keeper is never signalled: it exits by itself once its
/// command is gone).
fn kill_attempt(spec: &AttemptSpec, adopted: &Adopted) {
    let report = super::teardown(
        &super::AttemptIdentity {
            pgid: adopted.pgid,
            start_time: adopted.start_time,
            token: spec.run_token.clone(),
        },
        spec.kill_grace,
    );
    log::info!("job {}: {}", spec.job_id, report.describe());
}

/// The result, with the output's tails read from the attempt's files.
fn result(
    spec: &AttemptSpec,
    exit: Exit,
    leaked: Vec<Leak>,
    begun: Instant,
    out: Option<&OutputFiles>,
) -> AttemptResult {
    let (stdout, stderr) = out.map(|o| o.tails(spec.tail_bytes)).unwrap_or_default();
    AttemptResult {
        exit,
        stdout,
        stderr,
        leaked,
        duration: begun.elapsed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::process::{Child, Command, Stdio};

    /// A child killed by pid and reaped when dropped.
    struct Reaped(Child);

    impl Drop for Reaped {
        fn drop(&mut self) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.0.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = self.0.wait();
        }
    }

    /// Starts `program ARGS`, its output discarded.
    fn start(program: &str, args: &[&str]) -> std::io::Result<Reaped> {
        Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map(Reaped)
    }

    /// The live processes whose first argument is `token`, with their real uid.
    fn with_token(token: &str) -> Vec<(i32, u32)> {
        proc::all_processes()
            .filter(|p| !p.is_dead())
            .filter_map(|p| {
                let cmdline = std::fs::read(format!("/proc/{}/cmdline", p.pid)).ok()?;
                (cmdline.split(|&b| b == 0).nth(1)? == token.as_bytes()).then_some(())?;
                let status = std::fs::read_to_string(format!("/proc/{}/status", p.pid)).ok()?;
                let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
                Some((p.pid, line.split_whitespace().next()?.parse().ok()?))
            })
            .collect()
    }

    #[test]
    fn only_this_users_process_named_as_a_keeper_is_found_as_the_keeper_of_a_token() {
        // A duration `sleep` takes, unique to this test run: the token.
        let token = format!("86400.{}", std::process::id());
        let keeper = "exec -a leasehold-keeper sleep \"$0\"";
        // This user's `sleep TOKEN`: the token as first argument, but not a keeper.
        let plain = start("sleep", &[&token]).expect("sleep starts");
        // Another user's process named as a keeper, the token as first argument.
        let other = if nix::unistd::geteuid().is_root() {
            let started = start(
                "runuser",
                &["-u", "nobody", "--", "bash", "-c", keeper, &token],
            );
            Some(started.expect("runuser starts"))
        } else {
            eprintln!("not root: no process of another user to test with");
            None
        };
        let ours = start("bash", &["-c", keeper, &token]).expect("bash starts");
        let me = nix::unistd::geteuid().as_raw();
        let wanted = 2 + usize::from(other.is_some());
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut found = with_token(&token);
        while found.len() < wanted && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            found = with_token(&token);
        }
        assert_eq!(found.len(), wanted, "{found:?}");
        for &(pid, uid) in &found {
            let named = std::fs::read(format!("/proc/{pid}/cmdline"))
                .expect("cmdline")
                .starts_with(b"leasehold-keeper\0");
            assert_eq!(
                keeper_running(pid, &token),
                named && uid == me,
                "pid {pid} (uid {uid}, named as a keeper: {named})"
            );
        }
        assert_eq!(
            find_keeper(&token).map(|k| k.pid),
            Some(ours.0.id() as i32),
            "{found:?}"
        );
        // `runuser` does not pass its signal on to the other user's process: ended by its pid.
        for &(pid, uid) in &found {
            if uid != me {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        drop((plain, other));
    }
}
