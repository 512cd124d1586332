//! Retention: what each rule prunes and what it never touches, events and output going with
//! their job, the keep-max cap, the file shrinking, a dry run counting without writing, and late
//! writes for a pruned job.

use std::collections::HashSet;
use std::time::Duration;

use leasehold::protocol::{Ending, Finish, Finished};
use leasehold::{ErrorKind, Job, ListFilter, Output, PruneOptions, Retention, Status, Store};

use crate::helper::{TTL, claim};
use crate::util::{T0, TestDb};

const HOUR: i64 = 3_600_000;
const DAY: i64 = 24 * HOUR;
/// The time every prune below runs at: 60 days after the oldest endings.
const NOW: i64 = T0 + 61 * DAY;
/// Jobs per group.
const N: usize = 300;

/// The jobs of a file with a few thousand jobs in every status, by group.
struct Fixture {
    t: TestDb,
    old_succeeded: Vec<i64>,
    young_succeeded: Vec<i64>,
    old_failed: Vec<i64>,
    young_failed: Vec<i64>,
    old_cancelled: Vec<i64>,
    young_cancelled: Vec<i64>,
    /// Cancelled while running, long ago: the teardown marker is still set.
    marked: Vec<i64>,
    /// Claimed long ago and still running.
    running: Vec<i64>,
    /// Enqueued long ago and never claimed.
    pending: Vec<i64>,
}

impl Fixture {
    fn store(&self) -> Store {
        self.t.store()
    }

    fn finished(&self) -> Vec<i64> {
        [
            &self.old_succeeded,
            &self.young_succeeded,
            &self.old_failed,
            &self.young_failed,
            &self.old_cancelled,
            &self.young_cancelled,
        ]
        .into_iter()
        .flatten()
        .copied()
        .collect()
    }
}

/// Enqueues `n` jobs at `at` and claims them all.
fn claimed(store: &Store, n: usize, at: i64) -> Vec<leasehold::protocol::Claimed> {
    let jobs = vec![Job::shell("true"); n];
    let ids = store.enqueue_many_at(&jobs, at).unwrap();
    let c = claim(store, "w", n as u32, at);
    assert_eq!(c.len(), ids.len());
    c
}

/// `n` jobs that ended at `at` with `ending`, each with an output row.
fn ended(store: &Store, n: usize, ending: &Ending, at: i64) -> Vec<i64> {
    claimed(store, n, at - 1000)
        .into_iter()
        .map(|c| {
            let finish = Finish {
                job_id: c.id,
                run_token: c.run_token.clone(),
                attempt: c.attempt,
                ending: ending.clone(),
                output: Some(Output::new(
                    c.attempt,
                    vec![b'x'; 200],
                    Vec::new(),
                    false,
                    false,
                )),
                notes: Vec::new(),
                max_recovery_attempts: 3,
            };
            assert!(matches!(
                store.finish(&finish, at).unwrap(),
                Finished::Recorded(_)
            ));
            c.id
        })
        .collect()
}

fn cancelled(store: &Store, n: usize, at: i64) -> Vec<i64> {
    let jobs = vec![Job::shell("true"); n];
    let ids = store.enqueue_many_at(&jobs, at).unwrap();
    for &id in &ids {
        store.cancel_at(id, at).unwrap();
    }
    ids
}

fn failure() -> Ending {
    Ending::Failed {
        kind: ErrorKind::Exit,
        exit_code: Some(1),
        signal: None,
        message: "exit 1".into(),
    }
}

/// A new file: schema version 2 creates it `auto_vacuum = INCREMENTAL`, with the index the
/// prune reads.
fn incremental_file(t: &TestDb) -> Store {
    t.store()
}

fn fixture() -> Fixture {
    let t = TestDb::new();
    let store = incremental_file(&t);
    let old = T0 + DAY;
    let young = NOW - HOUR;
    let old_succeeded = ended(&store, N, &Ending::Succeeded, old);
    let old_failed = ended(&store, N, &failure(), old);
    let old_cancelled = cancelled(&store, N, old);
    let young_succeeded = ended(&store, N, &Ending::Succeeded, young);
    let young_failed = ended(&store, N, &failure(), young);
    let young_cancelled = cancelled(&store, N, young);
    // Claimed long ago: leases that expired long ago, but still running.
    let running: Vec<i64> = claimed(&store, N, old).iter().map(|c| c.id).collect();
    let marked: Vec<i64> = claimed(&store, N, old)
        .iter()
        .map(|c| store.cancel_at(c.id, old).unwrap().id)
        .collect();
    // Enqueued long ago, scheduled far in the future: never claimed.
    let pending = store
        .enqueue_many_at(&vec![Job::shell("true"); N], old)
        .unwrap();
    assert!(store.job(marked[0]).unwrap().status == Status::Cancelled);
    Fixture {
        t,
        old_succeeded,
        young_succeeded,
        old_failed,
        young_failed,
        old_cancelled,
        young_cancelled,
        marked,
        running,
        pending,
    }
}

fn present(store: &Store) -> HashSet<i64> {
    store
        .list(&ListFilter {
            limit: None,
            ..ListFilter::default()
        })
        .unwrap()
        .iter()
        .map(|j| j.id)
        .collect()
}

/// The ids in `ids` that `store` still holds.
fn kept(store: &Store, ids: &[i64]) -> usize {
    let present = present(store);
    ids.iter().filter(|id| present.contains(id)).count()
}

/// Rows of `table` whose job is in `ids`.
fn child_rows(f: &Fixture, table: &str, ids: &[i64]) -> i64 {
    let list = serde_json::to_string(ids).unwrap();
    f.t.bare()
        .query_row(
            &format!(
                "SELECT count(*) FROM {table} WHERE job_id IN (SELECT value FROM json_each(?1))"
            ),
            [list],
            |r| r.get(0),
        )
        .unwrap()
}

#[test]
fn each_rule_prunes_its_old_jobs_and_nothing_else() {
    let f = fixture();
    let store = f.store();
    let total = present(&store).len();
    assert_eq!(total, 9 * N);

    // Only the succeeded rule.
    let only_succeeded = Retention::keep_all().succeeded(Some(Duration::from_secs(86_400)));
    let report = store
        .prune_at(&only_succeeded, &leasehold::PruneOptions::default(), NOW)
        .unwrap();
    assert_eq!(report.jobs, N as u64);
    assert_eq!(kept(&store, &f.old_succeeded), 0);
    assert_eq!(present(&store).len(), total - N);

    // Only the failed rule.
    let only_failed = Retention::keep_all().failed(Some(Duration::from_secs(86_400)));
    assert_eq!(
        store
            .prune_at(&only_failed, &leasehold::PruneOptions::default(), NOW)
            .unwrap()
            .jobs,
        N as u64
    );
    assert_eq!(kept(&store, &f.old_failed), 0);

    // Only the cancelled rule: the marked jobs are cancelled and old, and stay.
    let only_cancelled = Retention::keep_all().cancelled(Some(Duration::from_secs(86_400)));
    assert_eq!(
        store
            .prune_at(&only_cancelled, &leasehold::PruneOptions::default(), NOW)
            .unwrap()
            .jobs,
        N as u64
    );
    assert_eq!(kept(&store, &f.old_cancelled), 0);

    // Nothing else went: young, running, pending, marked.
    for group in [
        &f.young_succeeded,
        &f.young_failed,
        &f.young_cancelled,
        &f.running,
        &f.pending,
        &f.marked,
    ] {
        assert_eq!(kept(&store, group), N);
    }
    // A rule of zero seconds prunes every finished job but never the others.
    let zero = Retention::keep_all()
        .succeeded(Some(Duration::ZERO))
        .failed(Some(Duration::ZERO))
        .cancelled(Some(Duration::ZERO));
    assert_eq!(
        store
            .prune_at(&zero, &leasehold::PruneOptions::default(), NOW)
            .unwrap()
            .jobs,
        3 * N as u64
    );
    assert_eq!(present(&store).len(), 3 * N);
    for group in [&f.running, &f.pending, &f.marked] {
        assert_eq!(kept(&store, group), N);
    }
}

#[test]
fn the_defaults_prune_by_age_and_forever_keeps_a_status() {
    let f = fixture();
    let store = f.store();
    // 60 days after the old endings: past every default; the young ones are an hour old.
    let forever_failed = Retention::default().failed(None);
    let report = store
        .prune_at(&forever_failed, &leasehold::PruneOptions::default(), NOW)
        .unwrap();
    assert_eq!(report.jobs, 2 * N as u64);
    assert_eq!(kept(&store, &f.old_failed), N);
    assert_eq!(kept(&store, &f.old_succeeded), 0);
    assert_eq!(kept(&store, &f.old_cancelled), 0);
    // Ten days after the old endings, only the succeeded default (7 days) has run out.
    let f2 = fixture();
    let store2 = f2.store();
    assert_eq!(
        store2
            .prune_at(
                &Retention::default(),
                &leasehold::PruneOptions::default(),
                T0 + 11 * DAY
            )
            .unwrap()
            .jobs,
        N as u64
    );
    assert_eq!(kept(&store2, &f2.old_succeeded), 0);
    assert_eq!(kept(&store2, &f2.old_failed), N);
    assert_eq!(kept(&store2, &f2.old_cancelled), N);
}

#[test]
fn events_and_output_go_with_their_job() {
    let f = fixture();
    let store = f.store();
    let old = f.old_succeeded.clone();
    assert!(child_rows(&f, "job_events", &old) >= 3 * N as i64);
    assert_eq!(child_rows(&f, "job_output", &old), N as i64);
    let young = f.young_succeeded.clone();
    let young_events = child_rows(&f, "job_events", &young);
    let report = store
        .prune_at(
            &Retention::default(),
            &leasehold::PruneOptions::default(),
            NOW,
        )
        .unwrap();
    assert!(report.events >= 3 * N as u64, "{report:?}");
    assert_eq!(report.outputs, 2 * N as u64, "{report:?}");
    assert_eq!(child_rows(&f, "job_events", &old), 0);
    assert_eq!(child_rows(&f, "job_output", &old), 0);
    assert_eq!(child_rows(&f, "job_events", &young), young_events);
    assert_eq!(child_rows(&f, "job_output", &young), N as i64);
    // No orphans anywhere.
    let orphans: i64 =
        f.t.bare()
            .query_row(
                "SELECT (SELECT count(*) FROM job_events WHERE job_id NOT IN (SELECT id FROM jobs))
                  + (SELECT count(*) FROM job_output WHERE job_id NOT IN (SELECT id FROM jobs))",
                [],
                |r| r.get(0),
            )
            .unwrap();
    assert_eq!(orphans, 0);
}

#[test]
fn keep_max_keeps_the_newest_finished_jobs() {
    let f = fixture();
    let store = f.store();
    // 6N unmarked finished jobs and N marked ones (which count, and stay); keep 1.5N.
    let max = N as u64 * 3 / 2;
    let report = store
        .prune_at(
            &Retention::keep_all().keep_max(Some(max)),
            &leasehold::PruneOptions::default(),
            NOW,
        )
        .unwrap();
    // The newest 1.5N by completed_at are the young ones, ended at one instant: the newest ids
    // among them stay.
    let mut young = [
        f.young_succeeded.clone(),
        f.young_failed.clone(),
        f.young_cancelled.clone(),
    ]
    .concat();
    young.sort_unstable();
    let (gone, stay) = young.split_at(young.len() - max as usize);
    assert_eq!(kept(&store, stay), stay.len());
    assert_eq!(kept(&store, gone), 0);
    assert_eq!(report.jobs, 6 * N as u64 - max);
    let finished = f.finished();
    assert_eq!(kept(&store, &finished), max as usize);
    for group in [&f.running, &f.pending, &f.marked] {
        assert_eq!(kept(&store, group), N);
    }
    // Already within the cap: nothing more.
    assert_eq!(
        store
            .prune_at(
                &Retention::keep_all().keep_max(Some(max)),
                &leasehold::PruneOptions::default(),
                NOW
            )
            .unwrap()
            .jobs,
        0
    );
    // A cap of 0 prunes every unmarked finished job.
    store
        .prune_at(
            &Retention::keep_all().keep_max(Some(0)),
            &leasehold::PruneOptions::default(),
            NOW,
        )
        .unwrap();
    assert_eq!(present(&store).len(), 3 * N);
}

#[test]
fn batches_are_bounded_and_a_limit_leaves_the_rest_for_later() {
    let f = fixture();
    let store = f.store();
    let options = PruneOptions::default().batch(100).max_batches(Some(3));
    let report = store
        .prune_at(&Retention::default(), &options, NOW)
        .unwrap();
    assert_eq!((report.jobs, report.batches, report.more), (300, 3, true));
    let rest = store
        .prune_at(
            &Retention::default(),
            &leasehold::PruneOptions::default(),
            NOW,
        )
        .unwrap();
    assert_eq!(rest.jobs, 3 * N as u64 - 300);
    assert!(!rest.more);
}

#[test]
fn a_prune_past_its_deadline_starts_nothing_and_leaves_it_all_for_later() {
    let f = fixture();
    let store = f.store();
    let before = present(&store);
    // A deadline already passed: no batch and no vacuum step starts.
    let passed = PruneOptions::default().deadline(Some(std::time::Instant::now()));
    let report = store
        .prune_at(&Retention::keep_all().keep_max(Some(0)), &passed, NOW)
        .unwrap();
    assert_eq!(
        (report.jobs, report.batches, report.bytes_freed, report.more),
        (0, 0, 0, true),
        "{report:?}"
    );
    assert_eq!(present(&store), before);
    // A deadline far ahead bounds nothing.
    let ahead = PruneOptions::default()
        .deadline(std::time::Instant::now().checked_add(std::time::Duration::from_secs(3600)));
    let report = store
        .prune_at(&Retention::keep_all().keep_max(Some(0)), &ahead, NOW)
        .unwrap();
    assert_eq!((report.jobs, report.more), (6 * N as u64, false));
    assert!(report.bytes_freed > 0, "{report:?}");
}

/// Moves everything in the WAL to the main file, so that its size is what it holds.
fn checkpoint(t: &TestDb) {
    t.bare()
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
            r.get::<_, i64>(0)
        })
        .unwrap();
}

/// The main file's size plus its WAL's.
fn file_bytes(t: &TestDb) -> u64 {
    let len = |p: std::path::PathBuf| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    len(t.path.clone()) + len(t.sibling("jobs.db-wal"))
}

#[test]
fn pruning_and_the_incremental_vacuum_shrink_the_file() {
    let f = fixture();
    let store = f.store();
    checkpoint(&f.t);
    let before = std::fs::metadata(&f.t.path).unwrap().len();
    let report = store
        .prune_at(
            &Retention::keep_all().keep_max(Some(0)),
            &leasehold::PruneOptions::default(),
            NOW,
        )
        .unwrap();
    assert_eq!(report.jobs, 6 * N as u64);
    assert!(report.bytes_freed > 0, "{report:?}");
    checkpoint(&f.t);
    let after = std::fs::metadata(&f.t.path).unwrap().len();
    assert!(
        after < before * 3 / 4,
        "the file went from {before} to {after} bytes ({report:?})"
    );
    let free: i64 =
        f.t.bare()
            .query_row("PRAGMA freelist_count", [], |r| r.get(0))
            .unwrap();
    assert_eq!(free, 0);
    assert!(file_bytes(&f.t) > 0);
}

#[test]
fn a_bounded_vacuum_leaves_the_rest_of_the_free_list_to_the_next_prune() {
    let f = fixture();
    let store = f.store();
    let free = || -> i64 {
        f.t.bare()
            .query_row("PRAGMA freelist_count", [], |r| r.get(0))
            .unwrap()
    };
    // About 6 MB more of finished jobs, so that the free list outgrows one step of 256 pages.
    let big = Job::shell("true").env("PAYLOAD", "x".repeat(2000));
    store.enqueue_many_at(&vec![big; 3000], NOW - DAY).unwrap();
    f.t.bare()
        .execute(
            "UPDATE jobs SET status = 'cancelled', completed_at = ?1
             WHERE status = 'pending' AND scheduled_at = ?1",
            [NOW - DAY],
        )
        .unwrap();
    let one_step = PruneOptions::default().max_vacuum_steps(Some(1));
    let zero = Retention::keep_all().keep_max(Some(0));
    let first = store.prune_at(&zero, &one_step, NOW).unwrap();
    assert_eq!(first.jobs, 6 * N as u64 + 3000);
    assert!(
        first.bytes_freed > 0 && first.bytes_freed <= 256 * 4096,
        "{first:?}"
    );
    assert!(free() > 0);
    // Nothing left to prune, but the free pages are given back.
    let second = store
        .prune_at(&zero, &leasehold::PruneOptions::default(), NOW)
        .unwrap();
    assert_eq!(second.jobs, 0);
    assert!(second.bytes_freed > 0, "{second:?}");
    assert_eq!(free(), 0);
}

#[test]
fn a_dry_run_counts_what_would_go_and_changes_nothing() {
    let f = fixture();
    let store = f.store();
    checkpoint(&f.t);
    drop(store);
    let before = std::fs::read(&f.t.path).unwrap();
    let store = f.store();
    for policy in [
        Retention::default(),
        Retention::keep_all().keep_max(Some(10)),
        Retention::default().keep_max(Some(N as u64)),
    ] {
        let dry = store
            .prune_at(&policy, &PruneOptions::default().dry_run(true), NOW)
            .unwrap();
        assert!(dry.dry_run);
        assert_eq!((dry.events, dry.outputs, dry.bytes_freed), (0, 0, 0));
        let expected = match policy.max_finished() {
            Some(10) => 6 * N as u64 - 10,
            Some(_) => 5 * N as u64,
            None => 3 * N as u64,
        };
        assert_eq!(dry.jobs, expected, "{policy:?}");
    }
    drop(store);
    assert!(std::fs::read(&f.t.path).unwrap() == before);
    // And the real prune prunes what the dry run counted.
    let store = f.store();
    assert_eq!(
        store
            .prune_at(
                &Retention::default(),
                &leasehold::PruneOptions::default(),
                NOW
            )
            .unwrap()
            .jobs,
        3 * N as u64
    );
}

#[test]
fn a_late_ending_and_a_renewal_for_a_pruned_job_are_harmless() {
    let t = TestDb::new();
    let store = t.store();
    let c = claimed(&store, 2, T0);
    let (gone, live) = (&c[0], &c[1]);
    // An operator cancels the first while it runs, its teardown is recorded, and a prune with
    // a rule of zero takes it at once: its runner still holds the attempt.
    store.cancel_at(gone.id, T0 + 10).unwrap();
    assert!(
        store
            .record_teardown(gone.id, &gone.run_token, "test", T0 + 20)
            .unwrap()
    );
    let zero = Retention::keep_all().cancelled(Some(Duration::ZERO));
    assert_eq!(
        store
            .prune_at(&zero, &leasehold::PruneOptions::default(), T0 + 30)
            .unwrap()
            .jobs,
        1
    );
    assert!(store.job(gone.id).is_err());

    // The runner's renewal names both: the live one is renewed, the pruned one is reported
    // lost (its lease is gone) and the statement succeeds.
    let tokens = vec![gone.run_token.clone(), live.run_token.clone()];
    let renewal = store.renew("w", &tokens, TTL, T0 + 40).unwrap();
    assert_eq!(renewal.renewed, vec![live.run_token.clone()]);
    assert_eq!(renewal.lost, vec![gone.run_token.clone()]);

    // Its late ending is fenced: Ok, no error, and no row comes back for the pruned job.
    for ending in [Ending::Succeeded, failure()] {
        let finish = Finish {
            job_id: gone.id,
            run_token: gone.run_token.clone(),
            attempt: gone.attempt,
            ending,
            output: Some(Output::new(
                gone.attempt,
                b"late".to_vec(),
                Vec::new(),
                false,
                false,
            )),
            notes: Vec::new(),
            max_recovery_attempts: 3,
        };
        assert_eq!(store.finish(&finish, T0 + 50).unwrap(), Finished::Fenced);
    }
    let rows: i64 = t
        .bare()
        .query_row(
            "SELECT (SELECT count(*) FROM jobs WHERE id = ?1)
                  + (SELECT count(*) FROM job_events WHERE job_id = ?1)
                  + (SELECT count(*) FROM job_output WHERE job_id = ?1)",
            [gone.id],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(rows, 0);
    // The live job is untouched and ends normally.
    let finish = Finish {
        job_id: live.id,
        run_token: live.run_token.clone(),
        attempt: live.attempt,
        ending: Ending::Succeeded,
        output: None,
        notes: Vec::new(),
        max_recovery_attempts: 3,
    };
    assert_eq!(
        store.finish(&finish, T0 + 60).unwrap(),
        Finished::Recorded(Status::Succeeded)
    );
}
