//! A real PostgreSQL server for the tests: its URL, a fresh database per test, and a restart.
//!
//! The server is the throwaway cluster of `.ci/pg` (`.ci/test`, the README's test command,
//! starts it and exports its URL as `LEASEHOLD_TEST_PG`); any server whose URL names a superuser, or a role that may create
//! databases, serves as well, except for [`restart_server`].

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use postgres::{Client, NoTls};

/// The environment variable that holds the test server's URL.
pub const TEST_PG_ENV: &str = "LEASEHOLD_TEST_PG";

/// The URL of the test server: `LEASEHOLD_TEST_PG`. Fails the test, saying how to start one,
/// when it is not set: a PostgreSQL test never skips silently.
pub fn server_url() -> String {
    match std::env::var(TEST_PG_ENV) {
        Ok(url) if !url.trim().is_empty() => url.trim().to_string(),
        _ => panic!(
            "{TEST_PG_ENV} is not set: this test needs a PostgreSQL server; run the suite with \
             `bash .ci/test`, which starts one, or start one with \
             `export {TEST_PG_ENV}=$(bash .ci/pg start)` (and `bash .ci/pg stop` after)"
        ),
    }
}

/// A new connection to `url`, failing the test with the URL and the cause when it cannot open.
pub fn connect(url: &str) -> Client {
    Client::connect(url, NoTls)
        .unwrap_or_else(|e| panic!("cannot connect to the test server at {url}: {e}"))
}

/// A database of its own for one test, dropped (with its connections) when this is dropped.
pub struct TestDb {
    /// The database's URL: the server's, naming this database.
    pub url: String,
    name: String,
}

impl TestDb {
    /// The database's name on the server.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A new connection to this database.
    pub fn connect(&self) -> Client {
        connect(&self.url)
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // WITH (FORCE) ends what a test left connected (a runner it killed, a client it kept).
        // No panic here: this runs as a failed test unwinds too, and a second panic aborts.
        let dropped = Client::connect(&server_url(), NoTls).and_then(|mut admin| {
            admin.batch_execute(&format!(
                "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                self.name
            ))
        });
        if let Err(e) = dropped {
            eprintln!("cannot drop the test database {}: {e}", self.name);
        }
        // What this host's runners kept for it (wake-up sockets, attempts' files).
        for folder in leasehold::local_folders(&self.url) {
            let _ = std::fs::remove_dir_all(folder);
        }
    }
}

/// Creates a database of its own for one test and returns it; it is dropped with the value.
///
/// Its name is `hint` (lowercased, with anything but letters, digits and `_` made `_`), then the
/// process id, a counter and the process's start time, so that tests in one binary, binaries
/// run at once and a rerun after a crash that left databases behind never collide.
pub fn fresh_db(hint: &str) -> TestDb {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static STARTED: std::sync::OnceLock<u128> = std::sync::OnceLock::new();
    let started = STARTED.get_or_init(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis())
    });
    let hint: String = hint
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '_') => c,
            _ => '_',
        })
        .take(24)
        .collect();
    let name = format!(
        "lh_{hint}_{}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        started % 1_000_000_000
    );
    let server = server_url();
    connect(&server)
        .batch_execute(&format!("CREATE DATABASE \"{name}\""))
        .unwrap_or_else(|e| panic!("cannot create the test database {name} on {server}: {e}"));
    TestDb {
        url: with_database(&server, &name),
        name,
    }
}

/// `url` with its database (the path) replaced by `database`; its query string is kept.
pub fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_at = base.find("://").map_or(0, |i| i + 3);
    let server = match base[authority_at..].find('/') {
        Some(slash) => &base[..authority_at + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{server}/{database}?{query}"),
        None => format!("{server}/{database}"),
    }
}

/// The `.ci/pg` script of this repository.
pub fn pg_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci/pg")
}

/// Restarts the test server (`bash .ci/pg restart`: `pg_ctl restart -m fast`), which ends every
/// connection to it. Returns once the server accepts connections again.
///
/// Only for the cluster of `.ci/pg` (`LEASEHOLD_TEST_PG` must be the URL it wrote), and only
/// from a test binary whose other tests do not use the server meanwhile: their connections are
/// cut too.
pub fn restart_server() {
    let server = server_url();
    let dir = std::env::var("LEASEHOLD_PG_DIR").unwrap_or_else(|_| "/tmp/leasehold-pg".into());
    let written = std::fs::read_to_string(Path::new(&dir).join("url")).unwrap_or_default();
    assert_eq!(
        written.trim(),
        server,
        "restart_server restarts the cluster of .ci/pg, whose URL is in {dir}/url, \
         but {TEST_PG_ENV} names another server"
    );
    let status = Command::new("bash")
        .arg(pg_script())
        .arg("restart")
        .status()
        .expect("bash runs .ci/pg");
    assert!(status.success(), "bash .ci/pg restart failed: {status}");
}

/// How many connections to `client`'s database wait for a lock another transaction holds (a
/// row lock, an advisory lock), as `pg_stat_activity` shows them now.
pub fn lock_waiters(client: &mut Client) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
            &[],
        )
        .and_then(|r| r.try_get(0))
        .expect("pg_stat_activity")
}

/// Runs `work` on a thread of its own while `holder`, a connection of the test in an open
/// transaction, holds a lock: once `work` has returned, or some connection waits for a lock
/// (10 s at most), commits `holder` and returns whether `work` waited, with what it returned.
/// Whether it waited is known without timing anything, and a `work` that waits fails its test
/// at once rather than when a deadline passes.
pub fn behind_lock<T: Send>(
    db: &TestDb,
    holder: &mut Client,
    work: impl FnOnce() -> T + Send,
) -> (bool, T) {
    let mut watcher = db.connect();
    std::thread::scope(|scope| {
        let worker = scope.spawn(work);
        let waited = super::poll(std::time::Duration::from_secs(10), || {
            if worker.is_finished() {
                return Some(false);
            }
            (lock_waiters(&mut watcher) > 0).then_some(true)
        });
        // Released before any assertion: a `work` still waiting then ends, and the scope
        // can join it.
        holder
            .batch_execute("COMMIT")
            .expect("the holding transaction commits");
        let done = worker
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        let waited = waited.expect("the work returns, or waits for a lock, within 10 s");
        (waited, done)
    })
}
