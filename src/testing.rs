//! Helpers for testing an application that enqueues jobs (feature `testing`, for
//! `[dev-dependencies]`): a throwaway database whose clock the test moves, assertions on what
//! the application enqueued, and a drain that runs the ready jobs through the real claim,
//! start and ending path. There is no inline mode that runs a job at enqueue: the application
//! under test opens the database at [`TestDb::path`] as it does in production, and every
//! store and runner opened on that file in this process reads [`TestDb::clock`].
//!
//! The helpers panic with a message that says what failed, as test helpers do, so a test
//! reads without `unwrap`.
//!
//! ```
//! use std::time::Duration;
//! use leasehold::testing::{Expected, TestDb};
//! use leasehold::{Job, Store};
//!
//! // The application's code, unchanged: it opens the file it is given.
//! fn save(db: &std::path::Path) -> leasehold::Result<()> {
//!     let job = Job::command(["backup"]).unique_key("backup").delay(Duration::from_secs(60));
//!     Store::open(db)?.enqueue(&job)?;
//!     Ok(())
//! }
//!
//! let db = TestDb::new();
//! save(db.path()).unwrap();
//! let due = db.clock().now_ms() + 60_000;
//! db.assert_enqueued(&Expected::command(["backup"]).unique_key("backup").due_at(due));
//! db.refute_enqueued(&Expected::command(["restore"]));
//! ```
//!
//! See docs/testing.md for a whole example and for what the clock does not reach.

use std::fmt::Write as _;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::job::{ErrorKind, EventKind, JobRecord, Outcome, Status};
use crate::protocol::{AttemptStart, ClaimRequest, Ending, Finish};
use crate::runner::Runner;
use crate::store::{ListFilter, ManualClock, Store};

/// Test databases made by this process so far: part of each one's folder name.
static MADE: AtomicU64 = AtomicU64::new(0);

/// How long a drain waits for the ready jobs to run before it fails the test.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(300);

/// The worker id a stubbed drain claims under.
const STUB_WORKER: &str = "leasehold-testing-drain";

/// A throwaway database in a folder of its own, removed on drop, with a clock the test moves.
///
/// Its clock starts at the system's time when it is made, and moves only when the test moves
/// it ([`ManualClock::advance`], [`ManualClock::set`]). Every [`Store`] and [`Runner`] opened
/// on [`TestDb::path`] in this process while the `TestDb` lives reads it: the application
/// needs no option of its own for tests.
#[derive(Debug)]
pub struct TestDb {
    folder: PathBuf,
    path: PathBuf,
    clock: ManualClock,
    store: Store,
}

impl Default for TestDb {
    fn default() -> Self {
        TestDb::new()
    }
}

impl TestDb {
    /// A new, empty database (`jobs.db`) in a new folder under the system's temporary folder.
    ///
    /// # Panics
    ///
    /// When the folder or the database cannot be made.
    pub fn new() -> TestDb {
        let made = MADE.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let folder = std::env::temp_dir().join(format!(
            "leasehold-test-{}-{made}-{nanos:08x}",
            std::process::id()
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&folder)
            .unwrap_or_else(|e| panic!("TestDb: cannot make {}: {e}", folder.display()));
        let folder = std::fs::canonicalize(&folder)
            .unwrap_or_else(|e| panic!("TestDb: cannot resolve {}: {e}", folder.display()));
        let path = folder.join("jobs.db");
        let clock = ManualClock::starting_now();
        crate::store::register_test_clock(&path, clock.clock());
        let store = Store::open(&path)
            .unwrap_or_else(|e| panic!("TestDb: cannot open {}: {e}", path.display()));
        TestDb {
            folder,
            path,
            clock,
            store,
        }
    }

    /// The database's path, for the application under test to open as it would in production.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A new store on the database, reading the test's clock.
    ///
    /// # Panics
    ///
    /// When the database cannot be opened.
    pub fn store(&self) -> Store {
        Store::open(&self.path)
            .unwrap_or_else(|e| panic!("TestDb: cannot open {}: {e}", self.path.display()))
    }

    /// The clock every store and runner on the database reads.
    pub fn clock(&self) -> &ManualClock {
        &self.clock
    }

    /// One job.
    ///
    /// # Panics
    ///
    /// When there is no such job.
    pub fn job(&self, id: i64) -> JobRecord {
        self.store
            .job(id)
            .unwrap_or_else(|e| panic!("TestDb: job {id}: {e}"))
    }

    /// The jobs waiting to run (pending, due or not, and those waiting for the jobs they run
    /// after), oldest first, with what the application set on each.
    ///
    /// # Panics
    ///
    /// When the database cannot be read.
    pub fn enqueued(&self) -> Vec<JobRecord> {
        let mut jobs = self
            .store
            .list(&ListFilter {
                status: Some(Status::Pending),
                ..ListFilter::default()
            })
            .unwrap_or_else(|e| panic!("TestDb: cannot list the enqueued jobs: {e}"));
        jobs.reverse();
        jobs
    }

    /// The first enqueued job (see [`TestDb::enqueued`]) that matches `expected`.
    ///
    /// # Panics
    ///
    /// When none matches, with what was expected and every enqueued job, each field that
    /// differs marked.
    pub fn assert_enqueued(&self, expected: &Expected) -> JobRecord {
        let jobs = self.enqueued();
        match jobs.iter().find(|j| expected.matches(j)) {
            Some(job) => job.clone(),
            None => panic!("{}", expected.report("no enqueued job matches", &jobs)),
        }
    }

    /// Every enqueued job that matches `expected`, oldest first; panics unless there are
    /// `count`.
    ///
    /// # Panics
    ///
    /// When the number that match is not `count`, with every enqueued job.
    pub fn assert_enqueued_times(&self, expected: &Expected, count: usize) -> Vec<JobRecord> {
        let jobs = self.enqueued();
        let matching: Vec<JobRecord> = jobs
            .iter()
            .filter(|j| expected.matches(j))
            .cloned()
            .collect();
        if matching.len() != count {
            panic!(
                "{}",
                expected.report(
                    &format!("{} enqueued jobs match, not {count}", matching.len()),
                    &jobs
                )
            );
        }
        matching
    }

    /// Panics if an enqueued job matches `expected`.
    ///
    /// # Panics
    ///
    /// When one does, naming it.
    pub fn refute_enqueued(&self, expected: &Expected) {
        let jobs = self.enqueued();
        if let Some(job) = jobs.iter().find(|j| expected.matches(j)) {
            panic!(
                "an enqueued job matches what should not be enqueued\n  expected none of: {expected}\n  found: {}",
                describe(job)
            );
        }
    }

    /// Runs every ready job with a real [`Runner`] on the database (its commands run as in
    /// production) until none is ready and none runs: the slots of schedules due on the
    /// test's clock (fired first, as the runner's firer would), the jobs those jobs enqueue, the
    /// dependents their successes release and the retries whose backoff has passed on the
    /// test's clock run too; a retry not yet due stays pending. Returns the jobs that ended.
    ///
    /// # Panics
    ///
    /// When the runner cannot start, or jobs are still ready or running after
    /// [`DRAIN_TIMEOUT`] (a command that does not end).
    pub fn drain(&self) -> Drained {
        let since = self.last_event();
        self.fire_schedules();
        let runner = Runner::builder(&self.path)
            .clock(self.clock.clock())
            .poll_interval(Duration::from_millis(20))
            .start()
            .unwrap_or_else(|e| panic!("TestDb::drain: the runner cannot start: {e}"));
        let deadline = Instant::now() + DRAIN_TIMEOUT;
        while !self.idle() {
            if Instant::now() > deadline {
                panic!(
                    "TestDb::drain: jobs still ready or running after {DRAIN_TIMEOUT:?}: {:?}",
                    self.enqueued().iter().map(describe).collect::<Vec<_>>()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        runner
            .shutdown()
            .unwrap_or_else(|e| panic!("TestDb::drain: the runner cannot stop: {e}"));
        self.ended_since(since)
    }

    /// [`TestDb::drain`] with `stub` in place of each command: claimed through the same
    /// statements a runner uses (leases, queue limits and pauses, unique keys, counters), each
    /// attempt ends as `stub` says, and the ending goes through the same path (retries and
    /// their backoff on the test's clock, the cascade to dependents; due schedule slots are
    /// fired first). A [`Stub::Run`] runs
    /// another command in the job's place, in its own process group, and its exit decides.
    ///
    /// # Panics
    ///
    /// On a database error, or when a [`Stub::Run`] command cannot start.
    pub fn drain_with(&self, mut stub: impl FnMut(&JobRecord) -> Stub) -> Drained {
        let since = self.last_event();
        self.fire_schedules();
        let store = &self.store;
        loop {
            let claimed = store
                .claim(
                    &ClaimRequest {
                        worker_id: STUB_WORKER,
                        limit: 64,
                        queues: &[],
                        lease_ttl: crate::runner::DEFAULT_LEASE_TTL,
                        queue_caps: &[],
                        unheld: 0,
                    },
                    store.clock().now_ms(),
                )
                .unwrap_or_else(|e| panic!("TestDb::drain_with: claim: {e}"));
            if claimed.is_empty() {
                break;
            }
            for c in claimed {
                let job = self.job(c.id);
                let ending = match stub(&job) {
                    Stub::Succeed => Ending::Succeeded,
                    Stub::Fail { exit_code } => Ending::Failed {
                        kind: ErrorKind::Exit,
                        exit_code: Some(exit_code),
                        signal: None,
                        message: format!("exited with code {exit_code} (stub)"),
                    },
                    Stub::Run(argv) => self.run_instead(&c, &argv),
                };
                let finish = Finish {
                    job_id: c.id,
                    run_token: c.run_token.clone(),
                    attempt: c.attempt,
                    ending,
                    output: None,
                    notes: Vec::new(),
                    max_recovery_attempts: crate::store::DEFAULT_MAX_RECOVERY_ATTEMPTS,
                };
                store
                    .finish(&finish, store.clock().now_ms())
                    .unwrap_or_else(|e| panic!("TestDb::drain_with: job {}: finish: {e}", c.id));
            }
        }
        self.ended_since(since)
    }

    /// Runs `argv` for the claimed attempt `c`, with its environment and folder, in a process
    /// group of its own, recording its start under the attempt's lease; returns its ending.
    fn run_instead(&self, c: &crate::protocol::Claimed, argv: &[String]) -> Ending {
        use std::os::unix::process::{CommandExt, ExitStatusExt};
        let Some((program, args)) = argv.split_first() else {
            panic!(
                "TestDb::drain_with: job {}: Stub::Run with no command",
                c.id
            );
        };
        let mut command = Command::new(program);
        command
            .args(args)
            .envs(c.env.iter().cloned())
            .process_group(0);
        if let Some(dir) = &c.cwd {
            command.current_dir(dir);
        }
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("TestDb::drain_with: job {}: {argv:?}: {e}", c.id));
        let pid = i32::try_from(child.id()).unwrap_or(i32::MAX);
        let start = AttemptStart {
            job_id: c.id,
            run_token: c.run_token.clone(),
            pid,
            pgid: pid,
            start_time: crate::process::proc_info(pid).map_or(0, |p| p.start_time),
            keeper: None,
        };
        self.store
            .record_start(&start, self.store.clock().now_ms())
            .unwrap_or_else(|e| panic!("TestDb::drain_with: job {}: start: {e}", c.id));
        let status = child
            .wait()
            .unwrap_or_else(|e| panic!("TestDb::drain_with: job {}: wait: {e}", c.id));
        match (status.code(), status.signal()) {
            (Some(0), _) => Ending::Succeeded,
            (code, signal) => Ending::Failed {
                kind: if signal.is_some() {
                    ErrorKind::Signal
                } else {
                    ErrorKind::Exit
                },
                exit_code: code,
                signal,
                message: format!("{argv:?} ended with {status} (stub)"),
            },
        }
    }

    /// Fires the schedules' slots due on the test's clock, as a runner's firer would.
    fn fire_schedules(&self) {
        self.store
            .fire_due()
            .unwrap_or_else(|e| panic!("TestDb: cannot fire the due schedules: {e}"));
    }

    /// Whether no job is ready (pending, due on the test's clock, not waiting, in a queue not
    /// paused) and none runs. Its reads are not one snapshot, so it holds only when no event
    /// (every transition writes one) was written between the first and the last.
    fn idle(&self) -> bool {
        let before = self.last_event();
        let idle = self.idle_by_reads();
        idle && self.last_event() == before
    }

    fn idle_by_reads(&self) -> bool {
        let counts = self
            .store
            .counts()
            .unwrap_or_else(|e| panic!("TestDb: cannot count the jobs: {e}"));
        if counts.running > 0 {
            return false;
        }
        let paused: Vec<String> = self
            .store
            .queues()
            .unwrap_or_else(|e| panic!("TestDb: cannot list the queues: {e}"))
            .into_iter()
            .filter(|q| q.paused)
            .map(|q| q.name)
            .collect();
        let now = self.clock.now_ms();
        !self.enqueued().iter().any(|j| {
            j.scheduled_at <= now
                && j.waiting_for.is_empty()
                && !j.teardown_pending
                && !paused.contains(&j.queue)
        })
    }

    fn last_event(&self) -> i64 {
        self.store
            .last_event_id()
            .unwrap_or_else(|e| panic!("TestDb: cannot read the events: {e}"))
    }

    /// The jobs that ended after event `since`, in the order they ended.
    fn ended_since(&self, since: i64) -> Drained {
        let mut ended = Vec::new();
        let mut after = since;
        loop {
            let events = self
                .store
                .endings_after(after, 1_000)
                .unwrap_or_else(|e| panic!("TestDb: cannot read the endings: {e}"));
            let Some(last) = events.last() else {
                break;
            };
            after = last.id;
            for e in &events {
                if matches!(
                    e.kind,
                    EventKind::Succeeded | EventKind::Failed | EventKind::Lost
                ) || e.kind == EventKind::Cancelled
                {
                    ended.push(self.job(e.job_id));
                }
            }
        }
        Drained { ended }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        crate::store::unregister_test_clock(&self.path);
        let _ = std::fs::remove_dir_all(&self.folder);
    }
}

/// How an attempt ends in [`TestDb::drain_with`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stub {
    /// It succeeds.
    Succeed,
    /// It exits with this code (not 0): retried while the job has attempts left.
    Fail {
        /// The exit code.
        exit_code: i32,
    },
    /// This command runs in the job's place (with its environment and folder), and its exit
    /// decides.
    Run(Vec<String>),
}

/// What a drain ran to an end.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Drained {
    /// The jobs that ended (succeeded, failed, lost or cancelled) during the drain, in the
    /// order they ended, as they stood after it. A job whose attempt failed with a retry
    /// still to come is not among them: it is pending ([`TestDb::enqueued`]).
    pub ended: Vec<JobRecord>,
}

impl Drained {
    /// How job `id` ended during the drain, if it did.
    pub fn outcome(&self, id: i64) -> Option<Outcome> {
        self.ended
            .iter()
            .find(|j| j.id == id)
            .and_then(JobRecord::outcome)
    }

    /// How many ended succeeded.
    pub fn succeeded(&self) -> usize {
        self.count(Status::Succeeded)
    }

    /// How many ended failed.
    pub fn failed(&self) -> usize {
        self.count(Status::Failed)
    }

    fn count(&self, status: Status) -> usize {
        self.ended.iter().filter(|j| j.status == status).count()
    }
}

/// What an enqueued job is expected to carry, for [`TestDb::assert_enqueued`] and
/// [`TestDb::refute_enqueued`]: each setting given must match; the others may be anything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expected {
    argv: Option<Vec<String>>,
    queue: Option<String>,
    priority: Option<i64>,
    unique_key: Option<String>,
    due_at: Option<i64>,
    after: Option<Vec<i64>>,
    env: Vec<(String, String)>,
    name: Option<String>,
}

impl Expected {
    /// Any job.
    pub fn any() -> Expected {
        Expected::default()
    }

    /// A job that runs exactly this command ([`Job::command`](crate::Job::command)).
    pub fn command<I, S>(argv: I) -> Expected
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Expected {
            argv: Some(argv.into_iter().map(Into::into).collect()),
            ..Expected::default()
        }
    }

    /// A job that runs this script with `sh -c` ([`Job::shell`](crate::Job::shell)).
    pub fn shell(script: impl Into<String>) -> Expected {
        Expected::command(["sh".to_string(), "-c".to_string(), script.into()])
    }

    /// In this queue.
    pub fn queue(mut self, queue: impl Into<String>) -> Expected {
        self.queue = Some(queue.into());
        self
    }

    /// With this priority.
    pub fn priority(mut self, priority: i64) -> Expected {
        self.priority = Some(priority);
        self
    }

    /// With this unique key.
    pub fn unique_key(mut self, key: impl Into<String>) -> Expected {
        self.unique_key = Some(key.into());
        self
    }

    /// Due (ready to run) at this time, in milliseconds since the Unix epoch: with the test's
    /// clock, `db.clock().now_ms() + delay`.
    pub fn due_at(mut self, ms: i64) -> Expected {
        self.due_at = Some(ms);
        self
    }

    /// Running after exactly these jobs, in any order.
    pub fn after(mut self, ids: impl IntoIterator<Item = i64>) -> Expected {
        let mut ids: Vec<i64> = ids.into_iter().collect();
        ids.sort_unstable();
        ids.dedup();
        self.after = Some(ids);
        self
    }

    /// With this name ([`Job::name`](crate::Job::name)).
    pub fn name(mut self, name: impl Into<String>) -> Expected {
        self.name = Some(name.into());
        self
    }

    /// With this environment variable (among others).
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Expected {
        self.env.push((name.into(), value.into()));
        self
    }

    /// Whether `job` carries every setting given.
    pub fn matches(&self, job: &JobRecord) -> bool {
        self.mismatches(job).is_empty()
    }

    /// The settings given that `job` does not carry, each as `field: job's value`.
    fn mismatches(&self, job: &JobRecord) -> Vec<String> {
        let mut out = Vec::new();
        let mut check = |given: bool, same: bool, field: &str, value: String| {
            if given && !same {
                out.push(format!("{field}: {value}"));
            }
        };
        check(
            self.argv.is_some(),
            self.argv.as_ref() == Some(&job.argv),
            "command",
            format!("{:?}", job.argv),
        );
        check(
            self.queue.is_some(),
            self.queue.as_ref() == Some(&job.queue),
            "queue",
            format!("{:?}", job.queue),
        );
        check(
            self.priority.is_some(),
            self.priority == Some(job.priority),
            "priority",
            job.priority.to_string(),
        );
        check(
            self.unique_key.is_some(),
            self.unique_key == job.unique_key,
            "unique key",
            format!("{:?}", job.unique_key),
        );
        check(
            self.due_at.is_some(),
            self.due_at == Some(job.scheduled_at),
            "due at",
            job.scheduled_at.to_string(),
        );
        check(
            self.name.is_some(),
            self.name == job.name,
            "name",
            format!("{:?}", job.name),
        );
        let mut after = job.after.clone();
        after.sort_unstable();
        check(
            self.after.is_some(),
            self.after.as_ref() == Some(&after),
            "after",
            format!("{after:?}"),
        );
        for (name, value) in &self.env {
            let has = job.env.iter().find(|(n, _)| n == name).map(|(_, v)| v);
            check(
                true,
                has == Some(value),
                &format!("env {name}"),
                format!("{has:?}"),
            );
        }
        out
    }

    /// The failure's message: `what`, the expectation, and each job with what differs.
    fn report(&self, what: &str, jobs: &[JobRecord]) -> String {
        let mut s = format!("{what}\n  expected: {self}\n");
        if jobs.is_empty() {
            s.push_str("  enqueued: nothing\n");
        } else {
            let _ = writeln!(s, "  enqueued ({}):", jobs.len());
            for job in jobs {
                let differs = self.mismatches(job);
                let mark = if differs.is_empty() { "=" } else { "≠" };
                let _ = writeln!(s, "  {mark} {}", describe(job));
                for d in differs {
                    let _ = writeln!(s, "      differs in {d}");
                }
            }
        }
        s
    }
}

impl std::fmt::Display for Expected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if let Some(argv) = &self.argv {
            parts.push(format!("command {argv:?}"));
        }
        if let Some(q) = &self.queue {
            parts.push(format!("queue {q:?}"));
        }
        if let Some(p) = self.priority {
            parts.push(format!("priority {p}"));
        }
        if let Some(k) = &self.unique_key {
            parts.push(format!("unique key {k:?}"));
        }
        if let Some(d) = self.due_at {
            parts.push(format!("due at {d}"));
        }
        if let Some(a) = &self.after {
            parts.push(format!("after {a:?}"));
        }
        if let Some(n) = &self.name {
            parts.push(format!("name {n:?}"));
        }
        for (n, v) in &self.env {
            parts.push(format!("env {n}={v:?}"));
        }
        if parts.is_empty() {
            f.write_str("any job")
        } else {
            f.write_str(&parts.join(", "))
        }
    }
}

/// One line about an enqueued job: what an application sets on it.
fn describe(job: &JobRecord) -> String {
    let mut s = format!(
        "job {}: command {:?}, queue {:?}, priority {}, due at {}",
        job.id, job.argv, job.queue, job.priority, job.scheduled_at
    );
    if let Some(k) = &job.unique_key {
        let _ = write!(s, ", unique key {k:?}");
    }
    if let Some(n) = &job.name {
        let _ = write!(s, ", name {n:?}");
    }
    if !job.after.is_empty() {
        let _ = write!(s, ", after {:?}", job.after);
    }
    if !job.env.is_empty() {
        let _ = write!(s, ", env {:?}", job.env);
    }
    s
}
