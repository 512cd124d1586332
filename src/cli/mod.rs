//! The command line: its grammar, how a command is dispatched, and how a failure becomes an
//! exit code and one line on stderr.

mod arg;
mod attempt;
mod db;
mod follow;
mod hosts;
mod jobs;
mod junit;
mod options;
mod progress;
mod queues;
mod render;
mod run;
mod schedules;
mod serve;
mod status;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::builder::{OsStringValueParser, TypedValueParser};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use leasehold::{
    DEFAULT_MAX_RECOVERY_ATTEMPTS, DEFAULT_RECLAIM_BATCH, DEFAULT_WORKERS, OpenOptions, Status,
    Store,
};

use self::arg::{Keep, Secs};

// Numbers are taken with `allow_hyphen_values`, so that `--timeout -1` or `--limit -inf` is
// refused by the number's parser, naming the flag, and not as an unknown option `-1`.

/// An embedded, durable job runner on SQLite: run jobs in the foreground, and operate on the
/// database that an application owns.
#[derive(Debug, Parser)]
#[command(
    name = "leasehold",
    version,
    propagate_version = true,
    arg_required_else_help = false
)]
pub struct Cli {
    #[command(flatten)]
    db: DbArg,
    #[command(subcommand)]
    command: Command,
}

/// `--db`, global: its own struct so that [`parse`]'s grammar of `jobs add` alone has the same
/// one.
#[derive(Debug, Args)]
struct DbArg {
    /// The database file.
    #[arg(
        long,
        global = true,
        env = "LEASEHOLD_DB",
        default_value = "./leasehold.db",
        value_name = "PATH"
    )]
    db: PathBuf,
}

/// Parses the command line (`std::env::args_os`).
///
/// `leasehold jobs add`, which a shell may run once per job, is first parsed by a grammar of
/// its own arguments and `--db` only ([`parse_add`]): clap's tree of every command, with all
/// their arguments and help, took more instructions to build and drop than the rest of the
/// command did before its job was sent (docs/performance.md, *One `jobs add` handed to a
/// runner*). Anything that grammar does not accept (help, version, another command, a
/// mistake) is parsed again by the whole tree, so every message and exit code is the whole
/// tree's.
///
/// # Errors
///
/// The whole tree's error: help, version, or a usage error to report ([`report_clap`]).
pub fn parse() -> Result<Cli, clap::Error> {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(cli) = parse_add(&args) {
        return Ok(cli);
    }
    let mut tree = Cli::command();
    let parsed = tree
        .try_get_matches_from_mut(&args)
        .and_then(|mut matches| Cli::from_arg_matches_mut(&mut matches))
        .map_err(|e| e.format(&mut tree));
    // The process ends soon after: freeing each of the tree's thousands of allocations one by
    // one would cost more than building some of them (the kernel takes the pages back at
    // exit). The tree holds no file or lock.
    std::mem::forget(tree);
    parsed
}

/// `args` parsed as `leasehold [--db PATH] jobs add ...` by a tree of those two commands and
/// `jobs add`'s arguments only; `None` when `args` name no `jobs add`, or that tree refuses
/// them (help, version and mistakes are the whole tree's to report).
///
/// The small tree is the whole tree's path to `jobs add` with its other branches cut: the
/// same `--db` ([`DbArg`]), the same [`AddArgs`], under the same names. So what it accepts
/// the whole tree accepts, with the same values.
fn parse_add(args: &[std::ffi::OsString]) -> Option<Cli> {
    // `jobs` then `add`: the only way to name the command (no aliases, no inferred names).
    // A value that happens to be spelled so (`--db jobs add ...`) only costs a second parse.
    if !args.windows(2).any(|w| w[0] == "jobs" && w[1] == "add") {
        return None;
    }
    let add = AddArgs::augment_args(clap::Command::new("add"));
    let jobs = clap::Command::new("jobs")
        .subcommand_required(true)
        .subcommand(add);
    let mut tree = DbArg::augment_args(clap::Command::new("leasehold"))
        .subcommand_required(true)
        .subcommand(jobs);
    let parsed = tree
        .try_get_matches_from_mut(args)
        .ok()
        .and_then(|mut matches| Cli::from_arg_matches_mut(&mut matches).ok());
    // As in `parse`: not worth freeing before exit.
    std::mem::forget(tree);
    parsed
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create, upgrade or show the database's schema, or compact the file.
    #[command(subcommand, arg_required_else_help = false)]
    Db(DbCommand),
    /// Add, list, inspect, retry and cancel jobs.
    #[command(subcommand, arg_required_else_help = false)]
    Jobs(JobsCommand),
    /// Add, list, remove, pause and resume recurring schedules, and show their next slots.
    #[command(subcommand, arg_required_else_help = false)]
    Schedules(schedules::SchedulesCommand),
    /// Limit, pause and resume queues for every runner on this file, and list them.
    #[command(subcommand, arg_required_else_help = false)]
    Queues(QueuesCommand),
    /// Job counts by status, the lease counters (`job_leases`) and the runners on this file,
    /// by host.
    Status(StatusArgs),
    /// The hosts whose runners share this database, and an operator's declaration that one
    /// is gone for good.
    #[command(subcommand, arg_required_else_help = false)]
    Hosts(HostsCommand),
    /// Run jobs in the foreground until SIGINT or SIGTERM (or, with --until-idle, until none
    /// is left).
    Run(RunArgs),
    /// A dashboard in the browser: overview, jobs, a job's history and output (read-only
    /// unless --allow-actions).
    Serve(ServeArgs),
}

/// `db migrate` and `db vacuum`: JSON, and going ahead beside a live runner.
#[derive(Debug, Args)]
struct ForceArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Go ahead even while a runner is live on the file (its attempts may be killed when it
    /// cannot renew their leases in time).
    #[arg(long)]
    force: bool,
}

#[derive(Debug, Subcommand)]
enum DbCommand {
    /// Create the schema, or upgrade an older one. Idempotent. The upgrade of a version-1 file
    /// (a VACUUM) is refused while a runner is live on it, unless --force.
    Migrate(ForceArgs),
    /// The file's schema version and the newest this build supports.
    Version(JsonArg),
    /// Compact the whole file (a full VACUUM, which needs free space about the file's size) and
    /// print its size before and after. Never creates the file. Refused while a runner is live
    /// on the file (it could not renew its leases), unless --force.
    Vacuum(ForceArgs),
    /// Deletes finished jobs past the retention rules now (the defaults for rules not given)
    Prune(PruneArgs),
    /// SQLite's integrity check of the file, read-only: prints `ok`, or what it found (exit 3).
    /// SQLite files only.
    Check(CheckArgs),
}

#[derive(Debug, Args)]
struct CheckArgs {
    /// SQLite's quick check: skips whether each index agrees with its table (faster on a
    /// large file).
    #[arg(long)]
    quick: bool,
    /// Print JSON: `{"ok", "found"}`.
    #[arg(long)]
    json: bool,
}

/// The retention rules of `db prune` and `run`.
#[derive(Debug, Args)]
struct KeepArgs {
    /// Keep succeeded jobs this long after they ended (or forever) [default: 604800]
    #[arg(
        long,
        value_name = "SECS",
        allow_hyphen_values = true,
        env = "LEASEHOLD_KEEP_SUCCEEDED"
    )]
    keep_succeeded: Option<Keep>,
    /// Keep failed jobs this long after they ended (or forever) [default: 2592000]
    #[arg(
        long,
        value_name = "SECS",
        allow_hyphen_values = true,
        env = "LEASEHOLD_KEEP_FAILED"
    )]
    keep_failed: Option<Keep>,
    /// Keep cancelled jobs this long after they ended (or forever) [default: 2592000]
    #[arg(
        long,
        value_name = "SECS",
        allow_hyphen_values = true,
        env = "LEASEHOLD_KEEP_CANCELLED"
    )]
    keep_cancelled: Option<Keep>,
    /// Keep at most this many finished jobs, the newest [default: no cap]
    #[arg(
        long,
        value_name = "N",
        allow_hyphen_values = true,
        env = "LEASEHOLD_KEEP_MAX"
    )]
    keep_max: Option<u64>,
}

impl KeepArgs {
    /// The policy: the library's defaults for the rules not given.
    fn retention(&self) -> leasehold::Retention {
        let mut policy = leasehold::Retention::default();
        if let Some(Keep(k)) = self.keep_succeeded {
            policy = policy.succeeded(k);
        }
        if let Some(Keep(k)) = self.keep_failed {
            policy = policy.failed(k);
        }
        if let Some(Keep(k)) = self.keep_cancelled {
            policy = policy.cancelled(k);
        }
        policy.keep_max(self.keep_max)
    }
}

#[derive(Debug, Args)]
struct PruneArgs {
    #[command(flatten)]
    keep: KeepArgs,
    /// Count what would be pruned, and change nothing
    #[arg(long)]
    dry_run: bool,
    /// Print JSON
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct JsonArg {
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum JobsCommand {
    /// Enqueue a command (after `--`), or one `sh -c` job per line of a file.
    Add(Box<AddArgs>),
    /// List jobs, newest first.
    Ls(LsArgs),
    /// A job, its event history and the tails of its output.
    Inspect(InspectArgs),
    /// A job's stdout (or stderr), raw: the whole file an attempt's keeper wrote, else the tail
    /// kept in the database; --follow prints a running attempt's output as it comes.
    Logs(LogsArgs),
    /// Requeue a failed or cancelled job, or a running one whose lease is missing or expired.
    Retry(RetryArgs),
    /// Cancel a pending or running job (a running job's processes are killed).
    Cancel(CancelArgs),
    /// Wait until every job named has ended: exit 0 when all succeeded, 1 when one did not,
    /// 124 when --timeout passed first.
    Wait(WaitArgs),
    /// Write a JUnit XML report of jobs (by id, or as `jobs ls` selects them), a test case
    /// per job, as Jenkins, GitLab and GitHub read it.
    Report(ReportArgs),
}

#[derive(Debug, Subcommand)]
enum QueuesCommand {
    /// At most N jobs of the queue run at once, over every runner on this file (`none`
    /// removes the limit).
    Limit(QueueLimitArgs),
    /// Leave the queue's pending jobs unclaimed by every runner; running jobs finish.
    Pause(QueueNameArgs),
    /// Let runners claim the queue's jobs again.
    Resume(QueueNameArgs),
    /// Every queue with unfinished jobs or a setting: pending, running, limit, paused, and
    /// how long its oldest ready job has waited.
    Ls(JsonArg),
}

#[derive(Debug, Subcommand)]
enum HostsCommand {
    /// Every host with a registered runner, a running job or a lost attempt waiting for a
    /// runner there: its runners (alive, dead, or not checkable from here), their leases, and
    /// the lost attempts that wait.
    Ls(JsonArg),
    /// Declare a host gone for good: end its jobs' leases now (they are requeued within their
    /// recovery budget), record every lost attempt of its runners torn down without seeing
    /// its processes (each says what was not verified), and record its runners stopped.
    /// Refused for this host, and for a host whose runners renewed within a lease TTL
    /// (unless --force).
    Gone(HostGoneArgs),
}

#[derive(Debug, Args)]
struct HostGoneArgs {
    /// The host, as its runners recorded it (`leasehold hosts ls`).
    #[arg(value_name = "HOST", value_parser = OsStringValueParser::new().try_map(arg::text))]
    host: String,
    /// Do it: the host's processes cannot be seen from here, so only the operator knows they
    /// are gone.
    #[arg(long)]
    yes: bool,
    /// Go ahead even while a runner there renewed within its lease TTL, or a lease of its
    /// jobs has not expired (a live runner kills its attempts at its next renewal; until then
    /// a job may run twice at once).
    #[arg(long)]
    force: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct QueueLimitArgs {
    /// The queue.
    #[arg(value_name = "NAME", value_parser = OsStringValueParser::new().try_map(arg::queue))]
    name: String,
    /// The most jobs of the queue that run at once, or `none`.
    #[arg(value_name = "N|none", allow_hyphen_values = true, value_parser = arg::queue_limit)]
    limit: arg::QueueLimit,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct QueueNameArgs {
    /// The queue.
    #[arg(value_name = "NAME", value_parser = OsStringValueParser::new().try_map(arg::queue))]
    name: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
#[command(
    allow_negative_numbers = true,
    override_usage = "leasehold jobs add [OPTIONS] -- CMD [ARG]...\n       \
                      leasehold jobs add [OPTIONS] --from-file FILE"
)]
struct AddArgs {
    #[command(flatten)]
    job: options::JobOptions,
    /// Make the job ready only after this long.
    #[arg(long, value_name = "SECS", allow_hyphen_values = true)]
    delay: Option<Secs>,
    /// Run only after these jobs succeeded (repeatable, or comma-separated). The job is
    /// cancelled if one of them fails or is cancelled.
    #[arg(
        long,
        value_name = "ID[,ID...]",
        value_delimiter = ',',
        allow_hyphen_values = true
    )]
    after: Vec<i64>,
    /// One `sh -c` job per non-empty line of FILE (`-` for stdin), in one transaction.
    #[arg(long, value_name = "FILE")]
    from_file: Option<PathBuf>,
    /// Enqueue nothing while a pending or running job has this key; print that job's id.
    #[arg(long, value_name = "KEY", value_parser = OsStringValueParser::new().try_map(arg::unique_key))]
    unique_key: Option<String>,
    /// A name for the job (a test's, for a harness), shown by `ls`, `inspect` and `wait`.
    #[arg(long, value_name = "NAME", value_parser = OsStringValueParser::new().try_map(arg::job_name))]
    name: Option<String>,
    /// With --unique-key: the key also matches any job of that key created less than SECS ago
    /// (one created exactly SECS ago does not).
    #[arg(
        long,
        value_name = "SECS",
        allow_hyphen_values = true,
        requires = "unique_key"
    )]
    unique_window: Option<Secs>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// The command and its arguments: after `--`, or from the first word that is not an
    /// option.
    // Not `allow_hyphen_values`: with it, a mistyped `--flag` would start the command and be
    // enqueued. `trailing_var_arg` alone starts it at the first value, or at `--`.
    #[arg(value_name = "CMD", trailing_var_arg = true,
          value_parser = OsStringValueParser::new().try_map(arg::text))]
    command: Vec<String>,
}

/// Which jobs `jobs ls` and `jobs report` take.
#[derive(Debug, Args)]
struct SelectArgs {
    /// Only jobs in this status.
    #[arg(long, value_name = "S", value_parser = arg::status)]
    status: Option<Status>,
    /// Only jobs of this queue.
    #[arg(long, value_name = "Q", value_parser = OsStringValueParser::new().try_map(arg::queue))]
    queue: Option<String>,
    /// Only failed jobs that exhausted the recovery budget.
    #[arg(long, conflicts_with = "status")]
    failed_stale: bool,
    /// At most N jobs (the newest).
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    limit: Option<u64>,
}

#[derive(Debug, Args)]
struct LsArgs {
    #[command(flatten)]
    select: SelectArgs,
    /// Print a JSON array of job objects. Each `env` keeps the names, with `••••••` as
    /// every value unless --show-env.
    #[arg(long)]
    json: bool,
    /// Print the values of the jobs' environment variables in --json (by default each is
    /// `••••••`).
    #[arg(long, requires = "json")]
    show_env: bool,
}

#[derive(Debug, Args)]
#[command(override_usage = "leasehold jobs report --junit PATH [ID]...\n       \
                            leasehold jobs report --junit PATH [--status S] [--queue Q] \
                            [--failed-stale] [--limit N]")]
struct ReportArgs {
    /// Write the report to PATH (created, or emptied and written).
    #[arg(long, value_name = "PATH", required = true)]
    junit: PathBuf,
    /// These jobs (by default, every job `jobs ls` would list with the same options).
    #[arg(value_name = "ID", conflicts_with_all = ["status", "queue", "failed_stale", "limit"])]
    ids: Vec<i64>,
    #[command(flatten)]
    select: SelectArgs,
}

#[derive(Debug, Args)]
struct InspectArgs {
    /// The job's id.
    id: i64,
    /// Print JSON. `env` keeps the names, with `••••••` as every value unless --show-env.
    #[arg(long)]
    json: bool,
    /// Print the values of the job's environment variables (by default each is shown as
    /// `NAME=••••••`, the same mask for every value, so that no value or length shows).
    #[arg(long)]
    show_env: bool,
}

#[derive(Debug, Args)]
struct LogsArgs {
    /// The job's id.
    id: i64,
    /// Stderr instead of stdout.
    #[arg(long)]
    stderr: bool,
    /// This attempt instead of the latest.
    #[arg(long, value_name = "N", allow_hyphen_values = true, value_parser = clap::value_parser!(i64).range(1..))]
    attempt: Option<i64>,
    /// Keep printing the output as it is written until the attempt ends (exit 0 then). A
    /// pending job is waited for (said once on stderr), then followed; one that ends without
    /// starting (cancelled) exits 0 saying so. Another job that is not running prints what
    /// there is and exits.
    #[arg(long)]
    follow: bool,
}

#[derive(Debug, Args)]
struct WaitArgs {
    /// The jobs' ids.
    #[arg(required = true, value_name = "ID")]
    ids: Vec<i64>,
    /// Give up after SECS (exit 124), printing where each job stands.
    #[arg(long, value_name = "SECS", allow_hyphen_values = true)]
    timeout: Option<Secs>,
    /// Print a JSON array of the jobs' outcomes: `[{"id", "status", "exit_code", "signal",
    /// "error_kind"}]`.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
#[command(override_usage = "leasehold jobs retry [OPTIONS] ID\n       \
                            leasehold jobs retry [OPTIONS] --failed-stale (--limit N | --all)")]
struct RetryArgs {
    /// The job's id.
    #[arg(conflicts_with = "failed_stale")]
    id: Option<i64>,
    /// Retry the failed jobs that exhausted the recovery budget (with --limit or --all).
    #[arg(long)]
    failed_stale: bool,
    /// With --failed-stale: at most N jobs, most recently failed first.
    #[arg(long, value_name = "N", allow_hyphen_values = true, conflicts_with = "all",
          value_parser = clap::value_parser!(u64).range(1..))]
    limit: Option<u64>,
    /// With --failed-stale: all of them.
    #[arg(long)]
    all: bool,
    /// Why, recorded in the job's history and last_error.
    #[arg(long, value_name = "R", value_parser = OsStringValueParser::new().try_map(arg::text))]
    reason: Option<String>,
    /// With a job id: record its lost attempt torn down even where its processes cannot be
    /// seen from here (another PID namespace, another host), saying what was not verified.
    /// Also clears the teardown of a job that already waits to run.
    #[arg(long, requires = "id")]
    force: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct CancelArgs {
    /// The job's id.
    id: i64,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct StatusArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Print the metrics in the Prometheus text exposition format (version 0.0.4).
    #[arg(long, conflicts_with = "json")]
    prometheus: bool,
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// The address and port to listen on (port 0 picks a free one; the URL is printed).
    #[arg(long, value_name = "ADDR:PORT", default_value = serve::DEFAULT_LISTEN)]
    listen: std::net::SocketAddr,
    /// Add retry and cancel buttons (POST forms carrying a per-process random token).
    #[arg(long)]
    allow_actions: bool,
    /// Read the secret from this file (yours alone, mode 0600) instead of making a random one.
    #[arg(long, value_name = "PATH")]
    token_file: Option<PathBuf>,
    /// Also answer to this Host name, e.g. a reverse proxy's (repeatable; IP addresses and
    /// localhost always pass).
    #[arg(long, value_name = "NAME[:PORT]", value_parser = serve::host_name)]
    allow_host: Vec<String>,
    /// Show environment values on a job's page (by default they are masked).
    #[arg(long)]
    show_env: bool,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Jobs run at once.
    #[arg(long, value_name = "N", allow_hyphen_values = true, env = "LEASEHOLD_WORKERS", default_value_t = DEFAULT_WORKERS,
          value_parser = |s: &str| arg::workers(s, run::MAX_WORKERS))]
    workers: usize,
    /// Take jobs from this queue only, with `=N` at most N of them at once in this runner
    /// (repeatable; a queue without `=N` shares the workers; by default, every queue).
    #[arg(long, value_name = "Q[=N]",
          value_parser = OsStringValueParser::new().try_map(arg::served_queue))]
    queue: Vec<(String, Option<usize>)>,
    /// Exit 0 once no job of its queues is pending or running, on any runner (1 with
    /// --fail-on-failure when one of this run's jobs failed).
    #[arg(long)]
    until_idle: bool,
    /// With --until-idle: write a JUnit XML report of the jobs this run ended to PATH (made
    /// before any job runs; written when the run ends).
    #[arg(long, value_name = "PATH", requires = "until_idle")]
    junit: Option<PathBuf>,
    /// With --until-idle: exit 1 when a job this run ended failed.
    #[arg(long, requires = "until_idle")]
    fail_on_failure: bool,
    /// How long a lease lasts unless renewed. The heartbeat, the sweep and the kill grace
    /// that are not given take a sixth of it each (at least 0.1 s, at most 5 s).
    #[arg(long, value_name = "SECS", allow_hyphen_values = true, env = "LEASEHOLD_LEASE_TTL",
          default_value_t = Secs(leasehold::DEFAULT_LEASE_TTL))]
    lease_ttl: Secs,
    /// How often leases are renewed (× 3 must not exceed the lease TTL) [default: a sixth of
    /// the lease TTL, 0.1 to 5]
    #[arg(
        long,
        value_name = "SECS",
        allow_hyphen_values = true,
        env = "LEASEHOLD_HEARTBEAT"
    )]
    heartbeat: Option<Secs>,
    /// How often lost attempts are looked for (must not exceed the lease TTL) [default: a
    /// sixth of the lease TTL, 0.1 to 5]
    #[arg(
        long,
        value_name = "SECS",
        allow_hyphen_values = true,
        env = "LEASEHOLD_SWEEP"
    )]
    sweep: Option<Secs>,
    /// How often the counters are sampled for the dashboard's charts (at least 1 s): the
    /// charts show 60 of these intervals and 24 spans of 60.
    #[arg(long, value_name = "SECS", allow_hyphen_values = true, env = "LEASEHOLD_SAMPLE_INTERVAL",
          default_value_t = Secs(leasehold::DEFAULT_SAMPLE_INTERVAL))]
    sample_interval: Secs,
    /// Between SIGTERM and SIGKILL when a job's processes are killed (with two heartbeats,
    /// at most the lease TTL) [default: a sixth of the lease TTL, 0.1 to 5]
    #[arg(
        long,
        value_name = "SECS",
        allow_hyphen_values = true,
        env = "LEASEHOLD_KILL_GRACE"
    )]
    kill_grace: Option<Secs>,
    /// On SIGINT or SIGTERM, how long running jobs get to finish before they are killed and
    /// requeued.
    #[arg(long, value_name = "SECS", allow_hyphen_values = true, env = "LEASEHOLD_SHUTDOWN_GRACE",
          default_value_t = Secs(leasehold::DEFAULT_SHUTDOWN_GRACE))]
    shutdown_grace: Secs,
    /// How many times a lost attempt is requeued before its job fails.
    #[arg(long, value_name = "N", allow_hyphen_values = true, env = "LEASEHOLD_MAX_RECOVERY",
          default_value_t = DEFAULT_MAX_RECOVERY_ATTEMPTS)]
    max_recovery: u32,
    /// How many lost attempts one sweep reclaims at most (0 disables reclaiming).
    #[arg(long, value_name = "N", allow_hyphen_values = true, env = "LEASEHOLD_RECLAIM_BATCH",
          default_value_t = DEFAULT_RECLAIM_BATCH)]
    reclaim_batch: u32,
    /// Run each job's command as the runner's own child, without a keeper: jobs start
    /// faster, but one whose runner dies is run again, and `--on-exit leave` is refused.
    #[arg(long, env = "LEASEHOLD_NO_KEEPERS")]
    no_keepers: bool,
    /// Whether a --when condition this machine cannot tell holds: `held` (the default) or
    /// `not-held`. online and unmetered where NetworkManager does not answer on the system
    /// bus, idle where logind does not; `status` says what was assumed.
    #[arg(long, value_name = "ASSUME", default_value = "held",
          value_parser = ["held", "not-held"])]
    unknown_conditions: String,
    /// The nice value, -20 to 19, of every command whose job sets none (`jobs add --nice`).
    #[arg(long, value_name = "N", allow_hyphen_values = true, env = "LEASEHOLD_NICE",
          value_parser = clap::value_parser!(i32).range(-20..=19))]
    nice: Option<i32>,
    /// The I/O class (idle, best-effort[:LEVEL]) of every command whose job sets none.
    #[arg(long, value_name = "CLASS", env = "LEASEHOLD_IO_CLASS", value_parser = arg::io_class)]
    io_class: Option<leasehold::IoClass>,
    /// The most bytes kept of each of a job's stdout and stderr files (the first half and
    /// the newest bytes past it; 0: no cap).
    #[arg(long, value_name = "BYTES", allow_hyphen_values = true, env = "LEASEHOLD_OUTPUT_CAP",
          default_value_t = leasehold::DEFAULT_OUTPUT_CAP)]
    output_cap: u64,
    /// On SIGINT or SIGTERM: `interrupt` gives running jobs the shutdown grace, then kills
    /// and requeues them; `leave` exits at once and leaves them running under their keepers,
    /// for the next runner on the file to adopt.
    #[arg(long, value_name = "WHAT", env = "LEASEHOLD_ON_EXIT", default_value = "interrupt",
          value_parser = ["interrupt", "leave"])]
    on_exit: String,
    #[command(flatten)]
    keep: KeepArgs,
}

/// Runs the parsed command.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    let db = cli.db.db.as_path();
    dispatch(db, cli.command).map_err(|e| damaged(db, e))
}

/// A damaged file's error, said once with the file and what to do next (exit 3).
fn damaged(db: &Path, e: anyhow::Error) -> anyhow::Error {
    let reason = e
        .chain()
        .find_map(|c| match c.downcast_ref::<leasehold::Error>() {
            Some(leasehold::Error::Damaged { reason }) => Some(reason.clone()),
            _ => None,
        });
    match reason {
        Some(reason) => anyhow::Error::new(Damaged::advice(db, &format!("SQLite: {reason}"))),
        None => e,
    }
}

/// The database file is damaged: exit 3.
#[derive(Debug)]
pub struct Damaged(pub String);

impl Damaged {
    /// The one line: the file, what is wrong, and the next step.
    pub fn advice(db: &Path, what: &str) -> Damaged {
        let file = leasehold::redacted_db(db);
        Damaged(format!(
            "the database {file} is damaged ({what}); stop every runner on it, copy it aside \
             with its -wal file, run `leasehold --db {file} db check`, then restore it from a \
             backup"
        ))
    }
}

impl std::fmt::Display for Damaged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Damaged {}

fn dispatch(db: &Path, command: Command) -> anyhow::Result<()> {
    match command {
        Command::Db(DbCommand::Migrate(a)) => db::migrate(db, a.json, a.force),
        Command::Db(DbCommand::Version(a)) => db::version(db, a.json),
        Command::Db(DbCommand::Vacuum(a)) => db::vacuum(db, a.json, a.force),
        Command::Db(DbCommand::Prune(a)) => db::prune(db, &a.keep.retention(), a.dry_run, a.json),
        Command::Db(DbCommand::Check(a)) => db::check(db, a.quick, a.json),
        Command::Jobs(JobsCommand::Add(a)) => jobs::add(db, *a),
        Command::Jobs(JobsCommand::Ls(a)) => jobs::ls(db, &a),
        Command::Jobs(JobsCommand::Inspect(a)) => jobs::inspect(db, &a),
        Command::Jobs(JobsCommand::Logs(a)) => jobs::logs(db, &a),
        Command::Jobs(JobsCommand::Retry(a)) => jobs::retry(db, &a),
        Command::Jobs(JobsCommand::Cancel(a)) => jobs::cancel(db, &a),
        Command::Jobs(JobsCommand::Wait(a)) => jobs::wait(db, &a),
        Command::Jobs(JobsCommand::Report(a)) => jobs::report(db, &a),
        Command::Queues(QueuesCommand::Limit(a)) => queues::limit(db, &a.name, a.limit, a.json),
        Command::Queues(QueuesCommand::Pause(a)) => queues::pause(db, &a.name, true, a.json),
        Command::Queues(QueuesCommand::Resume(a)) => queues::pause(db, &a.name, false, a.json),
        Command::Queues(QueuesCommand::Ls(a)) => queues::ls(db, a.json),
        Command::Schedules(c) => schedules::run(db, c),
        Command::Status(a) if a.prometheus => status::prometheus(db),
        Command::Status(a) => status::status(db, a.json),
        Command::Hosts(HostsCommand::Ls(a)) => hosts::ls(db, a.json),
        Command::Hosts(HostsCommand::Gone(a)) => hosts::gone(db, &a.host, a.yes, a.force, a.json),
        Command::Run(a) => run::run(db, &a),
        Command::Serve(a) => serve::serve(
            db,
            serve::Options {
                listen: a.listen,
                allow_actions: a.allow_actions,
                token_file: a.token_file,
                allow_hosts: a.allow_host,
                show_env: a.show_env,
            },
        ),
    }
}

/// Logs go to stderr: `info` by default for `run`, `warn` for the operator's commands;
/// `RUST_LOG` overrides both.
pub fn init_logging(cli: &Cli) {
    let default = match cli.command {
        Command::Run(_) | Command::Serve(_) => "info",
        _ => "warn",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default)).init();
}

/// Opens the database for a command that must not create or change it.
fn open_read_only(db: &Path) -> leasehold::Result<Store> {
    Store::open_with(db, &OpenOptions::read_only())
}

/// Opens the database for a command that writes to jobs but must not create the file.
fn open_existing(db: &Path) -> leasehold::Result<Store> {
    Store::open_with(db, &one_shot().create(false))
}

/// Options for a command that opens the file for one short piece of work: no checkpoint when
/// it closes (see [`OpenOptions::checkpoint_on_close`]), so that a command is one commit and
/// one flush, not three flushes and a new WAL for the next caller.
fn one_shot() -> OpenOptions {
    OpenOptions::new().checkpoint_on_close(false)
}

/// A mistake in the arguments that clap cannot see: exit 2.
#[derive(Debug)]
pub struct Usage(pub String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// A wait that gave up at its `--timeout`: exit 124.
#[derive(Debug)]
pub struct TimedOut(pub String);

impl std::fmt::Display for TimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TimedOut {}

/// How a command failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Something wrong with the arguments themselves: exit 2.
    Usage,
    /// The operation was refused or failed: exit 1.
    Operation,
    /// Stdout was closed by its reader.
    BrokenPipe,
    /// A wait's `--timeout` passed first: exit 124, as `timeout(1)`.
    TimedOut,
    /// The database file is damaged: exit 3.
    Damaged,
}

impl Failure {
    /// Sorts an error by the first cause in its chain that says what it is.
    pub fn classify(e: &anyhow::Error) -> Failure {
        for cause in e.chain() {
            if cause.is::<Usage>() {
                return Failure::Usage;
            }
            if cause.is::<TimedOut>() {
                return Failure::TimedOut;
            }
            if cause.is::<Damaged>() {
                return Failure::Damaged;
            }
            if let Some(leasehold::Error::Invalid { .. }) = cause.downcast_ref::<leasehold::Error>()
            {
                return Failure::Usage;
            }
            if let Some(io) = cause.downcast_ref::<std::io::Error>()
                && io.kind() == std::io::ErrorKind::BrokenPipe
            {
                return Failure::BrokenPipe;
            }
        }
        Failure::Operation
    }

    /// The process's exit code.
    pub fn exit_code(self) -> ExitCode {
        match self {
            Failure::Usage => ExitCode::from(2),
            Failure::Operation => ExitCode::from(1),
            Failure::BrokenPipe => ExitCode::SUCCESS,
            Failure::TimedOut => ExitCode::from(124),
            Failure::Damaged => ExitCode::from(3),
        }
    }
}

/// Prints a clap error: help and version as clap would (exit 0), anything else as one line on
/// stderr (exit 2).
pub fn report_clap(e: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            // Nothing more to do when stdout is closed.
            let _ = e.print();
            ExitCode::SUCCESS
        }
        _ => {
            let text = e.render().to_string();
            let lines: Vec<&str> = text
                .lines()
                .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            let reason = lines.join(" ");
            let reason = reason.strip_prefix("error: ").unwrap_or(&reason);
            eprintln!("leasehold: {} (see --help)", one_line(reason));
            ExitCode::from(2)
        }
    }
}

/// Makes a message one line: a reason on stderr never spans two.
pub fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use clap::{CommandFactory, FromArgMatches};

    use super::{Cli, parse_add};

    fn args(line: &[&str]) -> Vec<OsString> {
        std::iter::once("leasehold")
            .chain(line.iter().copied())
            .map(OsString::from)
            .collect()
    }

    /// What the whole tree makes of `args`, or its error's kind.
    fn whole(args: &[OsString]) -> Result<String, clap::error::ErrorKind> {
        let mut matches = Cli::command()
            .try_get_matches_from(args)
            .map_err(|e| e.kind())?;
        Cli::from_arg_matches_mut(&mut matches)
            .map(|cli| format!("{cli:?}"))
            .map_err(|e| e.kind())
    }

    #[test]
    fn the_jobs_add_grammar_parses_as_the_whole_tree_does() {
        let accepted: &[&[&str]] = &[
            &["jobs", "add", "--", "sh", "-c", "true"],
            &["jobs", "add", "echo", "--not-an-option"],
            &["--db", "x.db", "jobs", "add", "--", "true"],
            &["--db=x.db", "jobs", "add", "true"],
            &["jobs", "add", "--db", "y.db", "--json", "--", "true"],
            &[
                "jobs",
                "add",
                "--queue",
                "q",
                "--priority",
                "-5",
                "--timeout",
                "1.5",
                "--idle-timeout",
                "2",
                "--max-attempts",
                "3",
                "--on-lost",
                "fail",
                "--env",
                "A=1",
                "--env",
                "B=2",
                "--cwd",
                "/tmp",
                "--delay",
                "0.25",
                "--after",
                "1,2",
                "--after",
                "3",
                "--unique-key",
                "k",
                "--unique-window",
                "60",
                "--",
                "true",
            ],
            &["jobs", "add", "--from-file", "-"],
            // Refused later, by `jobs add` itself, the same way whichever tree parsed it.
            &["jobs", "add"],
            &["jobs", "add", "--from-file", "f", "--", "true"],
        ];
        for line in accepted {
            let args = args(line);
            let small = parse_add(&args).map(|cli| format!("{cli:?}"));
            assert_eq!(small.as_deref(), whole(&args).ok().as_deref(), "{line:?}");
            assert!(small.is_some(), "{line:?} left to the whole tree");
        }
    }

    #[test]
    fn what_the_jobs_add_grammar_refuses_is_left_to_the_whole_tree() {
        let refused: &[&[&str]] = &[
            &["jobs", "add", "--help"],
            &["jobs", "add", "-h"],
            &["jobs", "add", "--version"],
            &["--version", "jobs", "add", "true"],
            &["jobs", "add", "--bogus", "--", "true"],
            &["jobs", "add", "--timeout", "-1", "--", "true"],
            &["jobs", "add", "--timeout", "--", "true"],
            &["jobs", "add", "--unique-window", "5", "--", "true"],
            &["jobs", "ls"],
            &["queues", "ls", "--json"],
            // Valid, but `--db` between `jobs` and `add` is rare enough for the whole tree.
            &["jobs", "--db", "z.db", "add", "true"],
            &["help", "jobs", "add"],
        ];
        for line in refused {
            let args = args(line);
            assert!(parse_add(&args).is_none(), "{line:?} taken as a jobs add");
        }
    }

    /// Every command's name and every long option's spelling in the whole tree, for the
    /// property below to build command lines from.
    fn vocabulary() -> Vec<String> {
        fn walk(cmd: &clap::Command, out: &mut Vec<String>) {
            out.push(cmd.get_name().to_string());
            for arg in cmd.get_arguments() {
                out.extend(arg.get_long().map(|l| format!("--{l}")));
                out.extend(arg.get_short().map(|s| format!("-{s}")));
                out.extend(
                    arg.get_possible_values()
                        .iter()
                        .map(|v| v.get_name().to_string()),
                );
            }
            for sub in cmd.get_subcommands() {
                walk(sub, out);
            }
        }
        let mut out = Vec::new();
        walk(&Cli::command(), &mut out);
        out.sort();
        out.dedup();
        out
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(2000))]

        /// Any command line, of the tree's own words and of anything else, is parsed or refused
        /// without a panic; and what the `jobs add` grammar takes the whole tree takes alike.
        #[test]
        fn any_command_line_is_parsed_or_refused_without_a_panic(
            words in proptest::collection::vec(
                proptest::prop_oneof![
                    3 => proptest::sample::select(vocabulary()),
                    1 => proptest::string::string_regex("-{0,2}[a-z0-9=.:/-]{0,12}").expect("a regex"),
                    1 => proptest::prelude::any::<String>(),
                ],
                0..8,
            )
        ) {
            let line: Vec<&str> = words.iter().map(String::as_str).collect();
            let args = args(&line);
            let small = parse_add(&args).map(|cli| format!("{cli:?}"));
            let whole = whole(&args);
            if let Some(small) = small {
                proptest::prop_assert_eq!(Some(small), whole.ok(), "{:?}", line);
            }
        }
    }
}
