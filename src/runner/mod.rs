//! The runner: a dispatcher, a pool of workers, a writer, a heartbeat, a sweeper and a
//! notifier, each a thread, sharing one [`Shared`] state.

mod adopt;
mod builder;
mod condition;
mod dispatcher;
mod firer;
mod heartbeat;
mod listener;
mod notifier;
pub mod operator;
mod shared;
mod shutdown;
mod start;
mod sweeper;
mod worker;
mod writer;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, bounded};
use parking_lot::Mutex;

#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::job::{Job, JobRecord, Outcome};
use crate::metrics::{Metrics, RunnerFigures};
use crate::process::StopReason;
use crate::schedule::Schedule;
use crate::store::Store;
use crate::store::wake;
use crate::store::{Enqueued, ScheduleRecord};

pub use builder::{
    Completion, DEFAULT_DRAIN_TIMEOUT, DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_KILL_GRACE,
    DEFAULT_LEASE_TTL, DEFAULT_OUTPUT_TAIL, DEFAULT_POLL_INTERVAL, DEFAULT_RECLAIM_BATCH,
    DEFAULT_SAMPLE_INTERVAL, DEFAULT_SHUTDOWN_GRACE, DEFAULT_SWEEP_INTERVAL, DEFAULT_WORKERS,
    MAX_OUTPUT_TAIL, MAX_SETTING_DURATION, MAX_WORKERS, OnShutdown, RunnerBuilder,
};
pub use condition::CONDITION_INTERVAL;
pub use shared::SweepCounters;

use shared::{Shared, Writer};

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
    /// The sweeper, stopped before the workers are joined: it holds a handle to the writer
    /// for the attempts it adopts, which would keep the writer from ever ending.
    sweeper: Option<JoinHandle<()>>,
    stop_sweeper: Option<Sender<()>>,
    /// Ends the wake-up listener's blocking wait.
    stop_listener: Option<wake::Closer>,
    done: bool,
}

/// `now + d`, or None when that is past what `Instant` can represent (wait for ever).
fn deadline_after(d: Duration) -> Option<Instant> {
    Instant::now().checked_add(d)
}

impl Runner {
    /// A builder for a runner on the database at `path` (created if missing).
    pub fn builder(path: impl AsRef<Path>) -> RunnerBuilder {
        RunnerBuilder::new(path.as_ref().to_path_buf())
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
        let id = self.api.lock().enqueue(job)?;
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
        let done = self.api.lock().enqueue_unique(job)?;
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
        let rec = self.api.lock().put_schedule(name, schedule)?;
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
        let rec = self.api.lock().replace_schedule(name, schedule)?;
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
        let rec = self.api.lock().pause_schedule(name)?;
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
        let rec = self.api.lock().resume_schedule(name)?;
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
        let ids = self.api.lock().enqueue_many(jobs)?;
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
        let job = self.api.lock().cancel(id)?;
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
        let job = self.api.lock().retry(id, reason)?;
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
        let unfinished = self.api.lock().has_unfinished(&self.shared.config.queues);
        // A damaged file stops the runner, whoever finds it.
        if let Err(e) = &unfinished {
            self.shared.stop_if_damaged("caller", e);
        }
        unfinished
    }

    /// `Ok` while every thread of the runner works. After a thread failed (a panic, an error
    /// it could not handle), the runner has fenced itself: its attempts were killed and
    /// recorded as lost, and every request returns the error this returns.
    ///
    /// # Errors
    ///
    /// [`Error::RunnerFailed`] naming the thread and its cause; [`Error::Damaged`] when a
    /// thread found the database file damaged (the runner stopped at once).
    pub fn health(&self) -> Result<()> {
        self.shared.check()
    }
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
