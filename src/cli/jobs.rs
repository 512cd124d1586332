//! `leasehold jobs ...`: add, ls, inspect, logs, retry, cancel.

use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use leasehold::{Job, JobRecord, ListFilter, Status, Store, Stream, operator};
use serde_json::{Value, json};

use super::attempt::{attempt_dir, is_running};
use super::follow;
use super::junit;
use super::progress;
use super::render::{self, print_json};
use super::{
    AddArgs, CancelArgs, InspectArgs, LogsArgs, LsArgs, ReportArgs, RetryArgs, SelectArgs,
    TimedOut, Usage, WaitArgs, open_existing, open_read_only,
};

pub fn add(db: &Path, args: AddArgs) -> anyhow::Result<()> {
    let lines = match (&args.from_file, args.command.is_empty()) {
        (Some(_), false) => {
            return Err(
                Usage("give either a command after `--` or --from-file, not both".into()).into(),
            );
        }
        (None, true) => {
            return Err(Usage(
                "jobs add needs a command (`-- CMD [ARG...]`) or --from-file FILE".into(),
            )
            .into());
        }
        (Some(file), true) => Some(read_lines(file)?),
        (None, false) => None,
    };
    let options = args.job.applier()?;
    let with_options = |mut job: Job| {
        job = options(job).after(args.after.iter().copied());
        if let Some(d) = args.delay {
            job = job.delay(d.0);
        }
        if let Some(key) = &args.unique_key {
            job = job.unique_key(key);
        }
        if let Some(w) = args.unique_window {
            job = job.unique_window(w.0);
        }
        if let Some(name) = &args.name {
            job = job.name(name);
        }
        job
    };
    let mut out = std::io::stdout().lock();
    match lines {
        None => {
            let job = with_options(Job::command(&args.command));
            // Handed to a running runner when there is one: see Store::hand_off.
            let done = Store::hand_off(db, &super::one_shot(), &job)?;
            if args.json {
                print_json(
                    &mut out,
                    &json!({"id": done.id, "duplicate": done.duplicate}),
                )?;
            } else {
                writeln!(out, "{}", done.id)?;
            }
        }
        Some(lines) => {
            let store = Store::open_with(db, &super::one_shot())?;
            let jobs: Vec<Job> = lines
                .into_iter()
                .map(|l| with_options(Job::shell(l)))
                .collect();
            let bar = progress::Bar::new(jobs.len() as u64, "lines enqueued");
            let ids = store.enqueue_many_with_progress(&jobs, &mut |n| {
                bar.set(n as u64);
            });
            bar.finish();
            let ids = ids?;
            if args.json {
                print_json(&mut out, &json!({"ids": ids}))?;
            } else {
                writeln!(out, "{}", ids.len())?;
            }
        }
    }
    Ok(())
}

/// The non-empty lines of `file` (`-` for stdin), without their line endings.
fn read_lines(file: &Path) -> anyhow::Result<Vec<String>> {
    let mut bytes = Vec::new();
    if file.as_os_str() == "-" {
        std::io::stdin()
            .lock()
            .read_to_end(&mut bytes)
            .context("cannot read stdin")?;
    } else {
        bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        let line = e.as_bytes()[..e.utf8_error().valid_up_to()]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1;
        let name = if file.as_os_str() == "-" {
            "stdin".into()
        } else {
            file.display().to_string()
        };
        anyhow::anyhow!("line {line} of {name} is not valid UTF-8: nothing was enqueued")
    })?;
    Ok(text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect())
}

/// The jobs `select` picks, newest first, as `jobs ls` lists them.
fn selected(store: &Store, select: &SelectArgs) -> anyhow::Result<Vec<JobRecord>> {
    let filter = ListFilter {
        status: select.status,
        queue: select.queue.clone(),
        failed_stale: select
            .failed_stale
            .then(|| operator::lease_settings(store).map(|s| s.max_recovery_attempts))
            .transpose()?,
        before: None,
        limit: select.limit,
    };
    Ok(store.list(&filter)?)
}

pub fn ls(db: &Path, args: &LsArgs) -> anyhow::Result<()> {
    let store = open_read_only(db)?;
    let jobs = selected(&store, &args.select)?;
    let not_held = store.conditions_not_held()?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if args.json {
        let all: Vec<Value> = jobs
            .iter()
            .map(|j| render::job_json(j, args.show_env, &not_held))
            .collect();
        print_json(&mut out, &Value::Array(all))?;
    } else {
        let mut rows = vec![
            [
                "ID", "STATUS", "QUEUE", "PRI", "ATTEMPT", "RECOVERY", "RESULT", "CREATED",
                "COMMAND",
            ]
            .map(String::from)
            .to_vec(),
        ];
        for j in &jobs {
            rows.push(vec![
                j.id.to_string(),
                j.status.to_string(),
                j.queue.clone(),
                j.priority.to_string(),
                format!("{}/{}", j.attempt, j.max_attempts),
                j.recovery_count.to_string(),
                match render::waiting_conditions(j, &not_held).as_slice() {
                    [] => render::result(j),
                    waits => format!("waiting for {}", render::condition_names(waits)),
                },
                render::time(j.created_at),
                render::cut(&command_cell(j), 60),
            ]);
        }
        render::table(&mut out, &rows)?;
    }
    out.flush()?;
    Ok(())
}

/// The COMMAND cell of `jobs ls`: the job's name, if it has one, before its command line.
fn command_cell(j: &JobRecord) -> String {
    match &j.name {
        Some(name) => format!("[{name}] {}", render::command_line(&j.argv)),
        None => render::command_line(&j.argv),
    }
}

pub fn inspect(db: &Path, args: &InspectArgs) -> anyhow::Result<()> {
    let store = open_read_only(db)?;
    let job = store.job(args.id)?;
    let events = store.events(args.id)?;
    let output = store.output(args.id, None)?;
    let not_held = store.conditions_not_held()?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if args.json {
        let mut value = render::job_json(&job, args.show_env, &not_held);
        value["teardown_waits"] = json!(operator::teardown_wait(&store, job.id)?);
        value["kept"] = json!(operator::kept_without_runner(&store, &job)?);
        value["events"] = events.iter().map(render::event_json).collect();
        value["output"] = output.as_ref().map_or(Value::Null, render::output_json);
        print_json(&mut out, &value)?;
        out.flush()?;
        return Ok(());
    }
    let opt = |v: Option<i64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
    let fields: Vec<(&str, String)> = vec![
        ("status", job.status.to_string()),
        ("queue", job.queue.clone()),
        ("command", render::command_line(&job.argv)),
        ("cwd", job.cwd.clone().unwrap_or_else(|| "-".into())),
        (
            "env",
            if job.env.is_empty() {
                "-".into()
            } else {
                job.env
                    .iter()
                    .map(|(k, v)| format!("{k}={}", render::env_value(v, args.show_env)))
                    .collect::<Vec<_>>()
                    .join(" ")
            },
        ),
        ("priority", job.priority.to_string()),
        ("after", ids(&job.after)),
        (
            "waiting_for",
            match (
                job.waiting_for.is_empty(),
                render::waiting_conditions(&job, &not_held).as_slice(),
            ) {
                (_, []) => ids(&job.waiting_for),
                (true, waits) => render::condition_names(waits),
                (false, waits) => {
                    format!(
                        "{},{}",
                        ids(&job.waiting_for),
                        render::condition_names(waits)
                    )
                }
            },
        ),
        ("when", render::condition_names(&job.conditions)),
        ("when_lost", job.when_lost.as_str().into()),
        ("name", job.name.clone().unwrap_or_else(|| "-".into())),
        (
            "unique_key",
            job.unique_key.clone().unwrap_or_else(|| "-".into()),
        ),
        (
            "schedule",
            match (&job.schedule, job.slot_at) {
                (Some(name), Some(slot)) => format!("{name} (slot {})", render::time(slot)),
                (Some(name), None) => name.clone(),
                _ => "-".into(),
            },
        ),
        (
            "attempt",
            format!("{} of {}", job.attempt, job.max_attempts),
        ),
        ("failed_attempts", job.failed_attempts.to_string()),
        ("recovery_count", job.recovery_count.to_string()),
        ("on_lost", job.on_lost.as_str().into()),
        ("limits", render::limits(&job.limits)),
        (
            "try_later",
            format!(
                "{} of {}",
                job.tempfails,
                job.tempfail_max
                    .unwrap_or(i64::from(leasehold::DEFAULT_TEMPFAIL_MAX))
            ),
        ),
        (
            "timeout",
            job.timeout_ms
                .map_or("-".into(), |ms| format!("{}s", ms as f64 / 1000.0)),
        ),
        (
            "idle_timeout",
            job.idle_timeout_ms
                .map_or("-".into(), |ms| format!("{}s", ms as f64 / 1000.0)),
        ),
        ("result", render::result(&job)),
        ("exit_code", opt(job.exit_code)),
        ("signal", opt(job.signal)),
        (
            "error_kind",
            job.error_kind.map_or("-".into(), |k| k.as_str().into()),
        ),
        ("last_error", job.last_error.clone().unwrap_or("-".into())),
        ("run_token", job.run_token.clone().unwrap_or("-".into())),
        ("worker_id", job.worker_id.clone().unwrap_or("-".into())),
        ("pid", opt(job.pid)),
        ("created_at", render::time(job.created_at)),
        ("scheduled_at", render::time(job.scheduled_at)),
        ("started_at", render::opt_time(job.started_at)),
        ("heartbeat_at", render::opt_time(job.heartbeat_at)),
        ("lease_expires_at", render::opt_time(job.lease_expires_at)),
        ("completed_at", render::opt_time(job.completed_at)),
    ];
    writeln!(out, "job {}", job.id)?;
    let width = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in &fields {
        writeln!(out, "  {k:width$}  {v}")?;
    }
    if let Some(kept) = operator::kept_without_runner(&store, &job)? {
        writeln!(out, "  ({kept})")?;
    }
    if job.teardown_pending {
        match operator::teardown_wait(&store, job.id)? {
            Some(why) => writeln!(
                out,
                "  (a lost attempt's processes are still to be torn down; {why})"
            )?,
            None => writeln!(
                out,
                "  (a lost attempt's processes are still to be torn down)"
            )?,
        }
    }
    writeln!(out, "events:")?;
    for e in &events {
        writeln!(
            out,
            "  {}  attempt {}  {}{}",
            render::time(e.at),
            e.attempt,
            e.kind,
            e.detail
                .as_deref()
                .map_or(String::new(), |d| format!(": {d}"))
        )?;
    }
    match &output {
        None => writeln!(out, "output: none recorded")?,
        Some(o) => {
            for (name, bytes, truncated) in [
                ("stdout", &o.stdout, o.stdout_truncated),
                ("stderr", &o.stderr, o.stderr_truncated),
            ] {
                writeln!(
                    out,
                    "{name} (attempt {}{}):",
                    o.attempt,
                    if truncated { ", tail" } else { "" }
                )?;
                let text = String::from_utf8_lossy(bytes);
                for line in text.lines() {
                    writeln!(out, "  {line}")?;
                }
            }
        }
    }
    out.flush()?;
    Ok(())
}

pub fn logs(db: &Path, args: &LogsArgs) -> anyhow::Result<()> {
    let store = open_read_only(db)?;
    let mut job = store.job(args.id)?;
    // A job that has not started yet is followed from its next attempt's start.
    if args.follow && args.attempt.is_none() && job.status == Status::Pending {
        match follow::until_started(&store, job)? {
            Some(started) => job = started,
            None => return Ok(()),
        }
    }
    let stream = if args.stderr {
        Stream::Stderr
    } else {
        Stream::Stdout
    };
    let attempt = args.attempt.unwrap_or(job.attempt);
    let dir = attempt_dir(&store.attempt_files(args.id)?, attempt, &job);
    // Only a running attempt is followed, and only from its own folder: an older folder of
    // the same number (before an operator's retry) is not the running attempt's.
    let following = args.follow && is_running(&job, attempt, None);
    match dir {
        Some(dir) if following && is_running(&job, attempt, Some(&dir)) => {
            follow::file(&store, &job, &dir, stream)
        }
        _ if following => follow::until_files(&store, &job, attempt, stream),
        Some(dir) => {
            let path = dir.stream(stream);
            let mut out = std::io::stdout().lock();
            match std::fs::File::open(&path) {
                Ok(mut file) => {
                    std::io::copy(&mut file, &mut out)
                        .with_context(|| format!("cannot copy {}", path.display()))?;
                }
                // The keeper had not created it yet: nothing written.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(e).with_context(|| format!("cannot read {}", path.display()));
                }
            }
            out.flush()?;
            Ok(())
        }
        None => print_recorded(&store, args.id, args.attempt, stream),
    }
}

/// Prints the tail of one stream the database kept for `attempt` (or the latest recorded).
fn print_recorded(
    store: &Store,
    id: i64,
    attempt: Option<i64>,
    stream: Stream,
) -> anyhow::Result<()> {
    let output = store.output(id, attempt)?;
    let bytes = match (output, attempt) {
        (Some(o), _) => match stream {
            Stream::Stdout => o.stdout,
            Stream::Stderr => o.stderr,
        },
        (None, Some(attempt)) => bail!("job {id} has no output for attempt {attempt}"),
        (None, None) => Vec::new(),
    };
    let mut out = std::io::stdout().lock();
    out.write_all(&bytes)?;
    out.flush()?;
    Ok(())
}

pub fn retry(db: &Path, args: &RetryArgs) -> anyhow::Result<()> {
    let target = RetryTarget::from_args(args)?;
    let store = open_existing(db)?;
    let reason = args.reason.as_deref();
    let mut forced = None;
    let retried = match target {
        // Forcing a job that already waits to run (reclaimed, its lost attempt not torn down
        // where nothing here can see it) only clears its teardown.
        RetryTarget::One(id)
            if args.force && {
                let job = store.job(id)?;
                job.status == leasehold::Status::Pending && job.teardown_pending
            } =>
        {
            Vec::new()
        }
        // A retried job that was running without a live lease may still have processes:
        // the library kills them now rather than at the next sweep of some runner.
        RetryTarget::One(id) => vec![operator::retry(&store, id, reason)?.id],
        RetryTarget::FailedStale { limit } => operator::retry_failed_stale(&store, limit, reason)?,
    };
    let mut waits = None;
    if let RetryTarget::One(id) = target {
        if args.force {
            forced = operator::force_teardown(&store, id)?;
        }
        waits = operator::teardown_wait(&store, id)?;
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        // The teardown's keys only when there is something to say: the plain answer stays
        // `{"retried": [ID]}`.
        let mut value = json!({"retried": retried});
        if let Some(detail) = &forced {
            value["teardown_forced"] = json!(detail);
        }
        if let Some(why) = &waits {
            value["teardown_waits"] = json!(why);
        }
        print_json(&mut out, &value)?;
    } else if let RetryTarget::One(id) = target {
        if retried.is_empty() {
            writeln!(out, "job {id} was already pending")?;
        } else {
            writeln!(out, "job {id} is pending again")?;
        }
        if let Some(detail) = &forced {
            writeln!(out, "its lost attempt is recorded torn down: {detail}")?;
        }
        if let Some(why) = &waits {
            writeln!(out, "it is not claimed yet: {why}")?;
        }
    } else {
        let ids: Vec<String> = retried.iter().map(i64::to_string).collect();
        writeln!(
            out,
            "retried {} job{}{}{}",
            retried.len(),
            if retried.len() == 1 { "" } else { "s" },
            if ids.is_empty() { "" } else { ": " },
            ids.join(" ")
        )?;
    }
    Ok(())
}

/// What `jobs retry` was asked to retry.
#[derive(Debug, Clone, Copy)]
enum RetryTarget {
    One(i64),
    /// The failed jobs that exhausted the recovery budget: `limit` of them, or all.
    FailedStale {
        limit: Option<u64>,
    },
}

impl RetryTarget {
    fn from_args(args: &RetryArgs) -> Result<RetryTarget, Usage> {
        match (args.id, args.failed_stale, args.limit, args.all) {
            (Some(_), _, Some(_), _) | (Some(_), _, _, true) => Err(Usage(
                "--limit and --all go with --failed-stale, not with a job id".into(),
            )),
            (Some(id), false, None, false) => Ok(RetryTarget::One(id)),
            (Some(_), true, None, false) => {
                Err(Usage("give a job id or --failed-stale, not both".into()))
            }
            (None, false, _, _) => Err(Usage(
                "jobs retry needs a job id, or --failed-stale with --limit N or --all".into(),
            )),
            (None, true, None, false) => {
                Err(Usage("--failed-stale needs --limit N or --all".into()))
            }
            (None, true, limit, _) => Ok(RetryTarget::FailedStale { limit }),
        }
    }
}

pub fn cancel(db: &Path, args: &CancelArgs) -> anyhow::Result<()> {
    let store = open_existing(db)?;
    // A job cancelled while running has its processes killed now (its runner also would, at
    // its next renewal; if that runner is gone, nobody else would until a sweep).
    let job = operator::cancel(&store, args.id)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        print_json(
            &mut out,
            &json!({"id": job.id, "status": job.status.as_str()}),
        )?;
    } else {
        writeln!(out, "job {} is {}", job.id, job.status)?;
    }
    Ok(())
}

/// Job ids as `3,4`, or `-` for none.
fn ids(ids: &[i64]) -> String {
    if ids.is_empty() {
        return "-".into();
    }
    ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

/// The first pause between two looks at the jobs a wait follows, and the longest: a wait
/// answers within about 20 ms of a quick job's end, and a long one costs a read a second.
const WAIT_POLL_FIRST: Duration = Duration::from_millis(20);
const WAIT_POLL_MAX: Duration = Duration::from_secs(1);

/// `jobs wait`: reads the jobs until every one has ended (succeeded, failed or cancelled),
/// then prints their outcomes. An unknown id is refused before any wait. Read-only: a wait
/// never changes the file, and its reads take no write lock.
pub fn wait(db: &Path, args: &WaitArgs) -> anyhow::Result<()> {
    let store = open_read_only(db)?;
    let deadline = args.timeout.map(|t| Instant::now() + t.0);
    let mut pause = WAIT_POLL_FIRST;
    let jobs = loop {
        let jobs = args
            .ids
            .iter()
            .map(|&id| store.job(id))
            .collect::<leasehold::Result<Vec<_>>>()?;
        if jobs.iter().all(|j| j.status.is_terminal()) {
            break jobs;
        }
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if left.is_some_and(|l| l.is_zero()) {
            print_outcomes(&jobs, args.json)?;
            let open: Vec<String> = jobs
                .iter()
                .filter(|j| !j.status.is_terminal())
                .map(|j| format!("{} ({})", j.id, j.status.as_str()))
                .collect();
            return Err(
                TimedOut(format!("timed out: job {} not ended yet", open.join(", "))).into(),
            );
        }
        std::thread::sleep(left.map_or(pause, |l| l.min(pause)));
        pause = (pause * 2).min(WAIT_POLL_MAX);
    };
    print_outcomes(&jobs, args.json)?;
    let unsuccessful: Vec<String> = jobs
        .iter()
        .filter(|j| j.status != Status::Succeeded)
        .map(|j| format!("{} {}", j.id, j.status.as_str()))
        .collect();
    if !unsuccessful.is_empty() {
        bail!("job {}", unsuccessful.join(", "));
    }
    Ok(())
}

/// One line per job (`ID STATUS`, with its exit code or signal when it has one, then its name
/// quoted when it has one), or the JSON
/// array `jobs wait --json` documents.
fn print_outcomes(jobs: &[JobRecord], json: bool) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if json {
        let all: Vec<Value> = jobs
            .iter()
            .map(|j| {
                json!({
                    "id": j.id,
                    "status": j.status.as_str(),
                    "exit_code": j.exit_code,
                    "signal": j.signal,
                    "error_kind": j.error_kind.map(|k| k.as_str()),
                    "name": j.name,
                })
            })
            .collect();
        print_json(&mut out, &Value::Array(all))?;
    } else {
        for j in jobs {
            let how = match (j.exit_code, j.signal) {
                (Some(code), _) => format!(" (exit {code})"),
                (None, Some(sig)) => format!(" (signal {sig})"),
                (None, None) => String::new(),
            };
            let name = j
                .name
                .as_ref()
                .map(|n| format!(" {n:?}"))
                .unwrap_or_default();
            writeln!(out, "{} {}{how}{name}", j.id, j.status.as_str())?;
        }
    }
    out.flush()?;
    Ok(())
}

/// `jobs report --junit PATH`: the jobs named (or selected as `jobs ls` selects them), oldest
/// first, as a JUnit XML report. Read-only on the database; the file is written only once
/// every job was read.
pub fn report(db: &Path, args: &ReportArgs) -> anyhow::Result<()> {
    let store = open_read_only(db)?;
    let mut jobs = if args.ids.is_empty() {
        selected(&store, &args.select)?
    } else {
        args.ids
            .iter()
            .map(|&id| store.job(id))
            .collect::<leasehold::Result<Vec<_>>>()?
    };
    jobs.sort_by_key(|j| j.id);
    jobs.dedup_by_key(|j| j.id);
    let cases = jobs
        .into_iter()
        .map(|j| junit::Case::of(&store, j))
        .collect::<leasehold::Result<Vec<_>>>()?;
    let xml = junit::render(&cases, None);
    junit::write(junit::create(&args.junit)?, &args.junit, &xml)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}: {}", args.junit.display(), junit::totals(&cases))?;
    Ok(())
}
