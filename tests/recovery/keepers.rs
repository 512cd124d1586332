//! Attempts under keepers outlive their runner: a killed runner's finished attempts are
//! recorded, not rerun; its running ones are adopted by the next runner; `--on-exit leave`
//! leaves them running; a cancel or a timeout still ends them; a keeper killed by hand is
//! torn down and reclaimed as a runner's crash was before keepers. An attempt its runner
//! released costs no write; one whose runner died has its outcome journaled, flushed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use leasehold::{ErrorKind, Job, Status};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::helper::{Case, args, args_with_workers};
use crate::util::strace::{Trace, at, flushes};
use crate::util::{alive, group_alive, poll, wait_until};

/// The attempt's folder of job `id`'s `attempt`, under the case's database.
fn attempt_dir(c: &Case, id: i64) -> std::path::PathBuf {
    let job = c.job(id);
    let mut folder = std::fs::canonicalize(&c.db.path)
        .expect("the database exists")
        .into_os_string();
    folder.push("-attempts");
    std::path::PathBuf::from(folder)
        .join(id.to_string())
        .join(format!(
            "{}-{}",
            job.attempt,
            job.run_token.expect("a run token")
        ))
}

/// Enqueues `job`, starts a runner with `--on-exit leave` and waits for the job to run;
/// returns the job, its first attempt and the runner's index.
fn leave_running(c: &mut Case, job: Job) -> (i64, leasehold::JobRecord, usize) {
    let id = c.enqueue(job);
    let r = c.start_runner(&args(&["--on-exit", "leave"]));
    let first = c.running(id, 1);
    (id, first, r)
}

/// Stops runner `r` with SIGTERM and waits for it to exit.
fn stop(c: &mut Case, r: usize) {
    c.signal(r, Signal::SIGTERM);
    c.runners[r].wait(Duration::from_secs(5));
}

/// Waits until `pid` is gone (or a zombie), polling.
fn wait_gone(c: &Case, what: &str, pid: i64) {
    c.wait_for(what, |_| (!alive(pid)).then_some(()));
}

/// A job that waits for the file `go` in the case's folder, records its run, and exits 3.
const WAIT_FOR_GO: &str = "while [ ! -e go ]; do sleep 0.01; done; echo ran >> effects; exit 3";

/// The journals in the case's attempts folder: (file name, text).
fn journals(c: &Case) -> Vec<(String, String)> {
    let mut folder = std::fs::canonicalize(&c.db.path)
        .expect("the database exists")
        .into_os_string();
    folder.push("-attempts");
    let Ok(entries) = std::fs::read_dir(&folder) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.ends_with(".journal")
                .then(|| (name, std::fs::read_to_string(e.path()).unwrap_or_default()))
        })
        .collect()
}

/// A runner that records the end releases the attempt to the keeper after its commit: the
/// keeper writes nothing (no journal, no folder, no flush) for a job that printed a line, and
/// runs on for the runner's next job.
#[test]
fn an_attempt_its_runner_released_leaves_nothing_on_disk() {
    let mut c = Case::new();
    let id = c.enqueue(Job::shell(WAIT_FOR_GO));
    c.start_runner(&args(&[]));
    let keeper = c.running(id, 1).keeper_pid.expect("a keeper");
    let mut trace = Trace::attach(keeper, c.db.dir.path().join("strace"));
    std::fs::write(c.db.dir.path().join("go"), "").unwrap();
    let done = c.ended(id);
    assert_eq!((done.status, done.exit_code), (Status::Failed, Some(3)));
    let next = c.enqueue(Job::shell("echo second"));
    let second = c.ended(next);
    assert_eq!(second.status, Status::Succeeded);
    assert_eq!(second.keeper_pid, Some(keeper), "one keeper for both");
    let calls = trace.detach();
    assert!(
        !flushes(&calls),
        "a released attempt flushes nothing: {calls:#?}"
    );
    assert!(!attempt_dir(&c, id).exists(), "no folder for a quiet job");
    assert!(journals(&c).is_empty(), "no journal: {:?}", journals(&c));
    let out = c
        .store()
        .output(next, None)
        .unwrap()
        .expect("an output row");
    assert_eq!(out.stdout, b"second\n");
}

/// A runner SIGKILLed after the keeper reported the end but before the release: the keeper
/// journals the outcome and flushes it, then reaps the command, then exits (its runner and
/// its last attempt gone); the next runner records that outcome without a rerun.
#[test]
fn a_runner_that_dies_before_the_release_has_the_outcome_journaled_not_rerun() {
    let mut c = Case::new();
    let id = c.enqueue(Job::shell(WAIT_FOR_GO));
    let r = c.start_runner(&args(&[]));
    let running = c.running(id, 1);
    let keeper = running.keeper_pid.expect("a keeper");
    let token = running.run_token.clone().expect("a token");
    let mut trace = Trace::attach(keeper, c.db.dir.path().join("strace"));
    // Stopped, the runner reads nothing: the keeper reports the end into the socket, and
    // the runner is killed before it can release.
    c.signal(r, Signal::SIGSTOP);
    let stat = format!("/proc/{}/stat", c.runners[r].pid());
    assert!(
        wait_until(Duration::from_secs(10), || std::fs::read_to_string(&stat)
            .is_ok_and(|s| s
                .rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('T')))),
        "the runner stopped"
    );
    std::fs::write(c.db.dir.path().join("go"), "").unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || c.file("effects") == "ran\n"),
        "the command ran"
    );
    assert!(
        journals(&c).is_empty(),
        "nothing journaled while the runner lives"
    );
    c.crash(r);
    wait_gone(&c, "the keeper to finish alone", keeper);
    let journal = journals(&c);
    assert_eq!(journal.len(), 1, "{journal:?}");
    let line = journal[0]
        .1
        .lines()
        .find(|l| l.starts_with("outcome "))
        .unwrap_or_default();
    assert!(
        line.starts_with(&format!("outcome {token} exit 3 ")),
        "{journal:?}"
    );
    let calls = trace.calls();
    let wrote = at(&calls, "write(", "outcome ");
    let flushed = at(&calls, "fdatasync(", ".journal>");
    let reaped = at(&calls, "wait4(", "");
    let exit = at(&calls, "exit_group", "");
    assert!(
        wrote < flushed && flushed < reaped && reaped < exit,
        "journaled, flushed, then the command reaped, then gone: {calls:#?}"
    );

    c.start_runner(&args(&[]));
    let done = c.ended(id);
    assert_eq!((done.status, done.exit_code), (Status::Failed, Some(3)));
    assert_eq!(done.attempt, 1);
    assert_eq!(c.file("effects"), "ran\n", "run once");
    assert!(c.kinds(id).contains(&"outcome_recovered".to_string()));
}

/// 200 jobs of 0.4 s while the runner is SIGKILLed and restarted every 0.7 s: every job
/// succeeds, no two attempts of a job overlap, and each job's side effect happens exactly
/// once. Before keepers a finished attempt whose runner was dead was run again: 27 reruns in
/// 27 kills.
#[test]
fn sigkill_every_0_7_s_reruns_no_finished_work() {
    let mut c = Case::new();
    let ids: Vec<i64> = (0..200)
        .map(|_| {
            // An overlap is an attempt that starts while the job's previous one still lives.
            c.enqueue(Job::shell(
                r#"p=pid.$LEASEHOLD_JOB_ID
if [ -s $p ]; then
  st=$(sed 's/.*) //' /proc/$(cat $p)/stat 2>/dev/null | cut -c1)
  if [ -n "$st" ] && [ "$st" != Z ]; then echo "$LEASEHOLD_JOB_ID" >> overlaps; fi
fi
echo $$ > $p
echo "start $LEASEHOLD_JOB_ID" >> runs; sleep 0.4
echo "$LEASEHOLD_JOB_ID" >> effects; echo "end $LEASEHOLD_JOB_ID" >> runs"#,
            ))
        })
        .collect();
    let opts = args_with_workers("8", &["--lease-ttl", "30"]);
    let begun = Instant::now();
    let mut kills = 0;
    loop {
        let r = c.start_runner(&opts);
        std::thread::sleep(Duration::from_millis(700));
        let done = c.store().counts().expect("counts");
        if done.succeeded + done.failed + done.cancelled == ids.len() as u64 {
            break;
        }
        c.crash(r);
        kills += 1;
        assert!(
            begun.elapsed() < Duration::from_secs(240),
            "still not done after {kills} kills"
        );
    }
    let mut effects: BTreeMap<i64, usize> = BTreeMap::new();
    for line in c.file("effects").lines() {
        *effects.entry(line.parse().expect("a job id")).or_default() += 1;
    }
    let reruns: usize = effects.values().map(|n| n - 1).sum();
    let overlaps = c.file("overlaps").lines().count();
    // Attempts cut short: a runner killed between the keeper's spawn and its record, whose
    // keeper is found by its token and adopted, cuts none; a start without an end is one.
    let runs = c.file("runs");
    let cut_short = runs.lines().filter(|l| l.starts_with("start")).count()
        - runs.lines().filter(|l| l.starts_with("end")).count();
    let store = c.store();
    let events_of = |kind: &str| -> usize {
        ids.iter()
            .map(|&id| {
                let events = store.events(id).unwrap();
                events.iter().filter(|e| e.kind == kind).count()
            })
            .sum()
    };
    let (recovered, adopted) = (events_of("outcome_recovered"), events_of("adopted"));
    eprintln!(
        "{kills} kills in {:.1}s: {reruns} reruns of finished work, {overlaps} overlaps, \
         {cut_short} attempts cut short, {adopted} attempts adopted, {recovered} outcomes \
         recovered",
        begun.elapsed().as_secs_f64()
    );
    assert!(kills >= 5, "only {kills} kills: the soak did not soak");
    for &id in &ids {
        let job = c.job(id);
        assert_eq!(job.status, Status::Succeeded, "{job:?}");
        assert_eq!(effects.get(&id), Some(&1), "job {id}'s side effect");
    }
    assert_eq!(reruns, 0);
    assert_eq!(overlaps, 0);
}

/// `run --on-exit leave` with a 5 s job, SIGTERM after 1 s: the command exits within a second
/// and the job runs on; a runner started 2 s later adopts it, and it ends succeeded with
/// attempt 1, its whole output in its files and its tail in the database.
#[test]
fn on_exit_leave_leaves_the_job_running_for_the_next_runner_to_adopt() {
    let mut c = Case::new();
    let (id, first, r) = leave_running(
        &mut c,
        Job::shell("for i in 1 2 3 4 5; do echo line $i; sleep 1; done"),
    );
    std::thread::sleep(Duration::from_secs(1));
    let term = Instant::now();
    c.signal(r, Signal::SIGTERM);
    let (code, log) = c.runners[r].wait(Duration::from_secs(5));
    let took = term.elapsed();
    assert_eq!(code, Some(0), "{log}");
    assert!(took < Duration::from_secs(1), "exit took {took:?}");
    assert!(
        group_alive(first.pgid.unwrap()),
        "the job's processes run on after their runner exited"
    );
    assert_eq!(c.job(id).status, Status::Running);

    // Shown as it is: running, kept by its keeper, with no runner.
    let cli_json = |args: &[&str]| -> serde_json::Value {
        let out = std::process::Command::new(assert_cmd::cargo::cargo_bin("leasehold"))
            .arg("--db")
            .arg(&c.db.path)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let inspected = cli_json(&["jobs", "inspect", &id.to_string(), "--json"]);
    assert_eq!(inspected["status"], "running");
    let kept = inspected["kept"].as_str().expect("a kept line");
    assert!(kept.starts_with("kept, no runner: its runner"), "{kept}");
    assert!(kept.contains("runs it on"), "{kept}");
    let status = cli_json(&["status", "--json"]);
    assert_eq!(status["kept"][0]["job"], id, "{status}");

    std::thread::sleep(Duration::from_secs(1));
    assert!(group_alive(first.pgid.unwrap()), "still running");
    c.start_runner(&args(&[]));
    let done = c.ended(id);
    assert_eq!(done.status, Status::Succeeded, "{done:?}");
    assert_eq!(done.attempt, 1);
    assert_eq!(done.recovery_count, 0);
    let kinds = c.kinds(id);
    assert!(kinds.contains(&"adopted".to_string()), "{kinds:?}");
    assert_eq!(kinds.iter().filter(|k| *k == "started").count(), 1);
    let whole: String = (1..=5).map(|i| format!("line {i}\n")).collect();
    let dir = attempt_dir(&c, id);
    assert_eq!(std::fs::read_to_string(dir.join("stdout")).unwrap(), whole);
    let tail = c.store().output(id, None).unwrap().expect("an output row");
    assert_eq!(String::from_utf8_lossy(&tail.stdout), whole);
}

/// The same job left running, with no runner until it has finished: the next runner records
/// the outcome its keeper wrote, and does not run it again.
#[test]
fn an_outcome_written_while_no_runner_ran_is_recorded_without_a_rerun() {
    let mut c = Case::new();
    let (id, first, r) = leave_running(
        &mut c,
        Job::shell("echo ran >> effects; sleep 1; echo out; echo err >&2; exit 3"),
    );
    stop(&mut c, r);
    let keeper = first.keeper_pid.expect("a keeper");
    wait_gone(&c, "the keeper to finish alone", keeper);
    let token = first.run_token.clone().expect("a token");
    let journal = journals(&c);
    assert!(
        journal
            .iter()
            .any(|(_, text)| text.contains(&format!("outcome {token} exit 3 "))),
        "{journal:?}"
    );
    assert_eq!(c.job(id).status, Status::Running, "nobody recorded it yet");

    c.start_runner(&args(&[]));
    let done = c.ended(id);
    assert_eq!(done.status, Status::Failed, "{done:?}");
    assert_eq!(done.exit_code, Some(3));
    assert_eq!(done.attempt, 1);
    assert_eq!(c.file("effects"), "ran\n", "run once");
    assert!(c.kinds(id).contains(&"outcome_recovered".to_string()));
    let out = c.store().output(id, None).unwrap().expect("an output row");
    assert_eq!(
        (out.stdout.as_slice(), out.stderr.as_slice()),
        (&b"out\n"[..], &b"err\n"[..])
    );
}

/// A job whose timeout passes while no runner runs is killed as soon as it is adopted, and
/// ends `timeout`.
#[test]
fn a_timeout_that_passed_while_no_runner_ran_kills_the_job_once_adopted() {
    let mut c = Case::new();
    let (id, first, r) = leave_running(
        &mut c,
        Job::shell("echo started; sleep 300").timeout(Duration::from_secs(2)),
    );
    stop(&mut c, r);
    // Past the deadline with no runner alive: the job still runs.
    std::thread::sleep(Duration::from_secs(3));
    assert!(group_alive(first.pgid.unwrap()));
    let adopted_at = Instant::now();
    c.start_runner(&args(&[]));
    let done = c.ended(id);
    assert_eq!(done.status, Status::Failed, "{done:?}");
    assert_eq!(done.error_kind, Some(ErrorKind::Timeout));
    assert!(
        adopted_at.elapsed() < Duration::from_secs(5),
        "killed {:?} after the adoption",
        adopted_at.elapsed()
    );
    assert!(!group_alive(first.pgid.unwrap()));
    wait_gone(&c, "the keeper", first.keeper_pid.unwrap());
}

/// A cancel of a job left running under its keeper: the command's group and the keeper are
/// gone, and the job is cancelled.
#[test]
fn cancelling_a_kept_job_ends_its_command_and_its_keeper() {
    let mut c = Case::new();
    let (id, first, r) = leave_running(&mut c, Job::shell("sleep 300"));
    stop(&mut c, r);
    let out = std::process::Command::new(assert_cmd::cargo::cargo_bin("leasehold"))
        .arg("--db")
        .arg(&c.db.path)
        .args(["jobs", "cancel", &id.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The cancel's teardown, or the next runner's, ends the command; its keeper then exits.
    c.start_runner(&args(&[]));
    c.wait_for("the command's group to end", |_| {
        (!group_alive(first.pgid.unwrap())).then_some(())
    });
    wait_gone(&c, "the keeper", first.keeper_pid.unwrap());
    assert_eq!(c.job(id).status, Status::Cancelled);
}

/// A keeper SIGKILLed by hand: its runner cannot learn how the command ended, so it tears the
/// attempt down and the job runs again, never two attempts at once.
#[test]
fn a_keeper_killed_by_hand_is_torn_down_and_reclaimed() {
    let mut c = Case::new();
    let id = c.enqueue(Job::shell(crate::helper::PID_SCRIPT));
    c.start_runner(&args(&[]));
    let first = c.running(id, 1);
    c.wait_for("the first pid", |c| {
        (!c.file("pids").is_empty()).then_some(())
    });
    kill(
        Pid::from_raw(first.keeper_pid.unwrap() as i32),
        Signal::SIGKILL,
    )
    .unwrap();
    let done = c.ended(id);
    assert_eq!(done.status, Status::Succeeded, "{done:?}");
    assert_eq!(done.attempt, 2);
    assert_eq!(done.recovery_count, 1);
    assert_eq!(c.file("overlap"), "", "attempts overlapped");
    assert!(!group_alive(first.pgid.unwrap()));
    let reclaimed = c.kinds(id);
    assert!(
        reclaimed.contains(&"reclaimed".to_string()),
        "{reclaimed:?}"
    );
}

/// A keeper's memory is its own: a runner that touched 500 MB before starting a job gives its
/// keeper none of it (the keeper is exec'ed, not forked).
#[test]
fn a_keeper_holds_none_of_a_large_runners_memory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.db");
    let mut big = vec![0u8; 500 << 20];
    for i in (0..big.len()).step_by(4096) {
        big[i] = 1;
    }
    let runner = leasehold::Runner::builder(&path)
        .workers(1)
        .start()
        .expect("starts");
    let id = runner.enqueue(&Job::shell("sleep 10")).unwrap();
    let store = leasehold::Store::open(&path).unwrap();
    let keeper = poll(Duration::from_secs(30), || {
        store.job(id).unwrap().keeper_pid
    })
    .expect("a keeper");
    let rollup = std::fs::read_to_string(format!("/proc/{keeper}/smaps_rollup")).unwrap();
    let kib = |field: &str| -> u64 {
        rollup
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {field} in {rollup}"))
    };
    let (rss, pss) = (kib("Rss:"), kib("Pss:"));
    eprintln!(
        "runner holds {} MiB; its keeper: Rss {rss} kB, Pss {pss} kB",
        big.len() >> 20
    );
    assert!(rss < 8 * 1024, "keeper Rss {rss} kB");
    assert!(pss < 8 * 1024, "keeper Pss {pss} kB");
    runner.cancel(id).unwrap();
    drop(runner);
    std::hint::black_box(&big);
}
