//! Crash recovery with real crashes: each test starts `leasehold run` processes, kills,
//! freezes or starves them, and checks that no job is lost, run twice at once, or wedged.

#[path = "../util/mod.rs"]
mod util;

mod helper;

mod cgroup;
mod chaos;
mod crash;
mod deploy;
mod exhaustion;
mod flow;
mod freeze;
mod fulldisk;
mod hosts;
mod keeper_exec;
mod keepers;
mod namespace;
mod pg_restart;
mod renewal;
mod retry_elsewhere;
mod schedule;
mod server_clock;
mod shutdown;
mod soak;
mod writelock;
