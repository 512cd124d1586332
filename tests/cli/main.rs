//! The `leasehold` binary, run as an operator or a script would run it: every command, every
//! JSON shape, every error with its exit code, and the runbook's plain SQL.

#[path = "../util/mod.rs"]
mod util;

mod helper;

mod bulk;
mod cdp;
mod conditions;
mod damaged;
mod dashboard;
mod db;
mod fsync;
mod handoff;
mod hosts;
mod jobs;
mod junit;
mod logs;
mod numeric;
mod progress;
mod prune;
mod queues;
mod run;
mod runbook;
mod schedules;
mod serve;
mod serve_auth;
mod status;
mod usage;
mod wait;
mod wake_folder;
