//! The runner's side of the store: the lease transitions a runner performs, and their types.
//!
//! An embedder needs none of this: [`Runner`](crate::Runner) claims, starts, renews, finishes
//! and reclaims on its own. These are public for tools that drive leases themselves (a runner
//! in another language on the same file, a test harness that plays a runner step by step),
//! with [`Store::claim`](crate::Store::claim), [`Store::record_start`](crate::Store::record_start),
//! [`Store::renew`](crate::Store::renew), [`Store::finish`](crate::Store::finish),
//! [`Store::reclaim`](crate::Store::reclaim), [`Store::pending_teardowns`](crate::Store::pending_teardowns)
//! and [`Store::record_teardown`](crate::Store::record_teardown). Every one of them is fenced
//! by the run token, as the runner's own writes are.
//!
//! ```
//! # fn main() -> leasehold::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! use std::time::Duration;
//! use leasehold::protocol::{ClaimRequest, Ending, Finish, Finished};
//! use leasehold::{Job, Status, Store, now_ms};
//!
//! let store = Store::open(dir.path().join("jobs.db"))?;
//! let id = store.enqueue(&Job::shell("true"))?;
//! let req = ClaimRequest {
//!     worker_id: "my-worker",
//!     limit: 1,
//!     queues: &[],
//!     lease_ttl: Duration::from_secs(30),
//!     queue_caps: &[],
//!     unheld: 0,
//! };
//! let claimed = store.claim(&req, now_ms())?.remove(0);
//! let finish = Finish {
//!     job_id: claimed.id,
//!     run_token: claimed.run_token.clone(),
//!     attempt: claimed.attempt,
//!     ending: Ending::Succeeded,
//!     output: None,
//!     notes: Vec::new(),
//!     max_recovery_attempts: 3,
//! };
//! assert_eq!(store.finish(&finish, now_ms())?, Finished::Recorded(Status::Succeeded));
//! assert_eq!(store.job(id)?.status, Status::Succeeded);
//! # Ok(())
//! # }
//! ```

pub use crate::store::{
    AttemptStart, ClaimRequest, Claimed, Ending, Finish, Finished, KeptAttempt, KeptVerdict,
    LostAttempt, ReclaimReport, ReclaimRequest, Reclaimed, Renewal,
};
