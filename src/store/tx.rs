//! What every write of the store shares: the IMMEDIATE transaction, the savepoint that lets
//! one write of a shared transaction fail alone, the event row every transition appends, and
//! the queue filter of claims and reads.

use crate::store::db::{Connection, Dialect, params, sql};

use crate::error::Result;
use crate::job::EventKind;

/// Runs `f` in one IMMEDIATE transaction, rolled back when `f` fails. A full disk or
/// database is reported as [`Error::Full`](crate::Error::Full).
pub(crate) fn transaction<T>(
    conn: &Connection,
    f: &mut impl FnMut(&Connection) -> Result<T>,
) -> Result<T> {
    transaction_inner(conn, f).map_err(crate::Error::full_if_so)
}

fn transaction_inner<T>(
    conn: &Connection,
    f: &mut impl FnMut(&Connection) -> Result<T>,
) -> Result<T> {
    conn.begin()?;
    let result = f(conn).and_then(|v| {
        conn.command("COMMIT")?;
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
///
/// The inner result is `f`'s, its failure undone alone. The outer error fails the whole
/// transaction, which the caller must roll back (and may run again whole): a full disk
/// (SQLite may have rolled back the transaction already), a busy or lost connection
/// ([`Error::is_busy`](crate::Error::is_busy): on PostgreSQL a lost connection took the
/// transaction with it), or the savepoint's own statements failing.
pub(crate) fn savepoint<T>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> Result<T>,
) -> Result<Result<T>> {
    // Cached on SQLite: these run for every write, and parsing them each time shows.
    let exec = |sql: &str| conn.command(sql);
    exec("SAVEPOINT op")?;
    match f(conn) {
        Ok(v) => {
            exec("RELEASE op")?;
            Ok(Ok(v))
        }
        Err(e) if e.is_full() || e.is_busy() => Err(e),
        Err(e) => {
            exec("ROLLBACK TO op")?;
            exec("RELEASE op")?;
            Ok(Err(e))
        }
    }
}

/// What SQLite's IMMEDIATE transaction gives every write and PostgreSQL does not: that nothing
/// else writes between this transaction's read and its write. On PostgreSQL a read that a
/// write depends on takes a lock instead; these say which. Nothing on SQLite, whose one
/// writer at a time already is that lock.
#[derive(Debug, Clone, Copy)]
pub(super) enum Serialise<'a> {
    /// A schedule's row, while its due slots are fired: two runners firing at once fire
    /// each slot once, the second after the first has moved the schedule on.
    Schedule(&'a str),
    /// A job's row, while a job is made to run after it: its ending waits for the new
    /// dependent to commit, so it releases it (or the new job sees it ended).
    Job(i64),
    /// A unique key, while it is checked and a job of it inserted: a transaction-level
    /// advisory lock on the key's hash, as a window cannot be a unique index.
    UniqueKey(&'a str),
    /// The rows of the queues with a limit, while a claim counts their running jobs against
    /// it: claims of limited queues take turns, so that a limit of 1 holds across runners.
    /// (Locked in name order: two claims never wait for each other in a circle.)
    LimitedQueues,
}

/// Takes the lock that `what` needs on PostgreSQL, held until this transaction ends.
pub(super) fn serialise(conn: &Connection, what: Serialise<'_>) -> Result<()> {
    if conn.dialect() == Dialect::Sqlite {
        return Ok(());
    }
    match what {
        Serialise::Schedule(name) => {
            conn.prepare_cached(
                sql!(postgres: "SELECT 1 FROM schedules WHERE name = ?1 FOR UPDATE"),
            )?
            .query(params![name])?
            .next()?;
        }
        Serialise::Job(id) => {
            conn.prepare_cached(sql!(postgres: "SELECT 1 FROM jobs WHERE id = ?1 FOR SHARE"))?
                .query(params![id])?
                .next()?;
        }
        Serialise::UniqueKey(key) => {
            // The two-key form, in a key space of its own (the bytes of `uniq`).
            conn.execute(
                sql!(postgres: "SELECT pg_advisory_xact_lock(1970170225, hashtext(?1))"),
                params![key],
            )?;
        }
        Serialise::LimitedQueues => {
            let mut stmt = conn.prepare_cached(
                sql!(postgres: "SELECT name FROM queues WHERE max_running IS NOT NULL ORDER BY name FOR UPDATE"),
            )?;
            let mut rows = stmt.query(params![])?;
            while rows.next()?.is_some() {}
        }
    }
    Ok(())
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
    conn.prepare_cached(sql!(
        "INSERT INTO job_events (job_id, at, kind, attempt, detail) VALUES (?1, ?2, ?3, ?4, ?5)"
    ))?
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

#[cfg(test)]
pub(crate) mod tests {
    use crate::error::Error;
    use crate::job::Job;
    use crate::store::Store;
    use crate::store::db::params;

    /// Caps this connection's file at its present size (`PRAGMA max_page_count`), so that a
    /// write needing a new page fails as on a full disk; returns the cap.
    pub(crate) fn cap(store: &Store) -> i64 {
        let pages: i64 = store
            .conn()
            .query_row("PRAGMA page_count", params![], |r| r.get(0))
            .expect("page_count");
        store
            .conn()
            .query_row(
                &format!("PRAGMA max_page_count = {pages}"),
                params![],
                |r| r.get(0),
            )
            .expect("max_page_count")
    }

    #[test]
    fn a_full_database_refuses_an_enqueue_and_keeps_nothing_of_it() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let store = Store::open(dir.path().join("jobs.db")).expect("open");
        let first = store.enqueue_at(&Job::shell("true"), 1).expect("enqueue");
        cap(&store);
        let big = Job::shell(format!("echo {}", "x".repeat(20_000)));
        let batch: Vec<Job> = (0..50).map(|_| big.clone()).collect();

        let e = store
            .enqueue_many_at(&batch, 2)
            .expect_err("the batch needs new pages");
        assert!(matches!(e, Error::Full(_)), "{e:?}");
        assert!(e.is_full());
        assert_eq!(e.to_string(), "database or disk is full");
        let e = store
            .enqueue_at(&big, 2)
            .expect_err("the job needs new pages");
        assert!(e.is_full(), "{e:?}");

        // Nothing half-written: only the first job and its one event.
        let counts = store.counts().expect("counts");
        assert_eq!(counts.pending, 1, "{counts:?}");
        let events: i64 = store
            .conn()
            .query_row("SELECT count(*) FROM job_events", params![], |r| r.get(0))
            .expect("events");
        assert_eq!(events, 1);

        // Space back: the same writes succeed.
        store
            .conn()
            .query_row("PRAGMA max_page_count = 1073741823", params![], |r| {
                r.get::<_, i64>(0)
            })
            .expect("uncap");
        let ids = store
            .enqueue_many_at(&batch, 3)
            .expect("enqueue once there is room");
        assert_eq!(ids.len(), 50);
        assert_eq!(ids[0], first + 1);
    }
}
