//! A keeper's system calls that write or flush its outcome, and its exit, read by `strace -p`
//! attached to it while its command waits (`-y` names each descriptor's file).
//!
//! Shared by the integration tests (through `util`) and by the keeper's unit tests in
//! `src/process/keeper.rs` (by `#[path]`), so it depends on the standard library alone.

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The calls traced: the opens, every kind of flush, the renames and the exit.
const CALLS: &str = "trace=openat,fsync,fdatasync,sync_file_range,syncfs,rename,renameat,\
                     renameat2,exit_group,write,wait4,mkdir";

/// An `strace` attached to one process, writing to a log file.
pub struct Trace {
    strace: std::process::Child,
    log: PathBuf,
}

/// Polls `ready` every 10 ms until it holds or `within` has passed; whether it held.
fn poll(within: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if ready() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl Trace {
    /// Attaches strace to `pid`, logging to `log`, and waits (10 s at most) until it traces
    /// it.
    pub fn attach(pid: i64, log: PathBuf) -> Self {
        let strace = std::process::Command::new("strace")
            .args(["-qq", "-y", "-e", "signal=none", "-e", CALLS, "-o"])
            .arg(&log)
            .arg("-p")
            .arg(pid.to_string())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("strace runs (.ci/run installs it)");
        let trace = Self { strace, log };
        let tracer = trace.strace.id().to_string();
        assert!(
            poll(Duration::from_secs(10), || {
                std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| {
                    status
                        .lines()
                        .any(|l| l.strip_prefix("TracerPid:").map(str::trim) == Some(&tracer))
                })
            }),
            "strace attached to {pid}"
        );
        trace
    }

    /// The calls traced, once the process has exited and strace with it (30 s at most).
    pub fn calls(&mut self) -> Vec<String> {
        assert!(
            poll(Duration::from_secs(30), || self
                .strace
                .try_wait()
                .expect("waitpid")
                .is_some()),
            "strace ends with the process it traces"
        );
        std::fs::read_to_string(&self.log)
            .expect("strace's log")
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Trace {
    /// The calls traced so far, of a process that runs on: strace is stopped (it detaches at
    /// its SIGTERM), then its log read.
    #[allow(dead_code)] // by the integration tests; the keeper's unit tests trace keepers that exit
    pub fn detach(&mut self) -> Vec<String> {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.strace.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.strace.wait();
        std::fs::read_to_string(&self.log)
            .expect("strace's log")
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        if self.strace.try_wait().ok().flatten().is_none() {
            let _ = self.strace.kill();
            let _ = self.strace.wait();
        }
    }
}

/// Where in `calls` the first call that starts with `start` and names `path` is.
pub fn at(calls: &[String], start: &str, path: &str) -> usize {
    calls
        .iter()
        .position(|c| c.starts_with(start) && c.contains(path))
        .unwrap_or_else(|| panic!("no {start}…{path} in {calls:#?}"))
}

/// Whether any of `calls` flushes a file or the filesystem (`fsync`, `fdatasync`,
/// `sync_file_range`, `syncfs`).
pub fn flushes(calls: &[String]) -> bool {
    calls
        .iter()
        .any(|c| c.starts_with("fsync") || c.starts_with("fdatasync") || c.starts_with("sync"))
}
