//! Claiming: which due jobs a runner takes, and the promotion of deferred jobs that fell due.

use std::cmp::Reverse;
use std::time::Duration;

use crate::store::db::{Connection, OptionalExtension, Sql, params, params_from_iter, sql};

use crate::condition::WhenLost;
use crate::error::Result;
use crate::job::{EventKind, duration_ms};
use crate::manners::Limits;

use super::super::queue;
use super::super::row::{json_column, ms_duration};
use super::super::tx::{Serialise, event, queue_filter, serialise};
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
    /// The conditions ([`Condition`](crate::Condition)'s bits) that do not hold on the
    /// claiming runner's machine: a job that needs any of them is left out, waiting. 0 takes
    /// jobs whatever their conditions.
    pub unheld: u32,
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
    /// What must hold for it to run ([`Condition`](crate::Condition)'s bits).
    pub conditions: u32,
    /// What happens when one of them stops holding while it runs.
    pub when_lost: WhenLost,
    /// The job's manners and caps.
    pub limits: Limits,
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
         env, cwd, timeout_ms, idle_timeout_ms, priority, scheduled_at, conditions, when_lost,
         limits";

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
         env, cwd, timeout_ms, idle_timeout_ms, priority, scheduled_at, conditions, when_lost,
         limits
     FROM jobs
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
                 jobs.scheduled_at, jobs.conditions, jobs.when_lost, jobs.limits),
     logged AS (
       INSERT INTO job_events (job_id, at, kind, attempt, detail)
       SELECT id, ?1, 'claimed', attempt, 'worker ' || ?3 FROM taken)
     SELECT id, queue, attempt, run_token, argv, env, cwd, timeout_ms, idle_timeout_ms,
            priority, scheduled_at, conditions, when_lost, limits
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
                 jobs.scheduled_at, jobs.conditions, jobs.when_lost, jobs.limits),
     logged AS (
       INSERT INTO job_events (job_id, at, kind, attempt, detail)
       SELECT id, ?1, 'claimed', attempt, 'worker ' || ?3 FROM taken)
     SELECT t.id, t.queue, t.attempt, t.run_token, t.argv, t.env, t.cwd, t.timeout_ms,
            t.idle_timeout_ms, t.priority, t.scheduled_at, t.conditions, t.when_lost, t.limits,
            s.due, s.ruled
     FROM (SELECT ?5 > 0 AND EXISTS (SELECT 1 FROM jobs WHERE deferred = 1 AND scheduled_at <= ?1)
                      AS due,
                  EXISTS (SELECT 1 FROM queues WHERE paused != 0 OR max_running IS NOT NULL)
                      AS ruled,
                  (SELECT count(*) FROM promoted) AS promoted) AS s
     LEFT JOIN taken AS t ON true"
);

/// [`PG_FAST_CLAIM_SQL`] for `queues` (all queues when empty), leaving out the jobs that need
/// a condition of `unheld`.
#[cfg(feature = "postgres")]
fn pg_fast_claim_sql(queues: &[String], unheld: u32) -> Sql {
    Sql::built(
        String::new(),
        PG_FAST_CLAIM_SQL.replace(
            "{queues}",
            &(queue_filter(queues, 6) + &condition_filter(unheld)),
        ),
    )
}

/// The claim's test of a job's conditions: none of `unheld` (a runner's mask, written into
/// the text: at most 32 texts, and none when every condition holds, so that a runner with
/// nothing missing claims with the statements it always had). A job that fails it waits,
/// in the claim index, until the condition holds; a claim reads past it.
pub(in crate::store) fn condition_filter(unheld: u32) -> String {
    let unheld = unheld & crate::condition::ALL_CONDITIONS;
    if unheld == 0 {
        String::new()
    } else {
        format!(" AND (conditions & {unheld}) = 0")
    }
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
pub(in crate::store) fn claim_sql(queues: &[String], unheld: u32) -> Sql {
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
        .replace(
            "{queues}",
            &(queue_filter(queues, 3) + &condition_filter(unheld)),
        );
    Sql::built(text, String::new())
}

/// The ready jobs of one queue, best first, with `{conditions}` to fill
/// ([`condition_filter`]). Parameters: queue, now, limit.
const QUEUE_HEAD_SQL: (&str, &str) = (
    concat!(
        "SELECT id, priority, scheduled_at
     FROM jobs INDEXED BY jobs_claim_queue
     WHERE queue = ?1 AND ",
        in_claim_index!(),
        "
       AND scheduled_at <= ?2{conditions}
     ORDER BY priority DESC, scheduled_at, id LIMIT (SELECT ?3)"
    ),
    concat!(
        "SELECT id, priority, scheduled_at FROM jobs
         WHERE queue = ?1 AND ",
        in_claim_index!(),
        " AND scheduled_at <= ?2{conditions}
         ORDER BY priority DESC, scheduled_at, id LIMIT ?3"
    ),
);

/// [`QUEUE_HEAD_SQL`] leaving out the jobs that need a condition of `unheld`.
pub(in crate::store) fn queue_head_sql(unheld: u32) -> Sql {
    let filter = condition_filter(unheld);
    Sql::built(
        QUEUE_HEAD_SQL.0.replace("{conditions}", &filter),
        QUEUE_HEAD_SQL.1.replace("{conditions}", &filter),
    )
}

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
    let candidate = |r: &crate::store::db::Row<'_>| claimed_row(r, r.get(0)?, expires);
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
        let mut stmt = conn.prepare_cached(&claim_sql(req.queues, req.unheld))?;
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
    let mut stmt = conn.prepare_cached(&pg_fast_claim_sql(req.queues, req.unheld))?;
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
                Some(id) => Some(claimed_row(r, id, expires)?),
            };
            Ok((job, r.get::<_, bool>(14)?, r.get::<_, bool>(15)?))
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

/// A job a claim took, from a row of [`CANDIDATE_COLUMNS`] (or a statement that returns the
/// same columns in the same order) whose id is `id`.
fn claimed_row(r: &crate::store::db::Row<'_>, id: i64, expires: i64) -> Result<Claimed> {
    Ok(Claimed {
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
        conditions: condition_bits(r, 11)?,
        when_lost: when_lost(r, 12)?,
        limits: Limits::from_json(r.get::<_, Option<String>>(13)?.as_deref()),
    })
}

/// The `conditions` column at `i`, as bits.
fn condition_bits(r: &crate::store::db::Row<'_>, i: usize) -> Result<u32> {
    Ok(u32::try_from(r.get::<_, i64>(i)?).unwrap_or(0) & crate::condition::ALL_CONDITIONS)
}

/// The `when_lost` column at `i`.
fn when_lost(r: &crate::store::db::Row<'_>, i: usize) -> Result<WhenLost> {
    let w: String = r.get(i)?;
    w.parse()
        .map_err(|_| crate::error::Error::Column(format!("column {i}: when_lost {w:?}")))
}

/// At most this many deferred jobs become claimable in one claim's transaction: a claim's
/// write lock stays short when a million jobs fall due at once; the next claims promote the
/// rest, in due order.
const PROMOTE_AT_MOST: i64 = 500;

/// The deferred jobs due at `now`, earliest first: one seek into `jobs_deferred`, which holds
/// only the jobs not yet promoted. Parameters: now, limit.
pub(in crate::store) const DUE_DEFERRED_SQL: Sql = Sql::new(
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
pub(in crate::store) const QUEUE_NEXT_DUE_SQL: Sql = Sql::new(
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
pub(in crate::store) const NEXT_DUE_SQL: Sql = Sql::new(
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
        let mut stmt = conn.prepare_cached(&queue_head_sql(req.unheld))?;
        let rows = stmt.query_map(params![name, now, allowed], |r| r.try_into())?;
        for row in rows {
            heads.push(row?);
        }
    }
    heads.sort_by_key(|&(id, priority, scheduled_at)| (Reverse(priority), scheduled_at, id));
    heads.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    Ok(heads.into_iter().map(|(id, _, _)| id).collect())
}

/// The claim's statements, for the test that prepares every statement on both backends.
#[cfg(test)]
pub(super) fn statements() -> Vec<(&'static str, Sql)> {
    let queues = ["a".to_owned(), "b".to_owned()];
    let all = vec![
        ("CLAIM_ONE_SQL", CLAIM_ONE_SQL),
        ("CANDIDATE_SQL", CANDIDATE_SQL),
        ("queue_head_sql(all held)", queue_head_sql(0)),
        ("queue_head_sql(ac-power unheld)", queue_head_sql(1)),
        ("DUE_DEFERRED_SQL", DUE_DEFERRED_SQL),
        ("QUEUE_NEXT_DUE_SQL", QUEUE_NEXT_DUE_SQL),
        ("NEXT_DUE_SQL", NEXT_DUE_SQL),
        ("claim_sql(all queues)", claim_sql(&[], 0)),
        ("claim_sql(two queues)", claim_sql(&queues, 0)),
        ("claim_sql(idle unheld)", claim_sql(&queues, 16)),
    ];
    #[cfg(feature = "postgres")]
    let mut all = all;
    #[cfg(feature = "postgres")]
    all.extend([
        ("pg_fast_claim_sql(all queues)", pg_fast_claim_sql(&[], 0)),
        (
            "pg_fast_claim_sql(two queues)",
            pg_fast_claim_sql(&queues, 0),
        ),
        (
            "pg_fast_claim_sql(unmetered unheld)",
            pg_fast_claim_sql(&queues, 4),
        ),
        ("pg_claim_sql(one job)", pg_claim_sql()),
    ]);
    all
}
