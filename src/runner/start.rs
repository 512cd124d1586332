//! Start-up: checking the settings, registering the runner, recovering what dead runners
//! left, and starting its threads under supervision. A start that fails after its first
//! thread unwinds through the ordinary shutdown.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, bounded, unbounded};
use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::job::duration_ms;
use crate::process;
use crate::store::wake;
use crate::store::{DEFAULT_BUSY_TIMEOUT, OpenOptions, RunnerRecord, Store};

use super::builder::{Callback, Config, short_busy, validate};
use super::shared::{Shared, Writer, panic_message};
use super::sweeper::Sweeper;
use super::{
    Runner, RunnerBuilder, Threads, condition, dispatcher, firer, heartbeat, listener, notifier,
    worker,
};

impl RunnerBuilder {
    /// Checks the settings, opens the database, recovers what dead runners left, and starts
    /// the runner's threads.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`](crate::Error::Invalid) naming the setting for a misordered timing ladder (heartbeat × 3
    /// must not exceed the lease TTL, nor the kill grace plus two heartbeats, nor the sweep
    /// interval) or a zero value, and naming `SIGCHLD` when this process ignores it (or its
    /// handler has `SA_NOCLDWAIT`): its children's exit statuses would be lost; the errors of [`Store::open`]; [`Error::Io`](crate::Error::Io) when a thread cannot start;
    /// [`Error::WakeFolder`](crate::Error::WakeFolder) when the wake-up folder beside the
    /// database (`<db>-wake/`) could be used by another user (not a directory, not this
    /// user's, or with a group or other permission bit);
    /// [`Error::KeeperUnavailable`](crate::Error::KeeperUnavailable) when, with keepers, the
    /// keeper program cannot run here.
    ///
    /// A start that fails because the database server could not be reached or ended the
    /// connection (a restart, a cut, a server still starting: a PostgreSQL database) is tried
    /// again from its beginning, with backoff (100 ms doubling to 5 s, each wait logged at
    /// warn), for up to a lease TTL (at least 10 s); a refusal (a wrong password, a missing
    /// database) is returned at once.
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
        let callbacks = Arc::new(self.callbacks);
        let limit = self.config.lease_ttl.max(START_RETRY_MIN);
        let first = Instant::now();
        let mut backoff = START_BACKOFF_MIN;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            match Runner::start(self.config.clone(), Arc::clone(&callbacks)) {
                Err(e) if e.is_connection() && first.elapsed() + backoff < limit => {
                    let cause = std::error::Error::source(&e)
                        .map(|s| format!(": {s}"))
                        .unwrap_or_default();
                    log::warn!(
                        "cannot start a runner on {} (attempt {attempt}): {e}{cause}; waiting \
                         {backoff:.1?} for the database to answer again (trying for {limit:.0?})",
                        crate::store::redacted_db(&self.config.path)
                    );
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(START_BACKOFF_MAX);
                }
                other => return other,
            }
        }
    }
}

/// How long a start is tried again at least, while it fails for a connection that was lost
/// or a server out of reach (a restart, a cut, a server still starting); a lease TTL when
/// that is longer. A refusal (a wrong password, a missing database) fails at once.
const START_RETRY_MIN: Duration = Duration::from_secs(10);
/// The first wait between two tries of a start; it doubles up to [`START_BACKOFF_MAX`].
const START_BACKOFF_MIN: Duration = Duration::from_millis(100);
const START_BACKOFF_MAX: Duration = Duration::from_secs(5);

impl Runner {
    /// Opens one of the runner's connections. Only the first (`migrate`) creates and
    /// migrates the file; the others find it current and need no write transaction.
    pub(super) fn open(config: &Config, busy: Duration, migrate: bool) -> Result<Store> {
        Store::open_with(
            &config.path,
            &OpenOptions::new()
                .create(migrate)
                .migrate(migrate)
                .durability(config.durability)
                .busy_timeout(busy)
                .clock(config.clock.clone())
                .lease(config.lease_ttl, config.heartbeat_interval),
        )
    }

    pub(super) fn start(mut config: Config, callbacks: Arc<Vec<Callback>>) -> Result<Runner> {
        // Refused before the file is opened (or made), which leaves it as it was. The bind
        // below checks again, whether it makes the folder or finds it.
        if let Err(e @ Error::WakeFolder { .. }) = wake::check(&wake::folder(&config.path)) {
            return Err(e);
        }
        let mut api = Runner::open(&config, DEFAULT_BUSY_TIMEOUT, true)?;
        // Before the runner's first write (its record): a damaged file is refused untouched.
        api.refuse_if_damaged()?;
        // The clock the file was opened with (a test database's, in a `testing` build), for
        // every later connection and the times the threads read.
        config.clock = api.clock().clone();
        let containment = if config.keepers {
            // Made beside the file once it is known to be a database of ours.
            let folder = crate::files::folder(&config.path);
            crate::files::prepare_folder(&folder)?;
            // Checked once here rather than found out by every attempt.
            let containment = process::probe_keeper(&folder)
                .map_err(|reason| Error::KeeperUnavailable { reason })?;
            process::warn_if_namespace_init();
            containment
        } else {
            process::Containment::Groups("no keepers".to_owned())
        };
        let containment_text = format!(
            "{}; {}",
            containment.describe(),
            process::caps_in_force(&containment)
        );
        log::info!("attempts contained by {containment_text}");
        let pid = std::process::id() as i64;
        let suffix = random_hex();
        let worker_id = format!("{}:{}:{}", process::hostname(), pid, suffix);
        // Bound before the first claim, so that no enqueue committed after that claim goes
        // unnoticed. Without it the runner still works, on its poll.
        let listener = match wake::Listener::bind(&config.path, &format!("{pid}-{suffix}")) {
            Ok(l) => Some(l),
            // Another user could bind a socket beside this runner's and take the jobs that
            // commands hand over: refused, not worked around.
            Err(e @ Error::WakeFolder { .. }) => return Err(e),
            Err(e) => {
                let cause = std::error::Error::source(&e)
                    .map(|s| format!(": {s}"))
                    .unwrap_or_default();
                log::warn!(
                    "no wake-up socket beside {} ({e}{cause}): jobs enqueued by other \
                     processes start on the next poll",
                    crate::store::redacted_db(&config.path)
                );
                None
            }
        };
        api.set_own_socket(listener.as_ref().map(|l| l.path().to_path_buf()));
        let now = api.now();
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
            containment: Some(containment_text),
            conditions_held: None,
            conditions_note: None,
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
    pub(super) fn start_threads(
        &self,
        threads: &mut Threads,
        listener: Option<wake::Listener>,
        firer_wake_rx: Receiver<()>,
        callbacks: Arc<Vec<Callback>>,
    ) -> Result<()> {
        let shared = Arc::clone(&self.shared);
        let cfg = &shared.config;
        // Recover what dead runners left before taking any work.
        let sweeper = Sweeper::new(
            Runner::open(cfg, cfg.lease_ttl, false)?,
            Arc::clone(&shared),
        );
        sweeper.start_and_log(sweeper.now());

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
        // The writer's channels exist before its thread, for the sweeper's adopted attempts.
        let (writer, writer_loop) = Writer::new(Arc::clone(&shared));
        #[cfg(feature = "postgres")]
        let stop_listen = stop_rx.clone();
        let conditions_stop = stop_rx.clone();
        drop(stop_rx);
        {
            let (sweep_stop_tx, stop) = unbounded::<()>();
            threads.stop_sweeper = Some(sweep_stop_tx);
            let (shared, writer) = (Arc::clone(&shared), writer.clone());
            threads.sweeper = Some(spawn_thread(
                "leasehold-sweeper",
                "sweeper",
                &Arc::clone(&shared),
                move || {
                    while let Err(crossbeam_channel::RecvTimeoutError::Timeout) =
                        stop.recv_timeout(sweeper.until_next())
                    {
                        shared.test_hook("sweeper");
                        sweeper.tick_and_log(sweeper.now());
                        super::adopt::start(&shared, &writer);
                    }
                    let now = sweeper.now();
                    sweeper.stop_and_log(now);
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
                    listener::listen(listener, &shared, &firer_wake, &config);
                    Ok(())
                },
            )?);
        }
        #[cfg(feature = "postgres")]
        if crate::store::pg::is_url(&cfg.path) {
            let (shared, stop) = (Arc::clone(&shared), stop_listen);
            let firer_wake = self.firer_wake.clone();
            let config = cfg.clone();
            threads.background.push(spawn_thread(
                "leasehold-listen",
                "announcement listener",
                &Arc::clone(&shared),
                move || {
                    listener::listen_postgres(&config, &shared, &firer_wake, &stop);
                    Ok(())
                },
            )?);
        }
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
        // The condition thread after the writer: its looks open and close descriptors
        // (power supply files, the system bus) that would otherwise race the writer's
        // connection for the lowest free descriptor. Until its first look nothing a
        // condition needs is claimed (the shared mask starts with every condition unheld).
        {
            let store = Runner::open(cfg, short_busy(cfg), false)?;
            let (shared, stop) = (Arc::clone(&shared), conditions_stop);
            threads.background.push(spawn_thread(
                "leasehold-conditions",
                "condition",
                &Arc::clone(&shared),
                move || {
                    condition::run(&store, &shared, &stop);
                    Ok(())
                },
            )?);
        }
        // What the first sweep adopted, now that endings can be written.
        super::adopt::start(&shared, &writer);
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
}

/// Starts one of the runner's threads under supervision: a panic, an error, or an end before
/// shutdown fences the runner (see [`Shared::fail`]) instead of leaving it half-alive.
pub(super) fn spawn_thread(
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
                Ok(Err(e)) if shared.stop_if_damaged(role, &e) => return,
                Ok(Err(e)) => format!("{e:#}"),
                Err(panic) => format!("panicked: {}", panic_message(panic.as_ref())),
            };
            shared.fail(role, cause);
        })
        .map_err(|e| Error::io(format!("cannot start thread {name}"), e))
}

/// Eight random hex digits, to tell apart runners that reuse a pid.
pub(super) fn random_hex() -> String {
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
