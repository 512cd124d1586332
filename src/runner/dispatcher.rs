//! The dispatcher thread: claims jobs while workers are free and hands them over.

use std::sync::atomic::Ordering;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use crate::job::duration_ms;
use crate::process;

use super::shared::{Handed, LINGER, Op, Shared, Writer, interrupted, secs};

/// Claims jobs while workers are free and hands them over.
///
/// A claim is durable before its job starts, so with `synchronous = FULL` a worker that
/// waited for its own claim would wait for the disk on every job. The dispatcher therefore
/// claims a little ahead: as many jobs as are likely to start while one commit is under way
/// (the recent rate of endings times the recent claim round trip, twice over, at most eight
/// per worker). Long jobs end rarely, so they are not claimed ahead; a stream of short ones is.
pub(super) fn dispatch_loop(shared: &Shared, writer: &Writer, work: &Sender<Handed>) {
    let workers = shared.config.workers;
    let mut rate = RateMeter::new();
    // Two pipes, a pidfd and an eventfd per attempt: the default soft limit of 1024 is
    // reached by a few hundred workers when the hard limit allows far more.
    process::raise_nofile_limit();
    while !shared.shutting_down.load(Ordering::SeqCst) {
        shared.test_hook("dispatcher");
        if let Some(left) = claims_paused() {
            shared.wait_for_wake(left);
            continue;
        }
        let idle = shared.idle_workers.load(Ordering::SeqCst);
        let queued = work.len();
        let commit = Duration::from_nanos(shared.commit_nanos.load(Ordering::Relaxed));
        let per_sec = rate.sample(shared.endings_total.load(Ordering::Relaxed), workers as u64);
        // The claim's round trip is the commit plus the hand-offs between threads.
        let round_trip = commit.as_secs_f64() + HANDOFF.as_secs_f64();
        let lookahead = ((per_sec * round_trip * 2.0).round() as usize).min(8 * workers);
        // Refill in chunks: claim once the queue is down to half the lookahead (or a worker
        // would go without), not on every ending, so that one claim (and one wake-up of this
        // thread, see `refill_at`) serves several jobs.
        let low = lookahead / 2;
        shared.refill_at.store(low, Ordering::Relaxed);
        let want = if queued <= low || queued < idle {
            (idle + lookahead).saturating_sub(queued)
        } else {
            0
        };
        let mut claimed_all = false;
        // Whether the writer's latest time of the next due job can be trusted: it read it
        // with this claim. Without a claim (no worker free) the dispatcher waits for a worker
        // to free up, or for the poll.
        let mut fresh_due = false;
        if want > 0 {
            let caps = shared.queue_caps();
            // Read before the claim, so the lease it takes ends no earlier than this reading
            // plus the TTL on the boot clock.
            let claimed_boot_ns = process::boot_clock_ns();
            // The lease as this host counts it: from this reading, by this host's clock. On
            // PostgreSQL the stored expiry is the server's clock, which may run ahead of or
            // behind this host's; the lease ends no earlier than this reading plus the TTL in
            // elapsed time, whatever the clocks say.
            let claimed_at = crate::job::now_ms();
            let expires_here = claimed_at.saturating_add(duration_ms(shared.config.lease_ttl));
            match writer.claim(u32::try_from(want).unwrap_or(u32::MAX), caps) {
                Ok(jobs) => {
                    claimed_all = jobs.len() == want;
                    fresh_due = true;
                    for job in jobs {
                        let registered = shared.register(
                            &job.run_token,
                            job.id,
                            &job.queue,
                            expires_here,
                            shared.own_fence(),
                            match job.when_lost {
                                crate::condition::WhenLost::Stop => job.conditions,
                                crate::condition::WhenLost::Run => 0,
                            },
                        );
                        if let Err(e) = registered {
                            // Out of descriptors: give the job back untouched, and claim
                            // nothing for a while rather than claim it again at once,
                            // writing events each time.
                            exhausted(&format!("an eventfd for job {}: {e}", job.id));
                            writer.send(Op::Finish(Box::new(interrupted(
                                &job,
                                &shared.config,
                                &e.to_string(),
                            ))));
                            continue;
                        }
                        if work
                            .send(Handed {
                                job,
                                claimed_at,
                                claimed_boot_ns,
                            })
                            .is_err()
                        {
                            return;
                        }
                    }
                }
                // The writer warns of a full disk itself, once a minute.
                Err(e) if e.is_full() => log::debug!("claim refused: {e:#}"),
                Err(e) if shared.stop_if_damaged("dispatcher", &e) => {}
                Err(e) => log::error!("claim failed: {e:#}"),
            }
        }
        shared
            .claim_short
            .store(want > 0 && !claimed_all, Ordering::Relaxed);
        if !claimed_all {
            let poll = shared.config.poll_interval;
            let sleep = if fresh_due {
                shared.sleep_before_due(poll, shared.config.clock.now_ms())
            } else {
                poll
            };
            shared.wait_for_wake(sleep);
        }
    }
}

/// How long claims pause after an attempt could not start for want of descriptors, processes
/// or memory: long enough for running attempts to end and give some back.
const EXHAUSTED_PAUSE: Duration = Duration::from_secs(1);

/// How often running out of resources is logged, with the count since the last report.
const EXHAUSTED_LOG_EVERY: Duration = Duration::from_secs(60);

/// Running out of resources, as the process's runners have met it.
struct Exhaustion {
    /// Claims pause until then.
    until: Option<Instant>,
    /// Times since the last report.
    count: u64,
    /// When it was last reported.
    logged: Option<Instant>,
}

/// Process-wide on purpose: descriptors (EMFILE) and memory are the process's, processes
/// (EAGAIN) the user's, so what one runner of the process runs out of, its others lack too.
static EXHAUSTION: Mutex<Exhaustion> = Mutex::new(Exhaustion {
    until: None,
    count: 0,
    logged: None,
});

/// Notes that an attempt could not start (or a claimed job could not be prepared) for want
/// of resources (`why`): the job was given back, and claims pause for [`EXHAUSTED_PAUSE`].
/// Logged at once the first time, then once a minute with a count.
pub(crate) fn exhausted(why: &str) {
    let mut e = EXHAUSTION.lock().unwrap_or_else(PoisonError::into_inner);
    let now = Instant::now();
    e.until = now.checked_add(EXHAUSTED_PAUSE);
    e.count += 1;
    if e.logged
        .is_none_or(|at| now.duration_since(at) >= EXHAUSTED_LOG_EVERY)
    {
        log::warn!(
            "out of resources ({why}): {} job(s) given back since the last report, claims \
             paused for {}; the runner resumes by itself",
            e.count,
            secs(EXHAUSTED_PAUSE)
        );
        e.count = 0;
        e.logged = Some(now);
    }
}

/// How much longer claims pause, if they do.
fn claims_paused() -> Option<Duration> {
    let e = EXHAUSTION.lock().unwrap_or_else(PoisonError::into_inner);
    let left = e.until?.saturating_duration_since(Instant::now());
    (!left.is_zero()).then_some(left)
}

/// What a claim's round trip costs beyond its commit: waking the writer and the dispatcher.
const HANDOFF: Duration = Duration::from_millis(2).saturating_add(LINGER);

/// Over how long the rate of endings is measured: short, as a burst of short jobs that waits
/// for its first measurement runs without lookahead until then.
const RATE_WINDOW: Duration = Duration::from_millis(50);

/// Endings per second, over the last [`RATE_WINDOW`] or so.
struct RateMeter {
    at: Instant,
    count: u64,
    per_sec: f64,
}

impl RateMeter {
    fn new() -> Self {
        RateMeter {
            at: Instant::now(),
            count: 0,
            per_sec: 0.0,
        }
    }

    /// The rate, measured again once a window has passed, or sooner once `enough` endings
    /// have come in: a burst of short jobs should not run a whole window unaided.
    fn sample(&mut self, total: u64, enough: u64) -> f64 {
        let dt = self.at.elapsed().as_secs_f64();
        let ended = total - self.count;
        if dt >= RATE_WINDOW.as_secs_f64() || (ended >= enough && dt >= 0.005) {
            self.per_sec = ended as f64 / dt;
            self.count = total;
            self.at = Instant::now();
        }
        self.per_sec
    }
}
