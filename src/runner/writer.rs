//! The writer: one thread that owns the runner's write connection and commits the writes of
//! all its workers in shared transactions (group commit).
//!
//! With `synchronous = FULL` every commit waits for the disk. One transaction per transition
//! would make the disk, not the processes, the runner's limit; sharing a commit among the
//! transitions that are ready at the same moment keeps FULL's guarantee (each transition is
//! durable before anyone is told of it) at a fraction of the cost.
//!
//! Only a claim is waited for (a worker may be idle until it commits), so a claim is committed
//! at once, together with whatever else is queued. A start or an ending is waited for by nobody:
//! the writer lets those gather for up to [`LINGER`] (or until a claim arrives) before it
//! commits them, so that one commit serves many of them. Without this, on a fast disk the
//! writer commits almost every write on its own, and the commits' CPU cost (WAL frames,
//! checksums, locks, the flush) becomes the runner's limit.
//!
//! An attempt's start and its ending that fall in one batch (a short job's) are applied as
//! one write: the ending's statement writes the process too, and its event row records the
//! start ([`store::finish_started`]), so such a job costs one event row and one UPDATE fewer.
//! A claim and its attempt's start never share a batch: the worker spawns the attempt only
//! once the claim is committed. A batch retried in savepoints (below) pairs nothing.
//!
//! A batch is first applied as plain statements. If one write fails, the transaction is
//! rolled back and the batch applied again with each write in its own savepoint, so one that
//! fails does not undo the others; savepoints cost a copy of every page they touch, which the
//! common case does without.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::store::db::Connection;
use crossbeam_channel::{Receiver, Sender, TryRecvError};

use crate::error::{Error, Result};
use crate::job::Status;
use crate::store::{self, AttemptStart, ClaimRequest, Claimed, Finish, Finished, Store};

use super::shared::{LINGER, Op, Shared, WriterLoop};

/// How many queued writes one transaction takes at most.
const MAX_BATCH: usize = 256;

/// What one queued write became, to act on after the commit.
enum Done {
    Claimed(Sender<Result<Vec<Claimed>>>, Result<Vec<Claimed>>),
    Started,
    Finished(Box<Finish>, Result<Finished>),
}

impl WriterLoop {
    /// Commits batches until every handle is gone: the runner drops its handles only after
    /// its workers and dispatcher are joined, so no write is lost.
    pub(crate) fn run(self, store: &Store, shared: &Shared) {
        let mut held = Held::default();
        while let Some(batch) = next_batch(&self.urgent, &self.lazy) {
            shared.test_hook("writer");
            let done = commit(store, shared, &self, &mut held, batch);
            after_commit(shared, done);
        }
    }
}

/// Waits for writes and returns the next batch; None once both channels are closed and empty.
fn next_batch(urgent: &Receiver<Op>, lazy: &Receiver<Op>) -> Option<Vec<Op>> {
    let first = {
        let mut sel = crossbeam_channel::Select::new();
        let u = sel.recv(urgent);
        sel.recv(lazy);
        let ready = sel.select();
        let (rx, other) = if ready.index() == u {
            (urgent, lazy)
        } else {
            (lazy, urgent)
        };
        match ready.recv(rx) {
            Ok(op) => op,
            // That channel is closed (so is the other: one handle holds both): drain the
            // other to its end.
            Err(_) => other.recv().ok()?,
        }
    };
    let linger = !matches!(first, Op::Claim { .. });
    let mut batch = Vec::with_capacity(16);
    batch.push(first);
    if linger {
        // Let starts and endings gather; only a claim (or the end) cuts the wait short. The
        // lazy channel is not watched meanwhile, so its senders do not wake this thread.
        if let Ok(op) = urgent.recv_timeout(LINGER) {
            batch.push(op);
        }
    }
    drain(urgent, &mut batch);
    drain(lazy, &mut batch);
    Some(batch)
}

fn drain(rx: &Receiver<Op>, batch: &mut Vec<Op>) {
    while batch.len() < MAX_BATCH {
        match rx.try_recv() {
            Ok(op) => batch.push(op),
            Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
        }
    }
}

/// Applies a batch in one transaction, retrying while the database is busy, full or failing:
/// a write queued here is never dropped, only delayed (and fenced, if the lease moved on
/// meanwhile). Only a runner that is shutting down gives up, once the trouble has lasted a
/// lease TTL: its leases have run out by then, and a sweeper reclaims what it could not record.
fn commit(
    store: &Store,
    shared: &Shared,
    queues: &WriterLoop,
    held: &mut Held,
    mut batch: Vec<Op>,
) -> Vec<Done> {
    let started = Instant::now();
    let mut warned = false;
    // Plain statements first; savepoints only to retry a batch in which a write failed.
    let mut savepoints = false;
    let stopping = || shared.shutting_down.load(Ordering::SeqCst);
    loop {
        let ctx = Ctx {
            worker_id: shared.worker_id.as_str(),
            queues: shared.config.queues.as_slice(),
            lease_ttl: shared.config.lease_ttl,
            now: shared.config.clock.now_ms(),
            unheld: shared.unheld(),
        };
        let commit_started = Instant::now();
        let mut write_failed = false;
        let mut next_due = None;
        // A batch retried in savepoints applies each write alone, as it did before pairing: a
        // start that fails then costs only itself, never its ending.
        let pairs = if savepoints {
            vec![Pair::Alone; batch.len()]
        } else {
            pairs(&batch)
        };
        let attempt = store::transaction(store.conn(), &mut |conn| {
            let applied = apply_batch(conn, &batch, &pairs, savepoints, &ctx)
                .inspect_err(|_| write_failed = !savepoints)?;
            next_due = look_ahead(conn, &batch, &applied, &ctx)?;
            Ok(applied)
        });
        match attempt {
            // The file is damaged: the runner stops, and nothing more is written to it.
            Err(e) if shared.stop_if_damaged("writer", &e) => return give_up(batch, &e),
            // The transaction is rolled back: apply the batch again, one savepoint a write
            // (a full disk fails the whole transaction, below, whatever the mode).
            Err(e) if write_failed && !savepoints && !e.is_full() && !e.is_busy() => {
                savepoints = true;
            }
            Ok(results) => {
                held.recovered(batch.len());
                if let Some(due) = next_due {
                    let with_claim = batch.iter().any(|op| matches!(op, Op::Claim { .. }));
                    shared.set_next_due(due, with_claim);
                }
                // A slow commit counts at once and is forgotten slowly (an eighth a commit):
                // the dispatcher sizes its claim-ahead for the disk's bad moments, not its mean.
                let took = u64::try_from(commit_started.elapsed().as_nanos()).unwrap_or(u64::MAX);
                let order = Ordering::Relaxed;
                let before = shared.commit_nanos.load(order);
                shared
                    .commit_nanos
                    .store(took.max(before - before / 8), order);
                let mut done = Vec::with_capacity(batch.len());
                let mut failed = Vec::new();
                for (op, result) in batch.into_iter().zip(results) {
                    match (op, result) {
                        (Op::Claim { reply, .. }, Applied::Claimed(r)) => {
                            done.push(Done::Claimed(reply, r));
                        }
                        // An ending that failed in its own savepoint is held and tried again,
                        // as a full disk's are: given up on, it would leave its job running
                        // under this runner until the lease ran out, and then run it again.
                        (Op::Finish(f), Applied::Finished(Err(e))) => failed.push((f, e)),
                        (Op::Finish(f), Applied::Finished(r)) => done.push(Done::Finished(f, r)),
                        _ => done.push(Done::Started),
                    }
                }
                let Some((_, e)) = failed.first() else {
                    return done;
                };
                if let Error::Damaged { reason } = e
                    && shared.stop_if_damaged("writer", e)
                {
                    let e = Error::Damaged {
                        reason: reason.clone(),
                    };
                    after_commit(shared, done);
                    let batch = failed.into_iter().map(|(f, _)| Op::Finish(f)).collect();
                    return give_up(batch, &e);
                }
                let e = Error::io(
                    "cannot record an ending",
                    std::io::Error::other(format!("{e:#}")),
                );
                // What was committed is acted on now; the failed endings wait their turn.
                after_commit(shared, done);
                batch = failed.into_iter().map(|(f, _)| Op::Finish(f)).collect();
                let lasted = held.failed(&batch, &e);
                if stopping() && lasted > shared.config.lease_ttl {
                    log::error!("{e:#}; giving up on {} endings to shut down", batch.len());
                    return give_up(batch, &e);
                }
                held.wait(&mut batch, queues, &e);
                savepoints = false;
            }
            Err(e) if e.is_busy() => {
                if stopping() {
                    // Nobody needs a claim any more: answer them now, so that the dispatcher
                    // (and the shutdown joining it) is not held behind another process's lock.
                    batch = refuse_claims(batch, &e);
                    if batch.is_empty() {
                        return Vec::new();
                    }
                    if started.elapsed() > shared.config.lease_ttl {
                        log::error!(
                            "database is busy for {:.1?}; giving up on {} writes to shut down",
                            started.elapsed(),
                            batch.len()
                        );
                        return give_up(batch, &e);
                    }
                }
                if !warned && started.elapsed() > Duration::from_secs(1) {
                    log::warn!("database is busy; {} writes are waiting", batch.len());
                    warned = true;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            // The disk or the database is full, or the transaction itself failed (an I/O
            // error): nothing of the batch was stored. Keep it and try again until the
            // database takes writes again; claims are refused meanwhile (a runner that cannot
            // write claims nothing).
            Err(e) => {
                let lasted = held.failed(&batch, &e);
                if stopping() && lasted > shared.config.lease_ttl {
                    // The runner is stopping and the trouble is not going away: do not hold
                    // its shutdown forever. An ending given up on leaves its lease to expire.
                    log::error!("{e:#}; giving up on {} writes to shut down", batch.len());
                    return give_up(batch, &e);
                }
                held.wait(&mut batch, queues, &e);
                if batch.is_empty() {
                    // Only claims, all refused.
                    return Vec::new();
                }
                savepoints = false;
            }
        }
    }
}

/// Answers the claims of `batch` with an error and returns the rest.
fn refuse_claims(batch: Vec<Op>, e: &Error) -> Vec<Op> {
    batch
        .into_iter()
        .filter_map(|op| match op {
            Op::Claim { reply, .. } => {
                // The dispatcher waits for this reply; it is gone only if it died meanwhile.
                let _ = reply.send(Err(refusal(e)));
                None
            }
            other => Some(other),
        })
        .collect()
}

/// Answers every write of a batch that cannot be committed with an error.
fn give_up(batch: Vec<Op>, e: &Error) -> Vec<Done> {
    let error = || {
        Error::io(
            "cannot write to the database",
            std::io::Error::other(format!("{e:#}")),
        )
    };
    batch
        .into_iter()
        .map(|op| match op {
            Op::Claim { reply, .. } => Done::Claimed(reply, Err(error())),
            Op::Start(_) => Done::Started,
            Op::Finish(f) => Done::Finished(f, Err(error())),
        })
        .collect()
}

/// The error a claim is refused with while writes fail with `e`: [`Error::Full`] for a full
/// disk, so that the dispatcher waits it out quietly.
fn refusal(e: &Error) -> Error {
    if e.is_full() {
        full_error(e)
    } else {
        Error::io(
            "cannot write to the database",
            std::io::Error::other(format!("{e:#}")),
        )
    }
}

/// The error a claim is refused with while the disk is full.
fn full_error(e: &Error) -> Error {
    let code = rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL);
    Error::Full(rusqlite::Error::SqliteFailure(code, Some(format!("{e:#}"))))
}

/// The first wait after a transaction failed; it doubles up to [`HELD_BACKOFF_MAX`].
const HELD_BACKOFF_MIN: Duration = Duration::from_millis(100);
const HELD_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How often held writes are logged while the trouble lasts.
const HELD_WARN_EVERY: Duration = Duration::from_secs(60);

/// Writes the database does not take (a full disk, an I/O error, an ending that fails), while
/// that lasts: the writer holds them in memory and retries them. It lives as long as the
/// writer, so that it is logged once a minute, not once a batch.
#[derive(Default)]
struct Held {
    /// When the writes began to fail; None while they do not.
    since: Option<Instant>,
    backoff: Duration,
    /// When it was last logged.
    warned: Option<Instant>,
    /// Transactions failed since `since`.
    failures: u64,
    /// Whether the last failure was for space.
    full: bool,
}

impl Held {
    /// Counts a failed transaction and logs it once a minute; returns how long writes have
    /// been failing.
    fn failed(&mut self, batch: &[Op], e: &Error) -> Duration {
        let since = *self.since.get_or_insert_with(Instant::now);
        self.failures += 1;
        self.full = e.is_full();
        if self.warned.is_none_or(|at| at.elapsed() >= HELD_WARN_EVERY) {
            let endings = batch
                .iter()
                .filter(|op| matches!(op, Op::Finish(_)))
                .count();
            let what = if self.full {
                "database or disk is full".to_string()
            } else {
                format!("{e:#}")
            };
            log::warn!(
                "{what}: holding {} writes ({endings} endings) in memory and retrying; {} \
                 failed attempts in {:.0?}",
                batch.len(),
                self.failures,
                since.elapsed()
            );
            self.warned = Some(Instant::now());
        }
        since.elapsed()
    }

    /// Refuses the batch's claims (nothing of them was written: the runner claims nothing),
    /// then waits out the backoff before the next try. Writes that arrive meanwhile join the
    /// batch behind it, in their order; claims among them are refused at once, so that the
    /// dispatcher is not held (nor the runner's shutdown behind it).
    fn wait(&mut self, batch: &mut Vec<Op>, queues: &WriterLoop, e: &Error) {
        let deadline = Instant::now() + self.backoff.max(HELD_BACKOFF_MIN);
        self.backoff = (self.backoff * 2).clamp(HELD_BACKOFF_MIN, HELD_BACKOFF_MAX);
        let take = |op: Op, batch: &mut Vec<Op>| match op {
            Op::Claim { reply, .. } => {
                // The dispatcher waits for this reply; it is gone only if it died meanwhile.
                let _ = reply.send(Err(refusal(e)));
            }
            other => batch.push(other),
        };
        for op in std::mem::take(batch) {
            take(op, batch);
        }
        loop {
            match queues.urgent.recv_deadline(deadline) {
                Ok(op) => take(op, batch),
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => break,
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
                    break;
                }
            }
        }
        while let Ok(op) = queues.lazy.try_recv() {
            take(op, batch);
        }
    }

    /// A transaction committed: if writes were failing, they no longer are.
    fn recovered(&mut self, writes: usize) {
        if let Some(since) = self.since.take() {
            log::warn!(
                "{}: {writes} held writes recorded after {:.1?} and {} failed attempts",
                if self.full {
                    "space is back"
                } else {
                    "the database takes writes again"
                },
                since.elapsed(),
                self.failures
            );
            self.failures = 0;
            self.backoff = HELD_BACKOFF_MIN;
        }
    }
}

/// How one write of a batch is applied: on its own, or as part of another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pair {
    /// On its own.
    Alone,
    /// A start that the ending at this index records with it.
    StartOf(usize),
    /// An ending that records the start at this index with it.
    EndingOf(usize),
}

/// Pairs each ending of `batch` with its attempt's start (same job, same run token) when that
/// start comes earlier in the batch: a worker queues the start before the ending, on one
/// channel, so it always does when both are in the batch.
fn pairs(batch: &[Op]) -> Vec<Pair> {
    let mut pairs = vec![Pair::Alone; batch.len()];
    let mut starts: HashMap<(i64, &str), usize> = HashMap::new();
    for (i, op) in batch.iter().enumerate() {
        match op {
            Op::Start(s) => {
                starts.insert((s.job_id, s.run_token.as_str()), i);
            }
            Op::Finish(f) => {
                if let Some(start) = starts.remove(&(f.job_id, f.run_token.as_str())) {
                    pairs[start] = Pair::StartOf(i);
                    pairs[i] = Pair::EndingOf(start);
                }
            }
            Op::Claim { .. } => {}
        }
    }
    pairs
}

enum Applied {
    Claimed(Result<Vec<Claimed>>),
    Started,
    Finished(Result<Finished>),
}

/// What every write of one transaction shares: the runner's identity and settings, and the
/// transaction's time.
struct Ctx<'a> {
    worker_id: &'a str,
    queues: &'a [String],
    lease_ttl: Duration,
    now: i64,
    /// The conditions that do not hold now: a claim leaves out the jobs that need them.
    unheld: u32,
}

/// When the next job not due yet becomes due, read in the transaction of a claim (which took
/// what was due) or of an ending that scheduled a retry; None when the batch has neither. A
/// failed read fails the transaction: on PostgreSQL it aborted it, whose COMMIT would then
/// store nothing (see [`Error::Aborted`]).
fn look_ahead(
    conn: &Connection,
    batch: &[Op],
    applied: &[Applied],
    ctx: &Ctx<'_>,
) -> Result<Option<Option<i64>>> {
    let wanted = batch.iter().zip(applied).any(|(op, a)| {
        matches!(op, Op::Claim { .. })
            || matches!(
                a,
                Applied::Finished(Ok(Finished::Recorded(Status::Pending)))
            )
    });
    if !wanted {
        return Ok(None);
    }
    store::next_due(conn, ctx.queues, ctx.now).map(Some)
}

/// Applies the writes of `batch`, each paired start with its ending: as plain statements, or
/// each in its own savepoint.
///
/// On PostgreSQL the jobs the batch starts and ends are locked first, together and in id
/// order ([`store::lock_running`]), then the jobs those endings may release or cancel
/// ([`store::lock_dependents`]), before any write of the batch: the heartbeat renews the
/// same rows in the same order, and other runners' writers take shared dependents in the
/// same order, so none of them waits for another in a circle (each would otherwise wait for
/// the other's commit until the server's deadlock detector, a second later, broke the circle
/// by failing one). The writes then run in the batch's order. On SQLite this is nothing.
fn apply_batch(
    conn: &Connection,
    batch: &[Op],
    pairs: &[Pair],
    savepoints: bool,
    ctx: &Ctx<'_>,
) -> Result<Vec<Applied>> {
    let running: Vec<i64> = batch
        .iter()
        .filter_map(|op| match op {
            Op::Start(s) => Some(s.job_id),
            Op::Finish(f) => Some(f.job_id),
            Op::Claim { .. } => None,
        })
        .collect();
    store::lock_running(conn, &running)?;
    let ending: Vec<i64> = batch
        .iter()
        .filter_map(|op| match op {
            Op::Finish(f) => Some(f.job_id),
            _ => None,
        })
        .collect();
    store::lock_dependents(conn, &ending)?;
    let start_of = |pair: &Pair| match *pair {
        Pair::EndingOf(i) => match &batch[i] {
            Op::Start(s) => Some(s),
            _ => None,
        },
        _ => None,
    };
    // Plain statements: the endings together, where the first of them comes
    // ([`store::finish_group`]: on PostgreSQL the successes in one statement).
    let mut grouped = if savepoints {
        Vec::new()
    } else {
        let endings: Vec<(&Finish, Option<&AttemptStart>)> = batch
            .iter()
            .zip(pairs)
            .filter_map(|(op, pair)| match op {
                Op::Finish(f) => Some((&**f, start_of(pair))),
                _ => None,
            })
            .collect();
        if endings.is_empty() {
            Vec::new()
        } else {
            store::finish_group(conn, &endings, ctx.now)?
        }
    }
    .into_iter();
    let mut applied = Vec::with_capacity(batch.len());
    for (op, pair) in batch.iter().zip(pairs) {
        if let Pair::StartOf(_) = pair {
            // Recorded with its ending.
            applied.push(Applied::Started);
            continue;
        }
        let start = start_of(pair);
        applied.push(match op {
            // finish_group answers each ending it is given, in order: one a Finish here.
            Op::Finish(_) if !savepoints => Applied::Finished(Ok(grouped
                .next()
                .expect("finish_group answers each ending it is given"))),
            _ if savepoints => apply(conn, op, start, ctx)?,
            _ => apply_op(conn, op, start, ctx)?,
        });
    }
    Ok(applied)
}

/// Applies one write as plain statements; a failure may leave part of it applied. An ending
/// given its attempt's `start` records both.
fn apply_op(
    conn: &Connection,
    op: &Op,
    start: Option<&AttemptStart>,
    ctx: &Ctx<'_>,
) -> Result<Applied> {
    let now = ctx.now;
    Ok(match op {
        Op::Claim { limit, caps, .. } => {
            let req = ClaimRequest {
                worker_id: ctx.worker_id,
                limit: *limit,
                queues: ctx.queues,
                lease_ttl: ctx.lease_ttl,
                queue_caps: caps,
                unheld: ctx.unheld,
            };
            Applied::Claimed(Ok(store::claim(conn, &req, now)?))
        }
        Op::Start(s) => {
            store::record_start(conn, s, now)?;
            Applied::Started
        }
        Op::Finish(f) => Applied::Finished(Ok(match start {
            Some(s) => store::finish_started(conn, s, f, now)?,
            None => store::finish_attempt(conn, f, now)?,
        })),
    })
}

/// Applies one write inside a savepoint, so that its failure undoes only itself. What fails
/// the transaction rather than the write fails the whole batch, to be retried whole, never
/// recorded as the write's own failure: a full disk (SQLite may have rolled it back
/// already), a busy database or a lost connection (which took the transaction with it), or
/// the savepoint's own statements (see [`store::savepoint`]).
fn apply(
    conn: &Connection,
    op: &Op,
    start: Option<&AttemptStart>,
    ctx: &Ctx<'_>,
) -> Result<Applied> {
    let result = store::savepoint(conn, |conn| apply_op(conn, op, start, ctx))?;
    Ok(match (op, result) {
        (_, Ok(a)) => a,
        (Op::Claim { .. }, Err(e)) => Applied::Claimed(Err(e)),
        (Op::Start(s), Err(e)) => {
            log::error!("cannot record the start of job {}: {e:#}", s.job_id);
            Applied::Started
        }
        (Op::Finish(_), Err(e)) => Applied::Finished(Err(e)),
    })
}

fn after_commit(shared: &Shared, done: Vec<Done>) {
    let mut ended = false;
    for d in done {
        match d {
            Done::Claimed(reply, result) => {
                // The dispatcher waits for its reply, so this send fails only when the
                // dispatcher thread died meanwhile. The runner has then fenced itself: its
                // heartbeat stops, these claims' leases run out, and a sweeper reclaims them.
                if reply.send(result).is_err() {
                    log::warn!("a claim's reply found the dispatcher gone");
                }
            }
            Done::Started => {}
            Done::Finished(f, result) => {
                ended = true;
                shared.attempt_done(&f.run_token);
                match result {
                    Ok(Finished::Recorded(status)) => {
                        log::debug!("job {} attempt {}: {}", f.job_id, f.attempt, status);
                    }
                    Ok(Finished::Stopped) => log::debug!(
                        "job {} attempt {}: stopped by its cancel",
                        f.job_id,
                        f.attempt
                    ),
                    Ok(Finished::Fenced) => log::info!(
                        "job {} attempt {}: lease no longer held, result discarded",
                        f.job_id,
                        f.attempt
                    ),
                    Err(e) => log::error!(
                        "cannot record the ending of job {} attempt {}: {e:#}",
                        f.job_id,
                        f.attempt
                    ),
                }
            }
        }
    }
    if ended {
        shared.endings_changed();
        // An ending frees a place under a queue limit and may release the jobs that run
        // after it: a dispatcher whose last claim came back short claims again now, not at
        // its next poll.
        if shared.claim_short.load(Ordering::Relaxed) {
            shared.wake_dispatcher();
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::store::db::params;
    use std::sync::Arc;

    use super::*;
    use crate::job::{Job, Output, Status};
    use crate::runner::Runner;
    use crate::store::Ending;

    /// An attempt's start and its ending queued in one batch are applied as one write: one
    /// event row (enqueued, claimed, then the ending carrying the start), the job keeps the
    /// attempt's pid, and the history reads started then the ending at the commit's time. A
    /// start whose ending is not in the batch is recorded alone, as before.
    #[test]
    fn a_start_and_its_ending_in_one_batch_write_one_event_row() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("jobs.db");
        let config = Runner::builder(&path).config;
        let shared = Arc::new(Shared::new(config, "w1".to_string()));
        let (_writer, queues) = super::super::shared::Writer::new(Arc::clone(&shared));
        let store = Store::open(&path).expect("open");
        let ids: Vec<i64> = (0..3)
            .map(|_| store.enqueue_at(&Job::shell("true"), 1).expect("enqueue"))
            .collect();
        let req = ClaimRequest {
            worker_id: "w1",
            limit: 3,
            queues: &[],
            lease_ttl: Duration::from_secs(60),
            queue_caps: &[],
            unheld: 0,
        };
        let jobs = store.claim(&req, crate::job::now_ms()).expect("claim");
        assert_eq!(jobs.len(), 3);
        let start = |c: &Claimed, pid: i32| {
            Op::Start(AttemptStart {
                job_id: c.id,
                run_token: c.run_token.clone(),
                pid,
                pgid: pid,
                start_time: 99,
                keeper: None,
            })
        };
        let finish = |c: &Claimed, ending: Ending| {
            Op::Finish(Box::new(Finish {
                job_id: c.id,
                run_token: c.run_token.clone(),
                attempt: c.attempt,
                ending,
                output: None,
                notes: Vec::new(),
                max_recovery_attempts: 3,
            }))
        };
        let failed = Ending::Failed {
            kind: crate::job::ErrorKind::Exit,
            exit_code: Some(1),
            signal: None,
            message: "exit 1".to_string(),
        };
        // Interleaved as workers queue them; the third job's ending is not in the batch.
        let batch = vec![
            start(&jobs[0], 501),
            start(&jobs[1], 502),
            start(&jobs[2], 503),
            finish(&jobs[1], failed),
            finish(&jobs[0], Ending::Succeeded),
        ];
        let done = commit(&store, &shared, &queues, &mut Held::default(), batch);
        assert_eq!(done.len(), 5);
        let history = |id: i64| -> Vec<(String, i64, String)> {
            store
                .events(id)
                .expect("events")
                .into_iter()
                .map(|e| (e.kind.to_string(), e.at, e.detail.unwrap_or_default()))
                .collect()
        };
        let rows = |id: i64| crate::store::lease::tests::rows(&store, id);
        for (i, (id, ending, detail)) in [
            (ids[0], "succeeded", "exit 0"),
            (ids[1], "failed", "exit 1"),
        ]
        .into_iter()
        .enumerate()
        {
            let h = history(id);
            let kinds: Vec<&str> = h.iter().map(|e| e.0.as_str()).collect();
            assert_eq!(kinds, ["enqueued", "claimed", "started", ending]);
            let pid = 501 + i;
            assert_eq!(h[2].2, format!("pid {pid} pgid {pid}"));
            assert_eq!(h[3].2, detail);
            assert_eq!(h[2].1, h[3].1, "one commit, one time");
            assert_eq!(rows(id), 3);
            let job = store.job(id).expect("job");
            assert_eq!(job.pid, Some(pid as i64), "{job:?}");
            assert_eq!(job.pgid, Some(pid as i64), "{job:?}");
        }
        let kinds: Vec<String> = history(ids[2]).into_iter().map(|e| e.0).collect();
        assert_eq!(kinds, ["enqueued", "claimed", "started"]);
        assert_eq!(rows(ids[2]), 3);
        assert_eq!(store.job(ids[2]).expect("job").pid, Some(503));
    }

    /// The writer's work for `n` short jobs, `per` at a time: a claim's transaction, then
    /// one transaction with their starts and endings, as a runner commits jobs that end
    /// within the linger. With `pair` false each start and ending is applied on its own, as
    /// the writer did before it paired them. Kept out of line for callgrind's
    /// `--toggle-collect`.
    #[inline(never)]
    fn short_jobs_writer_cycles(store: &Store, n: usize, per: u32, pair: bool) -> usize {
        let ctx = Ctx {
            worker_id: "w1",
            queues: &[],
            lease_ttl: Duration::from_secs(60),
            now: crate::job::now_ms(),
            unheld: 0,
        };
        let req = ClaimRequest {
            worker_id: "w1",
            limit: per,
            queues: &[],
            lease_ttl: ctx.lease_ttl,
            queue_caps: &[],
            unheld: 0,
        };
        let mut done = 0;
        while done < n {
            let claimed =
                store::transaction(store.conn(), &mut |conn| store::claim(conn, &req, ctx.now))
                    .expect("claim");
            assert!(!claimed.is_empty(), "jobs are left to claim");
            let mut batch = Vec::with_capacity(2 * claimed.len());
            for (i, c) in claimed.iter().enumerate() {
                let pid = 1000 + i32::try_from(i).expect("a small batch");
                batch.push(Op::Start(AttemptStart {
                    job_id: c.id,
                    run_token: c.run_token.clone(),
                    pid,
                    pgid: pid,
                    start_time: 1,
                    keeper: Some((pid + 1, 1)),
                }));
                batch.push(Op::Finish(Box::new(Finish {
                    job_id: c.id,
                    run_token: c.run_token.clone(),
                    attempt: c.attempt,
                    ending: Ending::Succeeded,
                    output: None,
                    notes: Vec::new(),
                    max_recovery_attempts: 3,
                })));
            }
            let pairs = if pair {
                pairs(&batch)
            } else {
                vec![Pair::Alone; batch.len()]
            };
            store::transaction(store.conn(), &mut |conn| {
                apply_batch(conn, &batch, &pairs, false, &ctx)
            })
            .expect("starts and endings");
            done += claimed.len();
        }
        done
    }

    /// A measurement, run by hand (see docs/performance.md): the writer's work for 2,000
    /// short jobs, 8 a batch, with `LEASEHOLD_PAIR=0` as before pairing; prints the event
    /// rows a job.
    #[test]
    #[ignore = "a measurement: run under valgrind --tool=callgrind"]
    fn short_jobs_writer_work() {
        const N: usize = 2_000;
        let pair = std::env::var("LEASEHOLD_PAIR").map_or(true, |v| v != "0");
        let dir = tempfile::tempdir().expect("a temp dir");
        let store = Store::open(dir.path().join("jobs.db")).expect("open");
        store
            .enqueue_many_at(&vec![Job::command(["/bin/true"]); N], 1)
            .expect("enqueue");
        let started = Instant::now();
        assert_eq!(short_jobs_writer_cycles(&store, N, 8, pair), N);
        let took = started.elapsed();
        let rows: i64 = store
            .conn()
            .query_row("SELECT count(*) FROM job_events", params![], |r| r.get(0))
            .expect("count");
        eprintln!(
            "pair {pair}: {N} jobs in {took:.2?}, {:.2} event rows a job",
            rows as f64 / N as f64
        );
    }

    /// A writer whose file is full (`PRAGMA max_page_count` at its size, with no free page)
    /// holds an ending, refuses claims meanwhile, and records the ending exactly once when
    /// another connection frees pages.
    #[test]
    fn an_ending_waits_out_a_full_database_and_is_recorded_once() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("jobs.db");
        let config = Runner::builder(&path).config;
        let shared = Arc::new(Shared::new(config, "w1".to_string()));
        let (writer, queues) = super::super::shared::Writer::new(Arc::clone(&shared));

        let store = Store::open(&path).expect("open");
        let id = store.enqueue_at(&Job::shell("true"), 1).expect("enqueue");
        let req = ClaimRequest {
            worker_id: "w1",
            limit: 1,
            queues: &[],
            lease_ttl: Duration::from_secs(60),
            queue_caps: &[],
            unheld: 0,
        };
        let job = store
            .claim(&req, crate::job::now_ms())
            .expect("claim")
            .remove(0);
        // Pages that another connection frees later: the room the ending will need.
        let other = Store::open(&path).expect("open");
        other
            .conn()
            .execute_batch(
                "CREATE TABLE filler (b BLOB);
                 WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 8)
                 INSERT INTO filler SELECT zeroblob(64 * 1024) FROM n;",
            )
            .expect("filler");
        crate::store::cap_at_present_size(&store);

        let finish = Finish {
            job_id: id,
            run_token: job.run_token.clone(),
            attempt: job.attempt,
            ending: Ending::Succeeded,
            output: Some(Output {
                attempt: job.attempt,
                stdout: vec![b'o'; 64 * 1024],
                stderr: Vec::new(),
                stdout_truncated: false,
                stderr_truncated: false,
            }),
            notes: Vec::new(),
            max_recovery_attempts: 3,
        };
        let committer = {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || {
                let batch = vec![Op::Finish(Box::new(finish))];
                let done = commit(&store, &shared, &queues, &mut Held::default(), batch);
                done.into_iter()
                    .map(|d| match d {
                        Done::Finished(_, r) => r.map_err(|e| e.to_string()),
                        _ => Err("not an ending".to_string()),
                    })
                    .collect::<Vec<_>>()
            })
        };

        // While the ending is held, a claim is refused as full rather than kept waiting.
        let e = writer
            .claim(1, Vec::new())
            .expect_err("no claim while full");
        assert!(e.is_full(), "{e:?}");
        assert_eq!(other.job(id).expect("job").status, Status::Running);

        other
            .conn()
            .execute_batch("DROP TABLE filler")
            .expect("free pages");
        let done = committer.join().expect("the committer does not panic");
        assert_eq!(done, vec![Ok(Finished::Recorded(Status::Succeeded))]);
        let kinds: Vec<String> = other
            .events(id)
            .expect("events")
            .into_iter()
            .map(|e| e.kind.to_string())
            .collect();
        assert_eq!(kinds, ["enqueued", "claimed", "succeeded"]);
    }
}
