//! A recovery test's case: its database, the `leasehold run` processes it starts, and the
//! cleanup of every process they leave behind.

use std::time::Duration;

use leasehold::{Job, JobRecord, Status, Store};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::util::{RunnerProcess, TestDb, kinds, poll, processes_with_env};

/// How long a test waits for a job or a runner.
pub const WAIT: Duration = Duration::from_secs(30);

/// A test's database and runners, and a marker every process it starts carries in its
/// environment, so that cleanup can end them by pid whatever happens.
pub struct Case {
    // Dropped first: each runner is killed by pid before the folder goes.
    pub runners: Vec<RunnerProcess>,
    pub db: TestDb,
    pub marker: String,
}

impl Case {
    /// A new case with its database created.
    pub fn new() -> Case {
        let db = TestDb::new();
        let marker = format!(
            "LEASEHOLD_TEST_CASE={}",
            db.dir.path().file_name().unwrap().to_string_lossy()
        );
        drop(db.store());
        Case {
            runners: Vec::new(),
            db,
            marker,
        }
    }

    pub fn store(&self) -> Store {
        self.db.store()
    }

    /// Enqueues `job` to run in the case's folder.
    pub fn enqueue(&self, job: Job) -> i64 {
        self.store()
            .enqueue(&job.cwd(self.db.dir.path()))
            .expect("enqueue")
    }

    pub fn job(&self, id: i64) -> JobRecord {
        self.db.job(id)
    }

    pub fn kinds(&self, id: i64) -> Vec<String> {
        kinds(&self.store(), id)
    }

    /// Starts `leasehold run` with `args`; returns its index.
    pub fn start_runner(&mut self, args: &[&str]) -> usize {
        let (k, v) = self.marker.split_once('=').unwrap();
        let runner = RunnerProcess::start_with_env(&self.db.path, args, &[(k, v)]);
        self.runners.push(runner);
        self.runners.len() - 1
    }

    pub fn signal(&self, runner: usize, sig: Signal) {
        self.runners[runner].signal(sig);
    }

    /// SIGKILLs a runner and reaps it, so its pid is gone as after a real crash.
    pub fn crash(&mut self, runner: usize) {
        self.runners[runner].crash();
    }

    pub fn log(&self, runner: usize) -> String {
        self.runners[runner].log()
    }

    /// Waits until `f` holds, polling the database; fails with the runners' logs.
    pub fn wait_for<T>(&self, what: &str, mut f: impl FnMut(&Case) -> Option<T>) -> T {
        poll(WAIT, || f(self)).unwrap_or_else(|| {
            let logs: Vec<String> = self.runners.iter().map(RunnerProcess::log).collect();
            panic!(
                "timed out waiting for {what}; runner logs:\n{}",
                logs.join("\n---\n")
            )
        })
    }

    /// Waits until job `id` runs attempt `attempt` with its process recorded.
    pub fn running(&self, id: i64, attempt: i64) -> JobRecord {
        self.wait_for(&format!("job {id} to run attempt {attempt}"), |c| {
            let j = c.job(id);
            (j.status == Status::Running && j.attempt == attempt && j.pid.is_some()).then_some(j)
        })
    }

    pub fn ended(&self, id: i64) -> JobRecord {
        self.wait_for(&format!("job {id} to end"), |c| {
            let j = c.job(id);
            j.status.is_terminal().then_some(j)
        })
    }

    /// The text of file `name` in the case's folder, empty if there is none.
    pub fn file(&self, name: &str) -> String {
        std::fs::read_to_string(self.db.dir.path().join(name)).unwrap_or_default()
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        // The runners first (each is killed by pid as it is dropped), then whatever they
        // started that outlived them.
        self.runners.clear();
        for pid in processes_with_env(&self.marker) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// The job script of the crash tests: records its pid, notes an overlap when the previous
/// attempt's recorded pid is still alive, then succeeds on its second run or hangs on its
/// first.
pub const PID_SCRIPT: &str = r#"
if [ -s pids ]; then
  prev=$(tail -n 1 pids)
  st=$(sed 's/.*) //' /proc/$prev/stat 2>/dev/null | cut -c1)
  if [ -n "$st" ] && [ "$st" != Z ]; then echo "$prev alive when $$ started" >> overlap; fi
fi
echo $$ >> pids
if [ $(wc -l < pids) -ge 2 ]; then exit 0; fi
sleep 300
"#;

pub const FAST: &[&str] = &[
    "--workers",
    "2",
    "--heartbeat",
    "0.5",
    "--sweep",
    "0.5",
    "--kill-grace",
    "0.5",
    "--shutdown-grace",
    "0.5",
];

pub fn args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    FAST.iter().copied().chain(extra.iter().copied()).collect()
}

/// [`args`] with `workers` workers instead of FAST's two.
pub fn args_with_workers<'a>(workers: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let timings = FAST.iter().copied().skip_while(|a| *a != "--heartbeat");
    ["--workers", workers]
        .into_iter()
        .chain(timings)
        .chain(extra.iter().copied())
        .collect()
}

/// The jobs schedule `name` enqueued, by slot; fails on a slot with more than one job.
pub fn by_slot(store: &Store, name: &str) -> std::collections::BTreeMap<i64, JobRecord> {
    let mut slots = std::collections::BTreeMap::new();
    for j in store.list(&leasehold::ListFilter::default()).unwrap() {
        if j.schedule.as_deref() != Some(name) {
            continue;
        }
        let slot = j.slot_at.expect("a scheduled job has its slot");
        if let Some(other) = slots.insert(slot, j.clone()) {
            panic!("slot {slot} has two jobs: {} and {}", other.id, j.id);
        }
    }
    slots
}
