//! Metrics: a snapshot of a database (and of a runner, when one took it), and its rendering
//! in the Prometheus text exposition format, version 0.0.4. No SQL here: the store reads the
//! snapshot ([`Store::metrics`](crate::Store::metrics)), a runner adds its live figures
//! ([`Runner::metrics`](crate::Runner::metrics)).
//!
//! The exposition is written by hand rather than with `prometheus-client`: that crate encodes
//! OpenMetrics 1.0 (`# EOF`, `_created` samples), not the 0.0.4 text format, and its model is
//! live metric objects in one process, while ours is a snapshot read from a file that other
//! processes also write.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

/// The database's size on disk: see [`Store::size`](crate::Store::size).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatabaseSize {
    /// The database file.
    pub path: PathBuf,
    /// Its schema version (`PRAGMA user_version`).
    pub schema_version: i64,
    /// The size of the main file, in bytes.
    pub bytes: u64,
    /// The bytes of the main file's free pages (freelist pages × page size): what an
    /// incremental vacuum or a full VACUUM can give back.
    pub free_bytes: u64,
    /// The size of the `-wal` file beside it, in bytes; 0 when there is none.
    pub wal_bytes: u64,
}

/// The durable counters. Each is kept in the database and updated in the transaction of the
/// transition it counts, so it survives restarts, is shared by every runner on the file, and
/// is never lowered by pruning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CounterKind {
    /// Jobs that reached an end, by queue and outcome (`succeeded`, `failed`, `lost`,
    /// `cancelled`).
    JobsEnded,
    /// Failed attempts followed by a retry (the job went back to pending with a backoff).
    RetriesScheduled,
    /// Lost attempts reclaimed by a sweeper, by queue and outcome (`requeued`, `failed`).
    Reclaims,
    /// Attempts a runner killed itself because it could not renew their lease in time.
    SelfFences,
    /// Lost attempts whose processes were dealt with (killed, found gone, or unverifiable).
    Teardowns,
    /// Results written after their attempt had lost its lease, and so discarded.
    LateResultsDiscarded,
    /// Attempts whose command could not be started.
    SpawnFailures,
    /// Attempts interrupted by a runner's shutdown and requeued without spending a budget.
    Interrupted,
    /// Operators' retries (`jobs retry`, [`Store::retry`](crate::Store::retry)).
    ManualRetries,
}

impl CounterKind {
    /// Every counter, in the exposition's order.
    pub const ALL: [CounterKind; 9] = [
        CounterKind::JobsEnded,
        CounterKind::RetriesScheduled,
        CounterKind::Reclaims,
        CounterKind::SelfFences,
        CounterKind::Teardowns,
        CounterKind::LateResultsDiscarded,
        CounterKind::SpawnFailures,
        CounterKind::Interrupted,
        CounterKind::ManualRetries,
    ];

    /// The name stored in the `metric_counters` table.
    pub fn as_str(self) -> &'static str {
        match self {
            CounterKind::JobsEnded => "jobs_ended",
            CounterKind::RetriesScheduled => "retries_scheduled",
            CounterKind::Reclaims => "reclaims",
            CounterKind::SelfFences => "self_fences",
            CounterKind::Teardowns => "teardowns",
            CounterKind::LateResultsDiscarded => "late_results_discarded",
            CounterKind::SpawnFailures => "spawn_failures",
            CounterKind::Interrupted => "attempts_interrupted",
            CounterKind::ManualRetries => "manual_retries",
        }
    }

    /// The counter stored as `name`, if this build knows it.
    pub fn from_name(name: &str) -> Option<CounterKind> {
        CounterKind::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// Its labels besides none: which of `queue` and `outcome` it has.
    fn labels(self) -> (bool, bool) {
        match self {
            CounterKind::JobsEnded | CounterKind::Reclaims => (true, true),
            CounterKind::Teardowns | CounterKind::LateResultsDiscarded => (false, false),
            _ => (true, false),
        }
    }

    fn help(self) -> &'static str {
        match self {
            CounterKind::JobsEnded => {
                "Jobs that reached an end, by queue and outcome (succeeded, failed, lost, cancelled)."
            }
            CounterKind::RetriesScheduled => {
                "Failed attempts followed by a retry after a backoff, by queue."
            }
            CounterKind::Reclaims => {
                "Lost attempts reclaimed by a sweeper, by queue and outcome (requeued, failed)."
            }
            CounterKind::SelfFences => {
                "Attempts a runner killed itself because it could not renew their lease in time, by queue."
            }
            CounterKind::Teardowns => {
                "Lost attempts whose processes were torn down (killed, found gone or unverifiable)."
            }
            CounterKind::LateResultsDiscarded => {
                "Results of attempts that had lost their lease, discarded by the fence."
            }
            CounterKind::SpawnFailures => "Attempts whose command could not be started, by queue.",
            CounterKind::Interrupted => {
                "Attempts interrupted by a runner's shutdown and requeued, by queue."
            }
            CounterKind::ManualRetries => "Operators' retries of jobs, by queue.",
        }
    }
}

/// One counter's value for one set of labels.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Counter {
    /// Which counter.
    pub kind: CounterKind,
    /// The queue label ("" for a counter without one).
    pub queue: String,
    /// The outcome label ("" for a counter without one).
    pub outcome: String,
    /// Its value.
    pub value: u64,
}

/// Jobs of one queue in one status.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobCount {
    /// The queue.
    pub queue: String,
    /// The status, as stored (`pending`, `running`, ...).
    pub status: String,
    /// How many jobs.
    pub jobs: u64,
}

/// One histogram of attempt durations, for one queue and outcome.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Histogram {
    /// The queue.
    pub queue: String,
    /// How the attempts ended: `succeeded`, `failed` (for good), `retried`, `lost`,
    /// `interrupted` or `cancelled`.
    pub outcome: String,
    /// Cumulative buckets: (upper bound in seconds, observations at or below it), in
    /// increasing order; the last bound is infinite and its count is [`Histogram::count`].
    pub buckets: Vec<(f64, u64)>,
    /// The sum of the observations, in seconds.
    pub sum: f64,
    /// The number of observations.
    pub count: u64,
}

/// The live figures of a runner, which are not in the database.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunnerFigures {
    /// Its worker id.
    pub worker_id: String,
    /// Its worker threads.
    pub workers: u64,
    /// Workers running an attempt now.
    pub busy_workers: u64,
    /// Writes (claims, starts, endings) queued for the writer thread, when it could be read
    /// (not while the runner shuts down).
    pub writer_queue: Option<u64>,
    /// How long its last lease renewal took, once it has renewed.
    pub last_renewal: Option<Duration>,
}

/// A snapshot of a database's metrics, read in one read transaction (it never holds a write
/// lock). Render it with [`Metrics::to_prometheus`].
///
/// ```
/// # fn main() -> leasehold::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// use leasehold::{Job, Store};
///
/// let store = Store::open(dir.path().join("jobs.db"))?;
/// store.enqueue(&Job::shell("true").queue("mail"))?;
/// let metrics = store.metrics()?;
/// assert_eq!(metrics.jobs("mail", "pending"), 1);
/// assert!(metrics.to_prometheus().contains("leasehold_jobs{queue=\"mail\",status=\"pending\"} 1\n"));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Metrics {
    /// When it was taken (ms since the epoch): the `now` of the queue lags.
    pub at: i64,
    /// Jobs by queue and status. A queue whose jobs in a status are all gone stays, at 0.
    pub jobs: Vec<JobCount>,
    /// Per queue, the age of its oldest ready pending job (0 when none is ready).
    pub queue_lag: Vec<(String, Duration)>,
    /// The durable counters that have been counted at least once.
    pub counters: Vec<Counter>,
    /// Wait (scheduled to started) of ended attempts, by queue and outcome.
    pub wait: Vec<Histogram>,
    /// Run time (started to ended) of ended attempts, by queue and outcome.
    pub run: Vec<Histogram>,
    /// Runners that have not stopped and renewed within their lease TTL.
    pub runners_alive: u64,
    /// The file's size, its free pages and its WAL.
    pub database: DatabaseSize,
    /// A runner's live figures, when a runner took the snapshot.
    pub runner: Option<RunnerFigures>,
    /// For each condition on jobs ([`Condition`](crate::Condition)), the pending jobs that
    /// need it while no running runner saw it hold.
    pub waiting_for_condition: Vec<(crate::Condition, u64)>,
}

impl Metrics {
    /// Jobs of `queue` in `status` (as stored: `pending`, `running`, ...).
    pub fn jobs(&self, queue: &str, status: &str) -> u64 {
        self.jobs
            .iter()
            .filter(|c| c.queue == queue && c.status == status)
            .map(|c| c.jobs)
            .sum()
    }

    /// A counter's value for a queue and outcome ("" for a label it does not have).
    pub fn counter(&self, kind: CounterKind, queue: &str, outcome: &str) -> u64 {
        self.counters
            .iter()
            .filter(|c| c.kind == kind && c.queue == queue && c.outcome == outcome)
            .map(|c| c.value)
            .sum()
    }

    /// A counter's total over all its labels.
    pub fn counter_total(&self, kind: CounterKind) -> u64 {
        self.counters
            .iter()
            .filter(|c| c.kind == kind)
            .map(|c| c.value)
            .sum()
    }

    /// The snapshot in the Prometheus text exposition format, version 0.0.4 (serve it as
    /// `text/plain; version=0.0.4; charset=utf-8`).
    pub fn to_prometheus(&self) -> String {
        let mut out = String::with_capacity(4096);
        self.render(&mut out);
        out
    }

    /// Appends the exposition to `out`; see [`Metrics::to_prometheus`].
    pub fn render(&self, out: &mut String) {
        family(out, "leasehold_jobs", "gauge", "Jobs by queue and status.");
        for c in &self.jobs {
            sample(
                out,
                "leasehold_jobs",
                &[("queue", &c.queue), ("status", &c.status)],
                &c.jobs.to_string(),
            );
        }
        family(
            out,
            "leasehold_jobs_waiting_for_condition",
            "gauge",
            "Pending jobs that need a condition (--when) no running runner sees hold.",
        );
        for (condition, jobs) in &self.waiting_for_condition {
            sample(
                out,
                "leasehold_jobs_waiting_for_condition",
                &[("condition", condition.as_str())],
                &jobs.to_string(),
            );
        }
        family(
            out,
            "leasehold_queue_lag_seconds",
            "gauge",
            "Age of the oldest ready pending job of each queue (0 when none is ready).",
        );
        for (queue, lag) in &self.queue_lag {
            sample(
                out,
                "leasehold_queue_lag_seconds",
                &[("queue", queue)],
                &float(lag.as_secs_f64()),
            );
        }
        for kind in CounterKind::ALL {
            let name = format!("leasehold_{}_total", kind.as_str());
            family(out, &name, "counter", kind.help());
            let (has_queue, has_outcome) = kind.labels();
            let mut any = false;
            for c in self.counters.iter().filter(|c| c.kind == kind) {
                any = true;
                let mut labels: Vec<(&str, &str)> = Vec::new();
                if has_queue {
                    labels.push(("queue", &c.queue));
                }
                if has_outcome {
                    labels.push(("outcome", &c.outcome));
                }
                sample(out, &name, &labels, &c.value.to_string());
            }
            if !any && !has_queue && !has_outcome {
                sample(out, &name, &[], "0");
            }
        }
        histograms(
            out,
            "leasehold_attempt_wait_seconds",
            "Time from when an attempt was due (scheduled_at) to when it was claimed, by queue and outcome.",
            &self.wait,
        );
        histograms(
            out,
            "leasehold_attempt_run_seconds",
            "Time from an attempt's claim to its ending, by queue and outcome.",
            &self.run,
        );
        let gauges = [
            (
                "leasehold_runners_alive",
                "Runners on this file that have not stopped and renewed within their lease TTL.",
                self.runners_alive,
            ),
            (
                "leasehold_database_bytes",
                "Size of the database's main file.",
                self.database.bytes,
            ),
            (
                "leasehold_database_free_bytes",
                "Free pages of the database file, which pruning or a vacuum gives back.",
                self.database.free_bytes,
            ),
            (
                "leasehold_database_wal_bytes",
                "Size of the database's write-ahead log.",
                self.database.wal_bytes,
            ),
        ];
        for (name, help, value) in gauges {
            family(out, name, "gauge", help);
            sample(out, name, &[], &value.to_string());
        }
        let Some(r) = &self.runner else {
            return;
        };
        let mut live = vec![
            (
                "leasehold_runner_workers",
                "Worker threads of this runner.",
                r.workers.to_string(),
            ),
            (
                "leasehold_runner_busy_workers",
                "Workers of this runner running an attempt now.",
                r.busy_workers.to_string(),
            ),
        ];
        if let Some(q) = r.writer_queue {
            live.push((
                "leasehold_runner_writer_queue_depth",
                "Writes queued for this runner's writer thread.",
                q.to_string(),
            ));
        }
        if let Some(d) = r.last_renewal {
            live.push((
                "leasehold_runner_last_renewal_seconds",
                "How long this runner's last lease renewal took.",
                float(d.as_secs_f64()),
            ));
        }
        for (name, help, value) in live {
            family(out, name, "gauge", help);
            sample(out, name, &[], &value);
        }
    }
}

fn histograms(out: &mut String, name: &str, help: &str, all: &[Histogram]) {
    family(out, name, "histogram", help);
    let bucket = format!("{name}_bucket");
    for h in all {
        for (le, count) in &h.buckets {
            let le = float(*le);
            sample(
                out,
                &bucket,
                &[("queue", &h.queue), ("outcome", &h.outcome), ("le", &le)],
                &count.to_string(),
            );
        }
        let labels = [("queue", h.queue.as_str()), ("outcome", h.outcome.as_str())];
        sample(out, &format!("{name}_sum"), &labels, &float(h.sum));
        sample(out, &format!("{name}_count"), &labels, &h.count.to_string());
    }
}

/// The HELP and TYPE lines of a family.
fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let help = help.replace('\\', "\\\\").replace('\n', "\\n");
    // Writing to a String cannot fail.
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// One sample line, its label values escaped as the format asks.
fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: &str) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(k);
            out.push_str("=\"");
            for ch in v.chars() {
                match ch {
                    '\\' => out.push_str("\\\\"),
                    '"' => out.push_str("\\\""),
                    '\n' => out.push_str("\\n"),
                    c => out.push(c),
                }
            }
            out.push('"');
        }
        out.push('}');
    }
    out.push(' ');
    out.push_str(value);
    out.push('\n');
}

/// A float as the format writes it: `+Inf` for infinity, otherwise Rust's shortest
/// round-tripping decimal (never an exponent).
fn float(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_string()
    } else if v.is_nan() {
        "NaN".to_string()
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        let mut out = String::new();
        sample(&mut out, "m", &[("queue", "a\"b\\c\nd")], "1");
        assert_eq!(out, "m{queue=\"a\\\"b\\\\c\\nd\"} 1\n");
    }

    #[test]
    fn floats_are_written_without_exponents() {
        assert_eq!(float(0.005), "0.005");
        assert_eq!(float(86400.0), "86400");
        assert_eq!(float(f64::INFINITY), "+Inf");
        assert_eq!(float(1e-7), "0.0000001");
    }

    #[test]
    fn every_counter_has_a_distinct_name_that_reads_back() {
        for k in CounterKind::ALL {
            assert_eq!(CounterKind::from_name(k.as_str()), Some(k));
        }
    }
}
