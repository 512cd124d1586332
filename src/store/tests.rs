//! The store's own tests: query plans and virtual-machine step counts of its statements,
//! which only code inside the store can reach.

use super::lease::{DUE_DEFERRED_SQL, RENEW_SQL, claim_sql, queue_head_sql};
use super::queue::READY_QUEUES_SQL;
use super::reclaim::RECLAIM_CANDIDATES_SQL;
use super::*;
use crate::job::Job;
use crate::store::db::{params, params_from_iter};

/// The rendered query plan of `sql` with `values` bound.
fn plan(conn: &Connection, sql: &str, values: Vec<crate::store::db::Value>) -> String {
    let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
    let mut rows = stmt.query(params_from_iter(values)).unwrap();
    let mut lines = Vec::new();
    while let Some(row) = rows.next().unwrap() {
        lines.push(row.get::<_, String>(3).unwrap());
    }
    lines.join("\n")
}

/// Whether a line of `plan` reads the index `name`.
fn uses_index(plan: &str, name: &str) -> bool {
    plan.lines().any(|l| {
        let words: Vec<&str> = l.split_whitespace().collect();
        words.windows(2).any(|w| w == ["INDEX", name])
    })
}

#[test]
fn counts_and_queues_agree_with_the_rows() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("jobs.db")).unwrap();
    let now = 1_700_000_000_000i64;
    let jobs: Vec<crate::Job> = (0..10)
        .map(|i| crate::Job::shell("true").queue(if i < 6 { "a" } else { "b" }))
        .collect();
    store.enqueue_many_at(&jobs, now).unwrap();
    let conn = store.conn();
    conn.execute_batch(
        "UPDATE jobs SET status = 'succeeded', completed_at = 1 WHERE id IN (1, 2);
         UPDATE jobs SET status = 'failed', completed_at = 1 WHERE id = 3;
         UPDATE jobs SET status = 'cancelled', completed_at = 1 WHERE id = 7;
         UPDATE jobs SET status = 'running', run_token = 't', worker_id = 'w',
             lease_expires_at = 1 WHERE id IN (4, 8);
         UPDATE jobs SET teardown_token = 'x' WHERE id = 9;",
    )
    .unwrap();
    let c = store.counts().unwrap();
    assert_eq!(
        (c.pending, c.running, c.succeeded, c.failed, c.cancelled),
        (4, 2, 2, 1, 1)
    );
    let q = store.queues().unwrap();
    let q: Vec<(&str, u64, u64)> = q
        .iter()
        .map(|q| (q.name.as_str(), q.pending, q.running))
        .collect();
    // The teardown-marked pending job 9 counts too.
    assert_eq!(q, vec![("a", 2, 1), ("b", 2, 1)]);

    // Hand-written SQL that moves jobs to a queue no job was enqueued to (which has no rows
    // yet), one of them with a change of status in the same statement, then back, then deletes.
    conn.execute_batch(
        "UPDATE jobs SET queue = 'c' WHERE id IN (5, 6);
         UPDATE jobs SET queue = 'c', status = 'cancelled' WHERE id = 10;
         UPDATE jobs SET status = 'succeeded' WHERE id = 5;",
    )
    .unwrap();
    let by_queue = |store: &Store| -> Vec<(String, u64, u64, u64)> {
        let q = store.queues().unwrap();
        q.iter()
            .map(|q| (q.name.clone(), q.pending, q.running, q.succeeded))
            .collect()
    };
    let c = |name: &str, p, r, s| (name.to_string(), p, r, s);
    assert_eq!(
        by_queue(&store),
        vec![c("a", 0, 1, 2), c("b", 1, 1, 0), c("c", 1, 0, 1)]
    );
    conn.execute_batch(
        "UPDATE jobs SET queue = 'a' WHERE queue = 'c';
         DELETE FROM jobs WHERE id IN (1, 2);",
    )
    .unwrap();
    assert_eq!(
        by_queue(&store),
        vec![c("a", 1, 1, 1), c("b", 1, 1, 0)],
        "a queue whose jobs are all gone is not listed"
    );
    let c = store.counts().unwrap();
    assert_eq!(
        (c.pending, c.running, c.succeeded, c.failed, c.cancelled),
        (2, 2, 1, 1, 2)
    );
}

#[test]
fn list_pages_are_newest_first_below_the_before_id_with_filters() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("jobs.db")).unwrap();
    let jobs: Vec<crate::Job> = (0..7)
        .map(|i| crate::Job::shell("true").queue(if i % 2 == 0 { "a" } else { "b" }))
        .collect();
    store.enqueue_many_at(&jobs, 1_700_000_000_000).unwrap();
    let ids = |filter: &ListFilter| -> Vec<i64> {
        store.list(filter).unwrap().iter().map(|j| j.id).collect()
    };
    let page = |limit, before| ListFilter {
        limit: Some(limit),
        before,
        ..ListFilter::default()
    };
    assert_eq!(ids(&page(3, None)), vec![7, 6, 5]);
    assert_eq!(ids(&page(3, Some(5))), vec![4, 3, 2]);
    assert_eq!(ids(&page(3, Some(2))), vec![1]);
    assert!(ids(&page(3, Some(1))).is_empty());
    assert!(ids(&page(3, Some(i64::MIN))).is_empty());
    assert_eq!(ids(&page(3, Some(i64::MAX))), vec![7, 6, 5]);
    let queue_a = |before| ListFilter {
        queue: Some("a".into()),
        ..page(2, before)
    };
    assert_eq!(ids(&queue_a(None)), vec![7, 5]);
    assert_eq!(ids(&queue_a(Some(5))), vec![3, 1]);
    let pending_b = ListFilter {
        status: Some(crate::Status::Pending),
        queue: Some("b".into()),
        ..page(2, Some(6))
    };
    assert_eq!(ids(&pending_b), vec![4, 2]);
    let failed = ListFilter {
        status: Some(crate::Status::Failed),
        ..page(2, None)
    };
    assert!(ids(&failed).is_empty());
}

#[test]
fn list_pages_read_an_index_in_id_order_for_every_filter() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("jobs.db")).unwrap();
    let now = 1_700_000_000_000i64;
    // A large queue `big` whose jobs are pending, and a small queue `rare` with one job
    // that is cancelled: a status and queue filter must walk the index with fewer rows to
    // skip, whichever that is. No ANALYZE: a user's file has no statistics.
    let mut jobs: Vec<crate::Job> = (0..200)
        .map(|_| crate::Job::shell("true").queue("big"))
        .collect();
    jobs.push(crate::Job::shell("true").queue("rare"));
    store.enqueue_many_at(&jobs, now).unwrap();
    store.cancel_at(201, now).unwrap();
    let conn = store.conn();
    let filter = |status: Option<crate::Status>, queue: Option<&str>| ListFilter {
        status,
        queue: queue.map(str::to_string),
        before: Some(150),
        limit: Some(51),
        ..ListFilter::default()
    };
    let pending = Some(crate::Status::Pending);
    let cancelled = Some(crate::Status::Cancelled);
    for (f, index) in [
        (filter(None, None), None),
        (filter(pending, None), Some("jobs_status")),
        (filter(None, Some("rare")), Some("jobs_queue")),
        (filter(None, Some("big")), Some("jobs_queue")),
        // Few cancelled jobs and many in `big`: walk the cancelled ones.
        (filter(cancelled, Some("big")), Some("jobs_status")),
        // Many pending jobs and few in `rare`: walk `rare`.
        (filter(pending, Some("rare")), Some("jobs_queue")),
    ] {
        let (sql, values) = read::list_sql(conn, &f).unwrap();
        let p = plan(conn, sql.sqlite(), values);
        match index {
            Some(index) => assert!(uses_index(&p, index), "{f:?}: {p}"),
            // No filter: the table itself, by rowid, from `before` down.
            None => assert!(
                p.contains("SEARCH jobs USING INTEGER PRIMARY KEY"),
                "{f:?}: {p}"
            ),
        }
        assert!(p.starts_with("SEARCH"), "{f:?}: {p}");
        assert!(!p.contains("SCAN"), "{f:?}: {p}");
        assert!(!p.contains("TEMP B-TREE"), "{f:?}: {p}");
        assert!(
            p.contains("id<?"),
            "the page starts at `before` in the index: {p}"
        );
    }
}

/// The jobs beside the ready ones in [`claim_steps`], all of both queues and at a higher
/// priority than the ready ones.
#[derive(Clone, Copy, Default)]
struct Beside {
    /// Jobs that wait for a job still pending.
    waiting: usize,
    /// Jobs due in an hour.
    not_due: usize,
}

/// The virtual-machine steps of the reads that pick one job for a claim (the promotion of due
/// deferred jobs, then the claim's read), on a file of `pending` ready jobs, half in queue `a`
/// and half in `b`, beside the jobs of `beside`: a count of work, the same on any machine,
/// where a timing would be noise.
fn claim_steps(pending: usize, beside: Beside, queues: &[String]) -> i32 {
    let Beside { waiting, not_due } = beside;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("jobs.db")).unwrap();
    let now = 1_700_000_000_000i64;
    let queue = |i: usize| if i % 2 == 0 { "a" } else { "b" };
    if waiting > 0 {
        // The dependency sits in a queue the claim does not read.
        let first = store
            .enqueue_at(&crate::Job::shell("true").queue("c"), now)
            .unwrap();
        let jobs: Vec<crate::Job> = (0..waiting)
            .map(|i| {
                crate::Job::shell("true")
                    .queue(queue(i))
                    .priority(10)
                    .after([first])
            })
            .collect();
        store.enqueue_many_at(&jobs, now).unwrap();
    }
    if not_due > 0 {
        let jobs: Vec<crate::Job> = (0..not_due)
            .map(|i| {
                crate::Job::shell("true")
                    .queue(queue(i))
                    .priority(10)
                    .delay(std::time::Duration::from_secs(3600))
            })
            .collect();
        store.enqueue_many_at(&jobs, now).unwrap();
    }
    let jobs: Vec<crate::Job> = (0..pending)
        .map(|i| crate::Job::shell("true").queue(queue(i)))
        .collect();
    store.enqueue_many_at(&jobs, now).unwrap();
    let conn = store.conn();
    let mut promote = conn.prepare(DUE_DEFERRED_SQL.sqlite()).unwrap();
    let due = promote
        .query_map(params_from_iter([now, 500]), |r| r.get::<_, i64>(0))
        .unwrap()
        .count();
    assert_eq!(due, 0, "nothing is due to promote");
    let promote_steps = promote
        .sqlite()
        .unwrap()
        .get_status(rusqlite::StatementStatus::VmStep);
    let mut values: Vec<crate::store::db::Value> = vec![now.into(), 1i64.into()];
    values.extend(queues.iter().map(|q| q.clone().into()));
    let mut stmt = conn.prepare(&claim_sql(queues, 0)).unwrap();
    let mut rows = stmt.query(params_from_iter(values)).unwrap();
    let mut claimed = 0;
    while rows.next().unwrap().is_some() {
        claimed += 1;
    }
    drop(rows);
    assert_eq!(claimed, 1);
    promote_steps
        + stmt
            .sqlite()
            .unwrap()
            .get_status(rusqlite::StatementStatus::VmStep)
}

#[test]
fn a_claim_does_the_same_work_from_a_thousand_or_a_hundred_thousand_pending_jobs() {
    for queues in [vec![], vec!["a".to_string()], vec!["a".into(), "b".into()]] {
        let (few, many) = (
            claim_steps(1_000, Beside::default(), &queues),
            claim_steps(100_000, Beside::default(), &queues),
        );
        // Measured: 40, 43 and 99 steps of the claim's read at both sizes. A read that scanned
        // or sorted the pending rows of its queues would take at least one step per row:
        // 50,000 and more here.
        assert!(
            many <= few * 2,
            "queues {queues:?}: {many} steps from 100,000 jobs, {few} from 1,000"
        );
    }
}

/// Asserts, for a claim from every queue, one queue and two, that the jobs of `beside` (named
/// `what` in the message) add at most a fifth to the claim's steps beside 1,000 ready jobs.
fn assert_claims_step_over_none_of(beside: Beside, what: &str) {
    for queues in [vec![], vec!["a".to_string()], vec!["a".into(), "b".into()]] {
        let (alone, with) = (
            claim_steps(1_000, Beside::default(), &queues),
            claim_steps(1_000, beside, &queues),
        );
        assert!(
            with <= alone + alone / 5,
            "queues {queues:?}: {with} steps beside {what}, {alone} without"
        );
    }
}

#[test]
fn a_hundred_thousand_waiting_jobs_cost_a_claim_nothing() {
    // The waiting jobs are not in the claim indexes: a claim that read them would take a step
    // for each, 100,000 here.
    let waiting = Beside {
        waiting: 100_000,
        ..Beside::default()
    };
    assert_claims_step_over_none_of(waiting, "100,000 waiting jobs");
}

#[test]
fn a_hundred_thousand_jobs_not_yet_due_at_a_higher_priority_cost_a_claim_nothing() {
    // Jobs due later are deferred, out of the claim indexes; the promotion's seek finds none
    // due. Were they in the claim indexes, a claim (which reads them in priority order and
    // filters by due time) would step over all 100,000 to reach a ready job: measured, 400,057
    // steps against 57.
    let not_due = Beside {
        not_due: 100_000,
        ..Beside::default()
    };
    assert_claims_step_over_none_of(not_due, "100,000 jobs not yet due");
}

#[test]
fn claim_reclaim_and_renew_statements_read_their_indexes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("jobs.db")).unwrap();
    // No ANALYZE: a user's file has no statistics, and the planner's choice is what it is
    // then.
    let conn = store.conn();
    let now = 1_700_000_000_000i64;
    let v = |x: &str| crate::store::db::Value::from(x.to_string());
    // The claim names its index; the index must serve the claim's order without a sort,
    // for all queues or one queue. (For several queues SQLite reads the index once per
    // queue and sorts what it read: only the index use is checked then.)
    for queues in [vec![], vec!["a".to_string()], vec!["a".into(), "b".into()]] {
        let mut values = vec![now.into(), 8i64.into()];
        values.extend(queues.iter().map(|q| v(q)));
        let p = plan(conn, claim_sql(&queues, 0).sqlite(), values);
        let index = if queues.is_empty() {
            "jobs_claim"
        } else {
            "jobs_claim_queue"
        };
        assert!(uses_index(&p, index), "{queues:?}: {p}");
        if queues.len() <= 1 {
            assert!(!p.contains("TEMP B-TREE"), "{queues:?}: {p}");
        }
    }
    // The sweeper's query reads the running rows only (through the index on them):
    // their number is bounded by the runners' workers, whatever the size of the table.
    for (exclude, expired, held) in [
        (Some("me"), true, None),
        (Some("me"), true, Some(r#"["t1"]"#)),
        (None, false, None),
    ] {
        let values = vec![
            exclude
                .map(v)
                .unwrap_or(crate::store::db::Value::Null(crate::store::db::Kind::Text)),
            i64::from(expired).into(),
            now.into(),
            v(r#"["dead"]"#),
            100i64.into(),
            held.map(v)
                .unwrap_or(crate::store::db::Value::Null(crate::store::db::Kind::Text)),
        ];
        let p = plan(conn, RECLAIM_CANDIDATES_SQL.sqlite(), values);
        let running_only =
            uses_index(&p, "jobs_running_worker") || p.contains("INDEX jobs_status (status=?)");
        let full_scan = p.lines().any(|l| l.trim() == "SCAN jobs");
        assert!(running_only && !full_scan, "{p}");
    }
    let values = vec![
        v("w"),
        now.into(),
        (now + 30_000).into(),
        v(r#"["t1","t2"]"#),
    ];
    let p = plan(conn, RENEW_SQL.sqlite(), values);
    assert!(uses_index(&p, "jobs_running_worker"), "{p}");
    // A claim under queue limits reads each queue's index head, finds the queues with a
    // ready job by skipping through that index, and takes its ids by primary key.
    let p = plan(
        conn,
        queue_head_sql(0).sqlite(),
        vec![v("a"), now.into(), 8i64.into()],
    );
    assert!(uses_index(&p, "jobs_claim_queue"), "{p}");
    assert!(!p.contains("TEMP B-TREE"), "{p}");
    let p = plan(conn, READY_QUEUES_SQL.sqlite(), vec![]);
    assert!(uses_index(&p, "jobs_claim_queue"), "{p}");
    assert!(!p.contains("TEMP B-TREE"), "{p}");
    // A dependent's ending reads its dependents through their index.
    let p = plan(
        conn,
        "SELECT job_id FROM job_deps WHERE after_id = ?1",
        vec![1i64.into()],
    );
    assert!(uses_index(&p, "job_deps_after"), "{p}");
}

/// Every index on `jobs` is read by a statement of the store: an index costs every write that
/// touches its columns, so one that no statement reads is dropped (as `jobs_running_lease` was
/// in version 14). The list below names, for each index, a statement that needs it; an index
/// added without one fails here.
#[test]
fn every_index_on_jobs_serves_a_statement_of_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("jobs.db")).unwrap();
    let conn = store.conn();
    let now = 1_700_000_000_000i64;
    let v = |x: &str| crate::store::db::Value::from(x.to_string());
    let i = crate::store::db::Value::from;
    let list = |filter: ListFilter| read::list_sql(conn, &filter).unwrap();
    let by_status = list(ListFilter {
        status: Some(crate::Status::Pending),
        before: Some(10),
        ..ListFilter::default()
    });
    let by_queue = list(ListFilter {
        queue: Some("a".into()),
        before: Some(10),
        ..ListFilter::default()
    });
    let stale = list(ListFilter {
        failed_stale: Some(3),
        ..ListFilter::default()
    });
    let statements: Vec<(crate::store::db::Sql, Vec<crate::store::db::Value>)> = vec![
        (claim_sql(&[], 0), vec![i(now), i(1)]),
        (claim_sql(&["a".into()], 0), vec![i(now), i(1), v("a")]),
        (DUE_DEFERRED_SQL, vec![i(now), i(500)]),
        (RENEW_SQL, vec![v("w"), i(now), i(now), v(r#"["t"]"#)]),
        (
            super::reclaim::pending_teardowns_sql(),
            vec![i(0), i(100), i(now)],
        ),
        by_status,
        by_queue,
        stale,
        (
            super::retention::DUE_SQL,
            vec![v("succeeded"), i(now), i(10), i(500)],
        ),
        (super::lease::NEXT_DUE_SQL, vec![i(now)]),
        (
            super::enqueue::MATCHING_SQL,
            vec![
                v("k"),
                crate::store::db::Value::Null(crate::store::db::Kind::Text),
            ],
        ),
        (super::schedule::SCHEDULE_BUSY_SQL, vec![v("s")]),
    ];
    let plans: Vec<String> = statements
        .iter()
        .map(|(sql, values)| plan(conn, sql.sqlite(), values.clone()))
        .collect();
    let indexes: Vec<String> = conn
        .prepare(
            "SELECT name FROM sqlite_schema
             WHERE type = 'index' AND tbl_name = 'jobs' AND sql IS NOT NULL ORDER BY name",
        )
        .unwrap()
        .query_map(params![], |r| r.get(0))
        .unwrap()
        .collect::<crate::Result<_>>()
        .unwrap();
    assert!(indexes.len() >= 10, "{indexes:?}");
    assert!(!indexes.iter().any(|x| x == "jobs_running_lease"));
    for index in &indexes {
        let reads = plans.iter().any(|p| {
            uses_index(p, index)
                || p.contains(&format!("COVERING INDEX {index} "))
                || p.contains(&format!("COVERING INDEX {index}\n"))
        });
        assert!(
            reads,
            "no statement of the store reads {index}: drop it, or name here the statement \
             that needs it\n{plans:#?}"
        );
    }
}

#[test]
fn a_failed_savepoint_undoes_only_its_own_writes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("jobs.db")).unwrap();
    let job = Job::shell("true");
    let (kept, undone) = transaction(store.conn(), &mut |conn| {
        let kept = savepoint(conn, |c| enqueue::insert_job(c, &job, 1))?;
        let undone = savepoint(conn, |c| {
            let id = enqueue::insert_job(c, &job, 1)?;
            Err::<i64, _>(crate::Error::NoSuchJob(id))
        })?;
        Ok((kept, undone))
    })
    .unwrap();
    let kept = kept.unwrap();
    assert!(
        matches!(undone, Err(crate::Error::NoSuchJob(_))),
        "{undone:?}"
    );
    let ids: Vec<i64> = store
        .list(&ListFilter::default())
        .unwrap()
        .iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(ids, [kept]);
    assert_eq!(store.events(kept).unwrap().len(), 1);
}

#[test]
fn a_handed_job_is_stored_once_under_its_token_and_not_past_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("jobs.db")).unwrap();
    // The clock's: a deadline is also checked against the clock.
    let now = crate::job::now_ms();
    let job = crate::Job::shell("true");
    let token = "0123456789abcdef0123456789abcdef";
    let jobs = |s: &Store| -> i64 {
        s.conn()
            .query_row("SELECT count(*) FROM jobs", params![], |r| r.get(0))
            .unwrap()
    };

    // Past its deadline, a request stores nothing.
    let late = store
        .enqueue_handed(&job, token, Some(now - 1), now)
        .unwrap();
    assert_eq!(late, None);
    assert_eq!(jobs(&store), 0);

    // The runner stores it before its deadline; the command, which got no answer, then finds
    // the token and stores nothing; so does the runner should the request come again.
    let (first, new) = store
        .enqueue_handed(&job, token, Some(now + 2000), now)
        .unwrap()
        .unwrap();
    assert!(new);
    let again = store.enqueue_handed(&job, token, None, now + 3000).unwrap();
    let late_again = store
        .enqueue_handed(&job, token, Some(now + 2000), now + 4000)
        .unwrap();
    assert_eq!(again, Some((first, false)));
    assert_eq!(
        late_again,
        Some((first, false)),
        "a stored token answers even past its deadline"
    );
    assert_eq!(jobs(&store), 1);

    // Another token is another job; the first token expires and is deleted by a later
    // hand-off, and only then could its request store a job again (were it not refused for
    // its deadline, long past by then).
    let (other, _) = store
        .enqueue_handed(&job, "ffffffffffffffffffffffffffffffff", None, now)
        .unwrap()
        .unwrap();
    assert_ne!(other.id, first.id);
    let tokens = |s: &Store| -> i64 {
        s.conn()
            .query_row("SELECT count(*) FROM handoffs", params![], |r| r.get(0))
            .unwrap()
    };
    assert_eq!(tokens(&store), 2);
    let much_later = now + 2000 + super::handoff::TOKEN_KEPT_MS + 1;
    store
        .enqueue_handed(&job, "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee", None, much_later)
        .unwrap();
    assert_eq!(
        tokens(&store),
        1,
        "both older tokens expired and were deleted"
    );
}

#[test]
fn a_handed_duplicate_is_answered_as_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("jobs.db")).unwrap();
    let now = 1_700_000_000_000i64;
    let job = crate::Job::shell("true").unique_key("k");
    let held = store.enqueue_unique_at(&job, now).unwrap();
    let handed = store
        .enqueue_handed(&job, "0123456789abcdef0123456789abcdef", None, now)
        .unwrap()
        .unwrap();
    let duplicate = Enqueued {
        id: held.id,
        duplicate: true,
    };
    assert_eq!(handed, (duplicate, false), "nothing new was enqueued");
    let again = store
        .enqueue_handed(&job, "0123456789abcdef0123456789abcdef", None, now)
        .unwrap()
        .unwrap();
    assert_eq!(again, handed);
}

/// The statements a runner's writer runs for every job (a claim, a start, a success that
/// releases a dependent, its counters and events, and a start committed with its success)
/// build no temporary b-tree. SQLite builds one, once
/// per run of the statement, for an IN list of more than two constants (in a CHECK
/// constraint too), for a RETURNING clause and for `IN (SELECT ...)` in an UPDATE; each has a
/// page cache of its own, and the allocator's churn of those caches cost more CPU than the
/// rest of the writer's statements together.
#[test]
fn the_statements_run_for_every_job_build_no_temporary_btree() {
    use crate::store::{AttemptStart, ClaimRequest, Ending, Finish};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.db");
    let store = Store::open(&path).unwrap();
    let now = 1_700_000_000_000i64;
    let first = store.enqueue_at(&crate::Job::shell("true"), now).unwrap();
    let second = store
        .enqueue_at(&crate::Job::shell("true").after([first]), now)
        .unwrap();

    let mut conn = rusqlite::Connection::open(&path).unwrap();
    let traced = std::sync::Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
    let sink = std::sync::Arc::clone(&traced);
    conn.trace_v2(
        rusqlite::trace::TraceEventCodes::SQLITE_TRACE_STMT,
        Some(move |e: rusqlite::trace::TraceEvent<'_>| {
            if let rusqlite::trace::TraceEvent::Stmt(stmt, sql) = e
                // Trigger programs are traced as comments; the UPDATE that fires them is
                // explained with them.
                && !sql.starts_with("--")
            {
                sink.lock().push(stmt.expanded_sql().unwrap_or_default());
            }
        }),
    )
    .unwrap();
    let conn = crate::store::db::Connection::from(conn);
    let outcome = transaction(&conn, &mut |conn| {
        let req = ClaimRequest {
            worker_id: "w",
            limit: 1,
            queues: &[],
            lease_ttl: std::time::Duration::from_secs(60),
            queue_caps: &[],
            unheld: 0,
        };
        let job = claim(conn, &req, now)?.remove(0);
        assert_eq!(job.id, first);
        let start = AttemptStart {
            job_id: job.id,
            run_token: job.run_token.clone(),
            pid: 4242,
            pgid: 4242,
            start_time: 1,
            keeper: None,
        };
        assert!(record_start(conn, &start, now)?);
        let finish = Finish {
            job_id: job.id,
            run_token: job.run_token.clone(),
            attempt: job.attempt,
            ending: Ending::Succeeded,
            output: None,
            notes: Vec::new(),
            max_recovery_attempts: 3,
        };
        finish_attempt(conn, &finish, now)
    })
    .unwrap();
    assert_eq!(outcome, Finished::Recorded(crate::job::Status::Succeeded));
    // The success released the dependent: it is the next claim.
    assert_eq!(store.job(second).unwrap().waiting_for, Vec::<i64>::new());
    // A start committed with its ending (the writer's pair), for it and one more job.
    store.enqueue_at(&crate::Job::shell("true"), now).unwrap();
    transaction(&conn, &mut |conn| {
        let req = ClaimRequest {
            worker_id: "w",
            limit: 2,
            queues: &[],
            lease_ttl: std::time::Duration::from_secs(60),
            queue_caps: &[],
            unheld: 0,
        };
        for job in claim(conn, &req, now)? {
            let start = AttemptStart {
                job_id: job.id,
                run_token: job.run_token.clone(),
                pid: 4243,
                pgid: 4243,
                start_time: 1,
                keeper: Some((4244, 1)),
            };
            let finish = Finish {
                job_id: job.id,
                run_token: job.run_token.clone(),
                attempt: job.attempt,
                ending: Ending::Succeeded,
                output: None,
                notes: Vec::new(),
                max_recovery_attempts: 3,
            };
            finish_started(conn, &start, &finish, now)?;
        }
        Ok(())
    })
    .unwrap();

    let statements = traced.lock().clone();
    let ran = |part: &str| statements.iter().any(|s| s.contains(part));
    for part in [
        "INDEXED BY jobs_claim",
        "SET status = 'running'",
        "SET pid =",
        "SET status = 'succeeded'",
        "INSERT INTO job_events",
        "start_detail",
        "INSERT INTO metric_counters",
        "INSERT INTO metric_histograms",
        "FROM job_deps",
        "SET waiting = waiting - 1",
    ] {
        assert!(ran(part), "no statement with {part:?} ran: {statements:#?}");
    }
    assert!(
        statements
            .iter()
            .any(|s| s.contains("SET status = 'succeeded'") && s.contains("pid = 4243")),
        "no success wrote its start's process: {statements:#?}"
    );
    let building: Vec<&String> = statements
        .iter()
        .filter(|sql| {
            let mut stmt = conn.prepare(&format!("EXPLAIN {sql}")).unwrap();
            let ops = stmt
                .query_map(params![], |r| r.get::<_, String>(1))
                .unwrap()
                .collect::<crate::Result<Vec<_>>>()
                .unwrap();
            ops.iter().any(|op| op == "OpenEphemeral")
        })
        .collect();
    assert!(building.is_empty(), "{building:#?}");
}
