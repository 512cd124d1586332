//! The recent failures the dashboard lists: failed and lost attempts, newest first, with how
//! each failed.

use leasehold::{ErrorKind, EventKind, Job};

use crate::helper::{claim_and_lose, claim_one, enqueue, exit, finish};
use crate::util::T0;

crate::on_both! {
    fn recent_failures_are_failed_retried_and_lost_attempts_newest_first(db) {
        let store = db.store();
        assert!(store.recent_failures(20).unwrap().is_empty());
        let ok = enqueue(&store, &Job::shell("true"));
        let c = claim_one(&store, "w", T0);
        finish(&store, &c, leasehold::protocol::Ending::Succeeded, T0 + 1);
        // Fails, is retried after its backoff, and fails again.
        let twice = enqueue(&store, &Job::shell("false").max_attempts(2));
        let first = claim_one(&store, "w", T0 + 2);
        finish(&store, &first, exit(1), T0 + 3);
        let second = claim_one(&store, "w", T0 + 10_000);
        assert_eq!((second.id, second.attempt), (twice, 2));
        finish(&store, &second, exit(2), T0 + 10_001);
        // Lost: its lease expires and a sweep requeues it.
        let lost = enqueue(&store, &Job::shell("sleep 100"));
        let c = claim_and_lose(&store, T0 + 20_000, 3);
        assert_eq!(c.id, lost);

        let listed: Vec<(i64, EventKind, i64, Option<ErrorKind>)> = store
            .recent_failures(20)
            .unwrap()
            .into_iter()
            .map(|f| (f.job_id, f.kind, f.attempt, f.error_kind))
            .collect();
        assert_eq!(
            listed,
            [
                (lost, EventKind::Reclaimed, 1, Some(ErrorKind::Lost)),
                (twice, EventKind::Failed, 2, Some(ErrorKind::Exit)),
                // The job keeps only its latest attempt's error_kind.
                (twice, EventKind::RetryScheduled, 1, None),
            ]
        );
        assert!(!listed.iter().any(|f| f.0 == ok));
        let newest = &store.recent_failures(1).unwrap()[0];
        assert_eq!(newest.job_id, lost);
        assert_eq!(newest.argv, ["sh", "-c", "sleep 100"]);
        assert_eq!(newest.queue, "default");
    }

    /// A failure's line is the last non-blank line of the last 1024 bytes of its stderr, read
    /// as text even where the cut falls inside a character.
    fn a_failures_line_is_the_last_line_of_its_stderrs_tail(db) {
        let store = db.store();
        let id = enqueue(&store, &Job::shell("false"));
        let c = claim_one(&store, "w", T0);
        // 'é' is two bytes; 1024 bytes from the end start in the middle of one.
        let mut stderr = "é".repeat(600).into_bytes();
        stderr.extend_from_slice(b"\nwarming up\nno such table: orders\n\n");
        let finish = leasehold::protocol::Finish {
            job_id: c.id,
            run_token: c.run_token.clone(),
            attempt: c.attempt,
            ending: exit(1),
            output: Some(leasehold::Output::new(c.attempt, Vec::new(), stderr, false, false)),
            notes: Vec::new(),
            max_recovery_attempts: 3,
        };
        store.finish(&finish, T0 + 1).unwrap();
        let failure = &store.recent_failures(1).unwrap()[0];
        assert_eq!(failure.job_id, id);
        assert_eq!(
            failure.stderr_last_line.as_deref(),
            Some("no such table: orders")
        );
    }
}
