//! The "ready to claim" predicate: a job a claim may take, once it is due. Every statement
//! that reads the claim indexes (`jobs_claim`, `jobs_claim_queue`, `jobs_pending_due`) states
//! it, and each of those indexes is partial on exactly it: SQLite uses a partial index only
//! for a query whose WHERE clause implies the index's, so a statement that worded it
//! differently would silently read the whole table. It is written once, here, and a test
//! checks it against the schema's indexes.

/// The predicate, as SQL text: pending, with no teardown marker, and waiting for no other
/// job. "Due" (`scheduled_at <= now`) is not part of it: the indexes hold jobs due later too.
/// A macro, so that statements built at compile time can `concat!` it.
macro_rules! ready_to_claim {
    () => {
        "status = 'pending' AND teardown_token IS NULL AND waiting = 0"
    };
}

/// [`ready_to_claim!`] as a constant, for the schema test.
#[cfg(test)]
pub(super) const READY_TO_CLAIM: &str = ready_to_claim!();

#[cfg(test)]
mod tests {
    use super::READY_TO_CLAIM;

    /// The indexes the claim reads are partial on exactly the predicate the statements use.
    #[test]
    fn the_claim_indexes_are_partial_on_the_ready_predicate() {
        let conn = rusqlite::Connection::open_in_memory().expect("an in-memory database");
        conn.execute_batch(include_str!("../../schema.sql"))
            .expect("the schema loads");
        for index in ["jobs_claim", "jobs_claim_queue", "jobs_pending_due"] {
            let sql: String = conn
                .query_row(
                    "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = ?1",
                    [index],
                    |r| r.get(0),
                )
                .expect("the index exists");
            let clause = sql.split_once(" WHERE ").map(|(_, w)| w.trim());
            assert_eq!(clause, Some(READY_TO_CLAIM), "{index}: {sql}");
        }
    }
}
