//! `leasehold schedules ...`: add, ls, rm, pause, resume, next.

use std::io::Write;
use std::path::Path;

use clap::builder::{OsStringValueParser, TypedValueParser};
use clap::{Args, Subcommand};
use leasehold::{CatchUp, Job, Overlap, Schedule, ScheduleRecord, Store, now_ms, parse_rfc3339};
use serde_json::{Value, json};

use super::arg::{self, Secs};
use super::render::{self, print_json};
use super::{Usage, open_existing, open_read_only};

#[derive(Debug, Subcommand)]
pub enum SchedulesCommand {
    /// Add a schedule: a cron expression (or an interval), a zone, policies, and the command
    /// each slot enqueues (after `--`).
    Add(Box<AddArgs>),
    /// List the schedules: expression, zone, policies, paused, last and next slot, command.
    Ls(JsonArg),
    /// Remove a schedule (the jobs it enqueued stay).
    Rm(NameArgs),
    /// Pause a schedule: no slot fires until it is resumed.
    Pause(NameArgs),
    /// Resume a schedule at its next future slot (slots missed while paused are not caught up).
    Resume(NameArgs),
    /// The next slots of a schedule, in UTC and in its zone.
    Next(NextArgs),
}

#[derive(Debug, Args)]
pub struct JsonArg {
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct NameArgs {
    /// The schedule's name.
    #[arg(value_parser = OsStringValueParser::new().try_map(arg::schedule_name))]
    name: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct NextArgs {
    /// The schedule's name.
    #[arg(value_parser = OsStringValueParser::new().try_map(arg::schedule_name))]
    name: String,
    /// How many slots.
    #[arg(long, value_name = "N", default_value_t = 5, allow_hyphen_values = true,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    count: u32,
    /// Slots after this instant (RFC 3339, e.g. 2027-03-28T00:00:00Z) [default: now].
    #[arg(long, value_name = "RFC3339", allow_hyphen_values = true)]
    after: Option<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
#[command(
    allow_negative_numbers = true,
    override_usage = "leasehold schedules add NAME (--cron EXPR | --every SECS) [OPTIONS] -- CMD [ARG]..."
)]
pub struct AddArgs {
    /// The schedule's name (unique).
    #[arg(value_parser = OsStringValueParser::new().try_map(arg::schedule_name))]
    name: String,
    /// A cron expression: 5 fields, 6 with seconds first, or @hourly, @daily, @weekly,
    /// @monthly, @yearly.
    #[arg(long, value_name = "EXPR", conflicts_with = "every", required_unless_present = "every",
          value_parser = OsStringValueParser::new().try_map(arg::text))]
    cron: Option<String>,
    /// Fire every SECS seconds (at least 1), counted from now.
    #[arg(long, value_name = "SECS", allow_hyphen_values = true)]
    every: Option<Secs>,
    /// The IANA time zone the cron fields are read in.
    #[arg(long, value_name = "ZONE", default_value = "UTC",
          value_parser = OsStringValueParser::new().try_map(arg::text))]
    tz: String,
    /// Missed slots: skip (resume at the next), one (enqueue the newest), all (each, at most 100).
    #[arg(long, value_name = "POLICY", default_value = "skip", value_parser = catch_up)]
    catch_up: CatchUp,
    /// A slot while an earlier slot's job is pending or running: skip it, or allow it.
    #[arg(long, value_name = "POLICY", default_value = "skip", value_parser = overlap)]
    overlap: Overlap,
    /// Replace a schedule of the same name instead of refusing.
    #[arg(long)]
    replace: bool,
    #[command(flatten)]
    job: super::options::JobOptions,
    /// A unique key for each slot's job (a slot whose key matches an unfinished job enqueues
    /// nothing).
    #[arg(long, value_name = "KEY", value_parser = OsStringValueParser::new().try_map(arg::unique_key))]
    unique_key: Option<String>,
    /// The unique key also matches a job of that key created less than SECS ago (one
    /// created exactly SECS ago does not; the key defaults to `schedule:NAME`).
    #[arg(long, value_name = "SECS", allow_hyphen_values = true)]
    unique_window: Option<Secs>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// The command and its arguments: after `--`.
    #[arg(value_name = "CMD", trailing_var_arg = true,
          value_parser = OsStringValueParser::new().try_map(arg::text))]
    command: Vec<String>,
}

fn catch_up(s: &str) -> Result<CatchUp, String> {
    s.parse::<CatchUp>()
        .map_err(|_| format!("{s:?} is not one of skip, one, all"))
}

fn overlap(s: &str) -> Result<Overlap, String> {
    s.parse::<Overlap>()
        .map_err(|_| format!("{s:?} is not one of skip, allow"))
}

pub fn run(db: &Path, command: SchedulesCommand) -> anyhow::Result<()> {
    match command {
        SchedulesCommand::Add(a) => add(db, *a),
        SchedulesCommand::Ls(a) => ls(db, a.json),
        SchedulesCommand::Rm(a) => {
            open_existing(db)?.remove_schedule(&a.name)?;
            let mut out = std::io::stdout().lock();
            if a.json {
                print_json(&mut out, &json!({"removed": a.name}))?;
            } else {
                writeln!(out, "schedule {} removed", a.name)?;
            }
            Ok(())
        }
        SchedulesCommand::Pause(a) => {
            let rec = open_existing(db)?.pause_schedule(&a.name)?;
            show(&rec, a.json, "paused")
        }
        SchedulesCommand::Resume(a) => {
            let rec = open_existing(db)?.resume_schedule(&a.name)?;
            show(&rec, a.json, "resumed")
        }
        SchedulesCommand::Next(a) => next(db, &a),
    }
}

fn add(db: &Path, args: AddArgs) -> anyhow::Result<()> {
    if args.command.is_empty() {
        return Err(Usage("schedules add needs a command (`-- CMD [ARG...]`)".into()).into());
    }
    let mut job = args.job.applier()?(Job::command(&args.command));
    match (&args.unique_key, args.unique_window) {
        (Some(key), _) => job = job.unique_key(key),
        (None, Some(_)) => job = job.unique_key(format!("schedule:{}", args.name)),
        (None, None) => {}
    }
    if let Some(w) = args.unique_window {
        job = job.unique_window(w.0);
    }
    let schedule = match (&args.cron, args.every) {
        (Some(expr), None) => Schedule::cron(expr)?,
        (None, Some(every)) => Schedule::every(every.0),
        // clap requires exactly one of the two.
        _ => return Err(Usage("give either --cron EXPR or --every SECS".into()).into()),
    }
    .tz(&args.tz)
    .catch_up(args.catch_up)
    .overlap(args.overlap)
    .job(job);
    // Everything is checked before the file is opened: a refused schedule writes nothing.
    schedule.validate(now_ms())?;
    let store = Store::open(db)?;
    let rec = if args.replace {
        store.replace_schedule(&args.name, &schedule)?
    } else {
        store.put_schedule(&args.name, &schedule)?
    };
    show(
        &rec,
        args.json,
        if args.replace { "stored" } else { "added" },
    )
}

/// A schedule object. Times are milliseconds; unset ones are null.
fn schedule_json(r: &ScheduleRecord) -> Value {
    let s = &r.schedule;
    let job = s.job_template();
    json!({
        "name": r.name,
        "expression": r.expression(),
        "cron": s.cron_expr(),
        "every_ms": s.interval().map(|d| d.as_millis() as u64),
        "tz": s.zone_name(),
        "catch_up": s.catch_up_policy().as_str(),
        "overlap": s.overlap_policy().as_str(),
        "paused": r.paused,
        "last_slot_at": r.last_slot_at,
        "next_slot_at": r.next_slot_at,
        "next_slot_local": r.next_slot_at.map(|t| s.local_time(t)),
        "command": job.argv(),
        "created_at": r.created_at,
        "updated_at": r.updated_at,
    })
}

fn show(rec: &ScheduleRecord, as_json: bool, what: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if as_json {
        print_json(&mut out, &schedule_json(rec))?;
    } else {
        let next = match rec.next_slot_at {
            Some(t) if !rec.paused => format!(
                "next slot {} ({})",
                render::time(t),
                rec.schedule.local_time(t)
            ),
            Some(_) => "paused".to_string(),
            None => "no slot left".to_string(),
        };
        writeln!(out, "schedule {} {what}: {next}", rec.name)?;
    }
    Ok(())
}

fn ls(db: &Path, as_json: bool) -> anyhow::Result<()> {
    let store = open_read_only(db)?;
    let all = store.schedules()?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if as_json {
        let list: Vec<Value> = all.iter().map(schedule_json).collect();
        print_json(&mut out, &Value::Array(list))?;
    } else {
        let mut rows = vec![
            [
                "NAME",
                "EXPRESSION",
                "TZ",
                "CATCH_UP",
                "OVERLAP",
                "PAUSED",
                "LAST",
                "NEXT",
                "COMMAND",
            ]
            .map(String::from)
            .to_vec(),
        ];
        for r in &all {
            let s = &r.schedule;
            rows.push(vec![
                r.name.clone(),
                r.expression(),
                s.zone_name().to_string(),
                s.catch_up_policy().as_str().to_string(),
                s.overlap_policy().as_str().to_string(),
                if r.paused { "yes" } else { "no" }.to_string(),
                render::opt_time(r.last_slot_at),
                render::opt_time(r.next_slot_at),
                render::cut(&render::command_line(s.job_template().argv()), 60),
            ]);
        }
        render::table(&mut out, &rows)?;
    }
    out.flush()?;
    Ok(())
}

fn next(db: &Path, args: &NextArgs) -> anyhow::Result<()> {
    let after = match &args.after {
        Some(text) => parse_rfc3339(text)?,
        None => now_ms(),
    };
    let store = open_read_only(db)?;
    let rec = store.schedule(&args.name)?;
    let slots = store.next_slots(&args.name, after, args.count as usize)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if args.json {
        let list: Vec<Value> = slots
            .iter()
            .map(|&t| json!({"at": t, "local": rec.schedule.local_time(t)}))
            .collect();
        print_json(&mut out, &json!({"slots": list}))?;
    } else {
        for &t in &slots {
            writeln!(out, "{}  {}", render::time(t), rec.schedule.local_time(t))?;
        }
    }
    out.flush()?;
    Ok(())
}
