//! `jobs add --from-file` beside other clients' single `jobs add`s: a bulk enqueue gates,
//! announces and, when abandoned, deletes its own jobs only. On PostgreSQL other writers'
//! jobs take ids between a bulk slice's first and last.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::Duration;

use crate::helper::{FAST, add};
use crate::util::{TestDb, leasehold_vars, wait_for, wait_until};

/// `leasehold --db DB`, without the caller's settings, its stdin closed.
fn leasehold(db: &Path) -> Command {
    let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("leasehold"));
    for var in leasehold_vars() {
        cmd.env_remove(var);
    }
    cmd.arg("--db").arg(db).stdin(Stdio::null());
    cmd
}

/// A child process killed (by its pid) and reaped when dropped, the test failed or not.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Writes a file of `n` distinct commands; returns its path.
fn lines(t: &TestDb, n: usize) -> std::path::PathBuf {
    let file = t.sibling("lines.txt");
    let text: String = (0..n).map(|i| format!("true {i}\n")).collect();
    std::fs::write(&file, text).expect("the lines can be written");
    file
}

/// `jobs add --from-file FILE --json` in the background on `t`'s database (made first), its
/// stdout piped.
fn bulk_add(t: &TestDb, file: &Path) -> Child {
    drop(t.store());
    let db = t.target();
    leasehold(&db)
        .args(["jobs", "add", "--json", "--from-file"])
        .arg(file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the bulk add starts")
}

/// Once the bulk add has written some of its jobs: `n` single adds from 8 threads, each
/// thread's one after another, while it goes on. Returns their ids.
fn single_adds_during_bulk(t: &TestDb, n: usize) -> Vec<i64> {
    let db = t.target();
    wait_for(
        "the bulk add's first slice",
        Duration::from_secs(30),
        || (t.scalar("SELECT count(*) FROM jobs") > 0).then_some(()),
    );
    let threads: Vec<_> = (0..8)
        .map(|k| {
            let db = db.clone();
            thread::spawn(move || {
                (k..n)
                    .step_by(8)
                    .map(|i| add(&db, &["--queue", "single"], &["echo", &i.to_string()]))
                    .collect::<Vec<i64>>()
            })
        })
        .collect();
    let mut ids: Vec<i64> = threads
        .into_iter()
        .flat_map(|h| h.join().expect("the adds do not panic"))
        .collect();
    ids.sort_unstable();
    ids
}

/// Each single job is pending, ready (no gate, waiting for nothing) and announced once.
fn assert_intact(t: &TestDb, singles: &[i64]) {
    assert_eq!(
        t.scalar("SELECT count(*) FROM jobs WHERE queue = 'single'"),
        singles.len() as i64,
        "single jobs left"
    );
    for &id in singles {
        let q = |sql: &str| t.scalar(&sql.replace("ID", &id.to_string()));
        assert_eq!(
            q("SELECT count(*) FROM jobs WHERE id = ID AND queue = 'single'"),
            1,
            "single job {id} is gone"
        );
        assert_eq!(
            q("SELECT count(*) FROM job_events WHERE job_id = ID AND kind = 'enqueued'"),
            1,
            "single job {id}'s enqueued events"
        );
        assert_eq!(
            q("SELECT count(*) FROM job_deps WHERE job_id = ID"),
            0,
            "single job {id} is gated"
        );
        assert_eq!(q("SELECT waiting FROM jobs WHERE id = ID"), 0, "job {id}");
    }
}

crate::on_both! {
    fn a_bulk_add_beside_single_adds_gates_and_announces_only_its_own_jobs(t) {
        let n = 10_000;
        let file = lines(&t, n);
        if t.is_postgres() {
            // PostgreSQL writes such a list 100 rows a statement, in transactions of up to a
            // second: half a millisecond a row makes it five, so single adds land between.
            drop(t.store());
            t.exec(
                "CREATE FUNCTION test_slow_insert() RETURNS trigger LANGUAGE plpgsql AS
                     $$ BEGIN PERFORM pg_sleep(0.0005); RETURN NEW; END $$;
                 CREATE TRIGGER test_slow_insert AFTER INSERT ON jobs
                     FOR EACH ROW EXECUTE FUNCTION test_slow_insert();",
            );
        }
        let bulk = bulk_add(&t, &file);
        let singles = single_adds_during_bulk(&t, 40);
        let out = bulk.wait_with_output().expect("the bulk add ends");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON ids");
        let bulk_ids: Vec<i64> = v["ids"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|i| i.as_i64().expect("an id"))
            .collect();
        assert_eq!(bulk_ids.len(), n);
        assert!(bulk_ids.iter().all(|id| singles.binary_search(id).is_err()));
        // The bulk add was still going when the last single add was stored.
        let last_bulk = *bulk_ids.last().unwrap();
        assert!(
            singles.iter().any(|&s| s < last_bulk),
            "no single add landed inside the bulk add: {singles:?}, last bulk id {last_bulk}"
        );
        assert_intact(&t, &singles);
        assert_eq!(
            t.scalar("SELECT count(*) FROM job_events WHERE kind = 'enqueued'"),
            (n + singles.len()) as i64
        );
        assert_eq!(t.scalar("SELECT count(*) FROM job_deps"), 0);
        assert_eq!(
            t.scalar("SELECT CAST(sum(n) AS BIGINT) FROM job_counts WHERE status = 'pending'"),
            (n + singles.len()) as i64
        );
    }

    fn a_bulk_add_killed_mid_way_and_tidied_deletes_only_its_own_jobs(t) {
        let file = lines(&t, 200_000);
        let mut bulk = bulk_add(&t, &file);
        let singles = single_adds_during_bulk(&t, 15);
        assert!(
            bulk.try_wait().expect("the bulk add can be waited for").is_none(),
            "the bulk add ended before the single adds did: make it longer"
        );
        bulk.kill().expect("the bulk add can be killed");
        bulk.wait().expect("the bulk add is reaped");
        assert_eq!(t.scalar("SELECT count(*) FROM batches"), 1, "the batch left open");
        // Its writer is gone: what its expiry (60 s without a slice) would make of it.
        t.exec("UPDATE batches SET expires_at = 0");
        // The tidy path: a runner's sweep deletes an abandoned batch's jobs (this runner
        // serves another queue, so the single jobs stay pending as they were added).
        let runner = Killed(
            leasehold(&t.target())
                .arg("run")
                .args(FAST)
                .args(["--queue", "elsewhere"])
                .stderr(std::fs::File::create(t.sibling("runner.log")).expect("a log file"))
                .spawn()
                .expect("the runner starts"),
        );
        assert!(
            wait_until(Duration::from_secs(60), || {
                t.scalar("SELECT count(*) FROM batches") == 0
            }),
            "the runner's sweep tidies the abandoned batch"
        );
        drop(runner);
        assert_intact(&t, &singles);
        assert_eq!(t.scalar("SELECT count(*) FROM jobs"), singles.len() as i64);
        assert_eq!(
            t.scalar("SELECT count(*) FROM job_events WHERE kind = 'enqueued'"),
            singles.len() as i64
        );
    }
}
