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
//! A batch is first applied as plain statements. If one write fails, the transaction is
//! rolled back and the batch applied again with each write in its own savepoint, so one that
//! fails does not undo the others; savepoints cost a copy of every page they touch, which the
//! common case does without.

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use rusqlite::Connection;

use crate::error::{Error, Result};
use crate::store::{self, ClaimRequest, Claimed, Finish, Finished, Store};

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
        while let Some(batch) = next_batch(&self.urgent, &self.lazy) {
            shared.test_hook("writer");
            let done = commit(store, shared, batch);
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

/// Applies a batch in one transaction, retrying while the database is busy: a write queued
/// here is never dropped, only delayed (and fenced, if the lease moved on meanwhile).
fn commit(store: &Store, shared: &Shared, batch: Vec<Op>) -> Vec<Done> {
    let started = Instant::now();
    let mut warned = false;
    let mut failures = 0;
    // Plain statements first; savepoints only to retry a batch in which a write failed.
    let mut savepoints = false;
    loop {
        let ctx = Ctx {
            worker_id: shared.worker_id.as_str(),
            queues: shared.config.queues.as_slice(),
            lease_ttl: shared.config.lease_ttl,
            now: crate::job::now_ms(),
        };
        let commit_started = Instant::now();
        let mut write_failed = false;
        let attempt = store::transaction(store.conn(), &mut |conn| {
            if savepoints {
                return Ok(batch
                    .iter()
                    .map(|op| apply(conn, op, &ctx))
                    .collect::<Vec<_>>());
            }
            let mut applied = Vec::with_capacity(batch.len());
            for op in &batch {
                match apply_op(conn, op, &ctx) {
                    Ok(a) => applied.push(a),
                    Err(e) => {
                        write_failed = true;
                        return Err(e);
                    }
                }
            }
            Ok(applied)
        });
        match attempt {
            // The transaction is rolled back: apply the batch again, one savepoint a write.
            Err(_) if write_failed => savepoints = true,
            Ok(results) => {
                // A slow commit counts at once and is forgotten slowly (an eighth a commit):
                // the dispatcher sizes its claim-ahead for the disk's bad moments, not its mean.
                let took = u64::try_from(commit_started.elapsed().as_nanos()).unwrap_or(u64::MAX);
                let order = std::sync::atomic::Ordering::Relaxed;
                let before = shared.commit_nanos.load(order);
                shared
                    .commit_nanos
                    .store(took.max(before - before / 8), order);
                return batch
                    .into_iter()
                    .zip(results)
                    .map(|(op, result)| match (op, result) {
                        (Op::Claim { reply, .. }, Applied::Claimed(r)) => Done::Claimed(reply, r),
                        (Op::Finish(f), Applied::Finished(r)) => Done::Finished(f, r),
                        _ => Done::Started,
                    })
                    .collect();
            }
            Err(e) if e.is_busy() => {
                if !warned && started.elapsed() > Duration::from_secs(1) {
                    log::warn!("database is busy; {} writes are waiting", batch.len());
                    warned = true;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => {
                // The transaction itself failed, not one write in it (a full disk, an I/O
                // error). Retry a while; then give up, so that a claim is answered and the
                // runner can shut down. An ending given up on leaves its lease to expire.
                failures += 1;
                log::error!("write transaction failed: {e:#}");
                if failures >= 20 {
                    return batch
                        .into_iter()
                        .map(|op| match op {
                            Op::Claim { reply, .. } => Done::Claimed(
                                reply,
                                Err(Error::io(
                                    "cannot write to the database",
                                    std::io::Error::other(format!("{e:#}")),
                                )),
                            ),
                            Op::Start(_) => Done::Started,
                            Op::Finish(f) => Done::Finished(
                                f,
                                Err(Error::io(
                                    "cannot write to the database",
                                    std::io::Error::other(format!("{e:#}")),
                                )),
                            ),
                        })
                        .collect();
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
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
}

/// Applies one write as plain statements; a failure may leave part of it applied.
fn apply_op(conn: &Connection, op: &Op, ctx: &Ctx<'_>) -> Result<Applied> {
    let now = ctx.now;
    Ok(match op {
        Op::Claim { limit, .. } => {
            let req = ClaimRequest {
                worker_id: ctx.worker_id,
                limit: *limit,
                queues: ctx.queues,
                lease_ttl: ctx.lease_ttl,
            };
            Applied::Claimed(Ok(store::claim(conn, &req, now)?))
        }
        Op::Start(s) => {
            store::record_start(conn, s, now)?;
            Applied::Started
        }
        Op::Finish(f) => Applied::Finished(Ok(store::finish_attempt(conn, f, now)?)),
    })
}

/// Applies one write inside a savepoint, so that its failure undoes only itself.
fn apply(conn: &Connection, op: &Op, ctx: &Ctx<'_>) -> Applied {
    let result = store::savepoint(conn, |conn| apply_op(conn, op, ctx));
    match (op, result) {
        (_, Ok(a)) => a,
        (Op::Claim { .. }, Err(e)) => Applied::Claimed(Err(e)),
        (Op::Start(s), Err(e)) => {
            log::error!("cannot record the start of job {}: {e:#}", s.job_id);
            Applied::Started
        }
        (Op::Finish(_), Err(e)) => Applied::Finished(Err(e)),
    }
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
    }
}
