//! The process layer: the crate's only `unsafe` and raw operating-system calls.

mod attempt;
mod proc;

pub(crate) use attempt::{
    AttemptResult, AttemptSpec, BaseEnv, Ending, StopHandle, StopReason, run,
};
pub(crate) use proc::{AttemptIdentity, boot_id, hostname, proc_info, self_start_time, teardown};
#[cfg(test)]
pub(crate) use proc::{group_has_live_members, is_alive, start_time};
