//! The recent failures: the newest failed and lost attempts, each with its job's command and
//! queue, how it failed and the last line of its stderr, as the dashboard's overview lists
//! them.

#[cfg(doc)]
use crate::error::Error;
use crate::store::db::{Connection, LossyText, Sql};

use crate::error::Result;
use crate::job::{ErrorKind, EventKind};

use super::Store;
use super::row::json_column;

/// The event kinds that end an attempt in a failure or a loss, as `job_events_failures`
/// (migration 11) indexes them: a statement that repeats this predicate reads that index.
macro_rules! failure_kinds {
    () => {
        "(kind = 'failed' OR kind = 'retry_scheduled' OR kind = 'lost' OR kind = 'reclaimed')"
    };
}

/// The newest failure events with their jobs: the tail of `job_events_failures`, and one
/// lookup by primary key per event. Parameter: how many.
pub(super) const RECENT_SQL: Sql = Sql::new(
    concat!(
        "SELECT e.job_id, e.at, e.kind, e.attempt, e.detail, j.queue, j.argv, j.attempt,
            j.error_kind,
            (SELECT CAST(substr(o.stderr, -1024) AS TEXT) FROM job_output o
             WHERE o.job_id = e.job_id AND o.attempt = e.attempt ORDER BY o.id DESC LIMIT 1)
     FROM job_events e INDEXED BY job_events_failures JOIN jobs j ON j.id = e.job_id
     WHERE ",
        failure_kinds!(),
        "
     ORDER BY e.id DESC LIMIT (SELECT ?1)"
    ),
    concat!(
        "SELECT e.job_id, e.at, e.kind, e.attempt, e.detail, j.queue, j.argv, j.attempt,
            j.error_kind,
            (SELECT substring(o.stderr FROM greatest(length(o.stderr) - 1023, 1)) FROM job_output o
             WHERE o.job_id = e.job_id AND o.attempt = e.attempt ORDER BY o.id DESC LIMIT 1)
     FROM job_events e JOIN jobs j ON j.id = e.job_id
     WHERE ",
        failure_kinds!(),
        "
     ORDER BY e.id DESC LIMIT ?1"
    ),
);

/// A failed or lost attempt, as [`Store::recent_failures`](crate::Store::recent_failures)
/// lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecentFailure {
    /// The job.
    pub job_id: i64,
    /// When the attempt ended (the event's time), in milliseconds since the epoch.
    pub at: i64,
    /// What followed: [`EventKind::Failed`] or [`EventKind::RetryScheduled`] for a failure
    /// of the command, [`EventKind::Lost`] or [`EventKind::Reclaimed`] for a loss.
    pub kind: EventKind,
    /// The attempt's number.
    pub attempt: i64,
    /// The event's detail: the failure's message.
    pub detail: Option<String>,
    /// The job's queue.
    pub queue: String,
    /// The job's command.
    pub argv: Vec<String>,
    /// How the attempt failed: `lost` for a loss; for a failure of the command, the job's
    /// `error_kind` when this is its latest attempt (`None` when a later attempt has since
    /// replaced it, as the job stores only the latest).
    pub error_kind: Option<ErrorKind>,
    /// The last non-empty line of the attempt's stderr tail (of its last 1 KiB), if any.
    pub stderr_last_line: Option<String>,
}

pub(super) fn recent(conn: &Connection, limit: u32) -> Result<Vec<RecentFailure>> {
    let mut stmt = conn.prepare_cached(&RECENT_SQL)?;
    let rows = stmt.query_map([limit], |r| {
        let kind: String = r.get(2)?;
        let kind = EventKind::parse(&kind)
            .ok_or_else(|| crate::error::Error::Column(format!("column 2: event kind {kind:?}")))?;
        let attempt: i64 = r.get(3)?;
        let job_attempt: i64 = r.get(7)?;
        let job_kind: Option<String> = r.get(8)?;
        let error_kind = match kind {
            EventKind::Lost | EventKind::Reclaimed => Some(ErrorKind::Lost),
            _ if attempt == job_attempt => job_kind.as_deref().and_then(ErrorKind::parse),
            _ => None,
        };
        // Lossy: the last 1024 bytes may start inside a character.
        let stderr: Option<LossyText> = r.get(9)?;
        Ok(RecentFailure {
            job_id: r.get(0)?,
            at: r.get(1)?,
            kind,
            attempt,
            detail: r.get(4)?,
            queue: r.get(5)?,
            argv: json_column(r, 6)?,
            error_kind,
            stderr_last_line: stderr.and_then(|t| last_line(&t.0)),
        })
    })?;
    rows.collect::<Result<_>>()
}

/// The last line of `text` that is not blank, trimmed.
fn last_line(text: &str) -> Option<String> {
    text.lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(str::to_string)
}

/// The statements of this file that are `const` items or built at run time (with
/// representative inputs), for the test that prepares every statement (`store/statements.rs`).
#[cfg(test)]
pub(super) fn statements() -> Vec<(&'static str, Sql)> {
    vec![("RECENT_SQL", RECENT_SQL)]
}

impl Store {
    /// The newest `limit` failed or lost attempts, newest first: what the dashboard lists as
    /// recent failures. Reads the tail of an index of failure events (schema version 12),
    /// whatever the number of events. Pruning a job removes its failures with it.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn recent_failures(&self, limit: u32) -> Result<Vec<RecentFailure>> {
        recent(&self.conn, limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Store;

    #[test]
    fn recent_failures_read_the_failure_index_and_jobs_by_key() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("jobs.db")).unwrap();
        let mut stmt = store
            .conn()
            .prepare(&format!("EXPLAIN QUERY PLAN {}", RECENT_SQL.sqlite()))
            .unwrap();
        let plan: Vec<String> = stmt
            .query_map([20], |r| r.get(3))
            .unwrap()
            .collect::<Result<_>>()
            .unwrap();
        let plan = plan.join("\n");
        assert!(
            plan.contains("SCAN e USING INDEX job_events_failures"),
            "{plan}"
        );
        assert!(
            plan.contains("SEARCH j USING INTEGER PRIMARY KEY"),
            "{plan}"
        );
        assert!(
            plan.contains("SEARCH o USING INDEX job_output_job (job_id=? AND attempt=?)"),
            "{plan}"
        );
        assert!(!plan.contains("TEMP B-TREE"), "no sort: {plan}");
    }

    #[test]
    fn the_last_line_skips_blank_ones() {
        assert_eq!(last_line("a\nboom\n\n  \n"), Some("boom".to_string()));
        assert_eq!(last_line("\n"), None);
    }
}
