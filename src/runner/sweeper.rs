//! The sweeper: reclaims lost attempts and tears down their processes; prunes, and samples
//! the counters for the dashboard's charts.
//!
//! The logic is [`Sweeper::sweep_once`], which takes the time and returns what it did; the
//! runner's thread only waits, calls it and logs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;

use crate::error::Result;
use crate::store::{KeptAttempt, Namespace, PruneOptions, PruneReport, ReclaimRequest, Store};

use super::adopt::Judged;

use super::operator::{runner_death_evidence, tear_down_lost_attempts_at};
use super::shared::{Shared, SweepCounters};

/// Prune batches one sweep runs at most (of [`crate::DEFAULT_PRUNE_BATCH`] jobs each), so that
/// a sweep stays short; a backlog is worked off over the following sweeps.
pub(crate) const PRUNE_BATCHES_PER_SWEEP: u32 = 8;

/// MiB of free pages one round of a sweep's prune gives back at most: a file with a large free
/// list (a bulk delete, a converted file) is shrunk over many sweeps, each of them short.
pub(crate) const PRUNE_VACUUM_MIB_PER_ROUND: u32 = 16;

/// The sweeper's state between sweeps.
pub(crate) struct Sweeper {
    store: Store,
    shared: Arc<Shared>,
    /// Where this runner's pids mean something: what it can prove and tear down.
    here: Namespace,
    clock: Mutex<Clock>,
    /// Failed sweeps and prunes, logged once a minute with a count (a full disk fails every
    /// sweep until space is back).
    sweep_failures: Mutex<Repeated>,
    prune_failures: Mutex<Repeated>,
    sample_failures: Mutex<Repeated>,
    /// Whether the output files of pruned jobs are left to remove: the last removal stopped at
    /// its deadline, or failed.
    files_left: AtomicBool,
    /// Whether this runner held the lead of pruning at its last sweep.
    leads_pruning: AtomicBool,
    /// When the sweeper thread sweeps and samples next.
    ticks: Mutex<Ticks>,
}

/// The sweeper thread's two cadences: a sweep every sweep interval, and a sample at the start
/// of every sample interval (on the wall clock, as [`Store::take_sample`] counts them), each
/// on its own, so that a sample interval shorter than the sweep interval is kept.
struct Ticks {
    sweep: Instant,
    sample: Instant,
}

/// How long after an interval's start its sample is taken: past the edge, so that the
/// interval is the new one whatever the rounding.
const SAMPLE_LAG_MS: i64 = 5;

/// How often a failure that repeats every sweep is logged.
const REPEATED_FAILURE_LOG: Duration = Duration::from_secs(60);

/// A failure that may repeat every sweep: logged the first time, then once per
/// [`REPEATED_FAILURE_LOG`] with how many came since.
#[derive(Default)]
struct Repeated {
    last_logged: Option<Instant>,
    unlogged: u64,
}

impl Repeated {
    /// Records one failure; returns how many failures the log line covers when one is due.
    fn failed(&mut self, now: Instant) -> Option<u64> {
        self.unlogged += 1;
        let due = self
            .last_logged
            .is_none_or(|t| now.saturating_duration_since(t) >= REPEATED_FAILURE_LOG);
        if !due {
            return None;
        }
        self.last_logged = Some(now);
        Some(std::mem::take(&mut self.unlogged))
    }
}

/// The two clocks at the last sweep: when the wall clock moves much further than the
/// monotonic one (a suspend, a clock jump), every lease looks expired at once, so expiry
/// alone is not trusted until the other runners have had a lease TTL to renew.
///
/// On PostgreSQL leases are stamped by the database server's clock, so the server's clock is
/// watched the same way: a step of it (an NTP correction, a restored VM) expires every lease
/// at once as surely as a step of this host's clock does.
struct Clock {
    wall: SystemTime,
    mono: Instant,
    settle_until: Option<Instant>,
    /// The server's time (ms) at the last sweep that read it, with the monotonic clock just
    /// before the read was sent and just after its answer came.
    server: Option<ServerReading>,
}

/// One reading of the server's clock: its time (ms), stamped somewhere between `sent` and
/// `received` by this host's monotonic clock.
#[derive(Debug, Clone, Copy)]
struct ServerReading {
    at: i64,
    sent: Instant,
    received: Instant,
}

impl Clock {
    /// Records the clocks at a sweep and says whether the sweep is settling: within `ttl` of a
    /// wall-clock step that outran the monotonic clock by more than `heartbeat` (or went back).
    fn observe(
        &mut self,
        wall: SystemTime,
        mono: Instant,
        heartbeat: Duration,
        ttl: Duration,
    ) -> bool {
        let wall_step = wall.duration_since(self.wall).unwrap_or(Duration::ZERO);
        let mono_step = mono.duration_since(self.mono);
        let backwards = wall < self.wall;
        if backwards || wall_step > mono_step + heartbeat {
            log::info!(
                "wall clock moved {:.1}s while {:.1}s passed (a suspend or a clock change): \
                 not reclaiming expired leases for {:.0}s while runners renew",
                wall_step.as_secs_f64(),
                mono_step.as_secs_f64(),
                ttl.as_secs_f64()
            );
            self.settle_until = Some(mono + ttl);
        }
        self.wall = wall;
        self.mono = mono;
        self.settle_until.is_some_and(|t| mono < t)
    }

    /// Records a reading of the server's clock, and says whether the sweep is settling: within
    /// `ttl` of a step of the server's clock that outran this host's monotonic clock by more
    /// than `heartbeat`, or fell behind it by as much (as [`Clock::observe`] judges the wall
    /// clock, whose settling this shares). The time between two readings is known only within
    /// their round trips, so a slow answer is never taken for a step.
    fn observe_server(&mut self, now: ServerReading, heartbeat: Duration, ttl: Duration) -> bool {
        if let Some(before) = self.server {
            let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
            let step = now.at - before.at;
            let most = ms(now.received.duration_since(before.sent) + heartbeat);
            let least = ms(now.sent.duration_since(before.received)) - ms(heartbeat);
            if step > most || step < least {
                log::info!(
                    "the database server's clock moved {:.1}s while {:.1}s passed here (a \
                     clock change on the server): not reclaiming expired leases for {:.0}s \
                     while runners renew",
                    step as f64 / 1000.0,
                    now.received.duration_since(before.received).as_secs_f64(),
                    ttl.as_secs_f64()
                );
                self.settle_until = Some(now.received + ttl);
            }
        }
        self.server = Some(now);
        self.settle_until.is_some_and(|t| now.received < t)
    }
}

impl Sweeper {
    pub(crate) fn new(store: Store, shared: Arc<Shared>) -> Sweeper {
        let shared_sweep = shared.config.sweep_interval;
        Sweeper {
            store,
            shared,
            here: Namespace::here(),
            clock: Mutex::new(Clock {
                wall: SystemTime::now(),
                mono: Instant::now(),
                settle_until: None,
                server: None,
            }),
            sweep_failures: Mutex::default(),
            prune_failures: Mutex::default(),
            sample_failures: Mutex::default(),
            files_left: AtomicBool::new(false),
            leads_pruning: AtomicBool::new(false),
            ticks: Mutex::new(Ticks {
                sweep: Instant::now() + shared_sweep,
                sample: Instant::now(),
            }),
        }
    }

    /// The first sweep, before the runner's other threads start, and a sample of how things
    /// stand when the runner starts (whatever its interval holds already).
    pub(crate) fn start_and_log(&self, now: i64) {
        self.sweep_and_log(now);
        self.sample_and_log_forced(now, true);
    }

    /// How long the sweeper thread waits before its next tick: until the next sweep or the
    /// next sample, whichever comes first.
    pub(crate) fn until_next(&self) -> Duration {
        let t = self.ticks.lock();
        t.sweep
            .min(t.sample)
            .saturating_duration_since(Instant::now())
    }

    /// One tick of the sweeper thread: a sweep when one is due (it samples too when an
    /// interval began), else a sample when a sample interval began.
    pub(crate) fn tick_and_log(&self, now: i64) {
        let at = Instant::now();
        let interval = i64::try_from(self.shared.config.sample_interval.as_millis())
            .unwrap_or(i64::MAX)
            .max(1);
        let (sweep, sample) = {
            let mut t = self.ticks.lock();
            let sample = at >= t.sample;
            if sample {
                // The start of the next interval on the wall clock.
                let left = interval - now.rem_euclid(interval) + SAMPLE_LAG_MS;
                t.sample = at + Duration::from_millis(u64::try_from(left).unwrap_or(0));
            }
            (at >= t.sweep, sample)
        };
        if sweep {
            self.sweep_and_log(now);
            // A sweep interval between the end of one sweep and the start of the next, as
            // before samples had a cadence of their own: a long sweep is not followed at once.
            self.ticks.lock().sweep = Instant::now() + self.shared.config.sweep_interval;
        } else if sample {
            self.sample_and_log(now);
        }
    }

    /// A sample of how things stand when the runner stops (whatever its interval holds
    /// already), waiting for another process's write lock no longer than the shutdown's own
    /// writes do.
    pub(crate) fn stop_and_log(mut self, now: i64) {
        self.store
            .set_busy_timeout(super::builder::short_busy(&self.shared.config));
        self.sample_and_log_forced(now, true);
    }

    /// The time on the runner's clock: what a sweep acts at.
    pub(crate) fn now(&self) -> i64 {
        self.store.now()
    }

    /// Sweeps, adds the result to the runner's counters, and logs a line when it did
    /// something. Errors are logged: the next sweep tries again.
    pub(crate) fn sweep_and_log(&self, now: i64) {
        match self.sweep_once(now) {
            Ok(report) => {
                self.shared.counters.lock().add(&report);
                if report.did_something() {
                    log::info!(
                        "sweep reclaimed_pending={} reclaimed_failed={} torn_down={} \
                         unverified={} dead_runners={} adopted={} recovered={}",
                        report.reclaimed_pending,
                        report.reclaimed_failed,
                        report.torn_down,
                        report.unverified,
                        report.dead_runners,
                        report.adopted,
                        report.recovered
                    );
                } else {
                    log::debug!("sweep: nothing to do");
                }
            }
            Err(e) if self.shared.stop_if_damaged("sweeper", &e) => {}
            Err(e) => {
                if let Some(n) = self.sweep_failures.lock().failed(Instant::now()) {
                    log::warn!("sweep failed ({n} since the last report): {e:#}");
                }
            }
        }
        if self.leads_pruning(now) {
            self.prune_and_log(now);
        }
        self.tidy_batches_and_log();
        self.sample_and_log(now);
    }

    /// Samples the counters for the dashboard's charts when a new sample interval began (and
    /// no runner on the file sampled it yet). Errors are logged: the next sweep tries again.
    pub(crate) fn sample_and_log(&self, now: i64) {
        self.sample_and_log_forced(now, false);
    }

    /// As [`Sweeper::sample_and_log`]; `forced`, whatever the interval holds already (a
    /// runner's start and stop), unless a sample was taken at `now` or later.
    fn sample_and_log_forced(&self, now: i64, forced: bool) {
        let interval = self.shared.config.sample_interval.as_millis();
        let interval = i64::try_from(interval).unwrap_or(i64::MAX);
        let taken = if forced {
            self.store.take_sample_now(now, interval)
        } else {
            self.store.take_sample(now, interval)
        };
        match taken {
            Ok(true) => log::debug!("sample taken"),
            Ok(false) => {}
            Err(e) if self.shared.stop_if_damaged("sweeper", &e) => {}
            Err(e) => {
                if let Some(n) = self.sample_failures.lock().failed(Instant::now()) {
                    log::warn!("sample failed ({n} since the last report): {e:#}");
                }
            }
        }
    }

    /// Continues the fan-outs that endings left as cascades, and finishes the bulk enqueues
    /// that their processes left behind (lifts a committed batch's gates, deletes an abandoned
    /// one's jobs), within half a sweep interval.
    fn tidy_batches_and_log(&self) {
        let deadline = Instant::now().checked_add(self.shared.config.sweep_interval / 2);
        let tidied = self
            .store
            .continue_cascades(self.store.now(), deadline)
            .and_then(|_| self.store.tidy_batches(None, deadline));
        match tidied {
            Ok((0, 0)) => {}
            Ok((released, deleted)) => {
                log::info!("bulk enqueues: released={released} deleted_abandoned={deleted}");
            }
            Err(e) if self.shared.stop_if_damaged("sweeper", &e) => {}
            Err(e) => {
                if let Some(n) = self.prune_failures.lock().failed(Instant::now()) {
                    log::warn!("tidying bulk enqueues failed ({n} since the last report): {e:#}");
                }
            }
        }
    }

    /// Whether this runner prunes now: on PostgreSQL the one that holds the `prune` lead
    /// ([`Store::lead`]), taken or renewed at each sweep for three sweep intervals (at least a
    /// lease TTL), so that runners on many hosts do not all prune at once; on SQLite always.
    /// A failure to ask is logged, and this sweep does not prune.
    fn leads_pruning(&self, now: i64) -> bool {
        let cfg = &self.shared.config;
        let ttl = (cfg.sweep_interval * 3).max(cfg.lease_ttl);
        match self.store.lead("prune", &self.shared.worker_id, ttl, now) {
            Ok(leads) => {
                let changed = leads != self.leads_pruning.swap(leads, Ordering::Relaxed);
                if changed && crate::store::pg::is_url(&cfg.path) {
                    log::info!(
                        "this runner {} the pruning of the database",
                        if leads {
                            "now leads"
                        } else {
                            "no longer leads"
                        }
                    );
                }
                leads
            }
            Err(e) if self.shared.stop_if_damaged("sweeper", &e) => false,
            Err(e) => {
                if let Some(n) = self.prune_failures.lock().failed(Instant::now()) {
                    log::warn!(
                        "cannot ask for the lead of pruning ({n} since the last report): {e:#}"
                    );
                }
                false
            }
        }
    }

    /// Prunes finished jobs past the retention policy, a few batches at most, and logs a line
    /// when it pruned or freed anything. Errors are logged: the next sweep tries again.
    pub(crate) fn prune_and_log(&self, now: i64) {
        match self.prune(now) {
            Ok(r) if r.jobs > 0 || r.bytes_freed > 0 || r.wal_truncated => {
                log::info!(
                    "prune jobs={} bytes_freed={} more={} wal_truncated={}",
                    r.jobs,
                    r.bytes_freed,
                    r.more,
                    r.wal_truncated
                );
                if r.jobs > 0 || self.files_left.load(Ordering::Relaxed) {
                    self.remove_files_and_log();
                }
            }
            Ok(_) => {
                log::debug!("prune: nothing to do");
                if self.files_left.load(Ordering::Relaxed) {
                    self.remove_files_and_log();
                }
            }
            Err(e) if self.shared.stop_if_damaged("sweeper", &e) => {}
            Err(e) => {
                if let Some(n) = self.prune_failures.lock().failed(Instant::now()) {
                    log::warn!("prune failed ({n} since the last report): {e:#}");
                }
            }
        }
    }

    /// Removes the output files of the jobs that are gone, for at most a quarter of a sweep
    /// interval (what is left over is removed at the next sweeps), and logs a line when it
    /// removed any. Errors are logged: the next sweep tries again.
    fn remove_files_and_log(&self) {
        let deadline = Instant::now().checked_add(self.shared.config.sweep_interval / 4);
        let removed = self.store.remove_orphan_files(deadline);
        // Stopped at the deadline (or failed): go on at the next sweep, pruned jobs or not.
        let left = removed.is_err() || deadline.is_some_and(|d| Instant::now() >= d);
        self.files_left.store(left, Ordering::Relaxed);
        match removed {
            Ok(0) => {}
            Ok(n) => log::info!("removed the output files of {n} pruned jobs"),
            Err(e) if self.shared.stop_if_damaged("sweeper", &e) => {}
            Err(e) => {
                if let Some(n) = self.prune_failures.lock().failed(Instant::now()) {
                    log::warn!(
                        "removing pruned jobs' files failed ({n} since the last report): {e:#}"
                    );
                }
            }
        }
    }

    /// Rounds of [`PRUNE_BATCHES_PER_SWEEP`] batches while jobs are left due, for at most half
    /// a sweep interval: a runner that finishes jobs faster than one round prunes keeps up,
    /// and the sweeper still reclaims on its cadence. The budget also bounds each round, which
    /// starts no batch or vacuum step past it: on a large file a round alone took 11 s.
    fn prune(&self, now: i64) -> Result<PruneReport> {
        let cfg = &self.shared.config;
        let budget = cfg.sweep_interval / 2;
        let started = Instant::now();
        let options = PruneOptions::default()
            .max_batches(Some(PRUNE_BATCHES_PER_SWEEP))
            .max_vacuum_steps(Some(PRUNE_VACUUM_MIB_PER_ROUND))
            .deadline(started.checked_add(budget));
        let mut total = PruneReport::default();
        loop {
            let r = self.store.prune_at(&cfg.retention, &options, now)?;
            total.jobs += r.jobs;
            total.bytes_freed += r.bytes_freed;
            total.wal_truncated |= r.wal_truncated;
            total.more = r.more;
            if !r.more || started.elapsed() >= budget {
                return Ok(total);
            }
        }
    }

    /// One sweep at `now`: find dead runners on this host, reclaim lost attempts, tear down
    /// the processes of every lost attempt still marked.
    pub(crate) fn sweep_once(&self, now: i64) -> Result<SweepCounters> {
        let mut report = SweepCounters {
            sweeps: 1,
            ..SweepCounters::default()
        };
        let cfg = &self.shared.config;
        // Both clocks are observed at every sweep.
        let local = self.settling();
        let settling = self.server_settling()? || local;
        let dead = self.dead_runners()?;
        report.dead_runners = dead.len() as u64;
        for (id, why) in &dead {
            log::info!("runner {id} is dead: {why}");
        }
        // Read before the reclaim: a token taken later comes with a fresh lease, which the
        // reclaim does not find expired.
        let held: Vec<String> = self.shared.running.lock().keys().cloned().collect();
        let judged = Judged::default();
        let judge = |kept: &KeptAttempt| judged.judge(&self.shared, kept);
        let reclaimed = self.store.reclaim(
            &ReclaimRequest {
                max_recovery_attempts: cfg.max_recovery_attempts,
                batch: cfg.reclaim_batch,
                exclude_worker: Some(&self.shared.worker_id),
                held_tokens: Some(&held),
                dead_workers: &dead,
                expired: !settling,
                keepers: Some(&judge),
                lease_ttl: cfg.lease_ttl,
            },
            now,
        )?;
        for r in &reclaimed.reclaimed {
            log::info!(
                "job {} attempt {} reclaimed ({}): {}",
                r.lost.job_id,
                r.lost.attempt,
                r.status,
                r.message
            );
        }
        for (kept, status) in &reclaimed.recovered {
            log::info!(
                "job {} attempt {}: runner {} was gone; recorded its keeper's outcome ({status})",
                kept.job_id,
                kept.attempt,
                kept.worker_id
            );
        }
        report.recovered = reclaimed.recovered.len() as u64;
        report.adopted = reclaimed.adopted.len() as u64;
        report.reclaimed_pending = reclaimed.pending() as u64;
        report.reclaimed_failed = reclaimed.failed() as u64;
        super::adopt::add(&self.shared, &judged, reclaimed.adopted);
        judged.clear();
        if cfg.reclaim_batch > 0 {
            let (torn, unverified) = tear_down_lost_attempts_at(
                &self.store,
                u64::from(cfg.reclaim_batch),
                cfg.kill_grace,
                !settling,
            )?;
            report.torn_down = torn;
            report.unverified = unverified;
        }
        for (id, _) in &dead {
            self.store.mark_runner_dead(id, now)?;
        }
        Ok(report)
    }

    /// True while the sweeper distrusts lease expiry after a jump of the wall clock.
    fn settling(&self) -> bool {
        let cfg = &self.shared.config;
        self.clock.lock().observe(
            SystemTime::now(),
            Instant::now(),
            cfg.heartbeat_interval,
            cfg.lease_ttl,
        )
    }

    /// True while the sweeper distrusts lease expiry after a step of the database server's
    /// clock, which stamps the leases on PostgreSQL (on SQLite the wall clock is that clock,
    /// and [`Sweeper::settling`] watches it).
    ///
    /// # Errors
    ///
    /// The server's time cannot be read.
    fn server_settling(&self) -> Result<bool> {
        // A manual clock's steps are a test's, not the server's.
        if self.store.conn().sqlite().is_some() || self.store.clock().is_manual() {
            return Ok(false);
        }
        let cfg = &self.shared.config;
        let sent = Instant::now();
        let at = self.store.db_now()?;
        let reading = ServerReading {
            at,
            sent,
            received: Instant::now(),
        };
        Ok(self
            .clock
            .lock()
            .observe_server(reading, cfg.heartbeat_interval, cfg.lease_ttl))
    }

    /// Runners other than this one that are provably dead by evidence this runner can see
    /// (see [`runner_death_evidence`]), with the evidence.
    fn dead_runners(&self) -> Result<Vec<(String, String)>> {
        let mut dead: Vec<(String, String)> = self
            .store
            .runners()?
            .into_iter()
            .filter(|r| r.worker_id != self.shared.worker_id)
            .filter_map(|r| runner_death_evidence(&r, &self.here).map(|why| (r.worker_id, why)))
            .collect();
        // A runner that stopped and still holds running jobs left them to their keepers
        // (`OnShutdown::Leave`), or could not record their endings: it renews nothing any
        // more, by its own word.
        for id in self.store.stopped_runners_holding_jobs()? {
            if id != self.shared.worker_id {
                dead.push((id, "it stopped and left its running attempts".to_owned()));
            }
        }
        Ok(dead)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::job::{Job, Status, now_ms};
    use crate::process;
    use crate::runner::RunnerBuilder;
    use crate::runner::operator::{Reach, teardown_reach};
    use crate::store::ClaimRequest;
    use crate::store::RunnerRecord;

    fn sweeper(path: &std::path::Path, worker: &str) -> Sweeper {
        let config = RunnerBuilder::new(path.to_path_buf())
            .lease_ttl(Duration::from_secs(30))
            .kill_grace(Duration::from_millis(100))
            .config;
        let shared = Arc::new(Shared::new(config, worker.to_string()));
        Sweeper::new(Store::open(path).unwrap(), shared)
    }

    fn register(store: &Store, worker: &str, pid: i64, start: u64) {
        let now = now_ms();
        store
            .register_runner(&RunnerRecord {
                worker_id: worker.into(),
                pid,
                proc_start_time: start,
                boot_id: process::boot_id().unwrap(),
                host: crate::process::hostname(),
                started_at: now,
                heartbeat_at: now,
                stopped_at: None,
                lease_ttl_ms: 30_000,
                heartbeat_interval_ms: 5_000,
                max_recovery_attempts: 3,
                pid_ns: process::pid_namespace().ok(),
                containment: None,
                conditions_held: None,
                conditions_note: None,
            })
            .unwrap();
    }

    #[test]
    fn a_failure_repeated_every_sweep_is_logged_once_a_minute_with_a_count() {
        let mut r = Repeated::default();
        let t0 = Instant::now();
        assert_eq!(r.failed(t0), Some(1));
        for s in 1..60 {
            assert_eq!(r.failed(t0 + Duration::from_secs(s)), None);
        }
        assert_eq!(r.failed(t0 + Duration::from_secs(60)), Some(60));
        assert_eq!(r.failed(t0 + Duration::from_secs(61)), None);
    }

    /// Registers `worker` as a runner whose process has exited: its pid is gone once reaped.
    fn register_dead(store: &Store, worker: &str) {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i64;
        let start = process::start_time(pid as i32).unwrap_or(1);
        child.wait().unwrap();
        register(store, worker, pid, start);
    }

    fn claim_one(store: &Store, worker: &str) -> i64 {
        claim_token(store, worker).0
    }

    /// Claims a new job as `worker`: its id and run token.
    fn claim_token(store: &Store, worker: &str) -> (i64, String) {
        let id = store.enqueue(&Job::shell("true")).unwrap();
        let claimed = store
            .claim(
                &ClaimRequest {
                    worker_id: worker,
                    limit: 1,
                    queues: &[],
                    lease_ttl: Duration::from_secs(30),
                    queue_caps: &[],
                    unheld: 0,
                },
                now_ms(),
            )
            .unwrap();
        assert_eq!(claimed[0].id, id);
        (id, claimed[0].run_token.clone())
    }

    #[test]
    fn dead_runners_jobs_are_reclaimed_before_their_lease_expires() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.db");
        let store = Store::open(&path).unwrap();
        register_dead(&store, "dead");
        let dead_job = claim_one(&store, "dead");
        // A live runner (this process) keeps its job until its lease expires.
        let me = std::process::id() as i64;
        register(&store, "alive", me, process::start_time(me as i32).unwrap());
        let live_job = claim_one(&store, "alive");

        let report = sweeper(&path, "sweeper").sweep_once(now_ms()).unwrap();
        assert_eq!(report.dead_runners, 1);
        assert_eq!(report.reclaimed_pending, 1);
        assert_eq!(report.torn_down, 1);
        let job = store.job(dead_job).unwrap();
        assert_eq!(job.status, Status::Pending);
        assert!(!job.teardown_pending);
        let msg = job.last_error.unwrap();
        assert!(
            msg.starts_with("lease expired after missing heartbeat; runner dead is dead"),
            "{msg}"
        );
        assert_eq!(store.job(live_job).unwrap().status, Status::Running);
        assert!(
            store
                .runners()
                .unwrap()
                .iter()
                .all(|r| r.worker_id != "dead")
        );
    }

    #[test]
    fn own_jobs_are_never_reaped_even_past_their_lease() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.db");
        let store = Store::open(&path).unwrap();
        let (id, token) = claim_token(&store, "me");
        let later = now_ms() + 3_600_000;
        let me = sweeper(&path, "me");
        me.shared.running.lock().insert(
            token,
            crate::runner::shared::Running {
                job_id: id,
                queue: "default".into(),
                stop: process::StopHandle::new().unwrap(),
                lease_expires_at: now_ms(),
                fence: crate::runner::shared::Fence::None,
                release: None,
                stop_when_lost: 0,
            },
        );
        let report = me.sweep_once(later).unwrap();
        assert_eq!(report.reclaimed_pending + report.reclaimed_failed, 0);
        assert_eq!(store.job(id).unwrap().status, Status::Running);
        // Another runner's sweeper at the same time reclaims it.
        let report = sweeper(&path, "other").sweep_once(later).unwrap();
        assert_eq!(report.reclaimed_pending, 1);
    }

    /// An own expired lease that no worker holds (its ending was given up on) is this
    /// runner's to reclaim: nobody else would while it lives, and it no longer renews it.
    #[test]
    fn own_expired_leases_that_no_worker_holds_are_reclaimed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.db");
        let store = Store::open(&path).unwrap();
        let id = claim_one(&store, "me");
        let me = sweeper(&path, "me");
        let report = me.sweep_once(now_ms()).unwrap();
        assert_eq!(report.reclaimed_pending, 0, "its lease has not expired yet");
        let report = me.sweep_once(now_ms() + 3_600_000).unwrap();
        assert_eq!(report.reclaimed_pending, 1);
        assert_eq!(store.job(id).unwrap().status, Status::Pending);
    }

    #[test]
    fn a_sweep_after_a_wall_clock_jump_spares_live_leases_but_reclaims_on_evidence() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.db");
        let store = Store::open(&path).unwrap();
        // A live runner (this process) whose lease looks expired after the jump.
        let me = std::process::id() as i64;
        register(&store, "alive", me, process::start_time(me as i32).unwrap());
        let live_job = claim_one(&store, "alive");
        register_dead(&store, "dead");
        let dead_job = claim_one(&store, "dead");
        // A running row without lease metadata.
        let bare_job = claim_one(&store, "alive");
        store
            .conn()
            .execute(
                "UPDATE jobs SET lease_expires_at = NULL WHERE id = ?1",
                [bare_job],
            )
            .unwrap();

        // The wall clock jumps an hour ahead between two sweeps (or the machine slept): the
        // last sweep's wall time is an hour behind, its monotonic time is now.
        let jumped = sweeper(&path, "sweeper");
        jumped.clock.lock().wall = SystemTime::now() - Duration::from_secs(3600);
        let after_jump = now_ms() + 3_600_000;
        let report = jumped.sweep_once(after_jump).unwrap();
        assert_eq!(report.dead_runners, 1);
        assert_eq!(report.reclaimed_pending, 2, "{report:?}");
        assert_eq!(store.job(live_job).unwrap().status, Status::Running);
        assert_eq!(store.job(dead_job).unwrap().status, Status::Pending);
        assert_eq!(store.job(bare_job).unwrap().status, Status::Pending);
        // The next sweep within the lease TTL still settles.
        let report = jumped.sweep_once(after_jump + 1_000).unwrap();
        assert_eq!(report.reclaimed_pending + report.reclaimed_failed, 0);
        assert_eq!(store.job(live_job).unwrap().status, Status::Running);
        // Without the jump the same lease counts as expired: settling is what spared it.
        let report = sweeper(&path, "other").sweep_once(after_jump).unwrap();
        assert_eq!(report.reclaimed_pending, 1);
        assert_eq!(store.job(live_job).unwrap().status, Status::Pending);
    }

    #[test]
    fn a_wall_clock_jump_suspends_expiry_reclaims_for_one_lease_ttl() {
        let (w0, m0) = (SystemTime::now(), Instant::now());
        let (beat, ttl) = (Duration::from_secs(5), Duration::from_secs(30));
        let mut clock = Clock {
            wall: w0,
            mono: m0,
            settle_until: None,
            server: None,
        };
        let s = Duration::from_secs;
        // Both clocks move together: nothing to distrust.
        assert!(!clock.observe(w0 + s(5), m0 + s(5), beat, ttl));
        // A suspend: an hour of wall clock in five seconds of monotonic time.
        assert!(clock.observe(w0 + s(3610), m0 + s(10), beat, ttl));
        assert!(clock.observe(w0 + s(3630), m0 + s(30), beat, ttl));
        // One lease TTL after the jump, expiry is trusted again.
        assert!(!clock.observe(w0 + s(3641), m0 + s(41), beat, ttl));
        // A step backwards settles too; a step within a heartbeat of drift does not.
        assert!(clock.observe(w0 + s(3000), m0 + s(46), beat, ttl));
        let mut steady = Clock {
            wall: w0,
            mono: m0,
            settle_until: None,
            server: None,
        };
        assert!(!steady.observe(w0 + s(14), m0 + s(10), beat, ttl));
    }

    #[test]
    fn a_step_of_the_servers_clock_suspends_expiry_reclaims_for_one_lease_ttl() {
        let (w0, m0) = (SystemTime::now(), Instant::now());
        let (beat, ttl) = (Duration::from_secs(5), Duration::from_secs(30));
        let mut clock = Clock {
            wall: w0,
            mono: m0,
            settle_until: None,
            server: None,
        };
        let s = Duration::from_secs;
        let t0 = 1_000_000_000_000i64;
        // A reading sent at `sent` s and answered `rtt` s later, of the server's time t0 + `at`.
        let read = |at: i64, sent: u64, rtt: u64| ServerReading {
            at: t0 + at,
            sent: m0 + s(sent),
            received: m0 + s(sent + rtt),
        };
        // The first reading has nothing to compare with; then both clocks move together.
        assert!(!clock.observe_server(read(0, 0, 0), beat, ttl));
        assert!(!clock.observe_server(read(5_000, 5, 0), beat, ttl));
        // A slow answer (8 s on the way) is not a step, nor is the prompt one after it.
        assert!(!clock.observe_server(read(10_000, 10, 8), beat, ttl));
        assert!(!clock.observe_server(read(20_000, 20, 0), beat, ttl));
        // The server's clock is stepped an hour ahead; this host's wall clock is not.
        assert!(clock.observe_server(read(3_625_000, 25, 0), beat, ttl));
        // The wall clock's view settles with it: one settling for both.
        assert!(clock.observe(w0 + s(30), m0 + s(30), beat, ttl));
        assert!(clock.observe_server(read(3_650_000, 50, 0), beat, ttl));
        // One lease TTL after the step, expiry is trusted again.
        assert!(!clock.observe_server(read(3_656_000, 56, 0), beat, ttl));
        // A step back settles too; drift within a heartbeat does not.
        assert!(clock.observe_server(read(3_000_000, 60, 0), beat, ttl));
        let mut steady = Clock {
            wall: w0,
            mono: m0,
            settle_until: None,
            server: Some(read(0, 0, 0)),
        };
        assert!(!steady.observe_server(read(14_000, 10, 0), beat, ttl));
        assert!(!steady.observe_server(read(23_000, 20, 0), beat, ttl));
    }

    #[test]
    fn a_lost_attempt_of_another_namespace_keeps_its_marker_until_forced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.db");
        let store = Store::open(&path).unwrap();
        // A runner of this boot in another PID namespace, whose pid here is this process
        // under another start time: evidence only to a judge in its namespace.
        let me = std::process::id() as i64;
        let here = Namespace::here();
        let other_ns = here.pid_ns.map(|n| n + 1);
        let now = now_ms();
        store
            .register_runner(&RunnerRecord {
                worker_id: "boxed".into(),
                pid: me,
                proc_start_time: 1,
                boot_id: here.boot_id.clone(),
                host: here.host.clone(),
                started_at: now,
                heartbeat_at: now,
                stopped_at: None,
                lease_ttl_ms: 30_000,
                heartbeat_interval_ms: 5_000,
                max_recovery_attempts: 3,
                pid_ns: other_ns,
                containment: None,
                conditions_held: None,
                conditions_note: None,
            })
            .unwrap();
        let id = claim_one(&store, "boxed");
        let sweeper = sweeper(&path, "sweeper");
        // Alive as far as this namespace can tell: its lease is kept.
        let report = sweeper.sweep_once(now_ms()).unwrap();
        assert_eq!(report.dead_runners, 0);
        assert_eq!(store.job(id).unwrap().status, Status::Running);
        // Once its lease expires the job is reclaimed, but its teardown waits.
        let later = now_ms() + 3_600_000;
        let report = sweeper.sweep_once(later).unwrap();
        assert_eq!(report.reclaimed_pending, 1);
        assert_eq!(report.torn_down, 0);
        let job = store.job(id).unwrap();
        assert_eq!(job.status, Status::Pending);
        assert!(job.teardown_pending);
        let lost = store.teardown_of(id).unwrap().unwrap();
        assert_eq!(lost.worker_id.as_deref(), Some("boxed"));
        assert_eq!(lost.namespace.as_ref().unwrap().pid_ns, other_ns);
        let why = super::super::operator::teardown_wait(&store, id)
            .unwrap()
            .unwrap();
        let ns = other_ns.unwrap();
        assert!(
            why.contains(&format!(
                "teardown waits for a runner in PID namespace {ns}"
            )),
            "{why}"
        );
        assert!(why.contains("runner boxed is there"), "{why}");
        assert_eq!(sweeper.sweep_once(later).unwrap().torn_down, 0);
        // The operator forces it: recorded, saying what was not verified.
        let detail = super::super::operator::force_teardown(&store, id)
            .unwrap()
            .unwrap();
        assert!(detail.contains("not verified"), "{detail}");
        assert!(!store.job(id).unwrap().teardown_pending);
        assert_eq!(
            super::super::operator::force_teardown(&store, id).unwrap(),
            None
        );
    }

    #[test]
    fn a_reused_pid_proves_its_runner_dead_only_in_the_same_namespace() {
        let me = std::process::id() as i64;
        let start = process::start_time(me as i32).unwrap();
        let here = Namespace::here();
        let ns = here.pid_ns;
        let record = |pid: i64, start: u64, boot: &str, host: &str, pid_ns| RunnerRecord {
            worker_id: "r".into(),
            pid,
            proc_start_time: start,
            boot_id: boot.into(),
            host: host.into(),
            started_at: 0,
            heartbeat_at: 0,
            stopped_at: None,
            lease_ttl_ms: 0,
            heartbeat_interval_ms: 0,
            max_recovery_attempts: 0,
            pid_ns,
            containment: None,
            conditions_held: None,
            conditions_note: None,
        };
        let (host, boot) = (here.host.clone(), here.boot_id.clone());
        let judge = |r: &RunnerRecord| runner_death_evidence(r, &here);
        assert_eq!(judge(&record(me, start, &boot, &host, ns)), None);
        let reused = judge(&record(me, start + 1, &boot, &host, ns));
        assert!(reused.unwrap().contains("another process"));
        let gone = judge(&record(i64::from(i32::MAX), start, &boot, &host, ns));
        assert!(gone.unwrap().contains("is gone"));
        // In another PID namespace, or one not recorded (a row from before version 9), the
        // pid proves nothing: pid 1 there is not pid 1 here.
        let other_ns = ns.map(|n| n + 1);
        assert_eq!(judge(&record(me, start + 1, &boot, &host, other_ns)), None);
        assert_eq!(judge(&record(1, start, &boot, &host, other_ns)), None);
        assert_eq!(judge(&record(me, start + 1, &boot, &host, None)), None);
        // Another boot of this host ended the runner, whatever its namespace.
        let rebooted = judge(&record(me, start, "old-boot", &host, other_ns));
        assert!(rebooted.unwrap().contains("boot"));
        // A runner whose boot id was unreadable proves nothing by it.
        assert_eq!(judge(&record(me, start + 1, "", &host, ns)), None);
        // Nothing can be proven about another host's runner from here.
        assert_eq!(judge(&record(me, 0, "x", "elsewhere", ns)), None);
    }

    #[test]
    fn a_lost_attempt_is_torn_down_only_where_its_pids_mean_something() {
        let here = Namespace::new("vm", "boot-a", Some(7));
        let reach = |host: &str, boot: &str, ns| {
            teardown_reach(Some(&Namespace::new(host, boot, ns)), &here)
        };
        assert_eq!(teardown_reach(None, &here), Reach::Here);
        assert_eq!(reach("vm", "boot-a", Some(7)), Reach::Here);
        // A container of this kernel with its own host name but this PID namespace: here.
        assert_eq!(reach("box", "boot-a", Some(7)), Reach::Here);
        let Reach::Elsewhere(why) = reach("vm", "boot-a", Some(8)) else {
            panic!("another namespace is elsewhere")
        };
        assert!(why.contains("PID namespace 8"), "{why}");
        assert!(matches!(reach("vm", "boot-a", None), Reach::Elsewhere(_)));
        assert!(matches!(reach("vm", "", Some(7)), Reach::Elsewhere(_)));
        assert!(matches!(reach("vm", "boot-b", Some(8)), Reach::Gone(_)));
        assert!(matches!(
            reach("other", "boot-b", Some(7)),
            Reach::Elsewhere(_)
        ));
        let unknown_here = Namespace::new("vm", "boot-a", None);
        assert!(matches!(
            teardown_reach(
                Some(&Namespace::new("vm", "boot-a", Some(7))),
                &unknown_here
            ),
            Reach::Elsewhere(_)
        ));
    }
}
