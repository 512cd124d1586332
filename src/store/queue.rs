//! Queues: the limits and pauses stored in the file, which every claim on it respects, and
//! what `queues ls` shows of each queue.

use crate::store::db::{Connection, Sql, params, sql};

use super::Store;
use crate::error::{Error, Result};

/// A queue's settings as a claim reads them: only queues with a limit or a pause have one.
#[derive(Debug, Clone)]
pub(super) struct Rule {
    pub name: String,
    pub max_running: Option<i64>,
    pub paused: bool,
    /// Its running jobs over every runner, counted for a limited queue only.
    pub running: i64,
}

/// The queues whose jobs a claim must count or skip, with the running jobs of the limited
/// ones: a small table, read in every claim, in one statement.
pub(super) fn rules(conn: &Connection) -> Result<Vec<Rule>> {
    let mut stmt = conn.prepare_cached(sql!(
        "SELECT name, max_running, paused,
                CASE WHEN max_running IS NOT NULL AND paused = 0 THEN
                    (SELECT count(*) FROM jobs WHERE status = 'running' AND queue = queues.name)
                ELSE 0 END
         FROM queues WHERE paused != 0 OR max_running IS NOT NULL"
    ))?;
    let rows = stmt.query_map(params![], |r| {
        Ok(Rule {
            name: r.get(0)?,
            max_running: r.get(1)?,
            paused: r.get(2)?,
            running: r.get(3)?,
        })
    })?;
    rows.collect::<Result<_>>()
}

/// The queues that have a ready job (not waiting, not marked for teardown), in one
/// statement: a skip through the claim index, one step per queue, whatever the number of
/// jobs.
pub(super) const READY_QUEUES_SQL: Sql = Sql::new(
    concat!(
        "WITH RECURSIVE q(name) AS (
         SELECT (SELECT queue FROM jobs INDEXED BY jobs_claim_queue
                 WHERE ",
        in_claim_index!(),
        "
                 ORDER BY queue LIMIT 1)
         UNION ALL
         SELECT (SELECT queue FROM jobs INDEXED BY jobs_claim_queue
                 WHERE ",
        in_claim_index!(),
        "
                   AND queue > q.name
                 ORDER BY queue LIMIT 1)
         FROM q WHERE q.name IS NOT NULL)
     SELECT name FROM q WHERE name IS NOT NULL"
    ),
    concat!(
        "WITH RECURSIVE q(name) AS (
         SELECT (SELECT queue FROM jobs
                 WHERE ",
        in_claim_index!(),
        "
                 ORDER BY queue LIMIT 1)
         UNION ALL
         SELECT (SELECT queue FROM jobs
                 WHERE ",
        in_claim_index!(),
        "
                   AND queue > q.name
                 ORDER BY queue LIMIT 1)
         FROM q WHERE q.name IS NOT NULL)
     SELECT name FROM q WHERE name IS NOT NULL"
    ),
);

pub(super) fn ready_queues(conn: &Connection) -> Result<Vec<String>> {
    let mut stmt = conn.prepare_cached(&READY_QUEUES_SQL)?;
    let rows = stmt.query_map(params![], |r| r.get(0))?;
    rows.collect::<Result<_>>()
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::invalid("queue", "the queue name is empty"));
    }
    Ok(())
}

/// Sets (or with `None` removes) the limit of `name`.
pub(super) fn set_limit(conn: &Connection, name: &str, limit: Option<u32>) -> Result<()> {
    check_name(name)?;
    conn.prepare_cached(sql!(
        "INSERT INTO queues (name, max_running) VALUES (?1, ?2)
         ON CONFLICT (name) DO UPDATE SET max_running = excluded.max_running"
    ))?
    .execute(params![name, limit])?;
    forget_if_plain(conn, name)
}

/// Pauses or resumes `name`.
pub(super) fn set_paused(conn: &Connection, name: &str, paused: bool) -> Result<()> {
    check_name(name)?;
    conn.prepare_cached(sql!(
        "INSERT INTO queues (name, paused) VALUES (?1, ?2)
         ON CONFLICT (name) DO UPDATE SET paused = excluded.paused"
    ))?
    .execute(params![name, paused])?;
    forget_if_plain(conn, name)
}

/// A queue without a limit or a pause needs no row.
fn forget_if_plain(conn: &Connection, name: &str) -> Result<()> {
    conn.prepare_cached(sql!(
        "DELETE FROM queues WHERE name = ?1 AND max_running IS NULL AND paused = 0"
    ))?
    .execute([name])?;
    Ok(())
}

/// A queue as [`Store::queues`](crate::Store::queues) shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueInfo {
    /// The queue's name.
    pub name: String,
    /// Its pending jobs, those waiting for dependencies or a later time included.
    pub pending: u64,
    /// Of those, the jobs waiting for dependencies.
    pub waiting: u64,
    /// Its running jobs, over every runner.
    pub running: u64,
    /// Its succeeded jobs still in the file (pruning removes finished jobs).
    pub succeeded: u64,
    /// Its failed jobs still in the file.
    pub failed: u64,
    /// Its cancelled jobs still in the file.
    pub cancelled: u64,
    /// At most this many of its jobs run at once over every runner; `None`: no limit.
    pub limit: Option<u32>,
    /// Whether its jobs are left unclaimed.
    pub paused: bool,
    /// How long its oldest ready job (due, not waiting) has been ready, in milliseconds.
    pub oldest_ready_ms: Option<i64>,
}

/// Every queue that has an unfinished job or a setting (or, with `?2` true, any job at all),
/// by name. Parameters: now, all.
///
/// Cheap on a big file: the names and the counts by status come from `job_counts` (a few
/// rows, kept in the transaction of every change); the waiting jobs are found from
/// `job_deps` (only jobs that have dependencies can wait), and the oldest ready job is the
/// head of `jobs_pending_due`. Nothing here reads a queue's pending jobs (the CROSS JOIN
/// keeps the planner from reading every pending job to find the waiting ones).
pub(super) const LIST_SQL: Sql = Sql::new(
    concat!(
        "WITH counts AS (
         SELECT queue AS name,
                coalesce(sum(n) FILTER (WHERE status = 'pending'), 0) AS pending,
                coalesce(sum(n) FILTER (WHERE status = 'running'), 0) AS running,
                coalesce(sum(n) FILTER (WHERE status = 'succeeded'), 0) AS succeeded,
                coalesce(sum(n) FILTER (WHERE status = 'failed'), 0) AS failed,
                coalesce(sum(n) FILTER (WHERE status = 'cancelled'), 0) AS cancelled,
                sum(n) AS total
         FROM job_counts GROUP BY queue),
     waits AS (
         SELECT jobs.queue AS name, count(*) AS waiting
         FROM (SELECT DISTINCT job_id FROM job_deps) d CROSS JOIN jobs ON jobs.id = d.job_id
         WHERE jobs.status = 'pending' AND jobs.waiting > 0
         GROUP BY jobs.queue),
     names AS (SELECT name FROM counts WHERE pending + running > 0 OR (?2 != 0 AND total > 0)
               UNION SELECT name FROM queues)
     SELECT n.name, coalesce(c.pending, 0), coalesce(w.waiting, 0), coalesce(c.running, 0),
            q.max_running, coalesce(q.paused, 0),
            coalesce(c.succeeded, 0), coalesce(c.failed, 0), coalesce(c.cancelled, 0),
            (SELECT min(scheduled_at) FROM jobs INDEXED BY jobs_pending_due
                 WHERE queue = n.name AND ",
        ready_to_claim!(),
        " AND scheduled_at <= ?1)
     FROM names n
         LEFT JOIN counts c ON c.name = n.name
         LEFT JOIN waits w ON w.name = n.name
         LEFT JOIN queues q ON q.name = n.name
     ORDER BY n.name"
    ),
    concat!(
        "WITH counts AS (
         SELECT queue AS name,
                coalesce(sum(n) FILTER (WHERE status = 'pending'), 0) AS pending,
                coalesce(sum(n) FILTER (WHERE status = 'running'), 0) AS running,
                coalesce(sum(n) FILTER (WHERE status = 'succeeded'), 0) AS succeeded,
                coalesce(sum(n) FILTER (WHERE status = 'failed'), 0) AS failed,
                coalesce(sum(n) FILTER (WHERE status = 'cancelled'), 0) AS cancelled,
                sum(n) AS total
         FROM job_counts GROUP BY queue),
     waits AS (
         SELECT jobs.queue AS name, count(*) AS waiting
         FROM (SELECT DISTINCT job_id FROM job_deps) d JOIN jobs ON jobs.id = d.job_id
         WHERE jobs.status = 'pending' AND jobs.waiting > 0
         GROUP BY jobs.queue),
     names AS (SELECT name FROM counts WHERE pending + running > 0 OR (?2 != 0 AND total > 0)
               UNION SELECT name FROM queues)
     SELECT n.name, coalesce(c.pending, 0), coalesce(w.waiting, 0), coalesce(c.running, 0),
            q.max_running, coalesce(q.paused, 0),
            coalesce(c.succeeded, 0), coalesce(c.failed, 0), coalesce(c.cancelled, 0),
            (SELECT min(scheduled_at) FROM jobs
                 WHERE queue = n.name AND ",
        ready_to_claim!(),
        " AND scheduled_at <= ?1)
     FROM names n
         LEFT JOIN counts c ON c.name = n.name
         LEFT JOIN waits w ON w.name = n.name
         LEFT JOIN queues q ON q.name = n.name
     ORDER BY n.name"
    ),
);

/// The queues of [`LIST_SQL`]: with `all`, every queue that has any job too.
pub(super) fn list(conn: &Connection, now: i64, all: bool) -> Result<Vec<QueueInfo>> {
    let now = conn.now(now)?;
    let mut stmt = conn.prepare_cached(&LIST_SQL)?;
    let rows = stmt.query_map(params![now, all], |r| {
        Ok(QueueInfo {
            name: r.get(0)?,
            pending: r.get::<_, i64>(1)? as u64,
            waiting: r.get::<_, i64>(2)? as u64,
            running: r.get::<_, i64>(3)? as u64,
            limit: r
                .get::<_, Option<i64>>(4)?
                .map(|l| u32::try_from(l).unwrap_or(u32::MAX)),
            paused: r.get(5)?,
            succeeded: r.get::<_, i64>(6)?.max(0) as u64,
            failed: r.get::<_, i64>(7)?.max(0) as u64,
            cancelled: r.get::<_, i64>(8)?.max(0) as u64,
            oldest_ready_ms: r.get::<_, Option<i64>>(9)?.map(|t| now.saturating_sub(t)),
        })
    })?;
    rows.collect::<Result<_>>()
}

/// The statements of this file that are `const` items or built at run time (with
/// representative inputs), for the test that prepares every statement (`store/statements.rs`).
#[cfg(test)]
pub(super) fn statements() -> Vec<(&'static str, Sql)> {
    vec![
        ("READY_QUEUES_SQL", READY_QUEUES_SQL),
        ("LIST_SQL", LIST_SQL),
    ]
}

impl Store {
    /// Limits `queue` to `limit` running jobs at once, over every runner and process on this
    /// file; `None` removes the limit. A claim counts the queue's running jobs and takes new
    /// ones in one transaction, so runners never exceed the limit together. Lowering a limit
    /// stops nothing that runs: new claims wait until the queue is under it.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] for an empty name, [`Error::Sqlite`] when the database cannot be
    /// written.
    pub fn set_queue_limit(&self, queue: &str, limit: Option<u32>) -> Result<()> {
        self.write(|c| set_limit(c, queue, limit))?;
        // A raised or removed limit can make jobs claimable.
        self.poke();
        Ok(())
    }

    /// Pauses `queue` for every runner on this file: its pending jobs are not claimed until
    /// [`Store::resume_queue`]; its running jobs finish normally.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] for an empty name, [`Error::Sqlite`] when the database cannot be
    /// written.
    pub fn pause_queue(&self, queue: &str) -> Result<()> {
        self.write(|c| set_paused(c, queue, true))
    }

    /// Resumes a paused `queue`; resuming one that is not paused does nothing.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] for an empty name, [`Error::Sqlite`] when the database cannot be
    /// written.
    pub fn resume_queue(&self, queue: &str) -> Result<()> {
        self.write(|c| set_paused(c, queue, false))?;
        self.poke();
        Ok(())
    }

    /// Every queue that has an unfinished job, a limit or a pause, by name, with its counts at
    /// the store's clock.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn queues(&self) -> Result<Vec<QueueInfo>> {
        list(&self.conn, self.now(), false)
    }

    /// Every queue that has any job (finished ones included), a limit or a pause, by name,
    /// with its counts at the store's clock: what the dashboard's overview lists. As cheap as
    /// [`queues`](Store::queues): the counts come from the counters the transitions keep.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn all_queues(&self) -> Result<Vec<QueueInfo>> {
        list(&self.conn, self.now(), true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Store;

    fn plan(conn: &Connection, sql: &str) -> String {
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let mut rows = stmt.query([0i64, 1]).unwrap();
        let mut lines = Vec::new();
        while let Some(row) = rows.next().unwrap() {
            lines.push(row.get::<_, String>(3).unwrap());
        }
        lines.join("\n")
    }

    #[test]
    fn the_queue_list_reads_counters_and_index_heads_not_pending_jobs() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("jobs.db")).unwrap();
        let p = plan(store.conn(), LIST_SQL.sqlite());
        // `jobs` is read only by primary key (a job that has dependencies) or through the
        // head of `jobs_pending_due`: never scanned, nor through `jobs_status`.
        for line in p
            .lines()
            .filter(|l| l.contains(" jobs ") || l.ends_with(" jobs"))
        {
            assert!(
                line.contains("INTEGER PRIMARY KEY")
                    || line.contains("INDEX jobs_pending_due (queue=? AND scheduled_at<?)"),
                "{line} in {p}"
            );
        }
        assert!(p.contains("job_counts"), "{p}");
        assert!(!p.contains("jobs_status"), "{p}");
    }
}
