//! Bulk enqueues in bounded transactions ([`Store::enqueue_many`](crate::Store::enqueue_many),
//! `jobs add --from-file`), all or nothing to their caller.
//!
//! One transaction for a million jobs would hold the write lock for many seconds, past every
//! runner's lease renewal: each runner would kill its attempts. So a bulk enqueue is cut into
//! slices of at most [`SLICE`] each, and stays all or nothing through a *batch*:
//!
//! 1. A short transaction opens the batch: a `batches` row, `open`, with an expiry that its
//!    writer pushes forward at every slice ([`BATCH_TTL_MS`]).
//! 2. Each slice inserts jobs as one enqueue does, and a *gate* on each: a `job_deps` row
//!    naming `-batch` (no job has a negative id), counted in the job's `waiting`. A gated job is
//!    pending but never claimable, as any waiting job, and no job can be enqueued after it.
//! 3. One short transaction commits the batch (`committed`): from then on its jobs are the
//!    caller's, and its gates are lifted a slice at a time.
//!
//! The invariant: a job carries its batch's gate exactly while the batch is not done, and a
//! gate is only removed together with its effect, in one transaction: lifted (the `job_deps`
//! row deleted and `waiting` counted down) when its batch committed, or deleted with its job
//! (events and all) when its batch was abandoned (its writer failed, or died or stalled past
//! the expiry). A batch's row goes once it has no gate left. Whoever comes next finishes a
//! committed or abandoned batch ([`tidy`]): its own writer at once, and every runner's sweeper.
//! So a process that dies between two slices leaves its jobs all released or all deleted,
//! eventually, each exactly once.
//!
//! On PostgreSQL, plain jobs (no unique key, no dependencies) are written 100 a statement
//! ([`insert_grouped_slice`]), and a list written within [`GROUPED_SLICE`] is one transaction
//! with no batch at all: a transaction of new rows holds no other writer back there.

use std::time::{Duration, Instant};

use crate::store::db::{Connection, Dialect, OptionalExtension, Sql, params, sql};

use crate::error::{Error, Result};
use crate::job::Job;

use super::Store;
use super::counter;
use super::enqueue;
use super::slice::{SLICE, yield_lock};

/// An open batch whose writer has not written a slice for this long is abandoned: its jobs are
/// deleted by whoever tidies next.
pub(super) const BATCH_TTL_MS: i64 = 60_000;

/// Jobs one step of [`tidy`] takes; a slice takes steps until it held the lock [`SLICE`].
const TIDY_ROWS: i64 = 500;

const OPEN: i64 = 0;
const COMMITTED: i64 = 1;
const ABANDONED: i64 = 2;

/// Opens a batch at wall-clock time `clock`; returns its id.
pub(super) fn open(conn: &Connection, clock: i64) -> Result<i64> {
    conn.query_row(
        sql!(
            "INSERT INTO batches (state, created_at, expires_at) VALUES (?1, ?2, ?3) RETURNING id"
        ),
        params![OPEN, clock, clock + BATCH_TTL_MS],
        |r| r.get(0),
    )
}

/// The batch's gate: the `after_id` of its jobs' gate rows in `job_deps`.
fn gate_id(batch: i64) -> i64 {
    -batch
}

/// Gates, counts in `waiting` and announces (`enqueued`) the jobs `ids` of batch `batch`:
/// those a slice inserted, named by the ids their INSERTs returned. Never an id range: on
/// PostgreSQL other writers' jobs take ids between a slice's first and last.
/// Parameters: the ids (a JSON array on SQLite, an array literal `{1,2}` on PostgreSQL), then
/// the gate (the first statement) or now (the last).
const GATE_DEPS_SQL: Sql = Sql::new(
    "INSERT INTO job_deps (job_id, after_id) SELECT value, ?2 FROM json_each(?1)",
    "INSERT INTO job_deps (job_id, after_id) SELECT unnest(?1::bigint[]), ?2",
);
/// See [`GATE_DEPS_SQL`].
const GATE_WAITING_SQL: Sql = Sql::new(
    "UPDATE jobs SET waiting = waiting + 1 WHERE id IN (SELECT value FROM json_each(?1))",
    "UPDATE jobs SET waiting = waiting + 1 FROM unnest(?1::bigint[]) AS g (id)
     WHERE jobs.id = g.id",
);
/// See [`GATE_DEPS_SQL`].
const GATE_EVENTS_SQL: Sql = Sql::new(
    "INSERT INTO job_events (job_id, at, kind, attempt, detail)
     SELECT id, ?2, 'enqueued', 0, queue FROM jobs WHERE id IN (SELECT value FROM json_each(?1))",
    "INSERT INTO job_events (job_id, at, kind, attempt, detail)
     SELECT jobs.id, ?2, 'enqueued', 0, jobs.queue
     FROM jobs JOIN unnest(?1::bigint[]) AS g (id) ON jobs.id = g.id ORDER BY jobs.id",
);

/// On PostgreSQL the list is joined, never matched with `id = ANY (...)`: a grouped first
/// transaction can gate tens of thousands of jobs at once, and a plan that scanned `jobs` and
/// searched the array for each row took 48 s for 24,100 of them (0.7 s joined).
///
/// Runs [`GATE_DEPS_SQL`] and its two siblings (the events only when `announce`: a grouped
/// insert wrote them) for `ids`, and checks that each statement wrote one row per job.
fn gate(conn: &Connection, batch: i64, ids: &[i64], now: i64, announce: bool) -> Result<()> {
    let list = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
    let list = if conn.dialect() == Dialect::Sqlite {
        format!("[{list}]")
    } else {
        format!("{{{list}}}")
    };
    let written = [
        conn.prepare_cached(&GATE_DEPS_SQL)?
            .execute(params![list, gate_id(batch)])?,
        conn.prepare_cached(&GATE_WAITING_SQL)?
            .execute(params![list])?,
        if announce {
            conn.prepare_cached(&GATE_EVENTS_SQL)?
                .execute(params![list, now])?
        } else {
            ids.len()
        },
    ];
    if written.iter().any(|&n| n != ids.len()) {
        return Err(Error::io(
            "a bulk enqueue's slice could not gate the jobs it inserted",
            std::io::Error::other(format!("{} jobs, rows written {written:?}", ids.len())),
        ));
    }
    Ok(())
}

/// One slice of batch `batch`: enqueues the jobs of `jobs` from the first until the slice has
/// held the lock for [`SLICE`], each gated; returns their ids (a duplicate's is the matching
/// job's, as [`enqueue::enqueue`] says). Refuses when the batch is no longer open (it was
/// abandoned: nothing of it will be kept).
pub(super) fn insert_slice(
    conn: &Connection,
    batch: i64,
    jobs: &[Job],
    now: i64,
    clock: i64,
) -> Result<Vec<i64>> {
    let now = conn.now(now)?;
    let started = Instant::now();
    renew(conn, batch, clock)?;
    let mut ids = Vec::new();
    let mut inserted = Vec::new();
    let mut per_queue: std::collections::BTreeMap<&str, usize> = Default::default();
    for job in jobs {
        let (id, new) = enqueue::insert_gated(conn, job, now)?;
        ids.push(id);
        if new {
            inserted.push(id);
            *per_queue.entry(job.queue_name()).or_default() += 1;
        }
        if started.elapsed() >= SLICE {
            break;
        }
    }
    if !inserted.is_empty() {
        gate(conn, batch, &inserted, now, true)?;
    }
    for (queue, n) in per_queue {
        counter::enqueued(conn, queue, n)?;
    }
    Ok(ids)
}

/// Pushes open batch `batch`'s expiry forward from wall-clock time `clock`; refuses when it
/// is no longer open.
fn renew(conn: &Connection, batch: i64, clock: i64) -> Result<()> {
    let renewed = conn
        .prepare_cached(sql!(
            "UPDATE batches SET expires_at = ?3 WHERE id = ?1 AND state = ?2"
        ))?
        .execute(params![batch, OPEN, clock + BATCH_TTL_MS])?;
    if renewed != 1 {
        return Err(abandoned());
    }
    Ok(())
}

/// How long a bulk enqueue of plain jobs on PostgreSQL writes in one transaction, at most
/// (then its last statement, and the commit). New rows hold no other writer back there (no
/// one waits for them; the count shard is one of 16, taken by a try-lock), so the bound is
/// the transaction's length, not a lock's, and longer than [`SLICE`].
pub(super) const GROUPED_SLICE: Duration = Duration::from_secs(1);

/// One transaction of a bulk enqueue of plain jobs on PostgreSQL: writes `jobs` from the
/// first, [`enqueue::GROUPED_STATEMENT`] a statement with their events, until it has taken
/// [`GROUPED_SLICE`]; returns their ids and the batch. The first transaction (`batch` None)
/// writes them ungated: when it wrote the whole list it is the whole enqueue, all or nothing
/// by itself, with no batch, gate or tidy (no second and third version of each row); when
/// jobs are left, it opens the batch and gates what it wrote before it commits, and the
/// later transactions gate theirs, as [`insert_slice`] does.
pub(super) fn insert_grouped_slice(
    conn: &Connection,
    batch: Option<i64>,
    jobs: &[Job],
    now: i64,
    clock: i64,
) -> Result<(Vec<i64>, Option<i64>)> {
    let now = conn.now(now)?;
    let started = Instant::now();
    if let Some(batch) = batch {
        renew(conn, batch, clock)?;
    }
    let mut ids = Vec::new();
    for chunk in jobs.chunks(enqueue::GROUPED_STATEMENT) {
        ids.extend(enqueue::insert_grouped(conn, chunk, now)?);
        if started.elapsed() >= GROUPED_SLICE {
            break;
        }
    }
    let batch = match batch {
        None if ids.len() == jobs.len() => return Ok((ids, None)),
        None => open(conn, clock)?,
        Some(batch) => batch,
    };
    gate(conn, batch, &ids, now, false)?;
    Ok((ids, Some(batch)))
}

/// Commits batch `batch`: its jobs are its caller's from now on (their gates are lifted by
/// [`tidy`]). Refuses when the batch is no longer open.
pub(super) fn commit(conn: &Connection, batch: i64) -> Result<()> {
    let done = conn
        .prepare_cached(sql!(
            "UPDATE batches SET state = ?2 WHERE id = ?1 AND state = ?3"
        ))?
        .execute(params![batch, COMMITTED, OPEN])?;
    if done != 1 {
        return Err(abandoned());
    }
    Ok(())
}

/// Abandons batch `batch` if it is still open: its jobs are deleted by [`tidy`].
pub(super) fn abandon(conn: &Connection, batch: i64) -> Result<()> {
    conn.prepare_cached(sql!(
        "UPDATE batches SET state = ?2 WHERE id = ?1 AND state = ?3"
    ))?
    .execute(params![batch, ABANDONED, OPEN])?;
    Ok(())
}

fn abandoned() -> Error {
    Error::io(
        "the bulk enqueue was abandoned (its process stalled past the batch's expiry, or a \
         slice failed); nothing of it is kept",
        std::io::Error::other("batch no longer open"),
    )
}

/// What one [`tidy`] slice did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Tidied {
    /// Gates lifted from committed batches' jobs.
    pub released: u64,
    /// Jobs of abandoned batches deleted.
    pub deleted: u64,
    /// Whether a committed or abandoned batch (`only`, when given) still has gates.
    pub more: bool,
}

/// The next batch to finish: committed or abandoned, `?2` or any. Parameters: open, only.
/// On PostgreSQL its row is locked until the slice commits: two tidies at once (a bulk
/// enqueue's own and a sweeper's, or two sweepers') take turns on a batch, so that the second
/// reads its gates after the first lifted or deleted them, and lifts each once (two lifts
/// would count a job with dependencies of its own down twice).
const NEXT_SQL: Sql = Sql::new(
    "SELECT id, state FROM batches WHERE state != ?1 AND (?2 IS NULL OR id = ?2)
     ORDER BY id LIMIT 1",
    "SELECT id, state FROM batches WHERE state <> ?1 AND (?2 IS NULL OR id = ?2)
     ORDER BY id LIMIT 1 FOR UPDATE",
);

/// One slice of finishing batches (batch `only`, or any): abandons the open batches past
/// their expiry at wall-clock time `clock`, then lifts the gates of a committed batch, or
/// deletes the jobs of an abandoned one, until the slice has held the lock for [`SLICE`].
pub(super) fn tidy(conn: &Connection, only: Option<i64>, clock: i64) -> Result<Tidied> {
    let started = Instant::now();
    conn.prepare_cached(sql!(
        "UPDATE batches SET state = ?1 WHERE state = ?2 AND expires_at < ?3"
    ))?
    .execute(params![ABANDONED, OPEN, clock])?;
    let mut done = Tidied::default();
    loop {
        let next: Option<(i64, i64)> = conn
            .prepare_cached(&NEXT_SQL)?
            .query_row(params![OPEN, only], |r| r.try_into())
            .optional()?;
        let Some((batch, state)) = next else {
            return Ok(done);
        };
        let jobs: Vec<i64> = {
            let mut stmt = conn.prepare_cached(
                sql!(
                    sqlite: "SELECT job_id FROM job_deps WHERE after_id = ?1 ORDER BY job_id LIMIT (SELECT ?2)",
                    postgres: "SELECT job_id FROM job_deps WHERE after_id = ?1 ORDER BY job_id LIMIT ?2",
                ),
            )?;
            let rows = stmt.query_map(params![gate_id(batch), TIDY_ROWS], |r| r.get(0))?;
            rows.collect::<Result<_>>()?
        };
        if jobs.is_empty() {
            conn.prepare_cached(sql!("DELETE FROM batches WHERE id = ?1"))?
                .execute([batch])?;
            continue;
        }
        let last = jobs[jobs.len() - 1];
        if state == COMMITTED {
            // The gate and its count, together, for the jobs read (the batch's first gates).
            conn.prepare_cached(sql!(
                "UPDATE jobs SET waiting = waiting - 1 WHERE waiting > 0 AND id IN
                     (SELECT job_id FROM job_deps WHERE after_id = ?1 AND job_id <= ?2)"
            ))?
            .execute(params![gate_id(batch), last])?;
            conn.prepare_cached(sql!(
                "DELETE FROM job_deps WHERE after_id = ?1 AND job_id <= ?2"
            ))?
            .execute(params![gate_id(batch), last])?;
            done.released += jobs.len() as u64;
        } else {
            for job in &jobs {
                conn.prepare_cached(sql!("DELETE FROM job_events WHERE job_id = ?1"))?
                    .execute([job])?;
                // Its `job_deps` rows (the gate too) go with it.
                conn.prepare_cached(sql!("DELETE FROM jobs WHERE id = ?1"))?
                    .execute([job])?;
            }
            done.deleted += jobs.len() as u64;
        }
        if started.elapsed() >= SLICE {
            done.more = true;
            return Ok(done);
        }
    }
}

/// The statements of this file that are `const` items, for the test that prepares every
/// statement (`store/statements.rs`).
#[cfg(test)]
pub(super) fn statements() -> Vec<(&'static str, Sql)> {
    vec![
        ("GATE_DEPS_SQL", GATE_DEPS_SQL),
        ("GATE_WAITING_SQL", GATE_WAITING_SQL),
        ("GATE_EVENTS_SQL", GATE_EVENTS_SQL),
        ("NEXT_SQL", NEXT_SQL),
    ]
}

impl Store {
    /// Enqueues many jobs, all or none. Returns their ids in order, once every job is ready to
    /// be claimed.
    ///
    /// The jobs are written in transactions that hold the write lock for about 50 ms each,
    /// never for the whole list, so that runners on the file keep renewing their leases. Until
    /// the last of them commits, the jobs written so far exist but wait (pending, never
    /// claimed, and no job can be enqueued after them); when a write fails, or this process
    /// dies or stalls for 60 s between two of them, they are deleted, by this call
    /// or by the next runner's sweep. See *Bulk enqueue* in docs/commands.md.
    ///
    /// # Errors
    ///
    /// As [`Store::enqueue`]; nothing is kept when any job is invalid or refused, or when the
    /// database cannot be written.
    pub fn enqueue_many(&self, jobs: &[Job]) -> Result<Vec<i64>> {
        self.enqueue_many_at(jobs, self.now())
    }

    /// [`Store::enqueue_many`] at `now` rather than the store's clock.
    ///
    /// # Errors
    ///
    /// As [`Store::enqueue_many`].
    pub fn enqueue_many_at(&self, jobs: &[Job], now: i64) -> Result<Vec<i64>> {
        self.enqueue_many_with_progress_at(jobs, now, &mut |_| {})
    }

    /// [`Store::enqueue_many`], telling `progress` how many jobs are in so far (after every
    /// transaction), for a progress bar. Still all or none: a count told before a failure is
    /// not kept.
    ///
    /// # Errors
    ///
    /// As [`Store::enqueue_many`].
    pub fn enqueue_many_with_progress(
        &self,
        jobs: &[Job],
        progress: &mut dyn FnMut(usize),
    ) -> Result<Vec<i64>> {
        self.enqueue_many_with_progress_at(jobs, self.now(), progress)
    }

    fn enqueue_many_with_progress_at(
        &self,
        jobs: &[Job],
        now: i64,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Vec<i64>> {
        for job in jobs {
            job.validate_at(now)?;
        }
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        if self.conn().dialect() != Dialect::Sqlite && jobs.iter().all(enqueue::groupable) {
            return self.enqueue_grouped(jobs, now, progress);
        }
        let batch = self.write(|c| open(c, self.now()))?;
        let mut ids = Vec::with_capacity(jobs.len());
        let written = (|| {
            while ids.len() < jobs.len() {
                let started = Instant::now();
                let rest = &jobs[ids.len()..];
                let slice = self.write(|c| insert_slice(c, batch, rest, now, self.now()))?;
                ids.extend(slice);
                progress(ids.len());
                yield_lock(started.elapsed());
            }
            self.write(|c| commit(c, batch))
        })();
        self.end_batch(batch, written)?;
        Ok(ids)
    }

    /// A bulk enqueue of plain jobs on PostgreSQL ([`insert_grouped_slice`]): one transaction
    /// when the list takes at most [`GROUPED_SLICE`] to write, else a batch as
    /// [`Store::enqueue_many`] makes on SQLite.
    fn enqueue_grouped(
        &self,
        jobs: &[Job],
        now: i64,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Vec<i64>> {
        let (mut ids, batch) =
            self.write(|c| insert_grouped_slice(c, None, jobs, now, self.now()))?;
        progress(ids.len());
        let Some(batch) = batch else {
            self.poke();
            return Ok(ids);
        };
        let written = (|| {
            while ids.len() < jobs.len() {
                let rest = &jobs[ids.len()..];
                let (slice, _) =
                    self.write(|c| insert_grouped_slice(c, Some(batch), rest, now, self.now()))?;
                ids.extend(slice);
                progress(ids.len());
            }
            self.write(|c| commit(c, batch))
        })();
        self.end_batch(batch, written)?;
        Ok(ids)
    }

    /// After a bulk enqueue's slices were `written` (or failed) into batch `batch`: lifts its
    /// gates, or abandons it and deletes its jobs (best effort: a batch left open is abandoned
    /// at its expiry, and every tidy deletes an abandoned batch's jobs).
    fn end_batch(&self, batch: i64, written: Result<()>) -> Result<()> {
        if let Err(e) = written {
            if self.write(|c| abandon(c, batch)).is_ok() {
                let _ = self.tidy_batches(Some(batch), None);
            }
            return Err(e);
        }
        self.tidy_batches(Some(batch), None)?;
        self.poke();
        Ok(())
    }

    /// Finishes bulk enqueues ([`Store::enqueue_many`]) left behind, batch `only` or all, in
    /// slices that each hold the write lock about 50 ms: lifts the gates of committed ones, and
    /// deletes the jobs of abandoned ones (those whose process failed, or died or stalled for
    /// 60 s). Runners call it from their sweeps, with a `deadline` past which it
    /// starts no slice. Returns the gates lifted and the jobs deleted.
    pub(crate) fn tidy_batches(
        &self,
        only: Option<i64>,
        deadline: Option<Instant>,
    ) -> Result<(u64, u64)> {
        let (mut released, mut deleted) = (0, 0);
        loop {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok((released, deleted));
            }
            let started = Instant::now();
            let done = self.write(|c| tidy(c, only, self.now()))?;
            released += done.released;
            deleted += done.deleted;
            if !done.more {
                return Ok((released, deleted));
            }
            yield_lock(started.elapsed());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    const T0: i64 = 1_700_000_000_000;

    fn jobs(n: usize) -> Vec<Job> {
        (0..n).map(|i| Job::shell(format!("true {i}"))).collect()
    }

    /// (jobs, jobs ready to claim, gates, batches, pending in `job_counts`).
    fn census(store: &Store) -> (i64, i64, i64, i64, i64) {
        store
            .conn()
            .query_row(
                "SELECT (SELECT count(*) FROM jobs),
                        (SELECT count(*) FROM jobs WHERE status = 'pending' AND waiting = 0),
                        (SELECT count(*) FROM job_deps WHERE after_id < 0),
                        (SELECT count(*) FROM batches),
                        (SELECT coalesce(sum(n), 0) FROM job_counts WHERE status = 'pending')",
                params![],
                |r| r.try_into(),
            )
            .unwrap()
    }

    /// Writes `n` jobs into a new batch as its writer would, slice by slice, without the end.
    fn write_batch(store: &Store, n: usize, clock: i64) -> i64 {
        let all = jobs(n);
        let batch = store.write(|c| open(c, clock)).unwrap();
        let mut done = 0;
        while done < n {
            done += store
                .write(|c| insert_slice(c, batch, &all[done..], T0, clock))
                .unwrap()
                .len();
        }
        batch
    }

    #[test]
    fn a_committed_batch_whose_writer_died_is_released_once_by_the_next_tidy() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("jobs.db")).unwrap();
        let clock = crate::job::now_ms();
        let batch = write_batch(&store, 3_000, clock);
        store.write(|c| commit(c, batch)).unwrap();
        // The writer dies here: nothing is claimable yet, every job is counted.
        assert_eq!(census(&store), (3_000, 0, 3_000, 1, 3_000));
        // A tidy of another batch, or an open one's, leaves it alone; any tidy finishes it.
        assert_eq!(
            store.write(|c| tidy(c, Some(batch + 1), clock)).unwrap(),
            Tidied::default()
        );
        assert_eq!(store.tidy_batches(None, None).unwrap(), (3_000, 0));
        assert_eq!(census(&store), (3_000, 3_000, 0, 0, 3_000));
        // Exactly once: another tidy changes nothing.
        assert_eq!(store.tidy_batches(None, None).unwrap(), (0, 0));
        assert_eq!(census(&store), (3_000, 3_000, 0, 0, 3_000));
    }

    #[test]
    fn an_open_batch_past_its_expiry_is_deleted_and_its_writer_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("jobs.db")).unwrap();
        let before = store.enqueue_at(&Job::shell("true"), T0).unwrap();
        let clock = crate::job::now_ms();
        let batch = write_batch(&store, 2_000, clock);
        // Within the expiry, a tidy leaves the open batch to its writer.
        assert_eq!(
            store.write(|c| tidy(c, None, clock + 1)).unwrap(),
            Tidied::default()
        );
        assert_eq!(census(&store), (2_001, 1, 2_000, 1, 2_001));
        // Past it (the writer stalled or died), the jobs go, events and counts too.
        let late = clock + BATCH_TTL_MS + 1;
        let mut deleted = 0;
        loop {
            let t = store.write(|c| tidy(c, None, late)).unwrap();
            deleted += t.deleted;
            if !t.more {
                break;
            }
        }
        assert_eq!(deleted, 2_000);
        assert_eq!(census(&store), (1, 1, 0, 0, 1));
        let events: i64 = store
            .conn()
            .query_row("SELECT count(*) FROM job_events", params![], |r| r.get(0))
            .unwrap();
        assert_eq!(events, 1);
        assert_eq!(store.job(before).unwrap().id, before);
        // The writer, back, cannot write or commit a slice of it.
        assert!(
            store
                .write(|c| insert_slice(c, batch, &jobs(1), T0, late))
                .is_err()
        );
        assert!(store.write(|c| commit(c, batch)).is_err());
    }

    #[test]
    fn a_job_of_an_unfinished_batch_cannot_be_named_by_after() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("jobs.db")).unwrap();
        let batch = write_batch(&store, 1, crate::job::now_ms());
        let id: i64 = store
            .conn()
            .query_row("SELECT max(id) FROM jobs", params![], |r| r.get(0))
            .unwrap();
        let e = store
            .enqueue_at(&Job::shell("true").after([id]), T0)
            .unwrap_err();
        assert!(e.to_string().contains("bulk enqueue"), "{e}");
        store.write(|c| commit(c, batch)).unwrap();
        store.tidy_batches(None, None).unwrap();
        store
            .enqueue_at(&Job::shell("true").after([id]), T0)
            .unwrap();
    }
}
