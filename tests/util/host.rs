//! "Hosts" on one machine: `leasehold run` as the first process of a UTS and a PID namespace
//! of its own (`unshare --uts --pid --fork --kill-child --mount-proc`) under a host name of its
//! own, as a runner on another machine would be. Its pids mean nothing outside its namespace,
//! and every process it started dies with it when its namespace's init (the runner) is killed,
//! as a host's processes die with the host.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::{leasehold_vars, poll};

/// Fails the test, saying what was refused and why, when this process cannot make UTS and PID
/// namespaces and name a host in one (the two-host tests need root; CI runs as root).
pub fn require_namespaces() {
    let probe = Command::new("unshare")
        .args(["--uts", "--pid", "--fork", "--kill-child", "--mount-proc"])
        .args([
            "sh",
            "-c",
            r#"hostname lh-probe && [ "$(hostname)" = lh-probe ] && [ $$ = 1 ]"#,
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run unshare (util-linux): {e}; the two-host tests need it, as root")
        });
    assert!(
        probe.status.success(),
        "unshare --uts --pid --fork --mount-proc with a host name of its own is refused here \
         ({}): {}; the two-host tests make a UTS and a PID namespace per runner, which needs \
         root (CI runs as root)",
        probe.status,
        String::from_utf8_lossy(&probe.stderr).trim()
    );
}

/// One "host": `leasehold --db URL run ARGS` as pid 1 of its own UTS and PID namespaces, its
/// stderr in a log file. Dropping it kills the runner (and so its whole namespace) by pid.
pub struct Host {
    name: String,
    unshare: Child,
    runner: Pid,
    log: PathBuf,
}

impl Host {
    /// Starts the runner of host `name` on the database at `url`. `home` is its `HOME` and the
    /// parent of its `XDG_STATE_HOME`, the same folder for every host of a test, as a home on
    /// a network share would be; `logs` is the folder of its log (`<name>.log`); `env` is set
    /// too (a test's marker, `RUST_LOG`). Returns once the runner has replaced the shell that
    /// named the host.
    pub fn start(
        name: &str,
        url: &str,
        home: &Path,
        logs: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Host {
        let log = logs.join(format!("{name}.log"));
        let mut cmd = Command::new("unshare");
        cmd.args(["--uts", "--pid", "--fork", "--kill-child", "--mount-proc"])
            .args(["sh", "-c", r#"hostname "$1" && shift && exec "$@""#, "sh"])
            .arg(name)
            .arg(assert_cmd::cargo::cargo_bin("leasehold"))
            .args(["--db", url, "run"])
            .args(args);
        for var in leasehold_vars() {
            cmd.env_remove(var);
        }
        let unshare = cmd
            .env("HOME", home)
            .env("XDG_STATE_HOME", home.join(".local/state"))
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("the host's log file can be created"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start unshare for host {name}: {e}"));
        let parent = unshare.id() as i32;
        // unshare's child is the namespace's init: the shell, which execs the runner.
        let runner = poll(Duration::from_secs(10), || {
            children_of(parent).into_iter().find(|&pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|comm| comm.trim() == "leasehold")
            })
        });
        let mut host = Host {
            name: name.to_string(),
            unshare,
            runner: Pid::from_raw(runner.unwrap_or(0)),
            log,
        };
        if runner.is_none() {
            let log = host.log();
            drop(host.unshare.kill());
            panic!("host {name}'s runner did not start within 10 s; its log:\n{log}");
        }
        host
    }

    /// The host's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The runner's pid as this process sees it (in its own namespace it is 1).
    pub fn pid(&self) -> Pid {
        self.runner
    }

    /// Sends `sig` to the runner. SIGKILL and SIGSTOP reach a namespace's init from outside
    /// whatever it handles.
    pub fn signal(&self, sig: Signal) {
        kill(self.runner, sig)
            .unwrap_or_else(|e| panic!("cannot send {sig} to host {}: {e}", self.name));
    }

    /// Kills the runner with SIGKILL, which ends every process of its namespace (the host
    /// dies), and reaps `unshare`, which exits once its child, the runner, is gone.
    pub fn kill(&mut self) {
        if let Ok(None) = self.unshare.try_wait() {
            let _ = kill(self.runner, Signal::SIGKILL);
            let _ = self.unshare.wait();
        }
    }

    /// Whether the runner still runs: `unshare` exits when it ends.
    pub fn running(&mut self) -> bool {
        matches!(self.unshare.try_wait(), Ok(None))
    }

    /// What the runner has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // A stopped runner dies of SIGKILL too; unshare kills its child when it dies as well
        // (--kill-child), so the namespace goes whichever is first.
        self.kill();
    }
}

/// The live children of `parent`, from /proc.
pub fn children_of(parent: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    let rest = &s[s.rfind(')')? + 2..];
                    rest.split_whitespace().nth(1)?.parse::<i32>().ok()
                })
                == Some(parent)
        })
        .collect()
}
