//! `leasehold run` as a child process: started with arguments, signalled, crashed, waited
//! for, and killed by pid when the test ends before it does.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::poll;

/// The environment variables that set `leasehold run`'s options.
pub const RUN_VARS: [&str; 13] = [
    "LEASEHOLD_WORKERS",
    "LEASEHOLD_LEASE_TTL",
    "LEASEHOLD_HEARTBEAT",
    "LEASEHOLD_SWEEP",
    "LEASEHOLD_SAMPLE_INTERVAL",
    "LEASEHOLD_KILL_GRACE",
    "LEASEHOLD_SHUTDOWN_GRACE",
    "LEASEHOLD_MAX_RECOVERY",
    "LEASEHOLD_RECLAIM_BATCH",
    "LEASEHOLD_KEEP_SUCCEEDED",
    "LEASEHOLD_KEEP_FAILED",
    "LEASEHOLD_KEEP_CANCELLED",
    "LEASEHOLD_KEEP_MAX",
];

/// Every variable that configures `leasehold`: the database, the run options, the log filter.
/// A test removes them all from a command and sets the ones it means to, so that none of the
/// caller's reach it.
pub fn leasehold_vars() -> impl Iterator<Item = &'static str> {
    ["LEASEHOLD_DB", "RUST_LOG"].into_iter().chain(RUN_VARS)
}

/// A `leasehold run` in the background, its log (stderr) in a file next to the database.
/// Dropping it kills the process by pid if it still runs.
pub struct RunnerProcess {
    child: Child,
    log: PathBuf,
}

impl RunnerProcess {
    /// Starts `leasehold --db DB run ARGS`; `run` logs at info by default.
    pub fn start(db: &Path, args: &[&str]) -> RunnerProcess {
        RunnerProcess::start_with_env(db, args, &[])
    }

    /// Starts `leasehold --db DB run ARGS` with the variables `env` set as well.
    pub fn start_with_env(db: &Path, args: &[&str], env: &[(&str, &str)]) -> RunnerProcess {
        let folder = db.parent().expect("the database is in a folder");
        RunnerProcess::start_logged(db.as_os_str(), folder, args, env)
    }

    /// Starts `leasehold --db DB run ARGS` with `env` set, its log in `folder`: for a database
    /// that is not a file beside the log (a PostgreSQL URL).
    pub fn start_logged(
        db: &OsStr,
        folder: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> RunnerProcess {
        // Unique in this test process, so runners of one test never share a log.
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, Ordering::Relaxed);
        let log = folder.join(format!("runner-{n}.log"));
        let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("leasehold"));
        cmd.arg("--db").arg(db).arg("run").args(args);
        for var in leasehold_vars() {
            cmd.env_remove(var);
        }
        let child = cmd
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("the runner's log file can be created"))
            .spawn()
            .expect("leasehold run starts");
        RunnerProcess { child, log }
    }

    /// The runner's pid.
    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    /// Sends `sig` to the runner.
    pub fn signal(&self, sig: Signal) {
        kill(self.pid(), sig).expect("the runner can be signalled");
    }

    /// SIGKILLs the runner and reaps it, so its pid is gone as after a real crash.
    pub fn crash(&mut self) {
        self.signal(Signal::SIGKILL);
        self.child.wait().expect("the runner can be reaped");
    }

    /// What the runner has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the runner has not exited yet.
    pub fn running(&mut self) -> bool {
        let status = self.child.try_wait();
        status.expect("the runner can be waited for").is_none()
    }

    /// Waits for the runner to exit, up to `timeout`; returns its exit code and its log.
    pub fn wait(&mut self, timeout: Duration) -> (Option<i32>, String) {
        let child = &mut self.child;
        let status = poll(timeout, || {
            child.try_wait().expect("the runner can be waited for")
        })
        .unwrap_or_else(|| panic!("the runner did not exit within {timeout:?}"));
        (status.code(), self.log())
    }
}

impl Drop for RunnerProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = kill(self.pid(), Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }
}
