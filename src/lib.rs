//! leasehold: an embedded, durable job runner on SQLite.
#![deny(missing_docs)]

mod attempt;
mod error;
mod heartbeat;
mod job;
mod process;
mod runner;
mod store;
mod sweeper;
mod worker;
mod writer;

pub use error::{Error, Result};
pub use job::{
    DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_MAX, DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE, ErrorKind,
    Event, Job, JobRecord, OnLost, Outcome, Output, Status, now_ms,
};
pub use runner::{
    Completion, DEFAULT_DRAIN_TIMEOUT, DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_KILL_GRACE,
    DEFAULT_LEASE_TTL, DEFAULT_OUTPUT_TAIL, DEFAULT_POLL_INTERVAL, DEFAULT_RECLAIM_BATCH,
    DEFAULT_SHUTDOWN_GRACE, DEFAULT_SWEEP_INTERVAL, DEFAULT_WORKERS, Runner, RunnerBuilder,
};
pub use store::{
    AttemptStart, ClaimRequest, Claimed, Counts, DEFAULT_BUSY_TIMEOUT,
    DEFAULT_MAX_RECOVERY_ATTEMPTS, Durability, Ending, Finish, Finished, LEASE_EXPIRED_PREFIX,
    LEASE_MISSING_PREFIX, LeaseCounts, ListFilter, LostAttempt, Migration, OpenOptions,
    ReclaimReport, ReclaimRequest, Reclaimed, Renewal, RunnerRecord, SCHEMA_VERSION, Store,
};
pub use sweeper::{SweepCounters, runner_alive, tear_down_lost_attempts};
