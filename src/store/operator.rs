//! An operator's actions: cancelling a job, and retrying one or the failed jobs that exhausted
//! the recovery budget.

use crate::store::db::{Connection, params, sql};

use crate::error::{Error, Result};
use crate::job::{EventKind, JobRecord, Status};
use crate::metrics::CounterKind;

use super::counter;
use super::dependency;
use super::read::{ListFilter, job, list};
use super::tx::event;

pub(super) fn cancel(conn: &Connection, id: i64, now: i64) -> Result<JobRecord> {
    let now = conn.now(now)?;
    let current = job(conn, id)?;
    let facts = counter::Attempt::read(conn, id)?;
    let detail = match current.status {
        Status::Pending => {
            conn.execute(
                sql!(
                    "UPDATE jobs SET status = 'cancelled', completed_at = ?2
                 WHERE id = ?1 AND status = 'pending'"
                ),
                params![id, now],
            )?;
            "cancelled while pending".to_string()
        }
        Status::Running => {
            // Revoke the lease: the runner's next renewal reports it lost and it kills the
            // attempt; the teardown marker lets any runner kill it if that runner is gone.
            conn.execute(
                sql!("UPDATE jobs SET status = 'cancelled', completed_at = ?2, lease_expires_at = NULL,
                     teardown_token = coalesce(run_token, ''), teardown_pgid = pgid,
                     teardown_start_time = proc_start_time, teardown_worker = worker_id
                 WHERE id = ?1 AND status = 'running'"),
                params![id, now],
            )?;
            format!(
                "cancelled while running attempt {}; lease revoked",
                current.attempt
            )
        }
        s => {
            return Err(Error::WrongState {
                id,
                status: s.to_string(),
                reason: "it has already finished and cannot be cancelled".into(),
            });
        }
    };
    counter::cancelled(conn, facts.as_ref(), current.status, now)?;
    event(
        conn,
        id,
        now,
        EventKind::Cancelled,
        current.attempt,
        &detail,
    )?;
    dependency::job_ended(conn, id, Status::Cancelled, now)?;
    job(conn, id)
}

pub(super) fn retry(
    conn: &Connection,
    id: i64,
    reason: Option<&str>,
    now: i64,
) -> Result<JobRecord> {
    let now = conn.now(now)?;
    let current = job(conn, id)?;
    let refuse = |reason: String| Error::WrongState {
        id,
        status: current.status.to_string(),
        reason,
    };
    let lease_gone = current.run_token.is_none()
        || current.worker_id.is_none()
        || current.lease_expires_at.is_none_or(|t| t < now);
    match current.status {
        Status::Failed | Status::Cancelled => {}
        Status::Running if lease_gone => {}
        Status::Running => {
            return Err(refuse(format!(
                "its lease is live (worker {}, expires in {:.1}s): a runner is executing it; cancel it instead",
                current.worker_id.as_deref().unwrap_or("?"),
                (current.lease_expires_at.unwrap_or(now) - now) as f64 / 1000.0
            )));
        }
        Status::Pending => return Err(refuse("it is already waiting to run".into())),
        Status::Succeeded => {
            return Err(refuse(
                "succeeded jobs are not run again; enqueue a new job".into(),
            ));
        }
    }
    // A job that runs after others waits for them again, and never for one that cannot
    // succeed: the operator retries that one first.
    let waiting = match dependency::unmet(conn, id)? {
        Ok(waiting) => waiting,
        Err(dependency::Unmet::Ended(dep, status)) => {
            return Err(refuse(format!(
                "it runs after job {dep}, which is {status}: retry job {dep} first"
            )));
        }
        Err(dependency::Unmet::Enqueuing) => {
            return Err(refuse(
                "it is part of a bulk enqueue that has not finished".into(),
            ));
        }
        Err(dependency::Unmet::Pruned(0)) => {
            return Err(refuse(
                "it runs after jobs that were pruned, one of them before it succeeded: \
                 it counts as failed, so this job could never run (enqueue a new one)"
                    .into(),
            ));
        }
        Err(dependency::Unmet::Pruned(dep)) => {
            return Err(refuse(format!(
                "it runs after job {dep}, which was pruned before it succeeded: it counts as \
                 failed, so this job could never run (enqueue a new one)"
            )));
        }
    };
    let message = match reason {
        Some(r) if !r.trim().is_empty() => format!("manual retry: {}", r.trim()),
        _ => "manual retry after lease recovery".to_string(),
    };
    conn.execute(
        sql!(
            "UPDATE jobs SET
             teardown_token = CASE WHEN status = 'running' THEN coalesce(run_token, '')
                                   ELSE teardown_token END,
             teardown_pgid = CASE WHEN status = 'running' THEN pgid ELSE teardown_pgid END,
             teardown_start_time = CASE WHEN status = 'running' THEN proc_start_time
                                        ELSE teardown_start_time END,
             teardown_worker = CASE WHEN status = 'running' THEN worker_id
                                    ELSE teardown_worker END,
             status = 'pending', scheduled_at = ?2, started_at = NULL, completed_at = NULL,
             heartbeat_at = NULL, lease_expires_at = NULL, run_token = NULL, worker_id = NULL,
             recovery_count = 0, attempt = 0, failed_attempts = 0, exit_code = NULL,
             signal = NULL, error_kind = NULL, last_error = ?3, waiting = ?5
         WHERE id = ?1 AND status = ?4"
        ),
        params![id, now, message, current.status.as_str(), waiting],
    )?;
    counter::bump(conn, CounterKind::ManualRetries, &current.queue, "")?;
    event(
        conn,
        id,
        now,
        EventKind::ManualRetry,
        current.attempt,
        &message,
    )?;
    job(conn, id)
}

/// The failed jobs that exhausted the recovery budget, most recently failed first: `limit` of
/// them, or all. A read: [`retry_slice`] retries them.
pub(super) fn failed_stale(
    conn: &Connection,
    limit: Option<u64>,
    max_recovery_attempts: u32,
) -> Result<Vec<i64>> {
    let filter = ListFilter {
        failed_stale: Some(max_recovery_attempts),
        limit,
        ..ListFilter::default()
    };
    Ok(list(conn, &filter)?.into_iter().map(|j| j.id).collect())
}

/// One slice of a bulk retry: retries the jobs of `ids` from the first until the slice has
/// held the write lock for [`SLICE`](super::batch::SLICE); returns how many of `ids` it went
/// through, and those it retried. A job that is no longer there or no longer failed (another
/// operator retried or pruned it between two slices) is passed over.
pub(super) fn retry_slice(
    conn: &Connection,
    ids: &[i64],
    reason: Option<&str>,
    now: i64,
) -> Result<(usize, Vec<i64>)> {
    let now = conn.now(now)?;
    let started = std::time::Instant::now();
    let mut retried = Vec::new();
    let mut seen = 0;
    for &id in ids {
        seen += 1;
        match retry(conn, id, reason, now) {
            Ok(_) => retried.push(id),
            Err(Error::NoSuchJob(_) | Error::WrongState { .. }) => {}
            Err(e) => return Err(e),
        }
        if started.elapsed() >= super::batch::SLICE {
            break;
        }
    }
    Ok((seen, retried))
}
