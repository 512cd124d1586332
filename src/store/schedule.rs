//! Schedules: storing them, and firing their due slots.
//!
//! A slot fires in one IMMEDIATE transaction that reads the schedule's `next_slot_at`,
//! enqueues the slot's job and moves `next_slot_at` past it. Any number of runners on the file
//! may try the same slot: the first transaction moves `next_slot_at`, and the others, which
//! take the write lock after it, find nothing due. No slot is fired twice, and none is lost by
//! a crash: a transaction that does not commit leaves the slot due.
//!
//! A next slot more than one period ahead of `now` was computed from a clock that was ahead
//! (stepped forward, then back): the same transaction recomputes it from `now`, so the
//! schedule is not silenced for the size of the step.

use std::collections::VecDeque;

use crate::store::db::{Connection, OptionalExtension, Row, Sql, params, sql};

use crate::error::{Error, Result};
use crate::job::{EventKind, Job};
use crate::schedule::{CatchUp, MAX_CATCH_UP, Overlap, Schedule, misfire_grace, utc_text};

use super::Store;
use super::enqueue::{Slot, enqueue};
use super::tx::{Serialise, serialise};

/// A stored schedule: its definition and where it stands.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ScheduleRecord {
    /// Its unique name.
    pub name: String,
    /// When it fires, its zone, its policies and its job.
    pub schedule: Schedule,
    /// True while paused: no slot fires, and none is caught up on resume.
    pub paused: bool,
    /// The newest slot fired (or missed).
    pub last_slot_at: Option<i64>,
    /// The next slot due; None when the expression has no more.
    pub next_slot_at: Option<i64>,
    /// When it was first stored.
    pub created_at: i64,
    /// When it was last stored, paused or resumed.
    pub updated_at: i64,
}

impl ScheduleRecord {
    /// The expression as shown to people: the cron text, or `@every 60s`.
    pub fn expression(&self) -> String {
        match (self.schedule.cron_expr(), self.schedule.interval()) {
            (Some(e), _) => e.to_string(),
            (None, Some(d)) => format!("@every {}s", d.as_secs_f64()),
            (None, None) => String::new(),
        }
    }
}

/// One entry of a schedule's own history: a missed or skipped slot.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScheduleEvent {
    /// Increasing in the order events were written.
    pub id: i64,
    /// The schedule.
    pub schedule: String,
    /// When it was recorded.
    pub at: i64,
    /// [`EventKind::ScheduleMissed`] or [`EventKind::ScheduleSkipped`].
    pub kind: EventKind,
    /// The slot it concerns (for a missed run of slots, the newest).
    pub slot_at: Option<i64>,
    /// What happened, in words (a missed event gives the count).
    pub detail: Option<String>,
}

/// What one call of [`Store::fire_due`](crate::Store::fire_due) did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FireReport {
    /// Jobs enqueued for slots.
    pub enqueued: u64,
    /// Slots missed and not caught up (each run of them is one `schedule_missed` event).
    pub missed: u64,
    /// Slots that enqueued nothing: overlap `skip`, or a matching unique key.
    pub skipped: u64,
    /// The earliest slot still due among unpaused schedules, after this call.
    pub next_due: Option<i64>,
}

impl FireReport {
    /// True when a slot was fired, missed or skipped.
    pub fn did_something(&self) -> bool {
        self.enqueued + self.missed + self.skipped > 0
    }
}

/// The columns a schedule is read with ([`record`]). A macro, so that statements can `concat!` it.
macro_rules! columns {
    () => {
        "name, cron, every_ms, anchor_at, tz, job, catch_up, overlap, paused,
    last_slot_at, next_slot_at, created_at, updated_at"
    };
}

/// One schedule by name. Parameter: name.
const GET_SQL: Sql = Sql::same(concat!(
    "SELECT ",
    columns!(),
    " FROM schedules WHERE name = ?1"
));

/// Every schedule, by name.
const LIST_SQL: Sql = Sql::same(concat!(
    "SELECT ",
    columns!(),
    " FROM schedules ORDER BY name"
));

/// The schedules whose next slot is more than a period ahead of `?1`, soonest first: those
/// whose next slot a change of the clock or of the zone may have moved.
const AHEAD_SQL: Sql = Sql::same(concat!(
    "SELECT ",
    columns!(),
    " FROM schedules
             WHERE paused = 0 AND next_slot_at > ?1 + coalesce(every_ms, 1000)
             ORDER BY next_slot_at"
));

fn record(r: &Row<'_>) -> Result<ScheduleRecord> {
    let bad = |i: usize, what: String| crate::error::Error::Column(format!("column {i}: {what}"));
    let cron: Option<String> = r.get(1)?;
    let every: Option<i64> = r.get(2)?;
    let schedule = match (cron, every) {
        (Some(expr), _) => Schedule::cron(&expr).map_err(|e| bad(1, e.to_string()))?,
        (None, Some(ms)) => Schedule::every(std::time::Duration::from_millis(
            u64::try_from(ms).unwrap_or(1000),
        )),
        (None, None) => return Err(bad(1, "neither cron nor every_ms".into())),
    };
    let catch_up: String = r.get(6)?;
    let overlap: String = r.get(7)?;
    let job: String = r.get(5)?;
    let schedule = schedule
        .tz(r.get::<_, String>(4)?)
        .catch_up(
            catch_up
                .parse::<CatchUp>()
                .map_err(|e| bad(6, e.to_string()))?,
        )
        .overlap(
            overlap
                .parse::<Overlap>()
                .map_err(|e| bad(7, e.to_string()))?,
        )
        .job(Job::from_template(&job).map_err(|e| bad(5, e))?)
        .with_anchor(r.get(3)?);
    Ok(ScheduleRecord {
        name: r.get(0)?,
        schedule,
        paused: r.get(8)?,
        last_slot_at: r.get(9)?,
        next_slot_at: r.get(10)?,
        created_at: r.get(11)?,
        updated_at: r.get(12)?,
    })
}

/// Refuses a name that cannot be typed back: empty, or with control characters.
pub(super) fn check_name(name: &str) -> Result<()> {
    if name.trim().is_empty() {
        return Err(Error::invalid("name", "the schedule name is empty"));
    }
    if name.chars().any(char::is_control) {
        return Err(Error::invalid(
            "name",
            format!("{name:?} contains a control character"),
        ));
    }
    Ok(())
}

pub(super) fn get(conn: &Connection, name: &str) -> Result<ScheduleRecord> {
    conn.prepare_cached(&GET_SQL)?
        .query_row([name], record)
        .optional()?
        .ok_or_else(|| Error::NoSuchSchedule(name.to_string()))
}

pub(super) fn list(conn: &Connection) -> Result<Vec<ScheduleRecord>> {
    let mut stmt = conn.prepare_cached(&LIST_SQL)?;
    let rows = stmt.query_map(params![], record)?;
    rows.collect::<Result<_>>()
}

/// Stores a schedule (validated by the caller). A new interval counts from `now`; a replaced
/// schedule keeps its history, its pause and its last slot, and is due at its next slot after
/// `now`.
pub(super) fn put(
    conn: &Connection,
    name: &str,
    schedule: &Schedule,
    replace: bool,
    now: i64,
) -> Result<ScheduleRecord> {
    let now = conn.now(now)?;
    let exists: bool = conn
        .prepare_cached(sql!(
            "SELECT EXISTS (SELECT 1 FROM schedules WHERE name = ?1)"
        ))?
        .query_row([name], |r| r.get(0))?;
    if exists && !replace {
        return Err(Error::ScheduleExists(name.to_string()));
    }
    let anchored = schedule.clone().with_anchor(now);
    let next = anchored.slot_after(now)?;
    conn.prepare_cached(sql!(
        "INSERT INTO schedules (name, cron, every_ms, anchor_at, tz, job, catch_up, overlap,
             next_slot_at, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?10)
         ON CONFLICT (name) DO UPDATE SET cron = ?2, every_ms = ?3, anchor_at = ?4, tz = ?5,
             job = ?6, catch_up = ?7, overlap = ?8, next_slot_at = ?9, updated_at = ?10"
    ))?
    .execute(params![
        name,
        schedule.cron_expr(),
        schedule.interval().map(crate::job::duration_ms),
        now,
        schedule.zone_name(),
        schedule.job_template().to_template(),
        schedule.catch_up_policy().as_str(),
        schedule.overlap_policy().as_str(),
        next,
        now,
    ])?;
    get(conn, name)
}

pub(super) fn remove(conn: &Connection, name: &str) -> Result<()> {
    let n = conn
        .prepare_cached(sql!("DELETE FROM schedules WHERE name = ?1"))?
        .execute([name])?;
    if n == 0 {
        return Err(Error::NoSuchSchedule(name.to_string()));
    }
    Ok(())
}

/// Pauses or resumes. A resumed schedule is due at its next slot after `now`: the slots
/// that passed while it was paused are not caught up (a pause is deliberate).
pub(super) fn set_paused(
    conn: &Connection,
    name: &str,
    paused: bool,
    now: i64,
) -> Result<ScheduleRecord> {
    let now = conn.now(now)?;
    let current = get(conn, name)?;
    if current.paused == paused {
        return Ok(current);
    }
    let next = if paused {
        current.next_slot_at
    } else {
        current.schedule.slot_after(now)?
    };
    conn.prepare_cached(sql!(
        "UPDATE schedules SET paused = ?2, next_slot_at = ?3, updated_at = ?4 WHERE name = ?1"
    ))?
    .execute(params![name, paused, next, now])?;
    get(conn, name)
}

pub(super) fn events(conn: &Connection, name: &str) -> Result<Vec<ScheduleEvent>> {
    let mut stmt = conn.prepare_cached(sql!(
        "SELECT id, schedule, at, kind, slot_at, detail FROM schedule_events
             WHERE schedule = ?1 ORDER BY id"
    ))?;
    let rows = stmt.query_map([name], |r| {
        let kind: String = r.get(3)?;
        Ok(ScheduleEvent {
            id: r.get(0)?,
            schedule: r.get(1)?,
            at: r.get(2)?,
            kind: EventKind::parse(&kind).ok_or_else(|| {
                crate::error::Error::Column(format!("column 3: unknown event kind {kind:?}"))
            })?,
            slot_at: r.get(4)?,
            detail: r.get(5)?,
        })
    })?;
    rows.collect::<Result<_>>()
}

fn schedule_event(
    conn: &Connection,
    name: &str,
    at: i64,
    kind: EventKind,
    slot_at: i64,
    detail: &str,
) -> Result<()> {
    conn.prepare_cached(sql!(
        "INSERT INTO schedule_events (schedule, at, kind, slot_at, detail)
             VALUES (?1, ?2, ?3, ?4, ?5)"
    ))?
    .execute(params![name, at, kind.as_str(), slot_at, detail])?;
    Ok(())
}

/// A schedule keeps its newest this many events: a one-second schedule whose job outlasts
/// its period records a skipped slot every second.
pub const MAX_SCHEDULE_EVENTS: i64 = 1_000;

/// Deletes a schedule's events older than its newest [`MAX_SCHEDULE_EVENTS`].
fn trim_events(conn: &Connection, name: &str) -> Result<()> {
    conn.prepare_cached(sql!(
        "DELETE FROM schedule_events WHERE schedule = ?1 AND id <= (
             SELECT id FROM schedule_events WHERE schedule = ?1
             ORDER BY id DESC LIMIT 1 OFFSET ?2)"
    ))?
    .execute(params![name, MAX_SCHEDULE_EVENTS])?;
    Ok(())
}

/// The names of the unpaused schedules with a slot due at `now`, the most overdue first,
/// then those whose next slot lies more than a period ahead of `now` (to be recomputed).
pub(super) fn due(conn: &Connection, now: i64) -> Result<Vec<String>> {
    let now = conn.now(now)?;
    let mut stmt = conn.prepare_cached(sql!(
        "SELECT name FROM schedules
             WHERE paused = 0 AND next_slot_at IS NOT NULL AND next_slot_at <= ?1
             ORDER BY next_slot_at"
    ))?;
    let rows = stmt.query_map([now], |r| r.get(0))?;
    let mut names: Vec<String> = rows.collect::<Result<_>>()?;
    // No period is shorter than a second (`MIN_INTERVAL`, cron's seconds field): a next slot
    // within a second of now is never ahead. An interval's period is its column.
    let mut stmt = conn.prepare_cached(&AHEAD_SQL)?;
    let mut rows = stmt.query([now])?;
    while let Some(row) = rows.next()? {
        // A row that cannot be read is reported when its slot is due, not at every look.
        let Ok(rec) = record(&row) else { continue };
        if recomputed_next(&rec, now)?.is_some() {
            names.push(rec.name);
        }
    }
    Ok(names)
}

/// The next slot of a schedule not yet due at `now`, recomputed, when its stored one lies
/// more than one period ahead: a clock that was ahead computed it (a forward step later
/// undone, an RTC in local time), and left alone it would silence the schedule for the size
/// of the step. None when the stored one stands.
///
/// The period is the gap between the schedule's next two slots after `now`
/// ([`Schedule::period_after`]). A slot this schedule already fired after `now`, less than a
/// period ahead, was fired by a runner whose clock read came a little after ours (we waited
/// for the lock meanwhile): the next slot is recomputed after it, never to fire it again.
///
/// Also returns the interval's new anchor when it was after `now` (stored while the clock was
/// ahead): carried back on its grid, else its slots would still count from it.
fn recomputed_next(rec: &ScheduleRecord, now: i64) -> Result<Option<(i64, Option<i64>)>> {
    let Some(first) = rec.next_slot_at else {
        return Ok(None);
    };
    let anchor = rec.schedule.anchor_back_to(now);
    let schedule = match anchor {
        Some(a) => rec.schedule.clone().with_anchor(a),
        None => rec.schedule.clone(),
    };
    let Some(period) = schedule.period_after(now)? else {
        return Ok(None);
    };
    if rec.paused || first.saturating_sub(now) <= period {
        return Ok(None);
    }
    let base = match rec.last_slot_at {
        Some(last) if last > now && last - now <= period => last,
        _ => now,
    };
    Ok(schedule
        .slot_after(base)?
        .filter(|&next| next < first)
        .map(|next| (next, anchor)))
}

/// The earliest slot due among unpaused schedules.
pub(super) fn next_due(conn: &Connection) -> Result<Option<i64>> {
    conn.prepare_cached(sql!(
        "SELECT min(next_slot_at) FROM schedules WHERE paused = 0"
    ))?
    .query_row(params![], |r| r.get(0))
}

/// How many of the newest due slots are kept while counting: the catch-up's most recent
/// ones plus the on-time ones.
const KEEP: usize = MAX_CATCH_UP + 1024;

/// Slots counted one by one before the count jumps ahead to near `now` (a one-second
/// schedule after a month of downtime has millions).
const COUNT_STEPS: u64 = 20_000;

/// The slots of `schedule` from `first` to `now`: how many (an estimate past
/// [`COUNT_STEPS`]) and the newest [`KEEP`] of them, oldest first.
fn due_slots(schedule: &Schedule, first: i64, now: i64) -> Result<(u64, VecDeque<i64>)> {
    let mut kept = VecDeque::from([first]);
    let mut count = 1u64;
    let mut t = first;
    let mut jumped = false;
    while let Some(s) = schedule.slot_after(t)? {
        if s > now {
            break;
        }
        count += 1;
        if kept.len() == KEEP {
            kept.pop_front();
        }
        kept.push_back(s);
        t = s;
        if count == COUNT_STEPS && !jumped {
            // Jump to a few hundred average periods before now, counting the slots skipped
            // over by the average.
            let period = ((t - first) / (count as i64 - 1)).max(1);
            let target = now.saturating_sub(period.saturating_mul(2 * KEEP as i64));
            if target > t {
                count += ((target - t) / period) as u64;
                t = target;
                kept.clear();
            }
            jumped = true;
        }
    }
    Ok((count, kept))
}

/// A schedule's oldest unfinished job, if any: its overlap check. Parameter: the schedule.
pub(super) const SCHEDULE_BUSY_SQL: Sql = Sql::same(
    "SELECT id, status FROM jobs WHERE schedule = ?1 AND status IN ('pending', 'running')
     ORDER BY id LIMIT 1",
);

/// Fires the due slots of one schedule, in the caller's IMMEDIATE transaction: enqueues what
/// the policies say, records what was missed or skipped, and moves the schedule past `now`.
/// Nothing when the schedule is paused, gone, or not due (another runner fired it first);
/// a next slot more than a period ahead is recomputed from `now` (see [`recomputed_next`]).
pub(super) fn fire(conn: &Connection, name: &str, now: i64) -> Result<FireReport> {
    let now = conn.now(now)?;
    let mut report = FireReport::default();
    serialise(conn, Serialise::Schedule(name))?;
    let rec = match get(conn, name) {
        Ok(r) => r,
        Err(Error::NoSuchSchedule(_)) => return Ok(report),
        Err(e) => return Err(e),
    };
    let first = match rec.next_slot_at {
        Some(first) if !rec.paused => first,
        _ => return Ok(report),
    };
    if first > now {
        // Not due: what a runner that lost the race to fire this slot sees.
        if let Some((next, anchor)) = recomputed_next(&rec, now)? {
            let moved = conn
                .prepare_cached(sql!(
                    "UPDATE schedules SET next_slot_at = ?2, anchor_at = coalesce(?3, anchor_at)
                         WHERE name = ?1 AND next_slot_at = ?4 AND paused = 0"
                ))?
                .execute(params![name, next, anchor, first])?;
            if moved != 1 {
                // Cannot happen while this transaction holds the write lock.
                return Err(Error::Sqlite(rusqlite::Error::StatementChangedRows(moved)));
            }
            log::info!(
                "schedule {name:?}: its next slot {} lay more than a period ahead of now (the \
                 clock was ahead when it was computed): recomputed to {}",
                utc_text(first),
                utc_text(next)
            );
        }
        return Ok(report);
    }
    let schedule = &rec.schedule;
    let (count, kept) = due_slots(schedule, first, now)?;
    let newest = kept.back().copied().unwrap_or(first);
    let next = schedule.slot_after(now.max(newest))?;
    // Each slot's grace is bounded by the gap to its successor: at most half a period.
    let successors = kept.iter().skip(1).map(|&s| Some(s)).chain([next]);
    let (mut on_time, mut late) = (Vec::new(), Vec::new());
    for (&s, after) in kept.iter().zip(successors) {
        if now - s <= misfire_grace(s, after) {
            on_time.push(s);
        } else {
            late.push(s);
        }
    }
    let late_count = count - on_time.len() as u64;
    let caught_up: Vec<i64> = match schedule.catch_up_policy() {
        CatchUp::Skip => Vec::new(),
        CatchUp::One => late.last().copied().into_iter().collect(),
        CatchUp::All => late[late.len().saturating_sub(MAX_CATCH_UP)..].to_vec(),
    };
    let missed = late_count - caught_up.len() as u64;
    if missed > 0 {
        // The missed slots are the late ones before those caught up.
        let newest_missed = match caught_up.first() {
            Some(&c) => late.iter().copied().rev().find(|&s| s < c),
            None => late.last().copied(),
        }
        .unwrap_or(first);
        schedule_event(
            conn,
            name,
            now,
            EventKind::ScheduleMissed,
            newest_missed,
            &format!(
                "{missed} slot{} missed from {} to {} (catch_up {})",
                if missed == 1 { "" } else { "s" },
                utc_text(first),
                utc_text(newest_missed),
                schedule.catch_up_policy().as_str()
            ),
        )?;
        report.missed += missed;
    }
    let to_fire: Vec<i64> = caught_up.into_iter().chain(on_time).collect();
    let busy = if schedule.overlap_policy() == Overlap::Skip && !to_fire.is_empty() {
        conn.prepare_cached(&SCHEDULE_BUSY_SQL)?
            .query_row([name], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
            })
            .optional()?
    } else {
        None
    };
    for slot in to_fire {
        if let Some((id, status)) = &busy {
            schedule_event(
                conn,
                name,
                now,
                EventKind::ScheduleSkipped,
                slot,
                &format!(
                    "slot {} skipped: job {id} of an earlier slot is still {status} (overlap skip)",
                    utc_text(slot)
                ),
            )?;
            report.skipped += 1;
            continue;
        }
        let done = enqueue(
            conn,
            schedule.job_template(),
            now,
            Some(Slot {
                schedule: name,
                at: slot,
            }),
        )?;
        if done.duplicate {
            schedule_event(
                conn,
                name,
                now,
                EventKind::ScheduleSkipped,
                slot,
                &format!(
                    "slot {} skipped: its unique key matches job {}",
                    utc_text(slot),
                    done.id
                ),
            )?;
            report.skipped += 1;
        } else {
            report.enqueued += 1;
        }
    }
    move_next(conn, name, Some(newest), next, first)?;
    if report.missed + report.skipped > 0 {
        trim_events(conn, name)?;
    }
    Ok(report)
}

/// Moves a schedule's next slot from `first`, which the caller read in this transaction, to
/// `next`, guarded by `first`.
fn move_next(
    conn: &Connection,
    name: &str,
    last: Option<i64>,
    next: Option<i64>,
    first: i64,
) -> Result<()> {
    let moved = conn
        .prepare_cached(sql!(
            "UPDATE schedules SET last_slot_at = ?2, next_slot_at = ?3
                 WHERE name = ?1 AND next_slot_at = ?4 AND paused = 0"
        ))?
        .execute(params![name, last, next, first])?;
    if moved != 1 {
        // Cannot happen while this transaction holds the write lock; rolled back if it does.
        return Err(Error::Sqlite(rusqlite::Error::StatementChangedRows(moved)));
    }
    Ok(())
}

/// The statements of this file that are `const` items or built at run time (with
/// representative inputs), for the test that prepares every statement (`store/statements.rs`).
#[cfg(test)]
pub(super) fn statements() -> Vec<(&'static str, Sql)> {
    vec![
        ("GET_SQL", GET_SQL),
        ("LIST_SQL", LIST_SQL),
        ("AHEAD_SQL", AHEAD_SQL),
        ("SCHEDULE_BUSY_SQL", SCHEDULE_BUSY_SQL),
    ]
}

impl Store {
    /// Stores a new schedule under `name`; its first slot is the first after `now` (an
    /// interval counts from `now`). Returns it as stored.
    ///
    /// # Errors
    ///
    /// [`Error::ScheduleExists`] when the name is taken (see [`Store::replace_schedule`]);
    /// [`Error::Invalid`] naming `name`, `tz`, `every` or the job's setting for an empty
    /// name, an unknown zone, an interval under a second or a job that cannot run. Nothing
    /// is written then.
    pub fn put_schedule(&self, name: &str, schedule: &Schedule) -> Result<ScheduleRecord> {
        self.put_schedule_at(name, schedule, self.now())
    }

    /// [`Store::put_schedule`] at `now` rather than the store's clock.
    ///
    /// # Errors
    ///
    /// As [`Store::put_schedule`].
    pub fn put_schedule_at(
        &self,
        name: &str,
        schedule: &Schedule,
        now: i64,
    ) -> Result<ScheduleRecord> {
        self.store_schedule(name, schedule, false, now)
    }

    /// Stores a schedule under `name`, replacing one of that name if there is one (its
    /// history, pause and last slot stay; its next slot is the first after `now`).
    ///
    /// # Errors
    ///
    /// As [`Store::put_schedule`], without [`Error::ScheduleExists`].
    pub fn replace_schedule(&self, name: &str, schedule: &Schedule) -> Result<ScheduleRecord> {
        self.store_schedule(name, schedule, true, self.now())
    }

    /// [`Store::put_schedule`], or with `replace` [`Store::replace_schedule`].
    fn store_schedule(
        &self,
        name: &str,
        schedule: &Schedule,
        replace: bool,
        now: i64,
    ) -> Result<ScheduleRecord> {
        check_name(name)?;
        schedule.validate(now)?;
        let record = self.write(|c| put(c, name, schedule, replace, now))?;
        // Wakes the firers of the runners on this database: the new schedule may be due first.
        self.poke_firers();
        Ok(record)
    }

    /// Removes a schedule and its history; the jobs it enqueued stay.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchSchedule`].
    pub fn remove_schedule(&self, name: &str) -> Result<()> {
        self.write(|c| remove(c, name))
    }

    /// Pauses a schedule: no slot fires until it is resumed.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchSchedule`].
    pub fn pause_schedule(&self, name: &str) -> Result<ScheduleRecord> {
        let now = self.now();
        self.write(|c| set_paused(c, name, true, now))
    }

    /// Resumes a paused schedule at its next slot after `now`: slots that passed while it was
    /// paused are not caught up.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchSchedule`].
    pub fn resume_schedule(&self, name: &str) -> Result<ScheduleRecord> {
        let now = self.now();
        let record = self.write(|c| set_paused(c, name, false, now))?;
        self.poke_firers();
        Ok(record)
    }

    /// One schedule.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchSchedule`].
    pub fn schedule(&self, name: &str) -> Result<ScheduleRecord> {
        get(&self.conn, name)
    }

    /// Every schedule, by name.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn schedules(&self) -> Result<Vec<ScheduleRecord>> {
        list(&self.conn)
    }

    /// The next `count` slots of a schedule strictly after `after`.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchSchedule`].
    pub fn next_slots(&self, name: &str, after: i64, count: usize) -> Result<Vec<i64>> {
        get(&self.conn, name)?.schedule.slots_after(after, count)
    }

    /// A schedule's history of missed and skipped slots, oldest first.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn schedule_events(&self, name: &str) -> Result<Vec<ScheduleEvent>> {
        events(&self.conn, name)
    }

    /// Fires every slot due on the store's clock: see [`Store::fire_due_at`].
    ///
    /// # Errors
    ///
    /// As [`Store::fire_due_at`].
    pub fn fire_due(&self) -> Result<FireReport> {
        self.fire_due_at(self.now())
    }

    /// Fires every slot due at `now`: per schedule, one IMMEDIATE transaction enqueues the
    /// slot's job (or what the catch-up and overlap policies say) and moves the schedule past
    /// `now`, so two processes never fire a slot twice and a crash never loses one.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the database cannot be written, or a schedule's row cannot be
    /// read; the other schedules are fired all the same, and what was fired stays fired.
    pub fn fire_due_at(&self, now: i64) -> Result<FireReport> {
        let mut report = FireReport::default();
        // One schedule that cannot be fired (a damaged row) does not hold the others back.
        let mut failed = None;
        for name in due(&self.conn, now)? {
            match self.write(|c| fire(c, &name, now)) {
                Ok(r) => {
                    report.enqueued += r.enqueued;
                    report.missed += r.missed;
                    report.skipped += r.skipped;
                }
                Err(e) => {
                    log::warn!("schedule {name:?}: cannot fire its due slots: {e:#}");
                    failed.get_or_insert(e);
                }
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        if report.enqueued > 0 {
            self.poke();
        }
        report.next_due = next_due(&self.conn)?;
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    const MIN: i64 = 60_000;
    /// 2027-01-01T00:00:00Z.
    const T: i64 = 1_798_761_600_000;

    /// What the runner that lost the race sees: it listed the schedule as due, and once it
    /// holds the write lock the winner has moved the next slot past its `now`.
    #[test]
    fn firing_before_the_next_slot_enqueues_nothing_and_leaves_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("jobs.db")).unwrap();
        let minutely = Schedule::cron("* * * * *")
            .unwrap()
            .overlap(Overlap::Allow)
            .job(Job::shell("true"));
        store.put_schedule_at("m", &minutely, T).unwrap();
        assert_eq!(store.fire_due_at(T + MIN + 5).unwrap().enqueued, 1);
        // The loser's clock read: after the slot it saw due, before the next one.
        for now in [T + MIN + 3, T + 2 * MIN - 1] {
            let r = store.write(|c| fire(c, "m", now)).unwrap();
            assert_eq!(r, FireReport::default(), "at {now}");
            let rec = store.schedule("m").unwrap();
            assert_eq!(rec.next_slot_at, Some(T + 2 * MIN), "at {now}");
            assert_eq!(rec.last_slot_at, Some(T + MIN), "at {now}");
        }
        let jobs: i64 = store
            .conn
            .query_row("SELECT count(*) FROM jobs", params![], |r| r.get(0))
            .unwrap();
        assert_eq!(jobs, 1);
    }
}
