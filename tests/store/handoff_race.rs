//! A job handed to a runner that does not answer in time is stored by its command under the
//! request's token; on PostgreSQL the runner's transaction and the command's can run at once.
//! The token's row is the check: the second waits for the first and returns its job.

use std::time::Duration;

use leasehold::{Job, OpenOptions, Runner, Store};

use crate::util::{TestDb, wait_until};

#[test]
fn a_handed_job_stored_by_its_runner_and_its_command_at_once_is_stored_once() {
    let db = TestDb::postgres("handoff_race");
    drop(db.store());
    let runner = Runner::builder(db.target())
        .workers(1)
        .start()
        .expect("the runner starts");
    // Every INSERT into `jobs` waits for this transaction: the runner's store of the handed
    // job, then, once the command has given up waiting for the runner's answer (3 s), the
    // command's own.
    let mut holder = db.pg.as_ref().expect("on PostgreSQL").connect();
    let mut lock = holder.transaction().expect("BEGIN");
    lock.batch_execute("LOCK TABLE jobs IN EXCLUSIVE MODE")
        .expect("the table is locked");
    let target = db.target();
    let command = std::thread::spawn(move || {
        Store::hand_off(&target, &OpenOptions::default(), &Job::shell("true"))
    });
    let both = wait_until(Duration::from_secs(30), || {
        db.scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'
               AND query LIKE 'INSERT INTO %'",
        ) >= 2
    });
    assert!(both, "the runner and the command both store the job");
    lock.commit().expect("COMMIT");
    let stored = command
        .join()
        .expect("the command does not panic")
        .expect("the command gets the job's id");
    assert_eq!(db.scalar("SELECT count(*) FROM jobs"), 1);
    assert_eq!(db.scalar("SELECT min(id) FROM jobs"), stored.id);
    assert_eq!(db.scalar("SELECT job_id FROM handoffs"), stored.id);
    runner.shutdown().expect("the runner stops");
}
