//! Leases: claiming jobs, recording the process an attempt started, renewing the leases a
//! runner holds, and recording how an attempt ended (with the backoff before a retry).

#[cfg(doc)]
use crate::error::Error;
use std::collections::HashSet;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use crate::store::db::{Connection, OptionalExtension, Sql, params, sql};

use crate::error::Result;
use crate::job::{ErrorKind, EventKind, Output, Status, duration_ms};
use crate::manners::{DEFAULT_TEMPFAIL_MAX, EX_TEMPFAIL};
use crate::metrics::CounterKind;

use super::Store;
use super::counter;
use super::dependency;
pub(super) use super::ending::Ending;
use super::lost::{LEASE_EXPIRED_PREFIX, lost_verdict};
use super::runners::runner_heartbeat;
use super::tx::event;

mod claim;
pub use claim::{ClaimRequest, Claimed};
#[cfg(test)]
pub(super) use claim::{
    DUE_DEFERRED_SQL, NEXT_DUE_SQL, QUEUE_NEXT_DUE_SQL, claim_sql, queue_head_sql,
};
pub(crate) use claim::{claim, next_due};
mod grouped;
pub(crate) use grouped::finish_group;

/// The process an attempt started, to record under its lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptStart {
    /// The job.
    pub job_id: i64,
    /// The attempt's run token.
    pub run_token: String,
    /// The main process.
    pub pid: i32,
    /// Its process group.
    pub pgid: i32,
    /// Its start time, in clock ticks since boot.
    pub start_time: u64,
    /// The attempt's keeper, the command's parent that outlives the runner (see the
    /// `files` layout): its pid and start time. `None` for an attempt run without one.
    pub keeper: Option<(i32, u64)>,
}

/// Records an attempt's process and its `started` event, under the attempt's lease; false when
/// the lease is gone and nothing was written.
pub(crate) fn record_start(conn: &Connection, s: &AttemptStart, now: i64) -> Result<bool> {
    let now = conn.now(now)?;
    if !set_process(conn, s)? {
        return Ok(false);
    }
    let attempt: i64 = conn
        .prepare_cached(sql!("SELECT attempt FROM jobs WHERE id = ?1"))?
        .query_row([s.job_id], |r| r.get(0))?;
    event(
        conn,
        s.job_id,
        now,
        EventKind::Started,
        attempt,
        &start_detail(s),
    )?;
    Ok(true)
}

/// Writes the attempt's process into its job, fenced by the lease; false when the lease is
/// gone and nothing changed.
fn set_process(conn: &Connection, s: &AttemptStart) -> Result<bool> {
    // No RETURNING: SQLite gathers a RETURNING's rows in a temporary b-tree, which costs more
    // than this whole UPDATE. `record_start` reads the attempt from the row just written.
    let changed = conn
        .prepare_cached(sql!(
            "UPDATE jobs SET pid = ?3, pgid = ?4, proc_start_time = ?5, keeper_pid = ?6,
                 keeper_start_time = ?7
             WHERE id = ?1 AND status = 'running' AND run_token = ?2"
        ))?
        .execute(params![
            s.job_id,
            s.run_token,
            s.pid,
            s.pgid,
            s.start_time as i64,
            s.keeper.map(|(pid, _)| pid),
            s.keeper.map(|(_, start)| start as i64)
        ])?;
    Ok(changed > 0)
}

/// The detail of an attempt's `started` event, in its own row or on its ending's.
fn start_detail(s: &AttemptStart) -> String {
    format!("pid {} pgid {}", s.pid, s.pgid)
}

/// Records an attempt's start and its ending together, as the runner's writer does when both
/// fall in one transaction: the ending's event row carries the start (`start_detail`, read
/// back as a `started` event at the same time), and a success writes the process into the
/// job in its own UPDATE. The history reads as if [`record_start`] and [`finish_attempt`] had
/// run one after the other, in one row and one statement fewer.
pub(crate) fn finish_started(
    conn: &Connection,
    s: &AttemptStart,
    f: &Finish,
    now: i64,
) -> Result<Finished> {
    let now = conn.now(now)?;
    debug_assert!(s.job_id == f.job_id && s.run_token == f.run_token);
    if !f.notes.is_empty() {
        // The notes' events (leaked processes, say) come between the start and the ending:
        // the start keeps a row of its own ahead of them. Rare, so not worth a second path.
        record_start(conn, s, now)?;
        return finish_attempt(conn, f, now);
    }
    if f.ending == Ending::Succeeded {
        return finish_succeeded(conn, f, Some(s), now);
    }
    // Other endings write columns of their own; the process goes in first, under the same
    // fence. Should the lease be gone, the ending finds it gone too, and records no start.
    let held = set_process(conn, s)?;
    finish_with(conn, f, held.then_some(s), now)
}

/// Appends an ending's event; with `start`, the same row records the attempt's start.
fn ending_event(
    conn: &Connection,
    f: &Finish,
    now: i64,
    kind: EventKind,
    attempt: i64,
    detail: &str,
    start: Option<&AttemptStart>,
) -> Result<()> {
    let now = conn.now(now)?;
    let Some(s) = start else {
        return event(conn, f.job_id, now, kind, attempt, detail);
    };
    conn.prepare_cached(sql!(
        "INSERT INTO job_events (job_id, at, kind, attempt, detail, start_detail)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)"
    ))?
    .execute(params![
        f.job_id,
        now,
        kind.as_str(),
        attempt,
        detail,
        start_detail(s)
    ])?;
    Ok(())
}

/// What [`Store::renew`](crate::Store::renew) found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Renewal {
    /// Tokens whose leases were renewed.
    pub renewed: Vec<String>,
    /// Tokens that no longer hold a lease: reclaimed, cancelled or retried under the runner.
    pub lost: Vec<String>,
}

/// A runner's renewal of its leases. Parameters: worker id, now, new expiry, tokens (JSON).
///
/// On PostgreSQL the same rows are locked first in ascending id order (see [`lock_running`]
/// for why), then renewed. A single UPDATE locks its rows in whatever order its plan reads
/// them, which is not the order in which the runner's writer locks the same rows: the two then
/// wait for each other in a circle.
pub(super) const RENEW_SQL: Sql = Sql::new(
    "UPDATE jobs SET heartbeat_at = ?2, lease_expires_at = ?3
     WHERE status = 'running' AND worker_id = ?1
       AND run_token IN (SELECT value FROM json_each(?4))
     RETURNING run_token",
    "WITH mine AS MATERIALIZED (
         SELECT id FROM jobs
         WHERE status = 'running' AND worker_id = ?1
           AND run_token IN (SELECT value FROM json_array_elements_text(?4::json))
         ORDER BY id FOR NO KEY UPDATE)
     UPDATE jobs SET heartbeat_at = ?2, lease_expires_at = ?3
     FROM mine
     WHERE jobs.id = mine.id AND jobs.status = 'running' AND jobs.worker_id = ?1
     RETURNING jobs.run_token",
);

/// The running rows among `?1` (a JSON array of ids), locked in ascending id order: see
/// [`lock_running`].
const LOCK_RUNNING_SQL: Sql = Sql::postgres_only(
    "SELECT id FROM jobs
     WHERE id = ANY (ARRAY(SELECT value::bigint FROM json_array_elements_text(?1::json)))
       AND status = 'running'
     ORDER BY id FOR NO KEY UPDATE",
);

/// The jobs that the endings of `?1` (a JSON array of ids) may release or cancel (the first
/// [`ENDING_STEP`] dependents of each, which is what an ending handles in its own
/// transaction), locked in ascending id order: see [`lock_running`].
///
/// [`ENDING_STEP`]: super::dependency::ENDING_STEP
const LOCK_DEPENDENTS_SQL: Sql = Sql::postgres_only(
    "SELECT id FROM jobs
     WHERE id = ANY (ARRAY(
             SELECT d.job_id FROM json_array_elements_text(?1::json) AS p
             CROSS JOIN LATERAL (SELECT job_id FROM job_deps WHERE after_id = p.value::bigint
                                 ORDER BY job_id LIMIT ?2) AS d))
       AND (waiting > 0 OR status = 'pending')
     ORDER BY id FOR NO KEY UPDATE",
);

/// Locks, on PostgreSQL, the rows of `ids` that are running, in ascending id order, until the
/// caller's transaction ends; nothing on SQLite, whose one writer at a time cannot wait in a
/// circle. A transaction that writes several running jobs (a runner's writer recording starts
/// and endings, a sweeper reclaiming expired leases) calls this first, before it locks
/// anything else: every transaction then takes the running rows it writes in one order, the
/// renewal's ([`RENEW_SQL`]) included, and none of them can wait for another in a circle
/// over those rows. `FOR NO KEY UPDATE` is the lock their UPDATEs take anyway (no key
/// changes): it leaves the `FOR KEY SHARE` of a foreign key's check (an event row inserted
/// for the job) unblocked. docs/postgres.md ("Each promise under concurrency") has the whole
/// order, with what locks the other rows.
pub(crate) fn lock_running(conn: &Connection, ids: &[i64]) -> Result<()> {
    if conn.dialect() == crate::store::db::Dialect::Sqlite || ids.is_empty() {
        return Ok(());
    }
    let list = serde_json::to_string(ids).unwrap_or_default();
    let mut stmt = conn.prepare_cached(&LOCK_RUNNING_SQL)?;
    let mut rows = stmt.query(params![list])?;
    while rows.next()?.is_some() {}
    Ok(())
}

/// Locks, on PostgreSQL, the jobs that the endings of `ids` may release or cancel (their
/// first dependents, those an ending handles itself), in ascending id order; nothing on
/// SQLite. A transaction that records endings calls this right after [`lock_running`], so
/// that two such transactions whose jobs share dependents take them in one order too, however
/// the dependents of one ending interleave with another's. (The dependents of a dependent that
/// an ending cancels, deeper down a chain, are locked as they are met.)
pub(crate) fn lock_dependents(conn: &Connection, ids: &[i64]) -> Result<()> {
    if conn.dialect() == crate::store::db::Dialect::Sqlite || ids.is_empty() {
        return Ok(());
    }
    let list = serde_json::to_string(ids).unwrap_or_default();
    let step = i64::try_from(super::dependency::ENDING_STEP).unwrap_or(i64::MAX);
    let mut stmt = conn.prepare_cached(&LOCK_DEPENDENTS_SQL)?;
    let mut rows = stmt.query(params![list, step])?;
    while rows.next()?.is_some() {}
    Ok(())
}

pub(super) fn renew(
    conn: &Connection,
    worker_id: &str,
    tokens: &[String],
    lease_ttl: Duration,
    now: i64,
) -> Result<Renewal> {
    let now = conn.now(now)?;
    runner_heartbeat(conn, worker_id, now)?;
    if tokens.is_empty() {
        return Ok(Renewal::default());
    }
    let list = serde_json::to_string(tokens).unwrap_or_default();
    let expires = now.saturating_add(duration_ms(lease_ttl));
    let renewed: HashSet<String> = {
        let mut stmt = conn.prepare_cached(&RENEW_SQL)?;
        let rows = stmt.query_map(params![worker_id, now, expires, list], |r| r.get(0))?;
        rows.collect::<Result<_>>()?
    };
    let (renewed, lost) = tokens
        .iter()
        .cloned()
        .partition(|t| renewed.contains(t.as_str()));
    Ok(Renewal { renewed, lost })
}

/// An attempt's ending with what it left behind, for [`Store::finish`](crate::Store::finish).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finish {
    /// The job.
    pub job_id: i64,
    /// The attempt's run token: the fence.
    pub run_token: String,
    /// The attempt number.
    pub attempt: i64,
    /// How it ended.
    pub ending: Ending,
    /// The captured output, if any.
    pub output: Option<Output>,
    /// Extra events to record with the ending (kind, detail), such as leaked processes.
    pub notes: Vec<(EventKind, String)>,
    /// The recovery budget to apply to a [`Ending::Lost`].
    pub max_recovery_attempts: u32,
}

/// What [`Store::finish`](crate::Store::finish) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finished {
    /// The ending was recorded; the job is now in this status.
    Recorded(Status),
    /// The attempt no longer held its lease: nothing changed but a `late_result_discarded`
    /// event.
    Fenced,
    /// The job was cancelled while this attempt ran: the job stays cancelled, and the
    /// attempt's output and an `attempt_stopped` event record how it ended. Not a late
    /// result: it is what the cancel asked for.
    Stopped,
}

/// The wait before retry number `failures` (1 for the first retry), with ±20% jitter: within
/// `wait - wait/5 ..= wait + wait/5` exactly (integer arithmetic: f64 loses the last bits of
/// waits near `i64::MAX`), saturating at `i64::MAX`.
pub(crate) fn backoff_ms(base_ms: i64, max_ms: i64, failures: i64) -> i64 {
    let shift = u32::try_from(failures.saturating_sub(1).clamp(0, 40)).unwrap_or(40);
    let wait = base_ms.saturating_mul(1i64 << shift).min(max_ms).max(0);
    // A fresh random key per call: std's hasher seeds are random, which is all jitter needs.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_i64(wait);
    let fifth = i128::from(wait / 5);
    // 0..=10_000 parts of the jitter's span of two fifths.
    let parts = i128::from(h.finish() % 10_001);
    let jittered = i128::from(wait) - fifth + 2 * fifth * parts / 10_000;
    i64::try_from(jittered).unwrap_or(i64::MAX)
}

pub(crate) fn finish_attempt(conn: &Connection, f: &Finish, now: i64) -> Result<Finished> {
    let now = conn.now(now)?;
    finish_with(conn, f, None, now)
}

/// Records several endings in the caller's transaction, after locking their rows in id order
/// ([`lock_running`]): on PostgreSQL the successes together ([`finish_group`]), the others
/// in the order given.
pub(super) fn finish_many(
    conn: &Connection,
    finishes: &[Finish],
    now: i64,
) -> Result<Vec<Finished>> {
    let now = conn.now(now)?;
    let ids: Vec<i64> = finishes.iter().map(|f| f.job_id).collect();
    lock_running(conn, &ids)?;
    lock_dependents(conn, &ids)?;
    let endings: Vec<(&Finish, Option<&AttemptStart>)> =
        finishes.iter().map(|f| (f, None)).collect();
    finish_group(conn, &endings, now)
}

/// What an ending reads of its job: failed attempts, max attempts, backoff base and cap,
/// recovery count, on_lost, attempt.
type FailureFacts = (i64, i64, i64, i64, i64, String, i64);

/// The job's bound on "try me later" (NULL: the default) and how many it had.
type TempfailFacts = (Option<i64>, i64);

/// [`finish_attempt`], with the event row of a recorded ending carrying `start` when given
/// (see [`finish_started`]).
fn finish_with(
    conn: &Connection,
    f: &Finish,
    start: Option<&AttemptStart>,
    now: i64,
) -> Result<Finished> {
    let now = conn.now(now)?;
    if f.ending == Ending::Succeeded {
        return finish_succeeded(conn, f, start, now);
    }
    let row: Option<(FailureFacts, TempfailFacts)> = conn
        .prepare_cached(sql!(
            "SELECT failed_attempts, max_attempts, backoff_base_ms, backoff_max_ms,
                    recovery_count, on_lost, attempt, tempfail_max, tempfails
             FROM jobs WHERE id = ?1 AND status = 'running' AND run_token = ?2"
        ))?
        .query_row(params![f.job_id, f.run_token], |r| {
            Ok((
                (
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get(6)?,
                ),
                (r.get(7)?, r.get(8)?),
            ))
        })
        .optional()?;
    let Some(((failed, max_attempts, base, cap, recovery, on_lost, attempt), tempfail)) = row
    else {
        return fenced(conn, f, now);
    };
    let facts = counter::Attempt::read(conn, f.job_id)?;
    // Every UPDATE below repeats the fence (`WHERE id = ?1 AND status = 'running' AND
    // run_token = ?2`), though the IMMEDIATE transaction already holds it.
    let (status, kind, detail) = match &f.ending {
        // Taken by the early return above, which needs no SELECT.
        Ending::Succeeded => return finish_succeeded(conn, f, start, now),
        Ending::Failed {
            kind: ErrorKind::Exit,
            exit_code: Some(EX_TEMPFAIL),
            message,
            ..
        } if tempfail.1 < tempfail.0.unwrap_or(i64::from(DEFAULT_TEMPFAIL_MAX)) => {
            // "Try me later": back to pending with its backoff, the attempt given back (the
            // next claim runs the same attempt number) and no failure counted.
            let tempfails = tempfail.1 + 1;
            let wait = backoff_ms(base, cap, tempfails);
            conn.prepare_cached(sql!(
                sqlite: "UPDATE OR FAIL jobs SET status = 'pending', attempt = attempt - 1,
                     tempfails = ?4, scheduled_at = ?3 + ?5,
                     deferred = CASE WHEN ?5 > 0 THEN 1 ELSE 0 END, exit_code = 75,
                     signal = NULL, error_kind = NULL, last_error = ?6, started_at = NULL,
                     completed_at = NULL, heartbeat_at = NULL, lease_expires_at = NULL,
                     run_token = NULL, worker_id = NULL
                     WHERE id = ?1 AND status = 'running' AND run_token = ?2",
                postgres: "UPDATE jobs SET status = 'pending', attempt = attempt - 1,
                     tempfails = ?4, scheduled_at = ?3 + ?5,
                     deferred = CASE WHEN ?5 > 0 THEN 1 ELSE 0 END, exit_code = 75,
                     signal = NULL, error_kind = NULL, last_error = ?6, started_at = NULL,
                     completed_at = NULL, heartbeat_at = NULL, lease_expires_at = NULL,
                     run_token = NULL, worker_id = NULL
                     WHERE id = ?1 AND status = 'running' AND run_token = ?2",
            ))?
            .execute(params![
                f.job_id,
                f.run_token,
                now,
                tempfails,
                wait,
                message
            ])?;
            let bound = tempfail.0.unwrap_or(i64::from(DEFAULT_TEMPFAIL_MAX));
            let detail = format!(
                "try later: exited 75 (EX_TEMPFAIL); retry in {:.1}s, no attempt spent \
                 (try later {tempfails} of {bound})",
                wait as f64 / 1000.0
            );
            (Status::Pending, EventKind::TryLater, detail)
        }
        Ending::Failed {
            kind,
            exit_code,
            signal,
            message,
        } => {
            let failed = failed + 1;
            let retry = *kind != ErrorKind::Spawn && failed < max_attempts;
            if retry {
                let wait = backoff_ms(base, cap, failed);
                conn.prepare_cached(sql!(
                    sqlite: "UPDATE OR FAIL jobs SET status = 'pending', failed_attempts = ?4,
                         scheduled_at = ?3 + ?5, deferred = CASE WHEN ?5 > 0 THEN 1 ELSE 0 END, exit_code = ?6, signal = ?7, error_kind = ?8,
                         last_error = ?9, started_at = NULL, completed_at = NULL,
                         heartbeat_at = NULL, lease_expires_at = NULL, run_token = NULL,
                         worker_id = NULL WHERE id = ?1 AND status = 'running' AND run_token = ?2",
                    postgres: "UPDATE jobs SET status = 'pending', failed_attempts = ?4,
                         scheduled_at = ?3 + ?5, deferred = CASE WHEN ?5 > 0 THEN 1 ELSE 0 END, exit_code = ?6, signal = ?7, error_kind = ?8,
                         last_error = ?9, started_at = NULL, completed_at = NULL,
                         heartbeat_at = NULL, lease_expires_at = NULL, run_token = NULL,
                         worker_id = NULL WHERE id = ?1 AND status = 'running' AND run_token = ?2",
                ))?
                .execute(params![
                    f.job_id,
                    f.run_token,
                    now,
                    failed,
                    wait,
                    exit_code,
                    signal,
                    kind.as_str(),
                    message
                ])?;
                let detail = format!(
                    "{message}; retry in {:.1}s (failed {failed} of {max_attempts} attempts)",
                    wait as f64 / 1000.0
                );
                (Status::Pending, EventKind::RetryScheduled, detail)
            } else {
                conn.prepare_cached(sql!(
                    sqlite: "UPDATE OR FAIL jobs SET status = 'failed', failed_attempts = ?4, completed_at = ?3,
                         exit_code = ?5, signal = ?6, error_kind = ?7, last_error = ?8,
                         lease_expires_at = NULL, heartbeat_at = ?3 WHERE id = ?1 AND status = 'running' AND run_token = ?2",
                    postgres: "UPDATE jobs SET status = 'failed', failed_attempts = ?4, completed_at = ?3,
                         exit_code = ?5, signal = ?6, error_kind = ?7, last_error = ?8,
                         lease_expires_at = NULL, heartbeat_at = ?3 WHERE id = ?1 AND status = 'running' AND run_token = ?2",
                ))?
                .execute(params![
                    f.job_id,
                    f.run_token,
                    now,
                    failed,
                    exit_code,
                    signal,
                    kind.as_str(),
                    message
                ])?;
                (Status::Failed, EventKind::Failed, message.clone())
            }
        }
        Ending::Lost { message } | Ending::Stopped { message } => {
            let recovery = recovery + 1;
            let message = format!("{LEASE_EXPIRED_PREFIX}{message}");
            let (status, message) =
                lost_verdict(&on_lost, recovery, f.max_recovery_attempts, message);
            conn.prepare_cached(sql!(
                sqlite: "UPDATE OR FAIL jobs SET status = ?4, recovery_count = ?5, last_error = ?6,
                     scheduled_at = CASE WHEN ?4 = 'pending' THEN ?3 ELSE scheduled_at END,
                     completed_at = CASE WHEN ?4 = 'failed' THEN ?3 END,
                     error_kind = CASE WHEN ?4 = 'failed' THEN 'lost' END,
                     run_token = CASE WHEN ?4 = 'pending' THEN NULL ELSE run_token END,
                     worker_id = CASE WHEN ?4 = 'pending' THEN NULL ELSE worker_id END,
                     started_at = CASE WHEN ?4 = 'pending' THEN NULL ELSE started_at END,
                     lease_expires_at = NULL,
                     heartbeat_at = CASE WHEN ?4 = 'pending' THEN NULL ELSE ?3 END WHERE id = ?1 AND status = 'running' AND run_token = ?2",
                postgres: "UPDATE jobs SET status = ?4, recovery_count = ?5, last_error = ?6,
                     scheduled_at = CASE WHEN ?4 = 'pending' THEN ?3 ELSE scheduled_at END,
                     completed_at = CASE WHEN ?4 = 'failed' THEN ?3 END,
                     error_kind = CASE WHEN ?4 = 'failed' THEN 'lost' END,
                     run_token = CASE WHEN ?4 = 'pending' THEN NULL ELSE run_token END,
                     worker_id = CASE WHEN ?4 = 'pending' THEN NULL ELSE worker_id END,
                     started_at = CASE WHEN ?4 = 'pending' THEN NULL ELSE started_at END,
                     lease_expires_at = NULL,
                     heartbeat_at = CASE WHEN ?4 = 'pending' THEN NULL ELSE ?3 END WHERE id = ?1 AND status = 'running' AND run_token = ?2",
            ))?
            .execute(params![
                f.job_id,
                f.run_token,
                now,
                status.as_str(),
                recovery,
                message
            ])?;
            let kind = if status == Status::Failed {
                EventKind::Lost
            } else {
                EventKind::Reclaimed
            };
            (status, kind, message)
        }
        Ending::Interrupted { message } => {
            conn.prepare_cached(sql!(
                sqlite: "UPDATE OR FAIL jobs SET status = 'pending', scheduled_at = ?3, last_error = ?4,
                     started_at = NULL, completed_at = NULL, heartbeat_at = NULL,
                     lease_expires_at = NULL, run_token = NULL, worker_id = NULL WHERE id = ?1 AND status = 'running' AND run_token = ?2",
                postgres: "UPDATE jobs SET status = 'pending', scheduled_at = ?3, last_error = ?4,
                     started_at = NULL, completed_at = NULL, heartbeat_at = NULL,
                     lease_expires_at = NULL, run_token = NULL, worker_id = NULL WHERE id = ?1 AND status = 'running' AND run_token = ?2",
            ))?
            .execute(params![f.job_id, f.run_token, now, message])?;
            (Status::Pending, EventKind::Interrupted, message.clone())
        }
    };
    finish_rest(conn, f, now, attempt)?;
    ending_event(conn, f, now, kind, attempt, &detail, start)?;
    counter::attempt_ended(conn, facts.as_ref(), &f.ending, status, now)?;
    dependency::job_ended(conn, f.job_id, status, now)?;
    Ok(Finished::Recorded(status))
}

/// A successful ending: the fenced UPDATE needs no read before it; no row changed means the
/// lease is gone, and only the fenced event is written. With `start`, the same UPDATE writes
/// the attempt's process and the ending's event row records the start.
fn finish_succeeded(
    conn: &Connection,
    f: &Finish,
    start: Option<&AttemptStart>,
    now: i64,
) -> Result<Finished> {
    let now = conn.now(now)?;
    // No RETURNING (see `set_process`): the success leaves attempt, queue, scheduled_at and
    // started_at as they were, so what the metrics need of the attempt is read after it.
    let changed = match start {
        None => conn
            .prepare_cached(
                sql!(
                    sqlite: "UPDATE OR FAIL jobs SET status = 'succeeded', completed_at = ?3, exit_code = 0,
                     signal = NULL, error_kind = NULL, lease_expires_at = NULL, heartbeat_at = ?3
                 WHERE id = ?1 AND status = 'running' AND run_token = ?2",
                    postgres: "UPDATE jobs SET status = 'succeeded', completed_at = ?3, exit_code = 0,
                     signal = NULL, error_kind = NULL, lease_expires_at = NULL, heartbeat_at = ?3
                 WHERE id = ?1 AND status = 'running' AND run_token = ?2",
                ),
            )?
            .execute(params![f.job_id, f.run_token, now])?,
        Some(s) => conn
            .prepare_cached(
                sql!(
                    sqlite: "UPDATE OR FAIL jobs SET status = 'succeeded', completed_at = ?3, exit_code = 0,
                     signal = NULL, error_kind = NULL, lease_expires_at = NULL, heartbeat_at = ?3,
                     pid = ?4, pgid = ?5, proc_start_time = ?6, keeper_pid = ?7,
                     keeper_start_time = ?8
                 WHERE id = ?1 AND status = 'running' AND run_token = ?2",
                    postgres: "UPDATE jobs SET status = 'succeeded', completed_at = ?3, exit_code = 0,
                     signal = NULL, error_kind = NULL, lease_expires_at = NULL, heartbeat_at = ?3,
                     pid = ?4, pgid = ?5, proc_start_time = ?6, keeper_pid = ?7,
                     keeper_start_time = ?8
                 WHERE id = ?1 AND status = 'running' AND run_token = ?2",
                ),
            )?
            .execute(params![
                f.job_id,
                f.run_token,
                now,
                s.pid,
                s.pgid,
                s.start_time as i64,
                s.keeper.map(|(pid, _)| pid),
                s.keeper.map(|(_, start)| start as i64)
            ])?,
    };
    if changed == 0 {
        return fenced(conn, f, now);
    }
    let (attempt, facts): (i64, counter::Attempt) = conn
        .prepare_cached(sql!(
            "SELECT attempt, queue, scheduled_at, started_at FROM jobs WHERE id = ?1"
        ))?
        .query_row([f.job_id], |r| {
            Ok((
                r.get(0)?,
                counter::Attempt::new(r.get(1)?, r.get(2)?, r.get(3)?),
            ))
        })?;
    finish_rest(conn, f, now, attempt)?;
    ending_event(conn, f, now, EventKind::Succeeded, attempt, "exit 0", start)?;
    counter::attempt_ended(conn, Some(&facts), &f.ending, Status::Succeeded, now)?;
    dependency::job_ended(conn, f.job_id, Status::Succeeded, now)?;
    Ok(Finished::Recorded(Status::Succeeded))
}

/// An ending whose attempt no longer holds its lease: nothing changes but the
/// `late_result_discarded` event; or, for the attempt a cancel stopped, its output and an
/// `attempt_stopped` event.
fn fenced(conn: &Connection, f: &Finish, now: i64) -> Result<Finished> {
    let now = conn.now(now)?;
    let what = match &f.ending {
        Ending::Succeeded => "exit 0",
        Ending::Failed { message, .. } => message,
        Ending::Lost { message }
        | Ending::Interrupted { message }
        | Ending::Stopped { message } => message,
    };
    // A job pruned since its attempt lost the lease (a short keep rule, another process's
    // prune) has no row left to hang the event on: the result is discarded all the same.
    let Some(stopped_by_cancel) = conn
        .prepare_cached(
            sql!(
                sqlite: "SELECT status = 'cancelled' AND run_token IS ?2 AND attempt = ?3
             FROM jobs WHERE id = ?1",
                postgres: "SELECT status = 'cancelled' AND run_token IS NOT DISTINCT FROM ?2 AND attempt = ?3
             FROM jobs WHERE id = ?1",
            ),
        )?
        .query_row(params![f.job_id, f.run_token, f.attempt], |r| {
            r.get::<_, bool>(0)
        })
        .optional()?
    else {
        counter::bump(conn, CounterKind::LateResultsDiscarded, "", "")?;
        return Ok(Finished::Fenced);
    };
    if stopped_by_cancel {
        // The cancel kept this attempt's token on the row: this is the ending it asked for.
        finish_rest(conn, f, now, f.attempt)?;
        let detail = format!("the cancelled attempt ended: {what}");
        event(
            conn,
            f.job_id,
            now,
            EventKind::AttemptStopped,
            f.attempt,
            &detail,
        )?;
        return Ok(Finished::Stopped);
    }
    counter::bump(conn, CounterKind::LateResultsDiscarded, "", "")?;
    let mut detail = format!("attempt no longer holds its lease; discarded result: {what}");
    for (kind, note) in &f.notes {
        detail.push_str(&format!("; {kind}: {note}"));
    }
    event(
        conn,
        f.job_id,
        now,
        EventKind::LateResultDiscarded,
        f.attempt,
        &detail,
    )?;
    Ok(Finished::Fenced)
}

/// What every recorded ending writes after its UPDATE and before its own event: the output
/// (if any) and the notes' events.
fn finish_rest(conn: &Connection, f: &Finish, now: i64, attempt: i64) -> Result<()> {
    let now = conn.now(now)?;
    // An attempt that wrote nothing leaves no row: `output` then finds none, which reads as
    // empty, and a stream of quiet jobs costs one write less each.
    if let Some(out) = f
        .output
        .as_ref()
        .filter(|o| !o.stdout.is_empty() || !o.stderr.is_empty())
    {
        conn.prepare_cached(sql!(
            "INSERT INTO job_output
                 (job_id, attempt, stdout, stderr, stdout_truncated, stderr_truncated)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)"
        ))?
        .execute(params![
            f.job_id,
            attempt,
            out.stdout,
            out.stderr,
            out.stdout_truncated,
            out.stderr_truncated
        ])?;
    }
    for (kind, note) in &f.notes {
        event(conn, f.job_id, now, *kind, attempt, note)?;
    }
    Ok(())
}

/// The statements of this file that are `const` items or built at run time (with
/// representative inputs), for the test that prepares every statement (`store/statements.rs`).
#[cfg(test)]
pub(super) fn statements() -> Vec<(&'static str, Sql)> {
    let mut all = claim::statements();
    all.extend([
        ("RENEW_SQL", RENEW_SQL),
        ("LOCK_RUNNING_SQL", LOCK_RUNNING_SQL),
        ("LOCK_DEPENDENTS_SQL", LOCK_DEPENDENTS_SQL),
    ]);
    all.extend(grouped::statements());
    all
}

#[cfg(test)]
pub(crate) mod tests;

impl Store {
    /// Claims up to `limit` ready jobs for `worker_id`, taking a lease of `lease_ttl` on each.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written.
    pub fn claim(&self, req: &ClaimRequest<'_>, now: i64) -> Result<Vec<Claimed>> {
        self.write(|c| claim(c, req, now))
    }

    /// Records the process an attempt started, if the caller still holds the attempt's lease.
    /// Returns false (and changes nothing) when it does not.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written.
    pub fn record_start(&self, start: &AttemptStart, now: i64) -> Result<bool> {
        self.write(|c| record_start(c, start, now))
    }

    /// Renews, in one statement, the leases that `worker_id` holds under `tokens`, and reports
    /// the tokens that no longer hold one.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written.
    pub fn renew(
        &self,
        worker_id: &str,
        tokens: &[String],
        lease_ttl: Duration,
        now: i64,
    ) -> Result<Renewal> {
        self.write(|c| renew(c, worker_id, tokens, lease_ttl, now))
    }

    /// Records how an attempt ended, fenced by its run token.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written.
    pub fn finish(&self, finish: &Finish, now: i64) -> Result<Finished> {
        let finished = self.write(|c| finish_attempt(c, finish, now))?;
        self.continue_cascades(now, None)?;
        Ok(finished)
    }

    /// Records several attempts' endings in one transaction, as a runner's writer does, in
    /// the order given; each is fenced by its run token as [`Store::finish`] is. Returns what
    /// each did, in the same order. Nothing is recorded when one of them cannot be written.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written.
    pub fn finish_many(&self, finishes: &[Finish], now: i64) -> Result<Vec<Finished>> {
        let finished = self.write(|c| finish_many(c, finishes, now))?;
        self.continue_cascades(now, None)?;
        Ok(finished)
    }
}
