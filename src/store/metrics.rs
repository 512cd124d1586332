//! Reading a metrics snapshot: the durable counters and histograms, the job counts the
//! triggers keep, queue lags, live runners and the file's size. Reads only, in one read
//! transaction: a scrape never takes the write lock, and costs a few index seeks per queue
//! whatever the number of jobs.

#[cfg(doc)]
use crate::error::Error;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::store::db::{Connection, Sql, params, sql};

use crate::error::Result;
use crate::metrics::{Counter, CounterKind, DatabaseSize, Histogram, JobCount, Metrics};

use super::Store;
use super::counter::{BUCKETS_MS, RUN, WAIT};
use super::maintenance;

/// The job counts by queue and status, as the triggers keep them.
pub(super) const JOB_COUNTS_SQL: Sql =
    Sql::same("SELECT queue, status, n FROM job_counts ORDER BY queue, status");

/// Per queue, the `scheduled_at` of its oldest ready pending job (NULL when none; a job
/// waiting for a dependency is not ready): one seek into `jobs_pending_due` per queue.
/// Parameter: now.
pub(super) const QUEUE_LAG_SQL: Sql = Sql::new(
    concat!(
        "SELECT q.queue,
            (SELECT min(scheduled_at) FROM jobs INDEXED BY jobs_pending_due
             WHERE queue = q.queue AND ",
        ready_to_claim!(),
        " AND scheduled_at <= ?1)
     FROM (SELECT DISTINCT queue FROM job_counts) AS q ORDER BY q.queue"
    ),
    concat!(
        "SELECT q.queue,
            (SELECT min(scheduled_at) FROM jobs
             WHERE queue = q.queue AND ",
        ready_to_claim!(),
        " AND scheduled_at <= ?1)
     FROM (SELECT DISTINCT queue FROM job_counts) AS q ORDER BY q.queue"
    ),
);

/// Runners that have not stopped and renewed within their lease TTL. Parameter: now.
pub(super) const RUNNERS_ALIVE_SQL: Sql = Sql::same(
    "SELECT count(*) FROM runners
     WHERE stopped_at IS NULL AND heartbeat_at + lease_ttl_ms >= ?1",
);

pub(super) fn metrics(conn: &Connection, path: &Path, now: i64) -> Result<Metrics> {
    let now = conn.now(now)?;
    // One deferred transaction: one consistent snapshot, read without a write lock (in WAL
    // mode a reader never blocks a writer, nor waits for one).
    conn.snapshot(|conn| {
        let jobs = {
            let mut stmt = conn.prepare_cached(&JOB_COUNTS_SQL)?;
            let rows = stmt.query_map(params![], |r| {
                Ok(JobCount {
                    queue: r.get(0)?,
                    status: r.get(1)?,
                    jobs: count(r.get(2)?),
                })
            })?;
            rows.collect::<Result<Vec<_>>>()?
        };
        let queue_lag = {
            let mut stmt = conn.prepare_cached(&QUEUE_LAG_SQL)?;
            let rows = stmt.query_map([now], |r| {
                let oldest: Option<i64> = r.get(1)?;
                let lag = oldest.map_or(0, |t| now.saturating_sub(t).max(0));
                Ok((r.get::<_, String>(0)?, Duration::from_millis(count(lag))))
            })?;
            rows.collect::<Result<Vec<_>>>()?
        };
        let counters = {
            let mut stmt = conn.prepare_cached(sql!(
                "SELECT name, queue, outcome, value FROM metric_counters
             ORDER BY name, queue, outcome"
            ))?;
            let rows = stmt.query_map(params![], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, i64>(3)?,
                ))
            })?;
            let mut counters = Vec::new();
            for row in rows {
                let (name, queue, outcome, value) = row?;
                // A name this build does not know (none yet) is left out, not an error.
                if let Some(kind) = CounterKind::from_name(&name) {
                    counters.push(Counter {
                        kind,
                        queue,
                        outcome,
                        value: count(value),
                    });
                }
            }
            counters
        };
        let wait = histograms(conn, WAIT)?;
        let run = histograms(conn, RUN)?;
        let runners_alive = count(conn.query_row(&RUNNERS_ALIVE_SQL, [now], |r| r.get(0))?);
        let database = size(conn, path)?;
        let waiting_for_condition = super::runners::waiting_for_conditions(conn)?;
        Ok(Metrics {
            at: now,
            jobs,
            queue_lag,
            counters,
            wait,
            run,
            runners_alive,
            database,
            runner: None,
            waiting_for_condition,
        })
    })
}

/// The database's size: the file's, or the PostgreSQL database's.
pub(super) fn size(conn: &Connection, path: &Path) -> Result<crate::metrics::DatabaseSize> {
    match conn.sqlite() {
        Some(sqlite) => maintenance::size(sqlite, path),
        #[cfg(feature = "postgres")]
        None => super::pg::size(conn, path),
        #[cfg(not(feature = "postgres"))]
        None => Err(crate::Error::SqliteOnly("the database's size")),
    }
}

/// The histograms stored under `name`, their buckets cumulated over every bound.
fn histograms(conn: &Connection, name: &str) -> Result<Vec<Histogram>> {
    let mut stmt = conn.prepare_cached(sql!(
        "SELECT queue, outcome, le_ms, count, sum_ms FROM metric_histograms
         WHERE name = ?1 ORDER BY queue, outcome, le_ms"
    ))?;
    let rows = stmt.query_map([name], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, i64>(2)?,
            r.get::<_, i64>(3)?,
            r.get::<_, i64>(4)?,
        ))
    })?;
    // (queue, outcome) -> (bucket bound -> count, sum in ms)
    type Raw = (BTreeMap<i64, u64>, i64);
    let mut by_labels: BTreeMap<(String, String), Raw> = BTreeMap::new();
    for row in rows {
        let (queue, outcome, le, n, sum) = row?;
        let entry = by_labels.entry((queue, outcome)).or_default();
        *entry.0.entry(le).or_default() += count(n);
        entry.1 = entry.1.saturating_add(sum);
    }
    let mut out = Vec::with_capacity(by_labels.len());
    for ((queue, outcome), (raw, sum_ms)) in by_labels {
        let total: u64 = raw.values().sum();
        let mut buckets = Vec::with_capacity(BUCKETS_MS.len() + 1);
        for bound in BUCKETS_MS {
            // Every stored bound at or below this one (a bound this build does not list
            // falls into the next listed one above it).
            let n = raw.range(..=bound).map(|(_, n)| n).sum();
            buckets.push((bound as f64 / 1000.0, n));
        }
        buckets.push((f64::INFINITY, total));
        out.push(Histogram {
            queue,
            outcome,
            buckets,
            sum: sum_ms as f64 / 1000.0,
            count: total,
        });
    }
    Ok(out)
}

/// A count read from SQLite as a u64 (a negative one, which the schema never writes, is 0).
fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// The statements of this file that are `const` items or built at run time (with
/// representative inputs), for the test that prepares every statement (`store/statements.rs`).
#[cfg(test)]
pub(super) fn statements() -> Vec<(&'static str, Sql)> {
    vec![
        ("JOB_COUNTS_SQL", JOB_COUNTS_SQL),
        ("QUEUE_LAG_SQL", QUEUE_LAG_SQL),
        ("RUNNERS_ALIVE_SQL", RUNNERS_ALIVE_SQL),
    ]
}

impl Store {
    /// The database's size on disk: the main file, its free pages and its WAL.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the file cannot be read, [`Error::Io`] when its size cannot.
    pub fn size(&self) -> Result<DatabaseSize> {
        size(&self.conn, &self.path)
    }

    /// A snapshot of the database's metrics at the store's clock: see [`Store::metrics_at`].
    ///
    /// # Errors
    ///
    /// As [`Store::metrics_at`].
    pub fn metrics(&self) -> Result<Metrics> {
        self.metrics_at(self.now())
    }

    /// A snapshot of the database's metrics at `now` (the time queue lags and runner liveness
    /// are measured against): jobs by queue and status, queue lags, the durable counters and
    /// histograms, live runners, the file's size. Read in one read transaction: it never takes
    /// the write lock, and its cost does not grow with the number of jobs. Render it with
    /// [`Metrics::to_prometheus`].
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read, [`Error::Io`] when the file's size
    /// cannot.
    pub fn metrics_at(&self, now: i64) -> Result<Metrics> {
        metrics(&self.conn, &self.path, now)
    }
}

#[cfg(test)]
mod tests {
    use rusqlite::StatementStatus;

    use super::*;
    use crate::job::Job;
    use crate::store::Store;

    /// The virtual-machine steps of each scrape statement on a file of `jobs` jobs in three
    /// queues, a tenth of them pending and the rest succeeded: a count of work, the same on
    /// any machine.
    fn scrape_steps(jobs: usize) -> Vec<i32> {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("jobs.db")).unwrap();
        let now = 1_700_000_000_000i64;
        let batch: Vec<Job> = (0..jobs)
            .map(|i| Job::shell("true").queue(["a", "b", "c"][i % 3]))
            .collect();
        store.enqueue_many_at(&batch, now).unwrap();
        store
            .conn()
            .execute(
                "UPDATE jobs SET status = 'succeeded', completed_at = ?1 WHERE id % 10 != 0",
                [now],
            )
            .unwrap();
        let m = store.metrics_at(now + 5_000).unwrap();
        assert_eq!(
            m.jobs("a", "pending") + m.jobs("b", "pending") + m.jobs("c", "pending"),
            (jobs / 10) as u64
        );
        assert_eq!(m.queue_lag.len(), 3);
        assert!(
            m.queue_lag.iter().all(|(_, lag)| lag.as_millis() == 5_000),
            "{m:?}"
        );
        [JOB_COUNTS_SQL, QUEUE_LAG_SQL, RUNNERS_ALIVE_SQL]
            .iter()
            .map(|sql| {
                let mut stmt = store.conn().prepare(sql).unwrap();
                let n = stmt.sqlite().unwrap().parameter_count();
                let mut rows = if n == 0 {
                    stmt.query(params![]).unwrap()
                } else {
                    stmt.query([now]).unwrap()
                };
                while rows.next().unwrap().is_some() {}
                drop(rows);
                stmt.sqlite().unwrap().get_status(StatementStatus::VmStep)
            })
            .collect()
    }

    #[test]
    fn a_scrape_does_the_same_work_on_a_thousand_or_a_hundred_thousand_jobs() {
        let (few, many) = (scrape_steps(1_000), scrape_steps(100_000));
        // Measured: the same steps at both sizes. A statement that counted or scanned the
        // jobs would take a step per row: 100,000 and more.
        for (f, m) in few.iter().zip(&many) {
            assert!(
                *m <= f * 2 + 50,
                "{many:?} steps from 100,000 jobs, {few:?} from 1,000"
            );
        }
    }

    #[test]
    fn the_queue_lag_reads_one_index_head_per_queue() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("jobs.db")).unwrap();
        let plan: Vec<String> = {
            let mut stmt = store
                .conn()
                .prepare(&format!("EXPLAIN QUERY PLAN {}", QUEUE_LAG_SQL.sqlite()))
                .unwrap();
            let rows = stmt.query_map([0i64], |r| r.get::<_, String>(3)).unwrap();
            rows.collect::<Result<_>>().unwrap()
        };
        let plan = plan.join("\n");
        assert!(
            // One seek per queue; the min() stops at the first entry, whose row is read once.
            plan.contains("INDEX jobs_pending_due (queue=? AND scheduled_at<?)"),
            "{plan}"
        );
        assert!(!plan.lines().any(|l| l.trim() == "SCAN jobs"), "{plan}");
    }
}
