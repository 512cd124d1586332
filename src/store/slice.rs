//! Long work done in slices, each a write transaction that holds the lock for a bounded
//! time, with a pause between them so that the runners' renewals get the lock: bulk
//! enqueues, cascades, retries of many jobs, prunes.

use std::time::Duration;

/// How long one slice of a bulk enqueue or of [`tidy`] holds the write lock at most (then its
/// last row, and the commit): well under a renewal's margin, and long enough that the commits
/// cost little (about 1,000 to 3,000 rows a slice, measured).
pub(super) const SLICE: Duration = Duration::from_millis(50);

/// Pauses after a write transaction of a prune for as long as it held the lock (at least a
/// millisecond): a loop of back-to-back transactions starves the other connections, whose
/// busy handlers sleep between tries and keep finding the lock taken (measured: a claim
/// waited 632 ms behind 8 batches and their vacuum that way). Half the time free bounds
/// their wait to about one transaction.
pub(super) fn yield_lock(held: Duration) {
    std::thread::sleep(held.max(Duration::from_millis(1)));
}
