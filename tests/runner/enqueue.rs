//! Enqueueing: from a program without a runner, and from many threads while one runs.

use std::sync::Arc;

use leasehold::{Job, Outcome, Store};

use crate::helper::{fast, outcome, stdout};
use crate::util::TestDb;

#[test]
fn enqueue_from_many_threads_while_running() {
    let db = TestDb::new();
    let runner = Arc::new(fast(&db.path).start().expect("start"));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let r = Arc::clone(&runner);
            std::thread::spawn(move || {
                (0..10)
                    .map(|_| r.enqueue(&Job::shell("true")).unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let ids: Vec<i64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    for id in ids {
        assert_eq!(outcome(&runner, id), Outcome::Succeeded);
    }
}

crate::on_both! {
    fn enqueue_from_a_program_without_a_runner_is_picked_up(db) {
        let id = Store::open(db.target())
            .unwrap()
            .enqueue(
                &Job::shell("echo job $LEASEHOLD_JOB_ID in $PWD with $GREETING")
                    .env("GREETING", "hello")
                    .cwd("/tmp"))
            .unwrap();
        let runner = fast(&db.target()).start().expect("start");
        assert_eq!(outcome(&runner, id), Outcome::Succeeded);
        assert_eq!(
            stdout(&db.target(), id),
            format!("job {id} in /tmp with hello\n")
        );
    }
}
