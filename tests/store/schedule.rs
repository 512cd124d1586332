//! Schedules in the store, with time as a parameter: firing, catch-up, overlap, pause, and
//! two connections firing the same slots.

use std::time::Duration;

use leasehold::protocol::Ending;
use leasehold::{
    CatchUp, Error, EventKind, Job, JobRecord, ListFilter, Overlap, Schedule, Status, Store,
};

use crate::helper::{claim_one, finish};
use crate::util::TestDb;

const MIN: i64 = 60_000;
/// 2027-01-01T00:00:00Z.
const T: i64 = 1_798_761_600_000;

fn minutely() -> Schedule {
    Schedule::cron("* * * * *")
        .unwrap()
        .overlap(Overlap::Allow)
        .job(Job::shell("true"))
}

/// A cron schedule of `true` every second, its slots not overlapped.
fn every_second() -> Schedule {
    Schedule::cron("* * * * * *")
        .unwrap()
        .job(Job::shell("true"))
}

/// Stores `fast`, an interval schedule of `true` every 2 s from `T` whose slots may overlap.
fn put_every_two_seconds(store: &Store) {
    let every_2s = Schedule::every(Duration::from_secs(2))
        .overlap(Overlap::Allow)
        .job(Job::shell("true"));
    store.put_schedule_at("fast", &every_2s, T).unwrap();
}

fn jobs_of(store: &Store, name: &str) -> Vec<JobRecord> {
    let mut jobs: Vec<JobRecord> = store
        .list(&ListFilter::default())
        .unwrap()
        .into_iter()
        .filter(|j| j.schedule.as_deref() == Some(name))
        .collect();
    jobs.sort_by_key(|j| j.slot_at);
    jobs
}

fn slots(jobs: &[JobRecord]) -> Vec<i64> {
    jobs.iter().map(|j| j.slot_at.unwrap()).collect()
}

#[test]
fn a_damaged_schedule_does_not_hold_the_others_back() {
    let db = TestDb::new();
    let store = db.store();
    store.put_schedule_at("bad", &minutely(), T).unwrap();
    store.put_schedule_at("good", &minutely(), T).unwrap();
    db.bare()
        .execute(
            "UPDATE schedules SET job = 'not json' WHERE name = 'bad'",
            [],
        )
        .unwrap();
    assert!(store.fire_due_at(T + MIN).is_err());
    assert_eq!(slots(&jobs_of(&store, "good")), vec![T + MIN]);
    assert!(jobs_of(&store, "bad").is_empty());
}

crate::on_both! {
    fn a_due_slot_enqueues_one_job_that_names_its_schedule_and_slot(db) {
        let store = db.store();
        let rec = store.put_schedule_at("tick", &minutely(), T + 5).unwrap();
        assert_eq!(rec.next_slot_at, Some(T + MIN));
        assert_eq!(store.fire_due_at(T + MIN - 1).unwrap().enqueued, 0);
        let r = store.fire_due_at(T + MIN + 200).unwrap();
        assert_eq!((r.enqueued, r.missed, r.skipped), (1, 0, 0));
        assert_eq!(r.next_due, Some(T + 2 * MIN));
        // Fired: firing again at the same time does nothing.
        assert_eq!(store.fire_due_at(T + MIN + 300).unwrap().enqueued, 0);
        let jobs = jobs_of(&store, "tick");
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].slot_at, Some(T + MIN));
        assert_eq!(jobs[0].scheduled_at, T + MIN);
        let events = store.events(jobs[0].id).unwrap();
        assert_eq!(events[0].kind, EventKind::Enqueued);
        let detail = events[0].detail.clone().unwrap();
        assert!(
            detail.contains("schedule tick") && detail.contains("2027-01-01T00:01:00Z"),
            "{detail}"
        );
        let rec = store.schedule("tick").unwrap();
        assert_eq!(rec.last_slot_at, Some(T + MIN));
        assert_eq!(rec.next_slot_at, Some(T + 2 * MIN));
    }

    fn catch_up_skip_one_and_all_make_0_1_and_n_jobs_for_a_gap(db) {
        let store = db.store();
        for (name, policy) in [
            ("skip", CatchUp::Skip),
            ("one", CatchUp::One),
            ("all", CatchUp::All),
        ] {
            store
                .put_schedule_at(name, &minutely().catch_up(policy), T)
                .unwrap();
        }
        // The runners fire the first slot on time, then stop for nine slots.
        assert_eq!(store.fire_due_at(T + MIN + 100).unwrap().enqueued, 3);
        let restart = T + 10 * MIN + 30_000;
        let r = store.fire_due_at(restart).unwrap();
        assert_eq!(r.enqueued, 1 + 9, "{r:?}");
        assert_eq!(r.missed, 9 + 8, "{r:?}");
        let gap: Vec<i64> = (2..=10).map(|k| T + k * MIN).collect();
        assert_eq!(slots(&jobs_of(&store, "skip")), vec![T + MIN]);
        assert_eq!(slots(&jobs_of(&store, "one")), vec![T + MIN, T + 10 * MIN]);
        let all = slots(&jobs_of(&store, "all"));
        assert_eq!(all[1..], gap[..]);

        let skip_events = store.schedule_events("skip").unwrap();
        assert_eq!(skip_events.len(), 1);
        assert_eq!(skip_events[0].kind, EventKind::ScheduleMissed);
        let detail = skip_events[0].detail.clone().unwrap();
        assert!(
            detail.starts_with("9 slots missed from 2027-01-01T00:02:00Z to 2027-01-01T00:10:00Z"),
            "{detail}"
        );
        let one_events = store.schedule_events("one").unwrap();
        assert_eq!(one_events.len(), 1);
        assert!(
            one_events[0]
                .detail
                .as_deref()
                .unwrap()
                .starts_with("8 slots missed")
        );
        assert_eq!(one_events[0].slot_at, Some(T + 9 * MIN));
        assert!(store.schedule_events("all").unwrap().is_empty());
        // Every schedule resumes at the next future slot.
        for name in ["skip", "one", "all"] {
            assert_eq!(
                store.schedule(name).unwrap().next_slot_at,
                Some(T + 11 * MIN)
            );
        }
    }

    fn catch_up_all_keeps_the_100_most_recent_slots(db) {
        let store = db.store();
        store
            .put_schedule_at("all", &minutely().catch_up(CatchUp::All), T)
            .unwrap();
        let r = store.fire_due_at(T + 150 * MIN + 30_000).unwrap();
        assert_eq!((r.enqueued, r.missed), (100, 50));
        let fired = slots(&jobs_of(&store, "all"));
        assert_eq!(fired.first(), Some(&(T + 51 * MIN)));
        assert_eq!(fired.last(), Some(&(T + 150 * MIN)));
        let events = store.schedule_events("all").unwrap();
        assert!(
            events[0]
                .detail
                .as_deref()
                .unwrap()
                .starts_with("50 slots missed")
        );
    }

    fn a_long_gap_of_a_one_second_schedule_is_counted_without_firing_it(db) {
        let store = db.store();
        store.put_schedule_at("s", &every_second(), T).unwrap();
        // A week of downtime: 604,800 slots.
        let r = store.fire_due_at(T + 7 * 86_400_000 + 20_500).unwrap();
        // Only the newest slot, 500 ms late, is within the grace (half its 1 s period); the
        // rest are counted as missed.
        assert_eq!(r.enqueued, 1, "{r:?}");
        assert_eq!(r.enqueued + r.missed, 7 * 86_400 + 20, "{r:?}");
    }

    fn overlap_skip_enqueues_nothing_while_the_earlier_job_is_unfinished(db) {
        let store = db.store();
        store
            .put_schedule_at("sync", &minutely().overlap(Overlap::Skip), T)
            .unwrap();
        assert_eq!(store.fire_due_at(T + MIN).unwrap().enqueued, 1);
        // Still pending: the next slot is skipped.
        let r = store.fire_due_at(T + 2 * MIN).unwrap();
        assert_eq!((r.enqueued, r.skipped), (0, 1));
        // Running: skipped too.
        let c = claim_one(&store, "w", T + 2 * MIN + 10);
        let r = store.fire_due_at(T + 3 * MIN).unwrap();
        assert_eq!((r.enqueued, r.skipped), (0, 1));
        let events = store.schedule_events("sync").unwrap();
        assert_eq!(events.len(), 2);
        assert!(events.iter().all(|e| e.kind == EventKind::ScheduleSkipped));
        assert_eq!(events[1].slot_at, Some(T + 3 * MIN));
        assert!(
            events[1]
                .detail
                .as_deref()
                .unwrap()
                .contains("still running")
        );
        // Finished: the next slot fires.
        finish(&store, &c, Ending::Succeeded, T + 3 * MIN + 10);
        assert_eq!(store.fire_due_at(T + 4 * MIN).unwrap().enqueued, 1);
        assert_eq!(slots(&jobs_of(&store, "sync")), vec![T + MIN, T + 4 * MIN]);
    }

    fn two_connections_firing_the_same_slots_at_once_fire_each_once(db) {
        drop(db.store());
        let s = Schedule::cron("*/1 * * * * *")
            .unwrap()
            .overlap(Overlap::Allow)
            .job(Job::shell("true"));
        db.store().put_schedule_at("fast", &s, T).unwrap();
        let barrier = std::sync::Barrier::new(2);
        // A failed firing is noted, not unwrapped: a thread that panicked would leave the
        // other waiting at the barrier for ever.
        let (enqueued, failed): (u64, Vec<String>) = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..2)
                .map(|_| {
                    scope.spawn(|| {
                        let store = db.store();
                        let (mut n, mut failed) = (0, Vec::new());
                        for k in 1..=200 {
                            barrier.wait();
                            match store.fire_due_at(T + k * 1000 + 5) {
                                Ok(r) => n += r.enqueued,
                                Err(e) => failed.push(format!("slot {k}: {e:?}")),
                            }
                        }
                        (n, failed)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).fold(
                (0, Vec::new()),
                |(n, mut all), (m, failed)| {
                    all.extend(failed);
                    (n + m, all)
                },
            )
        });
        assert!(failed.is_empty(), "a connection that lost a race failed: {failed:?}");
        assert_eq!(enqueued, 200);
        let jobs = jobs_of(&db.store(), "fast");
        // No slot fires before it is due: the connection that lost a race finds the next slot
        // in the future and fires nothing.
        let early: Vec<(i64, i64)> = jobs
            .iter()
            .filter(|j| j.slot_at.unwrap() > j.created_at)
            .map(|j| (j.slot_at.unwrap(), j.created_at))
            .collect();
        assert!(
            early.is_empty(),
            "slots fired before due (slot, created): {early:?}"
        );
        let fired = slots(&jobs);
        let want: Vec<i64> = (1..=200).map(|k| T + k * 1000).collect();
        assert_eq!(fired, want);
    }

    fn a_paused_schedule_fires_nothing_and_resumes_at_its_next_future_slot(db) {
        // On a clock the test moves: every call acts at its time.
        let clock = leasehold::ManualClock::new(T);
        let store = db.store_with(&leasehold::OpenOptions::new().clock(&clock));
        store
            .put_schedule("p", &minutely().catch_up(CatchUp::All))
            .unwrap();
        clock.set(T + 10);
        let rec = store.pause_schedule("p").unwrap();
        assert!(rec.paused);
        clock.set(T + 30 * MIN);
        assert_eq!(store.fire_due().unwrap().enqueued, 0);
        clock.advance(Duration::from_millis(10));
        let rec = store.resume_schedule("p").unwrap();
        assert!(!rec.paused);
        assert_eq!(rec.next_slot_at, Some(T + 31 * MIN));
        clock.set(T + 31 * MIN + 10);
        let r = store.fire_due().unwrap();
        assert_eq!((r.enqueued, r.missed), (1, 0));
        assert!(store.schedule_events("p").unwrap().is_empty());
    }

    fn names_are_unique_and_bad_schedules_write_nothing(db) {
        let store = db.store();
        store.put_schedule_at("a", &minutely(), T).unwrap();
        match store.put_schedule_at("a", &minutely().tz("Europe/Berlin"), T + 1) {
            Err(Error::ScheduleExists(name)) => assert_eq!(name, "a"),
            other => panic!("{other:?}"),
        }
        assert_eq!(store.schedule("a").unwrap().schedule.zone_name(), "UTC");
        let replaced = store
            .replace_schedule("a", &minutely().tz("Europe/Berlin"))
            .unwrap();
        assert_eq!(replaced.schedule.zone_name(), "Europe/Berlin");
        assert_eq!(replaced.created_at, T);

        let bad: Vec<(&str, Schedule, &str)> = vec![
            ("", minutely(), "name"),
            ("b", minutely().tz("Nowhere/Land"), "tz"),
            (
                "b",
                Schedule::every(Duration::ZERO).job(Job::shell("true")),
                "every",
            ),
            ("b", Schedule::cron("@daily").unwrap(), "command"),
        ];
        for (name, schedule, setting) in bad {
            match store.put_schedule_at(name, &schedule, T) {
                Err(Error::Invalid { setting: s, .. }) => assert_eq!(s, setting),
                other => panic!("{name:?}: {other:?}"),
            }
        }
        assert_eq!(store.schedules().unwrap().len(), 1);
        match store.remove_schedule("nope") {
            Err(Error::NoSuchSchedule(n)) => assert_eq!(n, "nope"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            store.pause_schedule("nope"),
            Err(Error::NoSuchSchedule(_))
        ));
        store.remove_schedule("a").unwrap();
        assert!(store.schedules().unwrap().is_empty());
    }

    fn an_interval_counts_from_when_it_was_stored(db) {
        let store = db.store();
        let s = Schedule::every(Duration::from_secs(90)).job(Job::shell("true"));
        let rec = store.put_schedule_at("i", &s, T + 7).unwrap();
        assert_eq!(rec.next_slot_at, Some(T + 7 + 90_000));
        assert_eq!(
            store.next_slots("i", T + 7, 3).unwrap(),
            vec![T + 90_007, T + 180_007, T + 270_007]
        );
        assert_eq!(store.fire_due_at(T + 90_007).unwrap().enqueued, 1);
        let job = &jobs_of(&store, "i")[0];
        assert_eq!(job.status, Status::Pending);
    }

    fn a_schedule_keeps_its_newest_events_only(db) {
        let store = db.store();
        store.put_schedule_at("busy", &every_second(), T).unwrap();
        // The first slot's job never ends: every later slot is skipped.
        assert_eq!(store.fire_due_at(T + 1_000).unwrap().enqueued, 1);
        for k in 2..=(leasehold::MAX_SCHEDULE_EVENTS + 50) {
            let r = store.fire_due_at(T + k * 1_000).unwrap();
            assert_eq!(r.skipped, 1);
        }
        let events = store.schedule_events("busy").unwrap();
        assert_eq!(events.len() as i64, leasehold::MAX_SCHEDULE_EVENTS);
        assert_eq!(
            events.last().unwrap().slot_at,
            Some(T + (leasehold::MAX_SCHEDULE_EVENTS + 50) * 1_000)
        );
    }

    fn catch_up_skip_fires_no_missed_slot_of_a_short_outage_of_a_two_second_schedule(db) {
        let store = db.store();
        put_every_two_seconds(&store);
        assert_eq!(store.fire_due_at(T + 2_000 + 5).unwrap().enqueued, 1);
        // The firer is away for about 6 s: the slots at 4, 6 and 8 s pass. It returns 1.5 s
        // after the newest, more than half a period late: all three were missed, none fires.
        let r = store.fire_due_at(T + 9_500).unwrap();
        assert_eq!((r.enqueued, r.missed), (0, 3), "{r:?}");
        assert_eq!(r.next_due, Some(T + 10_000));
        // Only the next future slot fires.
        let r = store.fire_due_at(T + 10_000 + 5).unwrap();
        assert_eq!((r.enqueued, r.missed), (1, 0), "{r:?}");
        assert_eq!(slots(&jobs_of(&store, "fast")), vec![T + 2_000, T + 10_000]);
        let events = store.schedule_events("fast").unwrap();
        assert_eq!(events.len(), 1);
        assert!(
            events[0]
                .detail
                .as_deref()
                .unwrap()
                .starts_with("3 slots missed"),
            "{events:?}"
        );
    }

    fn a_slot_less_than_half_a_period_late_is_on_time(db) {
        let store = db.store();
        put_every_two_seconds(&store);
        // 1 s late: exactly half a period, still on time.
        let r = store.fire_due_at(T + 3_000).unwrap();
        assert_eq!((r.enqueued, r.missed), (1, 0), "{r:?}");
        // 1.001 s late: missed.
        let r = store.fire_due_at(T + 5_001).unwrap();
        assert_eq!((r.enqueued, r.missed), (0, 1), "{r:?}");
    }

    fn a_next_slot_computed_by_a_clock_an_hour_ahead_is_recomputed_once_the_clock_is_back(db) {
        let store = db.store();
        let hour = 60 * MIN;
        // The clock is an hour ahead when one schedule is stored and another fires.
        store.put_schedule_at("stored", &minutely(), T + hour).unwrap();
        store.put_schedule_at("fired", &minutely(), T - MIN).unwrap();
        // An interval counts from when it was stored: its anchor is an hour ahead too.
        let every_minute = Schedule::every(Duration::from_secs(60))
            .overlap(Overlap::Allow)
            .job(Job::shell("true"));
        store
            .put_schedule_at("interval", &every_minute, T + hour + 7)
            .unwrap();
        assert_eq!(store.fire_due_at(T + hour + 100).unwrap().enqueued, 1);
        assert_eq!(
            store.schedule("fired").unwrap().next_slot_at,
            Some(T + hour + MIN)
        );
        // The clock is set back: both next slots lie more than a period ahead and are
        // recomputed from now, in the firing transaction, without firing anything.
        let r = store.fire_due_at(T + 30_000).unwrap();
        assert_eq!((r.enqueued, r.missed, r.skipped), (0, 0, 0), "{r:?}");
        assert_eq!(r.next_due, Some(T + MIN));
        for name in ["stored", "fired"] {
            assert_eq!(store.schedule(name).unwrap().next_slot_at, Some(T + MIN));
        }
        // The interval keeps its phase (7 ms past the minute).
        assert_eq!(
            store.schedule("interval").unwrap().next_slot_at,
            Some(T + MIN + 7)
        );
        // All fire on time, not an hour later, and go on every minute.
        let r = store.fire_due_at(T + MIN + 100).unwrap();
        assert_eq!(r.enqueued, 3, "{r:?}");
        let r = store.fire_due_at(T + 2 * MIN + 100).unwrap();
        assert_eq!(r.enqueued, 3, "{r:?}");
        assert_eq!(
            slots(&jobs_of(&store, "stored")),
            vec![T + MIN, T + 2 * MIN]
        );
        assert_eq!(
            slots(&jobs_of(&store, "interval")),
            vec![T + MIN + 7, T + 2 * MIN + 7]
        );
    }

    fn a_clock_read_a_little_behind_the_runner_that_fired_fires_nothing_again(db) {
        let store = db.store();
        store.put_schedule_at("m", &minutely(), T).unwrap();
        // Another runner fired the slot at 2 minutes (and missed the one before).
        assert_eq!(store.fire_due_at(T + 2 * MIN + 100).unwrap().enqueued, 1);
        // This one read its clock 50 ms before that slot: the next slot is a period and 50 ms
        // ahead, but the slot fired is after now, so nothing is recomputed to fire it again.
        let r = store.fire_due_at(T + 2 * MIN - 50).unwrap();
        assert_eq!((r.enqueued, r.missed, r.skipped), (0, 0, 0), "{r:?}");
        assert_eq!(store.schedule("m").unwrap().next_slot_at, Some(T + 3 * MIN));
        let r = store.fire_due_at(T + 2 * MIN + 200).unwrap();
        assert_eq!(r.enqueued, 0, "{r:?}");
        assert_eq!(slots(&jobs_of(&store, "m")), vec![T + 2 * MIN]);
    }
}

/// On PostgreSQL a connection firing a schedule locks its row first: while another connection
/// fires the same slot (its transaction has moved the schedule on, not yet committed), the
/// second waits, then finds the slot fired and fires nothing, rather than firing it again or
/// failing on the guarded move of the next slot. (The race itself, many times:
/// `two_connections_firing_the_same_slots_at_once_fire_each_once`.)
#[test]
fn a_postgres_firing_waits_for_another_firing_of_the_schedule_and_then_fires_nothing() {
    let db = TestDb::postgres("schedule_row_locked");
    let pg = db.pg.as_ref().expect("a PostgreSQL test");
    let store = db.store();
    store.put_schedule_at("m", &minutely(), T).unwrap();
    let mut holder = pg.connect();
    holder
        .batch_execute(&format!(
            "BEGIN;
             UPDATE schedules SET last_slot_at = {}, next_slot_at = {} WHERE name = 'm'",
            T + MIN,
            T + 2 * MIN
        ))
        .unwrap();
    let firer = db.store();
    let (waited, fired) =
        crate::util::pg::behind_lock(pg, &mut holder, move || firer.fire_due_at(T + MIN + 5));
    let fired = fired.unwrap_or_else(|e| {
        panic!("firing beside another firing of the slot failed (waited: {waited}): {e:?}")
    });
    // Whether it waited is not asserted: a firing that skipped a schedule another holds
    // would keep the promise too.
    assert_eq!(fired.enqueued, 0, "the slot fired twice: {fired:?}");
    assert!(jobs_of(&store, "m").is_empty());
    assert_eq!(store.schedule("m").unwrap().next_slot_at, Some(T + 2 * MIN));
}
