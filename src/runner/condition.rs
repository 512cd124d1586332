//! The condition thread: looks at what holds on this machine (power, network, idleness) every
//! [`CONDITION_INTERVAL`], tells the claim (through [`Shared::set_unheld`]), stops the running
//! attempts that must stop when a condition they need is lost, and records what it saw in the
//! runner's row for `status`, `jobs inspect` and the dashboard.

use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError};

use crate::condition::ALL_CONDITIONS;
use crate::process::{ConditionProbe, ConditionsSeen};
use crate::store::Store;

use super::shared::Shared;

/// How often a runner looks at the conditions on jobs: a change is seen within this time
/// (power is a file read; the network and idleness three D-Bus calls on a kept connection).
pub const CONDITION_INTERVAL: Duration = Duration::from_secs(2);

/// Looks until `stop` is closed.
pub(crate) fn run(store: &Store, shared: &Shared, stop: &Receiver<()>) {
    let mut probe = ConditionProbe::new(shared.config.assume_unknown_conditions);
    let mut recorded: Option<ConditionsSeen> = None;
    loop {
        let seen = probe.look();
        apply(store, shared, &seen, &mut recorded);
        match stop.recv_timeout(CONDITION_INTERVAL) {
            Err(RecvTimeoutError::Timeout) if !shared.failed() => {}
            _ => return,
        }
    }
}

/// One look's effects: the claim's mask, the attempts stopped, and the runner's row written
/// when what it saw changed (a failed write is tried again at the next look).
fn apply(
    store: &Store,
    shared: &Shared,
    seen: &ConditionsSeen,
    recorded: &mut Option<ConditionsSeen>,
) {
    if recorded.as_ref() != Some(seen) {
        record(store, shared, seen, recorded);
    }
    shared.set_unheld(ALL_CONDITIONS & !seen.held);
}

/// Writes what the runner saw into its row, and logs it. Before the claim and the running
/// attempts are told: a job stopped for a lost condition is then never shown pending
/// without the condition it waits for.
fn record(
    store: &Store,
    shared: &Shared,
    seen: &ConditionsSeen,
    recorded: &mut Option<ConditionsSeen>,
) {
    match store.record_conditions(&shared.worker_id, seen.held, &seen.note) {
        Ok(()) => {
            log::info!(
                "conditions holding: {}{}",
                names(seen.held),
                if seen.note.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", seen.note)
                }
            );
            *recorded = Some(seen.clone());
        }
        Err(e) => log::warn!("cannot record the conditions this runner sees: {e}"),
    }
}

/// The names of a mask's conditions, or `none`.
fn names(mask: u32) -> String {
    let names: Vec<&str> = crate::condition::from_mask(mask)
        .into_iter()
        .map(|c| c.as_str())
        .collect();
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}
