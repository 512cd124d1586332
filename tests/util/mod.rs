//! Shared helpers for the integration tests: temporary databases, bare connections, waiting.

// Each test binary uses its own part of this module.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use leasehold::{OpenOptions, Store};
use rusqlite::Connection;
use tempfile::TempDir;

/// A fixed "now" for tests that pass time as a parameter: 2023-11-14T22:13:20Z.
pub const T0: i64 = 1_700_000_000_000;

/// How long a test may run before its watchdog ends the test process.
pub const WATCHDOG_DEFAULT_SECS: u64 = 120;
/// Overrides [`WATCHDOG_DEFAULT_SECS`].
pub const WATCHDOG_ENV: &str = "LEASEHOLD_TEST_WATCHDOG_SECS";

/// A guard that ends the whole test process, naming the test, when it is not dropped in
/// time: a test that hangs (a claim that never returns, a wait without a deadline) then fails
/// within a bound instead of wedging the test binary for minutes.
///
/// Create it first in a test (the helpers below hold one), so it is dropped last.
pub struct Watchdog {
    // Dropping the sender wakes the watchdog thread, which then exits quietly.
    _disarm: mpsc::Sender<()>,
}

impl Watchdog {
    /// Arms a watchdog for the current test: 120 s, or `LEASEHOLD_TEST_WATCHDOG_SECS`.
    pub fn new() -> Watchdog {
        let secs = std::env::var(WATCHDOG_ENV)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(WATCHDOG_DEFAULT_SECS);
        Watchdog::with_timeout(Duration::from_secs(secs))
    }

    /// Arms a watchdog that fires after `timeout`.
    pub fn with_timeout(timeout: Duration) -> Watchdog {
        // libtest runs each test on a thread named after it.
        let test = std::thread::current()
            .name()
            .unwrap_or("<unnamed test thread>")
            .to_string();
        let (disarm, armed) = mpsc::channel::<()>();
        std::thread::Builder::new()
            .name(format!("watchdog {test}"))
            .spawn(move || {
                if let Err(mpsc::RecvTimeoutError::Timeout) = armed.recv_timeout(timeout) {
                    // Straight to the stderr file: eprintln! would go to the test's captured
                    // output, which is never shown when the process exits.
                    let _ = writeln!(
                        std::io::stderr(),
                        "watchdog: test {test} did not finish within {timeout:?} \
                         (set {WATCHDOG_ENV} to change the bound); ending the test process"
                    );
                    std::process::exit(97);
                }
            })
            .expect("the watchdog thread starts");
        Watchdog { _disarm: disarm }
    }
}

/// A database path in a temporary folder that is removed when this is dropped.
pub struct TestDb {
    pub dir: TempDir,
    pub path: PathBuf,
    /// Bounds the test that holds this database.
    pub watchdog: Watchdog,
}

impl TestDb {
    /// A path to a database that does not exist yet.
    pub fn new() -> TestDb {
        let watchdog = Watchdog::new();
        let dir = tempfile::tempdir().expect("a temporary folder can be created");
        let path = dir.path().join("jobs.db");
        TestDb {
            dir,
            path,
            watchdog,
        }
    }

    /// A new connection with the library's defaults (creates and migrates the file).
    pub fn store(&self) -> Store {
        Store::open(&self.path).expect("the test database opens")
    }

    /// A new connection with `options`.
    pub fn store_with(&self, options: &OpenOptions) -> Store {
        Store::open_with(&self.path, options).expect("the test database opens")
    }

    /// A plain rusqlite connection, for what the store does not do (breaking rows on purpose).
    pub fn bare(&self) -> Connection {
        bare(&self.path)
    }

    /// Another path in the same temporary folder.
    pub fn sibling(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// A plain rusqlite connection on `path` that waits for locks like the store does.
pub fn bare(path: &Path) -> Connection {
    let conn = Connection::open(path).expect("a bare connection opens");
    conn.busy_timeout(Duration::from_secs(10))
        .expect("busy_timeout can be set");
    conn
}

/// Every column of one `jobs` row, as SQLite stores it.
pub fn raw_job_row(conn: &Connection, id: i64) -> Vec<rusqlite::types::Value> {
    let mut stmt = conn
        .prepare("SELECT * FROM jobs WHERE id = ?1")
        .expect("the jobs table exists");
    let n = stmt.column_count();
    stmt.query_row([id], |r| (0..n).map(|i| r.get(i)).collect())
        .expect("the job exists")
}

/// Polls `check` until it returns true or `timeout` passes; returns whether it did.
pub fn wait_until(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// One live (non-zombie) process: its pid and its process group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proc {
    pub pid: i32,
    pub pgid: i32,
}

/// Every live process, read from /proc (zombies are dead: they only wait to be reaped).
pub fn live_processes() -> Vec<Proc> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc")
        .expect("/proc is readable")
        .flatten()
    {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the command name, which may itself hold spaces and parentheses.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() > 2 && fields[0] != "Z" && fields[0] != "X" {
            let pgid = fields[2].parse().unwrap_or(0);
            out.push(Proc { pid, pgid });
        }
    }
    out
}

/// Whether `pid` is a live (non-zombie) process.
pub fn alive(pid: i32) -> bool {
    live_processes().iter().any(|p| p.pid == pid)
}

/// The live members of process group `pgid`.
pub fn group_members(pgid: i64) -> Vec<i32> {
    live_processes()
        .into_iter()
        .filter(|p| i64::from(p.pgid) == pgid)
        .map(|p| p.pid)
        .collect()
}

/// Live processes other than this one whose environment holds `entry` (`NAME=value`) exactly.
pub fn processes_with_env(entry: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    live_processes()
        .into_iter()
        .filter(|p| p.pid != me)
        .filter(|p| {
            std::fs::read(format!("/proc/{}/environ", p.pid))
                .map(|env| env.split(|b| *b == 0).any(|v| v == entry.as_bytes()))
                .unwrap_or(false)
        })
        .map(|p| p.pid)
        .collect()
}
