//! The runner on real SQLite files and real subprocesses: process groups, timeouts, output,
//! retries, revoked leases, completions and shutdown.

#[path = "../util/mod.rs"]
mod util;

mod helper;

mod completion;
mod enqueue;
mod lease;
mod process;
mod retention;
mod retry;
mod shutdown;
mod wake;
