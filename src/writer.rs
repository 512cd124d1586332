//! The writer: one thread that owns the runner's write connection and commits the writes of
//! all its workers in shared transactions (group commit).
//!
//! With `synchronous = FULL` every commit waits for the disk. One transaction per transition
//! would make the disk, not the processes, the runner's limit; sharing a commit among the
//! transitions that are ready at the same moment keeps FULL's guarantee (each transition is
//! durable before anyone is told of it) at a fraction of the cost. Each write runs inside its
//! own savepoint, so one that fails does not undo the others.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, bounded, unbounded};
use rusqlite::Connection;

use crate::error::{Error, Result};
use crate::runner::Shared;
use crate::store::{self, AttemptStart, ClaimRequest, Claimed, Finish, Finished, Store};

/// How many queued writes one transaction takes at most.
const MAX_BATCH: usize = 256;

/// One write for the writer thread.
pub(crate) enum Op {
    /// Claim up to `limit` jobs; the claimed jobs come back on `reply` once committed.
    Claim {
        limit: u32,
        reply: Sender<Result<Vec<Claimed>>>,
    },
    /// Record an attempt's process.
    Start(AttemptStart),
    /// Record an attempt's ending; once committed, the attempt leaves the runner's registry.
    Finish(Box<Finish>),
}

/// The handle workers and the dispatcher send writes through.
#[derive(Clone)]
pub(crate) struct Writer {
    tx: Sender<Op>,
}

impl Writer {
    /// Starts the writer thread on `store`.
    pub(crate) fn start(
        store: Store,
        shared: Arc<Shared>,
    ) -> Result<(Writer, std::thread::JoinHandle<()>)> {
        let (tx, rx) = unbounded();
        let handle = std::thread::Builder::new()
            .name("leasehold-writer".into())
            .spawn(move || run(&store, &shared, &rx))
            .map_err(|e| Error::io("cannot start the writer thread", e))?;
        Ok((Writer { tx }, handle))
    }

    /// Claims up to `limit` jobs and waits until the claim is committed.
    pub(crate) fn claim(&self, limit: u32) -> Result<Vec<Claimed>> {
        let (reply, answer) = bounded(1);
        self.tx
            .send(Op::Claim { limit, reply })
            .map_err(|_| Error::ShutDown)?;
        answer.recv().map_err(|_| Error::ShutDown)?
    }

    /// Queues a write without waiting for it.
    pub(crate) fn send(&self, op: Op) {
        if self.tx.send(op).is_err() {
            log::error!("the writer thread has stopped; a write was dropped");
        }
    }
}

/// What one queued write became, to act on after the commit.
enum Done {
    Claimed(Sender<Result<Vec<Claimed>>>, Result<Vec<Claimed>>),
    Started,
    Finished(Box<Finish>, Result<Finished>),
}

fn run(store: &Store, shared: &Shared, rx: &Receiver<Op>) {
    // Ends when every sender is gone: the runner drops its handles only after its workers and
    // dispatcher are joined, so no write is lost.
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        let done = commit(store, shared, batch);
        after_commit(shared, done);
    }
}

/// Applies a batch in one transaction, retrying while the database is busy: a write queued
/// here is never dropped, only delayed (and fenced, if the lease moved on meanwhile).
fn commit(store: &Store, shared: &Shared, batch: Vec<Op>) -> Vec<Done> {
    let started = Instant::now();
    let mut warned = false;
    let mut failures = 0;
    let lease_ttl = shared.config.lease_ttl;
    let worker_id = shared.worker_id.as_str();
    let queues = shared.config.queues.as_slice();
    loop {
        let now = crate::job::now_ms();
        let commit_started = Instant::now();
        let attempt = store::transaction(store.conn(), &mut |conn| {
            Ok(batch
                .iter()
                .map(|op| apply(conn, op, worker_id, queues, lease_ttl, now))
                .collect::<Vec<_>>())
        });
        match attempt {
            Ok(results) => {
                shared.commit_nanos.store(
                    u64::try_from(commit_started.elapsed().as_nanos()).unwrap_or(u64::MAX),
                    std::sync::atomic::Ordering::Relaxed,
                );
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

/// Applies one write inside a savepoint.
fn apply(
    conn: &Connection,
    op: &Op,
    worker_id: &str,
    queues: &[String],
    lease_ttl: Duration,
    now: i64,
) -> Applied {
    // Cached statements: these run for every write, and parsing them each time shows.
    let exec = |sql: &str| -> Result<()> {
        conn.prepare_cached(sql)?.execute([])?;
        Ok(())
    };
    let run = |f: &mut dyn FnMut() -> Result<Applied>| -> Result<Applied> {
        exec("SAVEPOINT op")?;
        match f() {
            Ok(v) => {
                exec("RELEASE op")?;
                Ok(v)
            }
            Err(e) => {
                exec("ROLLBACK TO op")?;
                exec("RELEASE op")?;
                Err(e)
            }
        }
    };
    match op {
        Op::Claim { limit, .. } => {
            let req = ClaimRequest {
                worker_id,
                limit: *limit,
                queues,
                lease_ttl,
            };
            match run(&mut || store::claim(conn, &req, now).map(|c| Applied::Claimed(Ok(c)))) {
                Ok(a) => a,
                Err(e) => Applied::Claimed(Err(e)),
            }
        }
        Op::Start(s) => {
            match run(&mut || store::record_start(conn, s, now).map(|_| Applied::Started)) {
                Ok(a) => a,
                Err(e) => {
                    log::error!("cannot record the start of job {}: {e:#}", s.job_id);
                    Applied::Started
                }
            }
        }
        Op::Finish(f) => {
            match run(&mut || store::finish_attempt(conn, f, now).map(|r| Applied::Finished(Ok(r))))
            {
                Ok(a) => a,
                Err(e) => Applied::Finished(Err(e)),
            }
        }
    }
}

fn after_commit(shared: &Shared, done: Vec<Done>) {
    let mut ended = false;
    for d in done {
        match d {
            Done::Claimed(reply, result) => {
                // The dispatcher may have gone at shutdown; the claimed jobs then simply
                // keep their leases until the heartbeat stops and the leases expire, which
                // cannot happen: the dispatcher always waits for its reply.
                let _ = reply.send(result);
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
