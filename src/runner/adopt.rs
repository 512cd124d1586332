//! Attempts a dead runner left to their keepers: judged by the sweeper before it reclaims
//! anything (a live keeper's attempt is adopted, a finished one's outcome recorded), and the
//! adopted ones followed to their end by a thread each, as a worker follows an attempt it
//! started.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::files::{self, Ended, Journaled};
use crate::job::now_ms;
use crate::manners::Limits;
use crate::process::{self, AttemptResult, AttemptSpec, Exit, KeptFiles, LiveKeeper, OutputFiles};
use crate::store::{Ending, KeptAttempt, KeptVerdict};

use super::shared::{Op, Shared, Writer};
use super::worker::finish_for;

/// What the sweeper's judge found alive, kept until the reclaim says which it adopted.
#[derive(Default)]
pub(crate) struct Judged {
    keepers: Mutex<HashMap<i64, LiveKeeper>>,
}

impl Judged {
    /// The verdict on one of a dead runner's kept attempts: adopt it while its keeper is
    /// alive (held by a verified pidfd from now on), record the outcome its keeper left, or
    /// reclaim it as any other attempt when there is neither.
    pub(crate) fn judge(&self, shared: &Shared, kept: &KeptAttempt) -> KeptVerdict {
        let folder = &shared.attempts_folder;
        // What the keeper's journal says of the attempt, read BEFORE whether the keeper
        // lives: a keeper found gone after has journaled all it ever will.
        let (said, live) = match kept.keeper {
            Some((pid, start)) => {
                let journal = files::journal_path(folder, pid, Some(start));
                let said = files::read_journal(&journal, &kept.run_token).unwrap_or_else(|e| {
                    log::warn!("job {}: its keeper's journal: {e}", kept.job_id);
                    None
                });
                (said, process::live_keeper(folder, pid, start))
            }
            // A keeper whose runner died before recording it is found by its journal.
            None => process::find_keeper(folder, &kept.run_token)
                .map_or((None, None), |(said, live)| (Some(said), live)),
        };
        let (ended, ended_at) = match (said, live) {
            (Some(Journaled::Outcome { ended, ended_at }), _) => (ended, ended_at),
            (Some(Journaled::Fenced), _) => return KeptVerdict::Reclaim,
            (_, Some(keeper)) => {
                self.keepers.lock().insert(kept.job_id, keeper);
                return KeptVerdict::Adopt;
            }
            // Gone without a word: lost.
            (_, None) => return KeptVerdict::Reclaim,
        };
        let dir = files::attempt_dir(folder, kept.job_id, kept.attempt, &kept.run_token);
        // Recorded as the dead runner would have recorded it: the same ending and tails.
        let (stdout, stderr) = OutputFiles::new(dir).tails(shared.config.output_tail);
        let exit = match ended {
            Ended::Exited(code) => Exit::Exited(code),
            Ended::Signaled(sig) => Exit::Signaled(sig),
        };
        let result = AttemptResult {
            exit,
            stdout,
            stderr,
            leaked: Vec::new(),
            duration: Duration::ZERO,
            release: None,
            memory_exceeded: false,
        };
        let finish = finish_for(
            kept.job_id,
            &kept.run_token,
            kept.attempt,
            &shared.config,
            result,
        );
        // An exit or a signal always makes an ending.
        let Some(finish) = finish else {
            return KeptVerdict::Reclaim;
        };
        let how = match &finish.ending {
            Ending::Failed { message, .. } => message.clone(),
            _ => "exited 0".to_owned(),
        };
        KeptVerdict::Recovered {
            ending: finish.ending,
            output: finish.output,
            detail: format!(
                "runner {} was gone; its keeper saw the command end ({how}) at {} ms",
                kept.worker_id, ended_at
            ),
        }
    }

    /// The keeper found alive for `job_id`, once its adoption is committed.
    fn take(&self, job_id: i64) -> Option<LiveKeeper> {
        self.keepers.lock().remove(&job_id)
    }

    /// Forgets the keepers of attempts the reclaim did not adopt after all.
    pub(crate) fn clear(&self) {
        self.keepers.lock().clear();
    }
}

/// Keeps the attempts `adopted` names, with the keepers `judged` found, registering each
/// with the runner at once so that its heartbeat renews the lease.
pub(crate) fn add(shared: &Shared, judged: &Judged, adopted: Vec<KeptAttempt>) {
    let read_at = Instant::now();
    for kept in adopted {
        let Some(keeper) = judged.take(kept.job_id) else {
            continue;
        };
        let expires =
            now_ms() + i64::try_from(shared.config.lease_ttl.as_millis()).unwrap_or(i64::MAX);
        let fence = shared.adopted_fence(kept.job_id, kept.attempt, &kept.run_token);
        if let Err(e) =
            shared.register(&kept.run_token, kept.job_id, &kept.queue, expires, fence, 0)
        {
            // Its lease runs out unrenewed and the next sweep judges it again.
            log::error!("job {}: cannot follow its keeper: {e}", kept.job_id);
            continue;
        }
        log::info!(
            "job {} attempt {}: adopted from runner {}, keeper pid {}",
            kept.job_id,
            kept.attempt,
            kept.worker_id,
            keeper.pid
        );
        shared.adopted.lock().push((kept, keeper, read_at));
    }
}

/// Starts a thread for each adopted attempt, which follows it and sends its ending to
/// `writer`. The threads are kept in `shared` for the shutdown to join.
pub(crate) fn start(shared: &Arc<Shared>, writer: &Writer) {
    let adopted = std::mem::take(&mut *shared.adopted.lock());
    for (kept, keeper, read_at) in adopted {
        let (shared2, writer) = (Arc::clone(shared), writer.clone());
        let token = kept.run_token.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("leasehold-adopted-{}", kept.job_id))
            .spawn(move || follow(&shared2, kept, keeper, read_at, &writer));
        match spawned {
            Ok(handle) => shared.adopters.lock().push(handle),
            Err(e) => {
                log::error!("cannot start a thread for an adopted attempt: {e}");
                shared.attempt_done(&token);
            }
        }
    }
}

/// Follows one adopted attempt to its end and sends its ending. Its timeout counts from its
/// age as read with its adoption (on the database's clock), then on by this host's monotonic
/// clock from `read_at`: never this host's wall clock against the server's `started_at`.
fn follow(
    shared: &Shared,
    kept: KeptAttempt,
    keeper: LiveKeeper,
    read_at: Instant,
    writer: &Writer,
) {
    let cfg = &shared.config;
    let Some(stop) = shared
        .running
        .lock()
        .get(&kept.run_token)
        .map(|r| r.stop.clone())
    else {
        return;
    };
    let spec = AttemptSpec {
        argv: Vec::new(),
        env: Vec::new(),
        base_env: shared.base_env.clone(),
        cwd: None,
        job_id: kept.job_id,
        attempt: kept.attempt,
        run_token: kept.run_token.clone(),
        files: Some(KeptFiles {
            folder: shared.attempts_folder.clone(),
            cap: cfg.output_cap,
            // Its keeper runs already; the heartbeat keeps its lease file.
            fence: None,
        }),
        timeout: kept.timeout,
        idle_timeout: kept.idle_timeout,
        kill_grace: cfg.kill_grace,
        drain: cfg.drain_timeout,
        tail_bytes: cfg.output_tail,
        limits: Limits::default(),
    };
    let age = kept.age.unwrap_or_default() + read_at.elapsed();
    let result = process::follow(
        &spec,
        process::Adopted {
            keeper,
            pgid: kept.pgid,
            start_time: kept.start_time,
            age,
        },
        &stop,
    );
    match finish_for(kept.job_id, &kept.run_token, kept.attempt, cfg, result) {
        Some(finish) => writer.send(Op::Finish(Box::new(finish))),
        None => {
            shared.attempt_done(&kept.run_token);
            shared.endings_changed();
        }
    }
}
