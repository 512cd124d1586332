//! The runner's settings: the builder, its defaults and bounds, and their validation.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::job::Outcome;
use crate::manners::{IoClass, Limits};
use crate::store::{
    DEFAULT_BUSY_TIMEOUT, DEFAULT_MAX_RECOVERY_ATTEMPTS, Durability, MAX_BUSY_TIMEOUT, Retention,
};

/// Worker threads, so jobs run at once. By default 4.
pub const DEFAULT_WORKERS: usize = 4;
/// How long a lease lasts unless renewed.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);
/// How often a runner renews its leases, with the default lease TTL. Unless it is given, the
/// heartbeat follows the lease TTL: a sixth of it, at least 100 ms, at most this (see
/// [`RunnerBuilder::lease_ttl`]).
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(5);
/// How often the sweeper looks for lost attempts, with the default lease TTL; unless it is
/// given, it follows the lease TTL as the heartbeat does.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(5);
/// How often a runner's sweeper samples the counters for the dashboard's charts.
pub const DEFAULT_SAMPLE_INTERVAL: Duration = Duration::from_secs(60);
/// Between SIGTERM and SIGKILL, with the default lease TTL; unless it is given, it follows
/// the lease TTL as the heartbeat does.
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(5);
/// The share of the lease TTL that the heartbeat, the sweep and the kill grace take by
/// default (when not given): a sixth, which keeps the timing ladder in order (heartbeat × 3,
/// and kill grace + heartbeat × 2, are half the lease), each at least [`LADDER_FLOOR`] and at
/// most its `DEFAULT_` constant (the defaults of a 30 s lease).
pub(crate) const LADDER_FRACTION: u32 = 6;
/// The least a default heartbeat, sweep or kill grace takes, however short the lease: so a
/// lease TTL shorter than 300 ms needs the heartbeat given (× 3 must fit it).
pub(crate) const LADDER_FLOOR: Duration = Duration::from_millis(100);
/// How many lost attempts one sweep reclaims at most.
pub const DEFAULT_RECLAIM_BATCH: u32 = 100;
/// The bytes of stdout and of stderr kept per attempt.
pub const DEFAULT_OUTPUT_TAIL: usize = 64 * 1024;
/// How long a runner waits for running jobs when it shuts down.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// After an attempt's main process exits, how long its pipes may stay open.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(1);
/// How often an idle dispatcher looks for jobs that became due (scheduled, backed off) or
/// whose wake-up it missed. Enqueues and retries in any process wake it at once.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(500);
/// The most worker threads a runner starts: each is an OS thread supervising one process
/// group, and past this many the machine, not the runner, is the limit.
pub const MAX_WORKERS: usize = 1024;
/// The longest any of a runner's time settings may be: what SQLite's busy timeout (a C `int`
/// of milliseconds) can take, about 24.8 days. The lease TTL bounds the busy timeouts of the
/// runner's connections, and every setting must survive millisecond and `Instant` arithmetic.
pub const MAX_SETTING_DURATION: Duration = MAX_BUSY_TIMEOUT;
/// The most bytes of stdout and of stderr a runner keeps per attempt.
pub const MAX_OUTPUT_TAIL: usize = 64 * 1024 * 1024;

/// A runner's settings; see [`RunnerBuilder`].
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub path: PathBuf,
    pub workers: usize,
    pub queues: Vec<String>,
    /// This runner's own limits, for some of `queues`.
    pub queue_limits: Vec<(String, usize)>,
    pub lease_ttl: Duration,
    pub heartbeat_interval: Duration,
    pub sweep_interval: Duration,
    pub sample_interval: Duration,
    pub kill_grace: Duration,
    pub max_recovery_attempts: u32,
    pub reclaim_batch: u32,
    pub retention: Retention,
    pub durability: Durability,
    pub output_tail: usize,
    pub shutdown_grace: Duration,
    pub drain_timeout: Duration,
    pub poll_interval: Duration,
    /// Run each attempt under a keeper (see [`RunnerBuilder::keepers`]).
    pub keepers: bool,
    /// The manners (nice, I/O class) of jobs that set none.
    pub manners: Limits,
    /// The cap of each stream's file of a kept attempt.
    pub output_cap: u64,
    /// What shutdown does with running attempts.
    pub on_shutdown: OnShutdown,
    /// Which of the settings that follow the lease TTL were given; the others follow it.
    pub given: Given,
    /// The clock every connection of the runner reads (see [`RunnerBuilder::clock`]).
    pub clock: crate::store::Clock,
    /// Whether a condition the runner cannot tell holds (see
    /// [`RunnerBuilder::assume_unknown_conditions`]).
    pub assume_unknown_conditions: bool,
}

/// Which of the settings that follow the lease TTL by default were set explicitly: a ladder
/// that a default breaks is refused naming the lease TTL, one that a given setting breaks
/// naming that setting.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Given {
    pub heartbeat: bool,
    pub sweep: bool,
    pub kill_grace: bool,
}

/// The default of a setting that follows the lease TTL: a [`LADDER_FRACTION`] of it, between
/// [`LADDER_FLOOR`] and `cap`.
fn following(lease_ttl: Duration, cap: Duration) -> Duration {
    (lease_ttl / LADDER_FRACTION).clamp(LADDER_FLOOR, cap)
}

/// What [`Runner::shutdown`](crate::Runner::shutdown) (and a `leasehold run` that is told to
/// stop) does with the attempts still running once the shutdown grace has passed, or at once
/// for [`OnShutdown::Leave`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnShutdown {
    /// Give them the shutdown grace, then kill them and give their jobs back (pending, no
    /// attempt or recovery spent). The default: a runner that stops leaves nothing behind.
    #[default]
    Interrupt,
    /// Return at once and leave them running under their keepers: the next runner on the
    /// file adopts them, or records how they ended. Needs [`RunnerBuilder::keepers`] (the
    /// default); without keepers it is refused at start.
    Leave,
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

/// A caller's callback for every ending.
pub(super) type Callback = Box<dyn Fn(&Completion) + Send + Sync>;

/// Builds and starts a [`Runner`](crate::Runner).
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
    pub(super) config: Config,
    pub(super) callbacks: Vec<Callback>,
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
                queue_limits: Vec::new(),
                lease_ttl: DEFAULT_LEASE_TTL,
                heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
                sweep_interval: DEFAULT_SWEEP_INTERVAL,
                sample_interval: DEFAULT_SAMPLE_INTERVAL,
                kill_grace: DEFAULT_KILL_GRACE,
                max_recovery_attempts: DEFAULT_MAX_RECOVERY_ATTEMPTS,
                reclaim_batch: DEFAULT_RECLAIM_BATCH,
                retention: Retention::default(),
                durability: Durability::Full,
                output_tail: DEFAULT_OUTPUT_TAIL,
                shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
                drain_timeout: DEFAULT_DRAIN_TIMEOUT,
                poll_interval: DEFAULT_POLL_INTERVAL,
                keepers: true,
                assume_unknown_conditions: true,
                manners: Limits::default(),
                output_cap: crate::files::DEFAULT_OUTPUT_CAP,
                on_shutdown: OnShutdown::Interrupt,
                given: Given::default(),
                clock: crate::store::Clock::system(),
            },
            callbacks: Vec::new(),
        }
    }

    /// How many jobs run at once. By default, 4.
    pub fn workers(mut self, workers: usize) -> Self {
        self.config.workers = workers;
        self
    }

    /// Takes jobs from this queue (call again to add more), at most `limit` of them at once
    /// in this runner, or with `None` as many as the workers take. `workers` stays the total:
    /// queues without a limit share the pool, and a worker never idles while a queue it serves
    /// has a ready job its limit allows. A limit stored in the file
    /// ([`Store::set_queue_limit`](crate::Store::set_queue_limit)) holds as well. By default,
    /// every queue, without a limit of the runner's.
    ///
    /// ```no_run
    /// # fn main() -> leasehold::Result<()> {
    /// use leasehold::Runner;
    ///
    /// // Two transcodes at a time, one upload, anything else on the rest of 4 workers.
    /// let runner = Runner::builder("jobs.db")
    ///     .workers(4)
    ///     .queue("transcode", 2)
    ///     .queue("upload", 1)
    ///     .queue("default", None)
    ///     .start()?;
    /// # runner.shutdown()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn queue(mut self, queue: impl Into<String>, limit: impl Into<Option<usize>>) -> Self {
        let queue = queue.into();
        self.config.queue_limits.retain(|(q, _)| *q != queue);
        if let Some(limit) = limit.into() {
            self.config.queue_limits.push((queue.clone(), limit));
        }
        if !self.config.queues.contains(&queue) {
            self.config.queues.push(queue);
        }
        self
    }

    /// How long a lease lasts unless renewed: a runner that stops renewing loses its jobs
    /// this long after its last renewal.
    ///
    /// On PostgreSQL it also bounds the runner's sessions: a statement runs for at most half
    /// of it (`statement_timeout`), and the server ends a session of the runner that sits in
    /// an open transaction for as long (`idle_in_transaction_session_timeout`: a frozen
    /// runner's locks do not outlive its leases).
    ///
    /// The heartbeat, the sweep interval and the kill grace that are not given follow it: a
    /// sixth of it each, at least 100 ms and at most
    /// their 5 s defaults, so `lease_ttl(10 s)` alone renews every 1.67 s. A lease shorter than
    /// 300 ms needs the heartbeat given. By default, 30 s.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        let c = &mut self.config;
        c.lease_ttl = ttl;
        if !c.given.heartbeat {
            c.heartbeat_interval = following(ttl, DEFAULT_HEARTBEAT_INTERVAL);
        }
        if !c.given.sweep {
            c.sweep_interval = following(ttl, DEFAULT_SWEEP_INTERVAL);
        }
        if !c.given.kill_grace {
            c.kill_grace = following(ttl, DEFAULT_KILL_GRACE);
        }
        self
    }

    /// How often leases are renewed; at most a third of the lease TTL.
    ///
    /// On PostgreSQL it also bounds the runner's waits: a statement waits for a lock for at
    /// most half of it (`lock_timeout`; the transaction then runs again, so a renewal is
    /// tried again within its heartbeat), and connecting, TCP keepalives (3 probes) and
    /// unacknowledged data (`tcp_user_timeout`) get one heartbeat each (at least 1 s). By
    /// default, a sixth of the lease TTL between 100 ms and 5 s (5 s for the default lease).
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.config.heartbeat_interval = interval;
        self.config.given.heartbeat = true;
        self
    }

    /// How often the sweeper reclaims lost attempts; at most the lease TTL. By default, a
    /// sixth of the lease TTL between 100 ms and 5 s (5 s for the default lease).
    pub fn sweep_interval(mut self, interval: Duration) -> Self {
        self.config.sweep_interval = interval;
        self.config.given.sweep = true;
        self
    }

    /// How often the sweeper samples the durable counters and the running and ready jobs
    /// into the file's small `metric_samples` table, which the dashboard's charts read: the
    /// charts show 60 intervals at this step and 24 spans of 60 intervals. At least 1 s; a
    /// sample is taken at the start of each interval on the wall clock, whatever the sweep
    /// interval, and one more as the runner starts and as it stops (so a short batch is
    /// charted). Runners on one file share the samples: each interval is sampled once. By
    /// default, 60 s (an hour and a day).
    pub fn sample_interval(mut self, interval: Duration) -> Self {
        self.config.sample_interval = interval;
        self
    }

    /// Between SIGTERM and SIGKILL when an attempt's group is killed; with two heartbeats,
    /// at most the lease TTL. By default, a sixth of the lease TTL between 100 ms and 5 s
    /// (5 s for the default lease).
    pub fn kill_grace(mut self, grace: Duration) -> Self {
        self.config.kill_grace = grace;
        self.config.given.kill_grace = true;
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

    /// How long finished jobs are kept: the sweeper prunes the rest on its cadence, a few
    /// small batches a sweep. [`Retention::keep_all`] turns pruning off. By default,
    /// [`Retention::default`] (succeeded 7 days, failed and cancelled 30 days, no cap).
    pub fn retention(mut self, retention: Retention) -> Self {
        self.config.retention = retention;
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

    /// Whether each attempt runs under a keeper: a small process (started from memory, nothing
    /// installed) that is the command's parent, writes its output to files beside the database
    /// (`<db>-attempts/`) and its outcome once it ends, and outlives the runner. A runner that
    /// dies or leaves then costs the attempt nothing: the next runner adopts it or records its
    /// outcome, and finished work is never run again. On by default; off, the runner is the
    /// command's parent and keeps only the output's tails, which starts jobs faster (see the
    /// README's Performance section) but reruns an attempt whose runner died.
    pub fn keepers(mut self, on: bool) -> Self {
        self.config.keepers = on;
        self
    }

    /// Whether a condition on jobs ([`Condition`](crate::Condition)) that this machine cannot
    /// tell counts as holding: `online` and `unmetered` where NetworkManager does not answer on
    /// the system bus, `idle` where logind does not. The runner looks every
    /// [`CONDITION_INTERVAL`](crate::CONDITION_INTERVAL) and `leasehold status` says what it
    /// assumed. By default, true: a machine without NetworkManager (a server, a container) runs
    /// such jobs rather than hold them forever; false holds them until it can tell.
    pub fn assume_unknown_conditions(mut self, holds: bool) -> Self {
        self.config.assume_unknown_conditions = holds;
        self
    }

    /// The nice value (-20 to 19) of every command whose job sets none ([`Job::nice`]):
    /// systemd's `Nice=` for a service's jobs. By default, none: commands run at the runner's.
    ///
    /// [`Job::nice`]: crate::Job::nice
    pub fn nice(mut self, nice: i32) -> Self {
        self.config.manners.nice = Some(nice);
        self
    }

    /// The I/O class of every command whose job sets none ([`Job::io_class`]): systemd's
    /// `IOSchedulingClass=`. By default, none: commands keep the runner's.
    ///
    /// [`Job::io_class`]: crate::Job::io_class
    pub fn io_class(mut self, class: IoClass) -> Self {
        self.config.manners.io_class = Some(class);
        self
    }

    /// The most bytes of a kept attempt's stdout file, and of its stderr file: past it, the
    /// first half and the newest bytes are kept, with a marker of how many were dropped
    /// between. 0: no cap. By default, 64 MiB.
    pub fn output_cap(mut self, bytes: u64) -> Self {
        self.config.output_cap = bytes;
        self
    }

    /// What shutdown does with running attempts: [`OnShutdown::Interrupt`] (the default) or
    /// [`OnShutdown::Leave`].
    pub fn on_shutdown(mut self, what: OnShutdown) -> Self {
        self.config.on_shutdown = what;
        self
    }

    /// How long [`Runner::shutdown`](crate::Runner::shutdown)(crate::Runner::shutdown) (and drop) lets running jobs finish before killing
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

    /// How often an idle runner looks for work nobody woke it for: jobs that became due (a
    /// `run_at`, a retry's backoff) and enqueues whose wake-up was lost. Enqueues and retries
    /// wake it at once, from this process or another (see the README's wake-up section), so
    /// this bounds only how late a scheduled job starts, and what an idle runner costs. It
    /// also bounds how late [`Runner::wait`](crate::Runner::wait) sees another process's
    /// ending. By default, 500 ms.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.config.poll_interval = interval;
        self
    }

    /// The clock the runner's stores read: a [`ManualClock`](crate::ManualClock)'s for a test
    /// that moves time, which then moves due times, backoff, schedules, retention and lease
    /// expiry for this runner (its waits between polls, heartbeats and sweeps stay real: see
    /// docs/testing.md). In a build with the `testing` feature a runner on a
    /// `leasehold::testing::TestDb`'s file takes its clock without this. By default, the
    /// system's clock.
    pub fn clock(mut self, clock: impl Into<crate::store::Clock>) -> Self {
        self.config.clock = clock.into();
        self
    }

    /// Calls `f` once for every ending of every job on the database (succeeded, failed,
    /// lost, cancelled), including jobs that other processes ran, from the runner's
    /// notifier thread. Endings written before the runner started are not reported.
    pub fn on_complete(mut self, f: impl Fn(&Completion) + Send + Sync + 'static) -> Self {
        self.callbacks.push(Box::new(f));
        self
    }
}

/// The setting a misordered ladder is blamed on: the one that breaks it when it was given,
/// else the lease TTL, whose default it followed (said in the note).
fn blame(setting: &'static str, given: bool) -> (&'static str, String) {
    if given {
        (setting, String::new())
    } else {
        (
            "lease_ttl",
            format!(
                " (its default for this lease: 1/{LADDER_FRACTION} of it, at least {}s)",
                LADDER_FLOOR.as_secs_f64()
            ),
        )
    }
}

/// Checks every setting before anything starts: each within what the runner's arithmetic
/// and SQLite can represent, and the timing ladder in order.
pub(super) fn validate(c: &Config) -> Result<()> {
    c.manners.validate()?;
    if c.on_shutdown == OnShutdown::Leave && !c.keepers {
        return Err(Error::invalid(
            "on_shutdown",
            "leaving attempts running at shutdown needs keepers, which are off",
        ));
    }
    let secs = |d: Duration| d.as_secs_f64();
    if c.workers == 0 || c.workers > MAX_WORKERS {
        return Err(Error::invalid(
            "workers",
            format!("{} is out of range: must be 1 to {MAX_WORKERS}", c.workers),
        ));
    }
    if c.queues.iter().any(String::is_empty) {
        return Err(Error::invalid("queue", "the queue name is empty"));
    }
    if let Some((q, _)) = c.queue_limits.iter().find(|(_, n)| *n == 0) {
        return Err(Error::invalid(
            "queue",
            format!("queue {q}: a limit of 0 would never run its jobs (pause it instead)"),
        ));
    }
    if c.output_tail > MAX_OUTPUT_TAIL {
        return Err(Error::invalid(
            "output_tail",
            format!(
                "{} bytes is more than the most a runner keeps, {MAX_OUTPUT_TAIL}",
                c.output_tail
            ),
        ));
    }
    for (name, d, may_be_zero) in [
        ("lease_ttl", c.lease_ttl, false),
        ("heartbeat_interval", c.heartbeat_interval, false),
        ("sweep_interval", c.sweep_interval, false),
        ("sample_interval", c.sample_interval, false),
        ("poll_interval", c.poll_interval, false),
        ("kill_grace", c.kill_grace, true),
        ("shutdown_grace", c.shutdown_grace, true),
        ("drain_timeout", c.drain_timeout, true),
    ] {
        if d.is_zero() && !may_be_zero {
            return Err(Error::invalid(name, "must be greater than 0"));
        }
        if d > MAX_SETTING_DURATION {
            return Err(Error::invalid(
                name,
                format!(
                    "{}s is too long: at most {}s (about 24.8 days)",
                    secs(d),
                    secs(MAX_SETTING_DURATION)
                ),
            ));
        }
    }
    // Cannot overflow: the heartbeat is at most MAX_SETTING_DURATION, far below a third of
    // Duration::MAX; checked all the same, so a future bound change cannot make it panic.
    if c.heartbeat_interval
        .checked_mul(3)
        .is_none_or(|d| d > c.lease_ttl)
    {
        let (setting, note) = blame("heartbeat_interval", c.given.heartbeat);
        return Err(Error::invalid(
            setting,
            format!(
                "heartbeat {}s{note} × 3 exceeds the lease TTL of {}s: a lease must survive two missed renewals",
                secs(c.heartbeat_interval),
                secs(c.lease_ttl)
            ),
        ));
    }
    // An attempt whose renewal is late is killed by its lease's expiry less the kill grace
    // (see the heartbeat), so that it is dead before another runner may reclaim it. With the
    // grace and two heartbeats inside the lease, a renewal that misses one beat still has a
    // heartbeat's time before any attempt is killed; a longer grace would make one slow
    // renewal kill every attempt.
    if c.kill_grace
        .checked_add(c.heartbeat_interval.saturating_mul(2))
        .is_none_or(|d| d > c.lease_ttl)
    {
        let (setting, note) = blame("kill_grace", c.given.kill_grace);
        return Err(Error::invalid(
            setting,
            format!(
                "kill grace {}s{note} plus two heartbeats of {}s exceeds the lease TTL of {}s: a \
                 renewal that misses one beat would kill every attempt",
                secs(c.kill_grace),
                secs(c.heartbeat_interval),
                secs(c.lease_ttl)
            ),
        ));
    }
    if c.sample_interval < Duration::from_secs(1) {
        return Err(Error::invalid(
            "sample_interval",
            format!("{}s is too short: at least 1s", secs(c.sample_interval)),
        ));
    }
    if c.sweep_interval > c.lease_ttl {
        let (setting, note) = blame("sweep_interval", c.given.sweep);
        return Err(Error::invalid(
            setting,
            format!(
                "sweep {}s{note} exceeds the lease TTL of {}s",
                secs(c.sweep_interval),
                secs(c.lease_ttl)
            ),
        ));
    }
    Ok(())
}

/// The busy timeout of the connections whose loops retry a busy database themselves (the
/// writer, the schedule firer): at most a lease TTL, so that a shutdown beside another
/// process's write lock is not held behind one long wait.
pub(super) fn short_busy(cfg: &Config) -> Duration {
    DEFAULT_BUSY_TIMEOUT.min(cfg.lease_ttl)
}
