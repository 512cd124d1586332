//! Samples for the dashboard's charts: the durable counters and two gauges, written by a
//! runner's sweeper once a sample interval into `metric_samples`, a table of at most 86 rows.
//! A chart's bar is the difference between two consecutive samples.

#[cfg(doc)]
use crate::error::Error;
use crate::store::db::{Connection, OptionalExtension, Sql, params, sql};

use crate::error::Result;

use super::Store;
use super::counter::{BUCKETS_MS, INF_MS, RUN, WAIT};

/// The samples kept at every interval: 60 intervals' worth (an hour at the default minute).
pub const FINE_SAMPLES: usize = 61;
/// The first sample of every 60 intervals is kept longer: 24 spans of 60 intervals (a day
/// at the default minute).
pub const COARSE_SAMPLES: usize = 25;
/// A coarse span, in intervals.
const COARSE_EVERY: i64 = 60;

/// The pending jobs ready to claim at ?1 (due, not waiting, not held for teardown): a count
/// over `jobs_pending_due`, queue by queue, reading only the ready entries.
const READY_SQL: Sql = Sql::new(
    concat!(
        "SELECT coalesce(sum((SELECT count(*) FROM jobs INDEXED BY jobs_pending_due
                          WHERE queue = q.queue AND ",
        ready_to_claim!(),
        " AND scheduled_at <= ?1)), 0)
     FROM (SELECT queue FROM job_counts WHERE status = 'pending' AND n > 0) q"
    ),
    concat!(
        "SELECT coalesce(sum((SELECT count(*) FROM jobs
                          WHERE queue = q.queue AND ",
        ready_to_claim!(),
        " AND scheduled_at <= ?1)), 0)
     FROM (SELECT queue FROM job_counts WHERE status = 'pending' AND n > 0) q"
    ),
);

/// One row of `metric_samples`: counters so far and gauges at `at`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Sample {
    /// When it was taken, in milliseconds since the epoch.
    pub at: i64,
    /// Whether it is the first of its span of 60 intervals (kept for the coarse chart).
    pub coarse: bool,
    /// Running jobs at `at`.
    pub running: u64,
    /// Pending jobs ready to claim at `at` (due, not waiting for a dependency).
    pub ready: u64,
    /// Jobs ended so far as succeeded.
    pub succeeded: u64,
    /// Jobs ended so far as failed (their command failed with no attempt left).
    pub failed: u64,
    /// Jobs ended so far as lost (recovery budget spent, or `on_lost = fail`).
    pub lost: u64,
    /// Jobs cancelled so far.
    pub cancelled: u64,
    /// Failed attempts so far that were followed by a retry.
    pub retried: u64,
    /// Attempts so far by wait (scheduled to started): one count per bucket of
    /// [`HISTOGRAM_BOUNDS_MS`], then the +Inf bucket.
    pub wait: Vec<u64>,
    /// Attempts so far by run time (started to ended), bucketed as `wait`.
    pub run: Vec<u64>,
}

/// The upper bounds in milliseconds of the histograms' buckets, +Inf left out: the buckets
/// of [`Sample::wait`] and [`Sample::run`], and of the `/metrics` histograms.
pub const HISTOGRAM_BOUNDS_MS: [i64; 18] = BUCKETS_MS;

/// Takes a sample at `now` unless one was taken in the same interval of `interval_ms`, and
/// trims the table; returns whether it wrote one. The ready count is read before the write
/// transaction (it reads index entries in proportion to the ready jobs), the counters inside
/// it (a few small rows).
pub(super) fn take(store: &super::Store, now: i64, interval_ms: i64) -> Result<bool> {
    take_in(store, now, interval_ms, interval_ms)
}

impl super::Store {
    /// Takes a sample at `now` whatever its interval of `interval_ms` holds already, unless
    /// one was taken at `now` or later: a runner's start and stop, so that a short batch has
    /// two samples to chart. Trims the table as [`Store::take_sample`] does, so the table
    /// stays as small.
    pub(crate) fn take_sample_now(&self, now: i64, interval_ms: i64) -> Result<bool> {
        take_in(self, now, interval_ms, 1)
    }
}

/// [`take`], with a sample refused when one was taken in the same span of `once_ms` (the
/// interval, or 1 for a forced sample); `interval_ms` still sets the coarse spans.
fn take_in(store: &super::Store, now: i64, interval_ms: i64, once_ms: i64) -> Result<bool> {
    let interval_ms = interval_ms.max(1);
    let once_ms = once_ms.max(1);
    let sampled = |conn: &Connection| -> Result<bool> {
        let last: Option<i64> = conn
            .query_row(sql!("SELECT max(at) FROM metric_samples"), params![], |r| {
                r.get(0)
            })
            .optional()?
            .flatten();
        Ok(last.is_some_and(|l| l.div_euclid(once_ms) >= now.div_euclid(once_ms)))
    };
    // Most sweeps find the interval sampled: they read one row, not the ready jobs.
    if sampled(store.conn())? {
        return Ok(false);
    }
    let ready: i64 = store.conn().query_row(&READY_SQL, [now], |r| r.get(0))?;
    store.write(|conn| {
        // Another runner may have sampled since.
        if sampled(conn)? {
            return Ok(false);
        }
        let last_coarse: Option<i64> = conn.query_row(
            sql!("SELECT max(at) FROM metric_samples WHERE coarse = 1"),
            params![],
            |r| r.get(0),
        )?;
        let span = interval_ms.saturating_mul(COARSE_EVERY);
        let coarse = last_coarse.is_none_or(|c| c.div_euclid(span) < now.div_euclid(span));
        let s = read(conn, now, ready, coarse)?;
        conn.prepare_cached(sql!(
            "INSERT INTO metric_samples (at, coarse, running, ready, succeeded, failed, lost,
                 cancelled, retried, wait, run)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
        ))?
        .execute(params![
            s.at,
            s.coarse,
            s.running as i64,
            s.ready as i64,
            s.succeeded as i64,
            s.failed as i64,
            s.lost as i64,
            s.cancelled as i64,
            s.retried as i64,
            join(&s.wait),
            join(&s.run),
        ])?;
        conn.prepare_cached(sql!(
            "DELETE FROM metric_samples
             WHERE at < (SELECT at FROM metric_samples ORDER BY at DESC LIMIT 1 OFFSET ?1)
               AND (coarse = 0 OR at < (SELECT at FROM metric_samples WHERE coarse = 1
                                        ORDER BY at DESC LIMIT 1 OFFSET ?2))"
        ))?
        .execute(params![FINE_SAMPLES as i64 - 1, COARSE_SAMPLES as i64 - 1])?;
        Ok(true)
    })
}

/// The counters as they are now, with the gauges.
fn read(conn: &Connection, now: i64, ready: i64, coarse: bool) -> Result<Sample> {
    let now = conn.now(now)?;
    let mut s = Sample {
        at: now,
        coarse,
        ready: ready.max(0) as u64,
        ..Sample::default()
    };
    s.running = conn
        .query_row(
            sql!("SELECT coalesce(sum(n), 0) FROM job_counts WHERE status = 'running'"),
            params![],
            |r| r.get::<_, i64>(0),
        )?
        .max(0) as u64;
    let mut stmt = conn.prepare_cached(sql!(
        "SELECT name, outcome, sum(value) FROM metric_counters
         WHERE name = 'jobs_ended' OR name = 'retries_scheduled' GROUP BY name, outcome"
    ))?;
    let mut rows = stmt.query(params![])?;
    while let Some(r) = rows.next()? {
        let (name, outcome, n): (String, String, i64) = (r.get(0)?, r.get(1)?, r.get(2)?);
        let n = n.max(0) as u64;
        match (name.as_str(), outcome.as_str()) {
            ("retries_scheduled", _) => s.retried += n,
            (_, "succeeded") => s.succeeded += n,
            (_, "failed") => s.failed += n,
            (_, "lost") => s.lost += n,
            (_, "cancelled") => s.cancelled += n,
            _ => {}
        }
    }
    s.wait = buckets(conn, WAIT)?;
    s.run = buckets(conn, RUN)?;
    Ok(s)
}

/// The counts of histogram `name` by bucket, over every queue and outcome, +Inf last.
fn buckets(conn: &Connection, name: &str) -> Result<Vec<u64>> {
    let mut counts = vec![0u64; BUCKETS_MS.len() + 1];
    let mut stmt = conn.prepare_cached(sql!(
        "SELECT le_ms, sum(count) FROM metric_histograms WHERE name = ?1 GROUP BY le_ms"
    ))?;
    let mut rows = stmt.query([name])?;
    while let Some(r) = rows.next()? {
        let (le, n): (i64, i64) = (r.get(0)?, r.get(1)?);
        let i = if le == INF_MS {
            Some(BUCKETS_MS.len())
        } else {
            BUCKETS_MS.iter().position(|&b| b == le)
        };
        if let Some(i) = i {
            counts[i] += n.max(0) as u64;
        }
    }
    Ok(counts)
}

fn join(counts: &[u64]) -> String {
    counts
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Every sample kept, oldest first.
pub(super) fn all(conn: &Connection) -> Result<Vec<Sample>> {
    let mut stmt = conn.prepare_cached(sql!(
        "SELECT at, coarse, running, ready, succeeded, failed, lost, cancelled, retried,
                wait, run
         FROM metric_samples ORDER BY at"
    ))?;
    let rows = stmt.query_map(params![], |r| {
        let n = |i: usize| r.get::<_, i64>(i).map(|v| v.max(0) as u64);
        let hist = |i: usize| {
            r.get::<_, String>(i).map(|t| {
                let mut v: Vec<u64> = t.split(',').filter_map(|x| x.parse().ok()).collect();
                v.resize(BUCKETS_MS.len() + 1, 0);
                v
            })
        };
        Ok(Sample {
            at: r.get(0)?,
            coarse: r.get(1)?,
            running: n(2)?,
            ready: n(3)?,
            succeeded: n(4)?,
            failed: n(5)?,
            lost: n(6)?,
            cancelled: n(7)?,
            retried: n(8)?,
            wait: hist(9)?,
            run: hist(10)?,
        })
    })?;
    rows.collect::<Result<_>>()
}

/// The statements of this file that are `const` items or built at run time (with
/// representative inputs), for the test that prepares every statement (`store/statements.rs`).
#[cfg(test)]
pub(super) fn statements() -> Vec<(&'static str, Sql)> {
    vec![("READY_SQL", READY_SQL)]
}

impl Store {
    /// The samples of the counters and gauges that runners took for the dashboard's charts,
    /// oldest first: at most [`FINE_SAMPLES`] plus [`COARSE_SAMPLES`] rows.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn samples(&self) -> Result<Vec<Sample>> {
        all(&self.conn)
    }

    /// Takes a sample at `now` unless one was taken in the same interval of `interval_ms`;
    /// returns whether it wrote one. A runner's sweeper calls it.
    pub(crate) fn take_sample(&self, now: i64, interval_ms: i64) -> Result<bool> {
        take(self, now, interval_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Store;

    #[test]
    fn pruning_jobs_leaves_the_samples_and_their_counters_alone() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("jobs.db")).unwrap();
        let t0 = 1_700_000_000_000i64;
        // Five succeeded jobs, counted as the transitions count them.
        store
            .conn()
            .execute_batch(&format!(
                "INSERT INTO jobs (queue, argv, status, created_at, scheduled_at, completed_at)
                 SELECT 'q', '[\"true\"]', 'succeeded', {t0}, {t0}, {t0}
                 FROM (SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4
                       UNION ALL SELECT 5);
                 INSERT INTO job_counts (queue, status, n) VALUES ('q', 'succeeded', 5);
                 INSERT INTO metric_counters (name, queue, outcome, value)
                 VALUES ('jobs_ended', 'q', 'succeeded', 5);"
            ))
            .unwrap();
        assert!(take(&store, t0 + 1_000, 1_000).unwrap());
        let before = all(store.conn()).unwrap();
        let retention = crate::Retention::default().succeeded(Some(std::time::Duration::ZERO));
        assert_eq!(
            store
                .prune_at(
                    &retention,
                    &crate::store::PruneOptions::default(),
                    t0 + 2_000
                )
                .unwrap()
                .jobs,
            5
        );
        assert_eq!(all(store.conn()).unwrap(), before);
        assert!(take(&store, t0 + 3_000, 1_000).unwrap());
        let after = all(store.conn()).unwrap();
        assert_eq!(after.len(), 2);
        assert_eq!((after[0].succeeded, after[1].succeeded), (5, 5));
    }

    #[test]
    fn one_sample_an_interval_and_at_most_86_rows() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("jobs.db")).unwrap();
        let t0 = 1_700_000_000_000i64 - 1_700_000_000_000 % 60_000;
        assert!(take(&store, t0, 1_000).unwrap());
        assert!(!take(&store, t0 + 999, 1_000).unwrap(), "same interval");
        // 28 spans of 60 one-second intervals.
        for i in 1..1_700 {
            take(&store, t0 + i * 1_000, 1_000).unwrap();
        }
        let all = all(store.conn()).unwrap();
        assert!(all.len() <= FINE_SAMPLES + COARSE_SAMPLES, "{}", all.len());
        let coarse: Vec<i64> = all.iter().filter(|s| s.coarse).map(|s| s.at).collect();
        assert_eq!(coarse.len(), COARSE_SAMPLES);
        assert!(
            coarse.windows(2).all(|w| w[1] - w[0] == 60_000),
            "{coarse:?}"
        );
        let newest: Vec<i64> = all.iter().rev().take(FINE_SAMPLES).map(|s| s.at).collect();
        assert!(
            newest.windows(2).all(|w| w[0] - w[1] == 1_000),
            "{newest:?}"
        );
    }
}
