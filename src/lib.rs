//! leasehold: an embedded, durable job runner on SQLite.
//!
//! An application links the crate, enqueues commands, and a [`Runner`] runs them as
//! subprocesses, each attempt in its own process group, from a pool of worker threads. Every
//! running job holds a lease in the database that its runner renews; a sweeper reclaims the
//! leases of runners that died, froze or lost their disk, tears the lost attempt's processes
//! down, and requeues the job within a recovery budget or fails it. A late result from a lost
//! attempt is fenced off: whatever ends a run first wins.
//!
//! ```
//! # fn main() -> leasehold::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let path = dir.path().join("jobs.db");
//! use std::time::Duration;
//! use leasehold::{Job, Outcome, Runner};
//!
//! let runner = Runner::builder(&path).workers(2).start()?;
//! let id = runner.enqueue(&Job::shell("echo hello").timeout(Duration::from_secs(10)))?;
//! assert_eq!(runner.wait(id, Duration::from_secs(30))?, Some(Outcome::Succeeded));
//! runner.shutdown()?;
//! # Ok(())
//! # }
//! ```
//!
//! A program that only enqueues, or an operator's tool, opens the database with [`Store`]
//! and needs no runner: a runner on the same file picks the jobs up.
//!
//! [`Store::metrics`] and [`Runner::metrics`] return a [`Metrics`] snapshot (jobs by queue and
//! status, queue lag, durable counters and histograms kept in the file) that
//! [`Metrics::to_prometheus`] renders in the Prometheus text format.
#![deny(missing_docs)]

/// The README's Rust examples, compiled (and run unless `no_run`) as doc tests so that they
/// keep up with the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

mod condition;
mod error;
mod files;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod job;
mod manners;
mod metrics;
mod process;
pub mod protocol;
mod runner;
mod schedule;
mod store;
#[cfg(feature = "testing")]
pub mod testing;

pub use condition::{BATTERY_LOW_PERCENT, Condition, WhenLost};
pub use error::{Error, Result};
pub use files::{AttemptDir, DEFAULT_OUTPUT_CAP, Stream, local_folders};
pub use job::{
    DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_MAX, DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE, ErrorKind,
    Event, EventKind, Job, JobRecord, OnLost, Outcome, Output, Status, now_ms,
};
pub use manners::{DEFAULT_TEMPFAIL_MAX, EX_TEMPFAIL, IoClass, Limits};
pub use metrics::{Counter, CounterKind, Histogram, JobCount, Metrics, RunnerFigures};
pub use runner::{
    CONDITION_INTERVAL, Completion, DEFAULT_DRAIN_TIMEOUT, DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_KILL_GRACE, DEFAULT_LEASE_TTL, DEFAULT_OUTPUT_TAIL, DEFAULT_POLL_INTERVAL,
    DEFAULT_RECLAIM_BATCH, DEFAULT_SAMPLE_INTERVAL, DEFAULT_SHUTDOWN_GRACE, DEFAULT_SWEEP_INTERVAL,
    DEFAULT_WORKERS, MAX_OUTPUT_TAIL, MAX_SETTING_DURATION, MAX_WORKERS, OnShutdown, Runner,
    RunnerBuilder, SweepCounters, operator,
};
pub use schedule::{
    CatchUp, MAX_CATCH_UP, MIN_INTERVAL, MISFIRE_GRACE, Overlap, Schedule, parse_rfc3339,
};
pub use store::{
    COARSE_SAMPLES, Clock, Counts, DEFAULT_BUSY_TIMEOUT, DEFAULT_MAX_RECOVERY_ATTEMPTS,
    DatabaseSize, Durability, Enqueued, FINE_SAMPLES, FireReport, HISTOGRAM_BOUNDS_MS,
    LEASE_EXPIRED_PREFIX, LEASE_MISSING_PREFIX, LeaseCounts, ListFilter, MAX_BUSY_TIMEOUT,
    MAX_SCHEDULE_EVENTS, ManualClock, Migration, Namespace, OpenOptions, QueueInfo, RecentFailure,
    RunnerRecord, SCHEMA_VERSION, Sample, ScheduleEvent, ScheduleRecord, Store, VacuumReport,
    redacted_db,
};
pub use store::{
    DEFAULT_KEEP_CANCELLED, DEFAULT_KEEP_FAILED, DEFAULT_KEEP_SUCCEEDED, DEFAULT_PRUNE_BATCH,
    PruneOptions, PruneReport, Retention, WAL_CHECKPOINT_BYTES,
};
