//! The store on real database files: claims, fences, endings, reclaims, operator actions,
//! migrations and concurrent connections. Time is a parameter: no test waits for a lease.

#[path = "../util/mod.rs"]
mod util;

mod helper;

mod batch;
mod claim;
mod dependency;
mod ending;
mod failure;
mod fence;
mod handoff_race;
mod leader;
mod lock_order;
mod metrics;
mod migration;
mod multiprocess;
mod name;
mod operator;
mod operator_race;
mod queue;
mod reclaim;
mod renewal;
mod retention;
mod roundtrip;
mod schedule;
mod tls;
mod unique;
