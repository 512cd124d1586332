//! A worker thread: runs one attempt at a time, from spawn to its recorded ending.

use std::cell::Cell;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use crossbeam_channel::Receiver;

use crate::job::{ErrorKind, EventKind, Output, duration_ms, now_ms};
use crate::process::{self, AttemptResult, AttemptSpec, StopReason};
use crate::store::{AttemptStart, Claimed, Ending, Finish};

use super::builder::Config;
use super::shared::{FENCE_MARGIN, Handed, Op, Shared, Writer, interrupted, panic_message, secs};

/// Runs the attempts the dispatcher hands over until the dispatcher goes away.
pub(crate) fn run(shared: &Shared, jobs: &Receiver<Handed>, writer: &Writer) {
    while let Ok(Handed {
        job,
        claimed_at,
        claimed_boot_ns,
    }) = jobs.recv()
    {
        shared.idle_workers.fetch_sub(1, Ordering::SeqCst);
        let running = shared
            .running
            .lock()
            .get(&job.run_token)
            .map(|r| (r.stop.clone(), r.lease_expires_at));
        let finish = match running {
            // Claimed ahead but not started when shutdown began: give it back untouched.
            Some(_) if shared.shutting_down.load(Ordering::SeqCst) => Some(interrupted(
                &job,
                &shared.config,
                "the runner is shutting down",
            )),
            Some((stop, expires)) => {
                let lease = Lease {
                    expires_at: expires,
                    claimed_at,
                    claimed_boot_ns,
                };
                match lease.distrust(&shared.config, now_ms(), process::boot_clock_ns()) {
                    // Claimed ahead, then the runner froze (SIGSTOP, a suspend, starvation)
                    // past the lease: another runner may have reclaimed and run it. Only the
                    // renewal would tell, and it may not have run yet: never start it.
                    Some(why) => {
                        log::info!(
                            "job {} attempt {}: not started: {why}; giving it back",
                            job.id,
                            job.attempt
                        );
                        Some(interrupted(&job, &shared.config, &why))
                    }
                    None => run_guarded(shared, &job, &lease, &stop, writer),
                }
            }
            // The heartbeat never saw it; cannot happen, as the dispatcher registers every
            // job before handing it over. Give it back rather than run it unguarded.
            None => Some(interrupted(
                &job,
                &shared.config,
                "not registered with the runner",
            )),
        };
        match finish {
            Some(finish) => writer.send(Op::Finish(Box::new(finish))),
            // Left running under its keeper at shutdown: no ending to write, and the runner
            // no longer renews its lease (the next runner adopts it).
            None => {
                shared.attempt_done(&job.run_token);
                shared.endings_changed();
            }
        }
        shared.endings_total.fetch_add(1, Ordering::Relaxed);
        shared.idle_workers.fetch_add(1, Ordering::SeqCst);
        // Enough work queued: the dispatcher has nothing to do yet, so let it sleep.
        if jobs.len() <= shared.refill_at.load(Ordering::Relaxed) {
            shared.wake_dispatcher();
        }
    }
}

/// What a worker knows of a claimed job's lease when it is about to start it.
#[derive(Debug, Clone, Copy)]
struct Lease {
    /// When the lease runs out, as last claimed or renewed (wall clock, ms).
    expires_at: i64,
    /// When the claim took it (wall clock, ms).
    claimed_at: i64,
    /// The boot clock just before the claim (ns).
    claimed_boot_ns: Option<u64>,
}

/// How far the boot clock may run ahead of the wall clock since the claim (the claim's own
/// round trip) before the wall clock counts as stepped back.
const CLOCK_SLACK_MS: i64 = 1_000;

impl Lease {
    /// Why the lease cannot be trusted to start the attempt at `now` (wall clock, ms) and
    /// `boot_ns` (boot clock), if it cannot: it runs out (by the wall clock) within the
    /// margin an attempt needs to be fenced in time, or the wall clock went back since the
    /// claim and the boot clock says a lease TTL has passed.
    fn distrust(&self, cfg: &Config, now: i64, boot_ns: Option<u64>) -> Option<String> {
        let ttl = duration_ms(cfg.lease_ttl);
        // The heartbeat fences an attempt a kill grace and a margin before its lease runs
        // out; a start inside that window would be fenced at once. Capped at a third of the
        // TTL, which is what a healthy heartbeat leaves at least.
        let margin = (duration_ms(cfg.kill_grace) + 250).min(ttl / 3);
        if now.saturating_add(margin) >= self.expires_at {
            return Some(format!(
                "its lease ran out before it could start (expired {} ms ago, counting a \
                 {margin} ms margin): the runner was frozen or starved",
                now.saturating_add(margin) - self.expires_at
            ));
        }
        let since_boot = boot_ns
            .zip(self.claimed_boot_ns)
            .map(|(now_b, then_b)| i64::try_from(now_b.saturating_sub(then_b) / 1_000_000))
            .and_then(Result::ok)?;
        let since_wall = now.saturating_sub(self.claimed_at);
        if since_boot > since_wall.saturating_add(CLOCK_SLACK_MS)
            && since_boot.saturating_add(margin) >= ttl
        {
            return Some(format!(
                "its lease ran out before it could start: {since_boot} ms passed since the \
                 claim by the boot clock, {since_wall} ms by the wall clock, which went back"
            ));
        }
        None
    }
}

/// Runs one attempt; a panic while it runs loses only this attempt. The attempt's main
/// process is killed and reaped as the supervisor unwinds; whatever else carries its run
/// token (its group, escaped descendants) is torn down here, and the attempt is recorded as
/// lost, so the job is requeued within its recovery budget. The worker then takes the next
/// job as a fresh one would. `None`: the attempt was left running under its keeper.
fn run_guarded(
    shared: &Shared,
    job: &Claimed,
    lease: &Lease,
    stop: &process::StopHandle,
    writer: &Writer,
) -> Option<Finish> {
    // What the spawn reported, kept outside the unwind: with the process group known, the
    // teardown kills the group as a whole, which a scan for the token alone can miss (a child
    // caught in the middle of its exec shows no environment for a moment).
    let spawned = Cell::new(None);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_one(shared, job, lease, stop, writer, &spawned)
    }));
    match outcome {
        Ok(finish) => finish,
        Err(panic) => {
            let cause = panic_message(panic.as_ref());
            log::error!(
                "job {} attempt {}: the worker panicked ({cause}); tearing the attempt down and \
                 recording it as lost",
                job.id,
                job.attempt
            );
            let teardown = crate::process::teardown(
                &crate::process::AttemptIdentity {
                    pgid: spawned.get().map(|s: process::Started| s.pgid),
                    start_time: spawned.get().map(|s| s.start_time),
                    token: job.run_token.clone(),
                },
                shared.config.kill_grace,
            );
            log::info!("job {}: {}", job.id, teardown.describe());
            Some(Finish {
                job_id: job.id,
                run_token: job.run_token.clone(),
                attempt: job.attempt,
                ending: Ending::Lost {
                    message: format!("the worker running the attempt panicked: {cause}"),
                },
                output: None,
                notes: Vec::new(),
                max_recovery_attempts: shared.config.max_recovery_attempts,
            })
        }
    }
}

fn run_one(
    shared: &Shared,
    job: &Claimed,
    lease: &Lease,
    stop: &process::StopHandle,
    writer: &Writer,
    spawned: &Cell<Option<process::Started>>,
) -> Option<Finish> {
    let cfg = &shared.config;
    let spec = AttemptSpec {
        argv: job.argv.clone(),
        env: job.env.clone(),
        base_env: shared.base_env.clone(),
        cwd: job.cwd.as_ref().map(PathBuf::from),
        job_id: job.id,
        attempt: job.attempt,
        run_token: job.run_token.clone(),
        files: cfg.keepers.then(|| process::KeptFiles {
            folder: shared.attempts_folder.clone(),
            cap: cfg.output_cap,
            fence: shared
                .fences()
                .then(|| {
                    crate::files::LeaseFence::of(
                        lease.claimed_boot_ns,
                        cfg.lease_ttl,
                        cfg.kill_grace,
                        FENCE_MARGIN,
                    )
                })
                .flatten(),
        }),
        timeout: job.timeout,
        idle_timeout: job.idle_timeout,
        kill_grace: cfg.kill_grace,
        drain: cfg.drain_timeout,
        tail_bytes: cfg.output_tail,
        limits: job.limits.or_manners(&cfg.manners),
    };
    log::debug!(
        "job {} attempt {}: starting {:?}",
        job.id,
        job.attempt,
        job.argv
    );
    let result = process::run(&spec, stop, |s| {
        spawned.set(Some(*s));
        // The check before the spawn cannot be one step with it: a runner frozen between
        // the two (SIGSTOP, a suspend) wakes to finish a spawn whose lease another runner
        // may have reclaimed meanwhile. Checked again once the process exists, such an
        // attempt is killed at once rather than at the next renewal.
        if let Some(why) = lease.distrust(cfg, now_ms(), process::boot_clock_ns()) {
            log::warn!(
                "job {} attempt {}: {why} while it was being started; killing it",
                job.id,
                job.attempt
            );
            stop.stop(StopReason::LeaseLost);
        }
        shared.test_hook("worker");
        writer.send(Op::Start(AttemptStart {
            job_id: job.id,
            run_token: job.run_token.clone(),
            pid: s.pid,
            pgid: s.pgid,
            start_time: s.start_time,
            keeper: s.keeper,
        }));
    });
    if let process::Exit::NoResources(why) = &result.exit {
        super::dispatcher::exhausted(why);
    }
    let mut result = result;
    if let Some(release) = result.release.take() {
        // Released to the keeper once the writer committed the ending (`attempt_done`).
        shared.keep_release(&job.run_token, release);
    }
    let lost = shared.lost_conditions.lock().remove(&job.run_token);
    let mut finish = finish_for(job.id, &job.run_token, job.attempt, cfg, result);
    // The history names the conditions whose loss stopped the attempt.
    if let (
        Some(lost),
        Some(Finish {
            ending: Ending::Interrupted { message },
            ..
        }),
    ) = (lost, finish.as_mut())
        && message.starts_with("condition lost")
    {
        let names: Vec<&str> = crate::condition::from_mask(lost)
            .into_iter()
            .map(|c| c.as_str())
            .collect();
        *message = format!(
            "condition lost: {} no longer held, so the attempt was stopped (when_lost=stop) \
             and the job requeued to wait for it, nothing spent",
            names.join(", ")
        );
    }
    finish
}

/// The ending to record for an attempt's result; `None` for one left running under its
/// keeper.
pub(super) fn finish_for(
    job_id: i64,
    run_token: &str,
    attempt: i64,
    cfg: &Config,
    r: AttemptResult,
) -> Option<Finish> {
    let failed = |kind: ErrorKind, exit_code: Option<i32>, signal: Option<i32>, message: String| {
        Ending::Failed {
            kind,
            exit_code,
            signal,
            message,
        }
    };
    let ending = match r.exit {
        process::Exit::Exited(0) => Ending::Succeeded,
        // Read from the attempt's cgroup or its stderr (see `process::cap`).
        process::Exit::Exited(_) | process::Exit::Signaled(_) if r.memory_exceeded => {
            let how = match r.exit {
                process::Exit::Signaled(sig) => format!("killed by signal {}", signal_name(sig)),
                process::Exit::Exited(code) => format!("exited with code {code}"),
                _ => String::new(),
            };
            let (code, sig) = match r.exit {
                process::Exit::Exited(c) => (Some(c), None),
                process::Exit::Signaled(s) => (None, Some(s)),
                _ => (None, None),
            };
            failed(
                ErrorKind::Memory,
                code,
                sig,
                format!("over its memory cap: {how}"),
            )
        }
        process::Exit::Exited(code) => failed(
            ErrorKind::Exit,
            Some(code),
            None,
            format!("exited with code {code}"),
        ),
        process::Exit::Signaled(sig) => failed(
            ErrorKind::Signal,
            None,
            Some(sig),
            format!("killed by signal {}", signal_name(sig)),
        ),
        process::Exit::TimedOut(d) => failed(
            ErrorKind::Timeout,
            None,
            None,
            format!("timed out after {}", secs(d)),
        ),
        process::Exit::IdleTimedOut(d) => failed(
            ErrorKind::IdleTimeout,
            None,
            None,
            format!("idle timeout: no output for {}", secs(d)),
        ),
        process::Exit::SpawnFailed(reason) => failed(ErrorKind::Spawn, None, None, reason),
        // How the command ended is unknown, and what was left of it was killed: like a
        // runner that lost the attempt, within the recovery budget and `on_lost`.
        process::Exit::KeeperLost => Ending::Lost {
            message: "the attempt's keeper died before its command ended; what was left of \
                      the attempt was killed"
                .into(),
        },
        // The runner's fault, not the job's: given back without spending an attempt.
        process::Exit::NoResources(reason) => Ending::Interrupted {
            message: format!("not run: the runner could not start it ({reason})"),
        },
        process::Exit::Stopped(StopReason::SelfFenced) => Ending::Lost {
            message: "the runner could not renew the lease before it ran out (database busy \
                      or stalled) and killed the attempt itself"
                .into(),
        },
        process::Exit::Stopped(StopReason::Leave) => return None,
        process::Exit::Stopped(StopReason::Shutdown) => Ending::Interrupted {
            message: "runner shut down: attempt killed and requeued".into(),
        },
        // Not the job's fault either: it waits for its conditions again, nothing spent.
        process::Exit::Stopped(StopReason::ConditionLost) => Ending::Interrupted {
            message: "condition lost: a condition of the job (`when`) stopped holding, so the \
                      attempt was stopped (when_lost=stop) and the job requeued to wait for it, \
                      nothing spent"
                .into(),
        },
        // The lease is already gone (cancelled, reclaimed, retried): this write is fenced,
        // and leaves the cancel's attempt_stopped event or a late_result_discarded one.
        process::Exit::Stopped(reason) => Ending::Stopped {
            message: format!("attempt stopped: {reason:?}"),
        },
    };
    let notes = r
        .leaked
        .iter()
        .map(|l| {
            (
                EventKind::Leaked,
                format!(
                    "pid {} was still alive after the attempt ended{} and was killed",
                    l.pid,
                    if l.escaped_group {
                        " outside its process group"
                    } else {
                        " in its process group"
                    }
                ),
            )
        })
        .collect();
    Some(Finish {
        job_id,
        run_token: run_token.to_owned(),
        attempt,
        ending,
        output: Some(Output {
            attempt,
            stdout: r.stdout.bytes,
            stderr: r.stderr.bytes,
            stdout_truncated: r.stdout.truncated,
            stderr_truncated: r.stderr.truncated,
        }),
        notes,
        max_recovery_attempts: cfg.max_recovery_attempts,
    })
}

fn signal_name(sig: i32) -> String {
    match nix::sys::signal::Signal::try_from(sig) {
        Ok(s) => s.as_str().to_string(),
        Err(_) => format!("{sig}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config with a 30 s lease and a 5 s kill grace (the defaults).
    fn config() -> Config {
        super::super::builder::RunnerBuilder::new("unused.db".into()).config
    }

    const T: i64 = 1_700_000_000_000;
    const SEC: u64 = 1_000_000_000;

    #[test]
    fn a_lease_past_its_expiry_or_inside_the_fence_margin_is_not_trusted() {
        let cfg = config();
        let lease = Lease {
            expires_at: T + 30_000,
            claimed_at: T,
            claimed_boot_ns: Some(100 * SEC),
        };
        assert_eq!(lease.distrust(&cfg, T + 1, Some(100 * SEC)), None);
        // 5.25 s margin: the grace and the heartbeat's own.
        assert_eq!(lease.distrust(&cfg, T + 24_000, Some(124 * SEC)), None);
        assert!(lease.distrust(&cfg, T + 25_000, Some(125 * SEC)).is_some());
        // Frozen for a minute.
        let why = lease.distrust(&cfg, T + 60_000, Some(160 * SEC)).unwrap();
        assert!(
            why.contains("its lease ran out before it could start"),
            "{why}"
        );
    }

    #[test]
    fn a_wall_clock_stepped_back_does_not_stretch_the_lease() {
        let cfg = config();
        let lease = Lease {
            expires_at: T + 30_000,
            claimed_at: T,
            claimed_boot_ns: Some(100 * SEC),
        };
        // The wall clock says 1 s passed, the boot clock a minute.
        let why = lease.distrust(&cfg, T + 1_000, Some(160 * SEC)).unwrap();
        assert!(why.contains("went back"), "{why}");
        // Without a boot clock reading only the wall clock counts.
        assert_eq!(lease.distrust(&cfg, T + 1_000, None), None);
    }
}
