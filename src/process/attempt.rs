//! Supervises one attempt of a job: spawn it in its own process group, collect
//! the tails of its output, enforce its time limits, honour stop requests, and
//! make sure nothing of it is left running when [`run`] returns.
//!
//! Supervision is a single `poll(2)` loop in the calling thread over the
//! stdout and stderr pipes, a pidfd for the main process and the stop
//! handle's wake-up eventfd, with the nearest deadline as the timeout: a job
//! that sleeps costs its supervisor no CPU.
//!
//! The main process is started by [`spawn`](super::spawn), its output kept
//! by [`output`](super::output), and what is left of the attempt when it must
//! end is killed by the one kill sequence.

use std::collections::BTreeMap;
use std::mem;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::Signal;

use super::cap::{memory_exceeded, needs_wrapper};
use super::cgroup;
use super::child::{ChildProc, pidfd_open};
use super::keeper::Kept as KeptSpawn;
use super::keeper::{exec_wrapper, spawn_kept};
use super::kept::{Keeping, KeptFiles, Release};
use super::kill::{self, POLL_INTERVAL};
use super::output::{Stream, Tail, keep_read_buffer, read_buffer};
use super::pidfd::{self, Held};
use super::proc;
use super::spawn::{BaseEnv, Command, Spawned, spawn, spawn_wrapped};
use super::stop::{StopHandle, StopReason};
use crate::files::{self, Ended};
use crate::manners::Limits;

/// If a pidfd cannot be had, the loop falls back to checking the child this
/// often, which is the only periodic wake-up in that (unexpected) case.
const NO_PIDFD_INTERVAL: Duration = Duration::from_millis(50);

/// How long after the spawn the main process's pidfd is opened, if its
/// pipes are still open by then (see `Supervisor::pidfd_due`); until then the
/// loop wakes on output and checks for the exit after each wake-up.
const LAZY_PIDFD: Duration = Duration::from_millis(10);

/// How long a group member that closed the attempt's pipes is given to finish exiting.
const EXITING_MEMBER_WAIT: Duration = Duration::from_millis(50);

/// What to run for one attempt and the limits to enforce on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AttemptSpec {
    /// The command; `argv[0]` is the program. Must not be empty.
    pub argv: Vec<String>,
    /// Variables added to the runner's environment.
    pub env: Vec<(String, String)>,
    /// The runner's environment, which the attempt's starts from.
    pub base_env: Arc<BaseEnv>,
    /// Working directory; the runner's if `None`.
    pub cwd: Option<PathBuf>,
    /// Exported to the attempt as `LEASEHOLD_JOB_ID`.
    pub job_id: i64,
    /// The attempt number (it names the attempt's folder of files).
    pub attempt: i64,
    /// Exported to the attempt as `LEASEHOLD_RUN_TOKEN`; it is how processes
    /// that leave the attempt's process group are still found.
    pub run_token: String,
    /// Run the command under a keeper that writes its output and outcome to these files,
    /// and outlives the runner; `None`: the runner is the command's parent and reads its
    /// output from pipes.
    pub files: Option<KeptFiles>,
    /// Wall-clock bound on the attempt.
    pub timeout: Option<Duration>,
    /// Kill the attempt when neither stdout nor stderr produced output for
    /// this long.
    pub idle_timeout: Option<Duration>,
    /// Time between SIGTERM to the group and SIGKILL.
    pub kill_grace: Duration,
    /// How long to keep reading the pipes after the main process exits.
    pub drain: Duration,
    /// How many trailing bytes of each stream to keep.
    pub tail_bytes: usize,
    /// The job's manners and caps, the runner's manners filled in.
    pub limits: Limits,
}

impl AttemptSpec {
    /// What [`spawn`] starts: the command part of the spec.
    fn command(&self) -> Command<'_> {
        Command {
            argv: &self.argv,
            env: &self.env,
            base_env: &self.base_env,
            cwd: self.cwd.as_deref(),
            job_id: self.job_id,
            run_token: &self.run_token,
            fence: self.files.as_ref().and_then(|f| f.fence),
            limits: self.limits,
        }
    }
}

/// Identifies a spawned attempt; passed to `on_started` so the caller can
/// record it (it is what a later [`teardown`](super::teardown::teardown)
/// verifies against).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Started {
    /// The main process's pid.
    pub pid: i32,
    /// The attempt's process group; equal to `pid`.
    pub pgid: i32,
    /// The main process's start time, in clock ticks since boot.
    pub start_time: u64,
    /// The keeper's pid and start time, when the command runs under one.
    pub keeper: Option<(i32, u64)>,
}

/// How an attempt's processes ended, as its supervisor saw them. Not the store's
/// [`Ending`](crate::store::Ending), which is what is recorded: the worker maps one to the
/// other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Exit {
    /// The main process exited with this code (-1 in the should-not-happen
    /// case that its status was lost: reaped by someone else).
    Exited(i32),
    /// The main process was killed by this signal (not sent by us).
    Signaled(i32),
    /// Killed because it ran longer than this timeout.
    TimedOut(Duration),
    /// Killed because it produced no output for this long.
    IdleTimedOut(Duration),
    /// Killed because [`StopHandle::stop`] was called.
    Stopped(StopReason),
    /// Could not be started; the OS reason and what failed.
    SpawnFailed(String),
    /// Could not be started for want of descriptors, processes or memory:
    /// the runner's fault, not the job's.
    NoResources(String),
    /// The attempt's keeper died before it reported the command's end: what was left of the
    /// attempt was killed, and how the command ended is unknown.
    KeeperLost,
}

/// A process of the attempt still alive after the main process exited (or
/// outside its group), which was killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Leak {
    /// The leaked process.
    pub pid: i32,
    /// Whether it had left the attempt's process group (found by run token).
    pub escaped_group: bool,
}

/// Everything [`run`] learned about an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AttemptResult {
    /// How it ended.
    pub exit: Exit,
    /// The tail of its stdout.
    pub stdout: Tail,
    /// The tail of its stderr.
    pub stderr: Tail,
    /// Processes that outlived the main process, or escaped its group, and
    /// were killed.
    pub leaked: Vec<Leak>,
    /// Wall time from spawn to the end of supervision.
    pub duration: Duration,
    /// For an attempt kept by the keeper: what lets it go once its ending is committed
    /// (dropped unreleased, the keeper journals the outcome as if the runner were gone).
    pub release: Option<Release>,
    /// It had a memory cap and failed for it (see [`memory_exceeded`]).
    pub memory_exceeded: bool,
}

/// Converts a wait into a poll timeout, rounding up so that poll does not
/// return just before a deadline and make the loop spin until it passes.
pub(super) fn poll_timeout(wait: Option<Duration>) -> PollTimeout {
    match wait {
        None => PollTimeout::NONE,
        Some(d) => {
            let ms = d.as_nanos().div_ceil(1_000_000);
            i32::try_from(ms)
                .ok()
                .and_then(|ms| PollTimeout::try_from(ms).ok())
                .unwrap_or(PollTimeout::MAX)
        }
    }
}

/// The earliest of some optional deadlines.
fn earliest(deadlines: &[Option<Instant>]) -> Option<Instant> {
    deadlines.iter().flatten().min().copied()
}

/// What one `poll` wake-up slot watches.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// The stdout pipe.
    Stdout,
    /// The stderr pipe.
    Stderr,
    /// The main process's pidfd.
    Exit,
    /// The stop handle's wake-up eventfd.
    Stop,
    /// The keeper's control socket.
    Keeper,
}

/// The state of one running attempt.
struct Supervisor<'a> {
    /// What is being run.
    spec: &'a AttemptSpec,
    /// Stop requests.
    stop: &'a StopHandle,
    /// The main process, when the runner spawned it itself; `None` once reaped, only when
    /// the attempt is over (or if someone else reaped it), and for a kept attempt.
    child: Option<ChildProc>,
    /// The keeper, for an attempt run under one; `None` once released.
    kept: Option<Keeping>,
    /// What releases a kept attempt to its keeper once its ending is committed.
    release: Option<Release>,
    /// Whether the main process has exited; it is left a zombie, unreaped,
    /// so that its pid (the group's id) cannot be reused while the group may
    /// still be signalled.
    exited: bool,
    /// The main process's exit status, once reaped.
    status: Option<ExitStatus>,
    /// The main process's start time: members found in its group after it
    /// was lost to someone else's reap must be no older.
    start_time: u64,
    /// The main process's pid, which is also the attempt's process group.
    pgid: i32,
    /// Readable when the main process exits; `None` once reaped (or if the
    /// kernel refused one), and until it is opened (see `pidfd_due`).
    pidfd: Option<OwnedFd>,
    /// When to open the pidfd, if it is not open yet: most jobs of a stream
    /// of short ones have exited and closed their pipes by then, and are
    /// reaped without one (a pidfd costs the kernel a file of its own).
    pidfd_due: Option<Instant>,
    /// The stdout pipe and tail.
    out: Stream,
    /// The stderr pipe and tail.
    err: Stream,
    /// When output was last seen (or the spawn), for the idle timeout.
    last_output: Instant,
    /// When the attempt was spawned.
    spawned: Instant,
    /// Scratch buffer for reads.
    buf: Vec<u8>,
}

impl Supervisor<'_> {
    /// Whether the main process still runs: not exited, not lost.
    fn running(&self) -> bool {
        (self.child.is_some() || self.kept.as_ref().is_some_and(|k| !k.lost)) && !self.exited
    }

    /// Whether the main process is held unreaped (by the runner, or by a keeper that still
    /// answers), so that its pid and process group id are provably the attempt's.
    fn held(&self) -> bool {
        self.child.is_some() || self.kept.as_ref().is_some_and(|k| !k.lost)
    }

    /// Whether either pipe is still open.
    fn pipes_open(&self) -> bool {
        self.out.pipe.is_some() || self.err.pipe.is_some()
    }

    /// Waits (at most `wait`, or forever if `None`) for output, the main
    /// process's exit or, with `watch_stop`, a stop request; then reads the
    /// output and reaps the main process if it exited. Callers check the
    /// stop handle and their deadlines themselves.
    fn pump(&mut self, wait: Option<Duration>, watch_stop: bool) {
        let mut wait = wait;
        if self.child.is_some()
            && self.running()
            && self.pidfd.is_none()
            && let Some(due) = self.pidfd_due
            // With its pipes closed, only a pidfd tells the exit without a poll.
            && (!self.pipes_open() || Instant::now() >= due)
        {
            self.open_pidfd();
        }
        if self.child.is_some() && self.running() && self.pidfd.is_none() {
            let cap = match self.pidfd_due {
                Some(due) => due.saturating_duration_since(Instant::now()),
                None => NO_PIDFD_INTERVAL,
            };
            wait = Some(wait.map_or(cap, |w| w.min(cap)));
        }
        let mut ready = [false; 5];
        let mut slots = [Slot::Stop; 5];
        let mut fds = Vec::with_capacity(5);
        let candidates = [
            (Slot::Stdout, self.out.pipe.as_ref().map(AsFd::as_fd)),
            (Slot::Stderr, self.err.pipe.as_ref().map(AsFd::as_fd)),
            (Slot::Exit, self.pidfd.as_ref().map(AsFd::as_fd)),
            (Slot::Stop, watch_stop.then(|| self.stop.wake())),
            (
                Slot::Keeper,
                self.kept.as_ref().and_then(Keeping::control_fd),
            ),
        ];
        for (slot, fd) in candidates {
            if let Some(fd) = fd {
                slots[fds.len()] = slot;
                fds.push(PollFd::new(fd, PollFlags::POLLIN));
            }
        }
        match poll(&mut fds, poll_timeout(wait)) {
            Ok(_) => {
                let wake = PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR;
                for (i, fd) in fds.iter().enumerate() {
                    // POLLNVAL cannot happen: every fd is owned by us and open.
                    ready[i] = fd.revents().is_some_and(|r| r.intersects(wake));
                }
            }
            Err(Errno::EINTR) => {}
            Err(e) => {
                // poll only fails for EINVAL/ENOMEM/EFAULT; sleep rather than
                // spin, and let the callers' deadlines move things on.
                log::error!("poll failed: {e}");
                std::thread::sleep(wait.unwrap_or(POLL_INTERVAL).min(POLL_INTERVAL));
            }
        }
        let n = fds.len();
        drop(fds);
        for (slot, _) in slots.iter().zip(ready).take(n).filter(|(_, r)| *r) {
            match slot {
                Slot::Stdout => {
                    if self.out.read_available(&mut self.buf) {
                        self.last_output = Instant::now();
                    }
                }
                Slot::Stderr => {
                    if self.err.read_available(&mut self.buf) {
                        self.last_output = Instant::now();
                    }
                }
                Slot::Exit => self.check_exit(),
                Slot::Stop => {}
                Slot::Keeper => self.read_keeper(),
            }
        }
        if self.pidfd.is_none() {
            self.check_exit();
        }
    }

    /// Reads the keeper's messages: the command's end, or the keeper's loss.
    fn read_keeper(&mut self) {
        let Some(kept) = &mut self.kept else {
            return;
        };
        kept.read();
        if kept.ended.is_some() {
            self.exited = true;
        } else if kept.lost {
            log::error!(
                "job {} attempt {}: its keeper pid {} went away before its command ended",
                self.spec.job_id,
                self.spec.attempt,
                kept.pid()
            );
        }
    }

    /// Opens the main process's pidfd (it is not reaped, so its pid is still
    /// its own, if a zombie); without one, the loop checks it periodically.
    fn open_pidfd(&mut self) {
        self.pidfd_due = None;
        let pid = self.pgid;
        self.pidfd = pidfd_open(pid)
            .inspect_err(|e| {
                log::warn!("pidfd_open({pid}): {e}; falling back to periodic checks");
            })
            .ok();
    }

    /// Notes whether the main process has exited, leaving it unreaped (see
    /// `exited`).
    fn check_exit(&mut self) {
        if self.exited {
            return;
        }
        let Some(child) = &mut self.child else {
            return;
        };
        match child.exited() {
            Ok(true) => self.exited = true,
            Ok(false) => return,
            Err(e) => {
                // Only ECHILD is possible: someone else reaped it (e.g.
                // SIGCHLD set to SIG_IGN elsewhere in the process). It is gone,
                // its status is lost, and its group id is no longer ours.
                log::error!("waiting for attempt pid {}: {e}", self.pgid);
                self.child = None;
            }
        }
        // An exited process's pidfd stays readable: polling it would spin.
        self.pidfd = None;
    }

    /// Reaps the main process once it has exited: the attempt is over, so its
    /// group is no longer signalled. A keeper is released (`release` on its
    /// socket: the ending is the runner's to record now, so it flushes
    /// nothing), and reaps it.
    fn reap_leader(&mut self, whole: bool) {
        if !self.exited && !self.kept.as_ref().is_some_and(|k| k.lost) {
            return;
        }
        if let Some(kept) = self.kept.take() {
            self.release = Some(kept.release(whole));
            return;
        }
        if let Some(mut child) = self.child.take() {
            match child.reap() {
                Ok(status) => self.status = Some(status),
                Err(e) => log::error!("reaping attempt pid {}: {e}", self.pgid),
            }
        }
    }

    /// The ending for a main process that exited by itself.
    fn exit(&self) -> Exit {
        if let Some(kept) = &self.kept {
            return match kept.ended {
                Some(Ended::Exited(code)) => Exit::Exited(code),
                Some(Ended::Signaled(sig)) => Exit::Signaled(sig),
                None => Exit::KeeperLost,
            };
        }
        match self.status {
            Some(s) => match (s.code(), s.signal()) {
                (Some(code), _) => Exit::Exited(code),
                (None, Some(sig)) => Exit::Signaled(sig),
                // A reaped (not stopped/continued) status is always one of the
                // two; keep something recognisable if it is not.
                (None, None) => Exit::Exited(-1),
            },
            // The status was lost (see `reap`).
            None => Exit::Exited(-1),
        }
    }

    /// Runs the attempt until it ends by itself or must be killed.
    fn supervise(&mut self) -> (Exit, Vec<Leak>) {
        let spec = self.spec;
        let deadline = spec.timeout.and_then(|t| self.spawned.checked_add(t));
        while self.running() {
            if let Some(reason) = self.stop.reason() {
                if reason == StopReason::Leave
                    && let Some(kept) = self.kept.take()
                {
                    // The keeper runs the attempt on, and the next runner adopts it.
                    kept.leave();
                    self.exited = true;
                    return (Exit::Stopped(reason), Vec::new());
                }
                return (Exit::Stopped(reason), self.terminate(false, true));
            }
            let now = Instant::now();
            if let (Some(d), Some(t)) = (deadline, spec.timeout)
                && now >= d
            {
                return (Exit::TimedOut(t), self.terminate(false, true));
            }
            let mut idle_deadline = spec
                .idle_timeout
                .and_then(|i| self.last_output.checked_add(i));
            if let (Some(d), Some(kept)) = (idle_deadline, &mut self.kept)
                && now >= d
                && let Some(age) = kept.files().new_change_age()
            {
                // A kept attempt with an idle timeout has its output go to files from its
                // first byte: their change times say when.
                self.last_output = self.last_output.max(now.checked_sub(age).unwrap_or(now));
                idle_deadline = spec
                    .idle_timeout
                    .and_then(|i| self.last_output.checked_add(i));
            }
            if let (Some(d), Some(i)) = (idle_deadline, spec.idle_timeout)
                && now >= d
            {
                return (Exit::IdleTimedOut(i), self.terminate(false, true));
            }
            let wait = earliest(&[deadline, idle_deadline]).map(|d| d - now);
            self.pump(wait, true);
        }
        if self.kept.as_ref().is_some_and(|k| k.lost) {
            // Nothing holds the command any more: what is left of the attempt is found by
            // its group's members no older than it and by its token, through verified pidfds.
            return (Exit::KeeperLost, self.terminate(true, true));
        }
        let leaks = self.drain();
        if self.kept.is_none() {
            self.reap_leader(false);
        }
        (self.exit(), leaks)
    }

    /// After the main process exited by itself: read the pipes until EOF for
    /// at most `drain`, then kill whatever of the attempt is left.
    fn drain(&mut self) -> Vec<Leak> {
        if let Some(kept) = &self.kept {
            // The keeper drained the pipes itself before it reported the end, and knows
            // whether anything of the attempt is left alive.
            return if kept.pipes_open {
                self.terminate(true, true)
            } else if kept.alone {
                Vec::new()
            } else if self.group_lingers() {
                self.terminate(true, false)
            } else {
                Vec::new()
            };
        }
        let deadline = Instant::now().checked_add(self.spec.drain);
        while self.pipes_open() && self.stop.reason().is_none() {
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                break;
            }
            self.pump(deadline.map(|d| d - now), true);
        }
        if self.pipes_open() {
            // Someone still holds the pipes: descendants, possibly outside
            // the group, so the (costly) token scan is warranted.
            self.terminate(true, true)
        } else if self.group_lingers() {
            self.terminate(true, false)
        } else {
            Vec::new()
        }
    }

    /// Whether a member of the attempt's group is still alive once its pipes are closed. A
    /// process closes its descriptors on its way out, a moment before /proc shows it exited:
    /// a member that closed the pipes by exiting is given [`EXITING_MEMBER_WAIT`] to finish,
    /// rather than be killed and recorded as a leak.
    fn group_lingers(&self) -> bool {
        let deadline = Instant::now() + EXITING_MEMBER_WAIT;
        while proc::group_has_live_members(self.pgid) {
            if Instant::now() >= deadline {
                return true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        false
    }

    /// Whether the main process is reaped, the group has no live member and
    /// none of `escaped` is alive.
    fn all_gone(&self, escaped: &BTreeMap<i32, Held>) -> bool {
        !self.running()
            && !self.group_alive()
            && escaped.values().all(Held::exited)
            && !self.cgroup().is_some_and(cgroup::populated)
    }

    /// The attempt's cgroup, in the cgroup mode.
    fn cgroup(&self) -> Option<&std::path::Path> {
        self.kept.as_ref().and_then(|k| k.cgroup.as_deref())
    }

    /// Whether the attempt's group has a live member: with the main process
    /// held unreaped, the group is the attempt's; once lost to someone else's
    /// reap, only members no older than the attempt count.
    fn group_alive(&self) -> bool {
        if self.held() {
            proc::group_has_live_members(self.pgid)
        } else {
            proc::group_members(self.pgid)
                .iter()
                .any(|m| m.start_time >= self.start_time)
        }
    }

    /// Signals the group and, with `scan_token`, every process carrying the
    /// run token outside it; records those outside the group as leaks (all of
    /// them with `record_group`, used once the main process has exited).
    ///
    /// The group is signalled by its id only while the main process, its
    /// leader, is held unreaped: the id is then provably the attempt's. Every
    /// other process (token carriers outside the group, members of a group
    /// whose leader someone else reaped) is held by a pidfd, verified against
    /// its start time, before its first signal, and signalled only through it.
    fn signal_all(
        &self,
        sig: Signal,
        record_group: bool,
        scan_token: bool,
        leaks: &mut BTreeMap<i32, bool>,
        held: &mut BTreeMap<i32, Held>,
    ) {
        let pgid = self.pgid;
        if record_group {
            for m in proc::group_members(pgid) {
                leaks.insert(m.pid, false);
            }
        }
        if self.held() {
            if let Err(e) = kill::signal_group(pgid, sig) {
                log::error!("{sig} to process group {pgid}: {e}");
            }
        } else {
            for m in proc::group_members(pgid) {
                if m.start_time >= self.start_time && !held.contains_key(&m.pid) {
                    if let Some(h) = Held::open(&m) {
                        held.insert(m.pid, h);
                    }
                } else if m.start_time < self.start_time {
                    pidfd::refuse("pid", m.pid, "older than the attempt whose group id it has");
                }
            }
        }
        if let Some(cg) = self.cgroup() {
            // Every process in the attempt's cgroup is the attempt's, whatever it did to its
            // group, session or environment: each is held by a pidfd like a token carrier.
            for pid in cgroup::members(cg) {
                let Some(p) = proc::proc_info(pid) else {
                    continue;
                };
                let in_group = p.pgid == pgid && self.held();
                if record_group || !in_group {
                    leaks.insert(p.pid, p.pgid != pgid);
                }
                if !in_group
                    && !held.contains_key(&p.pid)
                    && let Some(h) = Held::open(&p)
                {
                    held.insert(p.pid, h);
                }
            }
            if sig == Signal::SIGKILL
                && let Err(e) = cgroup::kill(cg)
            {
                log::error!("SIGKILL to cgroup {}: {e}", cg.display());
            }
        }
        if scan_token {
            for p in proc::processes_with_token(&self.spec.run_token) {
                if p.pgid == pgid && self.held() {
                    // Already signalled with the group.
                    if record_group {
                        leaks.insert(p.pid, false);
                    }
                    continue;
                }
                if !held.contains_key(&p.pid)
                    && let Some(h) = Held::open(&p)
                {
                    held.insert(p.pid, h);
                }
                leaks.insert(p.pid, p.pgid != pgid);
            }
        }
        for h in held.values() {
            if let Err(e) = h.signal(sig) {
                log::error!("{sig} to pid {}: {e}", h.pid);
            }
        }
    }

    /// Kills what is left of the attempt with the kill sequence: SIGTERM to
    /// the group (and escaped token carriers with `scan_token`), SIGKILL after
    /// `kill_grace` while anything is still alive, then a bounded wait until
    /// it is all gone and the main process is reaped. Output is read
    /// throughout. Closes the pipes. Returns the leaks (see
    /// [`Self::signal_all`]).
    fn terminate(&mut self, record_group: bool, scan_token: bool) -> Vec<Leak> {
        let grace = self.spec.kill_grace;
        let mut termination = Termination {
            sup: self,
            record_group,
            scan_token,
            leaks: BTreeMap::new(),
            held: BTreeMap::new(),
        };
        kill::kill_all(&mut termination, grace);
        let leaks = termination.leaks;
        if self.running()
            && let Some(child) = self.child.take()
        {
            // Stuck in uninterruptible sleep even after SIGKILL: dropping it
            // lets a thread reap it whenever it dies rather than leave a
            // zombie.
            log::error!(
                "attempt pid {} did not die after SIGKILL; reaping it in the background",
                child.pid
            );
            drop(child);
            self.pidfd = None;
        }
        // Whatever the dead writers left in the pipes; a pipe still held by a
        // survivor reports EAGAIN and is closed anyway. (A blocking pipe could
        // block here, so it is read only after poll says it is ready.)
        for stream in [&mut self.out, &mut self.err] {
            if stream.nonblocking {
                stream.read_available(&mut self.buf);
            }
        }
        self.out.pipe = None;
        self.err.pipe = None;
        leaks
            .into_iter()
            .map(|(pid, escaped_group)| Leak { pid, escaped_group })
            .collect()
    }
}

/// The supervisor's side of the kill sequence: the attempt's group, the
/// token carriers that escaped it and the main process, with output read and
/// the main process reaped while the sequence waits.
struct Termination<'s, 'a> {
    /// The attempt's supervisor.
    sup: &'s mut Supervisor<'a>,
    /// Whether the group's members are recorded as leaks too (escaped token
    /// carriers always are).
    record_group: bool,
    /// Whether token carriers outside the group are looked for.
    scan_token: bool,
    /// Every process found, and whether it had left the group.
    leaks: BTreeMap<i32, bool>,
    /// The processes signalled one by one, held by verified pidfds: token
    /// carriers outside the group (and the group's members, once its leader
    /// was lost to someone else's reap).
    held: BTreeMap<i32, Held>,
}

impl kill::Targets for Termination<'_, '_> {
    fn signal(&mut self, sig: Signal) {
        self.sup.signal_all(
            sig,
            self.record_group,
            self.scan_token,
            &mut self.leaks,
            &mut self.held,
        );
        if sig == Signal::SIGKILL && self.sup.running() {
            // The main process may have moved itself out of the group.
            if let Some(child) = &self.sup.child {
                child.kill();
            } else if self.sup.held()
                && let Err(e) = kill::signal_pid(self.sup.pgid, Signal::SIGKILL)
            {
                log::error!("SIGKILL to attempt pid {}: {e}", self.sup.pgid);
            }
        }
    }

    fn gone(&mut self) -> bool {
        self.sup.all_gone(&self.held)
    }

    fn pause(&mut self, step: Duration) {
        self.sup.pump(Some(step), false);
    }
}

/// Runs one attempt of `spec` to its end; see the module documentation.
///
/// `on_started` is called right after a successful spawn, before any waiting,
/// so the caller can record the attempt's identity. When this returns, no
/// process of the attempt is alive (barring one stuck in uninterruptible
/// sleep, which is logged) and the main process has been reaped, or, under a
/// keeper, released to its keeper, which reaps it at once (the runner no
/// longer signals its group).
pub(crate) fn run(
    spec: &AttemptSpec,
    stop: &StopHandle,
    on_started: impl FnOnce(&Started),
) -> AttemptResult {
    let spawned = Instant::now();
    let unstarted = |exit| AttemptResult {
        exit,
        stdout: Tail::default(),
        stderr: Tail::default(),
        leaked: Vec::new(),
        duration: spawned.elapsed(),
        release: None,
        memory_exceeded: false,
    };
    let Some(program) = spec.argv.first() else {
        return unstarted(Exit::SpawnFailed(
            "spawn: empty command line (no program to run)".to_owned(),
        ));
    };
    if let Some(reason) = stop.reason() {
        return unstarted(Exit::Stopped(reason));
    }

    let started = match &spec.files {
        None if needs_wrapper(&spec.limits) => match exec_wrapper(&spec.limits) {
            Some(wrapper) => {
                spawn_wrapped(&spec.command(), program, Some(wrapper)).map(Leader::Direct)
            }
            None => {
                return unstarted(Exit::SpawnFailed(format!(
                    "spawn {program:?}: its nice, I/O class, memory or process cap needs the \
                     keeper's program in memory (memfd), which this process cannot run"
                )));
            }
        },
        None => spawn(&spec.command(), program).map(Leader::Direct),
        Some(kept) => {
            let dir = files::attempt_dir(&kept.folder, spec.job_id, spec.attempt, &spec.run_token);
            // An idle timeout reads the files' change times: such output goes to files at once.
            let mem = match spec.idle_timeout {
                Some(_) => 0,
                None => u64::try_from(spec.tail_bytes).unwrap_or(u64::MAX),
            };
            spawn_kept(&spec.command(), program, &dir, (kept.cap, mem), spec.drain)
                .map(|k| Leader::Kept(k, dir))
        }
    };
    let leader = match started {
        Ok(leader) => leader,
        Err(e) if e.resources => return unstarted(Exit::NoResources(e.message)),
        Err(e) => return unstarted(Exit::SpawnFailed(e.message)),
    };
    let (child, kept, pipes, pid, start_time, keeper) = match leader {
        Leader::Direct(Spawned {
            child,
            stdout,
            stderr,
            start_time,
        }) => {
            let pid = child.pid;
            (
                Some(child),
                None,
                Some((stdout, stderr)),
                pid,
                start_time,
                None,
            )
        }
        Leader::Kept(
            KeptSpawn {
                keeper,
                keeper_start_time,
                control,
                pid,
                cgroup,
            },
            dir,
        ) => {
            let keeper_id = keeper_start_time.map(|t| (keeper, t));
            let kept = Keeping::new(keeper, control, dir, cgroup);
            (None, Some(kept), None, pid, None, keeper_id)
        }
    };
    // Known from the boot clock around the spawn, nearly always; otherwise
    // read: the child is not reaped yet (by us, or by its keeper), so /proc/PID exists
    // (possibly as a zombie); only an unreadable /proc could leave this unknown.
    let start_time = start_time
        .or_else(|| proc::start_time(pid))
        .unwrap_or_else(|| {
            log::error!("cannot read the start time of attempt pid {pid}");
            0
        });
    // A keeper whose start time the boot clock could not pin is read the same way.
    let keeper = keeper.or_else(|| {
        let k = kept.as_ref()?.pid();
        Some((k, proc::start_time(k)?))
    });
    on_started(&Started {
        pid,
        pgid: pid,
        start_time,
        keeper,
    });

    let (out, err) = match pipes {
        Some((stdout, stderr)) => (
            Stream::new(stdout, spec.tail_bytes),
            Stream::new(stderr, spec.tail_bytes),
        ),
        None => (
            Stream::closed(spec.tail_bytes),
            Stream::closed(spec.tail_bytes),
        ),
    };
    let direct = child.is_some();
    let mut sup = Supervisor {
        spec,
        stop,
        child,
        kept,
        release: None,
        exited: false,
        status: None,
        start_time,
        pgid: pid,
        pidfd: None,
        pidfd_due: if direct {
            spawned.checked_add(LAZY_PIDFD)
        } else {
            None
        },
        out,
        err,
        last_output: spawned,
        spawned,
        buf: read_buffer(),
    };
    // The keeper may have sent the command's end along with its start, read already: what is
    // buffered wakes no poll.
    sup.read_keeper();
    let (exit, leaked) = sup.supervise();
    // A kept attempt's output came with its end, or is in its files, complete once the
    // keeper reported the end and whatever was left of the attempt was killed.
    let tails = sup.kept.as_ref().map(|k| k.tails(spec.tail_bytes));
    let whole = tails
        .as_ref()
        .is_some_and(|(out, err)| !out.truncated && !err.truncated);
    // Killed or stopped: the main process exited during the kill sequence and
    // is reaped only now, its group being empty. A kept one is released to its keeper
    // once the caller committed its ending.
    sup.reap_leader(whole);
    keep_read_buffer(mem::take(&mut sup.buf));
    let cgroup = sup.cgroup().map(std::path::Path::to_path_buf);
    let (stdout, stderr) = match tails {
        Some(tails) => tails,
        None => (sup.out.tail.finish(), sup.err.tail.finish()),
    };
    // Read before the release: the keeper removes the attempt's cgroup once released.
    let failed = matches!(exit, Exit::Exited(c) if c != 0) || matches!(exit, Exit::Signaled(_));
    let memory_exceeded = failed
        && spec.limits.memory_max.is_some()
        && memory_exceeded(cgroup.as_deref(), &stderr.bytes);
    AttemptResult {
        memory_exceeded,
        exit,
        stdout,
        stderr,
        leaked,
        duration: spawned.elapsed(),
        release: sup.release.take(),
    }
}

/// What a spawn started: the command itself, or its keeper.
enum Leader {
    /// The runner is the command's parent.
    Direct(Spawned),
    /// A keeper is, with the attempt's folder.
    Kept(KeptSpawn, std::path::PathBuf),
}

#[cfg(test)]
mod tests;
