//! How an attempt ended, as its worker reports it: what a finish records and the counters
//! count.

use crate::job::ErrorKind;
#[cfg(doc)]
use crate::job::Status;

/// How an attempt ended, as its worker reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// Exit code 0.
    Succeeded,
    /// The command failed; retried while attempts are left, unless it could not start.
    Failed {
        /// Why.
        kind: ErrorKind,
        /// The exit code, when it exited.
        exit_code: Option<i32>,
        /// The signal, when one killed it.
        signal: Option<i32>,
        /// In words.
        message: String,
    },
    /// The runner fenced itself: it could not renew the lease in time and killed the
    /// attempt. Follows the recovery budget and `on_lost`, like a reclaim.
    Lost {
        /// Why, after the lease-expired prefix.
        message: String,
    },
    /// The runner shut down and killed the attempt: back to pending, without spending the
    /// recovery budget or an attempt.
    Interrupted {
        /// Why.
        message: String,
    },
    /// The runner stopped the attempt because its lease was taken from it (a cancel, a
    /// reclaim, an operator's retry). The write is expected to find the lease gone: the
    /// attempt a cancel stopped is recorded as `attempt_stopped`, any other as a late
    /// result. Should the lease still be held, it is recorded as [`Ending::Lost`] is.
    Stopped {
        /// Why.
        message: String,
    },
}
