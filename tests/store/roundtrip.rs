//! A job's row read back equals what was enqueued, for any job the builder accepts: the
//! columns' encodings (argv and env as JSON, times in ms, the enums' spellings) lose nothing.

use std::time::{Duration, UNIX_EPOCH};

use leasehold::{Job, OnLost, Status};
use proptest::prelude::*;

use crate::util::TestDb;

/// Text of any characters, NUL and control characters included (the builder refuses what it
/// cannot store).
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-zA-Z0-9 _./=-]{0,12}",
        1 => any::<String>(),
    ]
}

fn millis() -> impl Strategy<Value = Option<u64>> {
    proptest::option::of(prop_oneof![0u64..10_000, any::<u64>()])
}

/// What a test asks the builder for.
#[derive(Debug, Clone)]
struct Spec {
    argv: Vec<String>,
    env: Vec<(String, String)>,
    cwd: Option<String>,
    queue: Option<String>,
    priority: i64,
    max_attempts: Option<u32>,
    timeout: Option<u64>,
    idle: Option<u64>,
    on_lost: OnLost,
    name: Option<String>,
    unique_key: Option<String>,
    run_at: Option<u64>,
}

prop_compose! {
    fn any_spec()(
        argv in proptest::collection::vec(text(), 0..4),
        env in proptest::collection::vec((text(), text()), 0..3),
        cwd in proptest::option::of(text()),
        queue in proptest::option::of(text()),
        priority in any::<i64>(),
        max_attempts in proptest::option::of(any::<u32>()),
        timeout in millis(),
        idle in millis(),
        on_lost in prop_oneof![Just(OnLost::Requeue), Just(OnLost::Fail)],
        name in proptest::option::of(text()),
        unique_key in proptest::option::of(text()),
        run_at in proptest::option::of(0u64..4_102_444_800_000),
    ) -> Spec {
        Spec { argv, env, cwd, queue, priority, max_attempts, timeout, idle, on_lost, name, unique_key, run_at }
    }
}

/// The job the builder makes of `spec`.
fn job(spec: &Spec) -> Job {
    let mut job = Job::command(spec.argv.clone())
        .priority(spec.priority)
        .on_lost(spec.on_lost);
    for (k, v) in &spec.env {
        job = job.env(k.clone(), v.clone());
    }
    if let Some(dir) = &spec.cwd {
        job = job.cwd(dir.clone());
    }
    if let Some(q) = &spec.queue {
        job = job.queue(q.clone());
    }
    if let Some(n) = spec.max_attempts {
        job = job.max_attempts(n);
    }
    if let Some(ms) = spec.timeout {
        job = job.timeout(Duration::from_millis(ms));
    }
    if let Some(ms) = spec.idle {
        job = job.idle_timeout(Duration::from_millis(ms));
    }
    if let Some(n) = &spec.name {
        job = job.name(n.clone());
    }
    if let Some(k) = &spec.unique_key {
        job = job.unique_key(k.clone());
    }
    if let Some(ms) = spec.run_at {
        job = job.run_at(UNIX_EPOCH + Duration::from_millis(ms));
    }
    job
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_jobs_row_reads_back_as_enqueued(spec in any_spec()) {
        let db = TestDb::new();
        let store = db.store();
        let now = 1_700_000_000_000;
        let Ok(id) = store.enqueue_at(&job(&spec), now) else {
            return Ok(());
        };
        let ms = |ms: u64| i64::try_from(ms).expect("stored, so it fits");
        let row = store.job(id).expect("the enqueued job reads back");
        prop_assert_eq!(row.status, Status::Pending);
        prop_assert_eq!(&row.argv, &spec.argv);
        prop_assert_eq!(&row.env, &spec.env);
        prop_assert_eq!(&row.cwd, &spec.cwd);
        prop_assert_eq!(&row.queue, spec.queue.as_deref().unwrap_or(leasehold::DEFAULT_QUEUE));
        prop_assert_eq!(row.priority, spec.priority);
        prop_assert_eq!(
            row.max_attempts,
            i64::from(spec.max_attempts.unwrap_or(leasehold::DEFAULT_MAX_ATTEMPTS))
        );
        prop_assert_eq!(row.timeout_ms, spec.timeout.map(ms));
        prop_assert_eq!(row.idle_timeout_ms, spec.idle.map(ms));
        prop_assert_eq!(row.on_lost, spec.on_lost);
        prop_assert_eq!(&row.name, &spec.name);
        prop_assert_eq!(&row.unique_key, &spec.unique_key);
        prop_assert_eq!(row.scheduled_at, spec.run_at.map_or(now, ms));
        prop_assert_eq!(row.attempt, 0);
    }
}
