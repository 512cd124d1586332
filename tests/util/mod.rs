//! Shared helpers for the integration tests: temporary databases, bare connections, waiting
//! with a deadline, /proc, `leasehold run` processes, a per-test watchdog and a real
//! PostgreSQL server (`pg`).
//!
//! Each test binary includes this module with `#[path = "../util/mod.rs"] mod util;`.

// Each test binary uses its own part of this module, so what one binary leaves unused (an
// item, or its re-export below) is no mistake: `allow`, because `expect` would be unfulfilled
// in the binaries that happen to use all of one kind.
#![allow(dead_code, unused_imports)]

pub mod cluster;
pub mod exposition;
pub mod host;
pub mod pg;
mod proc;
mod runner;
mod span;
pub mod strace;
mod watchdog;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use leasehold::{JobRecord, OpenOptions, Store};
use rusqlite::Connection;
use tempfile::TempDir;

pub use proc::{
    EndMarked, Proc, alive, group_alive, group_members, live_processes, processes_with_env,
    token_alive, token_holders,
};
pub use runner::{RUN_VARS, RunnerProcess, leasehold_vars};
pub use span::{max_overlap, spans, timed};
pub use watchdog::{WATCHDOG_DEFAULT_SECS, WATCHDOG_ENV, Watchdog};

/// A fixed "now" for tests that pass time as a parameter: 2023-11-14T22:13:20Z.
pub const T0: i64 = 1_700_000_000_000;

/// A database for one test: a path in a temporary folder that is removed when this is
/// dropped, or a database of its own on the PostgreSQL test server ([`TestDb::postgres`]).
pub struct TestDb {
    pub dir: TempDir,
    pub path: PathBuf,
    /// Bounds the test that holds this database.
    pub watchdog: Watchdog,
    /// The PostgreSQL database, for a test on that backend.
    pub pg: Option<pg::TestDb>,
}

/// Runs each test written in it on both backends: `fn name(db) { ... }` becomes a test
/// `sqlite::name` on a SQLite file and a test `postgres::name` on a PostgreSQL database of
/// its own, with `db` a [`TestDb`] in the body. One suite, not a copy.
#[macro_export]
macro_rules! on_both {
    ($($(#[$meta:meta])* fn $name:ident($db:ident) $body:block)*) => {
        mod sqlite {
            #[allow(unused_imports)]
            use super::*;
            $($(#[$meta])* #[test] fn $name() { let $db = $crate::util::TestDb::new(); $body })*
        }
        mod postgres {
            #[allow(unused_imports)]
            use super::*;
            $($(#[$meta])* #[test] fn $name() {
                let $db = $crate::util::TestDb::postgres(stringify!($name));
                $body
            })*
        }
    };
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
            pg: None,
        }
    }

    /// A database of its own on the PostgreSQL test server (`hint` names it), empty.
    pub fn postgres(hint: &str) -> TestDb {
        TestDb {
            pg: Some(pg::fresh_db(hint)),
            ..TestDb::new()
        }
    }

    /// What the store opens: the file's path, or the PostgreSQL database's URL.
    pub fn target(&self) -> PathBuf {
        match &self.pg {
            Some(pg) => PathBuf::from(&pg.url),
            None => self.path.clone(),
        }
    }

    /// Whether this test runs on PostgreSQL.
    pub fn is_postgres(&self) -> bool {
        self.pg.is_some()
    }

    /// A new connection with the library's defaults (creates and migrates the database). On
    /// PostgreSQL the store acts at the times the test passes, as on SQLite.
    pub fn store(&self) -> Store {
        self.store_with(&OpenOptions::default())
    }

    /// A new connection with `options` (and, on PostgreSQL, the test's times).
    pub fn store_with(&self, options: &OpenOptions) -> Store {
        let options = options.clone().given_times(true);
        Store::open_with(self.target(), &options).expect("the test database opens")
    }

    /// One integer read with plain SQL, on either backend: what a runbook query sees.
    pub fn scalar(&self, sql: &str) -> i64 {
        match &self.pg {
            Some(pg) => pg
                .connect()
                .query_one(sql, &[])
                .and_then(|row| row.try_get(0))
                .unwrap_or_else(|e| panic!("{sql}: {e}")),
            None => self
                .bare()
                .query_row(sql, [], |r| r.get(0))
                .unwrap_or_else(|e| panic!("{sql}: {e}")),
        }
    }

    /// Runs plain SQL with no result, on either backend: a hand-written runbook UPDATE.
    pub fn exec(&self, sql: &str) {
        match &self.pg {
            Some(pg) => {
                pg.connect()
                    .batch_execute(sql)
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
            }
            None => {
                self.bare()
                    .execute_batch(sql)
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
            }
        }
    }

    /// A plain rusqlite connection, for what the store does not do (breaking rows on purpose).
    pub fn bare(&self) -> Connection {
        bare(&self.path)
    }

    /// Another path in the same temporary folder.
    pub fn sibling(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Job `id` as the database holds it now, read on a new connection.
    pub fn job(&self, id: i64) -> JobRecord {
        self.store().job(id).expect("the job exists")
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

/// The kinds of job `id`'s events, oldest first.
pub fn kinds(store: &Store, id: i64) -> Vec<String> {
    let events = store.events(id).expect("the job's events can be read");
    events.into_iter().map(|e| e.kind.to_string()).collect()
}

/// Polls `f` until it returns `Some` or `timeout` passes; returns what it found.
pub fn poll<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(found) = f() {
            return Some(found);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Polls `check` until it returns true or `timeout` passes; returns whether it did.
pub fn wait_until(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    poll(timeout, || check().then_some(())).is_some()
}

/// Polls `f` until it returns `Some`; fails the test, naming `what`, when `timeout` passes.
pub fn wait_for<T>(what: &str, timeout: Duration, f: impl FnMut() -> Option<T>) -> T {
    poll(timeout, f).unwrap_or_else(|| panic!("timed out waiting for {what}"))
}
