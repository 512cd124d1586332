//! Endings recorded together: on PostgreSQL, the plain successes of a batch (a runner's
//! writer's, or [`Store::finish_many`](crate::Store::finish_many)'s) in one statement, with
//! their events, output, counters and histograms; every other ending, and every ending on
//! SQLite, one at a time as [`finish_started`] and [`finish_attempt`](super::finish_attempt)
//! record it.
//!
//! Each success is still one guarded UPDATE of its row (`id`, `status = 'running'`,
//! `run_token`): a row whose guard no longer holds is not in the statement's result, and its
//! ending is then recorded as a late one ([`fenced`]), alone, as before. The states this adds:
//! none a reader sees (one statement, in the caller's transaction); the order of event rows
//! among the batch's jobs is the grouped successes' first, then the others'.

use std::collections::HashMap;

use serde_json::json;

use crate::error::Result;
use crate::job::Status;
use crate::metrics::CounterKind;
use crate::store::counter::{BUCKETS_MS, INF_MS, RUN, WAIT};
#[cfg(feature = "postgres")]
use crate::store::db::Dialect;
use crate::store::db::{Connection, Sql, params};
use crate::store::dependency;

use super::{AttemptStart, Ending, Finish, Finished, fenced, finish_started, finish_with};

/// An output larger than this (either stream) is recorded by the ending's own statements, not
/// sent through the grouped statement's JSON (as hex, twice its size).
const GROUPED_OUTPUT_MAX: usize = 16 * 1024;

/// The grouped successes: `?1` a JSON array of records (`n` the ending's place in the group,
/// `id`, `token`; with `paired`, the process its start recorded; `start_detail`; the output
/// as hex), `?2` now, `?3` the histograms' bounds (`{5,10,...}`), `?4` the counter's name,
/// `?5` and `?6` the histograms' names, `?7` the +Inf bound. Returns, for each ending
/// recorded, its `n` and whether its job has dependents (released by
/// [`dependency::job_ended`], one job at a time: rare).
const GROUPED_SUCCESS_SQL: Sql = Sql::postgres_only(
    "WITH f AS (
         SELECT * FROM json_to_recordset(?1::json) AS f(
             n bigint, id bigint, token text, paired boolean, pid bigint, pgid bigint,
             proc_start_time bigint, keeper_pid bigint, keeper_start_time bigint,
             start_detail text, stdout text, stderr text, stdout_truncated bigint,
             stderr_truncated bigint)),
     done AS (
         UPDATE jobs SET status = 'succeeded', completed_at = ?2, exit_code = 0, signal = NULL,
             error_kind = NULL, lease_expires_at = NULL, heartbeat_at = ?2,
             pid = CASE WHEN f.paired THEN f.pid ELSE jobs.pid END,
             pgid = CASE WHEN f.paired THEN f.pgid ELSE jobs.pgid END,
             proc_start_time = CASE WHEN f.paired THEN f.proc_start_time
                                    ELSE jobs.proc_start_time END,
             keeper_pid = CASE WHEN f.paired THEN f.keeper_pid ELSE jobs.keeper_pid END,
             keeper_start_time = CASE WHEN f.paired THEN f.keeper_start_time
                                      ELSE jobs.keeper_start_time END
         FROM f
         WHERE jobs.id = f.id AND jobs.status = 'running' AND jobs.run_token = f.token
         RETURNING f.n, jobs.id, jobs.attempt, jobs.queue, jobs.scheduled_at, jobs.started_at,
             f.start_detail, f.stdout, f.stderr, f.stdout_truncated, f.stderr_truncated),
     output AS (
         INSERT INTO job_output
             (job_id, attempt, stdout, stderr, stdout_truncated, stderr_truncated)
         SELECT id, attempt, decode(stdout, 'hex'), decode(stderr, 'hex'), stdout_truncated,
             stderr_truncated
         FROM done WHERE stdout IS NOT NULL ORDER BY n),
     logged AS (
         INSERT INTO job_events (job_id, at, kind, attempt, detail, start_detail)
         SELECT id, ?2, 'succeeded', attempt, 'exit 0', start_detail FROM done ORDER BY n),
     counted AS (
         INSERT INTO metric_counter_shards AS c (name, queue, outcome, shard, value)
         SELECT ?4, queue, 'succeeded', job_count_shard(), count(*) FROM done GROUP BY queue
         ON CONFLICT (name, queue, outcome, shard) DO UPDATE SET value = c.value + excluded.value),
     observed AS (
         SELECT o.name, done.queue, o.ms,
             coalesce((SELECT min(b) FROM unnest(?3::text::bigint[]) AS b WHERE o.ms <= b), ?7)
                 AS le
         FROM done CROSS JOIN LATERAL (
             VALUES (?5, greatest(done.started_at - done.scheduled_at, 0)),
                    (?6, greatest(?2 - done.started_at, 0))) AS o(name, ms)
         WHERE done.started_at IS NOT NULL),
     binned AS (
         INSERT INTO metric_histogram_shards AS h
             (name, queue, outcome, le_ms, shard, count, sum_ms)
         SELECT name, queue, 'succeeded', le, job_count_shard(), count(*), sum(ms)::bigint
         FROM observed GROUP BY name, queue, le
         ON CONFLICT (name, queue, outcome, le_ms, shard)
         DO UPDATE SET count = h.count + excluded.count, sum_ms = h.sum_ms + excluded.sum_ms)
     SELECT n, EXISTS (SELECT 1 FROM job_deps WHERE after_id = done.id) FROM done",
);

/// The statements of this file, for the test that prepares them all.
#[cfg(test)]
pub(in crate::store) fn statements() -> Vec<(&'static str, Sql)> {
    vec![("GROUPED_SUCCESS_SQL", GROUPED_SUCCESS_SQL)]
}

/// Records `endings` in the caller's transaction (each with the start recorded with it, when
/// both fall in one batch), and returns what each did, in order. The caller has locked the
/// running rows and their dependents first ([`lock_running`](super::lock_running),
/// [`lock_dependents`](super::lock_dependents)).
pub(crate) fn finish_group(
    conn: &Connection,
    endings: &[(&Finish, Option<&AttemptStart>)],
    now: i64,
) -> Result<Vec<Finished>> {
    let now = conn.now(now)?;
    // Grouped on PostgreSQL only: SQLite's one writer records each alone as cheaply.
    #[cfg(feature = "postgres")]
    let postgres = conn.dialect() == Dialect::Postgres;
    #[cfg(not(feature = "postgres"))]
    let postgres = false;
    let grouped: Vec<bool> = endings
        .iter()
        .map(|(f, _)| postgres && groupable(f))
        .collect();
    let recorded = if grouped.iter().any(|&g| g) {
        record_successes(conn, endings, &grouped, now)?
    } else {
        HashMap::new()
    };
    let mut results = Vec::with_capacity(endings.len());
    for (n, ((f, start), grouped)) in endings.iter().zip(grouped).enumerate() {
        results.push(if grouped {
            match recorded.get(&n) {
                Some(&dependents) => {
                    if dependents {
                        dependency::job_ended(conn, f.job_id, Status::Succeeded, now)?;
                    }
                    Finished::Recorded(Status::Succeeded)
                }
                None => fenced(conn, f, now)?,
            }
        } else {
            match start {
                Some(s) => finish_started(conn, s, f, now)?,
                None => finish_with(conn, f, None, now)?,
            }
        });
    }
    Ok(results)
}

/// Whether an ending goes through the grouped statement: a success with no notes (whose
/// events come between a start and its ending) and a small output.
fn groupable(f: &Finish) -> bool {
    f.ending == Ending::Succeeded
        && f.notes.is_empty()
        && f.output.as_ref().is_none_or(|o| {
            o.stdout.len() <= GROUPED_OUTPUT_MAX && o.stderr.len() <= GROUPED_OUTPUT_MAX
        })
}

/// Runs [`GROUPED_SUCCESS_SQL`] over the grouped endings; for each one recorded, its place in
/// `endings` and whether its job has dependents.
fn record_successes(
    conn: &Connection,
    endings: &[(&Finish, Option<&AttemptStart>)],
    grouped: &[bool],
    now: i64,
) -> Result<HashMap<usize, bool>> {
    let records: Vec<serde_json::Value> = endings
        .iter()
        .zip(grouped)
        .enumerate()
        .filter(|(_, (_, g))| **g)
        .map(|(n, ((f, start), _))| {
            let mut r = json!({ "n": n, "id": f.job_id, "token": f.run_token });
            if let Some(s) = start {
                r["paired"] = json!(true);
                r["pid"] = json!(s.pid);
                r["pgid"] = json!(s.pgid);
                r["proc_start_time"] = json!(s.start_time as i64);
                r["keeper_pid"] = json!(s.keeper.map(|(pid, _)| pid));
                r["keeper_start_time"] = json!(s.keeper.map(|(_, t)| t as i64));
                r["start_detail"] = json!(super::start_detail(s));
            }
            if let Some(o) = f
                .output
                .as_ref()
                .filter(|o| !o.stdout.is_empty() || !o.stderr.is_empty())
            {
                r["stdout"] = json!(hex(&o.stdout));
                r["stderr"] = json!(hex(&o.stderr));
                r["stdout_truncated"] = json!(i64::from(o.stdout_truncated));
                r["stderr_truncated"] = json!(i64::from(o.stderr_truncated));
            }
            r
        })
        .collect();
    let list = serde_json::Value::Array(records).to_string();
    let bounds: Vec<String> = BUCKETS_MS.iter().map(i64::to_string).collect();
    let bounds = format!("{{{}}}", bounds.join(","));
    let mut stmt = conn.prepare_cached(&GROUPED_SUCCESS_SQL)?;
    let rows = stmt.query_map(
        params![
            list,
            now,
            bounds,
            CounterKind::JobsEnded.as_str(),
            WAIT,
            RUN,
            INF_MS
        ],
        |r| Ok((r.get::<_, i64>(0)?, r.get::<_, bool>(1)?)),
    )?;
    let mut recorded = HashMap::new();
    for row in rows {
        let (n, dependents) = row?;
        recorded.insert(usize::try_from(n).unwrap_or(usize::MAX), dependents);
    }
    Ok(recorded)
}

/// `bytes` as lowercase hex, as PostgreSQL's `decode(..., 'hex')` reads it.
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}
