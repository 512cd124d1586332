//! The state the runner's threads share. The threads import this file and never each other.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, bounded, unbounded};
use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};
use crate::process::{BaseEnv, LiveKeeper, StopHandle, StopReason};
use crate::store::{AttemptStart, Claimed, Ending, Finish, KeptAttempt};

use super::builder::Config;

/// One attempt this runner is running, by its run token.
pub(crate) struct Running {
    pub job_id: i64,
    /// Its queue: what the runner's own queue limits count.
    pub queue: String,
    pub stop: StopHandle,
    /// When its lease runs out, as last written (wall clock, ms).
    pub lease_expires_at: i64,
    /// How the heartbeat moves the keeper's lease fence at each renewal (on PostgreSQL,
    /// with keepers; see [`Shared::fences`]).
    pub fence: Fence,
    /// What releases the attempt's command to the keeper once its ending is committed.
    pub release: Option<crate::process::Release>,
    /// The conditions whose loss stops it (its `when` conditions when its `when_lost` is
    /// `stop`, else none; none for an adopted attempt).
    pub stop_when_lost: u32,
}

/// How a renewal reaches the keeper's lease fence of an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fence {
    /// No fence: on SQLite, without keepers, or left running on purpose.
    None,
    /// A message to this process's keeper, which started the attempt.
    Keeper,
    /// The lease file in the attempt's folder, for an adopted attempt (its keeper reads it
    /// once its own runner is gone).
    File(std::path::PathBuf),
}

/// The state the runner's threads share.
pub(crate) struct Shared {
    pub config: Config,
    pub worker_id: String,
    /// Where kept attempts write their files: `<db>-attempts` (`files::folder`).
    pub attempts_folder: std::path::PathBuf,
    /// Attempts adopted by a sweep whose threads have not started yet (the runner's first
    /// sweep runs before its writer exists), each with the monotonic clock when its adoption
    /// was committed, from which its age ([`KeptAttempt::age`]) counts on.
    pub adopted: Mutex<Vec<(KeptAttempt, LiveKeeper, Instant)>>,
    /// The threads following adopted attempts, for the shutdown to join.
    pub adopters: Mutex<Vec<std::thread::JoinHandle<()>>>,
    pub running: Mutex<HashMap<String, Running>>,
    pub shutting_down: AtomicBool,
    /// Workers not running an attempt.
    pub idle_workers: AtomicUsize,
    /// Attempts ended by this runner's workers since it started.
    pub endings_total: AtomicU64,
    /// How long the writer's commits take, in nanoseconds: the slowest recent one, decaying.
    pub commit_nanos: AtomicU64,
    /// How long the heartbeat's last successful renewal took, in nanoseconds (0 before the
    /// first); read by [`Runner::metrics`](crate::Runner::metrics).
    pub renew_nanos: AtomicU64,
    /// The dispatcher refills the work queue once it holds this many jobs or fewer: a worker
    /// that finds more queued need not wake it.
    pub refill_at: AtomicUsize,
    /// The dispatcher's last claim took fewer jobs than it asked for: the writer wakes it
    /// once an ending is committed, which may let it take more.
    pub claim_short: AtomicBool,
    /// When the next claimable job that was not due at the last claim becomes due (wall
    /// clock, ms; `i64::MAX` for none): the dispatcher sleeps no longer than that.
    next_due: AtomicI64,
    /// Wakes the dispatcher (an enqueue, a free worker, shutdown).
    wake: (Mutex<bool>, Condvar),
    /// The conditions that do not hold now, as the condition thread last saw them
    /// ([`Condition`](crate::Condition)'s bits): a claim leaves out the jobs that need one.
    /// All of them until its first look.
    unheld: AtomicU32,
    /// The conditions whose loss stopped each attempt (by run token), for its history.
    pub lost_conditions: Mutex<HashMap<String, u32>>,
    /// Bumped whenever an ending is committed or observed; waiters block on it.
    endings: (Mutex<u64>, Condvar),
    pub counters: Mutex<SweepCounters>,
    /// The first fatal fault of one of the runner's threads: once set, the runner has fenced
    /// itself and refuses every request.
    fault: Mutex<Option<(&'static str, String)>>,
    /// What SQLite said when a thread found the database file damaged: the runner stopped
    /// at once ([`Shared::stop_if_damaged`]).
    damage: Mutex<Option<String>>,
    /// Endings that could not be handed to the writer (it had failed): the runner records
    /// them itself when it shuts down.
    pub unwritten: Mutex<Vec<Finish>>,
    /// A panic to inject into a named thread, for the tests of the fault handling, and the
    /// file whose appearance it waits for first, if any.
    #[cfg(test)]
    pub(super) inject_panic: Mutex<Option<(&'static str, Option<std::path::PathBuf>)>>,
    /// The environment attempts start from: the process's, taken once when the runner
    /// starts (it is not expected to change while the runner runs), so that a spawn does not
    /// read and convert it again.
    pub base_env: Arc<BaseEnv>,
}

impl Shared {
    pub(crate) fn new(config: Config, worker_id: String) -> Shared {
        Shared {
            attempts_folder: crate::files::folder(&config.path),
            adopted: Mutex::new(Vec::new()),
            adopters: Mutex::new(Vec::new()),
            worker_id,
            running: Mutex::new(HashMap::new()),
            shutting_down: AtomicBool::new(false),
            idle_workers: AtomicUsize::new(config.workers),
            endings_total: AtomicU64::new(0),
            commit_nanos: AtomicU64::new(0),
            renew_nanos: AtomicU64::new(0),
            refill_at: AtomicUsize::new(0),
            claim_short: AtomicBool::new(false),
            next_due: AtomicI64::new(i64::MAX),
            wake: (Mutex::new(false), Condvar::new()),
            unheld: AtomicU32::new(crate::condition::ALL_CONDITIONS),
            lost_conditions: Mutex::new(HashMap::new()),
            endings: (Mutex::new(0), Condvar::new()),
            counters: Mutex::new(SweepCounters::default()),
            fault: Mutex::new(None),
            damage: Mutex::new(None),
            unwritten: Mutex::new(Vec::new()),
            #[cfg(test)]
            inject_panic: Mutex::new(None),
            base_env: Arc::new(BaseEnv::current()),
            config,
        }
    }

    /// The conditions that do not hold now (see [`Shared::set_unheld`]).
    pub(crate) fn unheld(&self) -> u32 {
        self.unheld.load(Ordering::SeqCst)
    }

    /// Records what the condition thread saw: wakes the dispatcher when a condition came to
    /// hold (jobs may be claimable now), and stops each running attempt that must stop when
    /// one it needs no longer holds. Returns how many it stopped.
    pub(crate) fn set_unheld(&self, unheld: u32) -> usize {
        let before = self.unheld.swap(unheld, Ordering::SeqCst);
        if before & !unheld != 0 {
            self.wake_dispatcher();
        }
        let mut stopped = 0;
        for (token, r) in self.running.lock().iter() {
            if r.stop_when_lost & unheld != 0 && r.stop.reason().is_none() {
                self.lost_conditions
                    .lock()
                    .insert(token.clone(), r.stop_when_lost & unheld);
                log::info!(
                    "job {}: a condition it needs stopped holding; stopping it (when_lost=stop)",
                    r.job_id
                );
                r.stop.stop(StopReason::ConditionLost);
                stopped += 1;
            }
        }
        stopped
    }

    pub(crate) fn wake_dispatcher(&self) {
        *self.wake.0.lock() = true;
        self.wake.1.notify_all();
    }

    /// Records when the next job not yet due becomes due, as the writer read it. Read
    /// without a claim (an ending scheduled a retry), a time earlier than the one the
    /// dispatcher may be sleeping towards wakes it, to sleep again with the new time; read
    /// with a claim, the dispatcher reads it once the claim's reply is in.
    pub(crate) fn set_next_due(&self, due: Option<i64>, with_claim: bool) {
        let due = due.unwrap_or(i64::MAX);
        let before = self.next_due.swap(due, Ordering::SeqCst);
        if !with_claim && due < before {
            self.wake_dispatcher();
        }
    }

    /// How long the dispatcher may sleep at `now` (wall clock, ms): the poll interval, or
    /// less when a job becomes due sooner. At least a millisecond: a job due by now is taken
    /// by the claim that follows, which reads the next time again.
    pub(crate) fn sleep_before_due(&self, poll: Duration, now: i64) -> Duration {
        let due = self.next_due.load(Ordering::SeqCst);
        if due == i64::MAX {
            return poll;
        }
        let ms = u64::try_from(due.saturating_sub(now)).unwrap_or(0).max(1);
        poll.min(Duration::from_millis(ms))
    }

    pub(crate) fn wait_for_wake(&self, timeout: Duration) {
        let mut woken = self.wake.0.lock();
        if !*woken {
            self.wake.1.wait_for(&mut woken, timeout);
        }
        *woken = false;
    }

    /// What this runner may still claim of each queue it limits: its limit less the jobs of
    /// that queue it holds (running, or claimed and waiting for a worker).
    pub(crate) fn queue_caps(&self) -> Vec<(String, u32)> {
        if self.config.queue_limits.is_empty() {
            return Vec::new();
        }
        let running = self.running.lock();
        self.config
            .queue_limits
            .iter()
            .map(|(q, limit)| {
                let held = running.values().filter(|r| r.queue == *q).count();
                let left = limit.saturating_sub(held);
                (q.clone(), u32::try_from(left).unwrap_or(u32::MAX))
            })
            .collect()
    }

    /// Registers the attempt under `token` with the runner, with a stop handle of its own:
    /// from now on the heartbeat renews its lease, and a lost lease, a cancel or a shutdown
    /// stops it.
    ///
    /// # Errors
    ///
    /// The stop handle's eventfd could not be made (out of descriptors).
    pub(crate) fn register(
        &self,
        token: &str,
        job_id: i64,
        queue: &str,
        lease_expires_at: i64,
        fence: Fence,
        stop_when_lost: u32,
    ) -> std::io::Result<()> {
        let stop = StopHandle::new()?;
        self.running.lock().insert(
            token.to_owned(),
            Running {
                job_id,
                queue: queue.to_owned(),
                stop,
                lease_expires_at,
                fence,
                release: None,
                stop_when_lost,
            },
        );
        Ok(())
    }

    /// Whether this runner's keepers stop their commands when its leases run out unrenewed
    /// (a lease file in each attempt's folder, see `keeper.c`): on PostgreSQL, where a runner
    /// on another host takes a job again on its lease's expiry alone, and cannot see the
    /// processes of a frozen or cut-off runner's attempt. On SQLite every runner of a file is
    /// on one host and waits until the attempt's processes are torn down where they are seen.
    pub(crate) fn fences(&self) -> bool {
        self.config.keepers && crate::store::pg::is_url(&self.config.path)
    }

    /// How an attempt this runner starts has its fence moved, when [`Shared::fences`].
    pub(crate) fn own_fence(&self) -> Fence {
        if self.fences() {
            Fence::Keeper
        } else {
            Fence::None
        }
    }

    /// How an attempt this runner adopted has its fence moved, when [`Shared::fences`]: by
    /// the lease file in its folder.
    pub(crate) fn adopted_fence(&self, job_id: i64, attempt: i64, token: &str) -> Fence {
        if self.fences() {
            Fence::File(crate::files::attempt_dir(
                &self.attempts_folder,
                job_id,
                attempt,
                token,
            ))
        } else {
            Fence::None
        }
    }

    /// The attempt under `token` has ended (its ending is committed, or given up on): it
    /// leaves the registry, and its command is released to the keeper.
    pub(crate) fn attempt_done(&self, token: &str) {
        let done = self.running.lock().remove(token);
        if let Some(release) = done.and_then(|r| r.release) {
            release.release();
        }
    }

    /// Keeps what releases the attempt under `token` to the keeper once its ending is
    /// committed ([`Shared::attempt_done`]).
    pub(crate) fn keep_release(&self, token: &str, release: crate::process::Release) {
        if let Some(r) = self.running.lock().get_mut(token) {
            r.release = Some(release);
        }
    }

    pub(crate) fn endings_changed(&self) {
        *self.endings.0.lock() += 1;
        self.endings.1.notify_all();
    }

    pub(crate) fn wait_for_endings(&self, seen: u64, timeout: Duration) -> u64 {
        let mut n = self.endings.0.lock();
        if *n == seen {
            self.endings.1.wait_for(&mut n, timeout);
        }
        *n
    }

    pub(crate) fn endings_seen(&self) -> u64 {
        *self.endings.0.lock()
    }

    /// A thread of the runner failed: the runner fences itself. It stops claiming, stops
    /// renewing leases, and stops every running attempt as a self-fence (its group is killed
    /// and the attempt recorded as lost, by the writer or, if the writer is what failed, by
    /// the runner when it shuts down). Only the first fault is kept.
    pub(crate) fn fail(&self, thread: &'static str, cause: String) {
        {
            let mut fault = self.fault.lock();
            if fault.is_some() {
                return;
            }
            log::error!(
                "runner {}: the {thread} thread failed: {cause}; fencing the runner: killing \
                 its running attempts and refusing further work",
                self.worker_id
            );
            *fault = Some((thread, cause));
        }
        self.stop_everything(StopReason::SelfFenced);
    }

    /// When `e` says that the database file is damaged ([`Error::Damaged`]): the runner
    /// stops at once, every thread, its attempts stopped as a shutdown stops them, and says
    /// so in one line naming the file and what to do. Returns whether it was so.
    pub(crate) fn stop_if_damaged(&self, thread: &'static str, e: &Error) -> bool {
        let Error::Damaged { reason } = e else {
            return false;
        };
        {
            let mut fault = self.fault.lock();
            if fault.is_none() {
                log::error!(
                    "runner {}: the {thread} thread found the database {} damaged (SQLite: \
                     {reason}): stopping at once; stop every runner on it, copy it aside, \
                     run `leasehold db check`, then restore a backup",
                    self.worker_id,
                    crate::redacted_db(&self.config.path)
                );
                *fault = Some((thread, e.to_string()));
                *self.damage.lock() = Some(reason.clone());
            }
        }
        self.stop_everything(StopReason::Shutdown);
        true
    }

    /// Whether a thread found the database file damaged.
    pub(crate) fn damaged(&self) -> bool {
        self.damage.lock().is_some()
    }

    /// The application aborts the runner (see [`Runner::abort`](super::Runner::abort)): it
    /// fences itself as a failed thread makes it, but its attempts are stopped as at
    /// shutdown, so that their jobs go back without spending their recovery budget.
    pub(crate) fn abort(&self) {
        {
            let mut fault = self.fault.lock();
            if fault.is_none() {
                log::warn!(
                    "runner {}: aborted: killing its running attempts now",
                    self.worker_id
                );
                *fault = Some(("caller", "the runner was aborted".to_string()));
            }
        }
        self.stop_everything(StopReason::Shutdown);
    }

    /// Stops claiming and every running attempt (for `reason`), and wakes whoever waits.
    fn stop_everything(&self, reason: StopReason) {
        self.shutting_down.store(true, Ordering::SeqCst);
        for r in self.running.lock().values() {
            r.stop.stop(reason);
        }
        self.wake_dispatcher();
        self.endings_changed();
    }

    /// Whether a thread has failed.
    pub(crate) fn failed(&self) -> bool {
        self.fault.lock().is_some()
    }

    /// `Err` once a thread has failed.
    pub(crate) fn check(&self) -> Result<()> {
        if let Some(reason) = &*self.damage.lock() {
            return Err(Error::Damaged {
                reason: reason.clone(),
            });
        }
        match &*self.fault.lock() {
            None => Ok(()),
            Some((thread, cause)) => Err(Error::RunnerFailed {
                thread,
                cause: cause.clone(),
            }),
        }
    }

    /// Panics in `thread` when a test asked for it (once); nothing in other builds.
    pub(crate) fn test_hook(&self, thread: &'static str) {
        #[cfg(test)]
        {
            let mut inject = self.inject_panic.lock();
            if inject.as_ref().is_some_and(|(t, _)| *t == thread) {
                let after = inject.take().and_then(|(_, file)| file);
                drop(inject);
                if let Some(file) = after {
                    let deadline = std::time::Instant::now() + Duration::from_secs(20);
                    while !file.exists() && std::time::Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
                panic!("injected panic in the {thread} thread");
            }
        }
        #[cfg(not(test))]
        let _ = thread;
    }
}

/// How long a start or an ending may wait for others to share its commit. A claim cuts the
/// wait short.
pub(crate) const LINGER: Duration = Duration::from_millis(6);

/// One write for the writer thread.
pub(crate) enum Op {
    /// Claim up to `limit` jobs; the claimed jobs come back on `reply` once committed.
    Claim {
        limit: u32,
        /// The runner's caps for this claim, per queue.
        caps: Vec<(String, u32)>,
        reply: Sender<Result<Vec<Claimed>>>,
    },
    /// Record an attempt's process.
    Start(AttemptStart),
    /// Record an attempt's ending; once committed, the attempt leaves the runner's registry.
    Finish(Box<Finish>),
}

/// The handle workers and the dispatcher send writes through.
#[derive(Clone)]
pub(crate) struct Writer {
    /// Claims: committed at once.
    urgent: Sender<Op>,
    /// Starts and endings: may linger to share a commit.
    lazy: Sender<Op>,
    /// Where an ending goes when the writer thread has failed.
    shared: Arc<Shared>,
}

/// The writer thread's end of the channels: [`WriterLoop::run`] is the thread's body.
pub(crate) struct WriterLoop {
    pub(super) urgent: Receiver<Op>,
    pub(super) lazy: Receiver<Op>,
}

impl Writer {
    /// The handle and the loop that the writer thread runs.
    pub(crate) fn new(shared: Arc<Shared>) -> (Writer, WriterLoop) {
        let (urgent, urgent_rx) = unbounded();
        let (lazy, lazy_rx) = unbounded();
        (
            Writer {
                urgent,
                lazy,
                shared,
            },
            WriterLoop {
                urgent: urgent_rx,
                lazy: lazy_rx,
            },
        )
    }

    /// Writes queued for the writer thread and not yet taken by it.
    pub(crate) fn queued(&self) -> usize {
        self.urgent.len() + self.lazy.len()
    }

    /// Claims up to `limit` jobs, at most `caps` of the queues it names, and waits until the
    /// claim is committed.
    pub(crate) fn claim(&self, limit: u32, caps: Vec<(String, u32)>) -> Result<Vec<Claimed>> {
        let (reply, answer) = bounded(1);
        self.urgent
            .send(Op::Claim { limit, caps, reply })
            .map_err(|_| Error::ShutDown)?;
        answer.recv().map_err(|_| Error::ShutDown)?
    }

    /// Queues a write without waiting for it. When the writer thread has failed, an ending
    /// is kept for the runner to record at shutdown; a start is dropped (the ending that
    /// follows it matters, and the runner has fenced itself by then).
    pub(crate) fn send(&self, op: Op) {
        let tx = match op {
            Op::Claim { .. } => &self.urgent,
            Op::Start(_) | Op::Finish(_) => &self.lazy,
        };
        match tx.send(op) {
            Ok(()) => {}
            Err(crossbeam_channel::SendError(Op::Finish(f))) => {
                log::warn!(
                    "job {}: the writer has stopped; its ending is recorded at shutdown",
                    f.job_id
                );
                self.shared.unwritten.lock().push(*f);
            }
            Err(_) => log::warn!("the writer has stopped; the record of a start was dropped"),
        }
    }
}

/// The ending that gives a job back untouched: pending, no attempt or budget spent.
pub(crate) fn interrupted(job: &Claimed, cfg: &Config, why: &str) -> Finish {
    Finish {
        job_id: job.id,
        run_token: job.run_token.clone(),
        attempt: job.attempt,
        ending: Ending::Interrupted {
            message: format!("not run: {why}"),
        },
        output: None,
        notes: Vec::new(),
        max_recovery_attempts: cfg.max_recovery_attempts,
    }
}

/// The message a panic carried, when it is text.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// What the sweeper has done since the runner started, or in one sweep.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SweepCounters {
    /// Sweeps run.
    pub sweeps: u64,
    /// Lost jobs moved back to pending.
    pub reclaimed_pending: u64,
    /// Lost jobs failed (recovery budget spent, or `on_lost = fail`).
    pub reclaimed_failed: u64,
    /// Lost attempts whose processes were dealt with (killed, or found gone).
    pub torn_down: u64,
    /// Processes found that could not be verified as the lost attempt's, and so were not
    /// signalled.
    pub unverified: u64,
    /// Runners on this host found provably dead.
    pub dead_runners: u64,
    /// Attempts of dead runners adopted: their keepers ran them on.
    pub adopted: u64,
    /// Attempts of dead runners whose keepers' outcomes were recorded instead of a rerun.
    pub recovered: u64,
}

impl SweepCounters {
    pub(crate) fn add(&mut self, o: &SweepCounters) {
        self.sweeps += o.sweeps;
        self.reclaimed_pending += o.reclaimed_pending;
        self.reclaimed_failed += o.reclaimed_failed;
        self.torn_down += o.torn_down;
        self.unverified += o.unverified;
        self.dead_runners += o.dead_runners;
        self.adopted += o.adopted;
        self.recovered += o.recovered;
    }

    pub(crate) fn did_something(&self) -> bool {
        self.reclaimed_pending
            + self.reclaimed_failed
            + self.torn_down
            + self.dead_runners
            + self.adopted
            + self.recovered
            > 0
    }
}

/// A claimed job on its way to a worker, with when it was claimed by the boot clock
/// (`CLOCK_BOOTTIME`, which counts a suspend and cannot be stepped): the worker checks the lease
/// by it too, in case the wall clock went back while the job waited.
pub(crate) struct Handed {
    pub job: Claimed,
    /// This host's wall clock, in ms, read just before the claim.
    pub claimed_at: i64,
    /// The boot clock, in ns, read just before the claim; `None` if it could not be read.
    pub claimed_boot_ns: Option<u64>,
}

/// Margin kept between fencing an attempt and its lease running out, beyond the kill grace.
pub(crate) const FENCE_MARGIN: Duration = Duration::from_millis(250);

/// "1s", "1.5s": how durations read in messages.
pub(crate) fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0}s")
    } else {
        format!("{s}s")
    }
}
