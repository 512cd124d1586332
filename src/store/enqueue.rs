//! Enqueueing: a job's row, its dependencies and its `enqueued` event, and the unique-key
//! check before it.

use crate::store::db::{Connection, OptionalExtension, Sql, params, sql};

use crate::error::{Error, Result};
use crate::job::{EventKind, Job, Status};
use crate::schedule::utc_text;

#[cfg(doc)]
use super::ManualClock;
use super::Store;
use super::counter;
use super::dependency::gated;
use super::tx::{Serialise, event, serialise};

/// What an enqueue did: the job's id, and whether it was a duplicate (an existing job with
/// the same unique key, whose id this is, and nothing was written).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Enqueued {
    /// The new job's id, or the matching job's when `duplicate`.
    pub id: i64,
    /// True when the job's unique key matched an existing job and nothing was enqueued.
    pub duplicate: bool,
}

/// The schedule slot a job is enqueued for.
#[derive(Debug, Clone, Copy)]
pub(super) struct Slot<'a> {
    pub schedule: &'a str,
    pub at: i64,
}

pub(super) fn insert_job(conn: &Connection, job: &Job, now: i64) -> Result<i64> {
    let now = conn.now(now)?;
    Ok(enqueue(conn, job, now, None)?.id)
}

/// Enqueues `job` unless its unique key matches a job; the caller's IMMEDIATE transaction
/// makes the check and the insert one step for every other connection.
pub(super) fn enqueue(
    conn: &Connection,
    job: &Job,
    now: i64,
    slot: Option<Slot<'_>>,
) -> Result<Enqueued> {
    let now = conn.now(now)?;
    if let Some(key) = job.unique_key_name()
        && let Some(id) = matching(conn, key, job.unique_window_ms(), now)?
    {
        return Ok(Enqueued {
            id,
            duplicate: true,
        });
    }
    let id = insert_row(conn, job, now, slot)?;
    insert_deps(conn, id, job.dependencies())?;
    let detail = match slot {
        None => job.queue_name().to_string(),
        Some(s) => format!(
            "{}; schedule {}, slot {}",
            job.queue_name(),
            s.schedule,
            utc_text(s.at)
        ),
    };
    event(conn, id, now, EventKind::Enqueued, 0, &detail)?;
    counter::enqueued(conn, job.queue_name(), 1)?;
    Ok(Enqueued {
        id,
        duplicate: false,
    })
}

/// The newest job of a unique key that is unfinished, or created after a time when that is
/// not NULL. Parameters: key, the time.
pub(super) const MATCHING_SQL: Sql = Sql::same(
    "SELECT id FROM jobs WHERE unique_key = ?1
         AND (status IN ('pending', 'running') OR (?2 IS NOT NULL AND created_at > ?2))
     ORDER BY id DESC LIMIT 1",
);

/// The newest job that `key` matches at `now`: an unfinished one, or with a window, one
/// created within it.
fn matching(conn: &Connection, key: &str, window_ms: Option<i64>, now: i64) -> Result<Option<i64>> {
    let now = conn.now(now)?;
    serialise(conn, Serialise::UniqueKey(key))?;
    let since = window_ms.map(|w| now.saturating_sub(w));
    conn.prepare_cached(&MATCHING_SQL)?
        .query_row(params![key, since], |r| r.get(0))
        .optional()
}

/// Enqueues `job` for a slice of a bulk enqueue ([`super::batch`]): the matching job's id
/// and false when its unique key matches one; else its row and dependencies, and true. Its
/// event, its count and its gate are the slice's, written for all its rows at once.
pub(super) fn insert_gated(conn: &Connection, job: &Job, now: i64) -> Result<(i64, bool)> {
    let now = conn.now(now)?;
    if let Some(key) = job.unique_key_name()
        && let Some(id) = matching(conn, key, job.unique_window_ms(), now)?
    {
        return Ok((id, false));
    }
    let id = insert_row(conn, job, now, None)?;
    insert_deps(conn, id, job.dependencies())?;
    Ok((id, true))
}

/// Jobs one [`GROUPED_INSERT_SQL`] takes at most.
pub(super) const GROUPED_STATEMENT: usize = 100;

/// Plain jobs enqueued together on PostgreSQL: `?1` a JSON array of records (`n` the job's
/// place in the list, then its columns), `?2` now. Each job's id is drawn from the table's
/// sequence in list order before its row is written, so the statement returns every id by `n`
/// (an INSERT's RETURNING has no promised order), ascending in list order as one INSERT a row
/// gave them; with each row its `enqueued` event. The count trigger counts each row.
const GROUPED_INSERT_SQL: Sql = Sql::postgres_only(
    "WITH f AS MATERIALIZED (
         SELECT f.*, nextval((SELECT pg_get_serial_sequence('jobs', 'id'))::regclass) AS id
         FROM json_to_recordset(?1::json) AS f(
             n bigint, queue text, argv text, env text, cwd text, priority bigint,
             max_attempts bigint, backoff_base_ms bigint, backoff_max_ms bigint, on_lost text,
             timeout_ms bigint, idle_timeout_ms bigint, scheduled_at bigint, name text,
             conditions bigint, when_lost text, limits text, tempfail_max bigint)
         ORDER BY f.n),
     inserted AS (
         INSERT INTO jobs (id, queue, argv, env, cwd, priority, status, max_attempts,
             backoff_base_ms, backoff_max_ms, on_lost, timeout_ms, idle_timeout_ms,
             created_at, scheduled_at, deferred, name, conditions, when_lost, limits,
             tempfail_max)
         SELECT id, queue, argv, env, cwd, priority, 'pending', max_attempts, backoff_base_ms,
             backoff_max_ms, on_lost, timeout_ms, idle_timeout_ms, ?2, scheduled_at,
             CASE WHEN scheduled_at > ?2 THEN 1 ELSE 0 END, name, conditions, when_lost, limits,
             tempfail_max
         FROM f ORDER BY id
         RETURNING id),
     logged AS (
         INSERT INTO job_events (job_id, at, kind, attempt, detail)
         SELECT id, ?2, 'enqueued', 0, queue FROM f ORDER BY id)
     SELECT f.n, f.id, (SELECT count(*) FROM inserted) FROM f ORDER BY f.n",
);

/// Whether a job of a bulk enqueue on PostgreSQL may be written by [`GROUPED_INSERT_SQL`]: one
/// with no unique key (whose check takes a lock and may find a match) and no dependencies
/// (whose rows are locked and checked one by one).
pub(super) fn groupable(job: &Job) -> bool {
    job.unique_key_name().is_none() && job.dependencies().is_empty()
}

/// Writes `jobs` (at most [`GROUPED_STATEMENT`], each [`groupable`]) in the caller's
/// transaction on PostgreSQL with one statement; returns their ids in order.
pub(super) fn insert_grouped(conn: &Connection, jobs: &[Job], now: i64) -> Result<Vec<i64>> {
    let now = conn.now(now)?;
    let records: Vec<serde_json::Value> = jobs
        .iter()
        .enumerate()
        .map(|(n, job)| {
            let f = job.fields();
            serde_json::json!({
                "n": n, "queue": f.queue, "argv": f.argv, "env": f.env, "cwd": f.cwd,
                "priority": f.priority, "max_attempts": f.max_attempts,
                "backoff_base_ms": f.backoff_base_ms, "backoff_max_ms": f.backoff_max_ms,
                "on_lost": f.on_lost, "timeout_ms": f.timeout_ms,
                "idle_timeout_ms": f.idle_timeout_ms, "scheduled_at": job.scheduled_at(now),
                "name": f.name, "conditions": f.conditions, "when_lost": f.when_lost,
                "limits": f.limits, "tempfail_max": f.tempfail_max,
            })
        })
        .collect();
    let list = serde_json::Value::Array(records).to_string();
    let mut stmt = conn.prepare_cached(&GROUPED_INSERT_SQL)?;
    let rows = stmt.query_map(params![list, now], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, i64>(2)?,
        ))
    })?;
    let mut ids = Vec::with_capacity(jobs.len());
    for row in rows {
        let (n, id, inserted) = row?;
        if usize::try_from(n).ok() != Some(ids.len())
            || usize::try_from(inserted).ok() != Some(jobs.len())
        {
            return Err(Error::io(
                "a grouped enqueue did not write one row a job",
                std::io::Error::other(format!("{} jobs, {inserted} rows", jobs.len())),
            ));
        }
        ids.push(id);
    }
    if ids.len() != jobs.len() {
        return Err(Error::io(
            "a grouped enqueue did not return one id a job",
            std::io::Error::other(format!("{} jobs, {} ids", jobs.len(), ids.len())),
        ));
    }
    Ok(ids)
}

/// Inserts a job's row without its event (nor its count: see [`counter::enqueued`]). A
/// slot's job is ready at its slot. A job due after `now` is written deferred: out of the
/// claim indexes until a claim promotes it (see `ready.rs`).
fn insert_row(conn: &Connection, job: &Job, now: i64, slot: Option<Slot<'_>>) -> Result<i64> {
    let now = conn.now(now)?;
    let f = job.fields();
    let scheduled_at = match slot {
        Some(s) => s.at,
        None => job.scheduled_at(now),
    };
    conn.prepare_cached(sql!(
        "INSERT INTO jobs (queue, argv, env, cwd, priority, status, max_attempts,
             backoff_base_ms, backoff_max_ms, on_lost, timeout_ms, idle_timeout_ms,
             created_at, scheduled_at, unique_key, schedule, slot_at, deferred, name,
             conditions, when_lost, limits, tempfail_max)
         VALUES (?1, ?2, ?3, ?4, ?5, 'pending', ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,
                 CASE WHEN ?13 > ?12 THEN 1 ELSE 0 END, ?17, ?18, ?19, ?20, ?21)
         RETURNING id"
    ))?
    .query_row(
        params![
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
            f.unique_key,
            slot.map(|s| s.schedule),
            slot.map(|s| s.at),
            f.name,
            f.conditions,
            f.when_lost,
            f.limits,
            f.tempfail_max,
        ],
        |r| r.get(0),
    )
}

/// Records that job `id` runs after each of `after`, and counts those not yet succeeded in its
/// `waiting` column. Refuses (and the caller's transaction then writes nothing) an unknown id,
/// the job itself, and a job that already failed or was cancelled: the new job could never
/// run; and a job of a bulk enqueue that has not finished (see [`super::batch`]), which may
/// still be deleted. Cycles cannot arise: a job can only name jobs that exist before it.
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
        serialise(conn, Serialise::Job(dep))?;
        let status: Option<String> = conn
            .prepare_cached(sql!("SELECT status FROM jobs WHERE id = ?1"))?
            .query_row([dep], |r| r.get(0))
            .optional()?;
        let Some(status) = status else {
            return Err(refuse("no such job"));
        };
        if gated(conn, dep)? {
            return Err(refuse(
                "it is part of a bulk enqueue that has not finished (try again once it has)",
            ));
        }
        match status.parse::<Status>()? {
            Status::Succeeded => {}
            Status::Pending | Status::Running => waiting += 1,
            s @ (Status::Failed | Status::Cancelled) => {
                return Err(refuse(&format!(
                    "it is {s}, so this job could never run (retry it first)"
                )));
            }
        }
        conn.prepare_cached(sql!(
            sqlite: "INSERT OR IGNORE INTO job_deps (job_id, after_id) VALUES (?1, ?2)",
            postgres: "INSERT INTO job_deps (job_id, after_id) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
        ))?
            .execute(params![id, dep])?;
    }
    if waiting > 0 {
        conn.prepare_cached(sql!("UPDATE jobs SET waiting = ?2 WHERE id = ?1"))?
            .execute(params![id, waiting])?;
    }
    Ok(())
}

/// The statements of this file that are `const` items or built at run time (with
/// representative inputs), for the test that prepares every statement (`store/statements.rs`).
#[cfg(test)]
pub(super) fn statements() -> Vec<(&'static str, Sql)> {
    vec![
        ("MATCHING_SQL", MATCHING_SQL),
        ("GROUPED_INSERT_SQL", GROUPED_INSERT_SQL),
    ]
}

impl Store {
    /// Enqueues one job; returns its id. A job whose [`Job::unique_key`] matches an existing
    /// job creates nothing and returns that job's id ([`Store::enqueue_unique`] also says so).
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] for a job that cannot run (an empty command, zero attempts, a bad
    /// variable name), and [`Error::Sqlite`] when the database cannot be written.
    pub fn enqueue(&self, job: &Job) -> Result<i64> {
        self.enqueue_at(job, self.now())
    }

    /// [`Store::enqueue`] at `now` rather than the store's clock: for a test of a boundary in
    /// time that passes each time rather than moving a [`ManualClock`].
    ///
    /// # Errors
    ///
    /// As [`Store::enqueue`].
    pub fn enqueue_at(&self, job: &Job, now: i64) -> Result<i64> {
        job.validate_at(now)?;
        let id = self.write(|c| insert_job(c, job, now))?;
        self.poke();
        Ok(id)
    }

    /// Enqueues one job and says whether it was a duplicate: a job with a
    /// [`Job::unique_key`] that matches a pending or running job of that key (or, with a
    /// [`Job::unique_window`], any job of that key created within the window) creates nothing
    /// and returns that job's id. The check and the insert are one IMMEDIATE transaction, so
    /// concurrent enqueues from any number of threads and processes create one job.
    /// [`Store::enqueue`] does the same and returns only the id.
    ///
    /// # Errors
    ///
    /// As [`Store::enqueue`].
    pub fn enqueue_unique(&self, job: &Job) -> Result<Enqueued> {
        self.enqueue_unique_at(job, self.now())
    }

    /// [`Store::enqueue_unique`] at `now` rather than the store's clock.
    ///
    /// # Errors
    ///
    /// As [`Store::enqueue`].
    pub fn enqueue_unique_at(&self, job: &Job, now: i64) -> Result<Enqueued> {
        job.validate_at(now)?;
        let enqueued = self.write(|c| enqueue(c, job, now, None))?;
        if !enqueued.duplicate {
            self.poke();
        }
        Ok(enqueued)
    }
}
