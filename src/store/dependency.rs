//! Dependencies between jobs: what the ending of a job does to the jobs that run after it.
//!
//! A job's `waiting` column counts its dependencies that have not succeeded; the claim indexes
//! hold only jobs with `waiting = 0`, so a waiting job costs a claim nothing. The count is kept
//! whatever the dependent's status (a success counts down a cancelled dependent too), so that
//! it still tells, after a dependency was pruned, whether that dependency had succeeded: a job
//! succeeds at most once, so each dependency counts down at most once. Every function here
//! runs inside the transaction of the ending that calls it.

use rusqlite::{Connection, params};

use crate::error::Result;
use crate::job::{EventKind, Status};
use crate::metrics::CounterKind;

use super::counter;
use super::tx::event;

/// Job `id` has just ended in `status` (succeeded, failed or cancelled): a success counts
/// down its dependents' `waiting`; a failure or a cancel cancels every pending job that runs
/// after it, and the jobs after those, down the chain, each with `last_error` naming the
/// dependency and how it ended.
pub(super) fn job_ended(conn: &Connection, id: i64, status: Status, now: i64) -> Result<()> {
    match status {
        Status::Succeeded => {
            // Read first, then update by id: most jobs have no dependents, and an UPDATE
            // whose rows come from `IN (SELECT ...)` builds a temporary b-tree of them even
            // when there are none.
            let dependents: Vec<i64> = {
                let mut stmt =
                    conn.prepare_cached("SELECT job_id FROM job_deps WHERE after_id = ?1")?;
                let rows = stmt.query_map([id], |r| r.get(0))?;
                rows.collect::<rusqlite::Result<_>>()?
            };
            // Whatever the dependent's status: see the module's docs.
            for job in dependents {
                conn.prepare_cached(
                    "UPDATE jobs SET waiting = waiting - 1 WHERE id = ?1 AND waiting > 0",
                )?
                .execute([job])?;
            }
            Ok(())
        }
        Status::Failed | Status::Cancelled => cancel_dependents(conn, id, status, now),
        Status::Pending | Status::Running => Ok(()),
    }
}

/// Cancels the pending dependents of `id`, which ended in `status`, and theirs in turn.
fn cancel_dependents(conn: &Connection, id: i64, status: Status, now: i64) -> Result<()> {
    // (the job that ended, how, and the job whose failure started the chain)
    let mut ended = vec![(id, status, id)];
    while let Some((dep, how, root)) = ended.pop() {
        let message = if dep == root {
            format!("dependency job {dep} {how}")
        } else {
            format!("dependency job {dep} {how} (after job {root} failed or was cancelled)")
        };
        let cancelled: Vec<(i64, i64, String)> = {
            let mut stmt = conn.prepare_cached(
                "UPDATE jobs SET status = 'cancelled', completed_at = ?2, last_error = ?3
                 WHERE id IN (SELECT job_id FROM job_deps WHERE after_id = ?1)
                   AND status = 'pending'
                 RETURNING id, attempt, queue",
            )?;
            let rows = stmt.query_map(params![dep, now, message], |r| r.try_into())?;
            rows.collect::<rusqlite::Result<_>>()?
        };
        for (job, attempt, queue) in cancelled {
            event(conn, job, now, EventKind::Cancelled, attempt, &message)?;
            // A cancelled job ended, as when an operator cancels it (the metrics' endings).
            counter::bump(conn, CounterKind::JobsEnded, &queue, "cancelled")?;
            ended.push((job, Status::Cancelled, root));
        }
    }
    Ok(())
}

/// Why a job cannot be put back to pending: a dependency of it can no longer succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unmet {
    /// The dependency failed or was cancelled: the operator retries it first.
    Ended(i64, Status),
    /// The dependency was pruned before it succeeded (its dependent's `waiting` still counts
    /// it), so it counts as failed; `0` when the job names several pruned ones and which of
    /// them had not succeeded is unknown.
    Pruned(i64),
}

/// The `waiting` a job that an operator puts back to pending starts with: its dependencies
/// still pending or running. Returns why it could never run instead, if so: a dependency that
/// failed or was cancelled (the operator retries that one first), or one pruned before it
/// succeeded. A pruned dependency is told apart by the job's own `waiting`, which counts
/// every dependency that has not succeeded whatever the job's status: when it exceeds the
/// count of those still in the file, the difference was pruned unsucceeded. A dependency
/// pruned after it succeeded counts as succeeded.
pub(super) fn unmet(conn: &Connection, id: i64) -> Result<std::result::Result<i64, Unmet>> {
    let mut stmt = conn.prepare_cached(
        "SELECT d.after_id, p.status FROM job_deps d LEFT JOIN jobs p ON p.id = d.after_id
         WHERE d.job_id = ?1 AND (p.status IS NULL OR p.status != 'succeeded')
         ORDER BY d.after_id",
    )?;
    let rows = stmt.query_map([id], |r| {
        Ok((r.get::<_, i64>(0)?, r.get::<_, Option<String>>(1)?))
    })?;
    let (mut waiting, mut present_unsucceeded, mut pruned) = (0i64, 0i64, Vec::new());
    for row in rows {
        let (dep, status) = row?;
        let Some(status) = status else {
            pruned.push(dep);
            continue;
        };
        present_unsucceeded += 1;
        match status.parse::<Status>()? {
            Status::Pending | Status::Running => waiting += 1,
            Status::Succeeded => {}
            s @ (Status::Failed | Status::Cancelled) => return Ok(Err(Unmet::Ended(dep, s))),
        }
    }
    if !pruned.is_empty() {
        let counted: i64 = conn
            .prepare_cached("SELECT waiting FROM jobs WHERE id = ?1")?
            .query_row([id], |r| r.get(0))?;
        if counted > present_unsucceeded {
            let named = match pruned.as_slice() {
                [one] => *one,
                _ if counted - present_unsucceeded == pruned.len() as i64 => pruned[0],
                _ => 0,
            };
            return Ok(Err(Unmet::Pruned(named)));
        }
    }
    Ok(Ok(waiting))
}
