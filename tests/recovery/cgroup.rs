//! The cgroup mode: where the runner's cgroup v2 folder is writable (CI runs as root, with
//! cgroup v2 at /sys/fs/cgroup/unified), each attempt runs in a cgroup of its own, so that a
//! process that left the attempt's group and session and dropped its environment (neither
//! its group id nor its run token names it) is still the attempt's: a timeout kills it, the
//! teardown of a lost attempt kills it, and a runner run as a job goes with its attempt,
//! keepers and all. Each test says when it is skipped because the runner uses process groups
//! here, and `LEASEHOLD_CGROUPS=off` turns the mode off, as `status` says.

use std::time::Duration;

use leasehold::{Job, Status, Store};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::helper::{Case, args};
use crate::util::{alive, wait_until};

/// Started in the background by a job: leaves the job's group and session (`setsid`) with
/// an empty environment (`env -i`, so no run token), ignores SIGTERM, writes its pid to the
/// file `escapee` in the job's folder and sleeps.
const ESCAPE: &str = "env -i setsid sh -c 'trap \"\" TERM; echo $$ > escapee.tmp; \
                      mv escapee.tmp escapee; exec sleep 300' </dev/null >/dev/null 2>&1 &";

/// A process this test started, killed by pid when the test ends, whatever happened.
struct Guard(Vec<i64>);

impl Drop for Guard {
    fn drop(&mut self) {
        for &pid in &self.0 {
            if alive(pid) {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
        }
    }
}

/// How the case's runner contains its attempts, as it recorded at its start, once its row
/// is there.
fn containment_of(c: &Case) -> String {
    c.wait_for("the runner's row", |c| {
        c.store()
            .runners()
            .ok()?
            .into_iter()
            .find_map(|r| r.containment)
    })
}

/// Whether the case's runner uses cgroups; says why the test is skipped when it does not.
fn in_cgroups(c: &Case) -> bool {
    let how = containment_of(c);
    if !how.starts_with("cgroup ") {
        eprintln!("skipped: the runner contains its attempts by {how}");
        return false;
    }
    true
}

/// The pid in the file `name` of the case's folder, once it is there.
fn pid_in(c: &Case, name: &str) -> i64 {
    c.wait_for(name, |c| c.file(name).trim().parse().ok())
}

#[test]
fn a_timeout_kills_a_process_that_left_the_group_and_dropped_its_token() {
    let mut c = Case::new();
    let id = c.enqueue(
        Job::shell(format!("{ESCAPE} exec sleep 300"))
            .timeout(Duration::from_secs(1))
            .max_attempts(1),
    );
    c.start_runner(&args(&[]));
    if !in_cgroups(&c) {
        return;
    }
    let escapee = pid_in(&c, "escapee");
    let _guard = Guard(vec![escapee]);
    let done = c.ended(id);
    assert_eq!(done.status, Status::Failed, "{done:?}");
    assert!(
        wait_until(Duration::from_secs(10), || !alive(escapee)),
        "the escapee {escapee} outlived its attempt's timeout"
    );
    let how = containment_of(&c);
    // `cgroup NODE; caps: ...` (the caps in force after the node: docs/manners.md).
    let node = how
        .strip_prefix("cgroup ")
        .and_then(|rest| rest.split("; caps: ").next())
        .expect("the cgroup mode");
    let token = done.run_token.expect("a run token");
    let cgroup = std::path::Path::new(node).join(format!("a-{token}"));
    assert!(
        wait_until(Duration::from_secs(10), || !cgroup.exists()),
        "{cgroup:?} outlived its attempt"
    );
}

#[test]
fn a_lost_attempt_of_a_killed_keeper_is_torn_down_by_its_cgroup() {
    let mut c = Case::new();
    let id = c.enqueue(Job::shell(format!(
        "if [ -e ran ]; then exit 0; fi; touch ran; {ESCAPE} exec sleep 300"
    )));
    c.start_runner(&args(&[]));
    if !in_cgroups(&c) {
        return;
    }
    let first = c.running(id, 1);
    let escapee = pid_in(&c, "escapee");
    let _guard = Guard(vec![escapee, first.pid.expect("a pid")]);
    kill(
        Pid::from_raw(first.keeper_pid.expect("a keeper") as i32),
        Signal::SIGKILL,
    )
    .expect("the keeper is killed");
    let done = c.ended(id);
    assert_eq!(done.status, Status::Succeeded, "{done:?}");
    assert_eq!(done.attempt, 2);
    assert!(
        wait_until(Duration::from_secs(10), || !alive(escapee)),
        "the escapee {escapee} outlived the teardown of its lost attempt"
    );
    assert!(c.kinds(id).contains(&"reclaimed".to_owned()));
}

#[test]
fn a_runner_run_as_a_job_goes_with_its_attempt_keepers_and_all() {
    let mut c = Case::new();
    let inner = c.db.dir.path().join("inner.db");
    let inner_store = Store::open(&inner).expect("the inner database");
    let inner_id = inner_store
        .enqueue(&Job::shell("echo $$ > inner; exec sleep 300").cwd(c.db.dir.path()))
        .expect("enqueue");
    drop(inner_store);
    let bin = assert_cmd::cargo::cargo_bin("leasehold");
    let outer = c.enqueue(
        Job::command([
            bin.to_string_lossy().as_ref(),
            "--db",
            inner.to_string_lossy().as_ref(),
            "run",
        ])
        .timeout(Duration::from_secs(2))
        .max_attempts(1),
    );
    c.start_runner(&args(&[]));
    if !in_cgroups(&c) {
        return;
    }
    let inner_pid = pid_in(&c, "inner");
    let inner_keeper = c.wait_for("the inner job's keeper", |_| {
        Store::open(&inner).ok()?.job(inner_id).ok()?.keeper_pid
    });
    let outer_runner = c.running(outer, 1).pid.expect("a pid");
    let _guard = Guard(vec![inner_pid, inner_keeper, outer_runner]);
    let done = c.ended(outer);
    assert_eq!(done.status, Status::Failed, "{done:?}");
    assert!(
        wait_until(Duration::from_secs(10), || !alive(inner_pid)
            && !alive(inner_keeper)),
        "the inner job {inner_pid} or its keeper {inner_keeper} outlived the outer attempt"
    );
}

#[test]
fn status_says_how_a_runner_contains_its_attempts_and_the_switch_turns_cgroups_off() {
    let mut c = Case::new();
    c.start_runner(&args(&[]));
    let how = containment_of(&c);
    let root = nix::unistd::Uid::effective().is_root();
    let v2 = std::fs::read_to_string("/proc/self/mountinfo")
        .is_ok_and(|m| m.lines().any(|l| l.contains(" - cgroup2 ")));
    let off = std::env::var_os("LEASEHOLD_CGROUPS").is_some_and(|v| v == "off");
    if root && v2 && !off {
        assert!(how.starts_with("cgroup /"), "{how}");
    } else {
        eprintln!("not root, no cgroup v2, or turned off: the runner says {how}");
        assert!(how.starts_with("process groups ("), "{how}");
    }
    let status = assert_cmd::Command::cargo_bin("leasehold")
        .expect("the binary")
        .args(["--db", c.db.path.to_str().expect("a path"), "status"])
        .output()
        .expect("status runs");
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains(&format!("attempts contained by {how}")),
        "{text}"
    );
    // And which way each cap is in force: by the cgroup's files, or by rlimits where the
    // controllers were refused (the CI machine's cgroup v2 offers only hugetlb).
    assert!(how.contains("; caps: memory by "), "{how}");
    if how.starts_with("cgroup /") && !how.contains("memory by memory.max") {
        eprintln!("the cgroup mode's memory controller was refused here: {how}");
        assert!(how.contains("refused: the node's parent offers"), "{how}");
    }
    drop(c);

    let mut c = Case::new();
    let r = crate::util::RunnerProcess::start_with_env(
        &c.db.path,
        &args(&[]),
        &[("LEASEHOLD_CGROUPS", "off")],
    );
    c.runners.push(r);
    let how = containment_of(&c);
    assert_eq!(
        how,
        "process groups (turned off by LEASEHOLD_CGROUPS=off); caps: memory by RLIMIT_DATA, \
         pids by RLIMIT_NPROC, cpu weight not in force"
    );
}
