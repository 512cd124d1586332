//! Which of a job's attempt folders holds the output asked for, and whether that attempt is
//! running: what `jobs logs` and its `--follow` both decide by.

use leasehold::{AttemptDir, JobRecord, Status};

/// The folder of `attempt` among a job's `dirs`: the one of the job's current run token when
/// that is the attempt asked for, else the newest of that number (an operator's retry counts
/// attempts from 1 again).
pub(super) fn attempt_dir(
    dirs: &[AttemptDir],
    attempt: i64,
    job: &JobRecord,
) -> Option<AttemptDir> {
    let token = job.run_token.as_deref().filter(|_| attempt == job.attempt);
    let mut of_attempt = dirs.iter().filter(|d| d.attempt == attempt);
    let current = token.and_then(|t| of_attempt.clone().find(|d| d.token == t));
    current.or_else(|| of_attempt.next_back()).cloned()
}

/// Whether `job` is running `attempt` (the attempt of `dir`, when it has a folder).
pub(super) fn is_running(job: &JobRecord, attempt: i64, dir: Option<&AttemptDir>) -> bool {
    job.status == Status::Running
        && job.attempt == attempt
        && dir.is_none_or(|d| job.run_token.as_deref() == Some(d.token.as_str()))
}
