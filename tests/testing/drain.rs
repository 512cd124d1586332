//! Drains run the ready jobs through the real claim, start and ending path: a real runner's
//! outcomes and a stubbed drain's agree.

use std::time::Duration;

use leasehold::testing::{Expected, Stub, TestDb};
use leasehold::{Job, JobRecord, Outcome, Status};

#[test]
fn a_drain_runs_the_ready_jobs_with_a_real_runner() {
    let db = TestDb::new();
    let store = db.store();
    let a = store.enqueue(&Job::shell("true")).unwrap();
    let b = store.enqueue(&Job::shell("exit 3")).unwrap();
    let c = store.enqueue(&Job::shell("true").after([a])).unwrap();
    let later = store
        .enqueue(&Job::shell("true").delay(Duration::from_secs(60)))
        .unwrap();
    let drained = db.drain();
    assert_eq!(drained.outcome(a), Some(Outcome::Succeeded));
    assert!(matches!(
        drained.outcome(b),
        Some(Outcome::Failed {
            exit_code: Some(3),
            ..
        })
    ));
    assert_eq!(drained.outcome(c), Some(Outcome::Succeeded));
    assert_eq!(drained.outcome(later), None);
    assert_eq!((drained.succeeded(), drained.failed()), (2, 1));
    db.assert_enqueued(&Expected::shell("true").due_at(db.job(later).scheduled_at));
}

#[test]
fn a_stubbed_drain_runs_what_the_jobs_enqueue_and_what_they_release() {
    let db = TestDb::new();
    let store = db.store();
    let first = store.enqueue(&Job::command(["import"])).unwrap();
    let after = store
        .enqueue(&Job::command(["index"]).after([first]))
        .unwrap();
    let app = db.store();
    let drained = db.drain_with(|job| {
        if job.argv == ["import"] {
            // The job enqueues another, as its command would.
            app.enqueue(&Job::command(["thumbnail"])).unwrap();
        }
        Stub::Succeed
    });
    let order: Vec<Vec<String>> = drained.ended.iter().map(|j| j.argv.clone()).collect();
    assert_eq!(order[0], ["import"]);
    assert_eq!(order.len(), 3, "{order:?}");
    assert_eq!(drained.outcome(after), Some(Outcome::Succeeded));
    assert!(db.enqueued().is_empty());
}

#[test]
fn a_stub_can_run_another_command_in_the_jobs_place() {
    let db = TestDb::new();
    let id = db
        .store()
        .enqueue(&Job::command(["send-invoices"]).env("CODE", "4"))
        .unwrap();
    let drained = db.drain_with(|_| Stub::Run(vec!["sh".into(), "-c".into(), "exit $CODE".into()]));
    assert!(matches!(
        drained.outcome(id),
        Some(Outcome::Failed {
            exit_code: Some(4),
            ..
        })
    ));
    let started = db
        .store()
        .events(id)
        .unwrap()
        .iter()
        .any(|e| e.kind == leasehold::EventKind::Started);
    assert!(started, "the stub's process is recorded as the attempt's");
}

/// The jobs of the comparison: every tenth fails for good, every tenth is flaky (fails its
/// first attempt, succeeds on its second), and some run after a failing or a flaky one.
fn jobs(db: &TestDb, n: usize) -> Vec<i64> {
    let folder = db.path().parent().unwrap();
    let store = db.store();
    let mut ids: Vec<i64> = Vec::with_capacity(n);
    for i in 0..n {
        let job = match i % 10 {
            3 => Job::shell("exit 1").max_attempts(2),
            5 => Job::shell(format!(
                "test -e {dir}/flag{i} || {{ touch {dir}/flag{i}; exit 1; }}",
                dir = folder.display()
            ))
            .max_attempts(3),
            7 => Job::shell("true").after([ids[i - 4]]),
            8 => Job::shell("true").after([ids[i - 3]]),
            _ => Job::shell("true"),
        };
        ids.push(
            store
                .enqueue(&job.backoff(Duration::from_secs(10), Duration::from_secs(10)))
                .unwrap(),
        );
    }
    ids
}

/// What a stub makes of the comparison's commands: what running them does.
fn as_the_command_would(job: &JobRecord) -> Stub {
    let script = &job.argv[2];
    if script == "exit 1" || (script.contains("touch") && job.attempt == 1) {
        Stub::Fail { exit_code: 1 }
    } else {
        Stub::Succeed
    }
}

/// Drains with `drain` and moves the clock past the backoff until nothing is left.
fn run_out(db: &TestDb, mut drain: impl FnMut(&TestDb)) {
    for _ in 0..10 {
        drain(db);
        if db.enqueued().is_empty() {
            return;
        }
        db.clock().advance(Duration::from_secs(15));
    }
    panic!("jobs left after 10 drains: {}", db.enqueued().len());
}

#[test]
fn a_stubbed_drain_of_a_thousand_jobs_agrees_with_a_real_runner() {
    const N: usize = 1_000;
    let real = TestDb::new();
    let stubbed = TestDb::new();
    let real_ids = jobs(&real, N);
    let stubbed_ids = jobs(&stubbed, N);
    run_out(&real, |db| drop(db.drain()));
    run_out(&stubbed, |db| drop(db.drain_with(as_the_command_would)));
    let seen = |db: &TestDb, id: i64| {
        let j = db.job(id);
        (j.status, j.attempt, j.failed_attempts)
    };
    let mut statuses = [0usize; 3];
    for i in 0..N {
        let (r, s) = (seen(&real, real_ids[i]), seen(&stubbed, stubbed_ids[i]));
        assert_eq!(r, s, "job {i}: a real runner's, then the stubbed drain's");
        match r.0 {
            Status::Succeeded => statuses[0] += 1,
            Status::Failed => statuses[1] += 1,
            Status::Cancelled => statuses[2] += 1,
            other => panic!("job {i} is {other:?}"),
        }
    }
    // 100 fail for good and cancel the 100 after them; the flaky ones succeed on a retry.
    assert_eq!(statuses, [800, 100, 100]);
}
