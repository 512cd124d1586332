//! Numbers at their extremes: every option or argument that takes a number refuses what does
//! not fit, without a panic and without writing, and stores what fits exactly.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use assert_cmd::Command;
use leasehold::now_ms;

use crate::helper::{add, bin, cli, fails, inspect, ok};
use crate::util::{TestDb, bare};

#[test]
fn out_of_range_counts_and_durations_are_usage_errors_naming_the_flag() {
    let t = TestDb::new();
    let db = t.path.as_path();
    for (args, flag) in [
        (vec!["run", "--workers", "9223372036854775808"], "--workers"),
        (vec!["run", "--workers", "1025"], "--workers"),
        (vec!["run", "--heartbeat", "1e19"], "--heartbeat"),
        (vec!["run", "--lease-ttl", "1e19"], "--lease-ttl"),
        (vec!["run", "--sweep", "NaN"], "--sweep"),
        (vec!["run", "--sample-interval", "0.5"], "--sample-interval"),
        (vec!["run", "--kill-grace", "inf"], "--kill-grace"),
        (vec!["run", "--shutdown-grace", ""], "--shutdown-grace"),
        (
            vec!["jobs", "add", "--timeout", "1e19", "--", "true"],
            "--timeout",
        ),
        (
            vec!["jobs", "add", "--idle-timeout", "-inf", "--", "true"],
            "--idle-timeout",
        ),
        (
            vec!["jobs", "add", "--delay", "9223372036854776", "--", "true"],
            "--delay",
        ),
        (
            vec!["jobs", "add", "--delay", "1e-9", "--", "true"],
            "--delay",
        ),
        (vec!["jobs", "wait", "1", "--timeout", "1e19"], "--timeout"),
        (vec!["jobs", "wait", "9223372036854775808"], "ID"),
    ] {
        let line = fails(&mut cli(db, &args), 2);
        assert!(line.contains(flag), "{args:?}: {line}");
    }
    let line = fails(&mut cli(db, &["run", "--workers", "2000"]), 2);
    assert!(line.contains("1 to 1024"), "{line}");
    let line = fails(
        cli(db, &["run", "--until-idle"]).env("LEASEHOLD_WORKERS", "99999999999999999999"),
        2,
    );
    assert!(line.contains("--workers"), "{line}");
    assert!(!db.exists(), "a usage error created the database");

    // A delay that fits is stored exactly.
    let before = now_ms();
    let id = add(db, &["--delay", "1e9"], &["true"]);
    let job = inspect(db, id);
    assert_eq!(
        job["scheduled_at"].as_i64().unwrap() - job["created_at"].as_i64().unwrap(),
        1_000_000_000_000
    );
    assert!(job["created_at"].as_i64().unwrap() >= before);
}

/// Every option or argument that takes a number, by command, as `--help` shows it. When a
/// command gains one, add it here: the test below fails until it is listed.
const NUMERIC: [(&str, &str); 53] = [
    ("db prune", "--keep-succeeded"),
    ("db prune", "--keep-failed"),
    ("db prune", "--keep-cancelled"),
    ("db prune", "--keep-max"),
    ("jobs add", "--priority"),
    ("jobs add", "--timeout"),
    ("jobs add", "--idle-timeout"),
    ("jobs add", "--delay"),
    ("jobs add", "--max-attempts"),
    ("jobs add", "--unique-window"),
    ("jobs add", "--nice"),
    ("jobs add", "--memory-max"),
    ("jobs add", "--cpu-weight"),
    ("jobs add", "--pids-max"),
    ("jobs add", "--tempfail-max"),
    ("jobs ls", "--limit"),
    ("jobs inspect", "ID"),
    ("jobs logs", "ID"),
    ("jobs logs", "--attempt"),
    ("jobs retry", "ID"),
    ("jobs retry", "--limit"),
    ("jobs report", "ID"),
    ("jobs report", "--limit"),
    ("jobs cancel", "ID"),
    ("jobs wait", "ID"),
    ("jobs wait", "--timeout"),
    ("run", "--workers"),
    ("run", "--lease-ttl"),
    ("run", "--heartbeat"),
    ("run", "--sweep"),
    ("run", "--sample-interval"),
    ("run", "--kill-grace"),
    ("run", "--shutdown-grace"),
    ("run", "--max-recovery"),
    ("run", "--reclaim-batch"),
    ("run", "--output-cap"),
    ("run", "--nice"),
    ("run", "--keep-succeeded"),
    ("run", "--keep-failed"),
    ("run", "--keep-cancelled"),
    ("run", "--keep-max"),
    ("schedules add", "--every"),
    ("schedules add", "--priority"),
    ("schedules add", "--timeout"),
    ("schedules add", "--idle-timeout"),
    ("schedules add", "--max-attempts"),
    ("schedules add", "--unique-window"),
    ("schedules add", "--nice"),
    ("schedules add", "--memory-max"),
    ("schedules add", "--cpu-weight"),
    ("schedules add", "--pids-max"),
    ("schedules add", "--tempfail-max"),
    ("schedules next", "--count"),
];

/// The value names that `--help` gives a number.
const NUMERIC_VALUE_NAMES: [&str; 4] = ["N", "SECS", "ID", "BYTES"];

/// The commands that take no subcommand, as `--help` lists them (`jobs add`, `run`, ...).
fn leaf_commands() -> Vec<String> {
    let mut leaves = Vec::new();
    let mut todo = vec![String::new()];
    while let Some(path) = todo.pop() {
        let help = ok(bin().args(path.split_whitespace()).arg("--help"));
        let commands: Vec<String> = help
            .lines()
            .skip_while(|l| !l.starts_with("Commands:"))
            .skip(1)
            .take_while(|l| l.starts_with("  "))
            .filter_map(|l| l.split_whitespace().next())
            .filter(|c| *c != "help")
            .map(|c| format!("{path} {c}").trim().to_string())
            .collect();
        if commands.is_empty() {
            leaves.push(path);
        } else {
            todo.extend(commands);
        }
    }
    leaves.sort();
    leaves
}

/// The options and arguments of `command` whose value `--help` names as a number.
fn numeric_inputs(command: &str) -> Vec<String> {
    let help = ok(bin().args(command.split_whitespace()).arg("--help"));
    let mut found = Vec::new();
    for line in help.lines().map(str::trim_start) {
        let words: Vec<&str> = line.split_whitespace().collect();
        // An argument: `<ID>  The job's id` or `[ID]  ...`.
        if let Some(first) = words.first()
            && (first.starts_with('<') || first.starts_with('['))
        {
            let name = first.trim_matches(|c| "<>[].".contains(c));
            if NUMERIC_VALUE_NAMES.contains(&name) {
                found.push(name.to_string());
            }
            continue;
        }
        // An option: `--limit <N>  ...` or `-h, --help  ...`.
        if let Some(i) = words.iter().position(|w| w.starts_with("--"))
            && let Some(value) = words.get(i + 1)
            && let Some(name) = value.strip_prefix('<').and_then(|v| v.strip_suffix('>'))
            && NUMERIC_VALUE_NAMES.contains(&name)
        {
            found.push(words[i].to_string());
        }
    }
    found
}

#[test]
fn every_numeric_input_is_listed_for_the_extreme_values_test() {
    let listed: BTreeSet<(String, String)> = NUMERIC
        .iter()
        .map(|(c, f)| (c.to_string(), f.to_string()))
        .collect();
    let mut shown = BTreeSet::new();
    for command in leaf_commands() {
        for input in numeric_inputs(&command) {
            shown.insert((command.clone(), input));
        }
    }
    assert!(shown.len() >= 20, "the help was not parsed: {shown:?}");
    assert_eq!(
        shown, listed,
        "a numeric option is missing from NUMERIC (or gone from --help)"
    );
}

/// The environment variable that sets a `run` flag, if any.
fn run_env(flag: &str) -> Option<&'static str> {
    Some(match flag {
        "--workers" => "LEASEHOLD_WORKERS",
        "--lease-ttl" => "LEASEHOLD_LEASE_TTL",
        "--heartbeat" => "LEASEHOLD_HEARTBEAT",
        "--sweep" => "LEASEHOLD_SWEEP",
        "--sample-interval" => "LEASEHOLD_SAMPLE_INTERVAL",
        "--kill-grace" => "LEASEHOLD_KILL_GRACE",
        "--shutdown-grace" => "LEASEHOLD_SHUTDOWN_GRACE",
        "--max-recovery" => "LEASEHOLD_MAX_RECOVERY",
        "--reclaim-batch" => "LEASEHOLD_RECLAIM_BATCH",
        "--output-cap" => "LEASEHOLD_OUTPUT_CAP",
        "--keep-succeeded" => "LEASEHOLD_KEEP_SUCCEEDED",
        "--keep-failed" => "LEASEHOLD_KEEP_FAILED",
        "--keep-cancelled" => "LEASEHOLD_KEEP_CANCELLED",
        "--keep-max" => "LEASEHOLD_KEEP_MAX",
        _ => return None,
    })
}

/// Every row of every table, and the schema version, as text: two equal snapshots mean that
/// nothing was written in between.
fn snapshot(db: &Path) -> String {
    let conn = bare(db);
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let mut out = format!("version {version}\n");
    for table in tables {
        let mut stmt = conn.prepare(&format!("SELECT * FROM \"{table}\"")).unwrap();
        let n = stmt.column_count();
        let mut rows: Vec<String> = stmt
            .query_map([], |r| {
                (0..n)
                    .map(|i| r.get::<_, rusqlite::types::Value>(i))
                    .collect::<Result<Vec<_>, _>>()
            })
            .unwrap()
            .map(|row| format!("{:?}", row.unwrap()))
            .collect();
        rows.sort();
        out.push_str(&format!("{table}: {rows:?}\n"));
    }
    out
}

#[test]
fn every_numeric_input_takes_extreme_values_without_a_panic() {
    const EXTREMES: [&str; 16] = [
        "0",
        "0.05",
        "1e7",
        "-1",
        "1e-9",
        "1e19",
        "9223372036854775807",
        "-9223372036854775808",
        "18446744073709551616",
        "NaN",
        "inf",
        "-inf",
        "",
        " ",
        "1.5",
        "0x10",
    ];
    let t = TestDb::new();
    let db = t.path.as_path();
    ok(&mut cli(db, &["db", "migrate"]));
    // A job no runner below takes (they run queue "idle" only), so a refused command has
    // something it could have changed.
    add(db, &["--queue", "parked"], &["true"]);

    // `jobs report` writes its report here when a value is taken.
    let report = t.dir.path().join("report.xml");
    let report = report.to_str().expect("a UTF-8 path");
    let report_args = ["jobs", "report", "--junit", report];

    let mut commands: Vec<(String, Command)> = Vec::new();
    for (command, input) in NUMERIC {
        for value in EXTREMES {
            // The ways a value reaches the input: its own word, `--flag=value`, and for an
            // argument after `--`; for `run`, its environment variable too.
            let forms: Vec<Vec<String>> = if input.starts_with("--") {
                vec![
                    vec![input.to_string(), value.to_string()],
                    vec![format!("{input}={value}")],
                ]
            } else {
                vec![
                    vec![value.to_string()],
                    vec!["--".into(), value.to_string()],
                ]
            };
            let (before, after): (&[&str], &[&str]) = match (command, input) {
                ("jobs add", "--unique-window") => {
                    (&["jobs", "add", "--unique-key", "k"], &["--", "true"])
                }
                ("jobs add", _) => (&["jobs", "add"], &["--", "true"]),
                ("schedules add", "--every") => {
                    (&["schedules", "add", "s", "--replace"], &["--", "true"])
                }
                ("schedules add", _) => (
                    &["schedules", "add", "s", "--replace", "--cron", "@daily"],
                    &["--", "true"],
                ),
                ("schedules next", _) => (&["schedules", "next", "s"], &[]),
                ("jobs logs", "--attempt") => (&["jobs", "logs", "1"], &[]),
                ("jobs retry", "--limit") => (&["jobs", "retry", "--failed-stale"], &[]),
                ("jobs report", _) => (&report_args[..], &[]),
                ("run", _) => (&["run", "--until-idle", "--queue", "idle"], &[]),
                _ => (&[], &[]),
            };
            let before: Vec<&str> = if before.is_empty() {
                command.split_whitespace().collect()
            } else {
                before.to_vec()
            };
            for form in forms {
                let mut cmd = cli(db, &before);
                // An argument after `--` must come last.
                if form[0] == "--" {
                    cmd.args(after).args(&form);
                } else {
                    cmd.args(&form).args(after);
                }
                commands.push((format!("{command} {form:?}"), cmd));
            }
            if let Some(var) = run_env(input).filter(|_| command == "run") {
                let mut cmd = cli(db, &before);
                cmd.env(var, value);
                commands.push((format!("{command} {var}={value:?}"), cmd));
            }
        }
    }

    let (mut accepted, mut refused) = (0, 0);
    for (what, mut cmd) in commands {
        let before = snapshot(db);
        let out = cmd
            .timeout(Duration::from_secs(20))
            .output()
            .unwrap_or_else(|e| panic!("{what}: did not finish: {e}"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.code().is_some() && out.status.code() != Some(101),
            "{what}: {:?}: {stderr}",
            out.status
        );
        assert!(!stderr.contains("panicked"), "{what}: {stderr}");
        match out.status.code() {
            Some(0) => accepted += 1,
            Some(1 | 2) => {
                refused += 1;
                let lines: Vec<&str> = stderr.lines().collect();
                assert_eq!(lines.len(), 1, "{what}: not one line: {stderr:?}");
                assert!(lines[0].starts_with("leasehold: "), "{what}: {stderr:?}");
                assert_eq!(snapshot(db), before, "{what} was refused but wrote");
            }
            other => panic!("{what}: exit {other:?}: {stderr}"),
        }
    }
    // Some values are legitimately valid (`--priority 9223372036854775807`,
    // `--reclaim-batch 0`), most are not.
    assert!(accepted > 0 && refused > accepted, "{accepted} {refused}");
}
