//! What only the PostgreSQL backend has: calls from inside an embedder's async runtime, and a
//! connection lost under a running runner.

use leasehold::{Job, OpenOptions, Outcome, Status, Store};

use crate::helper::{WAIT, fast, outcome};
use crate::util::{TestDb, wait_for};

/// The synchronous `postgres` crate runs a runtime of its own, which panics when it is
/// started from a thread that already runs one. An embedder calling from a tokio task gets
/// working calls: the store opens, enqueues, reads and closes, on a current-thread runtime and
/// on a multi-thread one, and a runner started outside takes jobs enqueued inside.
#[test]
fn calls_from_inside_an_async_runtime_work() {
    let db = TestDb::postgres("async_runtime");
    let target = db.target();
    let runner = fast(&target).start().expect("the runner starts");
    let runtimes = [
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a current-thread runtime"),
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .expect("a multi-thread runtime"),
    ];
    for rt in runtimes {
        let (from_store, from_runner) = rt.block_on(async {
            let task = tokio::spawn({
                let target = target.clone();
                async move {
                    let store = Store::open_with(&target, &OpenOptions::default())
                        .expect("opened from a task");
                    let id = store
                        .enqueue(&Job::shell("exit 0"))
                        .expect("enqueued from a task");
                    assert_eq!(store.job(id).expect("read from a task").id, id);
                    id
                    // The store is dropped here, inside the task: its client closes too.
                }
            });
            let from_store = task.await.expect("the task ends");
            let from_runner = runner
                .enqueue(&Job::shell("exit 0"))
                .expect("Runner::enqueue from inside the runtime");
            (from_store, from_runner)
        });
        for id in [from_store, from_runner] {
            assert!(
                matches!(outcome(&runner, id), Outcome::Succeeded),
                "job {id}"
            );
        }
    }
    runner.shutdown().expect("the runner stops");
}

/// Every connection of a running runner, and of a store, is cut (the server ends them, as a
/// restart does): the runner connects again, the job enqueued meanwhile runs, once, and the
/// store's next read connects again instead of failing.
#[test]
fn a_runner_connects_again_after_its_connections_are_cut() {
    let db = TestDb::postgres("cut");
    let target = db.target();
    let runner = fast(&target).start().expect("the runner starts");
    let first = runner.enqueue(&Job::shell("exit 0")).expect("enqueue");
    assert!(matches!(outcome(&runner, first), Outcome::Succeeded));
    let kept = db.store();
    assert_eq!(kept.job(first).expect("read").status, Status::Succeeded);

    let pg = db.pg.as_ref().expect("a PostgreSQL test");
    let ended: i64 = cut_connections(pg).expect("the runner's connections are ended");
    assert!(ended >= 1, "the runner had connections: {ended}");

    let store = db.store();
    let second = store.enqueue(&Job::shell("exit 0")).expect("enqueue");
    let job = wait_for("the job enqueued after the cut ends", WAIT, || {
        let job = store.job(second).ok()?;
        (job.status == Status::Succeeded).then_some(job)
    });
    assert_eq!(job.attempt, 1, "run once");
    assert_eq!(
        kept.job(first).expect("a read after the cut").status,
        Status::Succeeded
    );
    // The runner keeps going: a third job runs too.
    let third = runner.enqueue(&Job::shell("exit 0")).expect("enqueue");
    assert!(matches!(outcome(&runner, third), Outcome::Succeeded));
    runner.shutdown().expect("the runner stops");
}

/// Before a poll this slow could find a job, only an announcement explains its start.
const SLOW_POLL: std::time::Duration = std::time::Duration::from_secs(60);
/// Well inside [`SLOW_POLL`]: a job that started by then was woken, not polled for.
const BEFORE_THE_POLL: std::time::Duration = std::time::Duration::from_secs(15);

/// Waits until job `id` has started (before the poll could have found it).
fn started(store: &Store, id: i64) -> leasehold::JobRecord {
    wait_for("the job to start before any poll", BEFORE_THE_POLL, || {
        let job = store.job(id).ok()?;
        job.started_at.map(|_| job)
    })
}

/// Jobs enqueued through another connection (no runner's own enqueue, no socket poke on
/// PostgreSQL) wake idle runners by `NOTIFY`: two runners of one worker each, polling once a
/// minute, both take a long job within seconds. The listening connection is then cut (the
/// server ends every connection of the database, as a restart does): the runner listens
/// again, and a job enqueued after the cut starts before any poll too.
#[test]
fn announcements_wake_idle_runners_and_survive_a_cut() {
    let db = TestDb::postgres("notify");
    let target = db.target();
    let slow = || {
        fast(&target)
            .workers(1)
            .poll_interval(SLOW_POLL)
            .start()
            .expect("a runner starts")
    };
    let (a, b) = (slow(), slow());
    let store = db.store();
    let pg = db.pg.as_ref().expect("a PostgreSQL test");
    let listeners = || -> i64 {
        pg.connect()
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND query LIKE 'LISTEN %'",
                &[],
            )
            .and_then(|r| r.try_get(0))
            .expect("pg_stat_activity")
    };
    wait_for("both runners listen", WAIT, || {
        (listeners() == 2).then_some(())
    });
    let ids: Vec<i64> = (0..2)
        .map(|_| store.enqueue(&Job::shell("sleep 1")).expect("enqueue"))
        .collect();
    let workers: std::collections::HashSet<String> = ids
        .iter()
        .map(|&id| started(&store, id).worker_id.expect("a runner's"))
        .collect();
    assert_eq!(workers.len(), 2, "each runner was woken and took one");
    for id in ids {
        assert!(matches!(outcome(&a, id), Outcome::Succeeded), "job {id}");
    }

    let cut: i64 = cut_connections(pg).expect("the connections are ended");
    assert!(cut >= 2, "the listeners were among them: {cut}");
    let after = db
        .store()
        .enqueue(&Job::shell("exit 0"))
        .expect("enqueue after the cut");
    started(&db.store(), after);
    assert!(matches!(outcome(&a, after), Outcome::Succeeded));
    wait_for("both runners listen again", WAIT, || {
        (listeners() == 2).then_some(())
    });
    a.shutdown().expect("runner a stops");
    b.shutdown().expect("runner b stops");
    assert_eq!(listeners(), 0, "a stopped runner listens no more");
}

/// Hosts' clocks differ from the server's, whose clock every lease is written in: a runner on
/// a host a minute ahead of the server, and one on a host a minute behind (the server's
/// `leasehold_now_ms()` is moved, as a skewed host would see it), runs its jobs once each, and
/// its leases in the database stay the server's. A runner that counted a lease in the
/// server's time by its own clock took a lease a minute in the past for a lost one and never
/// started anything; one a minute in the future would fence itself a minute late.
#[test]
fn jobs_run_once_whether_the_servers_clock_is_ahead_or_behind() {
    for skew_ms in [-60_000i64, 60_000] {
        let db = TestDb::postgres("skew");
        let store = db.store();
        db.exec(&format!(
            "CREATE OR REPLACE FUNCTION leasehold_now_ms() RETURNS BIGINT
                 LANGUAGE sql VOLATILE PARALLEL SAFE
                 AS $$ SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint
                              + ({skew_ms}) $$"
        ));
        let runner = fast(&db.target()).start().expect("the runner starts");
        let ids: Vec<i64> = (0..4)
            .map(|_| runner.enqueue(&Job::shell("sleep 0.3")).expect("enqueue"))
            .collect();
        // While running, the lease is in the server's time.
        let running = wait_for("a job to run", WAIT, || {
            ids.iter()
                .filter_map(|&id| store.job(id).ok())
                .find(|j| j.status == Status::Running && j.lease_expires_at.is_some())
        });
        let server_now = db.scalar("SELECT leasehold_now_ms()");
        let left = running.lease_expires_at.expect("a lease") - server_now;
        assert!(
            (0..=3_000).contains(&left),
            "skew {skew_ms}: the lease ends {left} ms from the server's now"
        );
        for &id in &ids {
            assert!(
                matches!(outcome(&runner, id), Outcome::Succeeded),
                "skew {skew_ms}: job {id}"
            );
            assert_eq!(store.job(id).expect("job").attempt, 1, "skew {skew_ms}");
        }
        runner.shutdown().expect("the runner stops");
    }
}

/// Ends every other connection to the test's database, as a server restart does; returns
/// how many it ended.
fn cut_connections(pg: &crate::util::pg::TestDb) -> Result<i64, postgres::Error> {
    pg.connect()
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
            &[],
        )
        .and_then(|r| r.try_get(0))
}
