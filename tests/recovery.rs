//! Crash recovery with real crashes: each test starts `leasehold run` processes, kills,
//! freezes or starves them, and checks that no job is lost, run twice at once, or wedged.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod util;

use util::{Watchdog, alive, group_members, processes_with_env};

use leasehold::{ErrorKind, Job, JobRecord, OnLost, Status, Store, now_ms};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const WAIT: Duration = Duration::from_secs(30);

/// A test's database, its folder, and a marker every process it starts carries in its
/// environment, so that cleanup can end them by pid whatever happens.
struct Case {
    dir: tempfile::TempDir,
    path: PathBuf,
    marker: String,
    runners: Vec<Runner>,
    _watchdog: Watchdog,
}

struct Runner {
    child: Child,
    log: PathBuf,
}

impl Case {
    fn new() -> Case {
        let watchdog = Watchdog::new();
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("jobs.db");
        let marker = format!(
            "LEASEHOLD_TEST_CASE={}",
            dir.path().file_name().unwrap().to_string_lossy()
        );
        Store::open(&path).expect("create the database");
        Case {
            dir,
            path,
            marker,
            runners: Vec::new(),
            _watchdog: watchdog,
        }
    }

    fn store(&self) -> Store {
        Store::open(&self.path).expect("open")
    }

    fn enqueue(&self, job: Job) -> i64 {
        self.store()
            .enqueue(&job.cwd(self.dir.path()), now_ms())
            .expect("enqueue")
    }

    fn job(&self, id: i64) -> JobRecord {
        self.store().job(id).expect("job")
    }

    fn kinds(&self, id: i64) -> Vec<String> {
        self.store()
            .events(id)
            .expect("events")
            .into_iter()
            .map(|e| e.kind.to_string())
            .collect()
    }

    /// Starts `leasehold run` with `args`; returns its index.
    fn start_runner(&mut self, args: &[&str]) -> usize {
        let n = self.runners.len();
        let log = self.dir.path().join(format!("runner-{n}.log"));
        let (k, v) = self.marker.split_once('=').unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .arg("--db")
            .arg(&self.path)
            .arg("run")
            .args(args)
            .env(k, v)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start leasehold run");
        self.runners.push(Runner { child, log });
        n
    }

    fn pid(&self, runner: usize) -> Pid {
        Pid::from_raw(self.runners[runner].child.id() as i32)
    }

    fn signal(&self, runner: usize, sig: Signal) {
        kill(self.pid(runner), sig).expect("signal the runner");
    }

    /// SIGKILLs a runner and reaps it, so its pid is gone as after a real crash.
    fn crash(&mut self, runner: usize) {
        self.signal(runner, Signal::SIGKILL);
        self.runners[runner].child.wait().expect("reap the runner");
    }

    fn log(&self, runner: usize) -> String {
        std::fs::read_to_string(&self.runners[runner].log).unwrap_or_default()
    }

    /// Waits until `f` holds, polling the database.
    fn wait_for<T>(&self, what: &str, mut f: impl FnMut(&Case) -> Option<T>) -> T {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(v) = f(self) {
                return v;
            }
            if Instant::now() > deadline {
                let logs: Vec<String> = (0..self.runners.len()).map(|i| self.log(i)).collect();
                panic!(
                    "timed out waiting for {what}; runner logs:\n{}",
                    logs.join("\n---\n")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until job `id` runs attempt `attempt` with its process recorded.
    fn running(&self, id: i64, attempt: i64) -> JobRecord {
        self.wait_for(&format!("job {id} to run attempt {attempt}"), |c| {
            let j = c.job(id);
            (j.status == Status::Running && j.attempt == attempt && j.pid.is_some()).then_some(j)
        })
    }

    fn ended(&self, id: i64) -> JobRecord {
        self.wait_for(&format!("job {id} to end"), |c| {
            let j = c.job(id);
            j.status.is_terminal().then_some(j)
        })
    }

    fn file(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default()
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        for r in &mut self.runners {
            let _ = r.child.kill();
            let _ = r.child.wait();
        }
        for pid in processes_with_env(&self.marker) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

fn group_alive(pgid: i64) -> bool {
    !group_members(pgid).is_empty()
}

fn token_alive(token: &str) -> bool {
    !processes_with_env(&format!("LEASEHOLD_RUN_TOKEN={token}")).is_empty()
}

/// The job script of the crash tests: records its pid, notes an overlap when the previous
/// attempt's recorded pid is still alive, then succeeds on its second run or hangs on its
/// first.
const PID_SCRIPT: &str = r#"
if [ -s pids ]; then
  prev=$(tail -n 1 pids)
  st=$(sed 's/.*) //' /proc/$prev/stat 2>/dev/null | cut -c1)
  if [ -n "$st" ] && [ "$st" != Z ]; then echo "$prev alive when $$ started" >> overlap; fi
fi
echo $$ >> pids
if [ $(wc -l < pids) -ge 2 ]; then exit 0; fi
sleep 300
"#;

const FAST: &[&str] = &[
    "--workers",
    "2",
    "--heartbeat",
    "0.5",
    "--sweep",
    "0.5",
    "--kill-grace",
    "0.5",
    "--shutdown-grace",
    "0.5",
];

fn args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    FAST.iter().copied().chain(extra.iter().copied()).collect()
}

#[test]
fn killed_runner_is_recovered_at_once_by_the_next_one() {
    let mut c = Case::new();
    let id = c.enqueue(Job::shell(PID_SCRIPT));
    let r = c.start_runner(&args(&["--lease-ttl", "30"]));
    let first = c.running(id, 1);
    c.wait_for("the first pid", |c| {
        (!c.file("pids").is_empty()).then_some(())
    });
    c.crash(r);
    let pgid = first.pgid.unwrap();
    assert!(group_alive(pgid), "the job's group survives its runner");

    let restart = Instant::now();
    c.start_runner(&args(&["--lease-ttl", "30"]));
    let done = c.ended(id);
    let took = restart.elapsed();
    eprintln!("recovered and ran attempt 2 in {took:?} after the restart (lease TTL 30 s)");
    assert_eq!(done.status, Status::Succeeded, "{done:?}");
    assert_eq!(done.recovery_count, 1);
    assert!(took < Duration::from_secs(5), "recovery took {took:?}");
    assert!(!group_alive(pgid), "the lost attempt's group is gone");
    assert_eq!(c.file("overlap"), "", "attempts overlapped");
    let kinds = c.kinds(id);
    let torn = kinds
        .iter()
        .position(|k| k == "torn_down")
        .expect("torn_down");
    let second = kinds.iter().rposition(|k| k == "claimed").unwrap();
    assert!(torn < second, "{kinds:?}");
    let reclaimed = c.store().events(id).unwrap();
    let detail = reclaimed
        .iter()
        .find(|e| e.kind == "reclaimed")
        .and_then(|e| e.detail.clone())
        .unwrap();
    assert!(
        detail.starts_with("lease expired after missing heartbeat; "),
        "{detail}"
    );
    assert!(detail.contains("is dead"), "{detail}");
}

#[test]
fn job_lost_more_often_than_the_budget_fails_as_lost() {
    let mut c = Case::new();
    let id = c.enqueue(Job::shell("sleep 300"));
    let ttl = ["--lease-ttl", "30", "--max-recovery", "3"];
    for attempt in 1..=4 {
        let r = c.start_runner(&args(&ttl));
        c.running(id, attempt);
        c.crash(r);
    }
    c.start_runner(&args(&ttl));
    let done = c.ended(id);
    assert_eq!(done.status, Status::Failed);
    assert_eq!(done.error_kind, Some(ErrorKind::Lost));
    assert_eq!(done.recovery_count, 4);
    assert_eq!(
        c.store()
            .lease_counts(3, now_ms())
            .unwrap()
            .recovery_exhausted_failed,
        1
    );
    c.wait_for("the last attempt's teardown", |c| {
        (!c.job(id).teardown_pending).then_some(())
    });
    assert!(!group_alive(done.pgid.unwrap()));
}

#[test]
fn frozen_runner_loses_its_job_to_another_and_its_late_result_is_discarded() {
    let mut c = Case::new();
    let id = c.enqueue(Job::shell(PID_SCRIPT));
    let ttl = ["--lease-ttl", "2"];
    let frozen = c.start_runner(&args(&ttl));
    let first = c.running(id, 1);
    c.start_runner(&args(&ttl));
    c.signal(frozen, Signal::SIGSTOP);
    let done = c.ended(id);
    assert_eq!(done.status, Status::Succeeded, "{done:?}");
    assert_eq!(done.attempt, 2);
    assert_ne!(done.worker_id, first.worker_id);
    assert!(!group_alive(first.pgid.unwrap()));
    assert_eq!(c.file("overlap"), "");
    c.signal(frozen, Signal::SIGCONT);
    c.wait_for("the late result to be discarded", |c| {
        c.kinds(id)
            .contains(&"late_result_discarded".to_string())
            .then_some(())
    });
    let after = c.job(id);
    assert_eq!(after.status, Status::Succeeded);
    assert_eq!(after.run_token, done.run_token);
    assert_eq!(after.exit_code, Some(0));
}

#[test]
fn runner_frozen_past_its_lease_keeps_its_jobs_when_it_wakes() {
    let mut c = Case::new();
    let ids: Vec<i64> = (0..2).map(|_| c.enqueue(Job::shell("sleep 2"))).collect();
    let r = c.start_runner(&args(&["--lease-ttl", "1.5"]));
    for &id in &ids {
        c.running(id, 1);
    }
    c.signal(r, Signal::SIGSTOP);
    std::thread::sleep(Duration::from_secs(3)); // Twice the lease TTL, frozen: the point of the test.
    c.signal(r, Signal::SIGCONT);
    for &id in &ids {
        let done = c.ended(id);
        assert_eq!(done.status, Status::Succeeded, "{done:?}");
        assert_eq!(done.recovery_count, 0);
        assert_eq!(done.attempt, 1);
    }
}

#[test]
fn runner_that_cannot_renew_kills_its_attempt_before_the_lease_runs_out() {
    let mut c = Case::new();
    let id = c.enqueue(Job::shell(PID_SCRIPT));
    let r = c.start_runner(&args(&["--lease-ttl", "3"]));
    let first = c.running(id, 1);
    c.wait_for("the first pid", |c| {
        (!c.file("pids").is_empty()).then_some(())
    });
    let pid = first.pid.unwrap();

    let lock = rusqlite::Connection::open(&c.path).unwrap();
    lock.busy_timeout(Duration::from_secs(10)).unwrap();
    lock.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let expires: i64 = lock
        .query_row(
            "SELECT lease_expires_at FROM jobs WHERE id = ?1",
            [id],
            |r| r.get(0),
        )
        .unwrap();
    let held = Instant::now();
    let deadline = Instant::now() + WAIT;
    while alive(pid) {
        assert!(Instant::now() < deadline, "the attempt was never fenced");
        std::thread::sleep(Duration::from_millis(10));
    }
    let killed_at = now_ms();
    assert!(
        killed_at < expires,
        "killed {}ms after its lease ran out",
        killed_at - expires
    );
    // Hold the lock for twice the lease TTL in all.
    std::thread::sleep(Duration::from_secs(6).saturating_sub(held.elapsed()));
    lock.execute_batch("COMMIT").unwrap();
    drop(lock);

    let done = c.ended(id);
    assert_eq!(done.status, Status::Succeeded, "{done:?}");
    assert_eq!(done.recovery_count, 1);
    assert_eq!(c.file("overlap"), "");
    assert!(
        c.runners[r].child.try_wait().unwrap().is_none(),
        "the runner survived"
    );
    assert!(
        c.log(r).contains("cannot renew its lease"),
        "the runner says why: {}",
        c.log(r)
    );
}

#[test]
fn setsid_descendant_of_a_lost_attempt_is_killed_before_the_next_attempt() {
    let mut c = Case::new();
    let script = r#"
if [ -s escapee ]; then
  prev=$(cat escapee)
  st=$(sed 's/.*) //' /proc/$prev/stat 2>/dev/null | cut -c1)
  if [ -n "$st" ] && [ "$st" != Z ]; then echo "$prev alive" >> overlap; fi
  exit 0
fi
setsid sh -c 'echo $$ > escapee; exec sleep 300' >/dev/null 2>&1 &
sleep 300
"#;
    let id = c.enqueue(Job::shell(script));
    let r = c.start_runner(&args(&["--lease-ttl", "30"]));
    let first = c.running(id, 1);
    c.wait_for("the escapee", |c| {
        (!c.file("escapee").is_empty()).then_some(())
    });
    let token = first.run_token.clone().unwrap();
    assert!(token_alive(&token));
    c.crash(r);
    c.start_runner(&args(&["--lease-ttl", "30"]));
    let done = c.ended(id);
    assert_eq!(done.status, Status::Succeeded, "{done:?}");
    assert_eq!(c.file("overlap"), "", "the escapee outlived its attempt");
    assert!(!token_alive(&token));
}

#[test]
fn recorded_pid_of_an_unrelated_process_is_never_signalled() {
    let mut c = Case::new();
    let (k, v) = c.marker.split_once('=').unwrap();
    let mut bystander = {
        use std::os::unix::process::CommandExt;
        Command::new("sleep")
            .arg("300")
            .env(k, v)
            .process_group(0)
            .spawn()
            .unwrap()
    };
    let pid = bystander.id() as i64;
    let id = c.enqueue(Job::shell("true").delay(Duration::from_secs(3600)));
    // A running row whose recorded process is the bystander's pid, but with another start
    // time: the pid was reused, so the bystander is not the attempt.
    rusqlite::Connection::open(&c.path)
        .unwrap()
        .execute(
            "UPDATE jobs SET status = 'running', attempt = 1, run_token = 'lost-token',
                 worker_id = 'gone', lease_expires_at = 1, pid = ?2, pgid = ?2,
                 proc_start_time = 1
             WHERE id = ?1",
            rusqlite::params![id, pid],
        )
        .unwrap();
    c.start_runner(&args(&["--lease-ttl", "30"]));
    let torn = c.wait_for("the teardown", |c| {
        c.store()
            .events(id)
            .unwrap()
            .into_iter()
            .find(|e| e.kind == "torn_down")
    });
    assert!(
        bystander.try_wait().unwrap().is_none(),
        "the bystander was signalled"
    );
    let detail = torn.detail.unwrap_or_default();
    assert!(detail.contains("not signalled"), "{detail}");
    let _ = bystander.kill();
    let _ = bystander.wait();
}

#[test]
fn on_lost_fail_job_is_not_run_again_after_a_crash() {
    let mut c = Case::new();
    let id = c.enqueue(Job::shell("echo $$ >> runs; sleep 300").on_lost(OnLost::Fail));
    let r = c.start_runner(&args(&["--lease-ttl", "30"]));
    c.running(id, 1);
    c.crash(r);
    c.start_runner(&args(&["--lease-ttl", "30"]));
    let done = c.ended(id);
    assert_eq!(done.status, Status::Failed);
    assert_eq!(done.error_kind, Some(ErrorKind::Lost));
    let msg = done.last_error.unwrap_or_default();
    assert!(msg.contains("not executed again"), "{msg}");
    c.wait_for("the teardown", |c| {
        (!c.job(id).teardown_pending).then_some(())
    });
    assert_eq!(c.file("runs").lines().count(), 1);
    let claims = c.kinds(id).iter().filter(|k| *k == "claimed").count();
    assert_eq!(claims, 1);
}

#[test]
fn sigterm_shuts_down_gracefully_and_requeues_running_jobs() {
    let mut c = Case::new();
    let ids: Vec<i64> = (0..2)
        .map(|_| c.enqueue(Job::shell("trap '' TERM; sleep 300")))
        .collect();
    let r = c.start_runner(&args(&["--lease-ttl", "30"]));
    let pgids: Vec<i64> = ids
        .iter()
        .map(|&id| c.running(id, 1).pgid.unwrap())
        .collect();
    let asked = Instant::now();
    c.signal(r, Signal::SIGTERM);
    let status = loop {
        if let Some(s) = c.runners[r].child.try_wait().unwrap() {
            break s;
        }
        assert!(asked.elapsed() < WAIT, "the runner did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = asked.elapsed();
    assert!(status.success(), "{status:?}");
    // Shutdown grace 0.5 s plus kill grace 0.5 s, with room for a slow machine.
    assert!(took < Duration::from_secs(4), "took {took:?}");
    for (&id, &pgid) in ids.iter().zip(&pgids) {
        assert!(!group_alive(pgid));
        let j = c.job(id);
        assert_eq!(j.status, Status::Pending);
        assert_eq!(j.recovery_count, 0);
    }
}

#[test]
fn late_result_of_an_attempt_that_ended_while_its_runner_was_frozen_is_fenced() {
    let mut c = Case::new();
    // Attempt 1 notes its token, then exits with `code` when the test says so; attempt 2
    // (the note exists) notes its token and runs on. One job whose late result is a success,
    // one whose late result is a failure: they are recorded by different statements.
    let script = |code: i32| {
        format!(
            r#"
if [ -e first-$LEASEHOLD_JOB_ID ]; then
  echo "$LEASEHOLD_RUN_TOKEN" > second-$LEASEHOLD_JOB_ID; exec sleep 300
fi
echo "$LEASEHOLD_RUN_TOKEN" > first-$LEASEHOLD_JOB_ID
while [ ! -e go ]; do sleep 0.05; done
exit {code}
"#
        )
    };
    let ids = [
        c.enqueue(Job::shell(script(0))),
        c.enqueue(Job::shell(script(3)).max_attempts(3)),
    ];
    let ttl = ["--lease-ttl", "2"];
    let frozen = c.start_runner(&args(&ttl));
    let firsts: Vec<JobRecord> = ids.iter().map(|&id| c.running(id, 1)).collect();
    for id in ids {
        c.wait_for("attempt 1's note", |c| {
            (!c.file(&format!("first-{id}")).is_empty()).then_some(())
        });
    }
    c.signal(frozen, Signal::SIGSTOP);
    // The attempts run in their own groups, so they are not frozen: they end on their own,
    // and wait as zombies for their frozen runner to reap them.
    std::fs::write(c.dir.path().join("go"), b"").unwrap();
    for first in &firsts {
        let pid = first.pid.unwrap();
        c.wait_for("attempt 1 to exit", |_| (!alive(pid)).then_some(()));
    }

    c.start_runner(&args(&ttl));
    let seconds: Vec<JobRecord> = ids.iter().map(|&id| c.running(id, 2)).collect();
    for (id, second) in ids.iter().zip(&seconds) {
        let note = format!("second-{id}");
        c.wait_for("attempt 2's note", |c| {
            (!c.file(&note).is_empty()).then_some(())
        });
        assert_eq!(c.file(&note).trim(), second.run_token.as_deref().unwrap());
        assert_ne!(second.worker_id, firsts[0].worker_id);
    }

    c.signal(frozen, Signal::SIGCONT);
    for (&id, second) in ids.iter().zip(&seconds) {
        let discarded = c.wait_for("the late result to be discarded", |c| {
            c.store()
                .events(id)
                .unwrap()
                .into_iter()
                .find(|e| e.kind == "late_result_discarded")
        });
        assert_eq!(discarded.attempt, 1);
        let after = c.job(id);
        assert_eq!(after.status, Status::Running, "{after:?}");
        assert_eq!(after.attempt, 2);
        assert_eq!(after.run_token, second.run_token);
        assert_eq!(after.worker_id, second.worker_id);
        assert_eq!(after.pid, second.pid);
        assert_eq!((after.exit_code, after.failed_attempts), (None, 0));
        assert!(alive(second.pid.unwrap()), "attempt 2 runs on");
    }
}

#[test]
fn runner_whose_renewal_is_late_never_reaps_its_own_job() {
    let mut c = Case::new();
    let id = c.enqueue(Job::shell("sleep 300"));
    // Renewals every 3 s, sweeps every 0.2 s: many of the runner's own sweeps fall between a
    // lease that looks expired and the renewal that fixes it.
    c.start_runner(&[
        "--workers",
        "1",
        "--lease-ttl",
        "9",
        "--heartbeat",
        "3",
        "--sweep",
        "0.2",
        "--kill-grace",
        "0.5",
        "--shutdown-grace",
        "0.5",
    ]);
    let first = c.running(id, 1);
    // Just after a renewal, make the lease look expired, as a renewal that comes late would
    // leave it.
    let renewed = c.wait_for("a renewal", |c| {
        let j = c.job(id);
        (j.heartbeat_at != first.heartbeat_at).then_some(j.heartbeat_at)
    });
    let expired_at = now_ms();
    rusqlite::Connection::open(&c.path)
        .unwrap()
        .execute(
            "UPDATE jobs SET lease_expires_at = ?2 WHERE id = ?1",
            rusqlite::params![id, expired_at - 1_000],
        )
        .unwrap();
    let renewal = c.wait_for("the next renewal", |c| {
        let j = c.job(id);
        (j.heartbeat_at != renewed).then_some(j)
    });
    eprintln!(
        "the lease looked expired for {} ms of sweeps every 200 ms",
        now_ms() - expired_at
    );
    assert_eq!(renewal.status, Status::Running, "{renewal:?}");
    assert_eq!(renewal.attempt, 1);
    assert_eq!(renewal.run_token, first.run_token);
    assert_eq!(renewal.recovery_count, 0);
    assert!(renewal.lease_expires_at.unwrap() > expired_at);
    assert!(!c.kinds(id).iter().any(|k| k == "reclaimed"));
    assert!(group_alive(first.pgid.unwrap()), "the attempt runs on");
}
