//! The runner on real SQLite files and real subprocesses: process groups, timeouts, output,
//! retries, revoked leases, completions and shutdown.

#[path = "../util/mod.rs"]
mod util;

mod helper;

mod completion;
mod enqueue;
mod flow;
mod lease;
mod manners;
mod metrics;
mod pg_cut;
mod pg_lock;
mod postgres;
mod process;
mod retention;
mod retry;
mod schedule;
mod shutdown;
mod teardown;
mod wake;
mod writer;
