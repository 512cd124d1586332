//! The job options that `jobs add` and `schedules add` share: how a job runs, whichever
//! command makes it.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use clap::builder::{OsStringValueParser, TypedValueParser};
use leasehold::{Condition, IoClass, Job, OnLost, WhenLost};

use super::arg::{self, EnvPair, Secs};

#[derive(Debug, Args)]
pub struct JobOptions {
    /// The queue.
    #[arg(long, value_name = "Q", default_value = leasehold::DEFAULT_QUEUE,
          value_parser = OsStringValueParser::new().try_map(arg::queue))]
    pub queue: String,
    /// Higher runs first.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 0,
        allow_hyphen_values = true
    )]
    pub priority: i64,
    /// Kill an attempt that runs longer than this.
    #[arg(long, value_name = "SECS", allow_hyphen_values = true)]
    pub timeout: Option<Secs>,
    /// Kill an attempt that writes no output for this long.
    #[arg(long, value_name = "SECS", allow_hyphen_values = true)]
    pub idle_timeout: Option<Secs>,
    /// How many attempts may fail before the job fails.
    #[arg(long, value_name = "N", allow_hyphen_values = true, default_value_t = leasehold::DEFAULT_MAX_ATTEMPTS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_attempts: u32,
    /// What to do when an attempt is lost: requeue (within the recovery budget) or fail.
    #[arg(long, value_name = "POLICY", default_value = "requeue", value_parser = arg::on_lost)]
    pub on_lost: OnLost,
    /// Start only while this holds on the runner's machine (repeatable): ac-power,
    /// battery-not-low, unmetered, online, idle. See docs/conditions.md.
    #[arg(long = "when", value_name = "COND", value_parser = arg::condition)]
    pub when: Vec<Condition>,
    /// When a --when condition stops holding while the job runs: run (on) or stop (and
    /// requeue it to wait, spending nothing).
    #[arg(long, value_name = "POLICY", default_value = "run", value_parser = arg::when_lost)]
    pub when_lost: WhenLost,
    /// An environment variable for the command (repeatable).
    #[arg(long = "env", value_name = "K=V",
          value_parser = OsStringValueParser::new().try_map(arg::env_pair))]
    pub env: Vec<EnvPair>,
    /// The folder the command runs in.
    #[arg(long, value_name = "DIR",
          value_parser = OsStringValueParser::new().try_map(arg::utf8_path))]
    pub cwd: Option<PathBuf>,
    /// Run the command at this nice value, -20 to 19 (systemd's Nice=); by default the
    /// runner's `--nice`.
    #[arg(long, value_name = "N", allow_hyphen_values = true,
          value_parser = clap::value_parser!(i32).range(-20..=19))]
    pub nice: Option<i32>,
    /// Run the command in this I/O class: idle, best-effort or best-effort:LEVEL (0-7)
    /// (systemd's IOSchedulingClass=); by default the runner's `--io-class`.
    #[arg(long, value_name = "CLASS", value_parser = arg::io_class)]
    pub io_class: Option<IoClass>,
    /// Cap the attempt's memory (512M, 2G, or bytes): the cgroup's memory.max, else
    /// RLIMIT_DATA. Killed for it, the attempt fails as `memory`.
    #[arg(long, value_name = "BYTES", value_parser = arg::bytes)]
    pub memory_max: Option<u64>,
    /// The attempt's CPU weight, 1 to 10000 (the cgroup's cpu.weight; 100 is the default).
    #[arg(long, value_name = "N", allow_hyphen_values = true,
          value_parser = clap::value_parser!(u32).range(1..=10000))]
    pub cpu_weight: Option<u32>,
    /// Cap the attempt's processes and threads (the cgroup's pids.max, else RLIMIT_NPROC).
    #[arg(long, value_name = "N", allow_hyphen_values = true,
          value_parser = clap::value_parser!(u64).range(1..=i64::MAX as u64))]
    pub pids_max: Option<u64>,
    /// How many times an exit 75 ("try me later") requeues the job without spending an
    /// attempt; past it, 75 is a failure (default 10; 0: never).
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub tempfail_max: Option<u32>,
}

impl JobOptions {
    /// A function that gives a job these options, with `--cwd` made absolute once (the job
    /// runs wherever its runner was started).
    pub fn applier(&self) -> anyhow::Result<impl Fn(Job) -> Job + '_> {
        let cwd = match &self.cwd {
            Some(dir) => Some(
                std::path::absolute(dir)
                    .with_context(|| format!("cannot resolve --cwd {}", dir.display()))?,
            ),
            None => None,
        };
        Ok(move |mut job: Job| {
            job = job
                .queue(&self.queue)
                .priority(self.priority)
                .max_attempts(self.max_attempts)
                .on_lost(self.on_lost)
                .when_lost(self.when_lost);
            for &c in &self.when {
                job = job.when(c);
            }
            if let Some(t) = self.timeout {
                job = job.timeout(t.0);
            }
            if let Some(t) = self.idle_timeout {
                job = job.idle_timeout(t.0);
            }
            if let Some(dir) = &cwd {
                job = job.cwd(dir);
            }
            for e in &self.env {
                job = job.env(&e.0, &e.1);
            }
            if let Some(n) = self.nice {
                job = job.nice(n);
            }
            if let Some(c) = self.io_class {
                job = job.io_class(c);
            }
            if let Some(m) = self.memory_max {
                job = job.memory_max(m);
            }
            if let Some(w) = self.cpu_weight {
                job = job.cpu_weight(w);
            }
            if let Some(p) = self.pids_max {
                job = job.pids_max(p);
            }
            if let Some(t) = self.tempfail_max {
                job = job.tempfail_max(t);
            }
            job
        })
    }
}
