//! A damaged database file (issue 36): a page of noise over a b-tree page of `jobs`, and the
//! sweep of every truncation at a page boundary and every page overwritten with noise. On each,
//! `status` and `run --until-idle` either work or refuse in one line with the documented exit
//! code; nothing panics or hangs, and a command that refuses leaves the file's bytes as they
//! were (its WAL too).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::helper::{FAST, add, cli, ok, run_until_idle, wait_running};
use crate::util::{RunnerProcess, TestDb, bare, leasehold_vars, poll};

/// The exit code of a command that found the database damaged (README, *Exit codes*).
const DAMAGED: i32 = 3;
/// SQLite's page size for leasehold's files.
const PAGE: usize = 4096;
/// How long one command of the sweep may take before it counts as a hang (a working
/// `run --until-idle` on the fixture takes well under a second).
const HANG: Duration = Duration::from_secs(20);

/// A database of about 60 to 100 pages, its WAL checkpointed into the file: finished jobs with
/// output (succeeded and failed), pending jobs, and one running job whose runner was killed
/// (its lease still held), its command gone too.
fn fixture(t: &TestDb) -> Vec<u8> {
    let db = t.path.as_path();
    ok(&mut cli(db, &["db", "migrate"]));
    let finished: String = (0..24)
        .map(|i| format!("seq 1 {}; echo done {i}\n", 200 + i * 10))
        .collect();
    ok(cli(db, &["jobs", "add", "--from-file", "-"]).write_stdin(finished));
    add(
        db,
        &["--max-attempts", "1"],
        &["sh", "-c", "seq 1 300 >&2; exit 3"],
    );
    run_until_idle(db, &["--workers", "4"]);
    // Once this exists, the held job ends at once when it runs again.
    let go = t.sibling("go");
    let held = add(
        db,
        &[],
        &[
            "sh",
            "-c",
            &format!("[ -e {} ] || exec sleep 1000", go.display()),
        ],
    );
    let mut runner = RunnerProcess::start(db, &["--no-keepers", "--lease-ttl", "600"]);
    let job = wait_running(db, held);
    runner.crash();
    let pgid = job["pgid"].as_i64().expect("a running job has a pgid");
    let _ = kill(Pid::from_raw(-(pgid as i32)), Signal::SIGKILL);
    std::fs::write(&go, "").unwrap();
    let pending: String = (0..10).map(|i| format!("echo pending {i}\n")).collect();
    ok(cli(db, &["jobs", "add", "--from-file", "-"]).write_stdin(pending));
    {
        let conn = bare(db);
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
    }
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(wal_or_shm(db, suffix));
    }
    let bytes = std::fs::read(db).unwrap();
    assert_eq!(bytes.len() % PAGE, 0, "whole pages");
    bytes
}

fn wal_or_shm(db: &Path, suffix: &str) -> PathBuf {
    let mut s = db.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// A fixed-seed xorshift: the same noise on every run.
struct Noise(u64);

impl Noise {
    fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            *b = (self.0 >> 24) as u8;
        }
    }
}

/// The copy with page `page` (from 0) overwritten with noise.
fn with_noise(bytes: &[u8], page: usize, noise: &mut Noise) -> Vec<u8> {
    let mut copy = bytes.to_vec();
    noise.fill(&mut copy[page * PAGE..(page + 1) * PAGE]);
    copy
}

/// The bytes of the file and of its WAL, if any.
fn state(db: &Path) -> (Vec<u8>, Vec<u8>) {
    (
        std::fs::read(db).unwrap_or_default(),
        std::fs::read(wal_or_shm(db, "-wal")).unwrap_or_default(),
    )
}

/// Runs `leasehold --db DB ARGS`, killed after `HANG`: its exit code (`None` for a hang) and
/// stderr.
fn run_bounded(db: &Path, args: &[&str]) -> (Option<i32>, String) {
    let err = wal_or_shm(db, ".stderr");
    let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("leasehold"));
    for var in leasehold_vars() {
        cmd.env_remove(var);
    }
    let mut child = cmd
        .arg("--db")
        .arg(db)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("leasehold starts");
    let status = poll(HANG, || {
        child.try_wait().expect("the command can be waited for")
    });
    let code = match status {
        Some(s) => s.code(),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            None
        }
    };
    (code, std::fs::read_to_string(&err).unwrap_or_default())
}

/// What is wrong with one command's run on a damaged copy, if anything.
fn judge(
    what: &str,
    before: &(Vec<u8>, Vec<u8>),
    db: &Path,
    code: Option<i32>,
    stderr: &str,
) -> Option<(&'static str, String)> {
    let said = |kind: &'static str| Some((kind, format!("{what}: {kind}: {code:?} {stderr:?}")));
    let Some(code) = code else {
        return said("hang");
    };
    if stderr.contains("panicked") {
        return said("panic");
    }
    if code == 0 {
        return None;
    }
    // A runner logs before it refuses; the refusal is one line, the last.
    let refusals: Vec<&str> = stderr.lines().filter(|l| !l.starts_with('[')).collect();
    if refusals.len() != 1 || !stderr.trim_end().ends_with(refusals[0]) {
        return said("not one line");
    }
    let line = refusals[0];
    // Noise over the header makes a file that is no database; a file truncated to nothing
    // is an empty one, with no schema yet.
    let documented = code == DAMAGED && line.contains("damaged") && line.contains("db check")
        || code == 1 && line.contains("not a leasehold database")
        || code == 1 && line.contains("run `leasehold db migrate`");
    if !documented {
        return said("undocumented refusal");
    }
    if state(db) != *before {
        return said("wrote to a file it refused");
    }
    None
}

#[test]
fn noise_over_the_root_page_of_jobs_stops_a_runner_at_once_in_one_line() {
    let t = TestDb::new();
    let bytes = fixture(&t);
    let root: i64 = bare(&t.path)
        .query_row(
            "SELECT rootpage FROM sqlite_master WHERE name = 'jobs'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let db = t.sibling("damaged.db");
    std::fs::write(&db, with_noise(&bytes, root as usize - 1, &mut Noise(36))).unwrap();
    let before = state(&db);
    let shown = db.display().to_string();

    let (code, stderr) = run_bounded(&db, &["status"]);
    assert_eq!(code, Some(DAMAGED), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&shown) && stderr.contains("db check"),
        "{stderr}"
    );

    let started = Instant::now();
    let mut args = vec!["run", "--until-idle"];
    args.extend_from_slice(&FAST);
    let (code, stderr) = run_bounded(&db, &args);
    assert_eq!(code, Some(DAMAGED), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(10), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("leasehold: ") && last.contains(&shown),
        "{stderr}"
    );
    assert!(
        !stderr.contains("cannot tell whether jobs are left"),
        "{stderr}"
    );
    assert!(state(&db) == before, "the runner wrote to the damaged file");

    let (code, report) = {
        let out = cli(&db, &["db", "check"]).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    assert_eq!(code, Some(DAMAGED), "{report}");
    assert!(
        !report.trim().is_empty() && !report.contains("\nok"),
        "{report}"
    );
    assert!(state(&db) == before, "db check wrote to the file");
    // The undamaged file checks clean.
    let out = ok(&mut cli(&t.path, &["db", "check"]));
    assert!(out.contains("ok"), "{out}");
}

#[test]
fn every_truncation_and_every_page_of_noise_is_worked_or_refused_in_one_line() {
    let t = TestDb::new();
    let bytes = fixture(&t);
    let pages = bytes.len() / PAGE;
    // The intact file works, with every job run.
    let mut run = vec!["run", "--until-idle", "--workers", "2"];
    run.extend_from_slice(&FAST);
    let intact = t.sibling("intact.db");
    std::fs::write(&intact, &bytes).unwrap();
    for args in [&["status"][..], &run[..]] {
        let (code, stderr) = run_bounded(&intact, args);
        assert_eq!(code, Some(0), "{args:?}: {stderr}");
    }
    assert!((50..=110).contains(&pages), "{pages} pages");
    let mut noise = Noise(0x5eed_0036);
    let mut copies: Vec<(String, Vec<u8>)> = (0..pages)
        .map(|p| (format!("truncated-at-page-{p}"), bytes[..p * PAGE].to_vec()))
        .collect();
    copies.extend((0..pages).map(|p| {
        (
            format!("noise-on-page-{}", p + 1),
            with_noise(&bytes, p, &mut noise),
        )
    }));

    let started = Instant::now();
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let outcomes = Mutex::new(std::collections::BTreeMap::new());
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((name, copy)) = copies.get(i) else {
                        break;
                    };
                    let dir = t.dir.path().join(name);
                    std::fs::create_dir(&dir).unwrap();
                    let db = dir.join("jobs.db");
                    std::fs::write(&db, copy).unwrap();
                    for args in [&["status"][..], &run[..]] {
                        let before = state(&db);
                        let (code, stderr) = run_bounded(&db, args);
                        let what = format!("{name} {}", args[0]);
                        *outcomes.lock().unwrap().entry((args[0], code)).or_insert(0) += 1;
                        if let Some(f) = judge(&what, &before, &db, code, &stderr) {
                            failures.lock().unwrap().push(f);
                        }
                    }
                    let _ = std::fs::remove_dir_all(&dir);
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    let mut counts = std::collections::BTreeMap::new();
    for (kind, what) in &failures {
        let command = if what.contains(" run: ") {
            "run"
        } else {
            "status"
        };
        *counts.entry((*kind, command)).or_insert(0) += 1;
    }
    eprintln!(
        "swept {} copies of a {pages}-page file in {:?}: exit codes {:?}, failures {counts:?}",
        copies.len(),
        started.elapsed(),
        outcomes.into_inner().unwrap()
    );
    let shown: Vec<&String> = failures.iter().map(|(_, f)| f).take(12).collect();
    assert!(failures.is_empty(), "{counts:?}: {shown:#?}");
}

#[test]
fn a_runner_that_meets_damage_while_it_runs_stops_at_once_and_kills_its_attempts() {
    let t = TestDb::new();
    let db = t.path.as_path();
    ok(&mut cli(db, &["db", "migrate"]));
    let id = add(db, &[], &["sleep", "1000"]);
    let mut args = FAST.to_vec();
    args.extend(["--shutdown-grace", "2"]);
    let mut runner = RunnerProcess::start(db, &args);
    let pid = wait_running(db, id)["pid"]
        .as_i64()
        .expect("a running job has a pid") as i32;
    // Every page but the header: the next read the WAL does not answer meets the noise.
    let len = std::fs::metadata(db).unwrap().len() as usize;
    let mut noise = Noise(0xdead);
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut file = std::fs::OpenOptions::new().write(true).open(db).unwrap();
        let mut page = vec![0u8; PAGE];
        for p in 1..len / PAGE {
            noise.fill(&mut page);
            file.seek(SeekFrom::Start((p * PAGE) as u64)).unwrap();
            file.write_all(&page).unwrap();
        }
    }
    let (code, log) = runner.wait(Duration::from_secs(20));
    assert_eq!(code, Some(DAMAGED), "{log}");
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("leasehold: ")
            && last.contains(&db.display().to_string())
            && last.contains("db check"),
        "{log}"
    );
    let gone = poll(Duration::from_secs(10), || {
        kill(Pid::from_raw(pid), None).is_err().then_some(())
    });
    assert!(
        gone.is_some(),
        "the attempt's process {pid} was left running"
    );
}

#[test]
fn db_check_reports_in_json_and_is_for_sqlite_files_only() {
    let t = TestDb::new();
    let bytes = fixture(&t);
    let v = crate::helper::json(&mut cli(&t.path, &["db", "check", "--quick", "--json"]));
    assert_eq!(v, serde_json::json!({"ok": true, "found": ["ok"]}));
    // Noise over the last page, a leaf: the check names what it found.
    let db = t.sibling("damaged.db");
    let pages = bytes.len() / PAGE;
    std::fs::write(&db, with_noise(&bytes, pages - 1, &mut Noise(7))).unwrap();
    let before = state(&db);
    let out = cli(&db, &["db", "check", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(DAMAGED));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], false, "{v}");
    assert!(!v["found"].as_array().unwrap().is_empty(), "{v}");
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
    assert!(state(&db) == before, "db check wrote to the file");
    let line = crate::helper::fails(
        &mut cli(
            Path::new("postgres://nobody@127.0.0.1:1/none"),
            &["db", "check"],
        ),
        1,
    );
    assert!(line.contains("SQLite file"), "{line}");
}
