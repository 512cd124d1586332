//! Dependencies between jobs: what the ending of a job does to the jobs that run after it.
//!
//! A job's `waiting` column counts its dependencies that have not succeeded; the claim indexes
//! hold only jobs with `waiting = 0`, so a waiting job costs a claim nothing. The count is kept
//! whatever the dependent's status (a success counts down a cancelled dependent too), so that
//! it still tells, after a dependency was pruned, whether that dependency had succeeded: a job
//! succeeds at most once, so each dependency counts down at most once.
//!
//! An ending handles at most [`ENDING_STEP`] dependents in its own transaction (the writer's,
//! which a renewal may be waiting behind); a fan-out of more is a *cascade*: a `cascades` row
//! naming the job that ended, how, the job whose failure started the chain, the last dependent
//! handled (`after_job`) and the last dependent there was at the ending (`last_job`). Whoever
//! comes next continues it a slice at a time ([`continue_cascades`]): the store's own callers
//! at once, and every runner's sweeper. The invariant: a dependent of a cascade's job with an id
//! in `(after_job, last_job]` has not been handled, and one at or below `after_job` has, and a
//! slice moves `after_job` in the transaction that handles the dependents it passes. So each
//! dependent is handled exactly once, whenever the process dies. Ids are never reused
//! (AUTOINCREMENT), so a job enqueued after the ending, which counted the dependency as it
//! found it, is above `last_job` and never handled twice.

use std::time::Instant;

use crate::store::db::{Connection, OptionalExtension, Sql, params, sql};

use crate::error::Result;
use crate::job::{EventKind, Status};
use crate::metrics::CounterKind;

use super::counter;

use super::Store;
use super::slice::{SLICE, yield_lock};
use super::tx::event;

/// Dependents one ending handles in its own transaction; the rest is a cascade.
pub(super) const ENDING_STEP: usize = 500;

/// Dependents one [`continue_cascades`] slice handles at most.
const CASCADE_SLICE: usize = 2_000;

/// The dependents of one job still to be handled: see the module's docs.
#[derive(Debug, Clone)]
struct Cascade {
    job: i64,
    how: Status,
    root: i64,
    after_job: i64,
    /// None until the cascade is stored: then the last dependent at the ending's commit.
    last_job: Option<i64>,
}

/// Job `id` has just ended in `status` (succeeded, failed or cancelled): a success counts
/// down its dependents' `waiting`; a failure or a cancel cancels every pending job that runs
/// after it, and the jobs after those, down the chain, each with `last_error` naming the
/// dependency and how it ended. At most [`ENDING_STEP`] of them here; the rest is left as a
/// cascade.
pub(super) fn job_ended(conn: &Connection, id: i64, status: Status, now: i64) -> Result<()> {
    let now = conn.now(now)?;
    match status {
        Status::Succeeded | Status::Failed | Status::Cancelled => {
            let start = Cascade {
                job: id,
                how: status,
                root: id,
                after_job: 0,
                last_job: None,
            };
            run(conn, vec![start], ENDING_STEP, None, now)?;
            Ok(())
        }
        Status::Pending | Status::Running => Ok(()),
    }
}

/// Continues the stored cascades, handling at most about [`CASCADE_SLICE`] dependents; returns
/// whether any cascade is left.
pub(super) fn continue_cascades(conn: &Connection, now: i64) -> Result<bool> {
    let now = conn.now(now)?;
    let stored: Vec<Cascade> = {
        let mut stmt = conn.prepare_cached(sql!(
            sqlite: "SELECT job_id, status, root, after_job, last_job FROM cascades
         ORDER BY rowid LIMIT 16",
            postgres: "SELECT job_id, status, root, after_job, last_job FROM cascades
         ORDER BY seq LIMIT 16",
        ))?;
        let rows = stmt.query_map(params![], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, i64>(4)?,
            ))
        })?;
        let mut stored = Vec::new();
        for row in rows {
            let (job, how, root, after_job, last_job) = row?;
            stored.push(Cascade {
                job,
                how: how.parse()?,
                root,
                after_job,
                last_job: Some(last_job),
            });
        }
        stored
    };
    if stored.is_empty() {
        return Ok(false);
    }
    for c in &stored {
        conn.prepare_cached(sql!(
            "DELETE FROM cascades WHERE job_id = ?1 AND status = ?2"
        ))?
        .execute(params![c.job, c.how.as_str()])?;
    }
    // Popped last first: the oldest first.
    let stack = stored.into_iter().rev().collect();
    let until = std::time::Instant::now() + SLICE;
    run(conn, stack, CASCADE_SLICE, Some(until), now)?;
    has_cascades(conn)
}

/// Whether any cascade is left to continue.
pub(super) fn has_cascades(conn: &Connection) -> Result<bool> {
    conn.prepare_cached(sql!("SELECT EXISTS (SELECT 1 FROM cascades)"))?
        .query_row(params![], |r| r.get(0))
}

/// The dependents of job ?1 after job ?2, up to ?3 when it is not NULL, at most ?4 of them.
///
/// On SQLite, two spellings keep the statement from being prepared again at every ending,
/// which SQLite does for a statement whose plan it judged to hang on a parameter's value,
/// whenever that parameter is bound anew (and a cached statement's are cleared after each
/// use): the limit through a subquery (a bare parameter in LIMIT did it: 11% of a runner's
/// instructions, measured), and `+?1` (`after_id = ?1` with `ORDER BY job_id` did it: 1.5% of
/// a runner's CPU with its commands, measured with SQLite 3.54; the plan is the same search of
/// `job_deps_after`).
const DEPENDENTS: &Sql = sql!(
    sqlite: "SELECT job_id FROM job_deps WHERE after_id = +?1 AND job_id > ?2
         AND (?3 IS NULL OR job_id <= ?3)
     ORDER BY job_id LIMIT (SELECT ?4)",
    postgres: "SELECT job_id FROM job_deps WHERE after_id = ?1 AND job_id > ?2
         AND (?3 IS NULL OR job_id <= ?3)
     ORDER BY job_id LIMIT ?4",
);

/// Handles up to `budget` dependents of the cascades on `stack` (and of the jobs that their
/// cancels cancel), and none after `until`, then stores what is left as cascades.
fn run(
    conn: &Connection,
    mut stack: Vec<Cascade>,
    mut budget: usize,
    until: Option<std::time::Instant>,
    now: i64,
) -> Result<()> {
    let now = conn.now(now)?;
    while let Some(mut c) = stack.pop() {
        if budget == 0 {
            store(conn, &mut c)?;
            continue;
        }
        // Read first, then update by id: most jobs have no dependents, and an UPDATE whose
        // rows come from `IN (SELECT ...)` builds a temporary b-tree of them even when there
        // are none. One more than the budget says whether the cascade ends here.
        let dependents: Vec<i64> = {
            let mut stmt = conn.prepare_cached(DEPENDENTS)?;
            let rows = stmt.query_map(
                params![c.job, c.after_job, c.last_job, (budget + 1) as i64],
                |r| r.get(0),
            )?;
            rows.collect::<Result<_>>()?
        };
        let message = if c.job == c.root {
            format!("dependency job {} {}", c.job, c.how)
        } else {
            format!(
                "dependency job {} {} (after job {} failed or was cancelled)",
                c.job, c.how, c.root
            )
        };
        let mut handled = 0;
        for &job in dependents.iter().take(budget) {
            handle(conn, &c, job, &message, now, &mut stack)?;
            c.after_job = job;
            handled += 1;
            budget -= 1;
            if until.is_some_and(|u| std::time::Instant::now() >= u) {
                budget = 0;
                break;
            }
        }
        // Read one more than the budget: the cascade ends here only when all were handled.
        if handled < dependents.len() {
            store(conn, &mut c)?;
        }
    }
    Ok(())
}

/// Handles dependent `job` of cascade `c`; a job it cancels joins `stack`.
fn handle(
    conn: &Connection,
    c: &Cascade,
    job: i64,
    message: &str,
    now: i64,
    stack: &mut Vec<Cascade>,
) -> Result<()> {
    let now = conn.now(now)?;
    if c.how == Status::Succeeded {
        // Whatever the dependent's status: see the module's docs.
        conn.prepare_cached(sql!(
            "UPDATE jobs SET waiting = waiting - 1 WHERE id = ?1 AND waiting > 0"
        ))?
        .execute([job])?;
        return Ok(());
    }
    let cancelled: Option<(i64, String)> = conn
        .prepare_cached(sql!(
            "UPDATE jobs SET status = 'cancelled', completed_at = ?2, last_error = ?3
             WHERE id = ?1 AND status = 'pending'
             RETURNING attempt, queue"
        ))?
        .query_row(params![job, now, message], |r| r.try_into())
        .optional()?;
    if let Some((attempt, queue)) = cancelled {
        event(conn, job, now, EventKind::Cancelled, attempt, message)?;
        // A cancelled job ended, as when an operator cancels it (the metrics' endings).
        counter::bump(conn, CounterKind::JobsEnded, &queue, "cancelled")?;
        stack.push(Cascade {
            job,
            how: Status::Cancelled,
            root: c.root,
            after_job: 0,
            last_job: None,
        });
    }
    Ok(())
}

/// Stores cascade `c` (or moves its `after_job`), with its `last_job` read now, in the
/// transaction of the ending, when it has none yet.
fn store(conn: &Connection, c: &mut Cascade) -> Result<()> {
    let last_job = match c.last_job {
        Some(last) => last,
        None => conn
            .prepare_cached(sql!("SELECT max(job_id) FROM job_deps WHERE after_id = ?1"))?
            .query_row([c.job], |r| r.get::<_, Option<i64>>(0))?
            .unwrap_or(0),
    };
    c.last_job = Some(last_job);
    if c.after_job >= last_job {
        return Ok(());
    }
    conn.prepare_cached(sql!(
        sqlite: "INSERT INTO cascades (job_id, status, root, after_job, last_job)
         VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (job_id, status) DO UPDATE SET root = excluded.root,
             after_job = min(after_job, excluded.after_job),
             last_job = max(last_job, excluded.last_job)",
        postgres: "INSERT INTO cascades (job_id, status, root, after_job, last_job)
         VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (job_id, status) DO UPDATE SET root = excluded.root,
             after_job = least(cascades.after_job, excluded.after_job),
             last_job = greatest(cascades.last_job, excluded.last_job)",
    ))?
    .execute(params![
        c.job,
        c.how.as_str(),
        c.root,
        c.after_job,
        last_job
    ])?;
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
    /// The job is part of a bulk enqueue that has not finished (see [`super::batch`]).
    Enqueuing,
}

/// The `waiting` a job that an operator puts back to pending starts with: its dependencies
/// still pending or running. Returns why it could never run instead, if so: a dependency that
/// failed or was cancelled (the operator retries that one first), or one pruned before it
/// succeeded. A pruned dependency is told apart by the job's own `waiting`, which counts
/// every dependency that has not succeeded whatever the job's status: when it exceeds the
/// count of those still in the file, the difference was pruned unsucceeded. A dependency
/// pruned after it succeeded counts as succeeded.
pub(super) fn unmet(conn: &Connection, id: i64) -> Result<std::result::Result<i64, Unmet>> {
    let mut stmt = conn.prepare_cached(sql!(
        "SELECT d.after_id, p.status FROM job_deps d LEFT JOIN jobs p ON p.id = d.after_id
         WHERE d.job_id = ?1 AND (p.status IS NULL OR p.status != 'succeeded')
         ORDER BY d.after_id"
    ))?;
    let rows = stmt.query_map([id], |r| {
        Ok((r.get::<_, i64>(0)?, r.get::<_, Option<String>>(1)?))
    })?;
    let (mut waiting, mut present_unsucceeded, mut pruned) = (0i64, 0i64, Vec::new());
    for row in rows {
        let (dep, status) = row?;
        if dep < 0 {
            return Ok(Err(Unmet::Enqueuing));
        }
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
            .prepare_cached(sql!("SELECT waiting FROM jobs WHERE id = ?1"))?
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

/// Whether job `id` carries a gate: its batch has not committed yet (or not released it).
pub(super) fn gated(conn: &Connection, id: i64) -> Result<bool> {
    conn.prepare_cached(sql!(
        "SELECT EXISTS (SELECT 1 FROM job_deps WHERE job_id = ?1 AND after_id < 0)"
    ))?
    .query_row([id], |r| r.get(0))
}

impl Store {
    /// Continues the fan-outs that endings left as cascades (see [`dependency`](self)): a success's
    /// dependents counted down, a failure's cancelled, down the chain, in slices that each
    /// hold the write lock for a few tens of milliseconds, until none is left or `deadline`.
    /// Returns whether it did anything. Cheap when there is none: one read.
    pub(crate) fn continue_cascades(&self, now: i64, deadline: Option<Instant>) -> Result<bool> {
        let mut did = false;
        while has_cascades(&self.conn)? {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
            let started = Instant::now();
            did = true;
            if !self.write(|c| continue_cascades(c, now))? {
                break;
            }
            yield_lock(started.elapsed());
        }
        if did {
            // A success's dependents may be ready now.
            self.poke();
        }
        Ok(did)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::Job;
    use crate::store::Store;

    const T0: i64 = 1_700_000_000_000;

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("jobs.db")).unwrap();
        (dir, store)
    }

    fn after(store: &Store, deps: &[i64], n: usize) -> Vec<i64> {
        let jobs: Vec<Job> = (0..n)
            .map(|_| Job::shell("true").after(deps.iter().copied()))
            .collect();
        store.enqueue_many_at(&jobs, T0).unwrap()
    }

    fn count(store: &Store, sql: &str) -> i64 {
        store
            .conn()
            .query_row(sql, params![], |r| r.get(0))
            .unwrap()
    }

    /// Each ending reads its dependents: the statement is prepared once, not at every ending
    /// (SQLite prepares a statement again when a parameter its plan hangs on is bound anew).
    #[test]
    fn the_dependents_statement_is_not_prepared_again_at_each_ending() {
        let (_dir, store) = store();
        for i in 0..20 {
            let id = store.enqueue_at(&Job::shell("true"), T0).unwrap();
            store
                .write(|conn| job_ended(conn, id, Status::Succeeded, T0 + i))
                .unwrap();
        }
        #[allow(irrefutable_let_patterns)] // SQLite's is the only backend without `postgres`
        let crate::store::db::Connection::Sqlite(conn) = store.conn() else {
            unreachable!("a file's store is SQLite's");
        };
        let stmt = conn
            .prepare_cached(crate::store::db::Text::text(
                DEPENDENTS,
                crate::store::db::Dialect::Sqlite,
            ))
            .unwrap();
        assert_eq!(stmt.get_status(rusqlite::StatementStatus::RePrepare), 0);
    }

    #[test]
    fn a_failure_with_many_dependents_cancels_a_step_then_the_rest_exactly_once() {
        let (_dir, store) = store();
        let a = store.enqueue_at(&Job::shell("true"), T0).unwrap();
        let bs = after(&store, &[a], 1_200);
        let c = after(&store, &[bs[0]], 1)[0];
        let d = after(&store, &[bs[1_199]], 1)[0];
        // The ending's own transaction handles one step: the process may die after it.
        store
            .write(|conn| {
                conn.execute(
                    "UPDATE jobs SET status = 'failed', completed_at = ?2 WHERE id = ?1",
                    params![a, T0 + 1],
                )?;
                job_ended(conn, a, Status::Failed, T0 + 1)
            })
            .unwrap();
        let cancelled = "SELECT count(*) FROM jobs WHERE status = 'cancelled'";
        assert_eq!(count(&store, cancelled), ENDING_STEP as i64);
        assert_eq!(count(&store, "SELECT count(*) FROM cascades"), 2);
        assert_eq!(store.job(c).unwrap().status, Status::Pending);

        assert!(store.continue_cascades(T0 + 2, None).unwrap());
        assert_eq!(count(&store, cancelled), 1_202);
        assert_eq!(count(&store, "SELECT count(*) FROM cascades"), 0);
        let events = "SELECT count(*) FROM job_events WHERE kind = 'cancelled'";
        assert_eq!(count(&store, events), 1_202, "each cancelled once");
        let d = store.job(d).unwrap();
        assert_eq!(
            d.last_error.as_deref(),
            Some(
                format!(
                    "dependency job {} cancelled (after job {a} failed or was cancelled)",
                    bs[1_199]
                )
                .as_str()
            )
        );
        assert!(!store.continue_cascades(T0 + 3, None).unwrap());
    }

    #[test]
    fn a_success_with_many_dependents_counts_each_down_exactly_once() {
        let (_dir, store) = store();
        let a = store.enqueue_at(&Job::shell("true"), T0).unwrap();
        let z = store.enqueue_at(&Job::shell("true"), T0).unwrap();
        let bs = after(&store, &[a, z], 1_200);
        store
            .write(|conn| {
                conn.execute(
                    "UPDATE jobs SET status = 'succeeded', completed_at = ?2 WHERE id = ?1",
                    params![a, T0 + 1],
                )?;
                job_ended(conn, a, Status::Succeeded, T0 + 1)
            })
            .unwrap();
        let once = "SELECT count(*) FROM jobs WHERE waiting = 1";
        assert_eq!(count(&store, once), ENDING_STEP as i64);
        // Enqueued after the success, it counts only z: the cascade must not count it down.
        let late = store
            .write(|conn| {
                let job = Job::shell("true").after([a, z]);
                super::super::enqueue::insert_job(conn, &job, T0 + 2)
            })
            .unwrap();
        assert_eq!(store.job(late).unwrap().waiting_for, [z]);
        store.continue_cascades(T0 + 3, None).unwrap();
        assert_eq!(count(&store, once), 1_201);
        assert_eq!(
            count(&store, "SELECT count(*) FROM jobs WHERE waiting != 1"),
            2
        );
        assert_eq!(store.job(bs[1_199]).unwrap().waiting_for, [z]);
    }
}
