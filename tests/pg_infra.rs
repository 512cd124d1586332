//! The PostgreSQL test infrastructure (`tests/util/pg.rs`) on the real server of `.ci/pg`: a
//! fresh database per test, isolated from the others and dropped after, and a server restart
//! that the tests reconnect after. In a binary of its own, because the restart cuts every
//! connection to the server.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use postgres::{Client, NoTls};

mod util;

use util::{Watchdog, pg, wait_for};

/// The tests of this binary one at a time: one restarts the server under the others.
static SERVER: Mutex<()> = Mutex::new(());

/// Whether a database named `name` exists on the test server.
fn exists(name: &str) -> bool {
    let mut admin = pg::connect(&pg::server_url());
    let row = admin
        .query_one(
            "SELECT count(*) FROM pg_database WHERE datname = $1",
            &[&name],
        )
        .expect("pg_database can be read");
    row.get::<_, i64>(0) == 1
}

#[test]
fn fresh_databases_are_isolated_dropped_and_reachable_after_a_restart() {
    let _watchdog = Watchdog::new();
    let _one = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let a = pg::fresh_db("infra a");
    let b = pg::fresh_db("infra b");
    assert_ne!(a.url, b.url);
    assert!(exists(a.name()) && exists(b.name()));

    let mut in_a = a.connect();
    in_a.batch_execute(
        "CREATE TABLE t (id bigint PRIMARY KEY, v text NOT NULL); INSERT INTO t VALUES (1, 'in a')",
    )
    .expect("a table and a row can be written in a");
    let mut in_b = b.connect();
    let tables: i64 = in_b
        .query_one("SELECT count(*) FROM pg_tables WHERE tablename = 't'", &[])
        .expect("pg_tables can be read")
        .get(0);
    assert_eq!(tables, 0, "a's table is not in b");
    in_b.batch_execute("CREATE TABLE t (id bigint PRIMARY KEY, v text NOT NULL)")
        .expect("b can have a table of the same name");
    let rows: i64 = in_b
        .query_one("SELECT count(*) FROM t", &[])
        .expect("b's table can be read")
        .get(0);
    assert_eq!(rows, 0, "a's row is not in b");

    pg::restart_server();
    assert!(
        in_a.query_one("SELECT 1", &[]).is_err(),
        "a connection from before the restart is cut"
    );
    let mut again = wait_for(
        "a connection to a after the restart",
        Duration::from_secs(30),
        || Client::connect(&a.url, NoTls).ok(),
    );
    let v: String = again
        .query_one("SELECT v FROM t WHERE id = 1", &[])
        .expect("a's row can be read after the restart")
        .get(0);
    assert_eq!(v, "in a", "the committed row survived the restart");

    // Dropped with a connection still open on it: DROP DATABASE ... WITH (FORCE) ends it.
    let (a_name, b_name) = (a.name().to_string(), b.name().to_string());
    drop(a);
    drop(b);
    assert!(
        !exists(&a_name) && !exists(&b_name),
        "both databases are dropped"
    );
    assert!(
        again.query_one("SELECT 1", &[]).is_err(),
        "their connections are ended"
    );
}

#[test]
fn a_fresh_database_is_created_and_dropped_in_well_under_a_second() {
    let _watchdog = Watchdog::new();
    let _one = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let rounds = 20;
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    for _ in 0..rounds {
        let one = Instant::now();
        let db = pg::fresh_db("timing");
        let name = db.name().to_string();
        drop(db);
        slowest = slowest.max(one.elapsed());
        assert!(!exists(&name));
    }
    let mean = started.elapsed() / rounds;
    eprintln!("pg_infra: create+drop of a database: mean {mean:?}, slowest {slowest:?}");
    assert!(
        slowest < Duration::from_secs(5),
        "a create+drop took {slowest:?}"
    );
}
