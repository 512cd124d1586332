//! What every write of the store shares: the IMMEDIATE transaction, the savepoint that lets
//! one write of a shared transaction fail alone, the event row every transition appends, and
//! the queue filter of claims and reads.

use rusqlite::{Connection, params};

use crate::error::Result;
use crate::job::EventKind;

/// Runs `f` in one IMMEDIATE transaction, rolled back when `f` fails.
pub(crate) fn transaction<T>(
    conn: &Connection,
    f: &mut impl FnMut(&Connection) -> Result<T>,
) -> Result<T> {
    conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
    let result = f(conn).and_then(|v| {
        conn.prepare_cached("COMMIT")?.execute([])?;
        Ok(v)
    });
    if result.is_err() && !conn.is_autocommit() {
        // The rollback's own failure adds nothing to the error already returned.
        let _ = conn.execute_batch("ROLLBACK");
    }
    result
}

/// Runs `f` in a savepoint of the open transaction: what `f` wrote stays when it succeeds and
/// is undone when it fails, and the transaction's other writes stay either way. The runner's
/// writer applies each write of a batch in one, so that a write that fails undoes only itself.
pub(crate) fn savepoint<T>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> Result<T>,
) -> Result<T> {
    // Cached statements: these run for every write, and parsing them each time shows.
    let exec = |sql: &str| -> Result<()> {
        conn.prepare_cached(sql)?.execute([])?;
        Ok(())
    };
    exec("SAVEPOINT op")?;
    match f(conn) {
        Ok(v) => {
            exec("RELEASE op")?;
            Ok(v)
        }
        Err(e) => {
            exec("ROLLBACK TO op")?;
            exec("RELEASE op")?;
            Err(e)
        }
    }
}

/// Appends one event to a job's history.
pub(super) fn event(
    conn: &Connection,
    job_id: i64,
    at: i64,
    kind: EventKind,
    attempt: i64,
    detail: &str,
) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO job_events (job_id, at, kind, attempt, detail) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![job_id, at, kind.as_str(), attempt, detail])?;
    Ok(())
}

/// `AND queue IN (?n, ...)` for a non-empty list of queues, numbering from `first`.
pub(super) fn queue_filter(queues: &[String], first: usize) -> String {
    if queues.is_empty() {
        return String::new();
    }
    let marks: Vec<String> = (0..queues.len())
        .map(|i| format!("?{}", first + i))
        .collect();
    format!("AND queue IN ({})", marks.join(", "))
}
