//! The database server's clock, which stamps every lease on PostgreSQL: a step of it while
//! jobs run, and a server's clock an hour behind this host's when a runner adopts an attempt.
//! The server's clock is moved by replacing `leasehold_now_ms()`, as the tests of skewed hosts
//! do (tests/runner/postgres.rs).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use leasehold::{Job, JobRecord, Status, Store, now_ms};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::helper::{WAIT, args};
use crate::util::{TestDb, leasehold_vars, poll, processes_with_env};

/// Moves the server's clock (as leasehold reads it) `offset_ms` from the real one.
fn set_server_offset(db: &TestDb, offset_ms: i64) {
    db.exec(&format!(
        "CREATE OR REPLACE FUNCTION leasehold_now_ms() RETURNS BIGINT
             LANGUAGE sql VOLATILE PARALLEL SAFE
             AS $$ SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint
                          + ({offset_ms}) $$"
    ));
}

/// A `leasehold run` on the test's PostgreSQL database, its stderr in a log file; killed by
/// pid when dropped.
struct Runner {
    child: Child,
    log: PathBuf,
}

impl Runner {
    fn start(
        n: usize,
        url: &str,
        dir: &Path,
        marker: &(String, String),
        run_args: &[&str],
    ) -> Runner {
        let log = dir.join(format!("runner-{n}.log"));
        let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("leasehold"));
        for var in leasehold_vars() {
            cmd.env_remove(var);
        }
        let child = cmd
            .args(["--db", url, "run"])
            .args(run_args)
            .env("HOME", dir.join("home"))
            .env("XDG_STATE_HOME", dir.join("home/.local/state"))
            .env(&marker.0, &marker.1)
            .env("RUST_LOG", "leasehold=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("the runner's log can be created"))
            .spawn()
            .expect("leasehold run starts");
        Runner { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

/// A test's database, its runners, and a marker every process they start carries, so that
/// cleanup ends them by pid.
struct Case {
    // Dropped first: each runner is killed by pid.
    runners: Vec<Runner>,
    db: TestDb,
    marker: (String, String),
}

impl Case {
    fn new(hint: &str) -> Case {
        let db = TestDb::postgres(hint);
        std::fs::create_dir_all(db.dir.path().join("home")).unwrap();
        let marker = (
            "LEASEHOLD_TEST_CASE".to_string(),
            db.pg.as_ref().unwrap().name().to_string(),
        );
        let case = Case {
            runners: Vec::new(),
            db,
            marker,
        };
        drop(case.store());
        case
    }

    fn url(&self) -> &str {
        &self.db.pg.as_ref().expect("a PostgreSQL database").url
    }

    /// A store at the server's clock, as the runners are.
    fn store(&self) -> Store {
        Store::open(self.url()).expect("the test database opens")
    }

    /// Starts `leasehold run` with the fast settings and `extra`; returns its index.
    fn start(&mut self, extra: &[&str]) -> usize {
        self.start_with(&args(extra))
    }

    /// Starts `leasehold run ARGS`; returns its index.
    fn start_with(&mut self, run_args: &[&str]) -> usize {
        let runner = Runner::start(
            self.runners.len(),
            self.url(),
            self.db.dir.path(),
            &self.marker,
            run_args,
        );
        self.runners.push(runner);
        self.runners.len() - 1
    }

    /// How many sweeps runner `n` has logged.
    fn sweeps(&self, n: usize) -> usize {
        self.runners[n].log().matches("] sweep").count()
    }

    fn job(&self, id: i64) -> JobRecord {
        self.store().job(id).expect("the job exists")
    }

    fn kinds(&self, id: i64) -> Vec<String> {
        let events = self.store().events(id).expect("the job's events");
        events.iter().map(|e| e.kind.to_string()).collect()
    }

    fn logs(&self) -> String {
        self.runners
            .iter()
            .enumerate()
            .map(|(n, r)| {
                let log = r.log();
                let lines: Vec<&str> = log.lines().collect();
                let tail = lines[lines.len().saturating_sub(30)..].join("\n");
                format!("--- runner {n}:\n{tail}\n")
            })
            .collect()
    }

    fn wait_for<T>(&self, what: &str, mut f: impl FnMut(&Case) -> Option<T>) -> T {
        poll(WAIT, || f(self))
            .unwrap_or_else(|| panic!("timed out waiting for {what}\n{}", self.logs()))
    }

    fn ended(&self, id: i64) -> JobRecord {
        self.wait_for(&format!("job {id} to end"), |c| {
            let j = c.job(id);
            j.status.is_terminal().then_some(j)
        })
    }

    fn file(&self, name: &str) -> String {
        std::fs::read_to_string(self.db.dir.path().join(name)).unwrap_or_default()
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        self.runners.clear();
        for pid in processes_with_env(&format!("{}={}", self.marker.0, self.marker.1)) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

#[test]
fn a_step_of_the_servers_clock_reclaims_no_attempt_while_it_runs() {
    let mut c = Case::new("server_step");
    // The job's runner renews every 10 s, the other sweeps every 0.5 s: between two renewals
    // the second has swept many times, and reclaims what looks expired.
    let a = c.start_with(&[
        "--workers",
        "2",
        "--heartbeat",
        "10",
        "--sweep",
        "0.5",
        "--kill-grace",
        "0.5",
        "--shutdown-grace",
        "0.5",
        "--lease-ttl",
        "30",
    ]);
    let id = c
        .store()
        .enqueue(
            &Job::shell(r#"echo "$LEASEHOLD_RUN_TOKEN" >> starts; sleep 14"#).cwd(c.db.dir.path()),
        )
        .expect("enqueue");
    let first = c.wait_for("the job to run", |c| {
        let j = c.job(id);
        (j.status == Status::Running && j.pid.is_some()).then_some(j)
    });
    // The second runner starts once the first holds the job.
    let b = c.start(&["--lease-ttl", "30"]);
    c.wait_for("the second runner's sweeps", |c| {
        (c.sweeps(b) >= 2).then_some(())
    });
    // Right after a renewal (its heartbeat_at moves), the server's clock steps an hour ahead:
    // every lease looks an hour past its end, and the next renewal is 10 s away.
    c.wait_for("a renewal of the job's lease", |c| {
        let j = c.job(id);
        (j.status != Status::Running || j.heartbeat_at != first.heartbeat_at).then_some(())
    });
    set_server_offset(&c.db, 3_600_000);
    let stepped_at = now_ms();
    let before = c.sweeps(b);
    c.wait_for("the second runner to sweep twice after the step", |c| {
        (c.sweeps(b) >= before + 2).then_some(())
    });
    let done = c.ended(id);
    let kinds = c.kinds(id);
    eprintln!(
        "job ended {} ms after the step; events {kinds:?}",
        now_ms() - stepped_at
    );
    assert!(
        !kinds.iter().any(|k| k == "reclaimed" || k == "lost"),
        "a running attempt was reclaimed after the server's clock stepped: {kinds:?}\n{}",
        c.logs()
    );
    assert_eq!(done.status, Status::Succeeded, "{done:?}\n{}", c.logs());
    assert_eq!((done.attempt, done.recovery_count), (1, 0), "{done:?}");
    assert_eq!(done.run_token, first.run_token, "{done:?}");
    assert_eq!(c.file("starts").lines().count(), 1, "the job started twice");
    assert!(
        c.runners[b]
            .log()
            .contains("the database server's clock moved"),
        "{}",
        c.logs()
    );
    drop(c.runners.remove(a));
}

#[test]
fn an_adopted_attempts_timeout_counts_on_the_servers_clock() {
    let mut c = Case::new("adopt_server_clock");
    // The server's clock is an hour behind this host's: `started_at` is in its time.
    set_server_offset(&c.db, -3_600_000);
    let a = c.start(&["--lease-ttl", "3", "--on-exit", "leave"]);
    let id = c
        .store()
        .enqueue(
            &Job::shell("sleep 3")
                .timeout(Duration::from_secs(120))
                .cwd(c.db.dir.path()),
        )
        .expect("enqueue");
    c.wait_for("the job to run under a keeper", |c| {
        let j = c.job(id);
        (j.status == Status::Running && j.pid.is_some() && j.keeper_pid.is_some()).then_some(j)
    });
    // The runner leaves the attempt to its keeper; the next one adopts it.
    kill(
        Pid::from_raw(c.runners[a].child.id() as i32),
        Signal::SIGTERM,
    )
    .unwrap();
    let left = poll(WAIT, || c.runners[a].child.try_wait().unwrap());
    assert!(left.is_some_and(|s| s.success()), "{left:?}\n{}", c.logs());
    c.start(&["--lease-ttl", "3"]);
    let done = c.ended(id);
    let kinds = c.kinds(id);
    eprintln!("{done:?}; events {kinds:?}");
    assert!(
        kinds.iter().any(|k| k == "adopted"),
        "{kinds:?}\n{}",
        c.logs()
    );
    assert_eq!(
        done.status,
        Status::Succeeded,
        "the adopted attempt did not run to its end: {done:?}; {kinds:?}\n{}",
        c.logs()
    );
    assert_eq!(done.attempt, 1, "{done:?}");
}
