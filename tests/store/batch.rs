//! Bulk enqueues commit in bounded slices: however long its rows take to write, a bulk add
//! never holds the write lock (SQLite) or a transaction (PostgreSQL) for the whole list.

use std::time::{Duration, Instant};

use leasehold::Job;

use crate::util::TestDb;

/// Jobs of the bulk add: at half a millisecond or more each (see [`slow_inserts`]), a quarter
/// of a second or more in one transaction, five slices of 50 ms or more.
const JOBS: usize = 500;

/// Makes every insert into `jobs` cost half a millisecond or more by itself, whatever the
/// store's own cost: a trigger that counts a 200 by 200 join (SQLite, which cannot sleep in
/// SQL: about 0.5 ms on a quiet machine in 2026), or sleeps 10 ms (PostgreSQL, whose
/// transactions of new rows hold no one back and so are bounded at a second: 5 s in all). So
/// the add below lasts long enough to need several slices however fast the store's inserts
/// become.
fn slow_inserts(db: &TestDb) {
    if db.is_postgres() {
        db.exec(
            "CREATE FUNCTION test_slow_insert() RETURNS trigger LANGUAGE plpgsql AS
                 $$ BEGIN PERFORM pg_sleep(0.01); RETURN NEW; END $$;
             CREATE TRIGGER test_slow_insert AFTER INSERT ON jobs
                 FOR EACH ROW EXECUTE FUNCTION test_slow_insert();",
        );
    } else {
        db.exec(
            "CREATE TABLE test_slow (x INTEGER);
             WITH RECURSIVE n(x) AS (VALUES (1) UNION ALL SELECT x + 1 FROM n WHERE x < 200)
             INSERT INTO test_slow SELECT x FROM n;
             CREATE TRIGGER test_slow_insert AFTER INSERT ON jobs
             BEGIN SELECT count(*) FROM test_slow a, test_slow b; END;",
        );
    }
}

crate::on_both! {
    /// The store tells its progress after every transaction of the add: a list that takes a
    /// quarter of a second or more to write is told in several steps, never once for the whole
    /// list.
    fn a_slow_bulk_enqueue_commits_in_many_slices(db) {
        let store = db.store();
        slow_inserts(&db);
        let jobs: Vec<Job> = (0..JOBS).map(|i| Job::shell(format!("true {i}"))).collect();
        let started = Instant::now();
        let mut told: Vec<(usize, Duration)> = Vec::new();
        let ids = store
            .enqueue_many_with_progress(&jobs, &mut |n| told.push((n, started.elapsed())))
            .unwrap();
        let took = started.elapsed();
        eprintln!("{JOBS} jobs in {} transactions, {took:?}", told.len());
        assert_eq!(ids.len(), JOBS);
        assert_eq!(told.last().map(|t| t.0), Some(JOBS));
        assert!(
            told.len() >= 3,
            "{JOBS} jobs that took {took:?} to write went in {} transaction(s): {told:?}",
            told.len()
        );
        assert_eq!(
            db.scalar("SELECT count(*) FROM jobs WHERE status = 'pending' AND waiting = 0"),
            JOBS as i64,
            "every job is ready once the add returns"
        );
    }
}
