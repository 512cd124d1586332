//! What a one-shot write pushes to disk, read from the system calls of the real command under
//! `strace`: one flush, its commit's, beside a running runner; and a new WAL's folder flushed
//! before anything is committed into it (leasehold's builds compile SQLite without its own
//! flush of the folder, see `sync_folder_of_new_wal` in src/store/open.rs).

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use crate::helper::{add, cli, idle_runner, inspect, ok, stop};
use crate::util::{TestDb, leasehold_vars};

/// One file flushed to disk, in the order the command flushed them.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    /// The file at this path was opened (or created).
    Opened(String),
    /// The file at this path was flushed (`fsync`, `fdatasync`).
    Flushed(String),
}

/// Runs `leasehold --db DB ARGS` under strace and returns what it opened and flushed, in order,
/// each by path, and its stdout. Panics (failing the test) when strace is missing: `.ci/run`
/// installs it.
fn traced(db: &Path, args: &[&str]) -> (Vec<Event>, String) {
    let trace = db.with_extension("strace");
    let mut cmd = Command::new("strace");
    cmd.args(["-qq", "-e", "signal=none", "-e"])
        .arg("trace=openat,open,close,fsync,fdatasync,sync_file_range,syncfs")
        .arg("-o")
        .arg(&trace)
        .arg(assert_cmd::cargo::cargo_bin("leasehold"))
        .arg("--db")
        .arg(db)
        .args(args);
    for var in leasehold_vars() {
        cmd.env_remove(var);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("strace runs ({e}); .ci/run installs Debian's strace"));
    assert!(
        out.status.success(),
        "{cmd:?}: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&trace).expect("strace wrote its log");
    let stdout = String::from_utf8(out.stdout).expect("stdout is UTF-8");
    (parse(&text), stdout)
}

/// The id a `jobs add` printed.
fn id(stdout: &str) -> i64 {
    stdout
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("an id: {stdout:?}"))
}

/// Reads strace's lines into events, following which path each descriptor is.
fn parse(text: &str) -> Vec<Event> {
    let mut open: HashMap<String, String> = HashMap::new();
    let mut events = Vec::new();
    for line in text.lines() {
        // strace pads the call before its result: `fsync(4)      = 0`.
        let Some((call, result)) = line.rsplit_once(" = ") else {
            continue;
        };
        let call = call.trim_end();
        let result = result.split_whitespace().next().unwrap_or("");
        if line.starts_with("openat(") || line.starts_with("open(") {
            let path = call.split('"').nth(1).expect("an open names its path");
            if result.parse::<i32>().is_ok_and(|fd| fd >= 0) {
                open.insert(result.to_string(), path.to_string());
                events.push(Event::Opened(path.to_string()));
            }
        } else if let Some(fd) = line.strip_prefix("close(") {
            open.remove(fd.split(')').next().unwrap_or(""));
        } else if ["fsync(", "fdatasync(", "sync_file_range(", "syncfs("]
            .iter()
            .any(|p| line.starts_with(p))
        {
            let fd = call
                .split('(')
                .nth(1)
                .unwrap_or("")
                .split([',', ')'])
                .next();
            let path = fd
                .and_then(|fd| open.get(fd))
                .unwrap_or_else(|| panic!("a flush of a descriptor not seen opened: {line}"));
            events.push(Event::Flushed(path.clone()));
        }
    }
    events
}

fn flushes(events: &[Event]) -> Vec<&str> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Flushed(p) => Some(p.as_str()),
            Event::Opened(_) => None,
        })
        .collect()
}

fn wal(db: &Path) -> String {
    format!("{}-wal", db.display())
}

fn folder(db: &Path) -> String {
    db.parent().expect("in a folder").display().to_string()
}

/// Where the first event matching `f` is, failing the test with the events when none does.
fn position(events: &[Event], what: &str, f: impl Fn(&Event) -> bool) -> usize {
    events
        .iter()
        .position(f)
        .unwrap_or_else(|| panic!("no {what} in {events:#?}"))
}

/// The folder is flushed after the WAL is opened and before the WAL's first flush (a commit).
fn assert_folder_flushed_before_first_commit(db: &Path, events: &[Event]) {
    let (wal, folder) = (wal(db), folder(db));
    let opened = position(events, "open of the WAL", |e| {
        *e == Event::Opened(wal.clone())
    });
    let folder_flush = position(events, "flush of the folder", |e| {
        *e == Event::Flushed(folder.clone())
    });
    let commit = position(events, "flush of the WAL", |e| {
        *e == Event::Flushed(wal.clone())
    });
    assert!(
        opened < folder_flush && folder_flush < commit,
        "the folder must be flushed after the WAL is opened and before its first commit: \
         {events:#?}"
    );
}

#[test]
fn a_one_shot_write_beside_a_runner_flushes_once_its_commit() {
    let t = TestDb::new();
    let db = t.path.as_path();
    ok(&mut cli(db, &["db", "migrate"]));
    let runner = idle_runner(db);
    let id = add(db, &["--queue", "here"], &["true"]);

    let (events, _) = traced(db, &["jobs", "cancel", &id.to_string()]);
    assert_eq!(
        flushes(&events),
        [wal(db).as_str()],
        "one flush, the commit's: {events:#?}"
    );
    assert_eq!(inspect(db, id)["status"], "cancelled");
    stop(runner);
}

#[test]
fn a_jobs_add_beside_a_runner_is_handed_over_and_opens_no_database() {
    let t = TestDb::new();
    let db = t.path.as_path();
    ok(&mut cli(db, &["db", "migrate"]));
    let runner = idle_runner(db);

    let (events, stdout) = traced(db, &["jobs", "add", "--queue", "here", "--", "true"]);
    let ours = |e: &Event| match e {
        Event::Opened(p) | Event::Flushed(p) => {
            p.starts_with(&db.display().to_string()) && !p.contains("-wake")
        }
    };
    assert!(
        !events.iter().any(ours) && flushes(&events).is_empty(),
        "the command neither opens the database nor flushes anything: {events:#?}"
    );
    // The runner stored it before it answered: it is there, with its event.
    let id = id(&stdout);
    let job = inspect(db, id);
    assert_eq!(job["status"], "pending");
    assert_eq!(job["queue"], "here");
    stop(runner);
}

#[test]
fn a_new_wal_has_its_folder_flushed_before_the_first_commit() {
    // A new file: `db migrate` creates the WAL and commits the schema into it.
    let t = TestDb::new();
    let db = t.path.as_path();
    let (events, _) = traced(db, &["db", "migrate"]);
    assert_folder_flushed_before_first_commit(db, &events);

    // With no runner, the migration's connection emptied and deleted the WAL as it closed:
    // the next command's connection makes a new one.
    assert!(!Path::new(&wal(db)).exists(), "the WAL was deleted");
    let (events, stdout) = traced(db, &["jobs", "add", "--", "true"]);
    assert_folder_flushed_before_first_commit(db, &events);
    assert_eq!(inspect(db, id(&stdout))["status"], "pending");
}
