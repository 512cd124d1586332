//! Rows into records: the columns a job is read with, and the JSON columns (argv, env).

use std::time::Duration;

use crate::store::db::Row;

use crate::error::Result;
use crate::job::{ErrorKind, Event, EventKind, JobRecord};
use crate::manners::Limits;

/// The columns a job is read with ([`job_row`]), SQLite's; PostgreSQL's are [`PG_JOB_COLUMNS`].
pub(super) const JOB_COLUMNS: &str =
    "id, queue, argv, env, cwd, priority, status, attempt, max_attempts,
    failed_attempts, recovery_count, on_lost, timeout_ms, idle_timeout_ms, created_at,
    scheduled_at, started_at, completed_at, heartbeat_at, lease_expires_at, run_token, worker_id,
    pid, pgid, exit_code, signal, error_kind, last_error, teardown_token IS NOT NULL,
    unique_key, schedule, slot_at,
    (SELECT json_group_array(after_id) FROM job_deps WHERE job_id = jobs.id),
    (SELECT json_group_array(d.after_id) FROM job_deps d LEFT JOIN jobs p ON p.id = d.after_id
         WHERE d.job_id = jobs.id AND p.status IS NOT NULL AND p.status != 'succeeded'),
    keeper_pid, name, conditions, when_lost, limits, tempfail_max, tempfails";

/// [`JOB_COLUMNS`] as PostgreSQL spells them: its `json_agg` of no rows is NULL, not `[]`.
pub(super) const PG_JOB_COLUMNS: &str =
    "id, queue, argv, env, cwd, priority, status, attempt, max_attempts,
    failed_attempts, recovery_count, on_lost, timeout_ms, idle_timeout_ms, created_at,
    scheduled_at, started_at, completed_at, heartbeat_at, lease_expires_at, run_token, worker_id,
    pid, pgid, exit_code, signal, error_kind, last_error, teardown_token IS NOT NULL,
    unique_key, schedule, slot_at,
    (SELECT coalesce(json_agg(after_id), '[]')::text FROM job_deps WHERE job_id = jobs.id),
    (SELECT coalesce(json_agg(d.after_id), '[]')::text
         FROM job_deps d LEFT JOIN jobs p ON p.id = d.after_id
         WHERE d.job_id = jobs.id AND p.status IS NOT NULL AND p.status != 'succeeded'),
    keeper_pid, name, conditions, when_lost, limits, tempfail_max, tempfails";

pub(super) fn job_row(r: &Row<'_>) -> Result<JobRecord> {
    let status: String = r.get(6)?;
    let on_lost: String = r.get(11)?;
    let kind: Option<String> = r.get(26)?;
    let bad = |i: usize, what: String| crate::error::Error::Column(format!("column {i}: {what}"));
    Ok(JobRecord {
        id: r.get(0)?,
        queue: r.get(1)?,
        argv: json_column(r, 2)?,
        env: json_column(r, 3)?,
        cwd: r.get(4)?,
        priority: r.get(5)?,
        status: status
            .parse()
            .map_err(|_| bad(6, format!("status {status:?}")))?,
        attempt: r.get(7)?,
        max_attempts: r.get(8)?,
        failed_attempts: r.get(9)?,
        recovery_count: r.get(10)?,
        on_lost: on_lost
            .parse()
            .map_err(|_| bad(11, format!("on_lost {on_lost:?}")))?,
        timeout_ms: r.get(12)?,
        idle_timeout_ms: r.get(13)?,
        created_at: r.get(14)?,
        scheduled_at: r.get(15)?,
        started_at: r.get(16)?,
        completed_at: r.get(17)?,
        heartbeat_at: r.get(18)?,
        lease_expires_at: r.get(19)?,
        run_token: r.get(20)?,
        worker_id: r.get(21)?,
        pid: r.get(22)?,
        pgid: r.get(23)?,
        exit_code: r.get(24)?,
        signal: r.get(25)?,
        error_kind: kind.as_deref().and_then(ErrorKind::parse),
        last_error: r.get(27)?,
        teardown_pending: r.get(28)?,
        unique_key: r.get(29)?,
        schedule: r.get(30)?,
        slot_at: r.get(31)?,
        after: json_column(r, 32)?,
        waiting_for: json_column(r, 33)?,
        keeper_pid: r.get(34)?,
        name: r.get(35)?,
        conditions: crate::condition::from_mask(u32::try_from(r.get::<_, i64>(36)?).unwrap_or(0)),
        when_lost: {
            let w: String = r.get(37)?;
            w.parse().map_err(|_| bad(37, format!("when_lost {w:?}")))?
        },
        limits: Limits::from_json(r.get::<_, Option<String>>(38)?.as_deref()),
        tempfail_max: r.get(39)?,
        tempfails: r.get(40)?,
    })
}

pub(super) fn event_row(r: &Row<'_>) -> Result<Event> {
    Ok(Event {
        id: r.get(0)?,
        job_id: r.get(1)?,
        at: r.get(2)?,
        kind: {
            let text: String = r.get(3)?;
            EventKind::parse(&text).ok_or_else(|| {
                crate::error::Error::Column(format!("column 3: unknown event kind {text:?}"))
            })?
        },
        attempt: r.get(4)?,
        detail: r.get(5)?,
    })
}

pub(super) fn ms_duration(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// Reads a JSON column (argv or env) into its Rust type.
pub(super) fn json_column<T: JsonColumn>(r: &Row<'_>, i: usize) -> Result<T> {
    let text: String = r.get(i)?;
    T::parse(&text).map_err(|e| crate::error::Error::Column(format!("column {i}: {e}")))
}

pub(super) trait JsonColumn: Sized {
    fn parse(text: &str) -> serde_json::Result<Self>;
}

impl JsonColumn for Vec<String> {
    fn parse(text: &str) -> serde_json::Result<Self> {
        serde_json::from_str(text)
    }
}

impl JsonColumn for Vec<i64> {
    fn parse(text: &str) -> serde_json::Result<Self> {
        serde_json::from_str(text)
    }
}

impl JsonColumn for Vec<(String, String)> {
    fn parse(text: &str) -> serde_json::Result<Self> {
        serde_json::from_str(text)
    }
}

/// A JSON column's text read as each column type (feature `fuzzing`).
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_columns(text: &str) {
    let _ = <Vec<String>>::parse(text);
    let _ = <Vec<i64>>::parse(text);
    let _ = <Vec<(String, String)>>::parse(text);
}
