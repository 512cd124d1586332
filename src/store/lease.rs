//! Leases: claiming jobs, recording the process an attempt started, renewing the leases a
//! runner holds, and recording how an attempt ended (with the backoff before a retry).

#[cfg(doc)]
use crate::error::Error;
use std::cmp::Reverse;
use std::collections::HashSet;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use crate::store::db::{Connection, OptionalExtension, Sql, params, params_from_iter, sql};

use crate::error::Result;
use crate::job::{ErrorKind, EventKind, Output, Status, duration_ms};
use crate::metrics::CounterKind;

use super::Store;
use super::counter;
use super::dependency;
pub(super) use super::ending::Ending;
use super::lost::{LEASE_EXPIRED_PREFIX, lost_verdict};
use super::queue;
use super::row::{json_column, ms_duration};
use super::runners::runner_heartbeat;
use super::tx::{Serialise, event, queue_filter, serialise};

mod grouped;
pub(crate) use grouped::finish_group;

/// What a runner asks of [`Store::claim`](crate::Store::claim).
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    /// The runner that will hold the leases.
    pub worker_id: &'a str,
    /// Claim at most this many.
    pub limit: u32,
    /// Only from these queues; all when empty.
    pub queues: &'a [String],
    /// The lease each claim takes.
    pub lease_ttl: Duration,
    /// The runner's own caps for this claim: at most this many more jobs of the queue (its
    /// limit less what it already holds). A queue not listed is capped only by `limit` and by
    /// the limits stored in the file ([`Store::set_queue_limit`](crate::Store::set_queue_limit)).
    pub queue_caps: &'a [(String, u32)],
}

/// A job a runner claimed: what it needs to run the attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Claimed {
    /// The job.
    pub id: i64,
    /// Its queue.
    pub queue: String,
    /// The attempt number this claim started.
    pub attempt: i64,
    /// The lease's token, which fences every later write of this attempt.
    pub run_token: String,
    /// The command.
    pub argv: Vec<String>,
    /// Extra environment.
    pub env: Vec<(String, String)>,
    /// The folder to run in.
    pub cwd: Option<String>,
    /// The attempt's timeout.
    pub timeout: Option<Duration>,
    /// The attempt's idle timeout.
    pub idle_timeout: Option<Duration>,
    /// When the lease runs out unless renewed.
    pub lease_expires_at: i64,
    priority: i64,
    scheduled_at: i64,
}

/// What a claim writes into each job it takes, guarded by the status it read. Parameters: id,
/// attempt, run token, worker id, now, lease expiry.
///
/// `OR FAIL`, as every UPDATE of a job's status the store runs for each job (the claim and
/// every ending below; an operator's, a reclaim's or a cascade's are rare and keep the default,
/// being able to fail halfway through many rows): a statement that
/// fires a trigger (`job_counts`) writes more than one row, and under the default `OR ABORT`
/// SQLite opens a statement journal for it, which copies every page it touches. Nothing here
/// can fail halfway (one row, checked before it is written); a full disk rolls back the whole
/// transaction, which the callers handle.
const CLAIM_ONE_SQL: Sql = Sql::sqlite_only(concat!(
    "UPDATE OR FAIL jobs SET status = 'running', attempt = ?2, run_token = ?3,
         worker_id = ?4, started_at = ?5, heartbeat_at = ?5, lease_expires_at = ?6,
         completed_at = NULL, pid = NULL, pgid = NULL, proc_start_time = NULL, exit_code = NULL,
         signal = NULL, error_kind = NULL, keeper_pid = NULL, keeper_start_time = NULL
     WHERE id = ?1 AND ",
    ready_to_claim!()
));

/// What a claim reads of each job it takes, with the attempt it starts and a new run token.
const CANDIDATE_COLUMNS: &str = "id, queue, attempt + 1, lower(hex(randomblob(16))), argv,
         env, cwd, timeout_ms, idle_timeout_ms, priority, scheduled_at";

/// The jobs a claim takes, with `{index}` and `{queues}` to fill: see [`claim_sql`].
/// Parameters: now, limit, then the queues from `?3`.
///
/// The limit goes through a subquery here and below: a bare parameter in LIMIT makes SQLite
/// (built with STAT4) prepare the statement again on every run.
const CANDIDATES_SQL: &str = concat!(
    "SELECT {columns} FROM jobs INDEXED BY {index}
     WHERE ",
    in_claim_index!(),
    "
       AND scheduled_at <= ?1 {queues}
     ORDER BY priority DESC, scheduled_at, id LIMIT (SELECT ?2)"
);

/// One job a claim takes by id, when queue rules chose it. Parameter: id.
const CANDIDATE_SQL: Sql = Sql::sqlite_only(concat!(
    "SELECT id, queue, attempt + 1, lower(hex(randomblob(16))), argv,
         env, cwd, timeout_ms, idle_timeout_ms, priority, scheduled_at FROM jobs
     WHERE id = ?1 AND ",
    ready_to_claim!()
));

/// PostgreSQL's claim: `{pick}` (the jobs to take, locked, skipping those another claim has
/// locked), their transition to running and their `claimed` events, in one statement, so
/// that claiming costs one round trip to the server whatever the number of jobs. Parameters:
/// now, then `{pick}`'s own (`?2`), worker id, lease expiry, then the queues from `?5`.
#[cfg(feature = "postgres")]
const PG_CLAIM_SQL: &str = "WITH picked AS ({pick}),
     taken AS (
       UPDATE jobs SET status = 'running', attempt = jobs.attempt + 1,
              run_token = replace(gen_random_uuid()::text, '-', ''), worker_id = ?3, started_at = ?1,
              heartbeat_at = ?1, lease_expires_at = ?4, completed_at = NULL, pid = NULL,
              pgid = NULL, proc_start_time = NULL, exit_code = NULL, signal = NULL,
              error_kind = NULL, keeper_pid = NULL, keeper_start_time = NULL
       FROM picked WHERE jobs.id = picked.id
       RETURNING jobs.id, jobs.queue, jobs.attempt, jobs.run_token, jobs.argv, jobs.env,
                 jobs.cwd, jobs.timeout_ms, jobs.idle_timeout_ms, jobs.priority,
                 jobs.scheduled_at),
     logged AS (
       INSERT INTO job_events (job_id, at, kind, attempt, detail)
       SELECT id, ?1, 'claimed', attempt, 'worker ' || ?3 FROM taken)
     SELECT id, queue, attempt, run_token, argv, env, cwd, timeout_ms, idle_timeout_ms,
            priority, scheduled_at
     FROM taken";

/// PostgreSQL's claim when no queue has a limit or a pause, in one statement and one round
/// trip: the promotion of due deferred jobs (at most `?5`, as [`promote_due`]), the check
/// that no queue rule exists (else it takes nothing, and the caller takes the rules' path,
/// which locks the limited queues' rows first), the pick of the best ready jobs (`?2`: how
/// many; `FOR UPDATE SKIP LOCKED`), their transition and their `claimed` events. Parameters:
/// now, limit, worker id, lease expiry, promotion limit, then the queues from `?6`.
///
/// The jobs it promotes were deferred in its snapshot, so it cannot take them itself: with a
/// promotion limit above 0 it takes nothing when any deferred job is due, and the caller runs
/// it again with 0 (no promotion, no such check), so that the promoted jobs compete by their
/// priority, as SQLite's [`promote_due`] before the read makes them.
///
/// One row at least: the jobs taken (their columns NULL when none was), each with whether a
/// deferred job was due and whether a queue rule exists.
#[cfg(feature = "postgres")]
const PG_FAST_CLAIM_SQL: &str = concat!(
    "WITH promoted AS (
       UPDATE jobs SET deferred = 0
       WHERE id IN (SELECT id FROM jobs WHERE deferred = 1 AND scheduled_at <= ?1
                    ORDER BY scheduled_at LIMIT ?5)
         AND deferred = 1
       RETURNING id),
     picked AS (
       SELECT id FROM jobs WHERE ",
    in_claim_index!(),
    " AND scheduled_at <= ?1 {queues}
         AND NOT EXISTS (SELECT 1 FROM queues WHERE paused != 0 OR max_running IS NOT NULL)
         AND (?5 = 0 OR NOT EXISTS (SELECT 1 FROM jobs WHERE deferred = 1 AND scheduled_at <= ?1))
       ORDER BY priority DESC, scheduled_at, id LIMIT ?2 FOR UPDATE SKIP LOCKED),
     taken AS (
       UPDATE jobs SET status = 'running', attempt = jobs.attempt + 1,
              run_token = replace(gen_random_uuid()::text, '-', ''), worker_id = ?3, started_at = ?1,
              heartbeat_at = ?1, lease_expires_at = ?4, completed_at = NULL, pid = NULL,
              pgid = NULL, proc_start_time = NULL, exit_code = NULL, signal = NULL,
              error_kind = NULL, keeper_pid = NULL, keeper_start_time = NULL
       FROM picked WHERE jobs.id = picked.id
       RETURNING jobs.id, jobs.queue, jobs.attempt, jobs.run_token, jobs.argv, jobs.env,
                 jobs.cwd, jobs.timeout_ms, jobs.idle_timeout_ms, jobs.priority,
                 jobs.scheduled_at),
     logged AS (
       INSERT INTO job_events (job_id, at, kind, attempt, detail)
       SELECT id, ?1, 'claimed', attempt, 'worker ' || ?3 FROM taken)
     SELECT t.id, t.queue, t.attempt, t.run_token, t.argv, t.env, t.cwd, t.timeout_ms,
            t.idle_timeout_ms, t.priority, t.scheduled_at, s.due, s.ruled
     FROM (SELECT ?5 > 0 AND EXISTS (SELECT 1 FROM jobs WHERE deferred = 1 AND scheduled_at <= ?1)
                      AS due,
                  EXISTS (SELECT 1 FROM queues WHERE paused != 0 OR max_running IS NOT NULL)
                      AS ruled,
                  (SELECT count(*) FROM promoted) AS promoted) AS s
     LEFT JOIN taken AS t ON true"
);

/// [`PG_FAST_CLAIM_SQL`] for `queues` (all queues when empty).
#[cfg(feature = "postgres")]
fn pg_fast_claim_sql(queues: &[String]) -> Sql {
    Sql::built(
        String::new(),
        PG_FAST_CLAIM_SQL.replace("{queues}", &queue_filter(queues, 6)),
    )
}

/// [`PG_CLAIM_SQL`]'s pick of one job that queue rules chose (`?2`: its id).
#[cfg(feature = "postgres")]
const PG_PICK_ONE: &str = concat!(
    "SELECT id FROM jobs WHERE id = ?2 AND ",
    ready_to_claim!(),
    " FOR UPDATE SKIP LOCKED"
);

/// PostgreSQL's claim ([`PG_CLAIM_SQL`]) of one job that queue rules chose.
#[cfg(feature = "postgres")]
fn pg_claim_sql() -> Sql {
    Sql::built(String::new(), PG_CLAIM_SQL.replace("{pick}", PG_PICK_ONE))
}

/// The read of the jobs a claim takes from `queues` (all queues when empty), when no queue has
/// a limit or a pause: SQLite's (PostgreSQL's is [`pg_claim_sql`]).
pub(super) fn claim_sql(queues: &[String]) -> Sql {
    // Without statistics the planner prefers jobs_status (an equality on status) and then
    // sorts every pending row: a claim costs O(pending) instead of reading an index head.
    let index = if queues.is_empty() {
        "jobs_claim"
    } else {
        "jobs_claim_queue"
    };
    let text = CANDIDATES_SQL
        .replace("{columns}", CANDIDATE_COLUMNS)
        .replace("{index}", index)
        .replace("{queues}", &queue_filter(queues, 3));
    Sql::built(text, String::new())
}

/// The ready jobs of one queue, best first. Parameters: queue, now, limit.
pub(super) const QUEUE_HEAD_SQL: Sql = Sql::new(
    concat!(
        "SELECT id, priority, scheduled_at
     FROM jobs INDEXED BY jobs_claim_queue
     WHERE queue = ?1 AND ",
        in_claim_index!(),
        "
       AND scheduled_at <= ?2
     ORDER BY priority DESC, scheduled_at, id LIMIT (SELECT ?3)"
    ),
    concat!(
        "SELECT id, priority, scheduled_at FROM jobs
         WHERE queue = ?1 AND ",
        in_claim_index!(),
        " AND scheduled_at <= ?2
         ORDER BY priority DESC, scheduled_at, id LIMIT ?3"
    ),
);

/// Claims up to `req.limit` ready jobs: reads them best first, then takes each with a guarded
/// single-row UPDATE, in the caller's IMMEDIATE transaction. No `UPDATE ... WHERE id IN
/// (SELECT ...) RETURNING ...`: SQLite gathers both the subquery's ids and the returned rows
/// in temporary b-trees, and their page caches cost more than the rows' own writes.
///
/// On PostgreSQL, where each statement is a round trip and claims run at once on many
/// runners, one statement ([`PG_CLAIM_SQL`]) locks the best ready jobs, skipping those
/// another claim has locked (`FOR UPDATE SKIP LOCKED`), moves them to running and records
/// their events: concurrent claims take different jobs instead of waiting for each other's
/// commit, and a job already taken is never read as ready.
pub(crate) fn claim(conn: &Connection, req: &ClaimRequest<'_>, now: i64) -> Result<Vec<Claimed>> {
    let now = conn.now(now)?;
    if req.limit == 0 {
        return Ok(Vec::new());
    }
    let expires = now.saturating_add(duration_ms(req.lease_ttl));
    #[cfg(feature = "postgres")]
    if conn.dialect() == crate::store::db::Dialect::Postgres
        && req.queue_caps.is_empty()
        && let Some(claimed) = pg_fast_claim(conn, req, now, expires)?
    {
        return Ok(claimed);
    }
    promote_due(conn, now)?;
    serialise(conn, Serialise::LimitedQueues)?;
    let rules = queue::rules(conn)?;
    let candidate = |r: &crate::store::db::Row<'_>| {
        Ok(Claimed {
            id: r.get(0)?,
            queue: r.get(1)?,
            attempt: r.get(2)?,
            run_token: r.get(3)?,
            argv: json_column(r, 4)?,
            env: json_column(r, 5)?,
            cwd: r.get(6)?,
            timeout: r.get::<_, Option<i64>>(7)?.map(ms_duration),
            idle_timeout: r.get::<_, Option<i64>>(8)?.map(ms_duration),
            lease_expires_at: expires,
            priority: r.get(9)?,
            scheduled_at: r.get(10)?,
        })
    };
    #[cfg(feature = "postgres")]
    if conn.dialect() == crate::store::db::Dialect::Postgres {
        // The rules' path (the fast claim found a queue rule, or the runner caps queues): the
        // limited queues' rows are locked above, then each allowed job taken by id.
        let worker = req.worker_id.to_owned();
        let mut stmt = conn.prepare_cached(&pg_claim_sql())?;
        let mut claimed = Vec::new();
        for id in allowed_heads(conn, req, &rules, now)? {
            if let Some(c) = stmt
                .query_row(params![now, id, worker, expires], candidate)
                .optional()?
            {
                claimed.push(c);
            }
        }
        claimed.sort_by_key(|c| (Reverse(c.priority), c.scheduled_at, c.id));
        return Ok(claimed);
    }
    let mut candidates: Vec<Claimed> = if rules.is_empty() && req.queue_caps.is_empty() {
        // Nothing limits a queue: one statement reads the head of one index.
        let mut values: Vec<crate::store::db::Value> =
            vec![now.into(), i64::from(req.limit).into()];
        values.extend(req.queues.iter().map(|q| q.clone().into()));
        let mut stmt = conn.prepare_cached(&claim_sql(req.queues))?;
        let rows = stmt.query_map(params_from_iter(values), candidate)?;
        rows.collect::<Result<_>>()?
    } else {
        let mut stmt = conn.prepare_cached(&CANDIDATE_SQL)?;
        let mut found = Vec::new();
        for id in allowed_heads(conn, req, &rules, now)? {
            if let Some(c) = stmt.query_row([id], candidate).optional()? {
                found.push(c);
            }
        }
        found
    };
    // Reverse, not negation: a priority of i64::MIN has no negative.
    candidates.sort_by_key(|c| (Reverse(c.priority), c.scheduled_at, c.id));
    let mut claimed = Vec::with_capacity(candidates.len());
    for c in candidates {
        let taken = conn.prepare_cached(&CLAIM_ONE_SQL)?.execute(params![
            c.id,
            c.attempt,
            c.run_token,
            req.worker_id,
            now,
            expires
        ])?;
        // Read in this transaction, so it is still pending; checked all the same.
        if taken == 0 {
            continue;
        }
        event(
            conn,
            c.id,
            now,
            EventKind::Claimed,
            c.attempt,
            &format!("worker {}", req.worker_id),
        )?;
        claimed.push(c);
    }
    Ok(claimed)
}

/// PostgreSQL's claim when the runner caps no queue: [`PG_FAST_CLAIM_SQL`], run a second time
/// (without promoting) when deferred jobs were due, to take the best of the promoted and the
/// ready. None when a queue rule exists: the caller takes the rules' path.
#[cfg(feature = "postgres")]
fn pg_fast_claim(
    conn: &Connection,
    req: &ClaimRequest<'_>,
    now: i64,
    expires: i64,
) -> Result<Option<Vec<Claimed>>> {
    let mut claimed: Vec<Claimed> = Vec::new();
    let mut stmt = conn.prepare_cached(&pg_fast_claim_sql(req.queues))?;
    for promote in [PROMOTE_AT_MOST, 0] {
        let mut values: Vec<crate::store::db::Value> = vec![
            now.into(),
            i64::from(req.limit).into(),
            req.worker_id.to_owned().into(),
            expires.into(),
            promote.into(),
        ];
        values.extend(req.queues.iter().map(|q| q.clone().into()));
        let rows = stmt.query_map(params_from_iter(values), |r| {
            let job = match r.get::<_, Option<i64>>(0)? {
                None => None,
                Some(id) => Some(Claimed {
                    id,
                    queue: r.get(1)?,
                    attempt: r.get(2)?,
                    run_token: r.get(3)?,
                    argv: json_column(r, 4)?,
                    env: json_column(r, 5)?,
                    cwd: r.get(6)?,
                    timeout: r.get::<_, Option<i64>>(7)?.map(ms_duration),
                    idle_timeout: r.get::<_, Option<i64>>(8)?.map(ms_duration),
                    lease_expires_at: expires,
                    priority: r.get(9)?,
                    scheduled_at: r.get(10)?,
                }),
            };
            Ok((job, r.get::<_, bool>(11)?, r.get::<_, bool>(12)?))
        })?;
        let (mut due, mut ruled) = (false, false);
        for row in rows {
            let (job, d, r) = row?;
            (due, ruled) = (d, r);
            claimed.extend(job);
        }
        if ruled {
            // Nothing taken: the pick checks the same.
            return Ok(None);
        }
        if !due {
            break;
        }
    }
    claimed.sort_by_key(|c| (Reverse(c.priority), c.scheduled_at, c.id));
    Ok(Some(claimed))
}

/// At most this many deferred jobs become claimable in one claim's transaction: a claim's
/// write lock stays short when a million jobs fall due at once; the next claims promote the
/// rest, in due order.
const PROMOTE_AT_MOST: i64 = 500;

/// The deferred jobs due at `now`, earliest first: one seek into `jobs_deferred`, which holds
/// only the jobs not yet promoted. Parameters: now, limit.
pub(super) const DUE_DEFERRED_SQL: Sql = Sql::new(
    "SELECT id FROM jobs INDEXED BY jobs_deferred
     WHERE deferred = 1 AND scheduled_at <= ?1
     ORDER BY scheduled_at LIMIT (SELECT ?2)",
    "SELECT id FROM jobs WHERE deferred = 1 AND scheduled_at <= ?1
     ORDER BY scheduled_at LIMIT ?2",
);

/// Moves the deferred jobs that are due at `now` into the claim indexes (at most
/// [`PROMOTE_AT_MOST`]), in the claim's own transaction, before it reads them. When none is
/// due this is one seek that finds nothing. A row by id, not `UPDATE ... WHERE id IN
/// (SELECT ...)`, which builds a temporary b-tree on every run.
fn promote_due(conn: &Connection, now: i64) -> Result<()> {
    let now = conn.now(now)?;
    let due: Vec<i64> = {
        let mut stmt = conn.prepare_cached(&DUE_DEFERRED_SQL)?;
        let rows = stmt.query_map(params![now, PROMOTE_AT_MOST], |r| r.get(0))?;
        rows.collect::<Result<_>>()?
    };
    if due.is_empty() {
        return Ok(());
    }
    // Guarded by `deferred = 1`: a job another claim promoted (and took) since it was read
    // here is left alone, not locked, running as it may be by then (see `lock_running`).
    let mut promote = conn.prepare_cached(sql!(
        "UPDATE jobs SET deferred = 0 WHERE id = ?1 AND deferred = 1"
    ))?;
    for id in due {
        promote.execute([id])?;
    }
    Ok(())
}

/// The earliest `scheduled_at` after `now` among the claimable pending jobs of one queue: the
/// first entry past `now` in that queue's part of `jobs_pending_due`, one seek. Parameters:
/// queue, now.
const QUEUE_NEXT_DUE_SQL: Sql = Sql::new(
    concat!(
        "SELECT min(scheduled_at) FROM jobs INDEXED BY jobs_pending_due
     WHERE queue = ?1 AND ",
        ready_to_claim!(),
        "
       AND scheduled_at > ?2"
    ),
    concat!(
        "SELECT min(scheduled_at) FROM jobs WHERE queue = ?1 AND ",
        ready_to_claim!(),
        " AND scheduled_at > ?2"
    ),
);

/// The same over every queue: a skip through `jobs_pending_due` from one queue to the next
/// (one seek each), then one seek per queue past `now`. Parameter: now.
pub(super) const NEXT_DUE_SQL: Sql = Sql::new(
    concat!(
        "WITH RECURSIVE q(name) AS (
         SELECT (SELECT queue FROM jobs INDEXED BY jobs_pending_due
                 WHERE ",
        ready_to_claim!(),
        "
                 ORDER BY queue LIMIT 1)
         UNION ALL
         SELECT (SELECT queue FROM jobs INDEXED BY jobs_pending_due
                 WHERE ",
        ready_to_claim!(),
        "
                   AND queue > q.name
                 ORDER BY queue LIMIT 1)
         FROM q WHERE q.name IS NOT NULL)
     SELECT min((SELECT min(scheduled_at) FROM jobs INDEXED BY jobs_pending_due
                 WHERE queue = q.name AND ",
        ready_to_claim!(),
        " AND scheduled_at > ?1))
     FROM q WHERE q.name IS NOT NULL"
    ),
    concat!(
        "WITH RECURSIVE q(name) AS (
         SELECT (SELECT queue FROM jobs WHERE ",
        ready_to_claim!(),
        " ORDER BY queue LIMIT 1)
         UNION ALL
         SELECT (SELECT queue FROM jobs WHERE ",
        ready_to_claim!(),
        " AND queue > q.name ORDER BY queue LIMIT 1)
         FROM q WHERE q.name IS NOT NULL)
     SELECT min((SELECT min(scheduled_at) FROM jobs WHERE queue = q.name AND ",
        ready_to_claim!(),
        " AND scheduled_at > ?1))
     FROM q WHERE q.name IS NOT NULL"
    ),
);

/// When the next claimable job of `queues` (all queues when empty) that is not due at `now`
/// becomes due: the earliest `scheduled_at` after `now`, or None. A runner sleeps no longer
/// than this, so that a job enqueued to run later, a retry's backoff or a schedule's slot
/// starts on time without a poke. Reads only index entries, a seek or two per queue, whatever
/// the size of the table. Jobs already due are not counted: a dispatcher that could not take
/// them (no free worker, a queue at its limit or paused) is woken by what changes that.
pub(crate) fn next_due(conn: &Connection, queues: &[String], now: i64) -> Result<Option<i64>> {
    let now = conn.now(now)?;
    if queues.is_empty() {
        let mut stmt = conn.prepare_cached(&NEXT_DUE_SQL)?;
        return stmt.query_row(params![now], |r| r.get(0));
    }
    let mut stmt = conn.prepare_cached(&QUEUE_NEXT_DUE_SQL)?;
    let mut earliest: Option<i64> = None;
    for queue in queues {
        let due: Option<i64> = stmt.query_row(params![queue, now], |r| r.get(0))?;
        earliest = match (earliest, due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    Ok(earliest)
}

/// The ids a claim may take when some queue is paused or limited (in the file, or by the
/// runner's caps): the best ready jobs of each queue the claim serves, as many as the queue
/// still allows, merged in claim order and cut to the request's limit. Reads, per queue, the
/// head of its index; the caller's IMMEDIATE transaction makes the count of running jobs and
/// the claim one atomic step, so runners on one file never exceed a limit together.
fn allowed_heads(
    conn: &Connection,
    req: &ClaimRequest<'_>,
    rules: &[queue::Rule],
    now: i64,
) -> Result<Vec<i64>> {
    let now = conn.now(now)?;
    let limit = i64::from(req.limit);
    let names = if req.queues.is_empty() {
        queue::ready_queues(conn)?
    } else {
        let mut names = req.queues.to_vec();
        names.sort();
        names.dedup();
        names
    };
    let mut heads: Vec<(i64, i64, i64)> = Vec::new();
    for name in &names {
        let mut allowed = limit;
        if let Some(rule) = rules.iter().find(|r| &r.name == name) {
            if rule.paused {
                continue;
            }
            if let Some(max) = rule.max_running {
                allowed = allowed.min(max - rule.running);
            }
        }
        if let Some((_, cap)) = req.queue_caps.iter().find(|(q, _)| q == name) {
            allowed = allowed.min(i64::from(*cap));
        }
        if allowed <= 0 {
            continue;
        }
        let mut stmt = conn.prepare_cached(&QUEUE_HEAD_SQL)?;
        let rows = stmt.query_map(params![name, now, allowed], |r| r.try_into())?;
        for row in rows {
            heads.push(row?);
        }
    }
    heads.sort_by_key(|&(id, priority, scheduled_at)| (Reverse(priority), scheduled_at, id));
    heads.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    Ok(heads.into_iter().map(|(id, _, _)| id).collect())
}

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
    let row: Option<(i64, i64, i64, i64, i64, String, i64)> = conn
        .prepare_cached(sql!(
            "SELECT failed_attempts, max_attempts, backoff_base_ms, backoff_max_ms,
                    recovery_count, on_lost, attempt
             FROM jobs WHERE id = ?1 AND status = 'running' AND run_token = ?2"
        ))?
        .query_row(params![f.job_id, f.run_token], |r| r.try_into())
        .optional()?;
    let Some((failed, max_attempts, base, cap, recovery, on_lost, attempt)) = row else {
        return fenced(conn, f, now);
    };
    let facts = counter::Attempt::read(conn, f.job_id)?;
    // Every UPDATE below repeats the fence (`WHERE id = ?1 AND status = 'running' AND
    // run_token = ?2`), though the IMMEDIATE transaction already holds it.
    let (status, kind, detail) = match &f.ending {
        // Taken by the early return above, which needs no SELECT.
        Ending::Succeeded => return finish_succeeded(conn, f, start, now),
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
    let queues = ["a".to_owned(), "b".to_owned()];
    let mut all = vec![
        ("CLAIM_ONE_SQL", CLAIM_ONE_SQL),
        ("CANDIDATE_SQL", CANDIDATE_SQL),
        ("QUEUE_HEAD_SQL", QUEUE_HEAD_SQL),
        ("DUE_DEFERRED_SQL", DUE_DEFERRED_SQL),
        ("QUEUE_NEXT_DUE_SQL", QUEUE_NEXT_DUE_SQL),
        ("NEXT_DUE_SQL", NEXT_DUE_SQL),
        ("RENEW_SQL", RENEW_SQL),
        ("LOCK_RUNNING_SQL", LOCK_RUNNING_SQL),
        ("LOCK_DEPENDENTS_SQL", LOCK_DEPENDENTS_SQL),
        ("claim_sql(all queues)", claim_sql(&[])),
        ("claim_sql(two queues)", claim_sql(&queues)),
    ];
    all.extend(grouped::statements());
    #[cfg(feature = "postgres")]
    all.extend([
        ("pg_fast_claim_sql(all queues)", pg_fast_claim_sql(&[])),
        ("pg_fast_claim_sql(two queues)", pg_fast_claim_sql(&queues)),
        ("pg_claim_sql(one job)", pg_claim_sql()),
    ]);
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
