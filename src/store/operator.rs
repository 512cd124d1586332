//! An operator's actions: cancelling a job, and retrying one or the failed jobs that exhausted
//! the recovery budget.

use std::time::Instant;

use crate::store::db::{Connection, Dialect, params, sql};

use crate::error::{Error, Result};
use crate::job::{EventKind, JobRecord, Status};
use crate::metrics::CounterKind;

use super::Store;
use super::counter;
use super::dependency;
use super::read::{ListFilter, job, list};
use super::slice::{SLICE, yield_lock};
use super::tx::event;

/// How many times an operator's write reads its job again when the write's guard found the
/// row changed since the read. Under [`lock`] that cannot happen; if it ever does, the write
/// acts on what the row now is, and after this many tries fails as busy (its transaction then
/// runs again whole).
const REREADS: usize = 3;

/// Locks job `id`'s row until the transaction ends, on PostgreSQL; nothing on SQLite, whose
/// IMMEDIATE transaction already keeps every other writer out. An operator's write reads the
/// job, decides, then writes: without the lock a claim, an ending or a renewal could commit
/// in between. `FOR NO KEY UPDATE` is the lock the UPDATE takes anyway; a claim's `SKIP
/// LOCKED` passes a job held by it, and a claim that took the job first is waited for.
fn lock(conn: &Connection, id: i64) -> Result<()> {
    if conn.dialect() == Dialect::Sqlite {
        return Ok(());
    }
    conn.prepare_cached(sql!(postgres: "SELECT id FROM jobs WHERE id = ?1 FOR NO KEY UPDATE"))?
        .query(params![id])?
        .next()?;
    Ok(())
}

/// Locks, on PostgreSQL, the unfinished jobs that job `id` runs after (`FOR SHARE`, in
/// ascending id order), then the job itself ([`lock`]); nothing on SQLite. A retry counts
/// them in its `waiting`: their endings, which count it down, wait for the retry's commit
/// (or the retry waits for theirs and counts them done). Without it, one that ends between
/// the count and the write leaves the job waiting for it forever. Dependencies before the
/// job: an ending locks its own row before its dependents', so the two never wait in a
/// circle.
fn lock_for_retry(conn: &Connection, id: i64) -> Result<()> {
    if conn.dialect() == Dialect::Sqlite {
        return Ok(());
    }
    {
        let mut stmt = conn.prepare_cached(sql!(postgres: "SELECT id FROM jobs
             WHERE id IN (SELECT after_id FROM job_deps WHERE job_id = ?1 AND after_id > 0)
               AND status IN ('pending', 'running')
             ORDER BY id FOR SHARE"))?;
        let mut rows = stmt.query(params![id])?;
        while rows.next()?.is_some() {}
    }
    lock(conn, id)
}

/// The error when a guarded write found its row changed [`REREADS`] times running: busy, so
/// that the store runs the whole transaction again.
fn changed_under() -> Error {
    Error::Busy {
        operation: "an operator's write (the job kept changing under it)",
        waited: std::time::Duration::ZERO,
    }
}

pub(super) fn cancel(conn: &Connection, id: i64, now: i64) -> Result<JobRecord> {
    let now = conn.now(now)?;
    lock(conn, id)?;
    for _ in 0..REREADS {
        let current = job(conn, id)?;
        let facts = counter::Attempt::read(conn, id)?;
        let (changed, detail) = match current.status {
            Status::Pending => (
                conn.execute(
                    sql!(
                        "UPDATE jobs SET status = 'cancelled', completed_at = ?2
                     WHERE id = ?1 AND status = 'pending'"
                    ),
                    params![id, now],
                )?,
                "cancelled while pending".to_string(),
            ),
            // Revoke the lease: the runner's next renewal reports it lost and it kills the
            // attempt; the teardown marker lets any runner kill it if that runner is gone.
            // Guarded by the attempt read: the marker names that attempt's processes.
            Status::Running => (
                conn.execute(
                    sql!(
                        "UPDATE jobs SET status = 'cancelled', completed_at = ?2,
                         lease_expires_at = NULL,
                         teardown_token = coalesce(run_token, ''), teardown_pgid = pgid,
                         teardown_start_time = proc_start_time, teardown_worker = worker_id,
                         teardown_lease_expires_at = lease_expires_at
                     WHERE id = ?1 AND status = 'running' AND coalesce(run_token, '') = ?3"
                    ),
                    params![id, now, current.run_token.as_deref().unwrap_or("")],
                )?,
                format!(
                    "cancelled while running attempt {}; lease revoked",
                    current.attempt
                ),
            ),
            s => {
                return Err(Error::WrongState {
                    id,
                    status: s.to_string(),
                    reason: "it has already finished and cannot be cancelled".into(),
                });
            }
        };
        if changed == 0 {
            continue;
        }
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
        return job(conn, id);
    }
    Err(changed_under())
}

pub(super) fn retry(
    conn: &Connection,
    id: i64,
    reason: Option<&str>,
    now: i64,
) -> Result<JobRecord> {
    let now = conn.now(now)?;
    lock_for_retry(conn, id)?;
    let message = match reason {
        Some(r) if !r.trim().is_empty() => format!("manual retry: {}", r.trim()),
        _ => "manual retry after lease recovery".to_string(),
    };
    for _ in 0..REREADS {
        let current = job(conn, id)?;
        let waiting = retryable(conn, &current, now)?;
        // Guarded by what the decision read: the status, and the attempt and its lease (a
        // running job is retried only while its lease is gone).
        let changed = conn.execute(
            sql!(
                "UPDATE jobs SET
                 teardown_token = CASE WHEN status = 'running' THEN coalesce(run_token, '')
                                       ELSE teardown_token END,
                 teardown_pgid = CASE WHEN status = 'running' THEN pgid ELSE teardown_pgid END,
                 teardown_start_time = CASE WHEN status = 'running' THEN proc_start_time
                                            ELSE teardown_start_time END,
                 teardown_worker = CASE WHEN status = 'running' THEN worker_id
                                        ELSE teardown_worker END,
                 teardown_lease_expires_at = CASE WHEN status = 'running' THEN lease_expires_at
                                                  ELSE teardown_lease_expires_at END,
                 status = 'pending', scheduled_at = ?2, started_at = NULL, completed_at = NULL,
                 heartbeat_at = NULL, lease_expires_at = NULL, run_token = NULL, worker_id = NULL,
                 recovery_count = 0, attempt = 0, failed_attempts = 0, exit_code = NULL,
                 signal = NULL, error_kind = NULL, last_error = ?3, waiting = ?5
             WHERE id = ?1 AND status = ?4 AND coalesce(run_token, '') = ?6
               AND coalesce(lease_expires_at, -1) = ?7"
            ),
            params![
                id,
                now,
                message,
                current.status.as_str(),
                waiting,
                current.run_token.as_deref().unwrap_or(""),
                current.lease_expires_at.unwrap_or(-1)
            ],
        )?;
        if changed == 0 {
            continue;
        }
        counter::bump(conn, CounterKind::ManualRetries, &current.queue, "")?;
        event(
            conn,
            id,
            now,
            EventKind::ManualRetry,
            current.attempt,
            &message,
        )?;
        return job(conn, id);
    }
    Err(changed_under())
}

/// Whether job `current` may be retried at `now`: the `waiting` it gets (its dependencies not
/// yet succeeded), or why not.
fn retryable(conn: &Connection, current: &JobRecord, now: i64) -> Result<i64> {
    let id = current.id;
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
    match dependency::unmet(conn, id)? {
        Ok(waiting) => Ok(waiting),
        Err(dependency::Unmet::Ended(dep, status)) => Err(refuse(format!(
            "it runs after job {dep}, which is {status}: retry job {dep} first"
        ))),
        Err(dependency::Unmet::Enqueuing) => Err(refuse(
            "it is part of a bulk enqueue that has not finished".into(),
        )),
        Err(dependency::Unmet::Pruned(0)) => Err(refuse(
            "it runs after jobs that were pruned, one of them before it succeeded: \
             it counts as failed, so this job could never run (enqueue a new one)"
                .into(),
        )),
        Err(dependency::Unmet::Pruned(dep)) => Err(refuse(format!(
            "it runs after job {dep}, which was pruned before it succeeded: it counts as \
             failed, so this job could never run (enqueue a new one)"
        ))),
    }
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
/// held the write lock for [`SLICE`](SLICE); returns how many of `ids` it went
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
        if started.elapsed() >= SLICE {
            break;
        }
    }
    Ok((seen, retried))
}

impl Store {
    /// Cancels a job: a pending one at once; a running one by revoking its lease, so that its
    /// runner stops the attempt. Returns the job as it now is.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchJob`], and [`Error::WrongState`] for a job that already ended.
    pub fn cancel(&self, id: i64) -> Result<JobRecord> {
        self.cancel_at(id, self.now())
    }

    /// [`Store::cancel`] at `now` rather than the store's clock.
    ///
    /// # Errors
    ///
    /// As [`Store::cancel`].
    pub fn cancel_at(&self, id: i64, now: i64) -> Result<JobRecord> {
        let job = self.write(|c| cancel(c, id, now))?;
        // The jobs after it, when more than one transaction's worth: cancelled by now.
        self.continue_cascades(now, None)?;
        Ok(job)
    }

    /// An operator's retry of one job: failed and cancelled jobs, and running jobs whose lease
    /// is missing or expired, go back to pending with their counters reset.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchJob`], and [`Error::WrongState`] for a pending, succeeded or live
    /// running job, with the reason.
    pub fn retry(&self, id: i64, reason: Option<&str>) -> Result<JobRecord> {
        self.retry_at(id, reason, self.now())
    }

    /// [`Store::retry`] at `now` rather than the store's clock.
    ///
    /// # Errors
    ///
    /// As [`Store::retry`].
    pub fn retry_at(&self, id: i64, reason: Option<&str>, now: i64) -> Result<JobRecord> {
        let job = self.write(|c| retry(c, id, reason, now))?;
        self.poke();
        Ok(job)
    }

    /// An operator's retry of the failed jobs that exhausted the recovery budget: `limit` of
    /// them, most recently failed first, or all when `limit` is None. Returns the ids retried.
    ///
    /// The jobs are retried in transactions that hold the write lock for about 50 ms each, so
    /// that runners on the file keep renewing their leases; each job's retry is whole. A job
    /// that another operator retried meanwhile is passed over.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written; the jobs retried before the
    /// failure stay retried.
    pub fn retry_failed_stale(
        &self,
        limit: Option<u64>,
        max_recovery_attempts: u32,
        reason: Option<&str>,
    ) -> Result<Vec<i64>> {
        let now = self.now();
        let ids = failed_stale(&self.conn, limit, max_recovery_attempts)?;
        let mut retried = Vec::with_capacity(ids.len());
        let mut done = 0;
        while done < ids.len() {
            let started = Instant::now();
            let (seen, slice) = self.write(|c| retry_slice(c, &ids[done..], reason, now))?;
            done += seen;
            retried.extend(slice);
            if !retried.is_empty() {
                // The first ones can run now.
                self.poke();
            }
            yield_lock(started.elapsed());
        }
        Ok(retried)
    }
}
