//! The schedule firer: fires due slots of every schedule on the file.
//!
//! The logic is [`Firer::fire_once`], which takes the time and returns what it did; the
//! runner's thread only sleeps until the earliest next slot (at most [`MAX_SLEEP`], so that
//! schedules changed by another process are seen within it), woken early when this process
//! changes a schedule, and calls it. Every runner on a file fires: the store's transaction
//! decides which one fires a slot, so no slot fires twice.
//!
//! A wall clock that jumps forward (a suspend, a clock change) makes slots due at once; the
//! store sorts them by the schedule's catch-up policy. After one that jumps back, a next slot
//! more than a period ahead (computed while the clock was ahead) is recomputed from now by
//! the store, so the schedule fires on time rather than once the clock catches up.

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, select};

use crate::error::Result;

use crate::store::{FireReport, Store};

use super::shared::Shared;

/// The longest the firer sleeps between looks at the schedules.
pub(crate) const MAX_SLEEP: Duration = Duration::from_secs(1);

/// The firer's connection.
pub(crate) struct Firer {
    store: Store,
}

impl Firer {
    pub(crate) fn new(store: Store) -> Firer {
        Firer { store }
    }

    /// Fires every slot due at `now`, and logs a line when something was fired, missed or
    /// skipped.
    pub(crate) fn fire_once(&self, now: i64) -> Result<FireReport> {
        let report = self.store.fire_due_at(now)?;
        if report.did_something() {
            log::info!(
                "schedules enqueued={} missed={} skipped={}",
                report.enqueued,
                report.missed,
                report.skipped
            );
        }
        Ok(report)
    }

    /// How long to sleep at `now` before the next look: until the earliest slot, at most
    /// [`MAX_SLEEP`].
    pub(crate) fn sleep_for(report: &FireReport, now: i64) -> Duration {
        match report.next_due {
            Some(at) if at > now => {
                Duration::from_millis(u64::try_from(at - now).unwrap_or(0)).min(MAX_SLEEP)
            }
            Some(_) => Duration::ZERO,
            None => MAX_SLEEP,
        }
    }
}

/// How far the wall clock may drift from the monotonic one between two looks before the
/// firer calls it a jump.
const JUMP_TOLERANCE_MS: i64 = 2_000;

/// The wall clock's jump between two looks, in milliseconds (forward positive), when it moved
/// more than [`JUMP_TOLERANCE_MS`] away from the monotonic clock (which stops during a
/// suspend): the sweeper's test, used here only to say in the log why slots are missed or
/// why none fire.
pub(crate) fn clock_jump(prev: (i64, Instant), now: (i64, Instant)) -> Option<i64> {
    let wall = now.0 - prev.0;
    let mono =
        i64::try_from(now.1.saturating_duration_since(prev.1).as_millis()).unwrap_or(i64::MAX);
    let jump = wall.saturating_sub(mono);
    (jump.abs() > JUMP_TOLERANCE_MS).then_some(jump)
}

/// Fires until `stop` closes. `wake` is sent to when this process changes a schedule. A
/// failure (a locked or full database) is logged and tried again at the next look.
pub(crate) fn run(firer: &Firer, shared: &Shared, stop: &Receiver<()>, wake: &Receiver<()>) {
    let mut failures = 0u64;
    let mut last = (firer.store.now(), Instant::now());
    loop {
        if shared.failed() {
            return;
        }
        shared.test_hook("firer");
        let now = firer.store.now();
        let look = (now, Instant::now());
        match clock_jump(last, look) {
            Some(jump) if jump > 0 => log::info!(
                "schedules: the wall clock jumped {:.1}s ahead (a suspend or a clock change): \
                 slots due meanwhile follow each schedule's catch-up policy",
                jump as f64 / 1000.0
            ),
            Some(jump) => log::info!(
                "schedules: the wall clock went back {:.1}s: a next slot more than a period \
                 ahead is recomputed from now",
                -jump as f64 / 1000.0
            ),
            None => {}
        }
        last = look;
        let sleep = match firer.fire_once(now) {
            Ok(report) => {
                if report.enqueued > 0 {
                    shared.wake_dispatcher();
                }
                if failures > 0 {
                    log::info!("schedules: firing works again after {failures} failures");
                    failures = 0;
                }
                Firer::sleep_for(&report, firer.store.now())
            }
            Err(e) if shared.stop_if_damaged("firer", &e) => return,
            Err(e) => {
                failures += 1;
                if failures == 1 || failures % 60 == 0 {
                    log::warn!("schedules: cannot fire due slots ({failures} times): {e:#}");
                }
                MAX_SLEEP
            }
        };
        select! {
            recv(stop) -> _ => return,
            recv(wake) -> _ => {}
            default(sleep) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{EventKind, Job, Status};
    use crate::schedule::{CatchUp, Overlap, Schedule};
    use crate::store::ListFilter;

    const MIN: i64 = 60_000;
    /// 2027-01-01T00:00:00Z.
    const T: i64 = 1_798_761_600_000;

    fn firer(path: &std::path::Path) -> Firer {
        Firer::new(Store::open(path).unwrap())
    }

    #[test]
    fn clock_jumps_are_told_from_drift_and_sleep() {
        let m0 = Instant::now();
        let s = Duration::from_secs;
        // Both clocks moved a second: no jump.
        assert_eq!(clock_jump((T, m0), (T + 1_000, m0 + s(1))), None);
        // A little drift is no jump.
        assert_eq!(clock_jump((T, m0), (T + 2_500, m0 + s(1))), None);
        // An hour of wall clock in a second of monotonic time: a suspend, or a step ahead.
        assert_eq!(
            clock_jump((T, m0), (T + 3_601_000, m0 + s(1))),
            Some(3_600_000)
        );
        // The wall clock stepped back ten minutes.
        assert_eq!(
            clock_jump((T, m0), (T - 599_000, m0 + s(1))),
            Some(-600_000)
        );
    }

    #[test]
    fn a_wall_clock_jump_forward_is_caught_up_by_the_policy_and_back_is_recomputed_from_now() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.db");
        let store = Store::open(&path).unwrap();
        let minutely = Schedule::cron("* * * * *")
            .unwrap()
            .overlap(Overlap::Allow)
            .job(Job::shell("true"));
        store.put_schedule_at("skip", &minutely, T).unwrap();
        store
            .put_schedule_at("one", &minutely.clone().catch_up(CatchUp::One), T)
            .unwrap();
        let f = firer(&path);
        // On time: each fires its first slot.
        let r = f.fire_once(T + MIN + 100).unwrap();
        assert_eq!((r.enqueued, r.missed), (2, 0));
        assert_eq!(r.next_due, Some(T + 2 * MIN));
        assert_eq!(Firer::sleep_for(&r, T + MIN + 100), MAX_SLEEP);
        assert_eq!(
            Firer::sleep_for(&r, T + 2 * MIN - 300),
            Duration::from_millis(300)
        );
        // The wall clock jumps an hour ahead (a suspend): 60 slots are due at once. Skip
        // fires none and records them; one fires the newest.
        let jumped = T + 61 * MIN + 100;
        let r = f.fire_once(jumped).unwrap();
        // The slot at 61 minutes is on time (100 ms late) for both; the 59 before are late.
        assert_eq!(r.enqueued, 3, "{r:?}");
        assert_eq!(r.missed, 59 + 58, "{r:?}");
        let missed = store.schedule_events("skip").unwrap();
        assert_eq!(missed.len(), 1);
        assert_eq!(missed[0].kind, EventKind::ScheduleMissed);
        assert!(
            missed[0]
                .detail
                .as_deref()
                .unwrap()
                .starts_with("59 slots missed")
        );
        // The clock steps back half an hour: nothing fires, and the next slots (half an hour
        // ahead) are recomputed from now rather than silencing the schedules meanwhile.
        let back = T + 31 * MIN;
        let r = f.fire_once(back).unwrap();
        assert_eq!(r.enqueued + r.missed + r.skipped, 0, "{r:?}");
        assert_eq!(r.next_due, Some(T + 32 * MIN));
        let r = f.fire_once(T + 32 * MIN + 50).unwrap();
        assert_eq!((r.enqueued, r.missed), (2, 0), "{r:?}");
        let jobs = store.list(&ListFilter::default()).unwrap();
        assert_eq!(jobs.len(), 7);
        assert!(jobs.iter().all(|j| j.status == Status::Pending));
        // Every slot has at most one job per schedule.
        for name in ["skip", "one"] {
            let mut slots: Vec<i64> = jobs
                .iter()
                .filter(|j| j.schedule.as_deref() == Some(name))
                .map(|j| j.slot_at.unwrap())
                .collect();
            let n = slots.len();
            slots.dedup();
            assert_eq!(slots.len(), n, "{name}: {slots:?}");
        }
        // Firing goes on every minute.
        let r = f.fire_once(T + 33 * MIN + 50).unwrap();
        assert_eq!(r.enqueued, 2);
    }
}
