//! leasehold: an embedded, durable job runner on SQLite.
#![deny(missing_docs)]

mod error;
mod job;
mod store;

pub use error::{Error, Result};
pub use job::{
    DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_MAX, DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE, ErrorKind,
    Event, Job, JobRecord, OnLost, Outcome, Output, Status, now_ms,
};
pub use store::{
    AttemptStart, ClaimRequest, Claimed, Counts, DEFAULT_BUSY_TIMEOUT,
    DEFAULT_MAX_RECOVERY_ATTEMPTS, Durability, Ending, Finish, Finished, LEASE_EXPIRED_PREFIX,
    LEASE_MISSING_PREFIX, LeaseCounts, ListFilter, LostAttempt, Migration, OpenOptions,
    ReclaimReport, ReclaimRequest, Reclaimed, Renewal, RunnerRecord, SCHEMA_VERSION, Store,
};
