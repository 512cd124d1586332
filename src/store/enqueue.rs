//! Enqueueing: a job's row, its dependencies and its `enqueued` event.

use rusqlite::{Connection, OptionalExtension, params};

use crate::error::{Error, Result};
use crate::job::{EventKind, Job, Status};

use super::tx::event;

pub(super) fn insert_job(conn: &Connection, job: &Job, now: i64) -> Result<i64> {
    let id = insert_row(conn, job, now)?;
    insert_deps(conn, id, job.dependencies())?;
    event(conn, id, now, EventKind::Enqueued, 0, job.queue_name())?;
    Ok(id)
}

/// Inserts many jobs and their events; the caller's transaction makes it all or none.
pub(super) fn insert_many(conn: &Connection, jobs: &[Job], now: i64) -> Result<Vec<i64>> {
    let ids = jobs
        .iter()
        .map(|j| {
            let id = insert_row(conn, j, now)?;
            insert_deps(conn, id, j.dependencies())?;
            Ok(id)
        })
        .collect::<Result<Vec<i64>>>()?;
    // One statement for all the `enqueued` events: the ids of this transaction's rows
    // are consecutive, as no other writer can insert while it holds the lock.
    if let (Some(first), Some(last)) = (ids.first(), ids.last()) {
        conn.prepare_cached(
            "INSERT INTO job_events (job_id, at, kind, attempt, detail)
                     SELECT id, ?3, 'enqueued', 0, queue FROM jobs WHERE id BETWEEN ?1 AND ?2",
        )?
        .execute(params![first, last, now])?;
    }
    Ok(ids)
}

/// Inserts a job's row without its event.
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

/// Records that job `id` runs after each of `after`, and counts those not yet succeeded in its
/// `waiting` column. Refuses (and the caller's transaction then writes nothing) an unknown id,
/// the job itself, and a job that already failed or was cancelled: the new job could never
/// run. Cycles cannot arise: a job can only name jobs that exist before it.
fn insert_deps(conn: &Connection, id: i64, after: &[i64]) -> Result<()> {
    if after.is_empty() {
        return Ok(());
    }
    let mut waiting = 0i64;
    for &dep in after {
        let refuse = |reason: &str| Error::Dependency {
            id: dep,
            reason: reason.to_string(),
        };
        if dep == id {
            return Err(refuse("a job cannot run after itself"));
        }
        let status: Option<String> = conn
            .prepare_cached("SELECT status FROM jobs WHERE id = ?1")?
            .query_row([dep], |r| r.get(0))
            .optional()?;
        let Some(status) = status else {
            return Err(refuse("no such job"));
        };
        match status.parse::<Status>()? {
            Status::Succeeded => {}
            Status::Pending | Status::Running => waiting += 1,
            s @ (Status::Failed | Status::Cancelled) => {
                return Err(refuse(&format!(
                    "it is {s}, so this job could never run (retry it first)"
                )));
            }
        }
        conn.prepare_cached("INSERT OR IGNORE INTO job_deps (job_id, after_id) VALUES (?1, ?2)")?
            .execute(params![id, dep])?;
    }
    if waiting > 0 {
        conn.prepare_cached("UPDATE jobs SET waiting = ?2 WHERE id = ?1")?
            .execute(params![id, waiting])?;
    }
    Ok(())
}
