//! The process layer: the crate's only `unsafe` and raw operating-system calls.
//!
//! An attempt of a job is a command spawned with glibc's `posix_spawn` in a
//! process group of its own, carrying its run token in its environment, and
//! supervised by a `poll(2)` loop in the worker's thread until nothing of it
//! is left running ([`run`]). A lost attempt, one whose runner died or gave
//! up its lease, is torn down by whoever reclaims it ([`teardown()`]; several
//! together by [`teardown_many`], under one grace). Both end processes with
//! the one kill sequence: SIGTERM, a grace, SIGKILL while any member of the
//! group is still alive, then a bounded wait.
//!
//! Pids are recycled, so a pid (or a process group id) is trusted only
//! together with the start time recorded when it was spawned, or when the
//! process carries the attempt's run token. A process whose identity cannot
//! be verified at the moment of signalling is never signalled: the attempt's
//! main process is kept unreaped until its group is empty (so the group id
//! cannot be reused while the supervisor may signal it), and every other
//! process is held by a pidfd, verified before its first signal and
//! signalled only through it.
//!
//! - `attempt`: the supervisor: poll loop, deadlines, [`run`];
//! - `spawn`: `posix_spawn`, the child's environment and program;
//! - `cap`: manners and caps: which spawn applies them, what is in force, memory kills;
//! - `cgroup`: the cgroup mode: an attempt's cgroup, its members, its kill;
//! - `child`: the main process until it is reaped (`waitpid`, pidfd);
//! - `keeper`: the process's keeper (`keeper.c`), its launcher and its messages;
//! - `output`: the pipes and the tail kept of each stream;
//! - `stop`: [`StopHandle`], which stops an attempt from another thread;
//! - `limit`: the runner's own resource limits;
//! - `kill`: signals and the kill sequence;
//! - `teardown`: finding and killing a lost attempt's processes;
//! - `pidfd`: processes held by verified pidfds, the only way others are signalled;
//! - `proc`: facts read from `/proc`: start times, groups, token carriers;
//! - `sigchld`: whether this process can still read its children's exit statuses.

mod adopt;
mod attempt;
mod cap;
mod cgroup;
mod child;
mod condition;
mod dbus;
mod keeper;
mod kept;
mod kill;
mod limit;
mod output;
mod pidfd;
mod proc;
mod sigchld;
mod spawn;
mod stop;
mod teardown;

#[cfg(feature = "fuzzing")]
pub(crate) use keeper::fuzz_control;
#[cfg(feature = "fuzzing")]
pub(crate) use keeper::{decode as keeper_decode, lease_datagram};

pub(crate) use adopt::{Adopted, LiveKeeper, find_keeper, follow, keeper_running, live_keeper};
pub(crate) use attempt::{AttemptResult, AttemptSpec, Exit, Started, run};
pub(crate) use cap::caps_in_force;
pub(crate) use cgroup::Containment;
pub(crate) use condition::{Probe as ConditionProbe, Seen as ConditionsSeen};
pub(crate) use keeper::{move_fence, probe as probe_keeper, warn_if_namespace_init};
pub(crate) use kept::{KeptFiles, OutputFiles, Release};
pub(crate) use limit::raise_nofile_limit;
pub(crate) use proc::{
    boot_clock_ns, boot_id, hostname, pid_namespace, proc_info, self_start_time,
};
#[cfg(test)]
pub(crate) use proc::{group_has_live_members, is_alive, start_time};
pub(crate) use sigchld::statuses_lost;
pub(crate) use spawn::BaseEnv;
pub(crate) use stop::{StopHandle, StopReason};
pub(crate) use teardown::{AttemptIdentity, teardown, teardown_many};
