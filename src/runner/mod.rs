//! The runner: a dispatcher, a pool of workers, a writer, a heartbeat, a sweeper and a
//! notifier, each a thread, sharing one [`Shared`] state.

mod builder;
mod dispatcher;
mod firer;
mod heartbeat;
mod notifier;
pub mod operator;
mod shared;
mod sweeper;
mod worker;
mod writer;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, bounded, unbounded};
use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::job::{Job, JobRecord, Outcome, duration_ms, now_ms};
use crate::metrics::{Metrics, RunnerFigures};
use crate::process;
use crate::process::StopReason;
use crate::schedule::Schedule;
use crate::store::{DEFAULT_BUSY_TIMEOUT, Durability, OpenOptions, RunnerRecord, Store};
use crate::store::{Enqueued, ScheduleRecord};
use crate::store::{handoff, wake};

pub use builder::{
    Completion, DEFAULT_DRAIN_TIMEOUT, DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_KILL_GRACE,
    DEFAULT_LEASE_TTL, DEFAULT_OUTPUT_TAIL, DEFAULT_POLL_INTERVAL, DEFAULT_RECLAIM_BATCH,
    DEFAULT_SHUTDOWN_GRACE, DEFAULT_SWEEP_INTERVAL, DEFAULT_WORKERS, MAX_OUTPUT_TAIL,
    MAX_SETTING_DURATION, MAX_WORKERS, RunnerBuilder,
};
pub use shared::SweepCounters;

use builder::Config;
use builder::{Callback, validate};
use shared::{Shared, Writer, panic_message};
use sweeper::Sweeper;

/// A running job runner on one database file.
///
/// Dropping it shuts it down as [`Runner::shutdown`] does.
pub struct Runner {
    shared: Arc<Shared>,
    api: Mutex<Store>,
    /// Wakes the schedule firer when this runner changes a schedule.
    firer_wake: Sender<()>,
    threads: Mutex<Threads>,
    subscribers: Arc<Mutex<Vec<notifier::Subscriber>>>,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("worker_id", &self.shared.worker_id)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Threads {
    dispatcher: Option<JoinHandle<()>>,
    workers: Vec<JoinHandle<()>>,
    writer: Option<(Writer, JoinHandle<()>)>,
    background: Vec<JoinHandle<()>>,
    stop_background: Option<Sender<()>>,
    /// Ends the wake-up listener's blocking wait.
    stop_listener: Option<wake::Closer>,
    done: bool,
}

/// Starts one of the runner's threads under supervision: a panic, an error, or an end before
/// shutdown fences the runner (see [`Shared::fail`]) instead of leaving it half-alive.
fn spawn_thread(
    name: &str,
    role: &'static str,
    shared: &Arc<Shared>,
    f: impl FnOnce() -> Result<()> + Send + 'static,
) -> Result<JoinHandle<()>> {
    let shared = Arc::clone(shared);
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            let cause = match outcome {
                Ok(Ok(())) if shared.shutting_down.load(Ordering::SeqCst) => return,
                // A worker ends when the dispatcher's channel closes: at shutdown, or when the
                // dispatcher died, which the dispatcher's own supervision reports (its channel
                // closes as it unwinds, before that report is made).
                Ok(Ok(())) if role == "worker" => return,
                Ok(Ok(())) => "it ended before the runner shut down".to_string(),
                Ok(Err(e)) => format!("{e:#}"),
                Err(panic) => format!("panicked: {}", panic_message(panic.as_ref())),
            };
            shared.fail(role, cause);
        })
        .map_err(|e| Error::io(format!("cannot start thread {name}"), e))
}

/// The busy timeout of the connections whose loops retry a busy database themselves (the
/// writer, the schedule firer): at most a lease TTL, so that a shutdown beside another
/// process's write lock is not held behind one long wait.
fn short_busy(cfg: &Config) -> Duration {
    DEFAULT_BUSY_TIMEOUT.min(cfg.lease_ttl)
}

/// `now + d`, or None when that is past what `Instant` can represent (wait for ever).
fn deadline_after(d: Duration) -> Option<Instant> {
    Instant::now().checked_add(d)
}

impl RunnerBuilder {
    /// Checks the settings, opens the database, recovers what dead runners left, and starts
    /// the runner's threads.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] naming the setting for a misordered timing ladder (heartbeat × 3
    /// must not exceed the lease TTL, nor the kill grace plus two heartbeats, nor the sweep
    /// interval) or a zero value, and naming `SIGCHLD` when this process ignores it (or its
    /// handler has `SA_NOCLDWAIT`): its children's exit statuses would be lost; the errors of [`Store::open`]; [`Error::Io`] when a thread cannot start.
    pub fn start(self) -> Result<Runner> {
        validate(&self.config)?;
        match process::statuses_lost() {
            Ok(None) => {}
            Ok(Some(why)) => {
                return Err(Error::invalid(
                    "SIGCHLD",
                    format!(
                        "{why}: the kernel reaps this process's children itself, so a runner \
                         could not read its jobs' exit statuses; restore SIGCHLD's default \
                         disposition before starting a runner"
                    ),
                ));
            }
            Err(e) => return Err(Error::io("cannot read SIGCHLD's disposition", e)),
        }
        Runner::start(self.config, self.callbacks)
    }
}

impl Runner {
    /// A builder for a runner on the database at `path` (created if missing).
    pub fn builder(path: impl AsRef<Path>) -> RunnerBuilder {
        RunnerBuilder::new(path.as_ref().to_path_buf())
    }

    /// Opens one of the runner's connections. Only the first (`migrate`) creates and
    /// migrates the file; the others find it current and need no write transaction.
    fn open(config: &Config, busy: Duration, migrate: bool) -> Result<Store> {
        Store::open_with(
            &config.path,
            &OpenOptions::new()
                .create(migrate)
                .migrate(migrate)
                .durability(config.durability)
                .busy_timeout(busy),
        )
    }

    fn start(config: Config, callbacks: Vec<Callback>) -> Result<Runner> {
        let mut api = Runner::open(&config, DEFAULT_BUSY_TIMEOUT, true)?;
        let pid = std::process::id() as i64;
        let suffix = random_hex();
        let worker_id = format!("{}:{}:{}", process::hostname(), pid, suffix);
        // Bound before the first claim, so that no enqueue committed after that claim goes
        // unnoticed. Without it the runner still works, on its poll.
        let listener = match wake::Listener::bind(&config.path, &format!("{pid}-{suffix}")) {
            Ok(l) => Some(l),
            Err(e) => {
                log::warn!(
                    "no wake-up socket beside {} ({e}): jobs enqueued by other processes \
                     start on the next poll",
                    config.path.display()
                );
                None
            }
        };
        api.set_own_socket(listener.as_ref().map(|l| l.path().to_path_buf()));
        let now = now_ms();
        api.register_runner(&RunnerRecord {
            worker_id: worker_id.clone(),
            pid,
            proc_start_time: process::self_start_time()
                .map_err(|e| Error::io("cannot read this process's start time", e))?,
            boot_id: process::boot_id().unwrap_or_default(),
            host: process::hostname(),
            started_at: now,
            heartbeat_at: now,
            stopped_at: None,
            lease_ttl_ms: duration_ms(config.lease_ttl),
            heartbeat_interval_ms: duration_ms(config.heartbeat_interval),
            max_recovery_attempts: i64::from(config.max_recovery_attempts),
            pid_ns: process::pid_namespace().ok(),
        })?;
        let shared = Arc::new(Shared::new(config, worker_id));
        // One pending wake-up says all a wake-up says: a firer that is slow (a busy
        // database) is not sent an ever longer queue of them.
        let (firer_wake, firer_wake_rx) = bounded::<()>(1);
        let runner = Runner {
            shared: Arc::clone(&shared),
            api: Mutex::new(api),
            firer_wake,
            threads: Mutex::new(Threads::default()),
            subscribers: Arc::default(),
        };
        let started = {
            let mut threads = runner.threads.lock();
            runner.start_threads(&mut threads, listener, firer_wake_rx, callbacks)
        };
        if let Err(e) = started {
            // Unwind what started, as a shutdown does: the threads joined, the listener
            // closed and its socket removed (a command would hand it jobs), this runner's
            // registration marked stopped. Nothing is running yet.
            if let Err(stop) = runner.shutdown_within(Duration::ZERO) {
                log::warn!(
                    "runner {}: after a failed start: {stop:#}",
                    shared.worker_id
                );
            }
            return Err(e);
        }
        let cfg = &shared.config;
        log::info!(
            "runner {} started: {} workers, queues {}, lease {}s",
            shared.worker_id,
            cfg.workers,
            if cfg.queues.is_empty() {
                "all".to_string()
            } else {
                cfg.queues
                    .iter()
                    .map(|q| match cfg.queue_limits.iter().find(|(l, _)| l == q) {
                        Some((_, n)) => format!("{q}={n}"),
                        None => q.clone(),
                    })
                    .collect::<Vec<_>>()
                    .join(",")
            },
            cfg.lease_ttl.as_secs_f64()
        );
        Ok(runner)
    }

    /// The runner's threads, started into `threads`; on an error, what started so far is in
    /// `threads` for [`Runner::shutdown_within`] to end.
    fn start_threads(
        &self,
        threads: &mut Threads,
        listener: Option<wake::Listener>,
        firer_wake_rx: Receiver<()>,
        callbacks: Vec<Callback>,
    ) -> Result<()> {
        let shared = Arc::clone(&self.shared);
        let cfg = &shared.config;
        // Recover what dead runners left before taking any work.
        let sweeper = Sweeper::new(
            Runner::open(cfg, cfg.lease_ttl, false)?,
            Arc::clone(&shared),
        );
        sweeper.sweep_and_log(now_ms());

        let (stop_tx, stop_rx) = unbounded::<()>();
        threads.stop_background = Some(stop_tx);
        let last_event = self.api.lock().last_event_id()?;
        let subscribers = Arc::clone(&self.subscribers);
        {
            let store = Runner::open(cfg, DEFAULT_BUSY_TIMEOUT, false)?;
            let (shared, stop, subs) = (
                Arc::clone(&shared),
                stop_rx.clone(),
                Arc::clone(&subscribers),
            );
            threads.background.push(spawn_thread(
                "leasehold-notifier",
                "notifier",
                &Arc::clone(&shared),
                move || {
                    notifier::notify_loop(&store, &shared, &stop, &subs, &callbacks, last_event);
                    Ok(())
                },
            )?);
        }
        {
            let store = Runner::open(cfg, cfg.heartbeat_interval, false)?;
            let (shared, stop) = (Arc::clone(&shared), stop_rx.clone());
            threads.background.push(spawn_thread(
                "leasehold-heartbeat",
                "heartbeat",
                &Arc::clone(&shared),
                move || {
                    heartbeat::run(store, &shared, &stop);
                    Ok(())
                },
            )?);
        }
        {
            let firer = firer::Firer::new(Runner::open(cfg, short_busy(cfg), false)?);
            let (shared, stop) = (Arc::clone(&shared), stop_rx.clone());
            threads.background.push(spawn_thread(
                "leasehold-firer",
                "firer",
                &Arc::clone(&shared),
                move || {
                    firer::run(&firer, &shared, &stop, &firer_wake_rx);
                    Ok(())
                },
            )?);
        }
        {
            let (shared, stop) = (Arc::clone(&shared), stop_rx);
            threads.background.push(spawn_thread(
                "leasehold-sweeper",
                "sweeper",
                &Arc::clone(&shared),
                move || {
                    let interval = shared.config.sweep_interval;
                    while let Err(crossbeam_channel::RecvTimeoutError::Timeout) =
                        stop.recv_timeout(interval)
                    {
                        shared.test_hook("sweeper");
                        sweeper.sweep_and_log(now_ms());
                    }
                    Ok(())
                },
            )?);
        }
        if let Some(listener) = listener {
            threads.stop_listener = Some(
                listener
                    .closer()
                    .map_err(|e| Error::io("cannot set up the wake-up socket", e))?,
            );
            let shared = Arc::clone(&shared);
            let firer_wake = self.firer_wake.clone();
            let config = cfg.clone();
            threads.background.push(spawn_thread(
                "leasehold-wake",
                "wake-up listener",
                &Arc::clone(&shared),
                move || {
                    listen(listener, &shared, &firer_wake, &config);
                    Ok(())
                },
            )?);
        }
        let (writer, writer_loop) = Writer::new(Arc::clone(&shared));
        threads.writer = Some((writer.clone(), {
            let store = Runner::open(cfg, short_busy(cfg), false)?;
            let shared = Arc::clone(&shared);
            spawn_thread(
                "leasehold-writer",
                "writer",
                &Arc::clone(&shared),
                move || {
                    writer_loop.run(&store, &shared);
                    Ok(())
                },
            )?
        }));
        let (work_tx, work_rx) = unbounded();
        for i in 0..cfg.workers {
            let (shared, rx, writer) = (Arc::clone(&shared), work_rx.clone(), writer.clone());
            threads.workers.push(spawn_thread(
                &format!("leasehold-worker-{i}"),
                "worker",
                &Arc::clone(&shared),
                move || {
                    worker::run(&shared, &rx, &writer);
                    Ok(())
                },
            )?);
        }
        {
            let (shared, writer) = (Arc::clone(&shared), writer.clone());
            threads.dispatcher = Some(spawn_thread(
                "leasehold-dispatcher",
                "dispatcher",
                &Arc::clone(&shared),
                move || {
                    dispatcher::dispatch_loop(&shared, &writer, &work_tx);
                    Ok(())
                },
            )?);
        }
        Ok(())
    }

    /// This runner's worker id, written on every lease it holds.
    pub fn worker_id(&self) -> &str {
        &self.shared.worker_id
    }

    /// Enqueues a job and wakes the runner; returns its id.
    ///
    /// # Errors
    ///
    /// As [`Store::enqueue`].
    pub fn enqueue(&self, job: &Job) -> Result<i64> {
        self.shared.check()?;
        let id = self.api.lock().enqueue(job, now_ms())?;
        self.shared.wake_dispatcher();
        Ok(id)
    }

    /// Enqueues a job, saying whether its unique key made it a duplicate, and wakes the
    /// runner.
    ///
    /// # Errors
    ///
    /// As [`Store::enqueue_unique`].
    pub fn enqueue_unique(&self, job: &Job) -> Result<Enqueued> {
        self.shared.check()?;
        let done = self.api.lock().enqueue_unique(job, now_ms())?;
        self.shared.wake_dispatcher();
        Ok(done)
    }

    /// Stores a new schedule and wakes the firer; see [`Store::put_schedule`].
    ///
    /// # Errors
    ///
    /// As [`Store::put_schedule`].
    pub fn put_schedule(&self, name: &str, schedule: &Schedule) -> Result<ScheduleRecord> {
        self.shared.check()?;
        let rec = self.api.lock().put_schedule(name, schedule, now_ms())?;
        let _ = self.firer_wake.try_send(());
        Ok(rec)
    }

    /// Stores or replaces a schedule and wakes the firer; see [`Store::replace_schedule`].
    ///
    /// # Errors
    ///
    /// As [`Store::replace_schedule`].
    pub fn replace_schedule(&self, name: &str, schedule: &Schedule) -> Result<ScheduleRecord> {
        self.shared.check()?;
        let rec = self.api.lock().replace_schedule(name, schedule, now_ms())?;
        let _ = self.firer_wake.try_send(());
        Ok(rec)
    }

    /// Removes a schedule; see [`Store::remove_schedule`].
    ///
    /// # Errors
    ///
    /// As [`Store::remove_schedule`].
    pub fn remove_schedule(&self, name: &str) -> Result<()> {
        self.shared.check()?;
        self.api.lock().remove_schedule(name)?;
        let _ = self.firer_wake.try_send(());
        Ok(())
    }

    /// Pauses a schedule; see [`Store::pause_schedule`].
    ///
    /// # Errors
    ///
    /// As [`Store::pause_schedule`].
    pub fn pause_schedule(&self, name: &str) -> Result<ScheduleRecord> {
        self.shared.check()?;
        let rec = self.api.lock().pause_schedule(name, now_ms())?;
        let _ = self.firer_wake.try_send(());
        Ok(rec)
    }

    /// Resumes a schedule at its next future slot and wakes the firer; see
    /// [`Store::resume_schedule`].
    ///
    /// # Errors
    ///
    /// As [`Store::resume_schedule`].
    pub fn resume_schedule(&self, name: &str) -> Result<ScheduleRecord> {
        self.shared.check()?;
        let rec = self.api.lock().resume_schedule(name, now_ms())?;
        let _ = self.firer_wake.try_send(());
        Ok(rec)
    }

    /// Enqueues many jobs in one transaction; returns their ids.
    ///
    /// # Errors
    ///
    /// As [`Store::enqueue_many`].
    pub fn enqueue_many(&self, jobs: &[Job]) -> Result<Vec<i64>> {
        self.shared.check()?;
        let ids = self.api.lock().enqueue_many(jobs, now_ms())?;
        self.shared.wake_dispatcher();
        Ok(ids)
    }

    /// Pauses `queue` for every runner on the file: its pending jobs wait, its running
    /// jobs finish normally. See [`Store::pause_queue`].
    ///
    /// # Errors
    ///
    /// As [`Store::pause_queue`].
    pub fn pause_queue(&self, queue: &str) -> Result<()> {
        self.shared.check()?;
        self.api.lock().pause_queue(queue)
    }

    /// Resumes `queue` for every runner on the file, and wakes this one, which claims its
    /// jobs at once. See [`Store::resume_queue`].
    ///
    /// # Errors
    ///
    /// As [`Store::resume_queue`].
    pub fn resume_queue(&self, queue: &str) -> Result<()> {
        self.shared.check()?;
        self.api.lock().resume_queue(queue)?;
        self.shared.wake_dispatcher();
        Ok(())
    }

    /// Sets (or with `None` removes) the limit of `queue` stored in the file, for every runner
    /// on it, and wakes this runner. See [`Store::set_queue_limit`].
    ///
    /// # Errors
    ///
    /// As [`Store::set_queue_limit`].
    pub fn set_queue_limit(&self, queue: &str, limit: Option<u32>) -> Result<()> {
        self.shared.check()?;
        self.api.lock().set_queue_limit(queue, limit)?;
        self.shared.wake_dispatcher();
        Ok(())
    }

    /// Cancels a job. A running attempt of this runner is killed at once (its group gets
    /// SIGTERM, then SIGKILL after the kill grace); one of another runner is killed when
    /// that runner next renews its leases.
    ///
    /// # Errors
    ///
    /// As [`Store::cancel`].
    pub fn cancel(&self, id: i64) -> Result<JobRecord> {
        self.shared.check()?;
        let job = self.api.lock().cancel(id, now_ms())?;
        // A cancelled running job keeps its run token; if this runner holds that token, the
        // attempt is ours to stop now. A pending job has no token.
        if let Some(token) = &job.run_token
            && let Some(r) = self.shared.running.lock().get(token)
        {
            r.stop.stop(StopReason::Cancelled);
        }
        self.shared.endings_changed();
        Ok(job)
    }

    /// An operator's retry; see [`Store::retry`].
    ///
    /// # Errors
    ///
    /// As [`Store::retry`].
    pub fn retry(&self, id: i64, reason: Option<&str>) -> Result<JobRecord> {
        self.shared.check()?;
        let job = self.api.lock().retry(id, reason, now_ms())?;
        self.shared.wake_dispatcher();
        Ok(job)
    }

    /// The job as stored now.
    ///
    /// # Errors
    ///
    /// As [`Store::job`].
    pub fn job(&self, id: i64) -> Result<JobRecord> {
        self.shared.check()?;
        self.api.lock().job(id)
    }

    /// Waits up to `timeout` for the job to end; returns its outcome, or None if it has not
    /// ended by then. A job retried after failing has not ended.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchJob`], or a database error.
    pub fn wait(&self, id: i64, timeout: Duration) -> Result<Option<Outcome>> {
        let deadline = deadline_after(timeout);
        let mut seen = self.shared.endings_seen();
        loop {
            self.shared.check()?;
            if let Some(outcome) = self.api.lock().job(id)?.outcome() {
                return Ok(Some(outcome));
            }
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => Duration::MAX,
            };
            if left.is_zero() {
                return Ok(None);
            }
            // This runner's endings (and, with a listener, the notifier's) wake the wait; the
            // poll interval bounds how late another process's ending is seen.
            let step = left.min(self.shared.config.poll_interval);
            seen = self.shared.wait_for_endings(seen, step);
        }
    }

    /// A channel that receives every ending from now on, as [`RunnerBuilder::on_complete`].
    ///
    /// It holds up to 10,000 unread endings. A subscriber that falls further behind is
    /// dropped rather than let the runner's memory grow: its channel closes once the endings
    /// it holds are read (`recv` then returns `Err`), and it may subscribe again.
    pub fn subscribe(&self) -> Receiver<Completion> {
        let (tx, rx) = bounded(notifier::SUBSCRIBER_CAPACITY);
        // From the last event now: the notifier of a runner nobody listened to has not been
        // reading the events.
        let from = self
            .api
            .lock()
            .last_event_id()
            .inspect_err(|e| log::warn!("subscribe: cannot read the last event: {e:#}"))
            .ok();
        self.subscribers
            .lock()
            .push(notifier::Subscriber { tx, from });
        // Wakes a notifier that had nobody to tell.
        self.shared.endings_changed();
        rx
    }

    /// The sweeper's counters since the runner started.
    pub fn counters(&self) -> SweepCounters {
        *self.shared.counters.lock()
    }

    /// A snapshot of the database's metrics (as [`Store::metrics`]) with this runner's live
    /// figures: its workers, how many are busy, the writer's queue and how long the last
    /// lease renewal took. Read on the runner's API connection, without a write lock.
    ///
    /// # Errors
    ///
    /// As [`Store::metrics`], and [`Error::RunnerFailed`] once a thread has failed.
    pub fn metrics(&self) -> Result<Metrics> {
        self.shared.check()?;
        let mut metrics = self.api.lock().metrics()?;
        let workers = self.shared.config.workers as u64;
        let idle = self.shared.idle_workers.load(Ordering::Relaxed) as u64;
        // The threads are locked for the whole of a shutdown: no figure then, not a wait.
        let writer_queue = self
            .threads
            .try_lock()
            .and_then(|t| t.writer.as_ref().map(|(w, _)| w.queued() as u64));
        let renew = self.shared.renew_nanos.load(Ordering::Relaxed);
        metrics.runner = Some(RunnerFigures {
            worker_id: self.shared.worker_id.clone(),
            workers,
            busy_workers: workers.saturating_sub(idle),
            writer_queue,
            last_renewal: (renew > 0).then(|| Duration::from_nanos(renew)),
        });
        Ok(metrics)
    }

    /// How many attempts this runner is running now.
    pub fn running(&self) -> usize {
        self.shared.running.lock().len()
    }

    /// Whether any job of this runner's queues is pending (due or not) or running, on any
    /// runner.
    ///
    /// # Errors
    ///
    /// A database error.
    pub fn has_unfinished(&self) -> Result<bool> {
        self.shared.check()?;
        self.api.lock().has_unfinished(&self.shared.config.queues)
    }

    /// `Ok` while every thread of the runner works. After a thread failed (a panic, an error
    /// it could not handle), the runner has fenced itself: its attempts were killed and
    /// recorded as lost, and every request returns the error this returns.
    ///
    /// # Errors
    ///
    /// [`Error::RunnerFailed`] naming the thread and its cause.
    pub fn health(&self) -> Result<()> {
        self.shared.check()
    }

    /// Kills every running attempt now, without a shutdown grace, and waits up to `timeout`
    /// for their processes to end: for an application that must exit before a shutdown could
    /// finish (`leasehold run` on a second SIGINT or SIGTERM). Each attempt's group gets
    /// SIGTERM, then SIGKILL after the kill grace. Their jobs go back to pending without
    /// spending their recovery budget when the database takes the write; otherwise their
    /// leases run out and a sweeper reclaims them. From then on the runner is fenced: every
    /// call returns [`Error::RunnerFailed`], and [`Runner::shutdown`] only joins its threads.
    /// Safe to call from another thread while a shutdown is under way.
    ///
    /// Returns whether every attempt ended within `timeout`.
    pub fn abort(&self, timeout: Duration) -> bool {
        self.shared.abort();
        let deadline = deadline_after(timeout);
        let workers = self.shared.config.workers;
        loop {
            if self.shared.idle_workers.load(Ordering::SeqCst) >= workers {
                return true;
            }
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => Duration::MAX,
            };
            if left.is_zero() {
                return false;
            }
            // A worker bumps the endings when its attempt's ending is committed; a poll covers
            // the ending the writer cannot commit.
            let seen = self.shared.endings_seen();
            self.shared
                .wait_for_endings(seen, left.min(Duration::from_millis(20)));
        }
    }

    /// Shuts down with the configured shutdown grace; see [`Runner::shutdown_within`].
    ///
    /// # Errors
    ///
    /// As [`Runner::shutdown_within`].
    pub fn shutdown(&self) -> Result<()> {
        self.shutdown_within(self.shared.config.shutdown_grace)
    }

    /// Stops claiming, lets running jobs finish for up to `grace`, then kills what is still
    /// running (SIGTERM to each group, SIGKILL after the kill grace) and puts those jobs back
    /// to pending without spending their recovery budget; joins every thread and records
    /// the runner's clean stop. Calling it again does nothing.
    ///
    /// # Errors
    ///
    /// A database error recording the stop (everything else is done by then);
    /// [`Error::RunnerFailed`] when a thread of the runner had failed (its attempts are
    /// recorded as lost by then).
    pub fn shutdown_within(&self, grace: Duration) -> Result<()> {
        let mut threads = self.threads.lock();
        if threads.done {
            return Ok(());
        }
        threads.done = true;
        self.shared.shutting_down.store(true, Ordering::SeqCst);
        self.shared.wake_dispatcher();
        if let Some(d) = threads.dispatcher.take() {
            let _ = d.join();
        }
        let deadline = deadline_after(grace);
        let mut seen = self.shared.endings_seen();
        loop {
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => Duration::MAX,
            };
            if self.shared.running.lock().is_empty() || left.is_zero() {
                break;
            }
            let step = left.min(Duration::from_millis(50));
            seen = self.shared.wait_for_endings(seen, step);
        }
        let left: Vec<i64> = {
            let running = self.shared.running.lock();
            for r in running.values() {
                r.stop.stop(StopReason::Shutdown);
            }
            running.values().map(|r| r.job_id).collect()
        };
        if !left.is_empty() {
            log::info!(
                "shutdown: grace of {}s over, killing and requeueing jobs {left:?}",
                grace.as_secs_f64()
            );
        }
        for w in threads.workers.drain(..) {
            let _ = w.join();
        }
        if let Some((writer, handle)) = threads.writer.take() {
            drop(writer);
            let _ = handle.join();
        }
        drop(threads.stop_background.take());
        if let Some(closer) = threads.stop_listener.take() {
            closer.close();
        }
        // The notifier (and a listener whose socket failed) may be waiting for an ending:
        // wake them to see the shutdown rather than wait out their poll.
        self.shared.endings_changed();
        for t in threads.background.drain(..) {
            let _ = t.join();
        }
        // Every thread ends through `spawn_thread`, which catches its panic: a join error
        // cannot happen, so the joins above only wait.
        let mut api = self.api.lock();
        // Beside another process's write lock, recording the stop waits no longer than the
        // writer did.
        api.set_busy_timeout(short_busy(&self.shared.config));
        let unwritten = std::mem::take(&mut *self.shared.unwritten.lock());
        for finish in &unwritten {
            // The writer had failed: record these endings here (each fenced as usual).
            match api.finish(finish, now_ms()) {
                Ok(done) => log::info!(
                    "job {} attempt {}: ending recorded at shutdown: {done:?}",
                    finish.job_id,
                    finish.attempt
                ),
                Err(e) => log::error!(
                    "job {} attempt {}: cannot record its ending ({e:#}); its lease will \
                     expire and a sweeper will reclaim it",
                    finish.job_id,
                    finish.attempt
                ),
            }
        }
        api.stop_runner(&self.shared.worker_id, now_ms())?;
        self.shared.check()?;
        log::info!("runner {} stopped", self.shared.worker_id);
        Ok(())
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            log::error!("runner shutdown: {e:#}");
        }
    }
}

/// The wake-up listener's loop: every poke from another process wakes the dispatcher, as an
/// enqueue in this process does, and the schedule firer, which rereads the schedules (another
/// process may have added or resumed one). Ends when the runner closes the socket at shutdown;
/// a socket that fails before that is logged and removed, so that no command hands a job to
/// a socket nobody reads (the dispatcher's poll still finds the work, and the firer rereads
/// the schedules every second).
fn listen(mut listener: wake::Listener, shared: &Shared, firer: &Sender<()>, config: &Config) {
    // Opened at the first job a command hands over, so that a runner nobody hands jobs to
    // keeps one connection fewer. Always FULL: the command reports the job stored when this
    // answers, as it would after a commit of its own.
    let mut store: Option<Store> = None;
    while let Some(requests) = listener.wait() {
        for request in requests {
            if shared.shutting_down.load(Ordering::SeqCst) {
                // Declined at once, so the command stores its job itself now rather than
                // after waiting out its deadline.
                let answer = handoff::decline(&request.body, handoff::SHUTTING_DOWN);
                listener.answer(&request.from, &answer);
                continue;
            }
            if store.is_none() {
                store = handoff_store(config, &listener)
                    .map_err(|e| log::warn!("cannot store handed jobs: {e}"))
                    .ok();
            }
            let Some(s) = &store else {
                // The command stores its job itself, with the error it gets, if any.
                let answer = handoff::decline(&request.body, "the runner cannot store it");
                listener.answer(&request.from, &answer);
                continue;
            };
            let (answer, new) = handoff::answer(s, &request.body, now_ms());
            listener.answer(&request.from, &answer);
            // Other runners on the file may take it (this one is woken below).
            if new {
                s.poke();
            }
        }
        if shared.shutting_down.load(Ordering::SeqCst) {
            // Drain: requests sent before the runner closes the socket are still queued in
            // it, and are declined above; the wait ends once they are read and the socket
            // is closed.
            continue;
        }
        shared.wake_dispatcher();
        // The firer ends only at shutdown; a send to it then is moot.
        let _ = firer.try_send(());
    }
    // Its file removed: commands no longer find it, and pass over to the next runner.
    drop(listener);
    while !shared.shutting_down.load(Ordering::SeqCst) {
        // The socket failed (logged by `wait`): wait for the shutdown.
        shared.wait_for_endings(shared.endings_seen(), Duration::from_secs(60));
    }
}

/// The listener's connection, for jobs that commands hand over (see [`handoff`]).
fn handoff_store(config: &Config, listener: &wake::Listener) -> Result<Store> {
    let mut store = Store::open_with(
        &config.path,
        &OpenOptions::new()
            .create(false)
            .migrate(false)
            .durability(Durability::Full),
    )?;
    store.set_own_socket(Some(listener.path().to_path_buf()));
    Ok(store)
}

/// Eight random hex digits, to tell apart runners that reuse a pid.
fn random_hex() -> String {
    use std::hash::{BuildHasher, Hasher};
    // std seeds each RandomState from the OS's randomness.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    format!("{:08x}", h.finish() as u32)
}

#[cfg(test)]
impl Runner {
    /// Makes `thread` panic the next time it runs its loop (once).
    fn inject_panic(&self, thread: &'static str) {
        *self.shared.inject_panic.lock() = Some((thread, None));
        self.shared.wake_dispatcher();
    }

    /// Makes `thread` panic the next time it runs its loop (once), after `file` appears
    /// (or 20 s passed).
    fn inject_panic_after(&self, thread: &'static str, file: &Path) {
        *self.shared.inject_panic.lock() = Some((thread, Some(file.to_path_buf())));
        self.shared.wake_dispatcher();
    }
}

#[cfg(test)]
mod tests;
