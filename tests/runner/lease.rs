//! Revoked leases: a cancel or an operator's retry from anywhere kills the attempt, and its
//! late result is fenced.

use std::time::{Duration, Instant};

use leasehold::{Job, Outcome, Status, Store};

use crate::helper::{WAIT, events, fast, outcome, running, stubborn_job};
use crate::util::{TestDb, group_members, kinds, wait_for};

#[test]
fn cancel_from_another_process_revokes_the_lease_and_kills_the_attempt() {
    let db = TestDb::new();
    let runner = fast(&db.path).start().expect("start");
    let id = runner.enqueue(&Job::shell("sleep 300")).expect("enqueue");
    let rec = running(&db, id);
    // Cancel through a separate connection, as `leasehold jobs cancel` does: the runner learns
    // of it from its next renewal.
    Store::open(&db.path).unwrap().cancel(id).unwrap();
    let pgid = rec.pgid.unwrap();
    wait_for("the group to die", WAIT, || {
        group_members(pgid).is_empty().then_some(())
    });
    // The runner records how the attempt the cancel stopped ended: not as a late result.
    wait_for("the stopped attempt's ending", WAIT, || {
        kinds(&db.store(), id)
            .contains(&"attempt_stopped".to_string())
            .then_some(())
    });
    let after = db.job(id);
    assert_eq!(after.status, Status::Cancelled);
    let kinds = kinds(&db.store(), id);
    assert!(
        !kinds
            .iter()
            .any(|k| k == "failed" || k == "succeeded" || k == "late_result_discarded"),
        "{kinds:?}"
    );
    let m = db.store().metrics().unwrap();
    assert_eq!(
        m.counter_total(leasehold::CounterKind::LateResultsDiscarded),
        0
    );
}

#[test]
fn cancel_through_the_runner_kills_within_kill_grace() {
    let db = TestDb::new();
    let (runner, id, pgid) = stubborn_job(&db);
    let started = Instant::now();
    runner.cancel(id).unwrap();
    wait_for("the group to die", WAIT, || {
        group_members(pgid).is_empty().then_some(())
    });
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(outcome(&runner, id), Outcome::Cancelled);
}

#[test]
fn operator_retry_of_a_lost_running_job_kills_the_old_attempt_and_fences_it() {
    let db = TestDb::new();
    let dir = db.path.parent().unwrap().to_path_buf();
    let runner = fast(&db.path).start().expect("start");
    // The first attempt leaves a mark and hangs; the second finds the mark and succeeds.
    let rec_id = runner
        .enqueue(
            &Job::shell("if [ -e retried ]; then exit 0; fi; touch retried; sleep 300").cwd(&dir),
        )
        .expect("enqueue");
    let first = running(&db, rec_id);
    // An operator may only retry a running job whose lease is gone: age it.
    rusqlite::Connection::open(&db.path)
        .unwrap()
        .execute(
            "UPDATE jobs SET lease_expires_at = 1 WHERE id = ?1",
            [rec_id],
        )
        .unwrap();
    Store::open(&db.path)
        .unwrap()
        .retry(rec_id, Some("test"))
        .unwrap();
    assert_eq!(outcome(&runner, rec_id), Outcome::Succeeded);
    assert!(group_members(first.pgid.unwrap()).is_empty());
    let evs = events(&db.store(), rec_id);
    let kinds: Vec<&str> = evs.iter().map(|e| e.0.as_str()).collect();
    assert!(kinds.contains(&"late_result_discarded"), "{kinds:?}");
    assert!(kinds.contains(&"torn_down"), "{kinds:?}");
    // The first attempt wrote no ending of its own: one `succeeded`, no `failed`.
    assert_eq!(kinds.iter().filter(|k| **k == "succeeded").count(), 1);
    assert!(!kinds.contains(&"failed"), "{kinds:?}");
    let torn = kinds.iter().position(|k| *k == "torn_down").unwrap();
    let second_claim = kinds.iter().rposition(|k| *k == "claimed").unwrap();
    assert!(
        torn < second_claim,
        "torn down before the job ran again: {kinds:?}"
    );
}
