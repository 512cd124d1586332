//! Runners in different PID namespaces on one file: each proves another dead only by evidence
//! it can see, and tears down only processes it can see. A real `unshare --pid --fork
//! --mount-proc leasehold run` beside a plain `leasehold run`, both directions.

use std::process::{Child, Command, Stdio};

use leasehold::{Job, Status};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::helper::{Case, PID_SCRIPT, args};
use crate::util::{leasehold_vars, token_alive};

/// `leasehold run` as pid 1 of a new PID namespace (with its own /proc). Dropping it kills
/// the namespace's init by its pid on this side (which ends every process in the namespace)
/// and then `unshare` itself, and reaps it.
struct NamespacedRunner {
    unshare: Child,
    log: std::path::PathBuf,
}

impl NamespacedRunner {
    /// Starts it, or says why it cannot (not root, no `unshare`, namespaces refused).
    fn start(c: &Case, extra: &[&str]) -> Result<NamespacedRunner, String> {
        let probe = Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc", "true"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| format!("cannot run unshare: {e}"))?;
        if !probe.status.success() {
            return Err(format!(
                "unshare --pid --fork --mount-proc is refused here ({}): {}",
                probe.status,
                String::from_utf8_lossy(&probe.stderr).trim()
            ));
        }
        let folder = c.db.dir.path();
        let log = folder.join("namespaced-runner.log");
        let mut cmd = Command::new("unshare");
        cmd.args(["--pid", "--fork", "--kill-child", "--mount-proc"])
            .arg(assert_cmd::cargo::cargo_bin("leasehold"))
            .arg("--db")
            .arg(&c.db.path)
            .arg("run")
            .args(args(extra));
        for var in leasehold_vars() {
            cmd.env_remove(var);
        }
        let (k, v) = c.marker.split_once('=').unwrap();
        let unshare = cmd
            .env(k, v)
            .env("RUST_LOG", "leasehold=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("the log file can be created"))
            .spawn()
            .map_err(|e| format!("cannot start unshare: {e}"))?;
        Ok(NamespacedRunner { unshare, log })
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for NamespacedRunner {
    fn drop(&mut self) {
        let me = self.unshare.id() as i32;
        // The namespace's init is unshare's child: killing it ends the whole namespace.
        for pid in crate::util::host::children_of(me) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        let _ = kill(Pid::from_raw(me), Signal::SIGKILL);
        let _ = self.unshare.wait();
    }
}

/// How many sweeps a runner's debug log shows.
fn sweeps(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("sweep: nothing to do") || l.contains("sweep reclaimed_pending="))
        .count()
}

fn skip(why: &str) {
    eprintln!("SKIPPED: {why}");
}

#[test]
fn a_plain_runner_does_not_reap_a_namespaced_runners_live_job() {
    let c = Case::new();
    let inside = match NamespacedRunner::start(&c, &["--lease-ttl", "3"]) {
        Ok(r) => r,
        Err(why) => return skip(&why),
    };
    let id = c.enqueue(Job::shell("sleep 300"));
    let first = c.wait_for("the namespaced runner to run the job", |c| {
        let j = c.job(id);
        (j.status == Status::Running && j.pid.is_some()).then_some(j)
    });
    let token = first.run_token.clone().unwrap();
    // A plain runner beside it, which sees pid 1 of the namespace as this host's init.
    let (k, v) = c.marker.split_once('=').unwrap();
    let marker = (k.to_string(), v.to_string());
    let outside = crate::util::RunnerProcess::start_with_env(
        &c.db.path,
        &args(&["--lease-ttl", "3"]),
        &[(&marker.0, &marker.1), ("RUST_LOG", "leasehold=debug")],
    );
    let runners_log = |what: &str| {
        format!(
            "{what}\ninside:\n{}\noutside:\n{}",
            inside.log(),
            outside.log()
        )
    };
    // Several sweeps of the plain runner, while the namespaced one renews the lease.
    let swept = crate::util::poll(crate::helper::WAIT, || {
        (sweeps(&outside.log()) >= 4 || c.job(id).run_token.as_deref() != Some(&token))
            .then_some(())
    });
    assert!(swept.is_some(), "{}", runners_log("no sweeps"));
    let now = c.job(id);
    eprintln!(
        "after {} sweeps of the plain runner: status {}, attempt {}, recovery_count {}",
        sweeps(&outside.log()),
        now.status,
        now.attempt,
        now.recovery_count
    );
    assert!(
        !outside.log().contains("is dead"),
        "{}",
        runners_log("the plain runner declared a live runner dead")
    );
    assert_eq!(now.status, Status::Running, "{}", runners_log("reaped"));
    assert_eq!(now.run_token.as_deref(), Some(token.as_str()));
    assert_eq!(now.recovery_count, 0, "{}", runners_log("reclaimed"));
    assert!(
        token_alive(&token),
        "the live attempt's processes were killed"
    );
    drop(outside);
    drop(inside);
}

#[test]
fn a_namespaced_runner_does_not_tear_down_an_attempt_it_cannot_see() {
    let mut c = Case::new();
    let id = c.enqueue(Job::shell(PID_SCRIPT));
    let r = c.start_runner(&args(&["--lease-ttl", "3"]));
    let first = c.running(id, 1);
    let token = first.run_token.clone().unwrap();
    c.wait_for("the first pid", |c| {
        (!c.file("pids").is_empty()).then_some(())
    });
    // The runner dies; its attempt lives on, in this (the host's) namespace.
    c.crash(r);
    assert!(token_alive(&token));

    let inside = match NamespacedRunner::start(&c, &["--lease-ttl", "3"]) {
        Ok(r) => r,
        Err(why) => return skip(&why),
    };
    let logs = |c: &Case, what: &str| {
        format!("{what}\ninside:\n{}\nkinds {:?}", inside.log(), c.kinds(id))
    };
    // It reclaims the job once the lease expires (or its runner is proven dead)...
    c.wait_for("the namespaced runner to reclaim the job", |c| {
        (c.job(id).recovery_count >= 1).then_some(())
    });
    // ... and then sweeps a few more times, unable to see the lost attempt.
    let after = sweeps(&inside.log());
    let swept = crate::util::poll(crate::helper::WAIT, || {
        (sweeps(&inside.log()) >= after + 4).then_some(())
    });
    assert!(swept.is_some(), "{}", logs(&c, "no sweeps"));
    let waiting = c.job(id);
    let kinds = c.kinds(id);
    eprintln!(
        "after {} more sweeps inside the namespace: status {}, attempt {}, teardown_pending {}, \
         events {kinds:?}, first attempt alive: {}",
        sweeps(&inside.log()) - after,
        waiting.status,
        waiting.attempt,
        waiting.teardown_pending,
        token_alive(&token)
    );
    assert!(
        !kinds.iter().any(|k| k == "torn_down"),
        "{}",
        logs(
            &c,
            "torn_down recorded by a runner that cannot see the attempt"
        )
    );
    assert!(waiting.teardown_pending, "{waiting:?}");
    assert_eq!(waiting.status, Status::Pending, "{waiting:?}");
    assert!(
        token_alive(&token),
        "the first attempt still runs, so no second one may"
    );
    // The operator's views say why it waits.
    let leasehold = |args: &[&str]| {
        let out = Command::new(assert_cmd::cargo::cargo_bin("leasehold"))
            .arg("--db")
            .arg(&c.db.path)
            .args(args)
            .output()
            .expect("leasehold runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let host_ns = std::fs::read_link("/proc/self/ns/pid").unwrap();
    let host_ns = host_ns.to_string_lossy();
    let ns = host_ns.trim_start_matches("pid:[").trim_end_matches(']');
    let why = format!("teardown waits for a runner in PID namespace {ns}");
    let inspect = leasehold(&["jobs", "inspect", &id.to_string()]);
    assert!(inspect.contains(&why), "{inspect}");
    assert!(
        inspect.contains("no runner is registered there"),
        "{inspect}"
    );
    let status = leasehold(&["status"]);
    assert!(
        status.contains(&format!("teardown: job {id} {why}")),
        "{status}"
    );

    // A plain runner (in the lost attempt's namespace) tears it down, and the job runs again.
    c.start_runner(&args(&["--lease-ttl", "3"]));
    let done = c.ended(id);
    assert_eq!(
        done.status,
        Status::Succeeded,
        "{}",
        logs(&c, "not succeeded")
    );
    assert!(
        !token_alive(&token),
        "the lost attempt's processes are gone"
    );
    assert_eq!(c.file("overlap"), "", "attempts overlapped");
    let kinds = c.kinds(id);
    let torn = kinds
        .iter()
        .position(|k| k == "torn_down")
        .expect("torn_down");
    let second = kinds.iter().rposition(|k| k == "claimed").unwrap();
    assert!(torn < second, "{kinds:?}");
    drop(inside);
}

#[test]
fn an_operator_forces_a_teardown_no_runner_can_see_and_is_told_what_was_not_verified() {
    let mut c = Case::new();
    let id = c.enqueue(Job::shell(PID_SCRIPT));
    let r = c.start_runner(&args(&["--lease-ttl", "3"]));
    let token = c.running(id, 1).run_token.unwrap();
    c.wait_for("the first pid", |c| {
        (!c.file("pids").is_empty()).then_some(())
    });
    c.crash(r);
    let inside = match NamespacedRunner::start(&c, &["--lease-ttl", "3"]) {
        Ok(r) => r,
        Err(why) => return skip(&why),
    };
    c.wait_for("the namespaced runner to reclaim the job", |c| {
        let j = c.job(id);
        (j.recovery_count >= 1 && j.teardown_pending).then_some(())
    });
    // The operator, in a namespace of its own too, forces it.
    let out = Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", "--mount-proc"])
        .arg(assert_cmd::cargo::cargo_bin("leasehold"))
        .arg("--db")
        .arg(&c.db.path)
        .args(["jobs", "retry", "--force", &id.to_string()])
        .output()
        .expect("unshare runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("job 1 was already pending"), "{stdout}");
    assert!(
        stdout.contains("recorded torn down: forced by the operator: not verified"),
        "{stdout}"
    );
    let done = c.ended(id);
    assert_eq!(done.status, Status::Succeeded, "{}", inside.log());
    let events = c.store().events(id).unwrap();
    let torn = events
        .iter()
        .find(|e| e.kind == "torn_down")
        .expect("torn_down");
    let detail = torn.detail.clone().unwrap_or_default();
    eprintln!("forced: {stdout}torn_down: {detail}");
    assert!(
        detail.contains("not verified that attempt 1 is gone"),
        "{detail}"
    );
    // Forced unverified: the first attempt was not signalled (the test's cleanup ends it).
    assert!(token_alive(&token));
    drop(inside);
}
