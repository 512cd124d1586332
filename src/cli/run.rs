//! `leasehold run`: a runner in the foreground, shut down gracefully by SIGINT or SIGTERM.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use crossbeam_channel::{Receiver, RecvTimeoutError};
use leasehold::Runner;
use nix::sys::signal::{SigSet, Signal};
use parking_lot::Mutex;

use super::arg::Secs;
use super::junit;
use super::{RunArgs, Usage};

/// How often `--until-idle` looks whether any job is left (beyond after each ending).
const IDLE_CHECK: Duration = Duration::from_millis(150);
/// How often a runner in the foreground looks whether a thread of it failed: rarely, as an
/// idle runner should cost next to no CPU, and a failed runner has fenced itself already.
const HEALTH_CHECK: Duration = Duration::from_secs(1);

/// The most `--workers` the command takes: the library's bound, so that a mistyped count
/// (`--workers 9223372036854775808`) is a usage error naming it, before anything starts.
pub const MAX_WORKERS: usize = leasehold::MAX_WORKERS;

pub fn run(db: &Path, args: &RunArgs) -> anyhow::Result<()> {
    // A report's file is made before anything runs: a path it cannot be written to is said
    // at once, with the database untouched, not after the jobs ran.
    let report = args
        .junit
        .as_deref()
        .map(|path| junit::create(path).map(|file| (path, file)))
        .transpose()?;
    let started_at = leasehold::now_ms();
    // Block the signals before any other thread exists, so that every thread inherits the
    // mask and only the signal thread receives them (with sigwait). The runner's threads thus
    // block SIGINT and SIGTERM, but jobs do not inherit that: each attempt is spawned with
    // posix_spawn and an empty POSIX_SPAWN_SETSIGMASK (and default dispositions), whatever
    // the spawning thread blocks.
    let signals = watch_signals().context("cannot set up signal handling")?;

    let mut builder = Runner::builder(db)
        .workers(args.workers)
        .lease_ttl(args.lease_ttl.0)
        .sample_interval(args.sample_interval.0)
        .shutdown_grace(args.shutdown_grace.0)
        .max_recovery_attempts(args.max_recovery)
        .reclaim_batch(args.reclaim_batch)
        .keepers(!args.no_keepers)
        .assume_unknown_conditions(args.unknown_conditions == "held")
        .output_cap(args.output_cap)
        .on_shutdown(if args.on_exit == "leave" {
            leasehold::OnShutdown::Leave
        } else {
            leasehold::OnShutdown::Interrupt
        })
        .retention(args.keep.retention());
    if let Some(n) = args.nice {
        builder = builder.nice(n);
    }
    if let Some(c) = args.io_class {
        builder = builder.io_class(c);
    }
    // Those not given follow the lease TTL (the library's defaults).
    if let Some(Secs(heartbeat)) = args.heartbeat {
        builder = builder.heartbeat_interval(heartbeat);
    }
    if let Some(Secs(sweep)) = args.sweep {
        builder = builder.sweep_interval(sweep);
    }
    if let Some(Secs(grace)) = args.kill_grace {
        builder = builder.kill_grace(grace);
    }
    for (q, limit) in &args.queue {
        builder = builder.queue(q, *limit);
    }
    // The jobs that ended while this runner ran: every ending on the database from its
    // start (the notifier reads them all, the last ones at shutdown), sorted out at the end.
    let ended = Arc::new(Mutex::new(Vec::new()));
    if report.is_some() || args.fail_on_failure {
        let ended = Arc::clone(&ended);
        builder = builder.on_complete(move |c| ended.lock().push(c.job_id));
    }
    let runner = builder.start().inspect_err(|_| {
        // Nothing ran: no report, rather than an empty file CI would take for a broken one.
        if let Some((path, _)) = &report {
            let _ = std::fs::remove_file(path);
        }
    });
    let runner = runner.map_err(|e| match e {
        leasehold::Error::Invalid { setting, reason } => {
            anyhow::Error::new(Usage(format!("invalid {}: {reason}", flag(setting))))
        }
        e => anyhow::Error::new(e).context(format!(
            "cannot start a runner on {}",
            leasehold::redacted_db(db)
        )),
    })?;

    let worker_id = runner.worker_id().to_string();
    let mut signals = Some(signals);
    // With --until-idle, every ending of this runner is a moment to look again; the check
    // interval bounds how late an ending in another process is seen. The first look is at
    // once, so that an empty file costs no wait at all.
    let endings = args.until_idle.then(|| runner.subscribe());
    let (no_signals, no_endings) = (crossbeam_channel::never(), crossbeam_channel::never());
    loop {
        // A runner thread that failed has fenced the runner: stop, and exit 1 with the cause
        // (the shutdown below returns it).
        if runner.health().is_err() {
            break;
        }
        if args.until_idle {
            match runner.has_unfinished() {
                Ok(false) => {
                    log::info!("no job left to run: shutting down");
                    break;
                }
                Ok(true) => {}
                // The runner stopped itself: the shutdown below returns why.
                Err(e) if e.is_damaged() => break,
                Err(e) => log::warn!(
                    "cannot tell whether jobs are left: {:#}",
                    anyhow::Error::new(e)
                ),
            }
        }
        let sigs = signals.as_ref().unwrap_or(&no_signals);
        let ends = endings.as_ref().unwrap_or(&no_endings);
        let received = crossbeam_channel::select! {
            recv(sigs) -> sig => sig.map_err(|_| RecvTimeoutError::Disconnected),
            recv(ends) -> _ => Err(RecvTimeoutError::Timeout),
            default(if args.until_idle { IDLE_CHECK } else { HEALTH_CHECK }) => {
                Err(RecvTimeoutError::Timeout)
            }
        };
        match received {
            Ok(sig) => {
                log::info!(
                    "{sig} received: shutting down, running jobs have {}s to finish",
                    args.shutdown_grace
                );
                break;
            }
            Err(RecvTimeoutError::Disconnected) => {
                log::error!("the signal thread has stopped: SIGINT and SIGTERM are not handled");
                signals = None;
            }
            Err(RecvTimeoutError::Timeout) => {}
        }
    }
    // A signal while the shutdown is under way (a second Ctrl-C, a second SIGTERM) forces
    // the exit: the attempts are killed now, and the command exits 1 without waiting out the
    // shutdown grace or a database another process holds.
    let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(1);
    // A kill grace that was not given is at most its default (it follows the lease TTL).
    let grace = args
        .kill_grace
        .map_or(leasehold::DEFAULT_KILL_GRACE, |g| g.0);
    let kill_wait = grace + FORCED_EXIT_MARGIN;
    let stopped = std::thread::scope(|scope| {
        if let Some(sigs) = &signals {
            let runner = &runner;
            scope.spawn(move || {
                crossbeam_channel::select! {
                    recv(sigs) -> sig => {
                        if let Ok(sig) = sig {
                            log::warn!("{sig} received again: killing running jobs and exiting");
                            if !runner.abort(kill_wait) {
                                log::error!("running jobs did not end within {kill_wait:?}");
                            }
                            std::process::exit(1);
                        }
                    }
                    recv(done_rx) -> _ => {}
                }
            });
        }
        let stopped = runner
            .shutdown_within(args.shutdown_grace.0)
            .context("the runner did not shut down cleanly");
        let _ = done_tx.send(());
        stopped
    });
    if report.is_none() && !args.fail_on_failure {
        return stopped;
    }
    // Whatever ended is reported, even when the runner failed or a signal stopped the run;
    // the runner's failure comes first.
    let ended = std::mem::take(&mut *ended.lock());
    let judged = judge(db, &worker_id, ended, report, started_at);
    stopped?;
    let failed = judged?;
    if args.fail_on_failure && !failed.is_empty() {
        let ids: Vec<String> = failed.iter().map(i64::to_string).collect();
        anyhow::bail!(
            "{} job{} of this run failed: {}",
            failed.len(),
            if failed.len() == 1 { "" } else { "s" },
            ids.join(", ")
        );
    }
    Ok(())
}

/// Reads the jobs in `ended` that this run ended (its runner ran their last attempt, or
/// they ended without one: cancelled before they ran), writes their report when asked, and
/// returns the ids of those that failed.
fn judge(
    db: &Path,
    worker_id: &str,
    mut ended: Vec<i64>,
    report: Option<(&Path, std::fs::File)>,
    started_at: i64,
) -> anyhow::Result<Vec<i64>> {
    ended.sort_unstable();
    ended.dedup();
    let store = super::open_read_only(db)?;
    let mut cases = Vec::new();
    for id in ended {
        let job = match store.job(id) {
            Ok(job) => job,
            // Pruned since (a retention shorter than the run).
            Err(leasehold::Error::NoSuchJob(_)) => continue,
            Err(e) => return Err(e.into()),
        };
        if job.attempt > 0 && job.worker_id.as_deref() != Some(worker_id) {
            continue;
        }
        cases.push(junit::Case::of(&store, job)?);
    }
    if let Some((path, file)) = report {
        junit::write(file, path, &junit::render(&cases, Some(started_at)))?;
        log::info!("JUnit report {}: {}", path.display(), junit::totals(&cases));
    }
    Ok(cases
        .iter()
        .filter(|c| c.failed())
        .map(|c| c.id())
        .collect())
}

/// How long a forced exit waits, beyond the kill grace, for the killed attempts to end.
const FORCED_EXIT_MARGIN: Duration = Duration::from_secs(2);

/// Blocks SIGINT and SIGTERM in this thread (and so in every thread started after), and
/// starts a thread that waits for them and sends each on the returned channel.
fn watch_signals() -> anyhow::Result<Receiver<Signal>> {
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    set.thread_block()?;
    let (tx, rx) = crossbeam_channel::unbounded();
    std::thread::Builder::new()
        .name("leasehold-signals".into())
        .spawn(move || {
            loop {
                match set.wait() {
                    Ok(sig) => {
                        if tx.send(sig).is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        log::error!("waiting for signals failed: {e}");
                        return;
                    }
                }
            }
        })?;
    Ok(rx)
}

/// The flag that sets a runner setting the library names.
fn flag(setting: &str) -> String {
    let name = match setting {
        "workers" => "workers",
        "lease_ttl" => "lease-ttl",
        "heartbeat_interval" => "heartbeat",
        "sweep_interval" => "sweep",
        "sample_interval" => "sample-interval",
        "kill_grace" => "kill-grace",
        "shutdown_grace" => "shutdown-grace",
        "max_recovery_attempts" => "max-recovery",
        "reclaim_batch" => "reclaim-batch",
        "on_shutdown" => "on-exit",
        other => return other.to_string(),
    };
    format!("--{name}")
}
