//! Retention: deleting finished jobs past their keep rule, with their events and output, in
//! small transactions; then giving the freed pages back to the file system and keeping the
//! WAL bounded.
//!
//! A job is pruned when it is finished (succeeded, failed or cancelled), carries no teardown
//! marker, and either its status's rule has run out since `completed_at`, or it is older than
//! the newest `keep_max` finished jobs. Pending and running jobs are never finished, so never
//! pruned; a marked job waits for its teardown whatever its age.
//!
//! Every query reads the index `jobs_finished (status, completed_at, id) WHERE completed_at IS
//! NOT NULL` when the file has it (created by schema version 2); without it they are correct,
//! only slower on a large file.

#[cfg(doc)]
use crate::error::Error;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::store::db::{Connection, Sql, params, sql};

use super::Store;
use super::slice::yield_lock;
use crate::error::Result;
use crate::job::{Status, duration_ms};

/// How long a succeeded job is kept after it ended. By default, 7 days.
pub const DEFAULT_KEEP_SUCCEEDED: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long a failed job is kept after it ended. By default, 30 days.
pub const DEFAULT_KEEP_FAILED: Duration = Duration::from_secs(30 * 24 * 3600);
/// How long a cancelled job is kept after it ended. By default, 30 days.
pub const DEFAULT_KEEP_CANCELLED: Duration = Duration::from_secs(30 * 24 * 3600);
/// How many jobs one prune transaction deletes at most: small enough that a claim waiting
/// behind it waits a few milliseconds.
pub const DEFAULT_PRUNE_BATCH: u32 = 500;
/// A `-wal` file larger than this is checkpointed and truncated after a prune (when no other
/// connection is busy with it).
pub const WAL_CHECKPOINT_BYTES: u64 = 64 * 1024 * 1024;
/// Pages one `incremental_vacuum` transaction gives back at most (1 MiB of 4 KiB pages), so
/// that returning a large prune's pages does not hold the write lock for long either: each
/// page moved is written to the WAL.
const VACUUM_PAGES_PER_STEP: u64 = 256;

/// The statuses a job can be pruned in.
const FINISHED: [Status; 3] = [Status::Succeeded, Status::Failed, Status::Cancelled];

/// How long finished jobs are kept: a rule per finished status (`None` keeps them forever)
/// and an optional cap on the number of finished jobs.
///
/// ```
/// use std::time::Duration;
/// use leasehold::Retention;
///
/// let policy = Retention::default()
///     .succeeded(Some(Duration::from_secs(3600)))
///     .cancelled(None)
///     .keep_max(Some(10_000));
/// assert_eq!(policy.succeeded_for(), Some(Duration::from_secs(3600)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    succeeded: Option<Duration>,
    failed: Option<Duration>,
    cancelled: Option<Duration>,
    keep_max: Option<u64>,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            succeeded: Some(DEFAULT_KEEP_SUCCEEDED),
            failed: Some(DEFAULT_KEEP_FAILED),
            cancelled: Some(DEFAULT_KEEP_CANCELLED),
            keep_max: None,
        }
    }
}

impl Retention {
    /// A policy that prunes nothing: every rule is forever and there is no cap.
    pub fn keep_all() -> Self {
        Retention {
            succeeded: None,
            failed: None,
            cancelled: None,
            keep_max: None,
        }
    }

    /// How long a succeeded job is kept after it ended; `None` keeps it forever. By default,
    /// [`DEFAULT_KEEP_SUCCEEDED`].
    pub fn succeeded(mut self, keep: Option<Duration>) -> Self {
        self.succeeded = keep;
        self
    }

    /// How long a failed job is kept after it ended; `None` keeps it forever. By default,
    /// [`DEFAULT_KEEP_FAILED`].
    pub fn failed(mut self, keep: Option<Duration>) -> Self {
        self.failed = keep;
        self
    }

    /// How long a cancelled job is kept after it ended; `None` keeps it forever. By default,
    /// [`DEFAULT_KEEP_CANCELLED`].
    pub fn cancelled(mut self, keep: Option<Duration>) -> Self {
        self.cancelled = keep;
        self
    }

    /// At most this many finished jobs are kept, the newest by `completed_at`; older ones are
    /// pruned whatever their rule says. Teardown-marked jobs count, and are never pruned. By
    /// default, no cap.
    pub fn keep_max(mut self, max: Option<u64>) -> Self {
        self.keep_max = max;
        self
    }

    /// The succeeded rule.
    pub fn succeeded_for(&self) -> Option<Duration> {
        self.succeeded
    }

    /// The failed rule.
    pub fn failed_for(&self) -> Option<Duration> {
        self.failed
    }

    /// The cancelled rule.
    pub fn cancelled_for(&self) -> Option<Duration> {
        self.cancelled
    }

    /// The cap on finished jobs.
    pub fn max_finished(&self) -> Option<u64> {
        self.keep_max
    }

    /// Whether this policy can prune anything at all.
    pub fn prunes(&self) -> bool {
        self.succeeded.is_some()
            || self.failed.is_some()
            || self.cancelled.is_some()
            || self.keep_max.is_some()
    }

    fn rule(&self, status: Status) -> Option<Duration> {
        match status {
            Status::Succeeded => self.succeeded,
            Status::Failed => self.failed,
            Status::Cancelled => self.cancelled,
            Status::Pending | Status::Running => None,
        }
    }
}

/// How a prune runs: its batch size, how many batches at most, and whether it only counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PruneOptions {
    batch: u32,
    max_batches: Option<u32>,
    vacuum_steps: Option<u32>,
    deadline: Option<Instant>,
    dry_run: bool,
}

impl Default for PruneOptions {
    fn default() -> Self {
        PruneOptions {
            batch: DEFAULT_PRUNE_BATCH,
            max_batches: None,
            vacuum_steps: None,
            deadline: None,
            dry_run: false,
        }
    }
}

impl PruneOptions {
    /// Jobs deleted per transaction (0 is taken as 1). By default, [`DEFAULT_PRUNE_BATCH`].
    pub fn batch(mut self, batch: u32) -> Self {
        self.batch = batch.max(1);
        self
    }

    /// Stops after this many batches, leaving the rest for the next prune. By default, no
    /// limit: everything due is pruned.
    pub fn max_batches(mut self, max: Option<u32>) -> Self {
        self.max_batches = max;
        self
    }

    /// Runs at most this many vacuum steps of 256 free pages each (1 MiB at the default page
    /// size; one transaction each), leaving the rest of the free list for the next prune. By
    /// default, no limit: every free page is given back.
    pub fn max_vacuum_steps(mut self, max: Option<u32>) -> Self {
        self.vacuum_steps = max;
        self
    }

    /// Starts no batch and no vacuum step once this instant has passed, leaving the rest for
    /// the next prune (`more` says when jobs were left). One transaction under way is
    /// finished, so a prune may run past it by one batch or step. By default, none.
    pub fn deadline(mut self, deadline: Option<Instant>) -> Self {
        self.deadline = deadline;
        self
    }

    /// Counts what would be pruned and changes nothing. By default, off.
    pub fn dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }
}

impl PruneOptions {
    pub(super) fn batch_size(&self) -> u32 {
        self.batch
    }

    pub(super) fn batch_limit(&self) -> Option<u32> {
        self.max_batches
    }

    pub(super) fn vacuum_limit(&self) -> Option<u32> {
        self.vacuum_steps
    }

    /// Whether the deadline, if any, has passed.
    pub(super) fn past_deadline(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    pub(super) fn is_dry_run(&self) -> bool {
        self.dry_run
    }
}

/// What a prune did (or, in a dry run, would do).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PruneReport {
    /// Jobs deleted (or that would be).
    pub jobs: u64,
    /// Their events deleted (0 in a dry run).
    pub events: u64,
    /// Their output rows deleted (0 in a dry run).
    pub outputs: u64,
    /// Delete transactions run.
    pub batches: u64,
    /// True when the batch limit or the deadline stopped the prune with jobs still due.
    pub more: bool,
    /// Bytes the incremental vacuum gave back to the file system (0 on a file without
    /// `auto_vacuum = INCREMENTAL`).
    pub bytes_freed: u64,
    /// True when the WAL passed [`WAL_CHECKPOINT_BYTES`] and was checkpointed and truncated.
    pub wal_truncated: bool,
    /// True for a dry run.
    pub dry_run: bool,
}

/// The bounds of one prune: per finished status, the `(completed_at, id)` at or below which its
/// jobs are due, the later of the status's rule and the keep-max cut. Computed once before the
/// first batch, so that the cut does not move while jobs keep finishing.
pub(super) type Bounds = Vec<(Status, (i64, i64))>;

/// The bounds of a prune by `policy` at `now`.
pub(super) fn bounds(conn: &Connection, policy: &Retention, now: i64) -> Result<Bounds> {
    let now = conn.now(now)?;
    let cut = match policy.keep_max {
        Some(max) => keep_max_cut(conn, max)?,
        None => None,
    };
    Ok(FINISHED
        .into_iter()
        .filter_map(|status| {
            let rule = policy
                .rule(status)
                .map(|keep| (now.saturating_sub(duration_ms(keep)), i64::MAX));
            let bound = match (rule, cut) {
                (Some(r), Some(c)) => Some(r.max(c)),
                (r, c) => r.or(c),
            };
            bound.map(|b| (status, b))
        })
        .collect())
}

/// The newest finished job past the newest `max`, as an inclusive `(completed_at, id)` bound;
/// None when there are no more than `max`. Merges the three statuses' index walks, newest
/// first, so it reads `max` index entries and no row.
fn keep_max_cut(conn: &Connection, max: u64) -> Result<Option<(i64, i64)>> {
    let mut stmts = Vec::with_capacity(FINISHED.len());
    for _ in FINISHED {
        stmts.push(conn.prepare_cached(sql!(
            "SELECT completed_at, id FROM jobs
             WHERE status = ?1 AND completed_at IS NOT NULL
             ORDER BY completed_at DESC, id DESC"
        ))?);
    }
    let mut cursors = Vec::with_capacity(FINISHED.len());
    for (stmt, status) in stmts.iter_mut().zip(FINISHED) {
        cursors.push(stmt.query(params![status.as_str()])?);
    }
    let mut heads: Vec<Option<(i64, i64)>> = Vec::with_capacity(cursors.len());
    for rows in &mut cursors {
        heads.push(next_key(rows)?);
    }
    let mut taken = 0u64;
    loop {
        let Some((i, key)) = heads
            .iter()
            .enumerate()
            .filter_map(|(i, h)| h.map(|k| (i, k)))
            .max_by_key(|(_, k)| *k)
        else {
            return Ok(None);
        };
        if taken == max {
            return Ok(Some(key));
        }
        taken += 1;
        heads[i] = next_key(&mut cursors[i])?;
    }
}

fn next_key(rows: &mut crate::store::db::Rows<'_>) -> Result<Option<(i64, i64)>> {
    Ok(match rows.next()? {
        Some(r) => Some((r.get(0)?, r.get(1)?)),
        None => None,
    })
}

/// The jobs of one status due under `bound`: the prune's selection. Parameters: status, bound's
/// completed_at, bound's id, limit. On PostgreSQL the rows are locked until the prune commits
/// (`FOR UPDATE SKIP LOCKED`): an operator's retry (which locks the job first) either waits
/// for the prune and finds the job gone, or holds it and the prune passes it by. Without the
/// lock a retry committed between the selection and the deletes kept its job alive with its
/// history deleted.
pub(super) const DUE_SQL: Sql = Sql::new(
    "SELECT id FROM jobs
     WHERE status = ?1 AND completed_at IS NOT NULL AND (completed_at, id) <= (?2, ?3)
       AND teardown_token IS NULL
     ORDER BY completed_at, id LIMIT (SELECT ?4)",
    "SELECT id FROM jobs
     WHERE status = ?1 AND completed_at IS NOT NULL AND (completed_at, id) <= (?2, ?3)
       AND teardown_token IS NULL
     ORDER BY completed_at, id LIMIT ?4 FOR UPDATE SKIP LOCKED",
);

/// How many jobs `policy` prunes at `now`, without changing anything.
pub(super) fn count_due(conn: &Connection, policy: &Retention, now: i64) -> Result<u64> {
    let now = conn.now(now)?;
    let mut total = 0u64;
    for (status, (at, id)) in bounds(conn, policy, now)? {
        let n: i64 = conn
            .prepare_cached(sql!(
                "SELECT count(*) FROM jobs
                 WHERE status = ?1 AND completed_at IS NOT NULL AND (completed_at, id) <= (?2, ?3)
                   AND teardown_token IS NULL"
            ))?
            .query_row(params![status.as_str(), at, id], |r| r.get(0))?;
        total += u64::try_from(n).unwrap_or(0);
    }
    Ok(total)
}

/// One batch: deletes up to `limit` due jobs with their events and output. Returns (jobs,
/// events, outputs); fewer jobs than `limit` means none is left due.
pub(super) fn delete_batch(
    conn: &Connection,
    bounds: &Bounds,
    limit: u32,
) -> Result<(u64, u64, u64)> {
    let mut ids: Vec<i64> = Vec::new();
    for (status, (at, id)) in bounds {
        let left = i64::from(limit) - ids.len() as i64;
        if left <= 0 {
            break;
        }
        let mut stmt = conn.prepare_cached(&DUE_SQL)?;
        let rows = stmt.query_map(params![status.as_str(), at, id, left], |r| r.get(0))?;
        for row in rows {
            ids.push(row?);
        }
    }
    if ids.is_empty() {
        return Ok((0, 0, 0));
    }
    let list = serde_json::to_string(&ids).unwrap_or_default();
    let events = conn
        .prepare_cached(sql!(
            sqlite: "DELETE FROM job_events WHERE job_id IN (SELECT CAST(value AS BIGINT) FROM json_each(?1))",
            postgres: "DELETE FROM job_events WHERE job_id IN (SELECT CAST(value AS BIGINT) FROM json_array_elements_text(?1::json))",
        ))?
        .execute(params![list])?;
    let outputs = conn
        .prepare_cached(sql!(
            sqlite: "DELETE FROM job_output WHERE job_id IN (SELECT CAST(value AS BIGINT) FROM json_each(?1))",
            postgres: "DELETE FROM job_output WHERE job_id IN (SELECT CAST(value AS BIGINT) FROM json_array_elements_text(?1::json))",
        ))?
        .execute(params![list])?;
    // The guard again: the selection ran in this transaction, so it still holds; repeating it
    // keeps a live job out of reach of any mistake in the selection.
    let jobs = conn
        .prepare_cached(
            sql!(
                sqlite: "DELETE FROM jobs WHERE id IN (SELECT CAST(value AS BIGINT) FROM json_each(?1))
               AND status IN ('succeeded', 'failed', 'cancelled') AND teardown_token IS NULL",
                postgres: "DELETE FROM jobs WHERE id IN (SELECT CAST(value AS BIGINT) FROM json_array_elements_text(?1::json))
               AND status IN ('succeeded', 'failed', 'cancelled') AND teardown_token IS NULL",
            ),
        )?
        .execute(params![list])?;
    Ok((jobs as u64, events as u64, outputs as u64))
}

/// Gives free pages back to the file system, a bounded number per transaction, and returns the
/// bytes given back. A file without `auto_vacuum = INCREMENTAL` has nothing to give: 0.
pub(super) fn incremental_vacuum(
    conn: &rusqlite::Connection,
    options: &PruneOptions,
) -> Result<u64> {
    let max_steps = options.vacuum_limit();
    let mode: i64 = conn.query_row("PRAGMA auto_vacuum", [], |r| r.get(0))?;
    // 2 is INCREMENTAL; NONE (0) keeps free pages in the file, FULL (1) already gave them back.
    if mode != 2 {
        return Ok(0);
    }
    let page_size: i64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
    let mut freed = 0u64;
    let mut steps = 0u32;
    loop {
        let before: i64 = conn.query_row("PRAGMA freelist_count", [], |r| r.get(0))?;
        if before == 0 || max_steps.is_some_and(|max| steps >= max) || options.past_deadline() {
            break;
        }
        steps += 1;
        // The pragma frees one page per step of its statement: run it to the end.
        let started = std::time::Instant::now();
        let mut stmt = conn.prepare(&format!(
            "PRAGMA incremental_vacuum({VACUUM_PAGES_PER_STEP})"
        ))?;
        let mut rows = stmt.query([])?;
        while rows.next()?.is_some() {}
        drop(rows);
        yield_lock(started.elapsed());
        let after: i64 = conn.query_row("PRAGMA freelist_count", [], |r| r.get(0))?;
        let step = u64::try_from(before - after).unwrap_or(0);
        freed += step * u64::try_from(page_size).unwrap_or(0);
        if step == 0 {
            break;
        }
    }
    Ok(freed)
}

/// Checkpoints and truncates the WAL when it passed [`WAL_CHECKPOINT_BYTES`], without waiting
/// for another connection: a busy checkpoint gives up (the caller sets no busy timeout) and the
/// next prune tries again. Returns whether the WAL was truncated.
pub(super) fn checkpoint_if_large(conn: &rusqlite::Connection, path: &Path) -> Result<bool> {
    // An unreadable size counts as small: the next prune looks again.
    if super::maintenance::wal_bytes(path).unwrap_or(0) <= WAL_CHECKPOINT_BYTES {
        return Ok(false);
    }
    // TRUNCATE holds off every writer while it copies: a PASSIVE checkpoint first copies the
    // bulk while claims and endings go on (measured: a TRUNCATE alone of a 200 MB WAL kept a
    // claim waiting 1.5 s); the TRUNCATE then only has the tail to copy.
    let checkpoint = |mode: &str| -> Result<Option<(i64, i64, i64)>> {
        match conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
            r.try_into()
        }) {
            Ok(row) => Ok(Some(row)),
            Err(e) if crate::error::is_busy(&e) => Ok(None),
            Err(e) => Err(e.into()),
        }
    };
    match checkpoint("PASSIVE")? {
        Some((0, log, done)) if done >= log => {}
        _ => return Ok(false),
    }
    Ok(matches!(checkpoint("TRUNCATE")?, Some((0, _, _))))
}

/// The statements of this file that are `const` items or built at run time (with
/// representative inputs), for the test that prepares every statement (`store/statements.rs`).
#[cfg(test)]
pub(super) fn statements() -> Vec<(&'static str, Sql)> {
    vec![("DUE_SQL", DUE_SQL)]
}

impl Store {
    /// Prunes every finished job past `policy` at the store's clock, with its events and output, in
    /// transactions of [`DEFAULT_PRUNE_BATCH`] jobs; then gives the freed pages back to the file
    /// system (on a file with `auto_vacuum = INCREMENTAL`) and truncates a WAL past
    /// [`WAL_CHECKPOINT_BYTES`]. Pending, running and teardown-marked jobs are never pruned.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written; the batches committed before
    /// stay pruned.
    pub fn prune(&self, policy: &Retention) -> Result<PruneReport> {
        self.prune_with(policy, &PruneOptions::default())
    }

    /// [`Store::prune`] with a batch size, a limit on batches, or as a dry run that only
    /// counts.
    ///
    /// # Errors
    ///
    /// As [`Store::prune`].
    pub fn prune_with(&self, policy: &Retention, options: &PruneOptions) -> Result<PruneReport> {
        self.prune_at(policy, options, self.now())
    }

    /// [`Store::prune_with`] at `now` rather than the store's clock: for a runner's sweeper,
    /// which reads the time once for a sweep.
    ///
    /// # Errors
    ///
    /// As [`Store::prune`].
    pub fn prune_at(
        &self,
        policy: &Retention,
        options: &PruneOptions,
        now: i64,
    ) -> Result<PruneReport> {
        let mut report = PruneReport {
            dry_run: options.is_dry_run(),
            ..PruneReport::default()
        };
        if options.is_dry_run() {
            report.jobs = count_due(&self.conn, policy, now)?;
            return Ok(report);
        }
        if policy.prunes() {
            let bounds = bounds(&self.conn, policy, now)?;
            while !bounds.is_empty() {
                if options
                    .batch_limit()
                    .is_some_and(|max| report.batches >= u64::from(max))
                    || options.past_deadline()
                {
                    report.more = true;
                    break;
                }
                let started = Instant::now();
                let (jobs, events, outputs) =
                    self.write(|c| delete_batch(c, &bounds, options.batch_size()))?;
                yield_lock(started.elapsed());
                report.batches += 1;
                report.jobs += jobs;
                report.events += events;
                report.outputs += outputs;
                if jobs < u64::from(options.batch_size()) {
                    break;
                }
            }
        }
        // Also when nothing was pruned: a bounded prune may have left free pages behind.
        if let Some(conn) = self.conn.sqlite() {
            report.bytes_freed = incremental_vacuum(conn, options)?;
            // Never wait for another connection here: a checkpoint that finds one busy gives
            // up, and the next prune tries again.
            conn.busy_timeout(Duration::ZERO)?;
            let truncated = checkpoint_if_large(conn, &self.path);
            conn.busy_timeout(self.busy_timeout)?;
            report.wal_truncated = truncated?;
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rendered query plan of `sql` with `values` bound.
    fn plan(conn: &Connection, sql: &str, values: &[&dyn crate::store::db::ToSql]) -> String {
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let mut rows = stmt.query(values).unwrap();
        let mut lines = Vec::new();
        while let Some(row) = rows.next().unwrap() {
            lines.push(row.get::<_, String>(3).unwrap());
        }
        lines.join("\n")
    }

    #[test]
    fn the_prune_reads_a_range_of_the_finished_index() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::Store::open(dir.path().join("jobs.db")).unwrap();
        let conn = store.conn();
        let due = plan(
            conn,
            DUE_SQL.sqlite(),
            &[&"succeeded", &1i64, &2i64, &500i64],
        );
        assert!(
            due.contains("USING INDEX jobs_finished (status=? AND completed_at<?)")
                || due.contains("USING INDEX jobs_finished (status=? AND (completed_at,id)<?)")
                || due.contains("jobs_finished (status=? AND"),
            "{due}"
        );
        assert!(!due.contains("TEMP B-TREE"), "{due}");
        let newest = plan(
            conn,
            "SELECT completed_at, id FROM jobs
             WHERE status = ?1 AND completed_at IS NOT NULL
             ORDER BY completed_at DESC, id DESC",
            &[&"failed"],
        );
        assert!(
            newest.contains("COVERING INDEX jobs_finished (status=?"),
            "{newest}"
        );
        assert!(!newest.contains("TEMP B-TREE"), "{newest}");
    }
}
