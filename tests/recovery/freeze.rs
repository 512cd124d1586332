//! Frozen runners (SIGSTOP): another runner takes over expired leases, a runner that wakes in
//! time keeps its jobs, and a frozen runner's late results are fenced.

use std::time::Duration;

use leasehold::{Job, JobRecord, Status};
use nix::sys::signal::Signal;

use crate::helper::{Case, PID_SCRIPT, args};
use crate::util::{alive, group_alive};

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
    std::fs::write(c.db.dir.path().join("go"), b"").unwrap();
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

/// Jobs the frozen runner claimed ahead (in its work channel, not started) are run by another
/// runner while it is frozen past their leases. Thawed, it must not start any of them: the
/// test holds the write lock as it thaws, so the renewal cannot report the leases lost, and
/// only the worker's own check stands between a claimed-ahead job and a second run.
#[test]
fn thawed_runner_does_not_start_jobs_it_claimed_before_a_freeze_past_their_leases() {
    let mut c = Case::new();
    // Each run notes its job, its pid and its parent (the runner that spawned it).
    let ids: Vec<i64> = (0..150)
        // The runner is the parent, or the parent of the attempt's keeper (`lh-keeper`).
        .map(|_| {
            c.enqueue(Job::shell(
                r#"r=$PPID; [ "$(cat /proc/$r/comm)" = lh-keeper ] && r=$(cut -d' ' -f4 /proc/$r/stat); echo "$LEASEHOLD_JOB_ID $$ $r" >> runs"#,
            ))
        })
        .collect();
    let opts = [
        "--workers",
        "1",
        "--lease-ttl",
        "1.5",
        "--heartbeat",
        "0.5",
        "--sweep",
        "0.5",
        "--kill-grace",
        "0.5",
        "--shutdown-grace",
        "0.5",
    ];
    let frozen = c.start_runner(&opts);
    let frozen_pid = c.runners[frozen].pid().as_raw();
    let bare = c.db.bare();
    // Freeze it while it holds claimed-ahead jobs: with one worker, two or more running jobs
    // without a recorded process mean at least one waits in the work channel.
    // A runner stopped in the middle of its WAL-index bookkeeping can make this read fail
    // (SQLITE_PROTOCOL): that freeze does not count, and the loop tries again.
    let unstarted = |bare: &rusqlite::Connection| -> i64 {
        bare.query_row(
            "SELECT count(*) FROM jobs WHERE status = 'running' AND pid IS NULL",
            [],
            |r| r.get(0),
        )
        .unwrap_or(0)
    };
    // A runner frozen inside a write transaction would hold SQLite's lock for the whole
    // freeze and wedge the other runner: freeze it only where the lock is free.
    let probe = rusqlite::Connection::open(&c.db.path).unwrap();
    probe.busy_timeout(Duration::from_millis(50)).unwrap();
    let lock_free = || probe.execute_batch("BEGIN IMMEDIATE; ROLLBACK").is_ok();
    let mut held = 0;
    for _ in 0..200 {
        c.signal(frozen, Signal::SIGSTOP);
        held = unstarted(&bare);
        if held >= 2 && lock_free() {
            break;
        }
        held = 0;
        c.signal(frozen, Signal::SIGCONT);
        std::thread::sleep(Duration::from_millis(3));
    }
    assert!(held >= 2, "the runner never held a job claimed ahead");
    // Another runner reclaims and runs them all while the first is frozen past the leases.
    let mut second = opts;
    second[1] = "4";
    c.start_runner(&second);
    for &id in &ids {
        let done = c.ended(id);
        assert_eq!(done.status, Status::Succeeded, "{done:?}");
    }
    let before = c.file("runs").lines().count();
    // Thaw with the write lock held: the heartbeat cannot learn that the leases are gone.
    bare.execute_batch("BEGIN IMMEDIATE").unwrap();
    c.signal(frozen, Signal::SIGCONT);
    let started_after_thaw = || -> Vec<String> {
        c.file("runs")
            .lines()
            .skip(before)
            .filter(|l| l.split(' ').nth(2) == Some(&frozen_pid.to_string()))
            .map(str::to_owned)
            .collect()
    };
    // The thawed runner gives back what waited in its work channel. Before the fix it
    // started those jobs instead, and this wait ran out.
    c.wait_for(
        "the thawed runner to give back its claimed-ahead jobs",
        |c| c.log(frozen).contains("not started").then_some(()),
    );
    bare.execute_batch("COMMIT").unwrap();
    // A freeze may land between the worker's check and its spawn: that one spawn finishes
    // on the thaw, and the worker's second check, once the process exists, kills it at once
    // (a command as quick as this one may still leave its line). Only that job may appear.
    let log = c.log(frozen);
    let killed_at_start = |line: &String| {
        let id = line.split(' ').next().unwrap_or("");
        log.lines().any(|l| {
            l.contains(&format!("job {id} attempt")) && l.contains("while it was being started")
        })
    };
    let (caught, runs): (Vec<String>, Vec<String>) =
        started_after_thaw().into_iter().partition(killed_at_start);
    assert!(
        caught.len() <= 1,
        "one worker, one spawn under way: {caught:?}"
    );
    assert!(
        runs.is_empty(),
        "the thawed runner started {} job(s) another runner had run: {runs:?}",
        runs.len()
    );
    assert!(
        log.contains("its lease ran out before it could start"),
        "{log}"
    );
    // Every job ran once, or twice: once by the frozen runner before it froze, its ending
    // still waiting in the writer's linger when it froze (so its lease ran out and the other
    // runner ran it again, after tearing it down: never at once; recording such an ending is
    // the keepers' issue), or whose spawn the freeze caught under way (killed at once on the
    // thaw). A second run of any other kind is a defect.
    let frozen = frozen_pid.to_string();
    let mut per_job = std::collections::BTreeMap::<i64, Vec<(usize, bool)>>::new();
    for (n, line) in c.file("runs").lines().enumerate() {
        let mut fields = line.split(' ');
        let id: i64 = fields.next().unwrap().parse().unwrap();
        let by_frozen = fields.nth(1) == Some(frozen.as_str());
        per_job.entry(id).or_default().push((n, by_frozen));
    }
    for id in &ids {
        let runs = per_job.get(id).map(Vec::as_slice).unwrap_or_default();
        match runs {
            [_] => {}
            [(n, true), (_, false)] | [(_, false), (n, true)]
                if *n < before || caught.iter().any(|l| l.starts_with(&format!("{id} "))) => {}
            other => panic!("job {id} ran {other:?} (line, by the frozen runner)"),
        }
    }
}
