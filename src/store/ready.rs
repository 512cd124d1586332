//! The "ready to claim" predicates: a job a claim may take, once it is due. Every statement
//! that reads the claim indexes (`jobs_claim`, `jobs_claim_queue`) or the due-time index
//! (`jobs_pending_due`) states its index's predicate, and each of those indexes is partial on
//! exactly it: SQLite uses a partial index only for a query whose WHERE clause implies the
//! index's, so a statement that worded it differently would silently read the whole table.
//! They are written once, here, and a test checks them against the schema's indexes.

/// The predicate, as SQL text: pending, with no teardown marker, and waiting for no other
/// job. "Due" (`scheduled_at <= now`) is not part of it: `jobs_pending_due` holds jobs due later
/// too (and the claim indexes hold any that a hand-written UPDATE moved into the future).
/// A macro, so that statements built at compile time can `concat!` it.
macro_rules! ready_to_claim {
    () => {
        "status = 'pending' AND teardown_token IS NULL AND waiting = 0"
    };
}

/// [`ready_to_claim!`] and not deferred: the predicate of the claim indexes. A job enqueued
/// (or retried) to run later is written `deferred = 1` and stays out of them until a claim
/// promotes it once it is due (see `lease::promote_due`), so that a claim, which reads the
/// claim indexes in priority order, never steps over jobs that are not due yet, whatever
/// their priority. (`jobs_pending_due`, ordered by due time, keeps them: the lag, the ready
/// count and the next wake-up read it by time.)
macro_rules! in_claim_index {
    () => {
        concat!(ready_to_claim!(), " AND deferred = 0")
    };
}

/// [`ready_to_claim!`] as a constant, for the schema test.
#[cfg(test)]
pub(super) const READY_TO_CLAIM: &str = ready_to_claim!();
/// [`in_claim_index!`] as a constant, for the schema test.
#[cfg(test)]
pub(super) const IN_CLAIM_INDEX: &str = in_claim_index!();

#[cfg(test)]
mod tests {
    use super::{IN_CLAIM_INDEX, READY_TO_CLAIM};

    /// The indexes the claim reads are partial on exactly the predicate the statements use.
    #[test]
    fn the_claim_indexes_are_partial_on_the_ready_predicate() {
        let conn = rusqlite::Connection::open_in_memory().expect("an in-memory database");
        conn.execute_batch(include_str!("../../schema.sql"))
            .expect("the schema loads");
        for (index, predicate) in [
            ("jobs_claim", IN_CLAIM_INDEX),
            ("jobs_claim_queue", IN_CLAIM_INDEX),
            ("jobs_pending_due", READY_TO_CLAIM),
        ] {
            let sql: String = conn
                .query_row(
                    "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = ?1",
                    [index],
                    |r| r.get(0),
                )
                .expect("the index exists");
            let clause = sql.split_once(" WHERE ").map(|(_, w)| w.trim());
            assert_eq!(clause, Some(predicate), "{index}: {sql}");
        }
    }
}
