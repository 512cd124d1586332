//! An operator's cancel and retry from another host, while the host that runs the job is
//! frozen: the job is not run again there before the frozen host's keeper has stopped the
//! attempt, at the end of the lease the attempt held when it was cancelled.

use std::process::{Command, Output, Stdio};

use leasehold::{Job, Status, Store, now_ms};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::helper::{WAIT, args};
use crate::util::host::{Host, require_namespaces};
use crate::util::{TestDb, leasehold_vars, poll, processes_with_env};

/// Appends `<run token> <ns clock>` to `ticks` every 200 ms. The job's first attempt (the one
/// that makes `first.d`) ticks until it is stopped; any later one ticks ten times and succeeds.
const TICKER: &str = r#"
if mkdir first.d 2>/dev/null; then n=-1000000; else n=0; fi
while [ $n -lt 10 ]; do
  echo "$LEASEHOLD_RUN_TOKEN $(date +%s%N)" >> ticks
  n=$((n + 1))
  sleep 0.2
done
"#;

/// `leasehold --db URL ARGS` as the first process of a UTS and PID namespace of its own named
/// `host`: an operator's command on another host.
fn on_host(db: &TestDb, marker: (&str, &str), host: &str, cmd_args: &[&str]) -> Output {
    let url = &db.pg.as_ref().expect("a PostgreSQL database").url;
    let mut cmd = Command::new("unshare");
    cmd.args(["--uts", "--pid", "--fork", "--kill-child", "--mount-proc"])
        .args(["sh", "-c", r#"hostname "$1" && shift && exec "$@""#, "sh"])
        .arg(host)
        .arg(assert_cmd::cargo::cargo_bin("leasehold"))
        .args(["--db", url])
        .args(cmd_args);
    for var in leasehold_vars() {
        cmd.env_remove(var);
    }
    cmd.env("HOME", db.dir.path().join("home"))
        .env("XDG_STATE_HOME", db.dir.path().join("home/.local/state"))
        .env(marker.0, marker.1)
        .stdin(Stdio::null())
        .output()
        .expect("unshare runs")
}

/// The lines of `ticks`: (run token, ns clock), in the order they were written.
fn ticks(text: &str) -> Vec<(String, i64)> {
    text.lines()
        .filter_map(|l| {
            let (token, at) = l.split_once(' ')?;
            Some((token.to_string(), at.trim().parse().ok()?))
        })
        .collect()
}

#[test]
fn a_cancel_and_retry_from_another_host_waits_for_the_frozen_hosts_lease_to_end() {
    require_namespaces();
    let db = TestDb::postgres("retry_elsewhere");
    let dir = db.dir.path().to_path_buf();
    std::fs::create_dir_all(dir.join("home")).unwrap();
    let url = db.pg.as_ref().unwrap().url.clone();
    let marker = (
        "LEASEHOLD_TEST_CASE".to_string(),
        db.pg.as_ref().unwrap().name().to_string(),
    );
    let env = [
        (marker.0.as_str(), marker.1.as_str()),
        ("RUST_LOG", "leasehold=debug"),
    ];
    let store = || Store::open(&url).expect("the test database opens");
    drop(store());
    let run = args(&["--lease-ttl", "3"]);
    let home = dir.join("home");
    let mut hosts = vec![Host::start("host-a", &url, &home, &dir, &run, &env)];
    let up = |name: &str| {
        poll(WAIT, || {
            store()
                .runners()
                .unwrap()
                .iter()
                .any(|r| r.host == name && r.stopped_at.is_none())
                .then_some(())
        })
        .unwrap_or_else(|| panic!("host {name}'s runner did not register"));
    };
    up("host-a");
    let id = store()
        .enqueue(&Job::shell(TICKER).cwd(&dir))
        .expect("enqueue");
    let first = poll(WAIT, || {
        let j = store().job(id).unwrap();
        let ticking =
            !ticks(&std::fs::read_to_string(dir.join("ticks")).unwrap_or_default()).is_empty();
        (j.status == Status::Running && ticking).then_some(j)
    })
    .expect("the first attempt ticks on host A");
    let old_token = first.run_token.clone().unwrap();
    hosts.push(Host::start("host-b", &url, &home, &dir, &run, &env));
    up("host-b");
    let logs = |hosts: &[Host]| {
        hosts
            .iter()
            .map(|h| format!("--- {}:\n{}", h.name(), h.log()))
            .collect::<String>()
    };

    // Host A's runner freezes; its keeper runs on, and the attempt ticks on until the keeper
    // stops it at the end of the lease the runner last renewed.
    hosts[0].signal(Signal::SIGSTOP);
    let held = store().job(id).unwrap();
    let lease_end = held.lease_expires_at.expect("a lease");
    let marker_ref = (marker.0.as_str(), marker.1.as_str());
    let cancel = on_host(
        &db,
        marker_ref,
        "host-b",
        &["jobs", "cancel", &id.to_string()],
    );
    assert!(cancel.status.success(), "{cancel:?}");
    let retry = on_host(
        &db,
        marker_ref,
        "host-b",
        &["jobs", "retry", &id.to_string()],
    );
    assert!(retry.status.success(), "{retry:?}");
    let retried_at = now_ms();

    let done = poll(WAIT, || {
        let j = store().job(id).unwrap();
        j.status.is_terminal().then_some(j)
    })
    .unwrap_or_else(|| panic!("the retried job did not end\n{}", logs(&hosts)));
    assert_eq!(done.status, Status::Succeeded, "{done:?}");
    let events = store().events(id).unwrap();
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    let claimed_again = events
        .iter()
        .rfind(|e| e.kind.as_str() == "claimed")
        .expect("a claim");
    let torn = events
        .iter()
        .find(|e| e.kind.as_str() == "torn_down")
        .expect("a torn_down event");

    let lines = ticks(&std::fs::read_to_string(dir.join("ticks")).unwrap());
    let tokens: Vec<&str> = lines.iter().map(|(t, _)| t.as_str()).collect();
    let old_last = lines
        .iter()
        .rposition(|(t, _)| *t == old_token)
        .expect("the first attempt ticked");
    let new_first = lines
        .iter()
        .position(|(t, _)| *t != old_token)
        .expect("the retried attempt ticked");
    let overlap_ms = (lines[old_last].1 - lines[new_first].1) / 1_000_000;
    eprintln!(
        "lease ended {} ms after the retry; torn down {} ms after it ({}); claimed again {} ms \
         after it; first attempt's last tick {} ms after the retried attempt's first; \
         events {kinds:?}",
        lease_end - retried_at,
        torn.at - lease_end,
        torn.detail.as_deref().unwrap_or_default(),
        claimed_again.at - lease_end,
        overlap_ms
    );
    assert!(
        old_last < new_first,
        "the two attempts ran at once for {overlap_ms} ms: ticks {tokens:?}\n{}",
        logs(&hosts)
    );
    assert!(
        claimed_again.at >= lease_end,
        "claimed again {} ms before the frozen attempt's lease ended: {kinds:?}",
        lease_end - claimed_again.at
    );

    // Host A thaws; its lease is gone, and nothing of its attempt ticks again.
    hosts[0].signal(Signal::SIGCONT);
    drop(hosts);
    for pid in processes_with_env(&format!("{}={}", marker.0, marker.1)) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
}
