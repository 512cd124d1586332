//! Stopping a runner: the graceful shutdown (a grace for running jobs, then kill and requeue),
//! and the abort that kills at once.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::error::Result;

use crate::process::StopReason;

use super::builder::OnShutdown;
use super::builder::short_busy;
use super::shared::Fence;
use super::{Runner, deadline_after};

impl Runner {
    /// Kills every running attempt now, without a shutdown grace, and waits up to `timeout`
    /// for their processes to end: for an application that must exit before a shutdown could
    /// finish (`leasehold run` on a second SIGINT or SIGTERM). Each attempt's group gets
    /// SIGTERM, then SIGKILL after the kill grace. Their jobs go back to pending without
    /// spending their recovery budget when the database takes the write; otherwise their
    /// leases run out and a sweeper reclaims them. From then on the runner is fenced: every
    /// call returns [`Error::RunnerFailed`](crate::Error::RunnerFailed), and [`Runner::shutdown`] only joins its threads.
    /// Safe to call from another thread while a shutdown is under way.
    ///
    /// Returns whether every attempt ended within `timeout`.
    pub fn abort(&self, timeout: Duration) -> bool {
        self.shared.abort();
        let deadline = deadline_after(timeout);
        let workers = self.shared.config.workers;
        loop {
            if self.attempts_settled(workers) {
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

    /// Whether every worker is idle and every attempt's ending is settled: committed (or
    /// given up on) by the writer, or kept for a shutdown to record when the writer has
    /// stopped. A worker turns idle as soon as it queues its ending, before the writer
    /// commits it: an exit then would leave the job running until its lease runs out.
    fn attempts_settled(&self, workers: usize) -> bool {
        if self.shared.idle_workers.load(Ordering::SeqCst) < workers {
            return false;
        }
        let unsettled = self.shared.running.lock().len();
        unsettled <= self.shared.unwritten.lock().len()
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
    /// It returns within `grace`, plus the kill grace, plus at most about two lease TTLs
    /// when the database does not take its writes meanwhile (another process holds the
    /// SQLite file's write lock, or a PostgreSQL row the runner must write; the server is
    /// out of reach): the sweeper's last sweep, and the writer's last endings, each give up
    /// after a lease TTL (their jobs' leases run out, and a sweeper reclaims them). On
    /// PostgreSQL no statement waits for a lock longer than half a heartbeat.
    ///
    /// # Errors
    ///
    /// A database error recording the stop (everything else is done by then);
    /// [`Error::RunnerFailed`](crate::Error::RunnerFailed) when a thread of the runner had failed (its attempts are
    /// recorded as lost by then); [`Error::Damaged`](crate::Error::Damaged) when a thread found
    /// the database file damaged (the runner stopped at once and wrote nothing more).
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
        // The sweeper adopts nothing more: what it adopted is stopped with the workers.
        drop(threads.stop_sweeper.take());
        if let Some(s) = threads.sweeper.take() {
            let _ = s.join();
        }
        let leave = self.shared.config.on_shutdown == OnShutdown::Leave;
        // Leaving attempts to their keepers waits for nothing.
        let deadline = if leave {
            Some(Instant::now())
        } else {
            deadline_after(grace)
        };
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
            let reason = if leave {
                StopReason::Leave
            } else {
                StopReason::Shutdown
            };
            for (token, r) in running.iter() {
                // Left running on purpose: its keeper's fence no longer applies (the next
                // runner of this host adopts it; no other host takes it meanwhile).
                match &r.fence {
                    Fence::Keeper if leave => crate::process::move_fence(token, None),
                    Fence::File(dir) if leave => {
                        let _ = std::fs::remove_file(dir.join(crate::files::LEASE_FILE));
                    }
                    _ => {}
                }
                r.stop.stop(reason);
            }
            running.values().map(|r| r.job_id).collect()
        };
        if leave && !left.is_empty() {
            log::info!(
                "shutdown: leaving jobs {left:?} running under their keepers; the next runner \
                 on this file adopts them"
            );
        } else if !left.is_empty() {
            log::info!(
                "shutdown: grace of {}s over, killing and requeueing jobs {left:?}",
                grace.as_secs_f64()
            );
        }
        for w in threads.workers.drain(..) {
            let _ = w.join();
        }
        for a in std::mem::take(&mut *self.shared.adopters.lock()) {
            let _ = a.join();
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
        // A damaged file gets no more writes: not the endings, not the stop (a runner's
        // record whose process is gone is judged dead).
        if self.shared.damaged() {
            return self.shared.check();
        }
        let unwritten = std::mem::take(&mut *self.shared.unwritten.lock());
        for finish in &unwritten {
            // The writer had failed: record these endings here (each fenced as usual).
            match api.finish(finish, api.now()) {
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
        api.stop_runner(&self.shared.worker_id, api.now())?;
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
