//! A cron expression and a time zone, as `schedules add` and a schedule's row give them: the
//! next slots after a time are strictly after it, increasing, and slots of the expression.
#![no_main]
use arbitrary::Arbitrary;
use leasehold::Schedule;
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Input<'a> {
    expr: &'a str,
    zone: &'a str,
    after: i64,
    rfc3339: &'a str,
}

fuzz_target!(|input: Input<'_>| {
    let _ = leasehold::parse_rfc3339(input.rfc3339);
    let Ok(schedule) = Schedule::cron(input.expr) else {
        return;
    };
    let schedule = schedule.tz(input.zone);
    if schedule.validate(input.after).is_err() {
        return;
    }
    let Ok(slots) = schedule.slots_after(input.after, 3) else {
        return;
    };
    let mut last = input.after;
    for slot in slots {
        assert!(
            slot > last,
            "{slot} after {last} for {:?} in {:?}",
            input.expr,
            input.zone
        );
        let _ = schedule.local_time(slot);
        // The slot is one of the expression's: the slot after the millisecond before it is it.
        let again = schedule
            .slots_after(slot - 1, 1)
            .expect("slots after a slot");
        assert_eq!(
            again.first(),
            Some(&slot),
            "{:?} in {:?}",
            input.expr,
            input.zone
        );
        last = slot;
    }
});
