//! Jobs: the builder a caller enqueues, the state machine, and what a job looks like stored.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::condition::{Condition, WhenLost, from_mask};
use crate::error::{Error, Result};
use crate::manners::{IoClass, Limits};

/// By default a job runs once: a failure is final.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 1;
/// The first retry waits this long; each later one waits twice as long as the one before.
pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_secs(1);
/// No retry waits longer than this.
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(3600);
/// The queue a job goes to unless it names another.
pub const DEFAULT_QUEUE: &str = "default";

/// Milliseconds since the Unix epoch, UTC: how leasehold stores and compares times.
pub fn now_ms() -> i64 {
    to_ms(SystemTime::now())
}

/// Milliseconds since the Unix epoch, saturating at `i64::MIN` and `i64::MAX` (some 292
/// million years away: only a time a caller made up is that far).
pub(crate) fn to_ms(t: SystemTime) -> i64 {
    checked_to_ms(t).unwrap_or(if t < UNIX_EPOCH { i64::MIN } else { i64::MAX })
}

/// Milliseconds since the Unix epoch, or `None` when they do not fit an i64.
fn checked_to_ms(t: SystemTime) -> Option<i64> {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).ok(),
        Err(e) => i64::try_from(e.duration().as_millis()).ok()?.checked_neg(),
    }
}

/// Whole milliseconds, rounded up, saturating at `i64::MAX`. [`Job::validate`] refuses a
/// job whose durations would saturate, so a stored job's are exact.
pub(crate) fn duration_ms(d: Duration) -> i64 {
    checked_duration_ms(d).unwrap_or(i64::MAX)
}

/// Whole milliseconds, rounded up (a timeout of 400 µs must not be stored as none at all),
/// or `None` when they do not fit an i64.
fn checked_duration_ms(d: Duration) -> Option<i64> {
    i64::try_from(d.as_micros().div_ceil(1000)).ok()
}

/// What happened to a job: one row of its history in `job_events`. The spelling in the
/// database is [`EventKind::as_str`]. Each is written in the transaction of the transition it
/// records. A [`Started`](EventKind::Started) committed together with its attempt's ending
/// is not a row of its own: the ending's row carries it (`start_detail`), and the history
/// reads it back as a `started` event before the ending.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EventKind {
    /// The job was written (the detail names its queue).
    Enqueued,
    /// A runner claimed it (the detail names the runner).
    Claimed,
    /// The attempt's process started (the detail gives pid and pgid).
    Started,
    /// The attempt exited 0.
    Succeeded,
    /// The attempt failed with no attempts left, could not start, or was lost beyond the
    /// recovery budget.
    Failed,
    /// The attempt failed and a retry is scheduled after a backoff.
    RetryScheduled,
    /// The attempt was lost (its lease expired, its runner died or fenced itself) and the job
    /// went back to pending within the recovery budget.
    Reclaimed,
    /// The attempt was lost and the job failed as lost: budget spent or `on_lost = fail`.
    Lost,
    /// A lost attempt's processes were dealt with; the job may be claimed again.
    TornDown,
    /// A process of the attempt outlived it and was killed.
    Leaked,
    /// A runner shut down during the attempt and gave the job back without spending a try.
    Interrupted,
    /// A caller cancelled the job.
    Cancelled,
    /// The attempt a cancel stopped has ended, as its runner saw it: the detail says how. The
    /// job stays cancelled; this is the cancel's expected end, not a late result.
    AttemptStopped,
    /// An operator retried the job.
    ManualRetry,
    /// A result arrived for an attempt that no longer held the lease, and changed nothing.
    LateResultDiscarded,
    /// Slots of a schedule passed while no runner could fire them and were not caught up
    /// (a schedule's history; the detail gives the count and the slots' range).
    ScheduleMissed,
    /// A slot of a schedule enqueued nothing because its earlier job was still pending or
    /// running (overlap `skip`), or its unique key matched a job (a schedule's history).
    ScheduleSkipped,
    /// The attempt's runner was gone, and its keeper had written how the command ended: the
    /// ending recorded with it is the keeper's (the detail says how and when), with no rerun.
    OutcomeRecovered,
    /// A runner took over a running attempt whose runner was gone and whose keeper was
    /// alive: the lease moved to it, the attempt and its run token stayed the same.
    Adopted,
    /// The command exited 75 (`EX_TEMPFAIL`): requeued with its backoff, no attempt spent
    /// ([`Job::tempfail_max`]).
    TryLater,
}

impl EventKind {
    /// Every kind.
    pub const ALL: [EventKind; 20] = [
        EventKind::Enqueued,
        EventKind::Claimed,
        EventKind::Started,
        EventKind::Succeeded,
        EventKind::Failed,
        EventKind::RetryScheduled,
        EventKind::Reclaimed,
        EventKind::Lost,
        EventKind::TornDown,
        EventKind::Leaked,
        EventKind::Interrupted,
        EventKind::Cancelled,
        EventKind::AttemptStopped,
        EventKind::ManualRetry,
        EventKind::LateResultDiscarded,
        EventKind::ScheduleMissed,
        EventKind::ScheduleSkipped,
        EventKind::OutcomeRecovered,
        EventKind::Adopted,
        EventKind::TryLater,
    ];

    /// The kind as stored in the `kind` column of `job_events`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Enqueued => "enqueued",
            EventKind::Claimed => "claimed",
            EventKind::Started => "started",
            EventKind::Succeeded => "succeeded",
            EventKind::Failed => "failed",
            EventKind::RetryScheduled => "retry_scheduled",
            EventKind::Reclaimed => "reclaimed",
            EventKind::Lost => "lost",
            EventKind::TornDown => "torn_down",
            EventKind::Leaked => "leaked",
            EventKind::Interrupted => "interrupted",
            EventKind::Cancelled => "cancelled",
            EventKind::AttemptStopped => "attempt_stopped",
            EventKind::ManualRetry => "manual_retry",
            EventKind::LateResultDiscarded => "late_result_discarded",
            EventKind::ScheduleMissed => "schedule_missed",
            EventKind::ScheduleSkipped => "schedule_skipped",
            EventKind::OutcomeRecovered => "outcome_recovered",
            EventKind::Adopted => "adopted",
            EventKind::TryLater => "try_later",
        }
    }

    /// The kind spelled `s` in the database, if any.
    pub(crate) fn parse(s: &str) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for EventKind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// Where a job is in its life. The spelling in the database is [`Status::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// Waiting for its `scheduled_at`, then for a runner to claim it. A runner's claim moves it
    /// to running; an operator's cancel moves it to cancelled.
    Pending,
    /// A runner holds its lease and runs an attempt. The attempt's ending moves it on (its
    /// worker), and so do a reclaim of an expired lease (a sweeper), a cancel, or an operator's
    /// retry once the lease is gone.
    Running,
    /// The command exited 0. Final.
    Succeeded,
    /// The command failed with no attempts left, could not start, or was lost beyond the
    /// recovery budget. An operator's retry moves it back to pending.
    Failed,
    /// Cancelled by a caller. An operator's retry moves it back to pending.
    Cancelled,
}

impl Status {
    /// Every status, in the order of a job's life.
    pub const ALL: [Status; 5] = [
        Status::Pending,
        Status::Running,
        Status::Succeeded,
        Status::Failed,
        Status::Cancelled,
    ];

    /// The status as stored in the `status` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Running => "running",
            Status::Succeeded => "succeeded",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
        }
    }

    /// True for the statuses that end a job: succeeded, failed and cancelled.
    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Succeeded | Status::Failed | Status::Cancelled)
    }
}

impl std::str::FromStr for Status {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Status::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| {
                Error::invalid(
                    "status",
                    format!("{s:?} is not one of pending, running, succeeded, failed, cancelled"),
                )
            })
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an attempt failed, as stored in the `error_kind` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The command exited with a non-zero code.
    Exit,
    /// The command was killed by a signal it did not get from leasehold.
    Signal,
    /// The attempt ran past the job's timeout and its process group was killed.
    Timeout,
    /// The attempt wrote no output for the job's idle timeout and its group was killed.
    IdleTimeout,
    /// The attempt's lease was lost (its runner died, froze or could not renew).
    Lost,
    /// The command could not be started for a reason of its own (not found, not executable,
    /// a bad working directory). Never retried. A runner short of descriptors, processes or
    /// memory gives the job back instead.
    Spawn,
    /// The attempt was killed for its memory cap ([`Job::memory_max`]): the cgroup's OOM
    /// killer in the cgroup mode; in the rlimit mode, a failed command whose stderr says an
    /// allocation failed (see docs/manners.md).
    Memory,
}

impl ErrorKind {
    /// The kind as stored in the `error_kind` column.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Exit => "exit",
            ErrorKind::Signal => "signal",
            ErrorKind::Timeout => "timeout",
            ErrorKind::IdleTimeout => "idle_timeout",
            ErrorKind::Lost => "lost",
            ErrorKind::Spawn => "spawn",
            ErrorKind::Memory => "memory",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        [
            ErrorKind::Exit,
            ErrorKind::Signal,
            ErrorKind::Timeout,
            ErrorKind::IdleTimeout,
            ErrorKind::Lost,
            ErrorKind::Spawn,
            ErrorKind::Memory,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What to do with a job whose attempt was lost (its lease expired or its runner died).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum OnLost {
    /// Run it again, while its recovery budget lasts. The default: for idempotent work.
    #[default]
    Requeue,
    /// Fail it at once and never run it again: for work whose side effects must not repeat.
    Fail,
}

impl OnLost {
    /// The policy as stored in the `on_lost` column.
    pub fn as_str(self) -> &'static str {
        match self {
            OnLost::Requeue => "requeue",
            OnLost::Fail => "fail",
        }
    }
}

impl std::str::FromStr for OnLost {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "requeue" => Ok(OnLost::Requeue),
            "fail" => Ok(OnLost::Fail),
            _ => Err(Error::invalid(
                "on_lost",
                format!("{s:?} is not one of requeue, fail"),
            )),
        }
    }
}

/// When a job becomes ready to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Schedule {
    Now,
    After(Duration),
    At(SystemTime),
}

/// A command to enqueue, built with [`Job::command`] or [`Job::shell`] and the setters below.
///
/// Durations are stored as whole milliseconds (rounded up) in a 64-bit integer. Enqueueing
/// refuses, with [`Error::Invalid`] naming the setting, a duration whose milliseconds do not
/// fit, and a `delay`, `run_at` or `backoff` that would put the job's ready time (or a
/// retry's) past what that integer holds.
///
/// ```
/// use std::time::Duration;
/// use leasehold::{Job, OnLost};
///
/// let job = Job::command(["rsync", "-a", "src/", "backup/"])
///     .queue("backups")
///     .timeout(Duration::from_secs(600))
///     .max_attempts(3)
///     .on_lost(OnLost::Requeue);
/// assert_eq!(job.argv()[0], "rsync");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    argv: Vec<String>,
    env: Vec<(String, String)>,
    cwd: Option<PathBuf>,
    queue: String,
    priority: i64,
    schedule: Schedule,
    timeout: Option<Duration>,
    idle_timeout: Option<Duration>,
    max_attempts: u32,
    backoff_base: Duration,
    backoff_max: Duration,
    on_lost: OnLost,
    unique_key: Option<String>,
    unique_window: Option<Duration>,
    after: Vec<i64>,
    name: Option<String>,
    conditions: u32,
    when_lost: WhenLost,
    limits: Limits,
    tempfail_max: Option<u32>,
}

impl Job {
    /// A job that runs `argv[0]` with the arguments that follow, without a shell.
    pub fn command<I, S>(argv: I) -> Job
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Job {
            argv: argv.into_iter().map(Into::into).collect(),
            env: Vec::new(),
            cwd: None,
            queue: DEFAULT_QUEUE.to_string(),
            priority: 0,
            schedule: Schedule::Now,
            timeout: None,
            idle_timeout: None,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            backoff_base: DEFAULT_BACKOFF_BASE,
            backoff_max: DEFAULT_BACKOFF_MAX,
            on_lost: OnLost::default(),
            unique_key: None,
            unique_window: None,
            after: Vec::new(),
            name: None,
            conditions: 0,
            when_lost: WhenLost::default(),
            limits: Limits::default(),
            tempfail_max: None,
        }
    }

    /// A job that runs `script` with `sh -c`.
    pub fn shell(script: impl Into<String>) -> Job {
        Job::command(["sh".to_string(), "-c".to_string(), script.into()])
    }

    /// Adds a variable to the command's environment, which otherwise is the runner's.
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Job {
        self.env.push((name.into(), value.into()));
        self
    }

    /// The folder the command runs in. It is stored as text, so it must be valid UTF-8:
    /// enqueueing refuses one that is not with [`Error::Invalid`] naming `cwd`, rather than
    /// run the job somewhere else. By default, the runner's.
    pub fn cwd(mut self, dir: impl Into<PathBuf>) -> Job {
        self.cwd = Some(dir.into());
        self
    }

    /// The queue the job goes to; runners can take from some queues only. By default,
    /// `"default"`.
    pub fn queue(mut self, queue: impl Into<String>) -> Job {
        self.queue = queue.into();
        self
    }

    /// Higher runs first among ready jobs. By default, 0.
    pub fn priority(mut self, priority: i64) -> Job {
        self.priority = priority;
        self
    }

    /// Makes the job ready only after this delay from enqueueing. By default, ready at once.
    pub fn delay(mut self, delay: Duration) -> Job {
        self.schedule = Schedule::After(delay);
        self
    }

    /// Makes the job ready at this time. By default, ready at once.
    pub fn run_at(mut self, at: SystemTime) -> Job {
        self.schedule = Schedule::At(at);
        self
    }

    /// Bounds each attempt: past it, the process group gets SIGTERM, then SIGKILL after the
    /// runner's kill grace, and the attempt fails with `error_kind` timeout. By default, none.
    pub fn timeout(mut self, timeout: Duration) -> Job {
        self.timeout = Some(timeout);
        self
    }

    /// Ends an attempt that writes nothing to stdout or stderr for this long, as a timeout
    /// does, with `error_kind` idle_timeout. By default, none.
    pub fn idle_timeout(mut self, idle: Duration) -> Job {
        self.idle_timeout = Some(idle);
        self
    }

    /// How many attempts may fail (exit, signal, timeout) before the job fails; the waits
    /// between them grow exponentially. A command that cannot start is never retried, and a
    /// lost attempt counts against the recovery budget instead. By default, 1.
    pub fn max_attempts(mut self, attempts: u32) -> Job {
        self.max_attempts = attempts;
        self
    }

    /// The wait before the first retry and the longest wait: each retry waits twice the one
    /// before, within ±20% jitter. By default, 1 s and 1 h.
    pub fn backoff(mut self, base: Duration, max: Duration) -> Job {
        self.backoff_base = base;
        self.backoff_max = max;
        self
    }

    /// Runs the command at this nice value (-20 to 19; below 0 needs privilege), set in the
    /// child before its exec, as systemd's `Nice=` and launchd's `Nice`. By default, the
    /// runner's (`RunnerBuilder::nice`), else the runner's own.
    pub fn nice(mut self, nice: i32) -> Job {
        self.limits.nice = Some(nice);
        self
    }

    /// Runs the command in this I/O class (`ioprio_set`), as systemd's `IOSchedulingClass=`
    /// and launchd's `LowPriorityIO`. By default, the runner's (`RunnerBuilder::io_class`),
    /// else the runner's own.
    pub fn io_class(mut self, class: IoClass) -> Job {
        self.limits.io_class = Some(class);
        self
    }

    /// Caps the attempt's memory at `bytes` (systemd's `MemoryMax=`): the cgroup's
    /// `memory.max` where the cgroup mode has the memory controller, else `RLIMIT_DATA`. An
    /// attempt killed for it fails with [`ErrorKind::Memory`]. By default, no cap.
    pub fn memory_max(mut self, bytes: u64) -> Job {
        self.limits.memory_max = Some(bytes);
        self
    }

    /// The attempt's CPU weight, 1 to 10000 (systemd's `CPUWeight=`; 100 is the default
    /// share): the cgroup's `cpu.weight` where the cgroup mode has the cpu controller, else
    /// not in force (no rlimit matches it). By default, none.
    pub fn cpu_weight(mut self, weight: u32) -> Job {
        self.limits.cpu_weight = Some(weight);
        self
    }

    /// Caps the attempt's processes and threads at `n` (systemd's `TasksMax=`): the
    /// cgroup's `pids.max` where the cgroup mode has the pids controller, else `RLIMIT_NPROC`
    /// (which counts the user's processes, not the job's, and binds no root). By default,
    /// none.
    pub fn pids_max(mut self, n: u64) -> Job {
        self.limits.pids_max = Some(n);
        self
    }

    /// How many times the job may exit 75 (`EX_TEMPFAIL`, "try me later") and be requeued
    /// with its backoff without spending an attempt; past it, 75 is an ordinary failure.
    /// By default, [`DEFAULT_TEMPFAIL_MAX`](crate::DEFAULT_TEMPFAIL_MAX); 0 turns it off.
    pub fn tempfail_max(mut self, n: u32) -> Job {
        self.tempfail_max = Some(n);
        self
    }

    /// The job's manners and caps.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Names the job: what `jobs ls`, `jobs inspect` and `jobs wait` show beside its id, and a
    /// test harness's name for the test it runs. Not unique. By default, none.
    pub fn name(mut self, name: impl Into<String>) -> Job {
        self.name = Some(name.into());
        self
    }

    /// Starts the job only while `condition` holds on the runner's machine; repeat for more
    /// (all must hold). A job whose conditions do not hold waits, pending, without taking a
    /// worker, and `waiting_for` says which. By default, none.
    pub fn when(mut self, condition: Condition) -> Job {
        self.conditions |= condition.bit();
        self
    }

    /// What to do when one of its [`Job::when`] conditions stops holding while it runs. By
    /// default, [`WhenLost::Run`].
    pub fn when_lost(mut self, when_lost: WhenLost) -> Job {
        self.when_lost = when_lost;
        self
    }

    /// What to do when an attempt is lost. By default, [`OnLost::Requeue`].
    pub fn on_lost(mut self, on_lost: OnLost) -> Job {
        self.on_lost = on_lost;
        self
    }

    /// Makes the job unique by `key`: enqueueing it while a job with the same key is pending
    /// or running creates nothing and returns that job's id (see
    /// [`Store::enqueue_unique`](crate::Store::enqueue_unique)). The check and the insert are
    /// one IMMEDIATE transaction, so it holds across threads and processes. By default, none.
    pub fn unique_key(mut self, key: impl Into<String>) -> Job {
        self.unique_key = Some(key.into());
        self
    }

    /// With a [`Job::unique_key`], the key also matches any job of that key created within
    /// `window` before the enqueue, whatever its status (a finished one too). The window is
    /// open at its far edge: a job created exactly `window` before the enqueue does not match
    /// (with a 60 s window, one created 59.999 s before does, one created 60 s before does
    /// not). By default, only unfinished jobs match.
    pub fn unique_window(mut self, window: Duration) -> Job {
        self.unique_window = Some(window);
        self
    }

    /// Runs only after every job in `ids` succeeded (call again to add more). Until then the
    /// job is pending but not claimed; when one of them ends failed or cancelled, this job is
    /// cancelled, with `last_error` naming it, in the same transaction. Enqueueing refuses an
    /// id that does not exist or names a job that already failed or was cancelled; a job that
    /// already succeeded is satisfied at once. By default, none.
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// use leasehold::{Job, Store, now_ms};
    ///
    /// let store = Store::open(dir.path().join("jobs.db"))?;
    /// let transcode = store.enqueue(&Job::shell("ffmpeg -i in.mov out.mp4"))?;
    /// let upload = store.enqueue(&Job::shell("upload out.mp4").after([transcode]))?;
    /// assert_eq!(store.job(upload)?.waiting_for, [transcode]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn after(mut self, ids: impl IntoIterator<Item = i64>) -> Job {
        for id in ids {
            if !self.after.contains(&id) {
                self.after.push(id);
            }
        }
        self
    }

    /// The command and its arguments.
    pub fn argv(&self) -> &[String] {
        &self.argv
    }

    /// The unique key, if any.
    pub(crate) fn unique_key_name(&self) -> Option<&str> {
        self.unique_key.as_deref()
    }

    /// The unique window in whole milliseconds (validated to fit).
    pub(crate) fn unique_window_ms(&self) -> Option<i64> {
        self.unique_window.map(duration_ms)
    }

    /// The jobs this one runs after.
    pub fn dependencies(&self) -> &[i64] {
        &self.after
    }

    /// Checks the job as if enqueued at `now` (the time the store computes its
    /// `scheduled_at` from): every value must be stored as asked, and every time computed from
    /// it (its `scheduled_at`, a retry's) must fit an i64.
    pub(crate) fn validate_at(&self, now: i64) -> Result<()> {
        match self.argv.first() {
            None => return Err(Error::invalid("command", "the command is empty")),
            Some(p) if p.is_empty() => {
                return Err(Error::invalid("command", "the program name is empty"));
            }
            Some(_) => {}
        }
        if self.argv.iter().any(|a| a.contains('\0')) {
            return Err(Error::invalid("command", "an argument contains a NUL byte"));
        }
        if let Some(dir) = &self.cwd {
            // Stored as text: a lossy conversion would run the job somewhere else than asked.
            match dir.to_str() {
                None => {
                    return Err(Error::invalid(
                        "cwd",
                        format!("{:?} is not valid UTF-8", dir.as_os_str()),
                    ));
                }
                Some(d) if d.contains('\0') => {
                    return Err(Error::invalid("cwd", "the folder contains a NUL byte"));
                }
                Some(_) => {}
            }
        }
        for (k, v) in &self.env {
            if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
                return Err(Error::invalid(
                    "env",
                    format!("{k:?} is not a valid variable name (NAME=VALUE, NAME not empty)"),
                ));
            }
        }
        if self.queue.is_empty() {
            return Err(Error::invalid("queue", "the queue name is empty"));
        }
        self.limits.validate()?;
        if self.max_attempts == 0 {
            return Err(Error::invalid("max_attempts", "must be at least 1"));
        }
        match &self.name {
            Some(n) if n.is_empty() => return Err(Error::invalid("name", "the name is empty")),
            Some(n) if n.contains('\0') => {
                return Err(Error::invalid("name", "the name contains a NUL byte"));
            }
            _ => {}
        }
        match &self.unique_key {
            Some(k) if k.is_empty() => {
                return Err(Error::invalid("unique_key", "the key is empty"));
            }
            Some(k) if k.contains('\0') => {
                return Err(Error::invalid("unique_key", "the key contains a NUL byte"));
            }
            None if self.unique_window.is_some() => {
                return Err(Error::invalid(
                    "unique_window",
                    "a unique window needs a unique key",
                ));
            }
            _ => {}
        }
        if let Some(w) = self.unique_window {
            if w.is_zero() {
                return Err(Error::invalid("unique_window", "must be greater than 0"));
            }
            ms("unique_window", w)?;
        }
        for (name, d) in [
            ("timeout", self.timeout),
            ("idle_timeout", self.idle_timeout),
        ] {
            if let Some(d) = d {
                if d.is_zero() {
                    return Err(Error::invalid(name, "must be greater than 0"));
                }
                ms(name, d)?;
            }
        }
        if self.backoff_base > self.backoff_max {
            return Err(Error::invalid(
                "backoff",
                "the first wait is longer than the longest",
            ));
        }
        // A retry is scheduled at now + the longest wait + 20% jitter (the store's backoff).
        let longest = ms("backoff", self.backoff_max)?;
        longest
            .checked_add(longest / 5)
            .and_then(|wait| now.checked_add(wait))
            .ok_or_else(|| too_far("backoff"))?;
        self.checked_scheduled_at(now)?;
        Ok(())
    }

    /// When the job enqueued at `now` becomes ready, or why that time does not fit an i64.
    fn checked_scheduled_at(&self, now: i64) -> Result<i64> {
        match self.schedule {
            Schedule::Now => Ok(now),
            Schedule::After(d) => now
                .checked_add(ms("delay", d)?)
                .ok_or_else(|| too_far("delay")),
            Schedule::At(t) => checked_to_ms(t).ok_or_else(|| too_far("run_at")),
        }
    }

    pub(crate) fn queue_name(&self) -> &str {
        &self.queue
    }

    /// When the job enqueued at `now` becomes ready. [`Job::validate`] refused a job for
    /// which this would not fit; it saturates should a caller pass a `now` far from the clock.
    pub(crate) fn scheduled_at(&self, now: i64) -> i64 {
        match self.schedule {
            Schedule::Now => now,
            Schedule::After(d) => now.saturating_add(duration_ms(d)),
            Schedule::At(t) => to_ms(t),
        }
    }

    pub(crate) fn fields(&self) -> JobFields<'_> {
        JobFields {
            argv: serde_json::to_string(&self.argv).unwrap_or_default(),
            env: serde_json::to_string(&self.env).unwrap_or_default(),
            // `validate`, which the store runs before every insert, refused a cwd that is not
            // UTF-8, so this conversion is exact. Were it ever skipped, a lossy path (which
            // almost surely does not exist: the spawn fails) is safer than no cwd at all,
            // which would run the job in the runner's folder.
            cwd: self.cwd.as_ref().map(|p| match p.to_str() {
                Some(s) => s.to_owned(),
                None => p.to_string_lossy().into_owned(),
            }),
            queue: &self.queue,
            priority: self.priority,
            max_attempts: i64::from(self.max_attempts),
            backoff_base_ms: duration_ms(self.backoff_base),
            backoff_max_ms: duration_ms(self.backoff_max),
            on_lost: self.on_lost.as_str(),
            timeout_ms: self.timeout.map(duration_ms),
            idle_timeout_ms: self.idle_timeout.map(duration_ms),
            unique_key: self.unique_key.as_deref(),
            name: self.name.as_deref(),
            conditions: i64::from(self.conditions),
            when_lost: self.when_lost.as_str(),
            limits: self.limits.to_json(),
            tempfail_max: self.tempfail_max.map(i64::from),
        }
    }

    /// The job as a schedule's template: a JSON object of every option but its ready time
    /// (each slot's job is ready at its slot).
    pub(crate) fn to_template(&self) -> String {
        let f = self.fields();
        serde_json::json!({
            "argv": self.argv,
            "env": self.env,
            "cwd": f.cwd,
            "queue": self.queue,
            "priority": self.priority,
            "max_attempts": self.max_attempts,
            "backoff_base_ms": f.backoff_base_ms,
            "backoff_max_ms": f.backoff_max_ms,
            "on_lost": self.on_lost.as_str(),
            "timeout_ms": f.timeout_ms,
            "idle_timeout_ms": f.idle_timeout_ms,
            "unique_key": self.unique_key,
            "unique_window_ms": self.unique_window_ms(),
            "name": self.name,
            "when": from_mask(self.conditions).iter().map(|c| c.as_str()).collect::<Vec<_>>(),
            "when_lost": self.when_lost.as_str(),
            "limits": self.limits.to_json(),
            "tempfail_max": self.tempfail_max,
        })
        .to_string()
    }

    /// The job as a command hands it to a runner (see `store::handoff`): its template, its
    /// dependencies, and when it is due if not at once, as a time (a delay counts from `now`,
    /// the command's enqueue time, as it would in the command's own enqueue).
    pub(crate) fn to_handoff(&self, now: i64) -> String {
        let due = match self.schedule {
            Schedule::Now => None,
            _ => Some(self.scheduled_at(now)),
        };
        format!(
            r#"{{"template":{},"after":{},"due_ms":{}}}"#,
            self.to_template(),
            serde_json::json!(self.after),
            serde_json::json!(due)
        )
    }

    /// The job that [`Job::to_handoff`] wrote.
    pub(crate) fn from_handoff(v: &serde_json::Value) -> std::result::Result<Job, String> {
        let mut job = Job::from_template_value(&v["template"])?;
        let after: Vec<i64> = serde_json::from_value(v["after"].clone())
            .map_err(|_| "the handed job's after is malformed".to_string())?;
        job = job.after(after);
        match &v["due_ms"] {
            serde_json::Value::Null => {}
            due => {
                let ms = due
                    .as_i64()
                    .ok_or_else(|| "the handed job's due_ms is malformed".to_string())?;
                let d = Duration::from_millis(ms.unsigned_abs());
                let at = if ms >= 0 {
                    UNIX_EPOCH.checked_add(d)
                } else {
                    UNIX_EPOCH.checked_sub(d)
                };
                job = job.run_at(at.ok_or("the handed job's due_ms is out of range")?);
            }
        }
        Ok(job)
    }

    /// The job a template written by [`Job::to_template`] describes.
    pub(crate) fn from_template(text: &str) -> std::result::Result<Job, String> {
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        Job::from_template_value(&v)
    }

    /// The job a template, already parsed, describes.
    fn from_template_value(v: &serde_json::Value) -> std::result::Result<Job, String> {
        use serde_json::Value;
        let bad = |what: &str| format!("the job template's {what} is malformed");
        let argv: Vec<String> =
            serde_json::from_value(v["argv"].clone()).map_err(|_| bad("argv"))?;
        let env: Vec<(String, String)> =
            serde_json::from_value(v["env"].clone()).map_err(|_| bad("env"))?;
        let millis = |name: &str| -> std::result::Result<Option<Duration>, String> {
            match &v[name] {
                Value::Null => Ok(None),
                n => n
                    .as_u64()
                    .map(|ms| Some(Duration::from_millis(ms)))
                    .ok_or_else(|| bad(name)),
            }
        };
        let mut job = Job::command(argv);
        job.env = env;
        job.cwd = v["cwd"].as_str().map(PathBuf::from);
        job.queue = v["queue"].as_str().ok_or_else(|| bad("queue"))?.to_string();
        job.priority = v["priority"].as_i64().ok_or_else(|| bad("priority"))?;
        job.max_attempts = v["max_attempts"]
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| bad("max_attempts"))?;
        job.backoff_base = millis("backoff_base_ms")?.unwrap_or(DEFAULT_BACKOFF_BASE);
        job.backoff_max = millis("backoff_max_ms")?.unwrap_or(DEFAULT_BACKOFF_MAX);
        job.on_lost = v["on_lost"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("on_lost"))?;
        job.timeout = millis("timeout_ms")?;
        job.idle_timeout = millis("idle_timeout_ms")?;
        job.unique_key = v["unique_key"].as_str().map(str::to_string);
        job.unique_window = millis("unique_window_ms")?;
        job.name = v["name"].as_str().map(str::to_string);
        // Absent from templates written before conditions existed.
        if let Some(when) = v["when"].as_array() {
            for c in when {
                let c: Condition = c
                    .as_str()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| bad("when"))?;
                job.conditions |= c.bit();
            }
        }
        if let Some(w) = v["when_lost"].as_str() {
            job.when_lost = w.parse().map_err(|_| bad("when_lost"))?;
        }
        job.limits = Limits::from_json(v["limits"].as_str());
        job.tempfail_max = v["tempfail_max"]
            .as_u64()
            .and_then(|n| u32::try_from(n).ok());
        Ok(job)
    }
}

/// A job duration in whole milliseconds, or an error naming `setting` when they do not fit
/// the database's i64.
fn ms(setting: &'static str, d: Duration) -> Result<i64> {
    checked_duration_ms(d).ok_or_else(|| {
        Error::invalid(
            setting,
            format!("{}s is too long: at most {} ms", d.as_secs_f64(), i64::MAX),
        )
    })
}

/// The error for a time past what an i64 of milliseconds holds.
fn too_far(setting: &'static str) -> Error {
    Error::invalid(
        setting,
        "the time it gives is more than 292 million years from 1970: out of range",
    )
}

/// A job's columns as the store writes them.
pub(crate) struct JobFields<'a> {
    pub argv: String,
    pub env: String,
    pub cwd: Option<String>,
    pub queue: &'a str,
    pub priority: i64,
    pub max_attempts: i64,
    pub backoff_base_ms: i64,
    pub backoff_max_ms: i64,
    pub on_lost: &'static str,
    pub timeout_ms: Option<i64>,
    pub idle_timeout_ms: Option<i64>,
    pub unique_key: Option<&'a str>,
    pub name: Option<&'a str>,
    pub conditions: i64,
    pub when_lost: &'static str,
    pub limits: Option<String>,
    pub tempfail_max: Option<i64>,
}

/// A job as stored: one row of the `jobs` table.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct JobRecord {
    /// The job's id.
    pub id: i64,
    /// Its queue.
    pub queue: String,
    /// The command and its arguments.
    pub argv: Vec<String>,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// The folder it runs in, if not the runner's.
    pub cwd: Option<String>,
    /// Its priority: higher runs first.
    pub priority: i64,
    /// Where it is in its life.
    pub status: Status,
    /// Claims so far (the attempt being run while running).
    pub attempt: i64,
    /// How many attempts may fail before the job fails.
    pub max_attempts: i64,
    /// Attempts that failed so far (exit, signal, timeout, idle timeout).
    pub failed_attempts: i64,
    /// Times a lost attempt was reclaimed.
    pub recovery_count: i64,
    /// What happens when an attempt is lost.
    pub on_lost: OnLost,
    /// The per-attempt timeout, in milliseconds.
    pub timeout_ms: Option<i64>,
    /// The idle timeout, in milliseconds.
    pub idle_timeout_ms: Option<i64>,
    /// When it was enqueued.
    pub created_at: i64,
    /// When it is (or was) ready to run.
    pub scheduled_at: i64,
    /// When the current or last attempt was claimed.
    pub started_at: Option<i64>,
    /// When it ended.
    pub completed_at: Option<i64>,
    /// The last renewal of its lease.
    pub heartbeat_at: Option<i64>,
    /// When its lease runs out, while running.
    pub lease_expires_at: Option<i64>,
    /// The current or last attempt's token.
    pub run_token: Option<String>,
    /// The runner that holds or held it.
    pub worker_id: Option<String>,
    /// The current or last attempt's main process.
    pub pid: Option<i64>,
    /// The current or last attempt's process group.
    pub pgid: Option<i64>,
    /// The current or last attempt's keeper: the process that is its command's parent and
    /// writes its outcome beside the database, which outlives the runner.
    pub keeper_pid: Option<i64>,
    /// The exit code of the last attempt, when it exited.
    pub exit_code: Option<i64>,
    /// The signal that killed the last attempt, when one did.
    pub signal: Option<i64>,
    /// Why the last attempt failed.
    pub error_kind: Option<ErrorKind>,
    /// The last error, in words.
    pub last_error: Option<String>,
    /// True while a lost attempt's processes still have to be torn down; the job cannot be
    /// claimed until they are.
    pub teardown_pending: bool,
    /// Its unique key, if it was enqueued with one.
    pub unique_key: Option<String>,
    /// The schedule that enqueued it, if one did.
    pub schedule: Option<String>,
    /// The slot of that schedule it was enqueued for.
    pub slot_at: Option<i64>,
    /// The jobs it runs after ([`Job::after`]), in id order.
    pub after: Vec<i64>,
    /// Those of `after` that have not succeeded (yet): while any is left, a pending job is
    /// not claimed. A dependency pruned since it succeeded is not listed.
    pub waiting_for: Vec<i64>,
    /// Its name ([`Job::name`]), if it has one.
    pub name: Option<String>,
    /// What must hold for it to start ([`Job::when`]).
    pub conditions: Vec<Condition>,
    /// What happens when one stops holding while it runs ([`Job::when_lost`]).
    pub when_lost: WhenLost,
    /// Its manners and caps ([`Job::nice`], [`Job::memory_max`], ...).
    pub limits: Limits,
    /// Its bound on "try me later" ([`Job::tempfail_max`]), if it set one.
    pub tempfail_max: Option<i64>,
    /// Times it exited 75 and was requeued without spending an attempt.
    pub tempfails: i64,
}

/// One entry of a job's history.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Event {
    /// The event's id: increasing in the order events were written. A `started` event
    /// recorded on its attempt's ending's row has that ending's id.
    pub id: i64,
    /// The job it belongs to.
    pub job_id: i64,
    /// When it happened.
    pub at: i64,
    /// What happened.
    pub kind: EventKind,
    /// The attempt it concerns.
    pub attempt: i64,
    /// The reason, in words.
    pub detail: Option<String>,
}

/// The captured tail of one attempt's output.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Output {
    /// The attempt.
    pub attempt: i64,
    /// The last bytes written to stdout.
    pub stdout: Vec<u8>,
    /// The last bytes written to stderr.
    pub stderr: Vec<u8>,
    /// True when stdout had more than the tail keeps.
    pub stdout_truncated: bool,
    /// True when stderr had more than the tail keeps.
    pub stderr_truncated: bool,
}

impl Output {
    /// The captured tail of one attempt, as [`Finish::output`](crate::protocol::Finish) takes it (the
    /// struct is `#[non_exhaustive]`, so callers outside the crate build it here).
    pub fn new(
        attempt: i64,
        stdout: Vec<u8>,
        stderr: Vec<u8>,
        stdout_truncated: bool,
        stderr_truncated: bool,
    ) -> Output {
        Output {
            attempt,
            stdout,
            stderr,
            stdout_truncated,
            stderr_truncated,
        }
    }
}

/// How a job ended, as a caller waiting for it sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The command exited 0.
    Succeeded,
    /// The job failed for good.
    Failed {
        /// Why.
        kind: ErrorKind,
        /// The exit code, when the command exited.
        exit_code: Option<i64>,
        /// The signal, when one killed it.
        signal: Option<i64>,
        /// What happened, in words.
        message: String,
    },
    /// The job was cancelled.
    Cancelled,
}

impl JobRecord {
    /// The job's outcome, once it has one (succeeded, failed or cancelled).
    pub fn outcome(&self) -> Option<Outcome> {
        match self.status {
            Status::Succeeded => Some(Outcome::Succeeded),
            Status::Cancelled => Some(Outcome::Cancelled),
            Status::Failed => Some(Outcome::Failed {
                kind: self.error_kind.unwrap_or(ErrorKind::Exit),
                exit_code: self.exit_code,
                signal: self.signal,
                message: self.last_error.clone().unwrap_or_default(),
            }),
            Status::Pending | Status::Running => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handed_job_reads_back_as_the_job_it_was() {
        let now = 1_700_000_000_000i64;
        let full = Job::command(["printf", "%s", "a b"])
            .env("A", "1")
            .cwd("/tmp")
            .queue("media")
            .priority(-3)
            .timeout(Duration::from_millis(1500))
            .idle_timeout(Duration::from_secs(7))
            .max_attempts(4)
            .backoff(Duration::from_secs(2), Duration::from_secs(60))
            .on_lost(OnLost::Fail)
            .unique_key("k")
            .unique_window(Duration::from_secs(30))
            .when(Condition::AcPower)
            .when(Condition::Unmetered)
            .when_lost(WhenLost::Stop)
            .after([3, 5]);
        // A schedule's template carries the conditions to every slot's job.
        let slot = Job::from_template(&full.to_template()).unwrap();
        assert_eq!((slot.conditions, slot.when_lost), (1 | 4, WhenLost::Stop));
        let cases = [
            (full.clone(), now),
            (full.clone().delay(Duration::from_secs(90)), now + 90_000),
            (
                full.clone().run_at(UNIX_EPOCH + Duration::from_millis(5)),
                5,
            ),
            (Job::shell("true"), now),
        ];
        for (job, due) in cases {
            let v: serde_json::Value = serde_json::from_str(&job.to_handoff(now)).unwrap();
            let back = Job::from_handoff(&v).unwrap();
            assert_eq!(back.to_template(), job.to_template());
            assert_eq!(back.dependencies(), job.dependencies());
            assert_eq!(back.scheduled_at(now), due);
        }
        let bad: serde_json::Value =
            serde_json::json!({"template": {}, "after": [], "due_ms": null});
        assert!(Job::from_handoff(&bad).is_err());
    }

    #[test]
    fn statuses_round_trip_through_their_spelling() {
        for s in Status::ALL {
            assert_eq!(s.as_str().parse::<Status>().unwrap(), s);
        }
        assert!("done".parse::<Status>().is_err());
    }

    #[test]
    fn event_kinds_round_trip_through_their_spelling_and_are_distinct() {
        let mut seen = std::collections::HashSet::new();
        for k in EventKind::ALL {
            assert_eq!(EventKind::parse(k.as_str()), Some(k));
            assert!(seen.insert(k.as_str()), "{k} is spelled twice");
        }
        assert_eq!(EventKind::parse("finished"), None);
    }

    #[test]
    fn invalid_jobs_are_refused_with_the_setting_named() {
        let empty: [&str; 0] = [];
        let cases = [
            (Job::command(empty), "command"),
            (Job::command([""]), "command"),
            (Job::shell("true").max_attempts(0), "max_attempts"),
            (Job::shell("true").env("A=B", "c"), "env"),
            (Job::shell("true").timeout(Duration::ZERO), "timeout"),
            (Job::shell("true").queue(""), "queue"),
        ];
        for (job, setting) in cases {
            match job.validate_at(now_ms()) {
                Err(Error::Invalid { setting: s, .. }) => assert_eq!(s, setting),
                other => panic!("{job:?}: {other:?}"),
            }
        }
        assert!(Job::shell("true").validate_at(now_ms()).is_ok());
    }

    /// The setting `job.validate_at(now)` refuses, or a panic saying it was accepted.
    fn refused(job: &Job, now: i64) -> &'static str {
        match job.validate_at(now) {
            Err(Error::Invalid { setting, .. }) => setting,
            other => panic!("{job:?} at {now}: {other:?}"),
        }
    }

    #[test]
    fn durations_whose_milliseconds_do_not_fit_are_refused_not_wrapped() {
        let now = 1_700_000_000_000;
        let huge = Duration::from_millis(u64::MAX);
        let just_over = Duration::from_millis(i64::MAX as u64) + Duration::from_micros(1);
        for d in [Duration::MAX, huge, just_over] {
            let job = Job::shell("true");
            assert_eq!(refused(&job.clone().timeout(d), now), "timeout");
            assert_eq!(refused(&job.clone().idle_timeout(d), now), "idle_timeout");
            assert_eq!(refused(&job.clone().delay(d), now), "delay");
            assert_eq!(refused(&job.clone().backoff(d, d), now), "backoff");
            assert_eq!(
                refused(&job.clone().backoff(Duration::from_secs(1), d), now),
                "backoff"
            );
        }
        // The longest that fits is stored exactly, for the durations that are not added to
        // a time.
        let max = Duration::from_millis(i64::MAX as u64);
        let job = Job::shell("true").timeout(max).idle_timeout(max);
        assert!(job.validate_at(now).is_ok());
        assert_eq!(job.fields().timeout_ms, Some(i64::MAX));
        assert_eq!(job.fields().idle_timeout_ms, Some(i64::MAX));
    }

    #[test]
    fn schedules_past_what_an_i64_holds_are_refused() {
        let now = 1_700_000_000_000;
        // Fits on its own, but not once added to now.
        let long = Duration::from_millis(i64::MAX as u64 - 1000);
        assert_eq!(refused(&Job::shell("true").delay(long), now), "delay");
        assert_eq!(
            refused(
                &Job::shell("true").backoff(Duration::from_secs(1), long),
                now
            ),
            "backoff"
        );
        // A retry waits up to 20% longer than the longest wait: that must fit too.
        let wait = Duration::from_millis(i64::MAX as u64 / 6 * 5 + 10_000);
        assert_eq!(
            refused(&Job::shell("true").backoff(Duration::from_secs(1), wait), 0),
            "backoff"
        );
        if let Some(far) = UNIX_EPOCH.checked_add(Duration::from_millis(u64::MAX)) {
            assert_eq!(refused(&Job::shell("true").run_at(far), now), "run_at");
        }
        if let Some(far) = UNIX_EPOCH.checked_sub(Duration::from_millis(u64::MAX)) {
            assert_eq!(refused(&Job::shell("true").run_at(far), now), "run_at");
        }
        // What fits is exact: a day's delay is a day's milliseconds.
        let job = Job::shell("true").delay(Duration::from_secs(86_400));
        assert!(job.validate_at(now).is_ok());
        assert_eq!(job.scheduled_at(now), now + 86_400_000);
        let at = UNIX_EPOCH + Duration::from_millis(1_800_000_000_123);
        assert_eq!(
            Job::shell("true").run_at(at).scheduled_at(now),
            1_800_000_000_123
        );
        let before = UNIX_EPOCH - Duration::from_millis(5);
        assert_eq!(Job::shell("true").run_at(before).scheduled_at(now), -5);
    }

    #[test]
    fn a_cwd_that_is_not_utf8_is_refused_not_changed() {
        use std::ffi::OsStr;
        use std::os::unix::ffi::OsStrExt;
        let job = Job::shell("true").cwd(OsStr::from_bytes(b"/tmp/\xff\xfeout"));
        assert_eq!(refused(&job, 0), "cwd");
        match job.validate_at(now_ms()) {
            Err(e) => assert!(e.to_string().contains("not valid UTF-8"), "{e}"),
            Ok(()) => panic!("accepted"),
        }
        let job = Job::shell("true").cwd(OsStr::from_bytes(b"/tmp/a\0b"));
        assert_eq!(refused(&job, 0), "cwd");
        let job = Job::shell("true").cwd("/tmp/caf\u{e9}");
        assert!(job.validate_at(now_ms()).is_ok());
        assert_eq!(job.fields().cwd.as_deref(), Some("/tmp/caf\u{e9}"));
    }

    #[test]
    fn times_convert_to_milliseconds_without_wrapping() {
        assert_eq!(to_ms(UNIX_EPOCH), 0);
        assert_eq!(duration_ms(Duration::from_micros(400)), 1);
        assert_eq!(duration_ms(Duration::MAX), i64::MAX);
        assert_eq!(checked_duration_ms(Duration::MAX), None);
        if let Some(far) = UNIX_EPOCH.checked_add(Duration::from_millis(u64::MAX)) {
            assert_eq!(to_ms(far), i64::MAX);
            assert_eq!(checked_to_ms(far), None);
        }
        if let Some(far) = UNIX_EPOCH.checked_sub(Duration::from_millis(u64::MAX)) {
            assert_eq!(to_ms(far), i64::MIN);
        }
    }
}
