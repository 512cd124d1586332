//! The runner: a dispatcher, a pool of workers, a writer, a heartbeat, a sweeper and a
//! notifier, each a thread, sharing one [`Shared`] state.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, unbounded};
use parking_lot::{Condvar, Mutex};

use crate::attempt::{StopHandle, StopReason};
use crate::error::{Error, Result};
use crate::job::{ErrorKind, Job, JobRecord, Outcome, Status, duration_ms, now_ms};
use crate::store::{DEFAULT_MAX_RECOVERY_ATTEMPTS, Durability, OpenOptions, RunnerRecord, Store};
use crate::sweeper::{SweepCounters, Sweeper};
use crate::writer::Writer;
use crate::{heartbeat, process, worker};

/// Worker threads, so jobs run at once. By default 4.
pub const DEFAULT_WORKERS: usize = 4;
/// How long a lease lasts unless renewed.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);
/// How often a runner renews its leases.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(5);
/// How often the sweeper looks for lost attempts.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(5);
/// Between SIGTERM and SIGKILL.
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(5);
/// How many lost attempts one sweep reclaims at most.
pub const DEFAULT_RECLAIM_BATCH: u32 = 100;
/// The bytes of stdout and of stderr kept per attempt.
pub const DEFAULT_OUTPUT_TAIL: usize = 64 * 1024;
/// How long a runner waits for running jobs when it shuts down.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// After an attempt's main process exits, how long its pipes may stay open.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(1);
/// How often an idle dispatcher looks for jobs enqueued by other processes.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// A runner's settings; see [`RunnerBuilder`].
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub path: PathBuf,
    pub workers: usize,
    pub queues: Vec<String>,
    pub lease_ttl: Duration,
    pub heartbeat_interval: Duration,
    pub sweep_interval: Duration,
    pub kill_grace: Duration,
    pub max_recovery_attempts: u32,
    pub reclaim_batch: u32,
    pub durability: Durability,
    pub output_tail: usize,
    pub shutdown_grace: Duration,
    pub drain_timeout: Duration,
    pub poll_interval: Duration,
}

/// What a completion callback or subscriber is told: a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Completion {
    /// The job.
    pub job_id: i64,
    /// The attempt that ended it.
    pub attempt: i64,
    /// How it ended.
    pub outcome: Outcome,
}

type Callback = Box<dyn Fn(&Completion) + Send + Sync>;

/// Builds and starts a [`Runner`].
///
/// ```no_run
/// # fn main() -> leasehold::Result<()> {
/// use std::time::Duration;
/// use leasehold::{Job, Runner};
///
/// let runner = Runner::builder("jobs.db")
///     .workers(2)
///     .lease_ttl(Duration::from_secs(30))
///     .start()?;
/// let id = runner.enqueue(&Job::shell("echo hello"))?;
/// let outcome = runner.wait(id, Duration::from_secs(10))?;
/// println!("{outcome:?}");
/// runner.shutdown()?;
/// # Ok(())
/// # }
/// ```
pub struct RunnerBuilder {
    pub(crate) config: Config,
    callbacks: Vec<Callback>,
}

impl std::fmt::Debug for RunnerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunnerBuilder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl RunnerBuilder {
    pub(crate) fn new(path: PathBuf) -> Self {
        RunnerBuilder {
            config: Config {
                path,
                workers: DEFAULT_WORKERS,
                queues: Vec::new(),
                lease_ttl: DEFAULT_LEASE_TTL,
                heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
                sweep_interval: DEFAULT_SWEEP_INTERVAL,
                kill_grace: DEFAULT_KILL_GRACE,
                max_recovery_attempts: DEFAULT_MAX_RECOVERY_ATTEMPTS,
                reclaim_batch: DEFAULT_RECLAIM_BATCH,
                durability: Durability::Full,
                output_tail: DEFAULT_OUTPUT_TAIL,
                shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
                drain_timeout: DEFAULT_DRAIN_TIMEOUT,
                poll_interval: DEFAULT_POLL_INTERVAL,
            },
            callbacks: Vec::new(),
        }
    }

    /// How many jobs run at once. By default, 4.
    pub fn workers(mut self, workers: usize) -> Self {
        self.config.workers = workers;
        self
    }

    /// Takes jobs from this queue (call again to add more). By default, every queue.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.config.queues.push(queue.into());
        self
    }

    /// How long a lease lasts unless renewed: a runner that stops renewing loses its jobs
    /// this long after its last renewal. By default, 30 s.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.config.lease_ttl = ttl;
        self
    }

    /// How often leases are renewed; at most a third of the lease TTL. By default, 5 s.
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.config.heartbeat_interval = interval;
        self
    }

    /// How often the sweeper reclaims lost attempts; at most the lease TTL. By default, 5 s.
    pub fn sweep_interval(mut self, interval: Duration) -> Self {
        self.config.sweep_interval = interval;
        self
    }

    /// Between SIGTERM and SIGKILL when an attempt's group is killed. By default, 5 s.
    pub fn kill_grace(mut self, grace: Duration) -> Self {
        self.config.kill_grace = grace;
        self
    }

    /// How often a lost job is run again before it fails as lost. By default, 3.
    pub fn max_recovery_attempts(mut self, attempts: u32) -> Self {
        self.config.max_recovery_attempts = attempts;
        self
    }

    /// How many lost attempts one sweep reclaims at most; 0 disables reclaiming. By
    /// default, 100.
    pub fn reclaim_batch(mut self, batch: u32) -> Self {
        self.config.reclaim_batch = batch;
        self
    }

    /// How hard commits are pushed to disk. By default, [`Durability::Full`].
    pub fn durability(mut self, durability: Durability) -> Self {
        self.config.durability = durability;
        self
    }

    /// The bytes of stdout and of stderr kept per attempt: the last ones. By default, 64 KiB.
    pub fn output_tail(mut self, bytes: usize) -> Self {
        self.config.output_tail = bytes;
        self
    }

    /// How long [`Runner::shutdown`] (and drop) lets running jobs finish before killing
    /// them. By default, 10 s.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.config.shutdown_grace = grace;
        self
    }

    /// After an attempt's main process exits, how long its pipes may stay open (held by a
    /// descendant) before what is left of the attempt is killed. By default, 1 s.
    pub fn drain_timeout(mut self, drain: Duration) -> Self {
        self.config.drain_timeout = drain;
        self
    }

    /// How often an idle runner looks for jobs that other processes enqueued (its own
    /// enqueues wake it at once). By default, 100 ms.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.config.poll_interval = interval;
        self
    }

    /// Calls `f` once for every ending of every job on the database (succeeded, failed,
    /// lost, cancelled), including jobs that other processes ran, from the runner's
    /// notifier thread. Endings written before the runner started are not reported.
    pub fn on_complete(mut self, f: impl Fn(&Completion) + Send + Sync + 'static) -> Self {
        self.callbacks.push(Box::new(f));
        self
    }

    /// Checks the settings, opens the database, recovers what dead runners left, and starts
    /// the runner's threads.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] naming the setting for a misordered timing ladder (heartbeat × 3
    /// must not exceed the lease TTL, nor the sweep interval the lease TTL) or a zero
    /// value; the errors of [`Store::open`]; [`Error::Io`] when a thread cannot start.
    pub fn start(self) -> Result<Runner> {
        validate(&self.config)?;
        Runner::start(self.config, self.callbacks)
    }
}

fn validate(c: &Config) -> Result<()> {
    let secs = |d: Duration| d.as_secs_f64();
    if c.workers == 0 {
        return Err(Error::invalid("workers", "must be at least 1"));
    }
    for (name, d) in [
        ("lease_ttl", c.lease_ttl),
        ("heartbeat_interval", c.heartbeat_interval),
        ("sweep_interval", c.sweep_interval),
        ("poll_interval", c.poll_interval),
    ] {
        if d.is_zero() {
            return Err(Error::invalid(name, "must be greater than 0"));
        }
    }
    if c.heartbeat_interval * 3 > c.lease_ttl {
        return Err(Error::invalid(
            "heartbeat_interval",
            format!(
                "heartbeat {}s × 3 exceeds the lease TTL of {}s: a lease must survive two missed renewals",
                secs(c.heartbeat_interval),
                secs(c.lease_ttl)
            ),
        ));
    }
    if c.sweep_interval > c.lease_ttl {
        return Err(Error::invalid(
            "sweep_interval",
            format!(
                "sweep {}s exceeds the lease TTL of {}s",
                secs(c.sweep_interval),
                secs(c.lease_ttl)
            ),
        ));
    }
    Ok(())
}

/// One attempt this runner is running, by its run token.
pub(crate) struct Running {
    pub job_id: i64,
    pub stop: StopHandle,
    /// When its lease runs out, as last written (wall clock, ms).
    pub lease_expires_at: i64,
}

/// The state the runner's threads share.
pub(crate) struct Shared {
    pub config: Config,
    pub worker_id: String,
    pub running: Mutex<HashMap<String, Running>>,
    pub shutting_down: AtomicBool,
    /// Workers not running an attempt.
    pub idle_workers: AtomicUsize,
    /// Attempts ended by this runner's workers since it started.
    pub endings_total: std::sync::atomic::AtomicU64,
    /// How long the writer's commits take, in nanoseconds: the slowest recent one, decaying.
    pub commit_nanos: std::sync::atomic::AtomicU64,
    /// The dispatcher refills the work queue once it holds this many jobs or fewer: a worker
    /// that finds more queued need not wake it.
    pub refill_at: AtomicUsize,
    /// Wakes the dispatcher (an enqueue, a free worker, shutdown).
    wake: (Mutex<bool>, Condvar),
    /// Bumped whenever an ending is committed or observed; waiters block on it.
    endings: (Mutex<u64>, Condvar),
    pub counters: Mutex<SweepCounters>,
    /// The environment attempts start from: the process's, taken once when the runner
    /// starts (it is not expected to change while the runner runs), so that a spawn does not
    /// read and convert it again.
    pub base_env: Arc<crate::attempt::BaseEnv>,
}

impl Shared {
    pub(crate) fn new(config: Config, worker_id: String) -> Shared {
        Shared {
            worker_id,
            running: Mutex::new(HashMap::new()),
            shutting_down: AtomicBool::new(false),
            idle_workers: AtomicUsize::new(config.workers),
            endings_total: std::sync::atomic::AtomicU64::new(0),
            commit_nanos: std::sync::atomic::AtomicU64::new(0),
            refill_at: AtomicUsize::new(0),
            wake: (Mutex::new(false), Condvar::new()),
            endings: (Mutex::new(0), Condvar::new()),
            counters: Mutex::new(SweepCounters::default()),
            base_env: Arc::new(crate::attempt::BaseEnv::current()),
            config,
        }
    }

    pub(crate) fn wake_dispatcher(&self) {
        *self.wake.0.lock() = true;
        self.wake.1.notify_all();
    }

    fn wait_for_wake(&self, timeout: Duration) {
        let mut woken = self.wake.0.lock();
        if !*woken {
            self.wake.1.wait_for(&mut woken, timeout);
        }
        *woken = false;
    }

    /// The attempt under `token` has ended (its ending is committed, or given up on).
    pub(crate) fn attempt_done(&self, token: &str) {
        self.running.lock().remove(token);
    }

    pub(crate) fn endings_changed(&self) {
        *self.endings.0.lock() += 1;
        self.endings.1.notify_all();
    }

    fn wait_for_endings(&self, seen: u64, timeout: Duration) -> u64 {
        let mut n = self.endings.0.lock();
        if *n == seen {
            self.endings.1.wait_for(&mut n, timeout);
        }
        *n
    }

    fn endings_seen(&self) -> u64 {
        *self.endings.0.lock()
    }
}

/// A running job runner on one database file.
///
/// Dropping it shuts it down as [`Runner::shutdown`] does.
pub struct Runner {
    shared: Arc<Shared>,
    api: Mutex<Store>,
    threads: Mutex<Threads>,
    subscribers: Arc<Mutex<Vec<Sender<Completion>>>>,
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
    done: bool,
}

fn spawn_thread(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(f)
        .map_err(|e| Error::io(format!("cannot start thread {name}"), e))
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
        let api = Runner::open(&config, crate::store::DEFAULT_BUSY_TIMEOUT, true)?;
        let pid = std::process::id() as i64;
        let worker_id = format!("{}:{}:{}", hostname(), pid, random_hex());
        let now = now_ms();
        api.register_runner(&RunnerRecord {
            worker_id: worker_id.clone(),
            pid,
            proc_start_time: process::self_start_time()
                .map_err(|e| Error::io("cannot read this process's start time", e))?,
            boot_id: process::boot_id().unwrap_or_default(),
            host: hostname(),
            started_at: now,
            heartbeat_at: now,
            stopped_at: None,
            lease_ttl_ms: duration_ms(config.lease_ttl),
            heartbeat_interval_ms: duration_ms(config.heartbeat_interval),
            max_recovery_attempts: i64::from(config.max_recovery_attempts),
        })?;
        let shared = Arc::new(Shared::new(config, worker_id));
        let cfg = &shared.config;
        // Recover what dead runners left before taking any work.
        let sweeper = Sweeper::new(
            Runner::open(cfg, cfg.lease_ttl, false)?,
            Arc::clone(&shared),
        );
        sweeper.sweep_and_log(now_ms());

        let (stop_tx, stop_rx) = unbounded::<()>();
        let mut threads = Threads {
            stop_background: Some(stop_tx),
            ..Threads::default()
        };
        let last_event = api.last_event_id()?;
        let subscribers: Arc<Mutex<Vec<Sender<Completion>>>> = Arc::default();
        {
            let store = Runner::open(cfg, crate::store::DEFAULT_BUSY_TIMEOUT, false)?;
            let (shared, stop, subs) = (
                Arc::clone(&shared),
                stop_rx.clone(),
                Arc::clone(&subscribers),
            );
            threads
                .background
                .push(spawn_thread("leasehold-notifier", move || {
                    notify_loop(&store, &shared, &stop, &subs, &callbacks, last_event);
                })?);
        }
        {
            let store = Runner::open(cfg, cfg.heartbeat_interval, false)?;
            let (shared, stop) = (Arc::clone(&shared), stop_rx.clone());
            threads
                .background
                .push(spawn_thread("leasehold-heartbeat", move || {
                    heartbeat::run(store, &shared, &stop);
                })?);
        }
        {
            let (shared, stop) = (Arc::clone(&shared), stop_rx);
            threads
                .background
                .push(spawn_thread("leasehold-sweeper", move || {
                    let interval = shared.config.sweep_interval;
                    while let Err(crossbeam_channel::RecvTimeoutError::Timeout) =
                        stop.recv_timeout(interval)
                    {
                        sweeper.sweep_and_log(now_ms());
                    }
                })?);
        }
        let (writer, writer_thread) = Writer::start(
            Runner::open(cfg, crate::store::DEFAULT_BUSY_TIMEOUT, false)?,
            Arc::clone(&shared),
        )?;
        let (work_tx, work_rx) = unbounded();
        for i in 0..cfg.workers {
            let (shared, rx, writer) = (Arc::clone(&shared), work_rx.clone(), writer.clone());
            threads
                .workers
                .push(spawn_thread(&format!("leasehold-worker-{i}"), move || {
                    worker::run(&shared, &rx, &writer);
                })?);
        }
        {
            let (shared, writer) = (Arc::clone(&shared), writer.clone());
            threads.dispatcher = Some(spawn_thread("leasehold-dispatcher", move || {
                dispatch_loop(&shared, &writer, &work_tx);
            })?);
        }
        threads.writer = Some((writer, writer_thread));
        log::info!(
            "runner {} started: {} workers, queues {}, lease {}s",
            shared.worker_id,
            cfg.workers,
            if cfg.queues.is_empty() {
                "all".to_string()
            } else {
                cfg.queues.join(",")
            },
            cfg.lease_ttl.as_secs_f64()
        );
        Ok(Runner {
            shared,
            api: Mutex::new(api),
            threads: Mutex::new(threads),
            subscribers,
        })
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
        let id = self.api.lock().enqueue(job, now_ms())?;
        self.shared.wake_dispatcher();
        Ok(id)
    }

    /// Enqueues many jobs in one transaction; returns their ids.
    ///
    /// # Errors
    ///
    /// As [`Store::enqueue_many`].
    pub fn enqueue_many(&self, jobs: &[Job]) -> Result<Vec<i64>> {
        let ids = self.api.lock().enqueue_many(jobs, now_ms())?;
        self.shared.wake_dispatcher();
        Ok(ids)
    }

    /// Cancels a job. A running attempt of this runner is killed at once (its group gets
    /// SIGTERM, then SIGKILL after the kill grace); one of another runner is killed when
    /// that runner next renews its leases.
    ///
    /// # Errors
    ///
    /// As [`Store::cancel`].
    pub fn cancel(&self, id: i64) -> Result<JobRecord> {
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
        self.api.lock().job(id)
    }

    /// Waits up to `timeout` for the job to end; returns its outcome, or None if it has not
    /// ended by then. A job retried after failing has not ended.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchJob`], or a database error.
    pub fn wait(&self, id: i64, timeout: Duration) -> Result<Option<Outcome>> {
        let deadline = Instant::now() + timeout;
        let mut seen = self.shared.endings_seen();
        loop {
            if let Some(outcome) = self.api.lock().job(id)?.outcome() {
                return Ok(Some(outcome));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            // This runner's endings (and, with a listener, the notifier's) wake the wait; the
            // poll interval bounds how late another process's ending is seen.
            let step = (deadline - now).min(self.shared.config.poll_interval);
            seen = self.shared.wait_for_endings(seen, step);
        }
    }

    /// A channel that receives every ending from now on, as [`RunnerBuilder::on_complete`].
    pub fn subscribe(&self) -> Receiver<Completion> {
        let (tx, rx) = unbounded();
        self.subscribers.lock().push(tx);
        rx
    }

    /// The sweeper's counters since the runner started.
    pub fn counters(&self) -> SweepCounters {
        *self.shared.counters.lock()
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
        self.api.lock().has_unfinished(&self.shared.config.queues)
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
    /// A database error recording the stop (everything else is done by then).
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
        let deadline = Instant::now() + grace;
        let mut seen = self.shared.endings_seen();
        while !self.shared.running.lock().is_empty() && Instant::now() < deadline {
            let step = deadline
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(50));
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
        for t in threads.background.drain(..) {
            let _ = t.join();
        }
        self.api
            .lock()
            .stop_runner(&self.shared.worker_id, now_ms())?;
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

/// This host's name, or "localhost" when it cannot be read.
pub(crate) fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".to_string())
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

/// Claims jobs while workers are free and hands them over.
///
/// A claim is durable before its job starts, so with `synchronous = FULL` a worker that
/// waited for its own claim would wait for the disk on every job. The dispatcher therefore
/// claims a little ahead: as many jobs as are likely to start while one commit is under way
/// (the recent rate of endings times the recent claim round trip, twice over, at most eight
/// per worker). Long jobs end rarely, so they are not claimed ahead; a stream of short ones is.
fn dispatch_loop(shared: &Shared, writer: &Writer, work: &Sender<crate::store::Claimed>) {
    let workers = shared.config.workers;
    let mut rate = RateMeter::new();
    while !shared.shutting_down.load(Ordering::SeqCst) {
        let idle = shared.idle_workers.load(Ordering::SeqCst);
        let queued = work.len();
        let commit = Duration::from_nanos(shared.commit_nanos.load(Ordering::Relaxed));
        let per_sec = rate.sample(shared.endings_total.load(Ordering::Relaxed), workers as u64);
        // The claim's round trip is the commit plus the hand-offs between threads.
        let round_trip = commit.as_secs_f64() + HANDOFF.as_secs_f64();
        let lookahead = ((per_sec * round_trip * 2.0).round() as usize).min(8 * workers);
        // Refill in chunks: claim once the queue is down to half the lookahead (or a worker
        // would go without), not on every ending, so that one claim (and one wake-up of this
        // thread, see `refill_at`) serves several jobs.
        let low = lookahead / 2;
        shared.refill_at.store(low, Ordering::Relaxed);
        let want = if queued <= low || queued < idle {
            (idle + lookahead).saturating_sub(queued)
        } else {
            0
        };
        let mut claimed_all = false;
        if want > 0 {
            match writer.claim(u32::try_from(want).unwrap_or(u32::MAX)) {
                Ok(jobs) => {
                    claimed_all = jobs.len() == want;
                    for job in jobs {
                        let stop = match StopHandle::new() {
                            Ok(s) => s,
                            Err(e) => {
                                // Out of descriptors: give the job back untouched.
                                log::error!("cannot run job {}: {e}", job.id);
                                writer.send(crate::writer::Op::Finish(Box::new(
                                    worker::interrupted(&job, &shared.config, &e.to_string()),
                                )));
                                continue;
                            }
                        };
                        shared.running.lock().insert(
                            job.run_token.clone(),
                            Running {
                                job_id: job.id,
                                stop,
                                lease_expires_at: job.lease_expires_at,
                            },
                        );
                        if work.send(job).is_err() {
                            return;
                        }
                    }
                }
                Err(e) => log::error!("claim failed: {e:#}"),
            }
        }
        if !claimed_all {
            shared.wait_for_wake(shared.config.poll_interval);
        }
    }
}

/// What a claim's round trip costs beyond its commit: waking the writer and the dispatcher.
const HANDOFF: Duration = Duration::from_millis(2).saturating_add(crate::writer::LINGER);

/// Over how long the rate of endings is measured: short, as a burst of short jobs that waits
/// for its first measurement runs without lookahead until then.
const RATE_WINDOW: Duration = Duration::from_millis(50);

/// Endings per second, over the last [`RATE_WINDOW`] or so.
struct RateMeter {
    at: Instant,
    count: u64,
    per_sec: f64,
}

impl RateMeter {
    fn new() -> Self {
        RateMeter {
            at: Instant::now(),
            count: 0,
            per_sec: 0.0,
        }
    }

    /// The rate, measured again once a window has passed, or sooner once `enough` endings
    /// have come in: a burst of short jobs should not run a whole window unaided.
    fn sample(&mut self, total: u64, enough: u64) -> f64 {
        let dt = self.at.elapsed().as_secs_f64();
        let ended = total - self.count;
        if dt >= RATE_WINDOW.as_secs_f64() || (ended >= enough && dt >= 0.005) {
            self.per_sec = ended as f64 / dt;
            self.count = total;
            self.at = Instant::now();
        }
        self.per_sec
    }
}

/// Tails the endings in the database and tells callbacks, subscribers and waiters.
fn notify_loop(
    store: &Store,
    shared: &Shared,
    stop: &Receiver<()>,
    subscribers: &Mutex<Vec<Sender<Completion>>>,
    callbacks: &[Callback],
    mut last: i64,
) {
    let mut seen = shared.endings_seen();
    loop {
        // With nobody to tell, reading the endings would only cost: this runner's own endings
        // wake its waiters directly, and a wait polls for other processes' endings.
        let listening = !callbacks.is_empty() || !subscribers.lock().is_empty();
        if !listening {
            last = store.last_event_id().unwrap_or(last);
            if matches!(
                stop.recv_timeout(shared.config.poll_interval),
                Err(crossbeam_channel::RecvTimeoutError::Disconnected)
            ) {
                return;
            }
            continue;
        }
        let stopping = matches!(
            stop.try_recv(),
            Err(crossbeam_channel::TryRecvError::Disconnected)
        );
        match store.endings_after(last, 1000) {
            Ok(events) => {
                let any = !events.is_empty();
                for e in events {
                    last = e.id;
                    let completion = completion(store, &e);
                    for cb in callbacks {
                        cb(&completion);
                    }
                    subscribers
                        .lock()
                        .retain(|s| s.send(completion.clone()).is_ok());
                }
                if any {
                    shared.endings_changed();
                    seen = shared.endings_seen();
                    continue;
                }
            }
            Err(e) => log::warn!("notifier: cannot read events: {e:#}"),
        }
        if stopping {
            return;
        }
        seen = shared.wait_for_endings(seen, shared.config.poll_interval);
    }
}

fn completion(store: &Store, e: &crate::job::Event) -> Completion {
    let job = store.job(e.job_id).ok();
    let detail = e.detail.clone().unwrap_or_default();
    let outcome = match e.kind.as_str() {
        "succeeded" => Outcome::Succeeded,
        "cancelled" => Outcome::Cancelled,
        kind => {
            // The row may have moved on since (an operator retried it): take the columns
            // only while they still describe this ending.
            let same = job
                .as_ref()
                .filter(|j| j.attempt == e.attempt && j.status == Status::Failed);
            Outcome::Failed {
                kind: same
                    .and_then(|j| j.error_kind)
                    .unwrap_or(if kind == "lost" {
                        ErrorKind::Lost
                    } else {
                        ErrorKind::Exit
                    }),
                exit_code: same.and_then(|j| j.exit_code),
                signal: same.and_then(|j| j.signal),
                message: detail,
            }
        }
    };
    Completion {
        job_id: e.job_id,
        attempt: e.attempt,
        outcome,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misordered_timing_ladder_names_the_setting() {
        let b = || Runner::builder("/nonexistent/x.db").lease_ttl(Duration::from_secs(3));
        match b().heartbeat_interval(Duration::from_secs(2)).start() {
            Err(Error::Invalid { setting, .. }) => assert_eq!(setting, "heartbeat_interval"),
            other => panic!("{other:?}"),
        }
        match b()
            .heartbeat_interval(Duration::from_secs(1))
            .sweep_interval(Duration::from_secs(4))
            .start()
        {
            Err(Error::Invalid { setting, .. }) => assert_eq!(setting, "sweep_interval"),
            other => panic!("{other:?}"),
        }
    }
}
