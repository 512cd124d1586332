use super::*;
use crate::store::db::params_from_iter;

/// The next due time among claimable jobs: the earliest after `now`, per served queue,
/// leaving out due, running and waiting jobs; and read from an index, not the table.
#[test]
fn next_due_is_the_earliest_future_claimable_job_of_the_served_queues() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let store = crate::Store::open(dir.path().join("jobs.db")).expect("open");
    let at = |queue: &str, ms: i64| {
        crate::Job::shell("true")
            .queue(queue)
            .run_at(std::time::UNIX_EPOCH + Duration::from_millis(ms.unsigned_abs()))
    };
    let first = store.enqueue_at(&at("a", 1_000), 0).expect("enqueue");
    store.enqueue_at(&at("a", 3_000), 0).expect("enqueue");
    store.enqueue_at(&at("b", 2_000), 0).expect("enqueue");
    // Waits for `first`: not claimable, so not counted, however early.
    store
        .enqueue_at(&at("b", 500).after([first]), 0)
        .expect("enqueue");
    let conn = store.conn();
    let all: &[String] = &[];
    let b = ["b".to_string()];
    let none = ["c".to_string()];
    assert_eq!(next_due(conn, all, 0).unwrap(), Some(1_000));
    assert_eq!(next_due(conn, all, 1_000).unwrap(), Some(2_000));
    assert_eq!(next_due(conn, &b, 0).unwrap(), Some(2_000));
    assert_eq!(next_due(conn, &none, 0).unwrap(), None);
    assert_eq!(next_due(conn, all, 3_000).unwrap(), None);
    // A claimed job is no longer pending.
    let req = ClaimRequest {
        worker_id: "w",
        limit: 1,
        queues: &["a".to_string()],
        lease_ttl: Duration::from_secs(30),
        queue_caps: &[],
        unheld: 0,
    };
    assert_eq!(claim(conn, &req, 1_500).unwrap().len(), 1);
    assert_eq!(next_due(conn, &["a".to_string()], 0).unwrap(), Some(3_000));
    let plans = [
        (
            QUEUE_NEXT_DUE_SQL,
            vec![crate::store::db::Value::from("a".to_string()), 0.into()],
        ),
        (NEXT_DUE_SQL, vec![0.into()]),
    ];
    for (sql, values) in plans {
        let plan: Vec<String> = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {}", sql.sqlite()))
            .unwrap()
            .query_map(params_from_iter(values), |r| r.get(3))
            .unwrap()
            .collect::<Result<_>>()
            .unwrap();
        assert!(
            plan.iter()
                .any(|l| l.contains("USING INDEX jobs_pending_due (queue=? AND scheduled_at>?)")),
            "{plan:?}"
        );
        assert!(
            plan.iter()
                .all(|l| !l.starts_with("SCAN jobs") || l.contains("INDEX")),
            "{plan:?}"
        );
    }
}

/// Two jobs of a queue of their own claimed at `now`; their claims.
fn claimed_pair(store: &crate::Store, job: &crate::Job, now: i64) -> Vec<Claimed> {
    let queue = format!("q{now}");
    let job = job.clone().queue(&queue);
    store.enqueue_at(&job, now).expect("enqueue");
    store.enqueue_at(&job, now).expect("enqueue");
    let req = ClaimRequest {
        worker_id: "w",
        limit: 2,
        queues: &[queue],
        lease_ttl: Duration::from_secs(30),
        queue_caps: &[],
        unheld: 0,
    };
    let claimed = claim(store.conn(), &req, now).expect("claim");
    assert_eq!(claimed.len(), 2);
    claimed
}

/// The start of claim `c`'s attempt, with a keeper.
fn start_of(c: &Claimed) -> AttemptStart {
    let pid = 40_000 + i32::try_from(c.id).expect("a small id");
    AttemptStart {
        job_id: c.id,
        run_token: c.run_token.clone(),
        pid,
        pgid: pid,
        start_time: 777,
        keeper: Some((pid - 1, 776)),
    }
}

/// What a job's history and row show, without what differs between two jobs (ids,
/// pids).
fn seen(store: &crate::Store, id: i64) -> (Vec<(String, i64, i64, String)>, String) {
    let events = store
        .events(id)
        .expect("events")
        .into_iter()
        .map(|e| {
            let detail = e.detail.unwrap_or_default();
            let pid = (40_000 + id).to_string();
            (
                e.kind.to_string(),
                e.at,
                e.attempt,
                detail.replace(&pid, "P"),
            )
        })
        .collect();
    let j = store.job(id).expect("job");
    let row = format!(
        "{} {:?} {:?} {:?} {:?} {:?} {:?}",
        j.status,
        j.pid.map(|p| p - id),
        j.pgid.map(|p| p - id),
        j.keeper_pid.map(|p| p - id),
        j.exit_code,
        j.error_kind,
        j.last_error
    );
    (events, row)
}

/// Event rows of job `id` (the writer's tests count them too).
pub(crate) fn rows(store: &crate::Store, id: i64) -> i64 {
    store
        .conn()
        .query_row(
            "SELECT count(*) FROM job_events WHERE job_id = ?1",
            [id],
            |r| r.get(0),
        )
        .expect("count")
}

/// A start and its ending recorded together read exactly as the two recorded one after
/// the other (kinds, times, attempts, details, and the job's pid and ending), in one
/// event row fewer, for every kind of ending; with notes, the start keeps its own row so
/// that the notes stay between it and the ending.
#[test]
fn a_start_recorded_with_its_ending_reads_as_the_two_recorded_apart() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let store = crate::Store::open(dir.path().join("jobs.db")).expect("open");
    let failed = |code| Ending::Failed {
        kind: ErrorKind::Exit,
        exit_code: Some(code),
        signal: None,
        message: format!("exit {code}"),
    };
    let retried = crate::Job::shell("false")
        .max_attempts(3)
        .backoff(Duration::ZERO, Duration::ZERO);
    let once = crate::Job::shell("true");
    let leak = vec![(EventKind::Leaked, "1 process left".to_string())];
    let cases = [
        (&once, Ending::Succeeded, Vec::new(), 1),
        (&once, failed(1), Vec::new(), 1),
        (&retried, failed(2), Vec::new(), 1),
        (
            &once,
            Ending::Lost {
                message: "frozen".to_string(),
            },
            Vec::new(),
            1,
        ),
        (
            &once,
            Ending::Interrupted {
                message: "shutdown".to_string(),
            },
            Vec::new(),
            1,
        ),
        (&once, Ending::Succeeded, leak, 0),
    ];
    for (i, (job, ending, notes, fewer)) in cases.into_iter().enumerate() {
        let now = 1_700_000_000_000 + 1_000 * i as i64;
        let pair = claimed_pair(&store, job, now);
        let finish = |c: &Claimed| Finish {
            job_id: c.id,
            run_token: c.run_token.clone(),
            attempt: c.attempt,
            ending: ending.clone(),
            output: None,
            notes: notes.clone(),
            max_recovery_attempts: 3,
        };
        let (apart, together) = (&pair[0], &pair[1]);
        let at = now + 10;
        crate::store::transaction(store.conn(), &mut |conn| {
            assert!(record_start(conn, &start_of(apart), at)?);
            finish_attempt(conn, &finish(apart), at)?;
            finish_started(conn, &start_of(together), &finish(together), at)
        })
        .expect("recorded");
        assert_eq!(
            seen(&store, apart.id),
            seen(&store, together.id),
            "{ending:?}"
        );
        let kinds: Vec<String> = seen(&store, together.id)
            .0
            .into_iter()
            .map(|e| e.0)
            .collect();
        assert_eq!(kinds[..3], ["enqueued", "claimed", "started"], "{ending:?}");
        assert_eq!(
            rows(&store, together.id),
            rows(&store, apart.id) - fewer,
            "{ending:?}"
        );
    }
}

/// A start and ending recorded together after the lease moved on record no start, as
/// the start recorded alone would not have.
#[test]
fn a_start_with_its_ending_after_the_lease_is_gone_records_no_start() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let store = crate::Store::open(dir.path().join("jobs.db")).expect("open");
    let now = 1_700_000_000_000;
    let pair = claimed_pair(&store, &crate::Job::shell("true"), now);
    for c in &pair {
        store.cancel_at(c.id, now + 1).expect("cancel");
    }
    let (apart, together) = (&pair[0], &pair[1]);
    let finish = |c: &Claimed| Finish {
        job_id: c.id,
        run_token: c.run_token.clone(),
        attempt: c.attempt,
        ending: Ending::Succeeded,
        output: None,
        notes: Vec::new(),
        max_recovery_attempts: 3,
    };
    let at = now + 10;
    let done = crate::store::transaction(store.conn(), &mut |conn| {
        assert!(!record_start(conn, &start_of(apart), at)?);
        Ok((
            finish_attempt(conn, &finish(apart), at)?,
            finish_started(conn, &start_of(together), &finish(together), at)?,
        ))
    })
    .expect("recorded");
    assert_eq!(done, (Finished::Stopped, Finished::Stopped));
    assert_eq!(seen(&store, apart.id), seen(&store, together.id));
    let kinds: Vec<String> = seen(&store, together.id)
        .0
        .into_iter()
        .map(|e| e.0)
        .collect();
    assert!(!kinds.contains(&"started".to_string()), "{kinds:?}");
}

/// The wait before jitter, as `backoff_ms` computes it.
fn unjittered(base: i64, cap: i64, failures: i64) -> i64 {
    let doublings = failures.saturating_sub(1).clamp(0, 40);
    base.saturating_mul(1i64 << doublings).min(cap).max(0)
}

fn samples(base: i64, cap: i64, failures: i64) -> Vec<i64> {
    (0..200).map(|_| backoff_ms(base, cap, failures)).collect()
}

#[test]
fn backoff_never_overflows_and_stays_within_the_jittered_cap() {
    let counts = [
        i64::MIN,
        -1,
        0,
        1,
        2,
        10,
        40,
        41,
        62,
        63,
        64,
        1000,
        i64::MAX,
    ];
    for (base, cap) in [
        (1_000, 3_600_000),
        (250, 4_000),
        (1, 1),
        (0, 0),
        (i64::MAX, i64::MAX),
        (i64::MAX / 2, i64::MAX),
    ] {
        for failures in counts {
            let wait = unjittered(base, cap, failures);
            // ±20% of the wait, and never more than 120% of the cap.
            let low = wait - wait / 5;
            let high = wait.saturating_add(wait / 5);
            for got in samples(base, cap, failures) {
                assert!(
                    (low..=high).contains(&got),
                    "backoff_ms({base}, {cap}, {failures}) = {got}, not in {low}..={high}"
                );
            }
        }
    }
}

#[test]
fn backoff_is_jittered_at_every_failure_count() {
    for failures in [1, 2, 5] {
        let s = samples(1_000, 3_600_000, failures);
        assert!(
            s.iter().any(|&w| w != s[0]),
            "no jitter at {failures}: {s:?}"
        );
    }
}

#[test]
fn backoff_past_the_cap_is_jittered_around_the_cap_not_pinned_above_it() {
    let cap = 4_000;
    for failures in [6, 10, 63, 64, 1000, i64::MAX] {
        let s = samples(250, cap, failures);
        assert!(
            s.iter().all(|w| (cap * 8 / 10..=cap * 12 / 10).contains(w)),
            "{failures}: {s:?}"
        );
        // The cap is the centre of the jitter: some waits fall below it, some above.
        assert!(s.iter().any(|&w| w < cap), "{failures}: {s:?}");
        assert!(s.iter().any(|&w| w > cap), "{failures}: {s:?}");
    }
}
