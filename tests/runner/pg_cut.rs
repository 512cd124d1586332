//! PostgreSQL sessions that the server ends under a runner (an administrator's
//! `pg_terminate_backend`, as a failover or a proxy does): a transaction cut in the middle is
//! never taken for committed, and a start survives its sessions being cut.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use leasehold::{Job, Outcome, Runner};

use crate::helper::outcome;
use crate::util::TestDb;
use crate::util::pg::TestDb as PgDb;

/// A thread that ends, again and again until it is stopped, the sessions of the test's
/// database that leasehold opened (`application_name`) and that match `state` (a condition
/// on `pg_stat_activity`'s `state`); counts those it ended.
struct Cutter {
    stop: Arc<AtomicBool>,
    cut: Arc<AtomicI64>,
    thread: Option<JoinHandle<()>>,
}

impl Cutter {
    fn start(pg: &PgDb, state: &'static str, pause: Duration) -> Cutter {
        let stop = Arc::new(AtomicBool::new(false));
        let cut = Arc::new(AtomicI64::new(0));
        let mut client = pg.connect();
        let thread = {
            let (stop, cut) = (Arc::clone(&stop), Arc::clone(&cut));
            std::thread::spawn(move || {
                let sql = format!(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                     WHERE datname = current_database() AND application_name = 'leasehold'
                       AND pid <> pg_backend_pid() AND {state}"
                );
                let stmt = client.prepare(&sql).expect("the cutter's statement");
                while !stop.load(Ordering::SeqCst) {
                    let n: i64 = client
                        .query_one(&stmt, &[])
                        .and_then(|r| r.try_get(0))
                        .expect("the cutter's query");
                    cut.fetch_add(n, Ordering::SeqCst);
                    if !pause.is_zero() {
                        std::thread::sleep(pause);
                    }
                }
            })
        };
        Cutter {
            stop,
            cut,
            thread: Some(thread),
        }
    }

    /// Stops cutting; returns how many sessions it ended.
    fn stop(mut self) -> i64 {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().expect("the cutter does not panic");
        }
        self.cut.load(Ordering::SeqCst)
    }
}

impl Drop for Cutter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Lines of `file` per job id (each line `ID TOKEN`).
fn lines_per_job(file: &Path) -> HashMap<i64, usize> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let mut per = HashMap::new();
    for line in text.lines() {
        let id: i64 = line
            .split_whitespace()
            .next()
            .and_then(|w| w.parse().ok())
            .unwrap_or_else(|| panic!("a line of the jobs' file: {line:?}"));
        *per.entry(id).or_default() += 1;
    }
    per
}

/// One runner of 4 workers runs 400 short jobs while every session of it that sits idle in
/// a transaction is ended by the server. Each cut transaction fails whole and runs again:
/// every job runs exactly once (one line each in the file the jobs append to) and has one
/// `claimed` event per attempt. (On the code before the fix, a statement after the cut ran
/// on a new session outside any transaction and the COMMIT "succeeded" there: claims that
/// never committed were run, and their jobs were claimed and run again.)
#[test]
fn jobs_run_once_while_sessions_idle_in_a_transaction_are_cut() {
    const JOBS: usize = 400;
    let db = TestDb::postgres("cut_idle_tx");
    let pg = db.pg.as_ref().expect("a PostgreSQL test");
    let target = db.target();
    let file = db.sibling("ran.txt");
    let command = format!(
        "sleep 0.02; echo \"$LEASEHOLD_JOB_ID $LEASEHOLD_RUN_TOKEN\" >> '{}'",
        file.display()
    );
    let ids = db
        .store()
        .enqueue_many(&vec![Job::shell(command); JOBS])
        .expect("enqueue");
    let runner = Runner::builder(&target)
        .workers(4)
        .lease_ttl(Duration::from_secs(3))
        .heartbeat_interval(Duration::from_millis(500))
        .sweep_interval(Duration::from_millis(500))
        .kill_grace(Duration::from_millis(300))
        .poll_interval(Duration::from_millis(20))
        .shutdown_grace(Duration::from_millis(500))
        .start()
        .expect("the runner starts");
    // A cut every 20 ms: often enough to land in hundreds of transactions, rarely enough
    // that most commit (every transaction cut is run again, so a cut after each statement
    // would let none through).
    let cutter = Cutter::start(
        pg,
        "state = 'idle in transaction'",
        Duration::from_millis(20),
    );
    let ended = |db: &TestDb| {
        db.scalar("SELECT count(*) FROM jobs WHERE status IN ('succeeded', 'failed', 'cancelled')")
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while ended(&db) < JOBS as i64 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let cut = cutter.stop();
    let done = ended(&db);
    runner.shutdown().expect("the runner stops");
    assert!(cut > 0, "no session was cut");

    let per = lines_per_job(&file);
    let twice: Vec<(i64, usize)> = ids
        .iter()
        .map(|id| (*id, per.get(id).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 1)
        .collect();
    let extra_claims = db.scalar(
        "SELECT count(*) FROM (SELECT job_id, attempt FROM job_events WHERE kind = 'claimed'
         GROUP BY job_id, attempt HAVING count(*) > 1) twice",
    );
    let not_succeeded = db.scalar("SELECT count(*) FROM jobs WHERE status <> 'succeeded'");
    eprintln!(
        "{cut} sessions cut; {done} of {JOBS} jobs ended; {} ran twice or more; {extra_claims} \
         attempts claimed twice; {not_succeeded} not succeeded",
        twice.len()
    );
    assert!(
        twice.is_empty(),
        "jobs run more than once (id, runs): {twice:?}"
    );
    assert_eq!(extra_claims, 0, "attempts with more than one claimed event");
    assert_eq!(done, JOBS as i64, "every job ended");
    assert_eq!(not_succeeded, 0, "every job succeeded");
    for id in &ids {
        assert_eq!(per.get(id), Some(&1), "job {id} ran once");
    }
}

/// A runner starts while the server ends every session leasehold opens on the database
/// (each as soon as it is seen, whatever it is doing): the start is tried again with backoff
/// instead of failing, and once the cuts stop the runner runs the job that waited. (Before,
/// `leasehold run` exited 1: "terminating connection due to administrator command".)
#[test]
fn a_start_survives_its_sessions_being_cut() {
    let db = TestDb::postgres("cut_start");
    let pg = db.pg.as_ref().expect("a PostgreSQL test");
    let target = db.target();
    let id = db.store().enqueue(&Job::shell("exit 0")).expect("enqueue");
    let cutter = Cutter::start(pg, "true", Duration::from_millis(2));
    let starting = std::thread::spawn(move || {
        Runner::builder(&target)
            .workers(2)
            .lease_ttl(Duration::from_secs(3))
            .heartbeat_interval(Duration::from_millis(500))
            .sweep_interval(Duration::from_millis(500))
            .kill_grace(Duration::from_millis(300))
            .poll_interval(Duration::from_millis(20))
            .shutdown_grace(Duration::from_millis(500))
            .start()
    });
    // The cuts last a second and a half, well into the start's retries.
    std::thread::sleep(Duration::from_millis(1_500));
    let cut = cutter.stop();
    let runner = starting
        .join()
        .expect("the start does not panic")
        .expect("the runner starts once its sessions are no longer cut");
    assert!(cut > 0, "no session was cut");
    assert!(
        matches!(outcome(&runner, id), Outcome::Succeeded),
        "job {id}"
    );
    runner.shutdown().expect("the runner stops");
}
