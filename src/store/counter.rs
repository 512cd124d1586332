//! Durable metrics: counters and histograms of transitions, written in the transaction of the
//! transition they count, so that they survive restarts and are never lowered by pruning.
//!
//! Each transition calls one helper here, in one line, after its guarded statement has
//! changed its row (and, for the histograms, with the facts of the attempt read before that
//! statement rewrote them). The job counts by queue and status are kept by triggers on
//! updates and deletes (`0003_counters.sql`), and by [`enqueued`] on inserts.

use crate::store::db::{Connection, Dialect, OptionalExtension, Sql, params, sql};

use crate::error::Result;
use crate::job::{ErrorKind, Status};
use crate::metrics::CounterKind;

use super::ending::Ending;

/// The histograms' bucket bounds, in milliseconds; the last bucket, +Inf, is stored as
/// `i64::MAX`. From 5 ms (a `/bin/true`) to a day (a long backup, or a long wait).
pub(crate) const BUCKETS_MS: [i64; 18] = [
    5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000, 300_000, 900_000,
    3_600_000, 21_600_000, 86_400_000,
];

/// The stored bound of the +Inf bucket.
pub(crate) const INF_MS: i64 = i64::MAX;

/// The histogram of the wait from `scheduled_at` to `started_at`.
pub(crate) const WAIT: &str = "wait";
/// The histogram of the run from `started_at` to the ending.
pub(crate) const RUN: &str = "run";

/// Adds one to a counter. Parameters: name, queue, outcome.
///
/// On PostgreSQL, into this transaction's shard of the counter, which no other transaction
/// writes until this one ends (`job_count_shard()`, pg/schema.sql). One row per counter would be
/// a lock that every runner's writer takes and holds until it commits: the runners would queue
/// behind each other on it, and two transactions bumping two counters in opposite orders would
/// deadlock. The view `metric_counters` sums the shards.
const BUMP_SQL: Sql = Sql::new(
    "INSERT INTO metric_counters (name, queue, outcome, value) VALUES (?1, ?2, ?3, 1)
     ON CONFLICT (name, queue, outcome) DO UPDATE SET value = metric_counters.value + 1",
    "INSERT INTO metric_counter_shards AS c (name, queue, outcome, shard, value)
     VALUES (?1, ?2, ?3, job_count_shard(), 1)
     ON CONFLICT (name, queue, outcome, shard) DO UPDATE SET value = c.value + 1",
);

/// Adds one observation to a histogram's bucket. Parameters: name, queue, outcome, bucket
/// bound, the observation. On PostgreSQL, into this transaction's shard, as [`BUMP_SQL`].
const OBSERVE_SQL: Sql = Sql::new(
    "INSERT INTO metric_histograms (name, queue, outcome, le_ms, count, sum_ms)
     VALUES (?1, ?2, ?3, ?4, 1, ?5)
     ON CONFLICT (name, queue, outcome, le_ms)
     DO UPDATE SET count = metric_histograms.count + 1,
         sum_ms = metric_histograms.sum_ms + excluded.sum_ms",
    "INSERT INTO metric_histogram_shards AS h (name, queue, outcome, le_ms, shard, count, sum_ms)
     VALUES (?1, ?2, ?3, ?4, job_count_shard(), 1, ?5)
     ON CONFLICT (name, queue, outcome, le_ms, shard)
     DO UPDATE SET count = h.count + 1, sum_ms = h.sum_ms + excluded.sum_ms",
);

/// The statements of this file that are `const` items, for the test that prepares them all.
#[cfg(test)]
pub(super) fn statements() -> Vec<(&'static str, Sql)> {
    vec![("BUMP_SQL", BUMP_SQL), ("OBSERVE_SQL", OBSERVE_SQL)]
}

/// Adds one to a counter.
pub(super) fn bump(conn: &Connection, kind: CounterKind, queue: &str, outcome: &str) -> Result<()> {
    conn.prepare_cached(&BUMP_SQL)?
        .execute(params![kind.as_str(), queue, outcome])?;
    Ok(())
}

/// `n` jobs were inserted into `queue` as pending: the job counts' share of an enqueue (the
/// triggers follow updates and deletes, not inserts; see `schema.sql`).
pub(super) fn enqueued(conn: &Connection, queue: &str, n: usize) -> Result<()> {
    if conn.dialect() != Dialect::Sqlite {
        // PostgreSQL's trigger counts every INSERT itself, into sharded rows (pg/schema.sql).
        return Ok(());
    }
    let counted = conn
        .prepare_cached(sql!(sqlite: "UPDATE job_counts SET n = n + ?2 WHERE queue = ?1 AND status = 'pending'"))?
        .execute(params![queue, n as i64])?;
    if counted == 0 {
        // The queue's first job: a row for every status, so that the triggers' change of
        // status finds both of its rows (see schema.sql).
        conn.prepare_cached(
            sql!(sqlite: "INSERT OR IGNORE INTO job_counts (queue, status, n)
             VALUES (?1, 'pending', ?2), (?1, 'running', 0), (?1, 'succeeded', 0),
                    (?1, 'failed', 0), (?1, 'cancelled', 0)"),
        )?
        .execute(params![queue, n as i64])?;
    }
    Ok(())
}

/// What an attempt's ending needs from its job's row, read before the transition rewrites it
/// (a requeue clears `started_at` and moves `scheduled_at`).
#[derive(Debug, Clone)]
pub(super) struct Attempt {
    queue: String,
    scheduled_at: i64,
    started_at: Option<i64>,
}

impl Attempt {
    /// The facts of an attempt read by its caller (from an UPDATE's RETURNING).
    pub(super) fn new(queue: String, scheduled_at: i64, started_at: Option<i64>) -> Attempt {
        Attempt {
            queue,
            scheduled_at,
            started_at,
        }
    }

    /// The row of job `id` as it is now; None when there is no such job.
    pub(super) fn read(conn: &Connection, id: i64) -> Result<Option<Attempt>> {
        conn.prepare_cached(sql!(
            "SELECT queue, scheduled_at, started_at FROM jobs WHERE id = ?1"
        ))?
        .query_row([id], |r| {
            Ok(Attempt {
                queue: r.get(0)?,
                scheduled_at: r.get(1)?,
                started_at: r.get(2)?,
            })
        })
        .optional()
    }

    /// Records the attempt's wait and run times under `outcome`, when it had started.
    fn observe(&self, conn: &Connection, outcome: &str, now: i64) -> Result<()> {
        let now = conn.now(now)?;
        let Some(started) = self.started_at else {
            return Ok(());
        };
        let wait = started.saturating_sub(self.scheduled_at).max(0);
        let run = now.saturating_sub(started).max(0);
        for (name, ms) in [(WAIT, wait), (RUN, run)] {
            let le = BUCKETS_MS
                .iter()
                .copied()
                .find(|&b| ms <= b)
                .unwrap_or(INF_MS);
            conn.prepare_cached(&OBSERVE_SQL)?
                .execute(params![name, self.queue, outcome, le, ms])?;
        }
        Ok(())
    }
}

/// A worker's ending was recorded and left the job in `status`: count it by what it was.
pub(super) fn attempt_ended(
    conn: &Connection,
    attempt: Option<&Attempt>,
    ending: &Ending,
    status: Status,
    now: i64,
) -> Result<()> {
    let now = conn.now(now)?;
    let Some(a) = attempt else {
        return Ok(());
    };
    let q = a.queue.as_str();
    let observed = match ending {
        Ending::Succeeded => {
            bump(conn, CounterKind::JobsEnded, q, "succeeded")?;
            "succeeded"
        }
        Ending::Failed { kind, .. } => {
            if *kind == ErrorKind::Spawn {
                bump(conn, CounterKind::SpawnFailures, q, "")?;
            }
            if status == Status::Pending {
                bump(conn, CounterKind::RetriesScheduled, q, "")?;
                "retried"
            } else {
                bump(conn, CounterKind::JobsEnded, q, "failed")?;
                "failed"
            }
        }
        Ending::Lost { .. } => {
            bump(conn, CounterKind::SelfFences, q, "")?;
            if status == Status::Failed {
                bump(conn, CounterKind::JobsEnded, q, "lost")?;
            }
            "lost"
        }
        Ending::Interrupted { .. } => {
            bump(conn, CounterKind::Interrupted, q, "")?;
            "interrupted"
        }
        // A stop whose lease was still held: lost, but not a self-fence.
        Ending::Stopped { .. } => {
            if status == Status::Failed {
                bump(conn, CounterKind::JobsEnded, q, "lost")?;
            }
            "lost"
        }
    };
    a.observe(conn, observed, now)
}

/// A sweeper reclaimed the attempt, and the job went to `status` (pending or failed).
pub(super) fn reclaimed(
    conn: &Connection,
    attempt: Option<&Attempt>,
    status: Status,
    now: i64,
) -> Result<()> {
    let now = conn.now(now)?;
    let Some(a) = attempt else {
        return Ok(());
    };
    if status == Status::Failed {
        bump(conn, CounterKind::Reclaims, &a.queue, "failed")?;
        bump(conn, CounterKind::JobsEnded, &a.queue, "lost")?;
    } else {
        bump(conn, CounterKind::Reclaims, &a.queue, "requeued")?;
    }
    a.observe(conn, "lost", now)
}

/// An operator cancelled the job, which was in `was` (pending or running).
pub(super) fn cancelled(
    conn: &Connection,
    attempt: Option<&Attempt>,
    was: Status,
    now: i64,
) -> Result<()> {
    let now = conn.now(now)?;
    let Some(a) = attempt else {
        return Ok(());
    };
    bump(conn, CounterKind::JobsEnded, &a.queue, "cancelled")?;
    if was == Status::Running {
        a.observe(conn, "cancelled", now)?;
    }
    Ok(())
}
