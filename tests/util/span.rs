//! Jobs that record when they themselves ran, and how many ran at once: what a limit is
//! checked against, from the jobs' own clocks rather than the runner's records.

use std::path::Path;

use leasehold::Job;

/// A job that sleeps `secs` and then writes its own start and end (nanoseconds since the
/// epoch) to `dir/<job id>`.
pub fn timed(dir: &Path, secs: &str) -> Job {
    Job::shell(format!(
        "s=$(date +%s%N); sleep {secs}; e=$(date +%s%N); \
         echo \"$s $e\" > '{dir}/'$LEASEHOLD_JOB_ID.tmp && \
         mv '{dir}/'$LEASEHOLD_JOB_ID.tmp '{dir}/'$LEASEHOLD_JOB_ID",
        dir = dir.display()
    ))
}

/// The (start, end) each job of `ids` wrote to `dir`.
pub fn spans(dir: &Path, ids: &[i64]) -> Vec<(u128, u128)> {
    ids.iter()
        .map(|id| {
            let text = std::fs::read_to_string(dir.join(id.to_string()))
                .unwrap_or_else(|e| panic!("job {id} recorded its times: {e}"));
            let mut parts = text.split_whitespace().map(|p| p.parse::<u128>().unwrap());
            (parts.next().unwrap(), parts.next().unwrap())
        })
        .collect()
}

/// The most of `spans` that ran at the same moment.
pub fn max_overlap(spans: &[(u128, u128)]) -> usize {
    // Ends sort before starts at the same instant: a job that ends as another starts does
    // not overlap it.
    let mut edges: Vec<(u128, i32)> = spans.iter().flat_map(|&(s, e)| [(s, 1), (e, -1)]).collect();
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    most as usize
}
