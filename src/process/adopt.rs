//! Following an attempt whose runner is gone, under its keeper: the adopting runner is not
//! the keeper's parent and has no control socket to it, so it holds the keeper by a pidfd
//! (opened, then verified by start time, program and user), enforces the attempt's limits by
//! signalling what is left of it through verified pidfds, and reads the keeper's journal for
//! the attempt's outcome, which the keeper writes durably before it lets the command go.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
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
use crate::files::{self, Ended, Journaled};

/// A keeper found alive and verified: held by a pidfd, so that its pid cannot be recycled
/// under the adopter.
pub(crate) struct LiveKeeper {
    /// Readable once the keeper exits.
    pidfd: OwnedFd,
    /// Its pid.
    pub pid: i32,
    /// Its journal.
    pub journal: PathBuf,
}

/// Opens a pidfd for `pid` and keeps it only if the process is a keeper of this user's:
/// alive, started at `start_time` (clock ticks since boot), and running the keeper program.
/// Checked after the open, so the pidfd holds the process that was checked. `folder` is the
/// attempts folder, where its journal is.
pub(crate) fn live_keeper(folder: &Path, pid: i32, start_time: u64) -> Option<LiveKeeper> {
    let pidfd = pidfd_open(pid).ok()?;
    let info = proc::proc_info(pid)?;
    if info.is_dead() || info.start_time != start_time {
        return None;
    }
    runs_keeper(pid).then(|| LiveKeeper {
        pidfd,
        pid,
        journal: files::journal_path(folder, pid, Some(start_time)),
    })
}

/// The keeper of the attempt with `token` by its journal, for an attempt whose runner died
/// between the command's start and its record: what the journal says of it, and the keeper
/// if it is still alive (verified as [`live_keeper`] does).
pub(crate) fn find_keeper(folder: &Path, token: &str) -> Option<(Journaled, Option<LiveKeeper>)> {
    files::journals_of(folder, token)
        .into_iter()
        .next()
        .map(|(pid, start, said)| (said, live_keeper(folder, pid, start)))
}

/// Whether `pid` is alive and runs a keeper of this user's: what `jobs inspect` and `status`
/// say of a job kept with no runner. Not a verification to act on (see [`live_keeper`]).
pub(crate) fn keeper_running(pid: i32) -> bool {
    proc::proc_info(pid).is_some_and(|p| !p.is_dead()) && runs_keeper(pid)
}

/// Whether `pid` runs the keeper as a runner starts it: named `leasehold-keeper` (its
/// argv[0]), `serve` as its first argument, and this user's (real and effective uid).
/// Another user's process named so is none; one of this user's could pretend, but could as
/// well signal the attempt.
fn runs_keeper(pid: i32) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let mut args = cmdline.split(|&b| b == 0);
    if args.next() != Some(keeper::NAME.to_bytes()) || args.next() != Some(b"serve".as_slice()) {
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

/// How long to wait for the keeper to journal the outcome once the command was killed: its
/// drain, then a durable write.
const KEEPER_EXIT_WAIT: Duration = Duration::from_secs(10);

/// How often the journal is read for the attempt's outcome.
const JOURNAL_POLL: Duration = Duration::from_millis(100);

/// What the keeper's journal says of the attempt, once it says how it ended: the exit, or
/// `KeeperLost` for an attempt its fence stopped (or a journal that cannot be read).
fn journaled(adopted: &Adopted, token: &str, job_id: i64) -> Option<Exit> {
    match files::read_journal(&adopted.keeper.journal, token) {
        Ok(Some(Journaled::Outcome { ended, .. })) => Some(match ended {
            Ended::Exited(code) => Exit::Exited(code),
            Ended::Signaled(sig) => Exit::Signaled(sig),
        }),
        Ok(Some(Journaled::Fenced)) => Some(Exit::KeeperLost),
        Ok(Some(Journaled::Kept) | None) => None,
        Err(e) => {
            log::error!("job {job_id}: reading its keeper's journal: {e}");
            None
        }
    }
}

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
    let mut keeper_gone = false;
    // Each break is a kill: a stop, a timeout or an idle timeout enforced here.
    let killed: Exit = loop {
        if let Some(exit) = journaled(&adopted, &spec.run_token, spec.job_id) {
            return ended(spec, &adopted, exit, begun, out.as_ref());
        }
        if keeper_gone {
            // Gone, and its journal (read after) says nothing: the attempt is lost.
            return ended(spec, &adopted, Exit::KeeperLost, begun, out.as_ref());
        }
        if let Some(reason) = stop.reason() {
            if reason == StopReason::Leave {
                return result(spec, Exit::Stopped(reason), Vec::new(), begun, out.as_ref());
            }
            break Exit::Stopped(reason);
        }
        let now = Instant::now();
        if let (Some(d), Some(t)) = (deadline, spec.timeout)
            && now >= d
        {
            break Exit::TimedOut(t);
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
            break Exit::IdleTimedOut(i);
        }
        let wait = [deadline, idle_deadline]
            .into_iter()
            .flatten()
            .min()
            .map_or(JOURNAL_POLL, |d| {
                d.saturating_duration_since(now).min(JOURNAL_POLL)
            });
        keeper_gone = wait_keeper(&adopted.keeper, stop, Some(wait));
    };
    kill_attempt(spec, &adopted);
    // The keeper journals the end of what was killed; wait for it, so that the folder holds
    // all the output there will be.
    let until = Instant::now() + KEEPER_EXIT_WAIT;
    while Instant::now() < until && journaled(&adopted, &spec.run_token, spec.job_id).is_none() {
        if wait_keeper(&adopted.keeper, stop, Some(JOURNAL_POLL)) {
            break;
        }
    }
    result(spec, killed, Vec::new(), begun, out.as_ref())
}

/// The result of an attempt whose end the journal told (or whose keeper is gone): whatever
/// outlived the command (its group, or escaped carrying the token) is killed first.
fn ended(
    spec: &AttemptSpec,
    adopted: &Adopted,
    exit: Exit,
    begun: Instant,
    out: Option<&OutputFiles>,
) -> AttemptResult {
    let mut leaked = Vec::new();
    let left: Vec<i32> = leftovers(spec, adopted);
    if !left.is_empty() {
        kill_attempt(spec, adopted);
        leaked = left
            .into_iter()
            .map(|pid| Leak {
                pid,
                escaped_group: Some(pid) != adopted.pgid,
            })
            .collect();
    }
    result(spec, exit, leaked, begun, out)
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
/// teardown a lost attempt gets (the keeper is never signalled: it journals the command's
/// end and goes on with its other attempts).
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

/// The result, with the output's tails read from the attempt's files (the keeper wrote
/// what it held there when the runner went).
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
        release: None,
        // An adopted attempt's caps are not known here: its failure is told as it was.
        memory_exceeded: false,
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

    /// Starts `program ARGS` in `cwd`, its output discarded.
    fn start(cwd: &Path, program: &str, args: &[&str]) -> std::io::Result<Reaped> {
        Command::new(program)
            .args(args)
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map(Reaped)
    }

    /// The live processes working in `cwd`, with their real uid.
    fn working_in(cwd: &Path) -> Vec<(i32, u32)> {
        proc::all_processes()
            .filter(|p| !p.is_dead())
            .filter_map(|p| {
                let dir = std::fs::read_link(format!("/proc/{}/cwd", p.pid)).ok()?;
                (dir == cwd).then_some(())?;
                let status = std::fs::read_to_string(format!("/proc/{}/status", p.pid)).ok()?;
                let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
                Some((p.pid, line.split_whitespace().next()?.parse().ok()?))
            })
            .collect()
    }

    #[test]
    fn only_this_users_process_run_as_the_keeper_is_taken_for_a_keeper() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let cwd = dir.path().canonicalize().expect("canonical");
        std::fs::set_permissions(&cwd, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        // `cat serve` blocks opening the FIFO `serve`: argv [NAME, "serve"], as a keeper's.
        let fifo = cwd.join("serve");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666))
            .expect("mkfifo");
        let keeper = "exec -a leasehold-keeper cat serve";
        // This user's `cat serve`: the right argument, not the keeper's name.
        let plain = start(&cwd, "bash", &["-c", "exec cat serve"]).expect("bash starts");
        // Another user's process named as a keeper.
        let other = if nix::unistd::geteuid().is_root() {
            let started = start(
                &cwd,
                "runuser",
                &["-u", "nobody", "--", "bash", "-c", keeper],
            );
            Some(started.expect("runuser starts"))
        } else {
            eprintln!("not root: no process of another user to test with");
            None
        };
        let ours = start(&cwd, "bash", &["-c", keeper]).expect("bash starts");
        let me = nix::unistd::geteuid().as_raw();
        let deadline = Instant::now() + Duration::from_secs(10);
        let named = |pid: i32| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c == b"leasehold-keeper\0serve\0")
        };
        let want_named = 1 + usize::from(other.is_some());
        let mut found = working_in(&cwd);
        while found.iter().filter(|(p, _)| named(*p)).count() < want_named
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(10));
            found = working_in(&cwd);
        }
        let keepers: Vec<i32> = found
            .iter()
            .filter(|&&(pid, _)| keeper_running(pid))
            .map(|&(pid, _)| pid)
            .collect();
        assert_eq!(keepers, vec![ours.0.id() as i32], "{found:?}");
        for &(pid, uid) in &found {
            assert_eq!(
                keeper_running(pid),
                named(pid) && uid == me,
                "pid {pid} uid {uid}"
            );
        }
        let start_time = proc::start_time(ours.0.id() as i32).expect("start time");
        assert!(live_keeper(&cwd, ours.0.id() as i32, start_time).is_some());
        assert!(live_keeper(&cwd, ours.0.id() as i32, start_time + 1).is_none());
        assert!(live_keeper(&cwd, plain.0.id() as i32, start_time).is_none());
        // `runuser` does not pass its signal on to the other user's process: ended by its pid.
        for &(pid, uid) in &found {
            if uid != me {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        drop((plain, other, ours));
    }
}
