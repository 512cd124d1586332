//! Schedules under real runners: two `leasehold run` processes on one file fire each slot of
//! a one-second schedule exactly once, also when one is SIGKILLed meanwhile; a job that
//! outlasts its period is not overlapped.

use std::thread::sleep;
use std::time::{Duration, Instant};

use leasehold::{EventKind, Job, JobRecord, Overlap, Schedule, Status, now_ms};

use crate::helper::{Case, args};

#[test]
fn two_runners_fire_every_slot_once_even_when_one_is_killed() {
    let mut c = Case::new();
    // catch_up all: a slot fired more than half a period (500 ms) late on a loaded machine
    // is still fired, so lateness is not mistaken for a lost slot.
    let every_second = Schedule::cron("*/1 * * * * *")
        .unwrap()
        .overlap(Overlap::Allow)
        .catch_up(leasehold::CatchUp::All)
        .job(Job::command(["true"]).cwd(c.db.dir.path()));
    c.store().put_schedule("tick", &every_second).unwrap();
    let a = c.start_runner(&args(&[]));
    c.start_runner(&args(&[]));
    // Both runners are up once each has fired or run something; the window starts then.
    c.wait_for("the first slot", |c| {
        (!crate::helper::by_slot(&c.store(), "tick").is_empty()).then_some(())
    });
    let start = now_ms();
    let began = Instant::now();
    sleep(Duration::from_secs(4));
    c.crash(a);
    let killed_at = now_ms();
    while began.elapsed() < Duration::from_secs(10) {
        sleep(Duration::from_millis(200));
    }
    let end = now_ms();
    // The survivor fires the slots up to `end` within about a second.
    c.wait_for("the window's last slot", |c| {
        crate::helper::by_slot(&c.store(), "tick")
            .keys()
            .next_back()
            .is_some_and(|&s| s >= end / 1000 * 1000)
            .then_some(())
    });
    let slots = crate::helper::by_slot(&c.store(), "tick");
    // No slot fired before it was due (the runner that loses a race fires nothing).
    let early: Vec<(i64, i64)> = slots
        .iter()
        .filter(|(s, j)| **s > j.created_at)
        .map(|(&s, j)| (s, j.created_at))
        .collect();
    assert!(
        early.is_empty(),
        "slots fired before due (slot, created): {early:?}"
    );
    let first = (start / 1000 + 1) * 1000;
    let last = end / 1000 * 1000;
    let missing: Vec<i64> = (first / 1000..=last / 1000)
        .map(|s| s * 1000)
        .filter(|s| !slots.contains_key(s))
        .collect();
    assert!(
        missing.is_empty(),
        "slots without a job: {missing:?} (runner killed at {killed_at})"
    );
    assert!(
        ((last - first) / 1000) >= 8,
        "the window covers {first}..{last}"
    );
    // How late the slots were enqueued (a figure for the README, not a check: the machine
    // is shared).
    let mut late: Vec<i64> = (first..=last)
        .step_by(1000)
        .filter_map(|s| slots.get(&s).map(|j| j.created_at - s))
        .collect();
    late.sort_unstable();
    eprintln!(
        "slots enqueued late by: median {} ms, max {} ms, over {} slots",
        late[late.len() / 2],
        late[late.len() - 1],
        late.len()
    );
    // Nothing was skipped or missed, and the jobs ran.
    assert!(c.store().schedule_events("tick").unwrap().is_empty());
    c.wait_for("the window's jobs to run", |c| {
        let slots = crate::helper::by_slot(&c.store(), "tick");
        (first..=last)
            .step_by(1000)
            .all(|s| slots.get(&s).is_some_and(|j| j.status == Status::Succeeded))
            .then_some(())
    });
}

#[test]
fn a_job_that_outlasts_its_period_is_not_overlapped() {
    let mut c = Case::new();
    // catch_up all: a slot fired more than 500 ms late is still offered, and skipped.
    let s = Schedule::cron("*/1 * * * * *")
        .unwrap()
        .catch_up(leasehold::CatchUp::All)
        .job(Job::command(["sleep", "2"]).cwd(c.db.dir.path()));
    c.store().put_schedule("slow", &s).unwrap();
    c.start_runner(&args(&[]));
    c.wait_for("three of its jobs to succeed", |c| {
        let done = crate::helper::by_slot(&c.store(), "slow")
            .values()
            .filter(|j| j.status == Status::Succeeded)
            .count();
        (done >= 3).then_some(())
    });
    let jobs: Vec<JobRecord> = crate::helper::by_slot(&c.store(), "slow")
        .into_values()
        .collect();
    // Each job was enqueued only after the one before it had ended.
    for pair in jobs.windows(2) {
        let ended = pair[0].completed_at.expect("an earlier job has ended");
        assert!(
            pair[1].created_at >= ended,
            "job {} was enqueued at {} while job {} ran until {ended}",
            pair[1].id,
            pair[1].created_at,
            pair[0].id
        );
    }
    let skipped = c.store().schedule_events("slow").unwrap();
    assert!(
        skipped.len() >= 2,
        "the slots while a job ran were skipped: {skipped:?}"
    );
    assert!(skipped.iter().all(|e| e.kind == EventKind::ScheduleSkipped));
}

#[test]
fn slots_missed_while_every_runner_was_stopped_follow_the_catch_up_policy() {
    use leasehold::CatchUp;
    let mut c = Case::new();
    // A slot every 20 s: a slot may be 10 s late (`MISFIRE_GRACE`, here half the period) and
    // still be on time.
    for (name, policy) in [
        ("skip", CatchUp::Skip),
        ("one", CatchUp::One),
        ("all", CatchUp::All),
    ] {
        let s = Schedule::cron("*/20 * * * * *")
            .unwrap()
            .overlap(Overlap::Allow)
            .catch_up(policy)
            .job(Job::command(["true"]).cwd(c.db.dir.path()));
        c.store().put_schedule(name, &s).unwrap();
    }
    let r = c.start_runner(&args(&[]));
    c.wait_for("the first slot of each schedule", |c| {
        ["skip", "one", "all"]
            .iter()
            .all(|n| !crate::helper::by_slot(&c.store(), n).is_empty())
            .then_some(())
    });
    // Every runner stops; two slots pass; a runner starts 12 s after the second.
    c.signal(r, nix::sys::signal::Signal::SIGTERM);
    let (code, log) = c.runners[r].wait(Duration::from_secs(30));
    assert_eq!(code, Some(0), "{log}");
    let second = c.store().schedule("skip").unwrap().next_slot_at.unwrap();
    let third = second + 20_000;
    let restart = third + 12_000;
    while now_ms() < restart {
        sleep(Duration::from_millis(200));
    }
    c.start_runner(&args(&[]));
    c.wait_for("the gap to be dealt with", |c| {
        ["skip", "one", "all"]
            .iter()
            .all(|n| {
                c.store()
                    .schedule(n)
                    .unwrap()
                    .last_slot_at
                    .is_some_and(|s| s >= third)
            })
            .then_some(())
    });
    let gap = |name: &str| -> Vec<i64> {
        crate::helper::by_slot(&c.store(), name)
            .into_keys()
            .filter(|s| (second..=third).contains(s))
            .collect()
    };
    assert_eq!(gap("skip"), Vec::<i64>::new());
    assert_eq!(gap("one"), vec![third]);
    assert_eq!(gap("all"), vec![second, third]);
    let missed = |name: &str| -> Vec<String> {
        c.store()
            .schedule_events(name)
            .unwrap()
            .into_iter()
            .filter(|e| e.kind == EventKind::ScheduleMissed)
            .filter_map(|e| e.detail)
            .collect()
    };
    let skip = missed("skip");
    assert_eq!(skip.len(), 1, "{skip:?}");
    assert!(skip[0].starts_with("2 slots missed"), "{skip:?}");
    let one = missed("one");
    assert!(
        one.len() == 1 && one[0].starts_with("1 slot missed"),
        "{one:?}"
    );
    assert!(missed("all").is_empty());
}
