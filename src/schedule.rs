//! Recurring schedules: what a schedule is, and which instants (its slots) it fires at.
//!
//! A cron expression is read in the schedule's time zone and follows ISC (Vixie) cron across
//! daylight-saving changes:
//! - a *fixed-time* schedule (no seconds, minute or hour field starting with `*`) fires a slot
//!   that falls in the hour a spring-forward skips once, right after the jump, and a slot in
//!   the hour a fall-back repeats once, at its first occurrence;
//! - a *wildcard* schedule (one of those fields starts with `*`, as `*/15 * * * *` or
//!   `0 * * * *`) follows real time: it fires whenever the zone's local time matches, so an
//!   hourly one fires every real hour, one hour apart, through both changes.
//!
//! No SQL and no OS here: the store persists schedules and fires their slots.

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, FixedOffset, SecondsFormat, Utc};
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use jiff::Timestamp;
use jiff::tz::{AmbiguousOffset, TimeZone};

use crate::error::{Error, Result};
use crate::job::{Job, duration_ms};

/// `catch_up = all` enqueues at most this many missed slots, the most recent.
pub const MAX_CATCH_UP: usize = 100;

/// A slot fired this late or less is on time, whatever the catch-up policy; an older one was
/// missed (the runners were down, the machine slept) and the catch-up policy decides. For a
/// slot less than twice this before the next one, the grace is half that gap instead, so
/// that the slots of a short outage are never fired as if on time.
pub const MISFIRE_GRACE: Duration = Duration::from_secs(10);

/// The shortest interval of [`Schedule::every`].
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// What happens to slots that passed while no runner could fire them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CatchUp {
    /// Resume at the next future slot; one `schedule_missed` event records the count.
    #[default]
    Skip,
    /// Enqueue one job, for the most recent missed slot.
    One,
    /// Enqueue one job per missed slot, at most the [`MAX_CATCH_UP`] most recent.
    All,
}

impl CatchUp {
    /// The policy as stored in the `catch_up` column.
    pub fn as_str(self) -> &'static str {
        match self {
            CatchUp::Skip => "skip",
            CatchUp::One => "one",
            CatchUp::All => "all",
        }
    }
}

impl FromStr for CatchUp {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "skip" => Ok(CatchUp::Skip),
            "one" => Ok(CatchUp::One),
            "all" => Ok(CatchUp::All),
            _ => Err(Error::invalid(
                "catch_up",
                format!("{s:?} is not one of skip, one, all"),
            )),
        }
    }
}

/// What happens to a slot while the schedule's job from an earlier slot is unfinished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Overlap {
    /// Enqueue nothing for the slot and record a `schedule_skipped` event.
    #[default]
    Skip,
    /// Enqueue the slot's job anyway.
    Allow,
}

impl Overlap {
    /// The policy as stored in the `overlap` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Skip => "skip",
            Overlap::Allow => "allow",
        }
    }
}

impl FromStr for Overlap {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "skip" => Ok(Overlap::Skip),
            "allow" => Ok(Overlap::Allow),
            _ => Err(Error::invalid(
                "overlap",
                format!("{s:?} is not one of skip, allow"),
            )),
        }
    }
}

/// When a schedule fires.
#[derive(Debug, Clone)]
enum Spec {
    Cron {
        /// As the caller wrote it.
        expr: String,
        cron: Box<Cron>,
        /// Seconds, minute or hour starts with `*`: follows real time (Vixie's wildcard job).
        wildcard: bool,
    },
    Every(Duration),
}

/// A recurring schedule: when it fires, in which zone, its policies, and the job each slot
/// enqueues. Stored under a name with [`Store::put_schedule`](crate::Store::put_schedule).
///
/// ```
/// # fn main() -> leasehold::Result<()> {
/// use leasehold::{CatchUp, Job, Schedule};
///
/// let nightly = Schedule::cron("30 2 * * *")?
///     .tz("Europe/Berlin")
///     .catch_up(CatchUp::One)
///     .job(Job::command(["backup", "--all"]));
/// // 2027-03-28 is the day Berlin skips 02:00-03:00: the slot fires right after the jump.
/// let after = 1_806_192_000_000; // 2027-03-28T00:00:00Z
/// assert_eq!(nightly.slots_after(after, 1)?, vec![1_806_195_600_000]); // 01:00Z, 03:00 CEST
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Schedule {
    spec: Spec,
    tz: String,
    catch_up: CatchUp,
    overlap: Overlap,
    job: Job,
    /// Interval slots are `anchor + k × every`, k ≥ 1 (the store sets it to the creation time).
    anchor: i64,
}

impl Schedule {
    /// A schedule from a cron expression: 5 fields (minute hour day-of-month month
    /// day-of-week), 6 with seconds first, or `@hourly`, `@daily` (`@midnight`), `@weekly`,
    /// `@monthly`, `@yearly` (`@annually`).
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] naming `cron` and the problem for a malformed expression.
    pub fn cron(expr: &str) -> Result<Schedule> {
        let spec = parse_cron(expr)?;
        Ok(Schedule::new(spec))
    }

    /// A schedule that fires every `interval` (at least [`MIN_INTERVAL`]), counted from when
    /// it is stored. [`Store::put_schedule`](crate::Store::put_schedule) refuses a shorter
    /// one with [`Error::Invalid`] naming `every`.
    pub fn every(interval: Duration) -> Schedule {
        Schedule::new(Spec::Every(interval))
    }

    fn new(spec: Spec) -> Schedule {
        Schedule {
            spec,
            tz: "UTC".to_string(),
            catch_up: CatchUp::default(),
            overlap: Overlap::default(),
            job: Job::command(Vec::<String>::new()),
            anchor: 0,
        }
    }

    /// The IANA time zone (`Europe/Berlin`) whose local time the cron fields are read in.
    /// Storing the schedule refuses an unknown zone. By default, `UTC`.
    pub fn tz(mut self, zone: impl Into<String>) -> Schedule {
        self.tz = zone.into();
        self
    }

    /// What happens to slots missed while no runner fired them. By default, [`CatchUp::Skip`].
    pub fn catch_up(mut self, policy: CatchUp) -> Schedule {
        self.catch_up = policy;
        self
    }

    /// What happens to a slot while an earlier slot's job is unfinished. By default,
    /// [`Overlap::Skip`].
    pub fn overlap(mut self, policy: Overlap) -> Schedule {
        self.overlap = policy;
        self
    }

    /// The job each slot enqueues (its delay or run time, if any, is ignored: a slot's job is
    /// ready at its slot). By default, none: storing a schedule without one is refused.
    pub fn job(mut self, job: Job) -> Schedule {
        self.job = job;
        self
    }

    /// Checks what storing the schedule checks and the builder could not: the zone, the
    /// interval, and the job (as if enqueued at `now`).
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] naming `tz`, `every` or the job's setting.
    pub fn validate(&self, now: i64) -> Result<()> {
        self.zone()?;
        if let Spec::Every(d) = self.spec {
            if d < MIN_INTERVAL {
                return Err(Error::invalid(
                    "every",
                    format!(
                        "{}s is shorter than the shortest interval, 1 second",
                        d.as_secs_f64()
                    ),
                ));
            }
            if d.as_millis() > i64::MAX as u128 / 2 {
                return Err(Error::invalid("every", "the interval is too long"));
            }
        }
        self.job.validate_at(now)
    }

    fn zone(&self) -> Result<TimeZone> {
        zone(&self.tz)
    }

    /// The cron expression as written, or None for an interval.
    pub fn cron_expr(&self) -> Option<&str> {
        match &self.spec {
            Spec::Cron { expr, .. } => Some(expr),
            Spec::Every(_) => None,
        }
    }

    /// The interval, or None for a cron expression.
    pub fn interval(&self) -> Option<Duration> {
        match self.spec {
            Spec::Every(d) => Some(d),
            Spec::Cron { .. } => None,
        }
    }

    /// The time zone's name.
    pub fn zone_name(&self) -> &str {
        &self.tz
    }

    /// The catch-up policy.
    pub fn catch_up_policy(&self) -> CatchUp {
        self.catch_up
    }

    /// The overlap policy.
    pub fn overlap_policy(&self) -> Overlap {
        self.overlap
    }

    /// The job each slot enqueues.
    pub fn job_template(&self) -> &Job {
        &self.job
    }

    pub(crate) fn with_anchor(mut self, anchor: i64) -> Schedule {
        self.anchor = anchor;
        self
    }

    /// For an interval whose anchor lies after `now` (it was stored while the clock was
    /// ahead), the anchor carried back on its own grid to the last point at or before `now`:
    /// the slots keep their phase and resume after `now`. None otherwise.
    pub(crate) fn anchor_back_to(&self, now: i64) -> Option<i64> {
        let Spec::Every(d) = self.spec else {
            return None;
        };
        let every = duration_ms(d).max(1);
        if now >= self.anchor {
            return None;
        }
        let back = ((self.anchor - now - 1) / every + 1).checked_mul(every)?;
        self.anchor.checked_sub(back)
    }

    /// The next `count` slots strictly after `after` (milliseconds since the epoch), in order.
    /// Fewer when the expression has no more (`0 0 30 2 *` has none).
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] naming `tz` for an unknown zone.
    pub fn slots_after(&self, after: i64, count: usize) -> Result<Vec<i64>> {
        let zone = self.zone()?;
        let mut slots = Vec::with_capacity(count.min(1024));
        let mut t = after;
        while slots.len() < count {
            match self.slot_after_in(&zone, t) {
                Some(s) => {
                    slots.push(s);
                    t = s;
                }
                None => break,
            }
        }
        Ok(slots)
    }

    /// The first slot strictly after `after`, or None when there is none.
    pub(crate) fn slot_after(&self, after: i64) -> Result<Option<i64>> {
        Ok(self.slot_after_in(&self.zone()?, after))
    }

    fn slot_after_in(&self, zone: &TimeZone, after: i64) -> Option<i64> {
        match &self.spec {
            Spec::Every(d) => {
                let every = duration_ms(*d).max(1);
                let k = if after < self.anchor {
                    1
                } else {
                    (after - self.anchor) / every + 1
                };
                k.checked_mul(every)?.checked_add(self.anchor)
            }
            Spec::Cron { cron, wildcard, .. } => {
                let secs = after.div_euclid(1000);
                let next = if *wildcard {
                    next_real_time(cron, zone, secs)
                } else {
                    next_fixed_time(cron, zone, secs)
                };
                next?.checked_mul(1000)
            }
        }
    }

    /// The schedule's period at `at`: the gap between its first two slots after `at` (for an
    /// interval, the interval; for a cron expression whose gaps differ, as `0 9,17 * * *`,
    /// the gap that comes next). None when it has fewer than two slots left.
    pub(crate) fn period_after(&self, at: i64) -> Result<Option<i64>> {
        Ok(match self.slots_after(at, 2)?.as_slice() {
            [a, b] => Some(b - a),
            _ => None,
        })
    }

    /// `ms` in the schedule's zone, as RFC 3339 with its offset: `2027-03-28T03:00:00+02:00`.
    pub fn local_time(&self, ms: i64) -> String {
        let Some(utc) = DateTime::<Utc>::from_timestamp_millis(ms) else {
            return ms.to_string();
        };
        let offset = self
            .zone()
            .ok()
            .and_then(|zone| i32::try_from(offset_at(&zone, utc.timestamp())).ok())
            .and_then(FixedOffset::east_opt);
        match offset {
            Some(offset) => utc
                .with_timezone(&offset)
                .to_rfc3339_opts(SecondsFormat::Secs, false),
            None => utc.to_rfc3339_opts(SecondsFormat::Secs, true),
        }
    }
}

/// How late, in milliseconds, `slot` may fire and still be on time, when the schedule's slot
/// after it is `successor`: [`MISFIRE_GRACE`], at most half the slot's period (the gap to
/// its successor; for an interval, the interval). The grace thus ends before the next slot is
/// due, so at most one slot is ever on time and `catch_up` decides for every other: an
/// `every 2s` schedule back from a 6 s outage fires none of the slots it missed under `skip`.
pub(crate) fn misfire_grace(slot: i64, successor: Option<i64>) -> i64 {
    let grace = duration_ms(MISFIRE_GRACE);
    match successor {
        Some(next) if next > slot => grace.min((next - slot) / 2),
        _ => grace,
    }
}

/// A time as RFC 3339 in UTC with milliseconds, for events' details.
pub(crate) fn utc_text(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms).map_or_else(
        || ms.to_string(),
        |t| t.to_rfc3339_opts(SecondsFormat::Secs, true),
    )
}

/// Parses an RFC 3339 time (`2027-03-28T00:00:00Z`, `2027-03-28T03:00:00+02:00`) into
/// milliseconds since the epoch.
///
/// # Errors
///
/// [`Error::Invalid`] naming `after` when the text is not such a time.
pub fn parse_rfc3339(text: &str) -> Result<i64> {
    DateTime::parse_from_rfc3339(text.trim())
        .map(|t| t.timestamp_millis())
        .map_err(|e| {
            Error::invalid(
                "after",
                format!("{text:?} is not an RFC 3339 time such as 2027-03-28T00:00:00Z: {e}"),
            )
        })
}

fn parse_cron(expr: &str) -> Result<Spec> {
    let trimmed = expr.trim();
    let bad = |why: String| Error::invalid("cron", format!("{expr:?}: {why}"));
    let expanded = match trimmed.to_ascii_lowercase().as_str() {
        "@yearly" | "@annually" => "0 0 1 1 *".to_string(),
        "@monthly" => "0 0 1 * *".to_string(),
        "@weekly" => "0 0 * * 0".to_string(),
        "@daily" | "@midnight" => "0 0 * * *".to_string(),
        "@hourly" => "0 * * * *".to_string(),
        s if s.starts_with('@') => {
            return Err(bad(
                "unknown shorthand (use @hourly, @daily, @weekly, @monthly or @yearly)".into(),
            ));
        }
        _ => trimmed.to_string(),
    };
    let fields: Vec<&str> = expanded.split_whitespace().collect();
    let time_fields = match fields.len() {
        5 => &fields[..2],
        6 => &fields[..3],
        0 => return Err(bad("the expression is empty".into())),
        n => {
            return Err(bad(format!(
                "{n} fields; expected 5 (minute hour day month weekday) or 6 (seconds first)"
            )));
        }
    };
    // An empty item of a list (`,`, `1,,2`, `5,`): croner reads it as no value, and the
    // expression then matches nothing, which it takes a long search to find (0.2 s, measured:
    // found by the `schedule` fuzz target).
    if let Some(field) = fields.iter().find(|f| f.split(',').any(str::is_empty)) {
        return Err(bad(format!("{field:?} has an empty item in its list")));
    }
    let wildcard = time_fields.iter().any(|f| f.starts_with('*'));
    let cron = CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .build()
        .parse(&expanded)
        .map_err(|e| bad(e.to_string()))?;
    // An expression that never matches (`0 0 30 2 *`) is refused now rather than stored.
    let probe = DateTime::<Utc>::from_timestamp(0, 0).unwrap_or_default();
    cron.find_next_occurrence(&probe, false)
        .map_err(|_| bad("it never matches any time".into()))?;
    Ok(Spec::Cron {
        expr: trimmed.to_string(),
        cron: Box::new(cron),
        wildcard,
    })
}

/// The IANA zone `name` from the system's tz database (`TZDIR`, else `/usr/share/zoneinfo`;
/// the compiled-in copy of the `bundled-tzdb` feature where the system has none). `UTC`
/// needs no database. The name must be spelled as the database spells it (`Europe/Berlin`,
/// not `europe/berlin`), as every runner that reads the schedule looks it up again.
///
/// # Errors
///
/// [`Error::Invalid`] naming `tz` for a zone the database does not have, or when there is
/// no database to look it up in.
fn zone(name: &str) -> Result<TimeZone> {
    if name == "UTC" {
        return Ok(TimeZone::UTC);
    }
    let db = jiff::tz::db();
    let unknown = |why: String| Error::invalid("tz", format!("{name:?} {why}"));
    let zone = db.get(name).map_err(|_| {
        if db.available().next().is_none() {
            unknown(
                "cannot be looked up: no time zone database found (install tzdata, point \
                 TZDIR at one, or build with the bundled-tzdb feature)"
                    .into(),
            )
        } else {
            unknown("is not a known IANA time zone (e.g. Europe/Berlin, UTC)".into())
        }
    })?;
    match zone.iana_name() {
        Some(spelled) if spelled != name => Err(unknown(format!(
            "is not a known IANA time zone; did you mean {spelled:?}?"
        ))),
        _ => Ok(zone),
    }
}

/// The zone's offset from UTC at instant `secs`, in seconds.
fn offset_at(zone: &TimeZone, secs: i64) -> i64 {
    match Timestamp::from_second(secs) {
        Ok(t) => i64::from(zone.to_offset(t).seconds()),
        Err(_) => 0,
    }
}

/// Wall-clock time as a UTC value (croner then searches it without any DST).
fn wall(secs: i64) -> Option<DateTime<Utc>> {
    DateTime::<Utc>::from_timestamp(secs, 0)
}

/// The first wall-clock match after (or at, when `inclusive`) `from`, in wall seconds.
fn next_wall(cron: &Cron, from: i64, inclusive: bool) -> Option<i64> {
    cron.find_next_occurrence(&wall(from)?, inclusive)
        .ok()
        .map(|t| t.timestamp())
}

/// Real time: the first instant after `after` whose local time matches. Local time is read
/// with the offset in force at each instant: where the offset changes, the search restarts at
/// the change with the new offset.
fn next_real_time(cron: &Cron, zone: &TimeZone, after: i64) -> Option<i64> {
    let mut from = after;
    let mut inclusive = false;
    for _ in 0..10_000 {
        let off = offset_at(zone, from);
        let candidate = next_wall(cron, from + off, inclusive)? - off;
        match first_change(zone, from, candidate, off) {
            None => return Some(candidate),
            Some(change) => {
                from = change;
                inclusive = true;
            }
        }
    }
    None
}

/// The first instant in (from, to] whose offset is not `off`, if any.
fn first_change(zone: &TimeZone, from: i64, to: i64, off: i64) -> Option<i64> {
    const DAY: i64 = 86_400;
    let mut lo = from;
    while lo < to {
        let hi = lo.saturating_add(DAY).min(to);
        if offset_at(zone, hi) != off {
            // The offset is `off` at lo and not at hi: find the first second it is not.
            let (mut a, mut b) = (lo, hi);
            while b - a > 1 {
                let mid = a + (b - a) / 2;
                if offset_at(zone, mid) == off {
                    a = mid;
                } else {
                    b = mid;
                }
            }
            return Some(b);
        }
        lo = hi;
    }
    None
}

/// Fixed time: the next wall-clock match mapped to an instant after `after`. A match that
/// does not exist (a spring-forward gap) fires at the jump; one that exists twice (a fall-back)
/// fires at its first occurrence only.
fn next_fixed_time(cron: &Cron, zone: &TimeZone, after: i64) -> Option<i64> {
    let mut cursor = after + offset_at(zone, after);
    for _ in 0..10_000 {
        let n = next_wall(cron, cursor, false)?;
        let local = TimeZone::UTC.to_datetime(Timestamp::from_second(n).ok()?);
        let instant = match zone.to_ambiguous_timestamp(local).offset() {
            AmbiguousOffset::Unambiguous { offset } => n - i64::from(offset.seconds()),
            // A fall-back's repeated hour: its first occurrence, under the earlier offset.
            AmbiguousOffset::Fold { before, .. } => n - i64::from(before.seconds()),
            AmbiguousOffset::Gap { .. } => gap_end(zone, n)?,
        };
        if instant > after {
            return Some(instant);
        }
        cursor = n;
    }
    None
}

/// The instant a spring-forward jumped over wall-clock time `target` (wall seconds): the
/// first instant whose local time is later than it.
fn gap_end(zone: &TimeZone, target: i64) -> Option<i64> {
    let local = |s: i64| s + offset_at(zone, s);
    let (mut a, mut b) = (target - 2 * 86_400, target + 2 * 86_400);
    if local(a) > target || local(b) <= target {
        return None;
    }
    while b - a > 1 {
        let mid = a + (b - a) / 2;
        if local(mid) > target {
            b = mid;
        } else {
            a = mid;
        }
    }
    Some(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Milliseconds of a UTC time given as `YYYY-MM-DDTHH:MM:SSZ`.
    fn at(text: &str) -> i64 {
        parse_rfc3339(text).unwrap()
    }

    fn utc(ms: &[i64]) -> Vec<String> {
        ms.iter().map(|&m| utc_text(m)).collect()
    }

    /// The slots of `expr` in `zone` from `from` to `to` (UTC texts).
    fn slots(expr: &str, zone: &str, from: &str, to: &str) -> Vec<String> {
        let s = Schedule::cron(expr).unwrap().tz(zone);
        let (from, to) = (at(from), at(to));
        let mut out = Vec::new();
        let mut t = from;
        while let Some(next) = s.slot_after(t).unwrap() {
            if next > to {
                break;
            }
            out.push(next);
            t = next;
        }
        utc(&out)
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    // Europe/Berlin, 2027: spring forward Sunday 28 March at 02:00 CET (01:00Z) to 03:00 CEST;
    // fall back Sunday 31 October at 03:00 CEST (01:00Z) to 02:00 CET.
    // America/New_York, 2027: spring forward Sunday 14 March at 02:00 EST (07:00Z) to 03:00
    // EDT; fall back Sunday 7 November at 02:00 EDT (06:00Z) to 01:00 EST.

    #[test]
    fn daily_0230_berlin_fires_once_on_both_change_days() {
        assert_eq!(
            slots(
                "30 2 * * *",
                "Europe/Berlin",
                "2027-03-26T12:00:00Z",
                "2027-03-30T12:00:00Z"
            ),
            strings(&[
                "2027-03-27T01:30:00Z", // 02:30 CET
                "2027-03-28T01:00:00Z", // 02:30 does not exist: right after the jump, 03:00 CEST
                "2027-03-29T00:30:00Z", // 02:30 CEST
                "2027-03-30T00:30:00Z",
            ])
        );
        assert_eq!(
            slots(
                "30 2 * * *",
                "Europe/Berlin",
                "2027-10-29T12:00:00Z",
                "2027-11-02T12:00:00Z"
            ),
            strings(&[
                "2027-10-30T00:30:00Z", // 02:30 CEST
                "2027-10-31T00:30:00Z", // 02:30 CEST, the first of two: not again at 01:30Z
                "2027-11-01T01:30:00Z", // 02:30 CET
                "2027-11-02T01:30:00Z",
            ])
        );
    }

    #[test]
    fn daily_0230_new_york_fires_once_on_both_change_days() {
        assert_eq!(
            slots(
                "30 2 * * *",
                "America/New_York",
                "2027-03-13T00:00:00Z",
                "2027-03-16T00:00:00Z"
            ),
            strings(&[
                "2027-03-13T07:30:00Z", // 02:30 EST
                "2027-03-14T07:00:00Z", // skipped: right after the jump, 03:00 EDT
                "2027-03-15T06:30:00Z", // 02:30 EDT
            ])
        );
        // 01:00-02:00 repeats on 7 November; 02:30 exists once (EST).
        assert_eq!(
            slots(
                "30 2 * * *",
                "America/New_York",
                "2027-11-06T00:00:00Z",
                "2027-11-09T00:00:00Z"
            ),
            strings(&[
                "2027-11-06T06:30:00Z", // 02:30 EDT
                "2027-11-07T07:30:00Z", // 02:30 EST
                "2027-11-08T07:30:00Z",
            ])
        );
        // A slot in the repeated hour fires at its first occurrence only.
        assert_eq!(
            slots(
                "30 1 * * *",
                "America/New_York",
                "2027-11-06T12:00:00Z",
                "2027-11-08T12:00:00Z"
            ),
            strings(&["2027-11-07T05:30:00Z", "2027-11-08T06:30:00Z"])
        );
    }

    #[test]
    fn hourly_follows_real_time_through_both_changes() {
        // Berlin, spring: 01:00 CET (00:00Z), then 03:00 CEST (01:00Z): one real hour apart.
        assert_eq!(
            slots(
                "0 * * * *",
                "Europe/Berlin",
                "2027-03-27T22:30:00Z",
                "2027-03-28T02:30:00Z"
            ),
            strings(&[
                "2027-03-27T23:00:00Z",
                "2027-03-28T00:00:00Z",
                "2027-03-28T01:00:00Z",
                "2027-03-28T02:00:00Z",
            ])
        );
        // Berlin, autumn: 02:00 CEST (00:00Z) and 02:00 CET (01:00Z) are both real hours.
        assert_eq!(
            slots(
                "@hourly",
                "Europe/Berlin",
                "2027-10-30T22:30:00Z",
                "2027-10-31T02:30:00Z"
            ),
            strings(&[
                "2027-10-30T23:00:00Z",
                "2027-10-31T00:00:00Z",
                "2027-10-31T01:00:00Z",
                "2027-10-31T02:00:00Z",
            ])
        );
        for (from, to) in [
            ("2027-03-14T04:30:00Z", "2027-03-14T09:30:00Z"),
            ("2027-11-07T03:30:00Z", "2027-11-07T08:30:00Z"),
        ] {
            let got = slots("0 * * * *", "America/New_York", from, to);
            let want: Vec<String> = (0..5)
                .map(|h| utc_text(at(from) + 1_800_000 + h * 3_600_000))
                .collect();
            assert_eq!(got, want, "{from}");
        }
    }

    #[test]
    fn every_15_minutes_follows_real_time_no_slot_twice_none_lost() {
        for (zone, from) in [
            ("Europe/Berlin", "2027-03-27T23:00:00Z"),
            ("Europe/Berlin", "2027-10-30T23:00:00Z"),
            ("America/New_York", "2027-03-14T05:00:00Z"),
            ("America/New_York", "2027-11-07T04:00:00Z"),
        ] {
            let to = utc_text(at(from) + 4 * 3_600_000);
            let got = slots("*/15 * * * *", zone, from, &to);
            // Every quarter of a real hour, exactly once: 16 slots in 4 hours.
            let want: Vec<String> = (1..=16).map(|q| utc_text(at(from) + q * 900_000)).collect();
            assert_eq!(got, want, "{zone} from {from}");
        }
    }

    #[test]
    fn seconds_fields_and_shorthands_parse() {
        let s = Schedule::cron("*/1 * * * * *").unwrap();
        assert_eq!(
            s.slots_after(at("2027-01-01T00:00:00Z") + 400, 3).unwrap(),
            vec![
                at("2027-01-01T00:00:01Z"),
                at("2027-01-01T00:00:02Z"),
                at("2027-01-01T00:00:03Z")
            ]
        );
        let weekly = Schedule::cron("@weekly").unwrap();
        // 2027-01-01 is a Friday: the next Sunday midnight is the 3rd.
        assert_eq!(
            weekly.slots_after(at("2027-01-01T00:00:00Z"), 1).unwrap(),
            vec![at("2027-01-03T00:00:00Z")]
        );
        assert!(Schedule::cron("@yearly").is_ok());
        assert!(Schedule::cron("@monthly").is_ok());
        assert!(Schedule::cron("@daily").is_ok());
    }

    #[test]
    fn malformed_expressions_are_refused_naming_the_problem() {
        for bad in [
            "",
            "* * *",
            "61 * * * *",
            "* 25 * * *",
            "* * * * * * *",
            "@reboot",
            "@fortnightly",
            "0 0 30 2 *",
            "a b c d e",
            "*/12 , * * *",
            "0 1,,2 * * *",
            "0 5, * * *",
            "0 0 * * ,1",
        ] {
            match Schedule::cron(bad) {
                Err(Error::Invalid { setting, reason }) => {
                    assert_eq!(setting, "cron", "{bad}");
                    assert!(!reason.contains('\n'), "{reason}");
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        let Err(Error::Invalid { reason, .. }) = Schedule::cron("*/12 , * * *") else {
            panic!("an empty list item is refused");
        };
        assert!(reason.contains("\",\" has an empty item"), "{reason}");
    }

    #[test]
    fn unknown_zones_and_short_intervals_are_refused() {
        let job = Job::shell("true");
        let s = Schedule::cron("* * * * *")
            .unwrap()
            .tz("Mars/Olympus")
            .job(job.clone());
        match s.validate(0) {
            Err(Error::Invalid { setting, .. }) => assert_eq!(setting, "tz"),
            other => panic!("{other:?}"),
        }
        for d in [Duration::ZERO, Duration::from_millis(999)] {
            match Schedule::every(d).job(job.clone()).validate(0) {
                Err(Error::Invalid { setting, .. }) => assert_eq!(setting, "every"),
                other => panic!("{other:?}"),
            }
        }
        match Schedule::every(Duration::from_secs(60)).validate(0) {
            Err(Error::Invalid { setting, .. }) => assert_eq!(setting, "command"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn zones_are_spelled_as_the_tz_database_spells_them() {
        let zone = |name: &str| Schedule::cron("0 9 * * *").unwrap().tz(name).zone();
        assert!(zone("UTC").is_ok());
        assert!(zone("Asia/Kolkata").is_ok());
        match zone("asia/kolkata") {
            Err(Error::Invalid { setting, reason }) => {
                assert_eq!(setting, "tz");
                assert!(reason.contains("did you mean \"Asia/Kolkata\""), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn intervals_count_from_their_anchor() {
        let s = Schedule::every(Duration::from_secs(60)).with_anchor(1_000);
        assert_eq!(s.slots_after(0, 3).unwrap(), vec![61_000, 121_000, 181_000]);
        assert_eq!(s.slots_after(61_000, 1).unwrap(), vec![121_000]);
        assert_eq!(s.slots_after(61_001, 1).unwrap(), vec![121_000]);
    }

    #[test]
    fn the_grace_is_at_most_half_the_gap_to_the_next_slot() {
        let grace = duration_ms(MISFIRE_GRACE);
        assert_eq!(misfire_grace(0, Some(2_000)), 1_000);
        assert_eq!(misfire_grace(0, Some(60_000)), grace);
        assert_eq!(misfire_grace(0, Some(20_000)), grace);
        assert_eq!(misfire_grace(0, None), grace);
    }

    #[test]
    fn a_period_is_the_gap_between_the_next_two_slots() {
        let every = Schedule::every(Duration::from_secs(2)).with_anchor(1_000);
        assert_eq!(every.period_after(0).unwrap(), Some(2_000));
        // Irregular: 09:00 and 17:00 are 8 h apart, 17:00 and 09:00 the next day 16 h.
        let twice = Schedule::cron("0 9,17 * * *").unwrap();
        let h = 3_600_000;
        assert_eq!(
            twice.period_after(at("2027-01-01T08:00:00Z")).unwrap(),
            Some(8 * h)
        );
        assert_eq!(
            twice.period_after(at("2027-01-01T12:00:00Z")).unwrap(),
            Some(16 * h)
        );
    }

    #[test]
    fn an_anchor_after_now_is_carried_back_on_its_grid() {
        let s = Schedule::every(Duration::from_secs(60)).with_anchor(3_600_007);
        assert_eq!(s.anchor_back_to(30_000), Some(7));
        assert_eq!(s.anchor_back_to(60_007), Some(60_007));
        assert_eq!(s.anchor_back_to(3_600_007), None);
        assert_eq!(Schedule::cron("* * * * *").unwrap().anchor_back_to(0), None);
    }

    #[test]
    fn local_times_carry_the_zones_offset() {
        let s = Schedule::cron("30 2 * * *").unwrap().tz("Europe/Berlin");
        assert_eq!(
            s.local_time(at("2027-03-28T01:00:00Z")),
            "2027-03-28T03:00:00+02:00"
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(1000))]

        /// For any daily expression in a zone with DST (or with a half-hour change), the next
        /// slot is strictly after the given time, on a whole minute, and a slot of the
        /// expression: its wall-clock minute and hour are the expression's, or it is the
        /// instant the zone's offset changes (a slot in a skipped hour runs at the gap's end),
        /// and asking again from just before it finds it again.
        #[test]
        fn the_next_slot_is_after_the_time_and_a_slot_of_the_expression(
            minutes in proptest::sample::subsequence((0u32..60).collect::<Vec<_>>(), 1..4),
            hours in proptest::option::of(
                proptest::sample::subsequence((0u32..24).collect::<Vec<_>>(), 1..4)
            ),
            name in proptest::sample::select(vec![
                "UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe",
                "Asia/Kolkata", "America/Sao_Paulo",
            ]),
            after in 946_684_800_000i64..4_102_444_800_000,
        ) {
            let list = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
            let expr = format!("{} {} * * *", list(&minutes), hours.as_deref().map_or("*".into(), list));
            let schedule = Schedule::cron(&expr).unwrap().tz(name);
            let slot = schedule.slot_after(after).unwrap().expect("a daily expression has slots");
            proptest::prop_assert!(slot > after, "{expr} in {name}: {slot} after {after}");
            proptest::prop_assert_eq!(slot % 60_000, 0, "{} in {}: on a whole minute", expr, name);
            let tz = zone(name).unwrap();
            let wall = tz.to_datetime(Timestamp::from_millisecond(slot).unwrap());
            let expressed = minutes.contains(&(wall.minute() as u32))
                && hours.as_ref().is_none_or(|h| h.contains(&(wall.hour() as u32)));
            let secs = slot / 1000;
            let at_a_change = offset_at(&tz, secs - 1) != offset_at(&tz, secs);
            proptest::prop_assert!(
                expressed || at_a_change,
                "{} in {}: {} is {} there", expr, name, utc_text(slot), wall
            );
            proptest::prop_assert_eq!(schedule.slot_after(slot - 1).unwrap(), Some(slot));
        }
    }
}
