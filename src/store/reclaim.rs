//! Reclaiming lost attempts (expired leases, missing lease metadata, dead runners) and the
//! teardown markers that keep a reclaimed job from running again before its lost attempt's
//! processes are gone.

#[cfg(doc)]
use crate::error::Error;
use std::time::Duration;

use crate::store::db::{Connection, OptionalExtension, Sql, params, sql};

use crate::error::Result;
use crate::job::{EventKind, Output, Status};
use crate::metrics::CounterKind;

use super::Store;
use super::counter;
use super::dependency;
use super::ending::Ending;
use super::lost::{LEASE_EXPIRED_PREFIX, LEASE_MISSING_PREFIX, lost_verdict};
use super::runners::Namespace;
use super::tx::event;

/// What a sweeper asks of [`Store::reclaim`](crate::Store::reclaim).
#[derive(Clone)]
pub struct ReclaimRequest<'a> {
    /// The recovery budget.
    pub max_recovery_attempts: u32,
    /// At most this many reclaims; 0 disables reclaiming.
    pub batch: u32,
    /// Never reclaim this runner's jobs: the caller's own, which it renews itself.
    pub exclude_worker: Option<&'a str>,
    /// With `exclude_worker`: the run tokens that runner still holds (`None`: all of its
    /// jobs are excluded). Its other expired leases are reclaimed as anyone's: an ending it
    /// gave up on left its job running under it, and nobody would renew or end that lease.
    pub held_tokens: Option<&'a [String]>,
    /// Runners known to be dead, with the evidence: their running jobs are reclaimed at once.
    pub dead_workers: &'a [(String, String)],
    /// Reclaim expired leases (false while a runner settles after a clock jump: only dead
    /// runners' jobs and lease-less rows are reclaimed then).
    pub expired: bool,
    /// Judges each attempt of a runner in `dead_workers` that ran under a keeper, before it
    /// is reclaimed: its keeper may still run it (adopt it) or may have left its outcome
    /// (record that). `None`: every such attempt is reclaimed as any other.
    pub keepers: Option<&'a dyn Fn(&KeptAttempt) -> KeptVerdict>,
    /// The lease an adopted attempt gets, held by `exclude_worker`.
    pub lease_ttl: Duration,
}

impl std::fmt::Debug for ReclaimRequest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReclaimRequest")
            .field("max_recovery_attempts", &self.max_recovery_attempts)
            .field("batch", &self.batch)
            .field("exclude_worker", &self.exclude_worker)
            .field("held_tokens", &self.held_tokens)
            .field("dead_workers", &self.dead_workers)
            .field("expired", &self.expired)
            .field("keepers", &self.keepers.map(|_| "a judge"))
            .field("lease_ttl", &self.lease_ttl)
            .finish()
    }
}

/// A dead runner's running attempt that ran under a keeper, for
/// [`ReclaimRequest::keepers`] to judge.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeptAttempt {
    /// The job.
    pub job_id: i64,
    /// The attempt.
    pub attempt: i64,
    /// Its run token.
    pub run_token: String,
    /// The dead runner that held it.
    pub worker_id: String,
    /// The job's queue.
    pub queue: String,
    /// The command's pid, which is its process group.
    pub pgid: Option<i32>,
    /// The command's start time.
    pub start_time: Option<u64>,
    /// The keeper's pid and start time (clock ticks since boot), as recorded with the
    /// attempt's start; `None` when its runner died before it recorded them (the keeper is
    /// then found by its run token).
    pub keeper: Option<(i32, u64)>,
    /// When the attempt was claimed (ms since the epoch, by the database's clock): its timeout
    /// runs from here.
    pub started_at: Option<i64>,
    /// How long the attempt had run when it was read: `started_at` taken from the database's
    /// time in the same transaction, so on one clock (the server's on PostgreSQL, whatever this
    /// host's clock says). A runner that follows it counts on from here by its own monotonic
    /// clock.
    pub age: Option<Duration>,
    /// The job's timeout.
    pub timeout: Option<Duration>,
    /// The job's idle timeout.
    pub idle_timeout: Option<Duration>,
}

/// What to do with a [`KeptAttempt`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeptVerdict {
    /// Its keeper is alive, verified: the lease moves to the sweeping runner, which follows the
    /// attempt to its end (an `adopted` event).
    Adopt,
    /// Its keeper wrote how the command ended: that is recorded (an `outcome_recovered`
    /// event), as the dead runner would have, and the command does not run again.
    Recovered {
        /// The ending the keeper saw.
        ending: Ending,
        /// The output's tails, read from the attempt's files.
        output: Option<Output>,
        /// In words, for the event: what the keeper wrote and when.
        detail: String,
    },
    /// Neither: reclaimed and torn down as an attempt without a keeper is.
    Reclaim,
}

/// A lost attempt: what is needed to find and tear down its processes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LostAttempt {
    /// The job.
    pub job_id: i64,
    /// The attempt that was lost.
    pub attempt: i64,
    /// Its run token ("" when the row had none).
    pub run_token: String,
    /// Its recorded process group.
    pub pgid: Option<i32>,
    /// Its recorded start time.
    pub start_time: Option<u64>,
    /// The runner that ran it (None: a marker from before schema version 9, or written by hand).
    pub worker_id: Option<String>,
    /// Where its pids mean something: its runner's host, boot and PID namespace (None when its
    /// runner is unknown or registered before schema version 9).
    pub namespace: Option<Namespace>,
    /// Whether its keeper has stopped it by now: on PostgreSQL, an attempt that ran under a
    /// keeper (which reads the lease file its runner renews) of a runner that did not stop
    /// (one that stops with `--on-exit leave` removes the file), whose lease as it was when
    /// the marker was made ended, by the server's clock, a slack ago (a cancel or a retry
    /// marks an attempt whose lease may still run). Such an attempt is gone, wherever it ran,
    /// unless its host's clock and kernel failed.
    pub fenced_by_keeper: bool,
}

/// One reclaimed job.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reclaimed {
    /// The lost attempt.
    pub lost: LostAttempt,
    /// The runner that held it.
    pub worker_id: Option<String>,
    /// Where the job went: pending or failed.
    pub status: Status,
    /// The `last_error` written.
    pub message: String,
}

/// What [`Store::reclaim`](crate::Store::reclaim) did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReclaimReport {
    /// Every reclaimed job.
    pub reclaimed: Vec<Reclaimed>,
    /// Attempts of dead runners adopted by the sweeping runner, whose keepers run them on.
    pub adopted: Vec<KeptAttempt>,
    /// Attempts of dead runners whose keepers' outcomes were recorded, and the status each
    /// job went to.
    pub recovered: Vec<(KeptAttempt, Status)>,
}

impl ReclaimReport {
    /// Jobs moved back to pending.
    pub fn pending(&self) -> usize {
        self.reclaimed
            .iter()
            .filter(|r| r.status == Status::Pending)
            .count()
    }

    /// Jobs failed as lost.
    pub fn failed(&self) -> usize {
        self.reclaimed
            .iter()
            .filter(|r| r.status == Status::Failed)
            .count()
    }
}

/// The running rows a sweep may reclaim. Parameters: the excluded worker (or NULL), whether
/// expired leases count, now, dead workers (JSON), batch size, the excluded worker's held
/// tokens (JSON, or NULL for all of its rows).
pub(super) const RECLAIM_CANDIDATES_SQL: Sql = Sql::new(
    "SELECT id, attempt, run_token, worker_id, pgid, proc_start_time, lease_expires_at,
            on_lost, recovery_count, keeper_pid, keeper_start_time, started_at, timeout_ms,
            idle_timeout_ms, queue
     FROM jobs
     WHERE status = 'running'
       AND (?1 IS NULL OR worker_id IS NULL OR worker_id != ?1
            OR (?6 IS NOT NULL AND ?2 != 0 AND lease_expires_at < ?3
                AND run_token NOT IN (SELECT value FROM json_each(?6))))
       AND (run_token IS NULL OR worker_id IS NULL OR lease_expires_at IS NULL
            OR (?2 != 0 AND lease_expires_at < ?3)
            OR worker_id IN (SELECT value FROM json_each(?4)))
     ORDER BY lease_expires_at, id LIMIT (SELECT ?5)",
    "SELECT id, attempt, run_token, worker_id, pgid, proc_start_time, lease_expires_at,
            on_lost, recovery_count, keeper_pid, keeper_start_time, started_at, timeout_ms,
            idle_timeout_ms, queue
     FROM jobs
     WHERE status = 'running'
       AND (?1 IS NULL OR worker_id IS NULL OR worker_id != ?1
            OR (?6 IS NOT NULL AND ?2 != 0 AND lease_expires_at < ?3
                AND run_token NOT IN (SELECT value FROM json_array_elements_text(?6::json))))
       AND (run_token IS NULL OR worker_id IS NULL OR lease_expires_at IS NULL
            OR (?2 != 0 AND lease_expires_at < ?3)
            OR worker_id IN (SELECT value FROM json_array_elements_text(?4::json)))
     ORDER BY lease_expires_at NULLS FIRST, id LIMIT ?5",
);

pub(super) fn reclaim(
    conn: &Connection,
    req: &ReclaimRequest<'_>,
    now: i64,
) -> Result<ReclaimReport> {
    let now = conn.now(now)?;
    let mut report = ReclaimReport::default();
    if req.batch == 0 {
        return Ok(report);
    }
    let dead: Vec<&str> = req.dead_workers.iter().map(|(w, _)| w.as_str()).collect();
    let dead_json = serde_json::to_string(&dead).unwrap_or_default();
    let held_json = req
        .held_tokens
        .map(|t| serde_json::to_string(t).unwrap_or_default());
    /// A running row that may be reclaimed: id, attempt, run_token, worker_id, pgid,
    /// proc_start_time, lease_expires_at, on_lost, recovery_count, and its keeper's facts.
    type Candidate = (
        (
            i64,
            i64,
            Option<String>,
            Option<String>,
            Option<i32>,
            Option<i64>,
            Option<i64>,
            String,
            i64,
        ),
        Keeper,
    );
    /// keeper_pid, keeper_start_time, started_at, timeout_ms, idle_timeout_ms, queue.
    type Keeper = (
        Option<i32>,
        Option<i64>,
        Option<i64>,
        Option<i64>,
        Option<i64>,
        String,
    );
    let candidates: Vec<Candidate> = {
        let mut stmt = conn.prepare_cached(&RECLAIM_CANDIDATES_SQL)?;
        let rows = stmt.query_map(
            params![
                req.exclude_worker,
                req.expired,
                now,
                dead_json,
                req.batch,
                held_json
            ],
            |r| {
                Ok((
                    (
                        r.get(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                        r.get(6)?,
                        r.get(7)?,
                        r.get(8)?,
                    ),
                    (
                        r.get(9)?,
                        r.get(10)?,
                        r.get(11)?,
                        r.get(12)?,
                        r.get(13)?,
                        r.get(14)?,
                    ),
                ))
            },
        )?;
        rows.collect::<Result<_>>()?
    };
    // On PostgreSQL, the rows in id order before any is written, then their dependents, as
    // every transaction that writes several running jobs takes them (a renewal of the same
    // runner's leases too): see `lease::lock_running`.
    let ids: Vec<i64> = candidates.iter().map(|((id, ..), _)| *id).collect();
    super::lease::lock_running(conn, &ids)?;
    super::lease::lock_dependents(conn, &ids)?;
    for ((id, attempt, token, worker, pgid, start, expires, on_lost, recovery), keeper) in
        candidates
    {
        let (keeper_pid, keeper_start, started_at, timeout_ms, idle_ms, queue) = keeper;
        if let (Some(judge), Some(token), Some(worker)) = (req.keepers, &token, &worker)
            && let Some((_, why)) = req.dead_workers.iter().find(|(w, _)| w == worker)
        {
            let kept = KeptAttempt {
                job_id: id,
                attempt,
                run_token: token.clone(),
                worker_id: worker.clone(),
                queue,
                pgid,
                start_time: start.map(|s| s as u64),
                keeper: keeper_pid.zip(keeper_start.map(|s| s as u64)),
                started_at,
                age: started_at.map(|t| Duration::from_millis(u64::try_from(now - t).unwrap_or(0))),
                timeout: timeout_ms.map(|ms| Duration::from_millis(ms.max(0) as u64)),
                idle_timeout: idle_ms.map(|ms| Duration::from_millis(ms.max(0) as u64)),
            };
            match judge(&kept) {
                KeptVerdict::Reclaim => {}
                KeptVerdict::Adopt => {
                    if adopt(conn, req, &kept, why, now)? {
                        report.adopted.push(kept);
                    }
                    continue;
                }
                KeptVerdict::Recovered {
                    ending,
                    output,
                    detail,
                } => {
                    if let Some(status) = recover(conn, req, &kept, ending, output, &detail, now)? {
                        report.recovered.push((kept, status));
                    }
                    continue;
                }
            }
        }
        let missing = token.is_none() || worker.is_none() || expires.is_none();
        let message = if missing {
            let absent: Vec<&str> = [
                ("run_token", token.is_none()),
                ("worker_id", worker.is_none()),
                ("lease_expires_at", expires.is_none()),
            ]
            .into_iter()
            .filter_map(|(n, a)| a.then_some(n))
            .collect();
            format!("{LEASE_MISSING_PREFIX}no {}", absent.join(", "))
        } else if let Some((w, why)) = req
            .dead_workers
            .iter()
            .find(|(w, _)| Some(w.as_str()) == worker.as_deref())
        {
            format!("{LEASE_EXPIRED_PREFIX}runner {w} is dead: {why}")
        } else {
            let late = now - expires.unwrap_or(now);
            format!(
                "{LEASE_EXPIRED_PREFIX}worker {} held it until {} ({:.1}s ago)",
                worker.as_deref().unwrap_or("?"),
                expires.unwrap_or(0),
                late as f64 / 1000.0
            )
        };
        let recovery = recovery + 1;
        let (status, message) =
            lost_verdict(&on_lost, recovery, req.max_recovery_attempts, message);
        let token_text = token.clone().unwrap_or_default();
        let facts = counter::Attempt::read(conn, id)?;
        let changed = conn
            .prepare_cached(sql!(
                sqlite: "UPDATE jobs SET status = ?3, recovery_count = ?4, last_error = ?5,
                     scheduled_at = CASE WHEN ?3 = 'pending' THEN ?6 ELSE scheduled_at END,
                     completed_at = CASE WHEN ?3 = 'failed' THEN ?6 END,
                     error_kind = CASE WHEN ?3 = 'failed' THEN 'lost' END,
                     started_at = CASE WHEN ?3 = 'pending' THEN NULL ELSE started_at END,
                     heartbeat_at = CASE WHEN ?3 = 'pending' THEN NULL ELSE heartbeat_at END,
                     lease_expires_at = NULL,
                     run_token = CASE WHEN ?3 = 'pending' THEN NULL ELSE run_token END,
                     worker_id = CASE WHEN ?3 = 'pending' THEN NULL ELSE worker_id END,
                     teardown_token = ?7, teardown_pgid = pgid,
                     teardown_start_time = proc_start_time, teardown_worker = worker_id,
                     teardown_lease_expires_at = lease_expires_at
                 WHERE id = ?1 AND status = 'running' AND run_token IS ?2",
                postgres: "UPDATE jobs SET status = ?3, recovery_count = ?4, last_error = ?5,
                     scheduled_at = CASE WHEN ?3 = 'pending' THEN ?6 ELSE scheduled_at END,
                     completed_at = CASE WHEN ?3 = 'failed' THEN ?6 END,
                     error_kind = CASE WHEN ?3 = 'failed' THEN 'lost' END,
                     started_at = CASE WHEN ?3 = 'pending' THEN NULL ELSE started_at END,
                     heartbeat_at = CASE WHEN ?3 = 'pending' THEN NULL ELSE heartbeat_at END,
                     lease_expires_at = NULL,
                     run_token = CASE WHEN ?3 = 'pending' THEN NULL ELSE run_token END,
                     worker_id = CASE WHEN ?3 = 'pending' THEN NULL ELSE worker_id END,
                     teardown_token = ?7, teardown_pgid = pgid,
                     teardown_start_time = proc_start_time, teardown_worker = worker_id,
                     teardown_lease_expires_at = lease_expires_at
                 WHERE id = ?1 AND status = 'running' AND run_token IS NOT DISTINCT FROM ?2",
            ))?
            .execute(params![
                id,
                token,
                status.as_str(),
                recovery,
                message,
                now,
                token_text
            ])?;
        if changed == 0 {
            continue;
        }
        counter::reclaimed(conn, facts.as_ref(), status, now)?;
        let kind = if status == Status::Failed {
            EventKind::Lost
        } else {
            EventKind::Reclaimed
        };
        event(conn, id, now, kind, attempt, &message)?;
        dependency::job_ended(conn, id, status, now)?;
        report.reclaimed.push(Reclaimed {
            lost: LostAttempt {
                job_id: id,
                attempt,
                run_token: token_text,
                pgid,
                start_time: start.map(|s| s as u64),
                worker_id: worker.clone(),
                namespace: None,
                // What the teardown reads of it comes from its marker (`teardown_of`).
                fenced_by_keeper: false,
            },
            worker_id: worker,
            status,
            message,
        });
    }
    Ok(report)
}

/// Moves a dead runner's attempt, whose keeper still runs it, to the sweeping runner: the
/// same attempt and run token under a fresh lease, with an `adopted` event.
fn adopt(
    conn: &Connection,
    req: &ReclaimRequest<'_>,
    kept: &KeptAttempt,
    why: &str,
    now: i64,
) -> Result<bool> {
    let now = conn.now(now)?;
    let Some(me) = req.exclude_worker else {
        return Ok(false);
    };
    let expires = now.saturating_add(i64::try_from(req.lease_ttl.as_millis()).unwrap_or(i64::MAX));
    let changed = conn
        .prepare_cached(sql!(
            "UPDATE jobs SET worker_id = ?3, heartbeat_at = ?4, lease_expires_at = ?5
             WHERE id = ?1 AND status = 'running' AND run_token = ?2"
        ))?
        .execute(params![kept.job_id, kept.run_token, me, now, expires])?;
    if changed == 0 {
        return Ok(false);
    }
    event(
        conn,
        kept.job_id,
        now,
        EventKind::Adopted,
        kept.attempt,
        &format!(
            "runner {} is dead ({why}); its keeper pid {} still runs the attempt; adopted by {me}",
            kept.worker_id,
            kept.keeper
                .map_or("(found by its token)".to_owned(), |(pid, _)| pid
                    .to_string())
        ),
    )?;
    Ok(true)
}

/// Records the ending a dead runner's keeper left, as the runner would have recorded it, with
/// an `outcome_recovered` event; the attempt keeps a teardown marker for whatever of it is
/// still alive (an escaped descendant), which holds a retry back until it is gone. Returns the
/// job's new status, or `None` when the attempt no longer held its lease.
fn recover(
    conn: &Connection,
    req: &ReclaimRequest<'_>,
    kept: &KeptAttempt,
    ending: Ending,
    output: Option<Output>,
    detail: &str,
    now: i64,
) -> Result<Option<Status>> {
    let now = conn.now(now)?;
    let finish = super::lease::Finish {
        job_id: kept.job_id,
        run_token: kept.run_token.clone(),
        attempt: kept.attempt,
        ending,
        output,
        notes: vec![(EventKind::OutcomeRecovered, detail.to_owned())],
        max_recovery_attempts: req.max_recovery_attempts,
    };
    let status = match super::lease::finish_attempt(conn, &finish, now)? {
        super::lease::Finished::Recorded(status) => status,
        super::lease::Finished::Fenced | super::lease::Finished::Stopped => return Ok(None),
    };
    conn.prepare_cached(sql!(
        "UPDATE jobs SET teardown_token = ?2, teardown_pgid = ?3, teardown_start_time = ?4,
             teardown_worker = ?5, teardown_lease_expires_at = NULL
         WHERE id = ?1"
    ))?
    .execute(params![
        kept.job_id,
        kept.run_token,
        kept.pgid,
        kept.start_time.map(|s| s as i64),
        kept.worker_id
    ])?;
    Ok(Some(status))
}

/// How long past the end of the lease a lost attempt held when it was marked a keeper's
/// lease fence is trusted to have stopped it: the default kill grace and the runner's fence
/// margin. The keeper SIGKILLs the command a margin before that end by its own host's clock
/// (a reading taken before the renewal the server stamped), so this is slack for the keeper's
/// 100 ms poll, the kill itself, and that clock running slow against the server's.
pub(crate) const KEEPER_FENCE_SLACK: Duration = Duration::from_millis(5_250);

/// What [`pending_teardowns`] and [`teardown_of`] read: the marker and its runner's namespace,
/// and whether its keeper has stopped it (`fenced_by_keeper`): a keeper's attempt of a runner
/// that did not stop, whose marked lease ended, by the server's clock, before the parameter
/// `{fenced_before}` (the server's now less [`KEEPER_FENCE_SLACK`]). A cancel or a retry marks
/// an attempt whose lease may be live; a marker without a lease is never trusted so.
const TEARDOWN_SQL: &str =
    "SELECT j.id, j.attempt, j.teardown_token, j.teardown_pgid, j.teardown_start_time,
            j.teardown_worker, r.host, r.boot_id, r.pid_ns,
            j.keeper_pid IS NOT NULL AND r.worker_id IS NOT NULL AND r.stopped_at IS NULL
                AND j.teardown_lease_expires_at IS NOT NULL
                AND j.teardown_lease_expires_at < {fenced_before}
     FROM jobs j {index} LEFT JOIN runners r ON r.worker_id = j.teardown_worker";

/// The server's time (`now` on SQLite) before which a marked lease must have ended for its
/// keeper's fence to be trusted.
fn fenced_before(conn: &Connection, now: i64) -> Result<i64> {
    let slack = i64::try_from(KEEPER_FENCE_SLACK.as_millis()).unwrap_or(i64::MAX);
    Ok(conn.now(now)?.saturating_sub(slack))
}

fn lost_attempt(r: &crate::store::db::Row<'_>) -> Result<LostAttempt> {
    let host: Option<String> = r.get(6)?;
    let boot_id: Option<String> = r.get(7)?;
    let pid_ns: Option<i64> = r.get(8)?;
    Ok(LostAttempt {
        job_id: r.get(0)?,
        attempt: r.get(1)?,
        run_token: r.get(2)?,
        pgid: r.get(3)?,
        start_time: r.get::<_, Option<i64>>(4)?.map(|s| s as u64),
        worker_id: r.get(5)?,
        namespace: match (host, boot_id, pid_ns) {
            (Some(host), Some(boot_id), Some(ns)) => Some(Namespace {
                host,
                boot_id,
                pid_ns: Some(ns as u64),
            }),
            _ => None,
        },
        fenced_by_keeper: r.get(9)?,
    })
}

/// Only a PostgreSQL database's runners write lease files for their keepers.
fn with_fences(conn: &Connection, mut lost: LostAttempt) -> LostAttempt {
    lost.fenced_by_keeper &= conn.sqlite().is_none();
    lost
}

/// The statement of [`pending_teardowns`]. Parameters: after, limit, fenced before.
pub(super) fn pending_teardowns_sql() -> Sql {
    // Named: without statistics the planner walks the table by rowid from `after`.
    let from = TEARDOWN_SQL
        .replace("{index}", "INDEXED BY jobs_teardown")
        .replace("{fenced_before}", "?3");
    let pg_from = TEARDOWN_SQL
        .replace("{index}", "")
        .replace("{fenced_before}", "?3");
    Sql::built(
        format!(
            "{from}
         WHERE j.teardown_token IS NOT NULL AND j.id > ?1 ORDER BY j.id LIMIT (SELECT ?2)"
        ),
        format!(
            "{pg_from} WHERE j.teardown_token IS NOT NULL AND j.id > ?1 ORDER BY j.id LIMIT ?2"
        ),
    )
}

/// The statement of [`teardown_of`]. Parameters: id, fenced before.
fn teardown_of_sql() -> Sql {
    let from = TEARDOWN_SQL
        .replace("{index}", "")
        .replace("{fenced_before}", "?2");
    Sql::built_same(format!(
        "{from} WHERE j.id = ?1 AND j.teardown_token IS NOT NULL"
    ))
}

/// Up to `limit` teardown markers of jobs whose id is above `after`, in id order.
pub(super) fn pending_teardowns(
    conn: &Connection,
    after: i64,
    limit: u64,
    now: i64,
) -> Result<Vec<LostAttempt>> {
    let fenced_before = fenced_before(conn, now)?;
    let mut stmt = conn.prepare_cached(&pending_teardowns_sql())?;
    let rows = stmt.query_map(params![after, limit as i64, fenced_before], lost_attempt)?;
    rows.map(|l| l.map(|l| with_fences(conn, l)))
        .collect::<Result<_>>()
}

/// Job `id`'s teardown marker, if it has one.
pub(super) fn teardown_of(conn: &Connection, id: i64, now: i64) -> Result<Option<LostAttempt>> {
    let fenced_before = fenced_before(conn, now)?;
    let mut stmt = conn.prepare_cached(&teardown_of_sql())?;
    Ok(stmt
        .query_row(params![id, fenced_before], lost_attempt)
        .optional()?
        .map(|l| with_fences(conn, l)))
}

pub(super) fn record_teardown(
    conn: &Connection,
    id: i64,
    token: &str,
    detail: &str,
    now: i64,
) -> Result<bool> {
    let now = conn.now(now)?;
    let attempt: Option<i64> = conn
        .prepare_cached(sql!(
            "UPDATE jobs SET teardown_token = NULL, teardown_pgid = NULL,
                 teardown_start_time = NULL, teardown_worker = NULL,
                 teardown_lease_expires_at = NULL
             WHERE id = ?1 AND teardown_token = ?2 RETURNING attempt"
        ))?
        .query_row(params![id, token], |r| r.get(0))
        .optional()?;
    match attempt {
        Some(attempt) => {
            counter::bump(conn, CounterKind::Teardowns, "", "")?;
            event(conn, id, now, EventKind::TornDown, attempt, detail)?;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// The statements of this file that are `const` items or built at run time (with
/// representative inputs), for the test that prepares every statement (`store/statements.rs`).
#[cfg(test)]
pub(super) fn statements() -> Vec<(&'static str, Sql)> {
    vec![
        ("RECLAIM_CANDIDATES_SQL", RECLAIM_CANDIDATES_SQL),
        ("pending_teardowns_sql()", pending_teardowns_sql()),
        ("teardown_of_sql()", teardown_of_sql()),
    ]
}

impl Store {
    /// Reclaims lost attempts: expired leases, running jobs without lease metadata, and the
    /// running jobs of runners known to be dead.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written.
    pub fn reclaim(&self, req: &ReclaimRequest<'_>, now: i64) -> Result<ReclaimReport> {
        let report = self.write(|c| reclaim(c, req, now))?;
        self.continue_cascades(now, None)?;
        Ok(report)
    }

    /// Lost attempts whose processes still have to be torn down.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn pending_teardowns(&self, limit: u64) -> Result<Vec<LostAttempt>> {
        pending_teardowns(&self.conn, 0, limit, self.now())
    }

    /// As [`Store::pending_teardowns`], of jobs whose id is above `after`: the next page.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn pending_teardowns_after(&self, after: i64, limit: u64) -> Result<Vec<LostAttempt>> {
        pending_teardowns(&self.conn, after, limit, self.now())
    }

    /// Job `id`'s lost attempt still to be torn down, if it has one, with its runner's
    /// namespace: what `jobs inspect` and the dashboard show of a job that waits.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn teardown_of(&self, id: i64) -> Result<Option<LostAttempt>> {
        teardown_of(&self.conn, id, self.now())
    }

    /// Records that a lost attempt's processes were dealt with (`detail` says how), which
    /// lets its job be claimed again. Returns false when another caller recorded it first.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written.
    pub fn record_teardown(
        &self,
        job_id: i64,
        token: &str,
        detail: &str,
        now: i64,
    ) -> Result<bool> {
        let recorded = self.write(|c| record_teardown(c, job_id, token, detail, now))?;
        if recorded {
            // The job can be claimed again.
            self.poke();
        }
        Ok(recorded)
    }
}
