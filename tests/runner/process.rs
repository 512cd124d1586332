//! Jobs as process groups: a clean start, timeouts and kill grace for the whole group,
//! members left behind, escapees, and the output tail.

use std::time::{Duration, Instant};

use leasehold::{ErrorKind, Job, Outcome, Status, Store};

use crate::helper::{WAIT, events, fast, outcome, running};
use crate::util::{TestDb, group_members, kinds, token_holders, wait_for, wait_until};

#[test]
fn job_sees_only_standard_descriptors_and_a_clean_signal_state() {
    let db = TestDb::new();
    // Block SIGTERM in this thread before the runner starts: its threads inherit the mask,
    // and the job must not.
    let mut set = nix::sys::signal::SigSet::empty();
    set.add(nix::sys::signal::Signal::SIGTERM);
    set.thread_block().expect("block SIGTERM");
    let runner = fast(&db.path).start().expect("start");
    set.thread_unblock().expect("unblock SIGTERM");
    // Inspect the job's own process from outside: a shell would change its mask itself.
    let id = runner
        .enqueue(&Job::command(["sleep", "30"]))
        .expect("enqueue");
    let pid = running(&db, id).pid.unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(status.contains("SigBlk:\t0000000000000000"), "{status}");
    assert!(status.contains("SigIgn:\t0000000000000000"), "{status}");
    // sleep may open its locale files for a moment after it starts: wait for the fds it keeps.
    let fds = wait_for("only the standard descriptors", WAIT, || {
        let mut fds: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
            .collect();
        fds.sort();
        (fds == [0, 1, 2]).then_some(fds)
    });
    assert_eq!(fds, [0, 1, 2]);
    runner.cancel(id).unwrap();
    assert_eq!(outcome(&runner, id), Outcome::Cancelled);
}

#[test]
fn timeout_kills_the_whole_group() {
    let db = TestDb::new();
    let runner = fast(&db.path).start().expect("start");
    let id = runner
        .enqueue(&Job::shell("sleep 300 & sleep 300").timeout(Duration::from_secs(1)))
        .expect("enqueue");
    match outcome(&runner, id) {
        Outcome::Failed { kind, message, .. } => {
            assert_eq!(kind, ErrorKind::Timeout);
            assert_eq!(message, "timed out after 1s");
        }
        other => panic!("{other:?}"),
    }
    let rec = db.job(id);
    assert_eq!(rec.status, Status::Failed);
    assert_eq!(rec.error_kind, Some(ErrorKind::Timeout));
    assert_eq!(group_members(rec.pgid.expect("a pgid")), Vec::<i32>::new());
}

#[test]
fn sigterm_ignoring_job_is_killed_after_kill_grace() {
    let db = TestDb::new();
    let runner = fast(&db.path).start().expect("start");
    let stubborn = runner
        .enqueue(&Job::shell("trap '' TERM; sleep 300").timeout(Duration::from_millis(300)))
        .expect("enqueue");
    // The leader exits at once; its background member ignores SIGTERM and holds no pipe.
    let orphan = runner
        .enqueue(
            &Job::shell("(trap '' TERM; exec sleep 300) >/dev/null 2>&1 & sleep 300")
                .timeout(Duration::from_millis(300)),
        )
        .expect("enqueue");
    for id in [stubborn, orphan] {
        let started = Instant::now();
        assert!(matches!(
            outcome(&runner, id),
            Outcome::Failed {
                kind: ErrorKind::Timeout,
                ..
            }
        ));
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(group_members(db.job(id).pgid.unwrap()), Vec::<i32>::new());
    }
}

#[test]
fn background_member_left_after_leader_exits_is_killed_and_recorded() {
    let db = TestDb::new();
    let runner = fast(&db.path).start().expect("start");
    let id = runner
        .enqueue(&Job::shell(
            "(trap '' TERM; exec sleep 300) >/dev/null 2>&1 & exit 0",
        ))
        .expect("enqueue");
    assert_eq!(outcome(&runner, id), Outcome::Succeeded);
    assert_eq!(group_members(db.job(id).pgid.unwrap()), Vec::<i32>::new());
    assert!(kinds(&db.store(), id).contains(&"leaked".to_string()));
}

#[test]
fn setsid_escapee_holding_stdout_does_not_hang_the_worker() {
    let db = TestDb::new();
    let runner = fast(&db.path).start().expect("start");
    let started = Instant::now();
    let id = runner
        .enqueue(&Job::shell("setsid sleep 300 & exit 0"))
        .expect("enqueue");
    assert_eq!(outcome(&runner, id), Outcome::Succeeded);
    // Drain (0.3 s) plus kill grace (0.3 s), with room for a slow machine.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let rec = db.job(id);
    assert_eq!(
        token_holders(rec.run_token.as_deref().unwrap()),
        Vec::<i32>::new()
    );
    let leaked: Vec<_> = events(&db.store(), id)
        .into_iter()
        .filter(|e| e.0 == "leaked")
        .collect();
    assert!(
        leaked
            .iter()
            .any(|e| e.2.contains("outside its process group")),
        "{leaked:?}"
    );
}

#[test]
fn output_beyond_the_tail_keeps_the_last_bytes() {
    let db = TestDb::new();
    let runner = fast(&db.path).output_tail(1000).start().expect("start");
    let id = runner
        .enqueue(&Job::shell(
            "head -c 100000 /dev/zero | tr '\\0' a; printf END; head -c 50000 /dev/zero >&2",
        ))
        .expect("enqueue");
    assert_eq!(outcome(&runner, id), Outcome::Succeeded);
    let out = Store::open(&db.path)
        .unwrap()
        .output(id, None)
        .unwrap()
        .unwrap();
    assert_eq!(out.stdout.len(), 1000);
    assert!(out.stdout.ends_with(b"aaaEND"));
    assert!(out.stdout_truncated);
    assert_eq!(out.stderr.len(), 1000);
    assert!(out.stderr_truncated);
}

/// A job's main process that exits while a member of its group lives on (holding its output
/// open) stays unreaped, a zombie, until the attempt is over: its pid, which is the group's id,
/// cannot be given to another process while the group may still be signalled by that id. Held
/// by the attempt's keeper, and by the runner itself without keepers.
#[test]
fn an_exited_main_process_stays_unreaped_while_its_group_lives() {
    for keepers in [true, false] {
        let db = TestDb::new();
        let runner = fast(&db.path)
            .keepers(keepers)
            .drain_timeout(Duration::from_secs(10))
            .start()
            .expect("start");
        let id = runner
            .enqueue(&Job::shell("sleep 2 & exit 0"))
            .expect("enqueue");
        let job = running(&db, id);
        let (pid, pgid) = (job.pid.unwrap(), job.pgid.unwrap());
        let state = || {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            stat.rfind(')').and_then(|i| stat[i + 2..].chars().next())
        };
        // The exit is seen as a zombie, or not at all once something reaped it.
        let seen = wait_for("the main process to exit", WAIT, || match state() {
            Some('Z') => Some((true, group_members(pgid))),
            None => Some((false, group_members(pgid))),
            Some(_) => None,
        });
        assert!(
            seen.0 && !seen.1.is_empty(),
            "keepers: {keepers}: main process {pid} unreaped: {}, its group's live members: {:?}",
            seen.0,
            seen.1
        );
        assert_eq!(
            outcome(&runner, id),
            Outcome::Succeeded,
            "keepers: {keepers}"
        );
        // Released to its keeper once the ending is committed, then reaped: soon after.
        assert!(
            wait_until(WAIT, || state().is_none()),
            "reaped once the attempt is over"
        );
        runner.shutdown().expect("shutdown");
    }
}
