//! What a lost attempt's job becomes, written once for the two ways an attempt is found
//! lost (a sweeper's reclaim, a runner's own fence): the start of its error, and the verdict
//! of its recovery budget and `on_lost`.

use crate::job::{OnLost, Status};

/// The start of `last_error` for a job whose lease expired (or whose runner is dead).
pub const LEASE_EXPIRED_PREFIX: &str = "lease expired after missing heartbeat; ";
/// The start of `last_error` for a running job with no lease metadata.
pub const LEASE_MISSING_PREFIX: &str = "lease metadata missing for running job; ";

/// Where a lost attempt's job goes: back to pending while the budget lasts and the job asks
/// for it, failed otherwise, with the message saying which.
pub(super) fn lost_verdict(
    on_lost: &str,
    recovery: i64,
    max: u32,
    message: String,
) -> (Status, String) {
    if on_lost == OnLost::Fail.as_str() {
        (
            Status::Failed,
            format!(
                "{message}; on_lost=fail: not executed again, and its side effects may already have happened"
            ),
        )
    } else if recovery > i64::from(max) {
        (
            Status::Failed,
            format!("{message}; recovery budget of {max} exhausted (reclaimed {recovery} times)"),
        )
    } else {
        (Status::Pending, message)
    }
}
