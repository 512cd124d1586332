//! Crashed runners without keepers (`--no-keepers`): a killed runner's jobs are torn down and
//! run again by the next one, within the recovery budget and `on_lost`, without signalling a
//! process that is not theirs. (With keepers, the next runner adopts them or records their
//! outcomes: see `keepers.rs`.)

use std::process::Command;
use std::time::{Duration, Instant};

use leasehold::{ErrorKind, Job, OnLost, Status, now_ms};

use crate::helper::{Case, PID_SCRIPT, args};
use crate::util::{group_alive, token_alive};

#[test]
fn killed_runner_is_recovered_at_once_by_the_next_one() {
    let mut c = Case::new();
    let id = c.enqueue(Job::shell(PID_SCRIPT));
    let r = c.start_runner(&args(&["--no-keepers", "--lease-ttl", "30"]));
    let first = c.running(id, 1);
    c.wait_for("the first pid", |c| {
        (!c.file("pids").is_empty()).then_some(())
    });
    c.crash(r);
    let pgid = first.pgid.unwrap();
    assert!(group_alive(pgid), "the job's group survives its runner");

    let restart = Instant::now();
    c.start_runner(&args(&["--no-keepers", "--lease-ttl", "30"]));
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
    let ttl = ["--no-keepers", "--lease-ttl", "30", "--max-recovery", "3"];
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
    let r = c.start_runner(&args(&["--no-keepers", "--lease-ttl", "30"]));
    let first = c.running(id, 1);
    c.wait_for("the escapee", |c| {
        (!c.file("escapee").is_empty()).then_some(())
    });
    let token = first.run_token.clone().unwrap();
    assert!(token_alive(&token));
    c.crash(r);
    c.start_runner(&args(&["--no-keepers", "--lease-ttl", "30"]));
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
    rusqlite::Connection::open(&c.db.path)
        .unwrap()
        .execute(
            "UPDATE jobs SET status = 'running', attempt = 1, run_token = 'lost-token',
                 worker_id = 'gone', lease_expires_at = 1, pid = ?2, pgid = ?2,
                 proc_start_time = 1
             WHERE id = ?1",
            rusqlite::params![id, pid],
        )
        .unwrap();
    c.start_runner(&args(&["--no-keepers", "--lease-ttl", "30"]));
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
    let r = c.start_runner(&args(&["--no-keepers", "--lease-ttl", "30"]));
    c.running(id, 1);
    c.crash(r);
    c.start_runner(&args(&["--no-keepers", "--lease-ttl", "30"]));
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
