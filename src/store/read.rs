//! Reads: jobs, their history and output, and the counters `status` reports.

use crate::store::db::{
    Connection, Dialect, OptionalExtension, Sql, params, params_from_iter, sql,
};

use crate::error::{Error, Result};
use crate::job::{Event, EventKind, JobRecord, Output, Status};

use super::Store;
use super::row::{JOB_COLUMNS, PG_JOB_COLUMNS, event_row, job_row};
use super::tx::queue_filter;

/// Filters for [`Store::list`](crate::Store::list).
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// Only jobs in this status.
    pub status: Option<Status>,
    /// Only jobs of this queue.
    pub queue: Option<String>,
    /// Only failed jobs that exhausted this recovery budget (the runbook's `--failed-stale`).
    pub failed_stale: Option<u32>,
    /// Only jobs with an id below this one. Jobs are listed newest first, so passing the last
    /// id of a page lists the next page (keyset pagination: each page reads only its own
    /// rows from an index, however deep it is). Ignored with `failed_stale`, whose order is
    /// not by id.
    pub before: Option<i64>,
    /// At most this many.
    pub limit: Option<u64>,
}

/// The runbook's definition of a job that exhausted the recovery budget.
const FAILED_STALE_WHERE: &str = "status = 'failed' AND recovery_count > ?max
    AND (lower(coalesce(last_error, '')) LIKE 'lease expired after missing heartbeat;%'
         OR lower(coalesce(last_error, '')) LIKE 'lease metadata missing for running job;%')";

/// The read of one job by id (`?1`).
fn job_sql() -> Sql {
    Sql::built(
        format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1"),
        format!("SELECT {PG_JOB_COLUMNS} FROM jobs WHERE id = ?1"),
    )
}

pub(super) fn job(conn: &Connection, id: i64) -> Result<JobRecord> {
    conn.prepare_cached(&job_sql())?
        .query_row([id], job_row)
        .optional()?
        .ok_or(Error::NoSuchJob(id))
}

pub(super) fn list(conn: &Connection, filter: &ListFilter) -> Result<Vec<JobRecord>> {
    let (sql, values) = list_sql(conn, filter)?;
    query_jobs(conn, &sql, values)
}

/// The statement [`list`] runs for `filter`, and its values.
pub(super) fn list_sql(
    conn: &Connection,
    filter: &ListFilter,
) -> Result<(Sql, Vec<crate::store::db::Value>)> {
    // The failed-stale rows are found from their partial index: the planner would otherwise
    // take `jobs_status` and read every failed row. (SQLite's hints; PostgreSQL has none.)
    let from = if filter.failed_stale.is_some() {
        "jobs INDEXED BY jobs_failed_recovery"
    } else {
        match (filter.status, &filter.queue) {
            (Some(status), Some(queue)) => both_filters_index(conn, status, queue)?,
            _ => "jobs",
        }
    };
    Ok(list_text(filter, from))
}

/// The statement [`list`] runs for `filter`, reading `from` (`jobs`, with SQLite's index hint),
/// and its values.
fn list_text(filter: &ListFilter, from: &str) -> (Sql, Vec<crate::store::db::Value>) {
    let (mut sql, mut values) = select_jobs(filter);
    if let Some(max) = filter.failed_stale {
        values.push(i64::from(max).into());
        sql.push_str(&format!(
            " AND {}",
            FAILED_STALE_WHERE.replace("?max", &format!("?{}", values.len()))
        ));
        sql.push_str(" ORDER BY completed_at DESC NULLS LAST, created_at DESC, id DESC");
    } else {
        if let Some(before) = filter.before {
            values.push(before.into());
            sql.push_str(&format!(" AND id < ?{}", values.len()));
        }
        // Newest first: the rowid backwards, or `jobs_status` (status, id) or `jobs_queue`
        // (queue, id) backwards from `before`.
        sql.push_str(" ORDER BY id DESC");
    }
    if let Some(limit) = filter.limit {
        values.push((limit.min(i64::MAX as u64) as i64).into());
        sql.push_str(&format!(" LIMIT ?{}", values.len()));
    }
    let sql = Sql::built(
        format!("SELECT {JOB_COLUMNS} FROM {from} {sql}"),
        format!("SELECT {PG_JOB_COLUMNS} FROM jobs {sql}"),
    );
    (sql, values)
}

/// The index a list by both status and queue walks, newest first, skipping the rows of the
/// other filter: the one with fewer rows to skip at worst, by the kept counts (a few rows of
/// `job_counts`). Left to itself, the planner (without statistics) takes `jobs_queue` and
/// would read every job of a large queue to find its few failed ones.
fn both_filters_index(conn: &Connection, status: Status, queue: &str) -> Result<&'static str> {
    let (by_status, by_queue): (i64, i64) = conn
        .prepare_cached(sql!(
            "SELECT coalesce(sum(n) FILTER (WHERE status = ?1), 0),
                    coalesce(sum(n) FILTER (WHERE queue = ?2), 0)
             FROM job_counts"
        ))?
        .query_row(params![status.as_str(), queue], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
    Ok(if conn.dialect() != Dialect::Sqlite {
        "jobs"
    } else if by_status < by_queue {
        "jobs INDEXED BY jobs_status"
    } else {
        "jobs INDEXED BY jobs_queue"
    })
}

/// The `WHERE` of a read of jobs with `filter`'s status and queue, and the values bound so far:
/// the callers add their order, their limits and their values after them.
fn select_jobs(filter: &ListFilter) -> (String, Vec<crate::store::db::Value>) {
    let mut sql = "WHERE 1 = 1".to_owned();
    let mut values: Vec<crate::store::db::Value> = Vec::new();
    if let Some(s) = filter.status {
        values.push(s.as_str().to_string().into());
        sql.push_str(&format!(" AND status = ?{}", values.len()));
    }
    if let Some(q) = &filter.queue {
        values.push(q.clone().into());
        sql.push_str(&format!(" AND queue = ?{}", values.len()));
    }
    (sql, values)
}

/// The jobs that `sql`, with `values` bound, selects.
fn query_jobs(
    conn: &Connection,
    sql: &Sql,
    values: Vec<crate::store::db::Value>,
) -> Result<Vec<JobRecord>> {
    let mut stmt = conn.prepare(sql)?;
    let rows = stmt.query_map(params_from_iter(values), job_row)?;
    rows.collect::<Result<_>>()
}

/// Job `id`'s history, oldest first. A row with a `start_detail` (an ending committed with its
/// attempt's start) reads as two events: the `started` it records, then its own.
pub(super) fn events(conn: &Connection, id: i64) -> Result<Vec<Event>> {
    let mut stmt = conn.prepare_cached(sql!(
        "SELECT id, job_id, at, kind, attempt, detail, start_detail FROM job_events
             WHERE job_id = ?1 ORDER BY id"
    ))?;
    let mut rows = stmt.query([id])?;
    let mut events = Vec::new();
    while let Some(row) = rows.next()? {
        let event = event_row(&row)?;
        if let Some(detail) = row.get::<_, Option<String>>(6)? {
            // Its id is the ending's: the row that holds them both.
            events.push(Event {
                kind: EventKind::Started,
                detail: Some(detail),
                ..event.clone()
            });
        }
        events.push(event);
    }
    Ok(events)
}

pub(super) fn endings_after(conn: &Connection, after_id: i64, limit: u64) -> Result<Vec<Event>> {
    let mut stmt = conn.prepare_cached(sql!(
        sqlite: "SELECT id, job_id, at, kind, attempt, detail FROM job_events
             WHERE id > ?1 AND kind IN ('succeeded', 'failed', 'lost', 'cancelled')
             ORDER BY id LIMIT (SELECT ?2)",
        postgres: "SELECT id, job_id, at, kind, attempt, detail FROM job_events
             WHERE id > ?1 AND kind IN ('succeeded', 'failed', 'lost', 'cancelled')
             ORDER BY id LIMIT ?2",
    ))?;
    let rows = stmt.query_map(params![after_id, limit as i64], event_row)?;
    rows.collect::<Result<_>>()
}

pub(super) fn last_event_id(conn: &Connection) -> Result<i64> {
    conn.query_row(
        sql!("SELECT coalesce(max(id), 0) FROM job_events"),
        params![],
        |r| r.get(0),
    )
}

pub(super) fn output(conn: &Connection, id: i64, attempt: Option<i64>) -> Result<Option<Output>> {
    let mut stmt = conn.prepare_cached(sql!(
        "SELECT attempt, stdout, stderr, stdout_truncated, stderr_truncated
             FROM job_output WHERE job_id = ?1 AND (?2 IS NULL OR attempt = ?2)
             ORDER BY id DESC LIMIT 1"
    ))?;
    stmt.query_row(params![id, attempt], |r| {
        Ok(Output {
            attempt: r.get(0)?,
            stdout: r.get(1)?,
            stderr: r.get(2)?,
            stdout_truncated: r.get(3)?,
            stderr_truncated: r.get(4)?,
        })
    })
    .optional()
}

pub(super) fn counts(conn: &Connection) -> Result<Counts> {
    let mut counts = Counts::default();
    // job_counts is kept by enqueues and by triggers on every UPDATE and DELETE: a few rows,
    // where counting the table by status reads every job (68-98 ms on 1,000,000).
    let mut stmt = conn.prepare_cached(sql!(
        "SELECT status, sum(n) FROM job_counts GROUP BY status"
    ))?;
    let mut rows = stmt.query(params![])?;
    while let Some(row) = rows.next()? {
        let status: String = row.get(0)?;
        let n = row.get::<_, i64>(1)? as u64;
        match status.parse::<Status>()? {
            Status::Pending => counts.pending = n,
            Status::Running => counts.running = n,
            Status::Succeeded => counts.succeeded = n,
            Status::Failed => counts.failed = n,
            Status::Cancelled => counts.cancelled = n,
        }
    }
    Ok(counts)
}

pub(super) fn lease_counts(
    conn: &Connection,
    max_recovery_attempts: u32,
    now: i64,
) -> Result<LeaseCounts> {
    let now = conn.now(now)?;
    let (running, stale_running, running_without_lease) = conn.query_row(
        sql!(
            "SELECT count(*),
                    count(CASE WHEN lease_expires_at IS NOT NULL AND lease_expires_at < ?1
                               THEN 1 END),
                    count(CASE WHEN run_token IS NULL OR worker_id IS NULL
                                    OR lease_expires_at IS NULL THEN 1 END)
             FROM jobs WHERE status = 'running'"
        ),
        [now],
        |r| {
            Ok((
                r.get::<_, i64>(0)? as u64,
                r.get::<_, i64>(1)? as u64,
                r.get::<_, i64>(2)? as u64,
            ))
        },
    )?;
    let recovery_exhausted_failed = conn.query_row(
        &recovery_exhausted_sql(),
        [i64::from(max_recovery_attempts)],
        |r| r.get::<_, i64>(0),
    )?;
    Ok(LeaseCounts {
        running,
        stale_running,
        running_without_lease,
        recovery_exhausted_failed: recovery_exhausted_failed as u64,
    })
}

/// The count of failed jobs that exhausted the recovery budget (`?1`).
fn recovery_exhausted_sql() -> Sql {
    let stale = FAILED_STALE_WHERE.replace("?max", "?1");
    Sql::built(
        format!("SELECT count(*) FROM jobs INDEXED BY jobs_failed_recovery WHERE {stale}"),
        format!("SELECT count(*) FROM jobs WHERE {stale}"),
    )
}

/// Whether `queues` (all when empty, or from `?1`) have a pending or running job.
fn has_unfinished_sql(queues: &[String]) -> Sql {
    let text = format!(
        "SELECT EXISTS (SELECT 1 FROM jobs WHERE status IN ('pending', 'running') {})",
        queue_filter(queues, 1)
    );
    Sql::built(text.clone(), text)
}

pub(super) fn has_unfinished(conn: &Connection, queues: &[String]) -> Result<bool> {
    // Cached: a caller waiting for a runner to finish asks this in a loop.
    conn.prepare_cached(&has_unfinished_sql(queues))?
        .query_row(params_from_iter(queues.iter()), |r| r.get(0))
}

/// How many jobs are in each status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Counts {
    /// Waiting to run.
    pub pending: u64,
    /// Being run.
    pub running: u64,
    /// Exited 0.
    pub succeeded: u64,
    /// Failed for good.
    pub failed: u64,
    /// Cancelled.
    pub cancelled: u64,
}

/// The runbook's lease counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseCounts {
    /// Running jobs.
    pub running: u64,
    /// Running jobs whose lease has expired.
    pub stale_running: u64,
    /// Running jobs missing run_token, worker_id or lease_expires_at.
    pub running_without_lease: u64,
    /// Failed jobs that exhausted the recovery budget.
    pub recovery_exhausted_failed: u64,
}

/// The statements of this file that are `const` items or built at run time (with
/// representative inputs), for the test that prepares every statement (`store/statements.rs`).
#[cfg(test)]
pub(super) fn statements() -> Vec<(&'static str, Sql)> {
    let queues = ["a".to_owned(), "b".to_owned()];
    let every = ListFilter {
        status: Some(Status::Failed),
        queue: Some("a".to_owned()),
        failed_stale: None,
        before: Some(10),
        limit: Some(5),
    };
    let stale = ListFilter {
        failed_stale: Some(3),
        ..every.clone()
    };
    vec![
        ("job_sql()", job_sql()),
        ("recovery_exhausted_sql()", recovery_exhausted_sql()),
        ("has_unfinished_sql(all queues)", has_unfinished_sql(&[])),
        (
            "has_unfinished_sql(two queues)",
            has_unfinished_sql(&queues),
        ),
        (
            "list_text(every filter)",
            list_text(&every, "jobs INDEXED BY jobs_status").0,
        ),
        (
            "list_text(failed stale)",
            list_text(&stale, "jobs INDEXED BY jobs_failed_recovery").0,
        ),
    ]
}

impl Store {
    /// One job.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchJob`].
    pub fn job(&self, id: i64) -> Result<JobRecord> {
        job(&self.conn, id)
    }

    /// Jobs matching `filter`, newest first.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn list(&self, filter: &ListFilter) -> Result<Vec<JobRecord>> {
        list(&self.conn, filter)
    }

    /// A job's history, oldest first.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn events(&self, id: i64) -> Result<Vec<Event>> {
        events(&self.conn, id)
    }

    /// Events after `after_id` whose kind ends a job (succeeded, failed, lost, cancelled),
    /// oldest first, at most `limit`.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn endings_after(&self, after_id: i64, limit: u64) -> Result<Vec<Event>> {
        endings_after(&self.conn, after_id, limit)
    }

    /// The id of the newest event, or 0.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn last_event_id(&self) -> Result<i64> {
        last_event_id(&self.conn)
    }

    /// The captured output of one attempt of a job, or of its latest attempt.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn output(&self, id: i64, attempt: Option<i64>) -> Result<Option<Output>> {
        output(&self.conn, id, attempt)
    }

    /// How many jobs are in each status.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn counts(&self) -> Result<Counts> {
        counts(&self.conn)
    }

    /// The runbook's lease counters at `now`.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn lease_counts(&self, max_recovery_attempts: u32, now: i64) -> Result<LeaseCounts> {
        lease_counts(&self.conn, max_recovery_attempts, now)
    }

    /// Whether any job of `queues` (all queues when empty) is pending (due or not) or running.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn has_unfinished(&self, queues: &[String]) -> Result<bool> {
        has_unfinished(&self.conn, queues)
    }
}
