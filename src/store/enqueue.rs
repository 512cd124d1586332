//! Enqueueing: a job's row and its `enqueued` event.

use rusqlite::{Connection, params};

use crate::error::Result;
use crate::job::{EventKind, Job};

use super::counter;
use super::tx::event;

pub(super) fn insert_job(conn: &Connection, job: &Job, now: i64) -> Result<i64> {
    let id = insert_row(conn, job, now)?;
    event(conn, id, now, EventKind::Enqueued, 0, job.queue_name())?;
    counter::enqueued(conn, job.queue_name(), 1)?;
    Ok(id)
}

/// How often [`insert_many`] reports progress: every this many rows.
const PROGRESS_EVERY: usize = 1000;

/// Inserts many jobs and their events; the caller's transaction makes it all or none.
/// `progress` is told how many rows are in, every [`PROGRESS_EVERY`] rows and at the end.
pub(super) fn insert_many(
    conn: &Connection,
    jobs: &[Job],
    now: i64,
    progress: &mut dyn FnMut(usize),
) -> Result<Vec<i64>> {
    let mut ids = Vec::with_capacity(jobs.len());
    for job in jobs {
        ids.push(insert_row(conn, job, now)?);
        if ids.len() % PROGRESS_EVERY == 0 {
            progress(ids.len());
        }
    }
    // One statement for all the `enqueued` events: the ids of this transaction's rows
    // are consecutive, as no other writer can insert while it holds the lock.
    if let (Some(first), Some(last)) = (ids.first(), ids.last()) {
        conn.prepare_cached(
            "INSERT INTO job_events (job_id, at, kind, attempt, detail)
                     SELECT id, ?3, 'enqueued', 0, queue FROM jobs WHERE id BETWEEN ?1 AND ?2",
        )?
        .execute(params![first, last, now])?;
    }
    progress(ids.len());
    let mut per_queue: std::collections::BTreeMap<&str, usize> = Default::default();
    for j in jobs {
        *per_queue.entry(j.queue_name()).or_default() += 1;
    }
    for (queue, n) in per_queue {
        counter::enqueued(conn, queue, n)?;
    }
    Ok(ids)
}

/// Inserts a job's row without its event (nor its count: see [`counter::enqueued`]).
fn insert_row(conn: &Connection, job: &Job, now: i64) -> Result<i64> {
    let f = job.fields();
    let scheduled_at = job.scheduled_at(now);
    conn.prepare_cached(
        "INSERT INTO jobs (queue, argv, env, cwd, priority, status, max_attempts,
             backoff_base_ms, backoff_max_ms, on_lost, timeout_ms, idle_timeout_ms,
             created_at, scheduled_at)
         VALUES (?1, ?2, ?3, ?4, ?5, 'pending', ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
    )?
    .execute(params![
        f.queue,
        f.argv,
        f.env,
        f.cwd,
        f.priority,
        f.max_attempts,
        f.backoff_base_ms,
        f.backoff_max_ms,
        f.on_lost,
        f.timeout_ms,
        f.idle_timeout_ms,
        now,
        scheduled_at,
    ])?;
    Ok(conn.last_insert_rowid())
}
