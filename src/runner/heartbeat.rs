//! The heartbeat: renews every lease the runner holds in one statement, stops the attempts
//! whose leases are gone, and fences the runner itself when it cannot renew in time.

use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError};

use crate::job::{duration_ms, now_ms};
use crate::process::StopReason;
use crate::store::Store;

use super::shared::{FENCE_MARGIN, Fence, Shared};

/// The least time a renewal is given, even when the runner wakes (from a suspend, a SIGSTOP)
/// to find its leases already past their expiry: elapsed time alone is no evidence of a lost
/// lease, so the renewal is always tried.
const MIN_RENEW_BUDGET: Duration = Duration::from_millis(250);

/// Renews leases every heartbeat interval until `stop` is closed, or until the runner has
/// fenced itself after a thread failed: its leases must then run out, so that other runners
/// can reclaim what it can no longer vouch for.
pub(crate) fn run(mut store: Store, shared: &Shared, stop: &Receiver<()>) {
    let interval = shared.config.heartbeat_interval;
    loop {
        match stop.recv_timeout(interval) {
            Err(RecvTimeoutError::Timeout) if !shared.failed() => {
                shared.test_hook("heartbeat");
                beat(&mut store, shared, now_ms());
            }
            _ => return,
        }
    }
}

/// One renewal. The time an attempt must be stopped by, to be dead before its lease runs out,
/// is its lease expiry less the kill grace and a margin: that bounds how long the renewal may
/// wait for a busy database.
pub(crate) fn beat(store: &mut Store, shared: &Shared, now: i64) {
    let cfg = &shared.config;
    let reserve = duration_ms(cfg.kill_grace + FENCE_MARGIN);
    let (tokens, earliest) = {
        let running = shared.running.lock();
        let tokens: Vec<String> = running.keys().cloned().collect();
        let earliest = running.values().map(|r| r.lease_expires_at).min();
        (tokens, earliest)
    };
    // At most the lease TTL, at least MIN_RENEW_BUDGET even when the TTL is shorter (a
    // `clamp` would panic on those crossed bounds).
    let budget = earliest
        .map(|e| {
            let left = e.saturating_sub(reserve).saturating_sub(now);
            Duration::from_millis(u64::try_from(left).unwrap_or(0))
        })
        .unwrap_or(cfg.heartbeat_interval)
        .min(cfg.lease_ttl)
        .max(MIN_RENEW_BUDGET);
    store.set_busy_timeout(budget);
    let at = now_ms();
    let at_boot = crate::process::boot_clock_ns();
    let started = std::time::Instant::now();
    // A manual clock stamps the database; the attempts' own counts stay on this host's.
    let stamp = if store.clock().is_manual() {
        store.now()
    } else {
        at
    };
    match store.renew(&shared.worker_id, &tokens, cfg.lease_ttl, stamp) {
        Ok(renewal) => {
            let took = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
            shared
                .renew_nanos
                .store(took.max(1), std::sync::atomic::Ordering::Relaxed);
            let mut running = shared.running.lock();
            let fence =
                crate::files::LeaseFence::of(at_boot, cfg.lease_ttl, cfg.kill_grace, FENCE_MARGIN);
            for token in &renewal.renewed {
                if let Some(r) = running.get_mut(token) {
                    r.lease_expires_at = at + duration_ms(cfg.lease_ttl);
                    match (&r.fence, fence) {
                        (Fence::Keeper, Some(fence)) => {
                            crate::process::move_fence(token, Some(fence));
                        }
                        (Fence::File(dir), Some(fence)) => {
                            // Its keeper made the folder when its runner went.
                            if let Err(e) = crate::files::make_attempt_dir(dir)
                                .and_then(|()| crate::files::write_lease(dir, fence))
                            {
                                log::debug!("job {}: lease file: {e}", r.job_id);
                            }
                        }
                        _ => {}
                    }
                }
            }
            for token in &renewal.lost {
                if let Some(r) = running.get(token) {
                    log::info!(
                        "job {}: lease lost (cancelled, reclaimed or retried elsewhere); \
                         killing the attempt",
                        r.job_id
                    );
                    r.stop.stop(StopReason::LeaseLost);
                }
            }
        }
        Err(e) if shared.stop_if_damaged("heartbeat", &e) => {}
        Err(e) => {
            let now = now_ms();
            let running = shared.running.lock();
            for r in running.values() {
                if r.lease_expires_at - reserve <= now {
                    log::warn!(
                        "job {}: cannot renew its lease before it runs out ({e:#}); \
                         killing the attempt so that no other runner overlaps it",
                        r.job_id
                    );
                    r.stop.stop(StopReason::SelfFenced);
                }
            }
            if e.is_full() {
                // The writer warns of a full disk itself, once a minute.
                log::debug!("lease renewal failed: {e:#}");
            } else if !e.is_busy() {
                log::error!("lease renewal failed: {e:#}");
            }
        }
    }
}
