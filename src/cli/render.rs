//! How jobs, events and times are printed: the JSON shapes scripts depend on, and the human
//! forms.

use std::io::Write;

use leasehold::{Condition, Event, JobRecord, Output, Status};
use serde_json::{Value, json};

/// What a job's environment value prints as unless the caller asks for the values
/// (`--show-env`): the same for every value, so that not even a value's length shows. The
/// values are often secrets (API keys, tokens) that only the database's owner should read.
pub const ENV_MASK: &str = "••••••";

/// An environment value as printed: itself when `show`, else [`ENV_MASK`].
pub fn env_value(value: &str, show: bool) -> &str {
    if show { value } else { ENV_MASK }
}

/// The conditions a pending job waits for: those of its own that no running runner saw hold
/// (`not_held`, from [`leasehold::Store::conditions_not_held`]).
pub fn waiting_conditions(j: &JobRecord, not_held: &[Condition]) -> Vec<Condition> {
    if j.status != Status::Pending {
        return Vec::new();
    }
    j.conditions
        .iter()
        .copied()
        .filter(|c| not_held.contains(c))
        .collect()
}

/// Conditions by name, comma-separated, or `-`.
pub fn condition_names(conditions: &[Condition]) -> String {
    if conditions.is_empty() {
        return "-".into();
    }
    conditions
        .iter()
        .map(|c| c.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

/// A job object. Times are integer milliseconds since the Unix epoch; unset values are null.
/// A job's manners and caps in one line (`-` for none): `nice 10, io idle, memory 512 MiB`.
pub fn limits(l: &leasehold::Limits) -> String {
    let mut parts = Vec::new();
    if let Some(n) = l.nice {
        parts.push(format!("nice {n}"));
    }
    if let Some(c) = l.io_class {
        parts.push(format!("io {}", c.as_string()));
    }
    if let Some(m) = l.memory_max {
        parts.push(format!("memory {m} bytes"));
    }
    if let Some(w) = l.cpu_weight {
        parts.push(format!("cpu weight {w}"));
    }
    if let Some(p) = l.pids_max {
        parts.push(format!("pids {p}"));
    }
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(", ")
    }
}

/// The environment's values are [`ENV_MASK`] unless `show_env`. `waiting_for` lists the jobs
/// it waits for (ids) and then the conditions (names) that no running runner saw hold.
pub fn job_json(j: &JobRecord, show_env: bool, not_held: &[Condition]) -> Value {
    let env: serde_json::Map<String, Value> = j
        .env
        .iter()
        .map(|(k, v)| (k.clone(), Value::from(env_value(v, show_env))))
        .collect();
    let mut v = json!({
        "id": j.id,
        "queue": j.queue,
        "argv": j.argv,
        "env": env,
        "cwd": j.cwd,
        "status": j.status.as_str(),
        "priority": j.priority,
        "attempt": j.attempt,
        "max_attempts": j.max_attempts,
        "failed_attempts": j.failed_attempts,
        "recovery_count": j.recovery_count,
        "on_lost": j.on_lost.as_str(),
        "timeout_ms": j.timeout_ms,
        "idle_timeout_ms": j.idle_timeout_ms,
        "exit_code": j.exit_code,
        "signal": j.signal,
        "error_kind": j.error_kind.map(|k| k.as_str()),
        "last_error": j.last_error,
        "run_token": j.run_token,
        "worker_id": j.worker_id,
        "pid": j.pid,
        "pgid": j.pgid,
        "created_at": j.created_at,
        "scheduled_at": j.scheduled_at,
        "started_at": j.started_at,
        "heartbeat_at": j.heartbeat_at,
        "lease_expires_at": j.lease_expires_at,
        "completed_at": j.completed_at,
        "teardown_pending": j.teardown_pending,
        "unique_key": j.unique_key,
        "name": j.name,
        "schedule": j.schedule,
        "slot_at": j.slot_at,
        "after": j.after,
        "waiting_for": j
            .waiting_for
            .iter()
            .map(|&id| Value::from(id))
            .chain(
                waiting_conditions(j, not_held)
                    .into_iter()
                    .map(|c| Value::from(c.as_str()))
            )
            .collect::<Vec<_>>(),
    });
    // Apart: one json! of every field passes the macro's recursion limit.
    let more = json!({
        "when": j.conditions.iter().map(|c| c.as_str()).collect::<Vec<_>>(),
        "when_lost": j.when_lost.as_str(),
        "nice": j.limits.nice,
        "io_class": j.limits.io_class.map(|c| c.as_string()),
        "memory_max": j.limits.memory_max,
        "cpu_weight": j.limits.cpu_weight,
        "pids_max": j.limits.pids_max,
        "tempfail_max": j.tempfail_max,
        "tempfails": j.tempfails,
    });
    if let (Value::Object(all), Value::Object(more)) = (&mut v, more) {
        all.extend(more);
    }
    v
}

/// One entry of a job's history.
pub fn event_json(e: &Event) -> Value {
    json!({"at": e.at, "kind": e.kind.as_str(), "attempt": e.attempt, "detail": e.detail})
}

/// The output tails of one attempt, as text with invalid UTF-8 replaced.
pub fn output_json(o: &Output) -> Value {
    json!({
        "attempt": o.attempt,
        "stdout": String::from_utf8_lossy(&o.stdout),
        "stderr": String::from_utf8_lossy(&o.stderr),
        "truncated": o.stdout_truncated || o.stderr_truncated,
        "stdout_truncated": o.stdout_truncated,
        "stderr_truncated": o.stderr_truncated,
    })
}

/// Writes `value` and a newline.
pub fn print_json(out: &mut impl Write, value: &Value) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, value)?;
    writeln!(out)
}

/// A time as `2024-01-31T12:00:00.000Z` (UTC).
pub fn time(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rest = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// An optional time, or `-`.
pub fn opt_time(ms: Option<i64>) -> String {
    ms.map_or_else(|| "-".to_string(), time)
}

/// The proleptic Gregorian date of a day number counted from 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// A command line a shell would read back as the same argv.
pub fn command_line(argv: &[String]) -> String {
    argv.iter().map(|a| quote(a)).collect::<Vec<_>>().join(" ")
}

fn quote(a: &str) -> String {
    let plain = !a.is_empty()
        && a.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        a.to_string()
    } else {
        format!("'{}'", a.replace('\'', r"'\''"))
    }
}

/// What a job's last attempt came to, in a few words: `exit 3`, `timeout`, `-`.
pub fn result(j: &JobRecord) -> String {
    match (j.error_kind, j.exit_code, j.signal) {
        (Some(k), _, _) if k.as_str() != "exit" => k.as_str().to_string(),
        (_, Some(code), _) => format!("exit {code}"),
        (_, _, Some(sig)) => format!("signal {sig}"),
        _ => "-".to_string(),
    }
}

/// Cuts `s` to at most `max` characters, marking the cut with `…`.
pub fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

/// Writes rows as columns separated by two spaces; the last column is not padded.
pub fn table(out: &mut impl Write, rows: &[Vec<String>]) -> std::io::Result<()> {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(cell);
                let pad = widths[c] - cell.chars().count() + 2;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_utc_with_milliseconds() {
        assert_eq!(time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(time(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(time(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(time(-1), "1969-12-31T23:59:59.999Z");
    }

    #[test]
    fn command_lines_quote_what_a_shell_would_split() {
        let argv = ["sh", "-c", "echo 'hi' there", ""].map(String::from);
        assert_eq!(command_line(&argv), r"sh -c 'echo '\''hi'\'' there' ''");
    }
}
