//! Failed attempts: retries with backoff, and spawn failures that are never retried.

use std::time::Duration;

use leasehold::{ErrorKind, Job, Outcome, Store};

use crate::helper::{fast, outcome};

crate::on_both! {
    fn failing_job_is_retried_with_backoff_then_fails(db) {
        let runner = fast(&db.target()).start().expect("start");
        let id = runner
            .enqueue(
                &Job::shell("exit 3")
                    .max_attempts(3)
                    .backoff(Duration::from_millis(200), Duration::from_secs(10)),
            )
            .expect("enqueue");
        match outcome(&runner, id) {
            Outcome::Failed {
                kind, exit_code, ..
            } => {
                assert_eq!(kind, ErrorKind::Exit);
                assert_eq!(exit_code, Some(3));
            }
            other => panic!("{other:?}"),
        }
        let rec = db.job(id);
        assert_eq!((rec.attempt, rec.exit_code), (3, Some(3)));
        let evs = Store::open(db.target()).unwrap().events(id).unwrap();
        let claims: Vec<i64> = evs
            .iter()
            .filter(|e| e.kind == "claimed")
            .map(|e| e.at)
            .collect();
        let retries: Vec<i64> = evs
            .iter()
            .filter(|e| e.kind == "retry_scheduled")
            .map(|e| e.at)
            .collect();
        assert_eq!((claims.len(), retries.len()), (3, 2));
        // Each claim waited out its backoff: 200 ms, then 400 ms, each within -20%.
        assert!(claims[1] - retries[0] >= 160, "{claims:?} {retries:?}");
        assert!(claims[2] - retries[1] >= 320, "{claims:?} {retries:?}");
    }

    fn missing_command_fails_at_once_as_spawn_error(db) {
        let runner = fast(&db.target()).start().expect("start");
        let id = runner
            .enqueue(&Job::command(["/no/such/program"]).max_attempts(3))
            .expect("enqueue");
        match outcome(&runner, id) {
            Outcome::Failed { kind, message, .. } => {
                assert_eq!(kind, ErrorKind::Spawn);
                assert!(message.contains("No such file"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(db.job(id).attempt, 1);
    }
}
