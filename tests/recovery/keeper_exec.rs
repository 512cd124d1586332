//! A keeper that cannot be exec'ed is the runner's problem, never the job's: a runner whose
//! keeper cannot run refuses to start, with a message that says what to do, and a keeper that
//! stops being exec'able after the start gives its jobs back unspent.
//!
//! Each runner runs in a mount and PID namespace of its own (`unshare -m --pid --fork`) where
//! `vm.memfd_noexec=2` (a per-PID-namespace setting) refuses the keeper's memfd, so the keeper
//! runs from its file in the attempts folder, which the namespace mounts as a tmpfs: `noexec`
//! from the start, or remounted `noexec` once the runner runs. Nothing of it is seen outside.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use leasehold::{ErrorKind, EventKind, Job, Status};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::helper::{Case, WAIT, args};
use crate::util::{leasehold_vars, poll};

/// The namespace's set-up, then the runner: `sh -c SETUP sh FOLDER MOUNT_OPTIONS RUNNER...`.
/// It exits 90 when the system refuses `vm.memfd_noexec=2`, 91 when it refuses the mount.
const SETUP: &str = r#"
echo 2 > /proc/sys/vm/memfd_noexec 2>/dev/null || { echo "refused: vm.memfd_noexec=2 (a kernel before 6.3, or not root)" >&2; exit 90; }
mkdir -p "$1" && mount -t tmpfs -o "$2" leasehold-test "$1" || { echo "refused: mount -t tmpfs -o $2 on $1" >&2; exit 91; }
shift 2
exec "$@"
"#;

/// `leasehold run` in a mount and PID namespace of its own with the attempts folder on a
/// tmpfs; killed with its whole namespace by pid when dropped.
struct Confined {
    unshare: Child,
    log: PathBuf,
}

impl Confined {
    /// Starts `leasehold --db DB run ARGS` with `folder` mounted as a tmpfs with `options`.
    fn start(c: &Case, folder: &Path, options: &str, extra: &[&str]) -> Confined {
        let log = c.db.sibling(&format!("confined-{}.log", extra.len()));
        let mut cmd = Command::new("unshare");
        cmd.args(["-m", "--pid", "--fork", "--kill-child", "--mount-proc"])
            .args(["sh", "-c", SETUP, "sh"])
            .arg(folder)
            .arg(options)
            .arg(assert_cmd::cargo::cargo_bin("leasehold"))
            .arg("--db")
            .arg(&c.db.path)
            .arg("run")
            .args(args(extra));
        for var in leasehold_vars() {
            cmd.env_remove(var);
        }
        let (k, v) = c.marker.split_once('=').unwrap();
        let unshare = cmd
            .env(k, v)
            .env("RUST_LOG", "leasehold=info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("the log file can be created"))
            .spawn()
            .expect("unshare starts");
        Confined { unshare, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the runner has started (`Ok`) or its namespace has ended (`Err` with the
    /// exit code), at most [`WAIT`].
    fn started_or_ended(&mut self) -> Result<(), Option<i32>> {
        let found = poll(WAIT, || {
            if let Ok(Some(status)) = self.unshare.try_wait() {
                return Some(Err(status.code()));
            }
            self.log().contains("started:").then_some(Ok(()))
        });
        found.unwrap_or_else(|| panic!("the runner neither started nor ended:\n{}", self.log()))
    }

    /// Runs `mount ARGS` in the runner's mount namespace.
    fn mount(&self, options: &str, folder: &Path) {
        let out = Command::new("nsenter")
            .args(["-t", &self.unshare.id().to_string(), "-m", "mount", "-o"])
            .arg(options)
            .arg(folder)
            .output()
            .expect("nsenter runs");
        assert!(
            out.status.success(),
            "mount -o {options} {} in the runner's namespace: {}",
            folder.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Confined {
    fn drop(&mut self) {
        // The namespace's init is unshare's child: killing it ends the whole namespace.
        let me = self.unshare.id() as i32;
        for pid in crate::util::host::children_of(me) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        let _ = kill(Pid::from_raw(me), Signal::SIGKILL);
        let _ = self.unshare.wait();
    }
}

/// Why these tests cannot run here, if they cannot: they need root for the namespaces, the
/// mount and the setting (CI runs as root).
fn refused() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("not root: mount namespaces, tmpfs mounts and vm.memfd_noexec need it".into());
    }
    Command::new("nsenter")
        .arg("--version")
        .output()
        .err()
        .map(|e| format!("no nsenter(1): {e}"))
}

/// The attempts folder of the case's database, where the keeper's file is written.
fn attempts_folder(c: &Case) -> PathBuf {
    let mut name = std::fs::canonicalize(&c.db.path)
        .expect("the database exists")
        .into_os_string();
    name.push("-attempts");
    PathBuf::from(name)
}

#[test]
fn a_runner_whose_keeper_cannot_be_execed_refuses_to_start_and_says_what_to_do() {
    if let Some(why) = refused() {
        return eprintln!("SKIPPED: {why}");
    }
    let c = Case::new();
    let folder = attempts_folder(&c);
    let mut runner = Confined::start(&c, &folder, "noexec,mode=0700", &[]);
    match runner.started_or_ended() {
        Err(Some(code @ (90 | 91))) => {
            return eprintln!("SKIPPED (code {code}): {}", runner.log().trim());
        }
        Ok(()) => panic!(
            "the runner started with a keeper that cannot be exec'ed:\n{}",
            runner.log()
        ),
        Err(code) => {
            let log = runner.log();
            assert_ne!(code, Some(0), "{log}");
            for part in [
                "the attempt keeper cannot run here",
                "exec ",
                "Permission denied",
                "--no-keepers",
            ] {
                assert!(log.contains(part), "no {part:?} in:\n{log}");
            }
        }
    }
    // What the message advises works: without keepers, the same runner starts.
    let mut without = Confined::start(&c, &folder, "noexec,mode=0700", &["--no-keepers"]);
    assert_eq!(without.started_or_ended(), Ok(()), "{}", without.log());
}

#[test]
fn a_keeper_that_cannot_be_execed_at_spawn_gives_the_job_back_unspent() {
    if let Some(why) = refused() {
        return eprintln!("SKIPPED: {why}");
    }
    let c = Case::new();
    let folder = attempts_folder(&c);
    let mut runner = Confined::start(&c, &folder, "mode=0700", &[]);
    if let Err(code) = runner.started_or_ended() {
        if matches!(code, Some(90 | 91)) {
            return eprintln!("SKIPPED: {}", runner.log().trim());
        }
        panic!("the runner did not start ({code:?}):\n{}", runner.log());
    }
    // Started (its keeper run from the folder); from now on no keeper can be exec'ed, and
    // the one running is killed by its pid: the next spawn must start another.
    runner.mount("remount,noexec", &folder);
    let keepers: Vec<i32> = crate::util::host::children_of(runner.unshare.id() as i32)
        .into_iter()
        .flat_map(crate::util::host::children_of)
        .filter(|&pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c == "lh-keeper\n")
        })
        .collect();
    assert_eq!(keepers.len(), 1, "the runner's one keeper: {keepers:?}");
    let _ = kill(Pid::from_raw(keepers[0]), Signal::SIGKILL);
    let id = c.enqueue(Job::shell("echo ran"));
    let given_back = poll(WAIT, || {
        let j = c.job(id);
        assert_ne!(
            j.status,
            Status::Failed,
            "failed as the job's fault: {j:?}\n{}",
            runner.log()
        );
        let events = c.store().events(id).expect("the job's events");
        events
            .into_iter()
            .find(|e| e.kind == EventKind::Interrupted)
    });
    let event = given_back.unwrap_or_else(|| panic!("never given back:\n{}", runner.log()));
    let why = event.detail.unwrap_or_default();
    assert!(
        why.contains("cannot start its keeper") && why.contains("Permission denied"),
        "{why}"
    );
    // Once the folder allows exec again, the job runs, its tries unspent.
    runner.mount("remount,exec", &folder);
    let done = c.wait_for("the job to succeed", |c| {
        let j = c.job(id);
        j.status.is_terminal().then_some(j)
    });
    assert_eq!(done.status, Status::Succeeded, "{done:?}\n{}", runner.log());
    assert_ne!(done.error_kind, Some(ErrorKind::Spawn));
    let kinds = c.kinds(id);
    eprintln!("events: {kinds:?}");
    assert!(!kinds.contains(&"failed".to_string()), "{kinds:?}");
}
