use super::*;

use nix::sys::signal::Signal;

use crate::files::{self, Outcome};
use crate::process::kill::signal_group;
use crate::process::proc::tests::{token, wait_until};
use crate::process::spawn::{BaseEnv, Command, spawn_kept, spawn_kept_from};

/// A long drain, for commands whose pipes close when they exit.
const DRAIN: Duration = Duration::from_secs(5);

/// A command to start under a keeper, in an attempts folder of its own.
struct Job {
    argv: Vec<String>,
    cwd: Option<PathBuf>,
    base_env: BaseEnv,
    token: String,
    folder: tempfile::TempDir,
    /// The lease fence the keeper starts with.
    fence: Option<files::LeaseFence>,
}

impl Job {
    /// `argv` as attempt 1 of job 1, with a token named after the test.
    fn new(argv: &[&str], name: &str) -> Self {
        Self {
            argv: argv.iter().map(|a| (*a).to_owned()).collect(),
            cwd: None,
            base_env: BaseEnv::current(),
            token: token(&format!("keeper-{name}")),
            folder: tempfile::tempdir().expect("tempdir"),
            fence: None,
        }
    }

    /// `sh -c script`.
    fn sh(script: &str, name: &str) -> Self {
        Self::new(&["sh", "-c", script], name)
    }

    /// The attempt's folder.
    fn dir(&self) -> PathBuf {
        files::attempt_dir(&self.folder.path().join("db-attempts"), 1, 1, &self.token)
    }

    fn command(&self) -> Command<'_> {
        Command {
            argv: &self.argv,
            env: &[],
            base_env: &self.base_env,
            cwd: self.cwd.as_deref(),
            job_id: 1,
            run_token: &self.token,
            fence: self.fence,
        }
    }

    /// Starts it, from memory unless `force_file`.
    fn try_start(&self, cap: u64, drain: Duration, file: bool) -> Result<Running, SpawnError> {
        let (kept, source) = spawn_kept_from(
            &self.command(),
            &self.argv[0],
            &self.dir(),
            cap,
            drain,
            file,
        )?;
        assert_eq!(source, if file { Source::File } else { Source::Memory });
        Ok(Running(Some(kept)))
    }

    fn start(&self, cap: u64, drain: Duration) -> Running {
        let cmd = self.command();
        Running(Some(
            spawn_kept(&cmd, &self.argv[0], &self.dir(), cap, drain).expect("starts"),
        ))
    }

    fn outcome(&self) -> Option<Outcome> {
        files::read_outcome(&self.dir()).expect("outcome readable")
    }

    fn stream(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.dir().join(name)).expect("stream file")
    }
}

/// A started command; on drop, its group is killed while the keeper still holds its
/// leader (so the group id is still its), and the keeper is killed and reaped.
struct Running(Option<Kept>);

impl Running {
    fn kept(&mut self) -> &mut Kept {
        self.0.as_mut().expect("not yet ended")
    }

    /// The next message, within 10 s.
    fn message(&mut self) -> Message {
        match self
            .kept()
            .control
            .wait(Instant::now() + Duration::from_secs(10))
        {
            Ok(Received::Message(m)) => m,
            other => panic!("no message: {other:?}"),
        }
    }

    /// Releases the command (as a runner does once it has the end) and waits for the
    /// keeper's exit code.
    /// Asserts that the next message says the command exited with `code`, its pipes
    /// closed.
    fn assert_exited(&mut self, code: i32) {
        let message = self.message();
        assert!(
            matches!(
                message,
                Message::Exited {
                    ended: Ended::Exited(c),
                    pipes_open: false
                } if c == code
            ),
            "{message:?}"
        );
    }

    fn release(&mut self) -> Option<i32> {
        let mut kept = self.0.take().expect("not yet ended");
        kept.control.release();
        assert!(
            wait_until(Duration::from_secs(10), || kept
                .keeper
                .exited()
                .expect("waitid")),
            "keeper {} did not exit",
            kept.keeper.pid
        );
        kept.keeper.reap().expect("reap keeper").code()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(kept) = self.0.take() {
            let leader = proc::proc_info(kept.pid);
            if leader.is_some_and(|p| p.ppid == kept.keeper.pid && p.pgid == kept.pid) {
                let _ = signal_group(kept.pid, Signal::SIGKILL);
            }
            // Dropping the unreaped keeper kills and reaps it.
        }
    }
}

/// The keeper's exit code once it exits on its own (no runner), within 10 s.
fn keeper_exit(keeper: &mut ChildProc) -> Option<i32> {
    assert!(
        wait_until(Duration::from_secs(10), || keeper.exited().expect("waitid")),
        "keeper {} did not exit",
        keeper.pid
    );
    keeper.reap().expect("reap keeper").code()
}

#[test]
fn output_and_exit_code_reach_the_files_and_the_outcome() {
    let job = Job::sh("echo out; echo err >&2; exit 3", "exit");
    let before = crate::job::now_ms();
    let mut run = job.start(0, DRAIN);
    run.assert_exited(3);
    assert_eq!(job.stream(files::STDOUT), b"out\n");
    assert_eq!(job.stream(files::STDERR), b"err\n");
    let outcome = job.outcome().expect("an outcome");
    assert_eq!(
        (outcome.token.as_str(), outcome.ended),
        (job.token.as_str(), Ended::Exited(3))
    );
    assert!(outcome.ended_at >= before && outcome.ended_at <= crate::job::now_ms());
    assert!(!job.dir().join("outcome.tmp").exists());
    assert_eq!(run.release(), Some(3));
}

#[test]
fn a_command_killed_by_a_signal_is_reported_as_killed() {
    let job = Job::sh("kill -9 $$", "signal");
    let mut run = job.start(0, DRAIN);
    assert!(matches!(
        run.message(),
        Message::Exited {
            ended: Ended::Signaled(9),
            pipes_open: false
        }
    ));
    assert_eq!(job.outcome().map(|o| o.ended), Some(Ended::Signaled(9)));
    assert_eq!(run.release(), Some(128 + 9));
}

#[test]
fn a_missing_program_and_a_bad_cwd_fail_as_a_direct_spawn_does() {
    let job = Job::new(&["/no/such/program"], "missing");
    let err = job
        .try_start(0, DRAIN, false)
        .map(|_| ())
        .expect_err("no program");
    assert_eq!(
        err.message,
        "spawn \"/no/such/program\": No such file or directory (os error 2)"
    );
    assert!(!err.resources);

    let mut job = Job::sh("exit 0", "badcwd");
    job.cwd = Some(PathBuf::from("/no/such/dir"));
    let err = job
        .try_start(0, DRAIN, false)
        .map(|_| ())
        .expect_err("no cwd");
    assert_eq!(
        err.message,
        "spawn \"sh\": working directory \"/no/such/dir\": No such file or directory (os error 2)"
    );
    // The keeper's own chdir, for a folder that goes away after the check.
    std::fs::create_dir_all(job.dir()).expect("attempt dir");
    let (program, argv) = (c"/bin/sh", [c"sh".to_owned()]);
    let envp = c_pointers([]);
    let err = spawn_keeper(&KeeperSpec {
        name: "sh",
        token: &job.token,
        attempt_dir: &job.dir(),
        cap: 0,
        drain: DRAIN,
        cwd: job.cwd.as_deref(),
        program,
        argv: &argv,
        envp: &envp,
        fallback_dir: job.folder.path(),
    })
    .map(|_| ())
    .expect_err("the keeper's chdir fails");
    assert_eq!(
        err.message,
        "spawn \"sh\": working directory \"/no/such/dir\": No such file or directory (os error 2)"
    );
}

#[test]
fn a_stream_past_its_cap_keeps_its_head_a_marker_with_the_exact_count_and_its_tail() {
    let all: Vec<u8> = (1..=100_000)
        .flat_map(|i| format!("{i}\n").into_bytes())
        .collect();
    let marker = files::DROPPED_PREFIX.len() + files::DROPPED_WIDTH + files::DROPPED_SUFFIX.len();
    // A cap larger than a pipe read, one smaller, and a tiny one.
    for cap in [60_000u64, 1000, 7] {
        let job = Job::sh("seq 1 100000; seq 1 1000 >&2", &format!("cap-{cap}"));
        let mut run = job.start(cap, DRAIN);
        assert!(matches!(
            run.message(),
            Message::Exited {
                ended: Ended::Exited(0),
                ..
            }
        ));
        assert!(all.len() as u64 > 9 * cap);
        let file = job.stream(files::STDOUT);
        let head = usize::try_from(cap / 2).expect("small");
        assert!(
            file.len() as u64 <= cap * 5 / 4 + marker as u64,
            "cap {cap}: {} bytes",
            file.len()
        );
        assert_eq!(file[..head], all[..head], "cap {cap}");
        let dropped = files::dropped(&file[head..head + marker]).expect("a marker after the head");
        let tail = &file[head + marker..];
        assert!(
            !tail.is_empty() && all.ends_with(tail),
            "cap {cap}: the tail is the last bytes"
        );
        assert_eq!(
            head as u64 + dropped + tail.len() as u64,
            all.len() as u64,
            "cap {cap}"
        );
        if cap == 60_000 {
            // Under the cap, a stream is whole.
            let err: Vec<u8> = (1..=1000)
                .flat_map(|i| format!("{i}\n").into_bytes())
                .collect();
            assert_eq!(job.stream(files::STDERR), err);
        }
        assert_eq!(run.release(), Some(0));
    }
}

/// The lease fence: with a lease file whose times pass while the runner says nothing (frozen,
/// or cut off from the database), the keeper sends SIGTERM to the command's group, then
/// SIGKILL, and exits 3 with no outcome and no `exited`: the attempt is lost, not failed. A
/// renewal (the file rewritten later) keeps the command running; a removed file (a runner
/// that left its attempt on purpose) ends the fence.
#[test]
fn the_lease_fence_stops_an_unrenewed_attempt_and_leaves_no_outcome() {
    let boot_ms = || proc::boot_clock_ns().expect("the boot clock") / 1_000_000;
    let fence_in = |ms: u64| files::LeaseFence {
        term_at: boot_ms() + ms,
        kill_at: boot_ms() + ms + 300,
    };
    // Ignores SIGTERM: only the SIGKILL after it ends it.
    let mut job = Job::sh("trap '' TERM; sleep 30", "fence");
    job.fence = Some(fence_in(600));
    let mut run = job.start(0, DRAIN);
    // Renewed twice in time: the command outlives the first times.
    for _ in 0..2 {
        std::thread::sleep(Duration::from_millis(300));
        files::write_lease(&job.dir(), fence_in(600)).expect("renewed");
    }
    let renewed_until = boot_ms() + 600;
    let Kept {
        mut keeper,
        control,
        ..
    } = run.0.take().expect("started");
    assert_eq!(keeper_exit(&mut keeper), Some(3));
    assert!(
        boot_ms() >= renewed_until,
        "stopped before the renewed lease's times"
    );
    assert!(job.outcome().is_none(), "a fenced attempt has no outcome");
    drop(control);

    // The same with the file removed while it runs: no fence, the command's own ending.
    let mut left = Job::sh("sleep 1.2; exit 4", "fence-left");
    left.fence = Some(fence_in(400));
    let mut run = left.start(0, DRAIN);
    std::fs::remove_file(left.dir().join(files::LEASE_FILE)).expect("removed");
    run.assert_exited(4);
}

/// The fence's SIGKILL reaches the whole group at KILL_AT even when the leader died of the
/// SIGTERM: a member that ignores SIGTERM does not run on once the keeper is gone (another
/// host's runner may then start the job again).
#[test]
fn the_lease_fence_kills_members_that_outlive_a_leader_dead_of_its_sigterm() {
    let boot_ms = || proc::boot_clock_ns().expect("the boot clock") / 1_000_000;
    let mut job = Job::sh(
        "(trap '' TERM; exec sleep 30) & echo $! > member; exec sleep 30",
        "fence-member",
    );
    job.cwd = Some(job.folder.path().to_owned());
    job.fence = Some(files::LeaseFence {
        term_at: boot_ms() + 300,
        kill_at: boot_ms() + 1_300,
    });
    let kill_at = job.fence.map(|f| f.kill_at).unwrap_or_default();
    let mut run = job.start(0, DRAIN);
    let member_file = job.folder.path().join("member");
    assert!(
        wait_until(Duration::from_secs(10), || std::fs::read_to_string(
            &member_file
        )
        .is_ok_and(|s| s.ends_with('\n'))),
        "the member wrote its pid"
    );
    let member: i32 = std::fs::read_to_string(&member_file)
        .expect("member pid")
        .trim()
        .parse()
        .expect("a pid");
    let Kept {
        mut keeper,
        control,
        ..
    } = run.0.take().expect("started");
    assert_eq!(keeper_exit(&mut keeper), Some(3));
    assert!(
        boot_ms() >= kill_at,
        "the keeper exited before KILL_AT, so nothing sent the group its SIGKILL"
    );
    // Killed, it is gone or a zombie waiting for its new parent to reap it.
    let alive = || proc::proc_info(member).is_some_and(|p| p.state != 'Z');
    let gone = wait_until(Duration::from_secs(5), || !alive());
    if !gone {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(member), Signal::SIGKILL);
    }
    assert!(
        gone,
        "member {member}, which ignores SIGTERM, runs on after the fence"
    );
    assert!(job.outcome().is_none(), "a fenced attempt has no outcome");
    drop(control);
}

#[test]
fn a_runner_that_dies_costs_the_command_nothing_and_the_keeper_still_writes_the_outcome() {
    // Any signal the runner's death could bring (a hangup, a broken pipe, a
    // termination) would show in the output and the exit code.
    let job = Job::sh(
        "trap 'echo HUP; exit 91' HUP; trap 'echo PIPE; exit 92' PIPE; \
         trap 'echo TERM; exit 93' TERM; sleep 0.5; echo done; exit 5",
        "runner-dies",
    );
    let mut run = job.start(0, DRAIN);
    let Kept {
        mut keeper,
        control,
        pid,
        ..
    } = run.0.take().expect("started");
    drop(control);
    assert_eq!(keeper_exit(&mut keeper), Some(5));
    assert_eq!(job.stream(files::STDOUT), b"done\n");
    let outcome = job.outcome().expect("an outcome");
    assert_eq!(outcome.ended, Ended::Exited(5));
    assert!(
        proc::proc_info(pid).is_none_or(|p| p.ppid != keeper.pid),
        "reaped"
    );
}

#[test]
fn a_keeper_leads_its_own_session_and_holds_its_command_unreaped_until_released() {
    let job = Job::new(&["sleep", "30"], "identity");
    let mut run = job.start(0, DRAIN);
    let (keeper, pid) = (run.kept().keeper.pid, run.kept().pid);
    // SAFETY: getsid reads nothing of ours.
    let sid = unsafe { libc::getsid(keeper) };
    assert_eq!(sid, keeper, "the keeper leads a session");
    let (kinfo, cinfo) = (
        proc::proc_info(keeper).expect("keeper"),
        proc::proc_info(pid).expect("command"),
    );
    assert_eq!(kinfo.pgid, keeper);
    assert_eq!((cinfo.pgid, cinfo.ppid), (pid, keeper));
    assert_ne!(cinfo.pgid, kinfo.pgid);
    let entry = format!("{}={}", proc::RUN_TOKEN_VAR, job.token);
    let environ = |p: i32| std::fs::read(format!("/proc/{p}/environ")).expect("environ");
    let has = |env: Vec<u8>| env.split(|&b| b == 0).any(|e| e == entry.as_bytes());
    assert!(!has(environ(keeper)), "the keeper does not carry the token");
    assert!(has(environ(pid)), "the command does");
    assert_eq!(
        proc::processes_with_token(&job.token)
            .iter()
            .map(|p| p.pid)
            .collect::<Vec<_>>(),
        [pid]
    );
    let status = std::fs::read_to_string(format!("/proc/{keeper}/status")).expect("status");
    let rss_kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .expect("VmRSS");
    let pss = std::fs::read_to_string(format!("/proc/{keeper}/smaps_rollup"))
        .ok()
        .and_then(|r| r.lines().find(|l| l.starts_with("Pss:")).map(str::to_owned));
    eprintln!("keeper VmRSS: {rss_kb} kB, {}", pss.unwrap_or_default());
    assert!(rss_kb < 2048, "keeper VmRSS {rss_kb} kB");

    // A teardown of the command's group does not reach the keeper.
    signal_group(pid, Signal::SIGKILL).expect("kill the command's group");
    assert!(matches!(
        run.message(),
        Message::Exited {
            ended: Ended::Signaled(9),
            ..
        }
    ));
    assert_eq!(
        proc::proc_info(pid).map(|p| p.state),
        Some('Z'),
        "held unreaped"
    );
    assert!(
        proc::is_alive(keeper),
        "the keeper outlives its command's group"
    );
    assert!(matches!(run.kept().control.next(), Ok(Received::Pending)));
    assert_eq!(run.release(), Some(128 + 9));
    assert!(
        proc::proc_info(pid).is_none_or(|p| p.ppid != keeper),
        "reaped at the release"
    );
}

#[test]
fn pipes_held_past_the_drain_are_reported_and_killed_when_no_runner_is_left() {
    let job = Job::sh("sleep 30 & echo hi", "leftover");
    let mut run = job.start(0, Duration::from_millis(200));
    assert!(matches!(
        run.message(),
        Message::Exited {
            ended: Ended::Exited(0),
            pipes_open: true
        }
    ));
    let pid = run.kept().pid;
    assert!(
        crate::process::group_has_live_members(pid),
        "the leftover runs"
    );
    // The runner goes without killing it: the keeper kills the group and exits. A SIGKILL
    // is delivered, not done, when kill() returns: the leftover is gone a moment later.
    assert_eq!(run.release(), Some(0));
    assert!(
        wait_until(Duration::from_secs(5), || {
            !crate::process::group_has_live_members(pid)
        }),
        "the leftover is killed"
    );
    assert_eq!(job.stream(files::STDOUT), b"hi\n");
}

#[test]
fn the_program_runs_from_an_owner_only_file_where_memory_will_not_do() {
    let job = Job::sh("echo from-file", "file");
    let mut run = job.try_start(0, DRAIN, true).expect("starts");
    assert!(matches!(
        run.message(),
        Message::Exited {
            ended: Ended::Exited(0),
            ..
        }
    ));
    assert_eq!(job.stream(files::STDOUT), b"from-file\n");
    let written: Vec<_> = std::fs::read_dir(job.folder.path().join("db-attempts"))
        .expect("attempts folder")
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(".leasehold-keeper-")
        })
        .collect();
    assert_eq!(written.len(), 1);
    let mode = written[0].metadata().expect("stat").permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    use std::os::unix::fs::PermissionsExt as _;
    let dir_mode = std::fs::metadata(job.dir())
        .expect("attempt dir")
        .permissions()
        .mode();
    assert_eq!(dir_mode & 0o777, 0o700);
    assert_eq!(run.release(), Some(0));
}

/// A tmpfs mounted `noexec` on a folder of its own, unmounted (lazily) on drop; `None`,
/// with the reason printed, where the system refuses the mount (not root).
struct Noexec(tempfile::TempDir);

impl Noexec {
    fn mount() -> Option<Self> {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "noexec,mode=0700", "leasehold-test"])
            .arg(dir.path())
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Self(dir)),
            Ok(o) => {
                let why = String::from_utf8_lossy(&o.stderr);
                eprintln!("SKIPPED: mount -t tmpfs -o noexec is refused here: {why}");
                None
            }
            Err(e) => {
                eprintln!("SKIPPED: cannot run mount: {e}");
                None
            }
        }
    }
}

impl Drop for Noexec {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.0.path())
            .status();
    }
}

#[test]
fn a_keeper_that_cannot_be_execed_is_the_runners_fault_and_fails_its_probe() {
    let Some(noexec) = Noexec::mount() else {
        return;
    };
    // The probe, as a runner's start makes it: from memory here, and from a file where the
    // folder allows exec.
    let fine = tempfile::tempdir().expect("tempdir");
    assert_eq!(probe(fine.path()), Ok(()));
    assert_eq!(probe_from(fine.path(), true), Ok(()));
    let refused = probe_from(noexec.0.path(), true).expect_err("a noexec folder");
    assert!(
        refused.starts_with("cannot start it: exec ") && refused.contains("Permission denied"),
        "{refused}"
    );
    // An attempt's keeper from the same folder: the job is not at fault.
    let mut job = Job::sh("exit 0", "noexec");
    job.folder = tempfile::tempdir_in(noexec.0.path()).expect("tempdir on the mount");
    let err = job
        .try_start(0, DRAIN, true)
        .map(|_| ())
        .expect_err("no exec");
    assert!(err.resources, "the job's fault: {}", err.message);
    assert!(
        err.message
            .starts_with("spawn \"sh\": the runner cannot start its keeper: exec ")
            && err.message.contains("Permission denied"),
        "{}",
        err.message
    );
}

#[test]
fn a_stream_that_cannot_be_written_costs_the_command_nothing() {
    // Every write of stdout fails (ENOSPC), as on a full disk.
    let job = Job::sh("seq 1 100000; echo fine >&2; exit 4", "full");
    std::fs::create_dir_all(job.dir()).expect("attempt dir");
    std::os::unix::fs::symlink("/dev/full", job.dir().join(files::STDOUT)).expect("symlink");
    let mut run = job.start(1000, DRAIN);
    run.assert_exited(4);
    assert_eq!(job.stream(files::STDERR), b"fine\n");
    assert_eq!(job.outcome().map(|o| o.ended), Some(Ended::Exited(4)));
    assert_eq!(run.release(), Some(4));
}

#[test]
fn a_silent_command_leaves_no_stream_files_and_reads_as_empty() {
    let job = Job::sh("exit 3", "silent");
    let mut run = job.start(1000, DRAIN);
    run.assert_exited(3);
    assert_eq!(job.outcome().map(|o| o.ended), Some(Ended::Exited(3)));
    for name in [files::STDOUT, files::STDERR] {
        assert!(!job.dir().join(name).exists(), "{name} made with no output");
    }
    // What the runner keeps of it, and what an idle timeout reads: nothing, no change.
    let mut out = super::super::kept::OutputFiles::new(job.dir());
    let (stdout, stderr) = out.tails(1024);
    assert!(stdout.bytes.is_empty() && !stdout.truncated);
    assert!(stderr.bytes.is_empty() && !stderr.truncated);
    assert_eq!(out.new_change_age(), None);
    assert_eq!(run.release(), Some(3));
}

#[test]
fn only_the_stream_with_output_gets_a_file() {
    let job = Job::sh("echo late >&2", "one-stream");
    let mut run = job.start(0, DRAIN);
    assert!(matches!(run.message(), Message::Exited { .. }));
    assert!(!job.dir().join(files::STDOUT).exists());
    assert_eq!(job.stream(files::STDERR), b"late\n");
    assert_eq!(run.release(), Some(0));
}

#[test]
fn a_stream_file_that_cannot_be_made_costs_the_command_nothing() {
    // A folder where the stdout file goes: every create of it fails.
    let job = Job::sh("echo lost; echo fine >&2; exit 5", "unmakeable");
    std::fs::create_dir_all(job.dir().join(files::STDOUT)).expect("blocker");
    let mut run = job.start(0, DRAIN);
    run.assert_exited(5);
    assert_eq!(job.stream(files::STDERR), b"fine\n");
    assert_eq!(job.outcome().map(|o| o.ended), Some(Ended::Exited(5)));
    assert_eq!(run.release(), Some(5));
}

#[test]
fn bytes_before_a_stream_file_could_be_made_are_counted_by_a_marker_at_its_start() {
    let flag = tempfile::tempdir().expect("tempdir");
    let go = flag.path().join("go");
    // `ready` on stderr is read after `lost` on stdout: the keeper pumps stdout first.
    let script = format!(
        "echo lost; echo ready >&2; while [ ! -e '{}' ]; do sleep 0.01; done; echo kept",
        go.display()
    );
    let job = Job::sh(&script, "late-file");
    let blocker = job.dir().join(files::STDOUT);
    std::fs::create_dir_all(&blocker).expect("blocker");
    let mut run = job.start(0, DRAIN);
    let stderr = job.dir().join(files::STDERR);
    assert!(wait_until(Duration::from_secs(10), || {
        std::fs::read(&stderr).is_ok_and(|b| b == b"ready\n")
    }));
    std::fs::remove_dir(&blocker).expect("blocker removed");
    std::fs::write(&go, b"").expect("go");
    assert!(matches!(
        run.message(),
        Message::Exited {
            ended: Ended::Exited(0),
            ..
        }
    ));
    let mut want = files::DROPPED_PREFIX.to_vec();
    want.extend_from_slice(format!("{:>w$}", 5, w = files::DROPPED_WIDTH).as_bytes());
    want.extend_from_slice(files::DROPPED_SUFFIX);
    want.extend_from_slice(b"kept\n");
    assert_eq!(job.stream(files::STDOUT), want);
    assert_eq!(files::dropped(&want), Some(5));
    assert_eq!(run.release(), Some(0));
}

#[test]
fn the_command_gets_its_environment_cwd_and_a_shell_for_a_script_without_a_shebang() {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("plain");
    std::fs::write(
        &script,
        "echo $0 $1 $LEASEHOLD_JOB_ID $LEASEHOLD_RUN_TOKEN; pwd\n",
    )
    .expect("write script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let script = script.to_string_lossy().into_owned();
    let mut job = Job::new(&[&script, "arg"], "env");
    job.cwd = Some(PathBuf::from("/tmp"));
    let mut run = job.start(0, DRAIN);
    assert!(matches!(
        run.message(),
        Message::Exited {
            ended: Ended::Exited(0),
            ..
        }
    ));
    let out = String::from_utf8(job.stream(files::STDOUT)).expect("text");
    assert_eq!(out, format!("{script} arg 1 {}\n/tmp\n", job.token));
    assert_eq!(run.release(), Some(0));
}

#[test]
fn an_outcome_that_cannot_be_written_is_retried_every_second_while_no_runner_holds_it() {
    let job = Job::sh("exit 6", "retry");
    // A folder where the temporary file goes: every attempt to write it fails, as on
    // a full disk (the tests run as root, to whom permissions are no obstacle).
    let blocker = job.dir().join("outcome.tmp");
    std::fs::create_dir_all(&blocker).expect("blocker");
    let mut run = job.start(0, DRAIN);
    assert!(matches!(
        run.message(),
        Message::Exited {
            ended: Ended::Exited(6),
            ..
        }
    ));
    assert_eq!(job.outcome(), None);
    let Kept {
        mut keeper,
        control,
        ..
    } = run.0.take().expect("started");
    drop(control);
    // Released, but the outcome is not on disk: the keeper stays and retries.
    assert!(
        !wait_until(Duration::from_millis(1500), || keeper
            .exited()
            .expect("waitid")),
        "the keeper waits for its outcome"
    );
    std::fs::remove_dir(&blocker).expect("unblock");
    assert_eq!(keeper_exit(&mut keeper), Some(6));
    assert_eq!(job.outcome().map(|o| o.ended), Some(Ended::Exited(6)));
}

use super::strace::{Trace, at, flushes};

/// A command that waits for the file `go` in its job's folder, then exits 3.
fn waiting_job(name: &str) -> (Job, PathBuf) {
    let folder = tempfile::tempdir().expect("tempdir");
    let go = folder.path().join("go");
    let script = format!(
        "while [ ! -e {} ]; do sleep 0.01; done; echo out; exit 3",
        go.display()
    );
    let mut job = Job::sh(&script, name);
    job.folder = folder;
    (job, go)
}

#[test]
fn a_released_keeper_exits_without_flushing_its_outcome() {
    let (job, go) = waiting_job("released");
    let mut run = job.start(0, DRAIN);
    let mut trace = Trace::attach(
        i64::from(run.kept().keeper.pid),
        job.folder.path().join("strace"),
    );
    std::fs::write(&go, "").expect("go");
    run.assert_exited(3);
    assert_eq!(run.release(), Some(3));
    let calls = trace.calls();
    let dir = std::fs::canonicalize(job.dir()).expect("attempt dir");
    let renamed = at(&calls, "rename", "outcome.tmp");
    assert!(renamed < at(&calls, "exit_group", ""), "{calls:#?}");
    assert!(!flushes(&calls), "no flush once released: {calls:#?}");
    assert!(calls[renamed].contains(&dir.display().to_string()));
    assert_eq!(job.outcome().map(|o| o.ended), Some(Ended::Exited(3)));
    assert_eq!(job.stream(files::STDOUT), b"out\n");
}

#[test]
fn a_keeper_whose_runner_goes_without_a_release_flushes_its_outcome_then_its_folder_and_then_exits()
{
    let (job, go) = waiting_job("unreleased");
    let mut run = job.start(0, DRAIN);
    let mut trace = Trace::attach(
        i64::from(run.kept().keeper.pid),
        job.folder.path().join("strace"),
    );
    std::fs::write(&go, "").expect("go");
    assert!(matches!(
        run.message(),
        Message::Exited {
            ended: Ended::Exited(3),
            ..
        }
    ));
    // The runner has the end but goes (dies) before it releases the command.
    let Kept {
        mut keeper,
        control,
        ..
    } = run.0.take().expect("started");
    drop(control);
    assert_eq!(keeper_exit(&mut keeper), Some(3));
    let calls = trace.calls();
    let dir = std::fs::canonicalize(job.dir()).expect("attempt dir");
    let dir = format!("<{}>", dir.display());
    let outcome = format!("/{}>", files::OUTCOME);
    // Renamed unflushed, as the end was reported to a runner; flushed at its EOF.
    let renamed = at(&calls, "rename", "outcome.tmp");
    let file = at(&calls, "fsync(", &outcome);
    let folder = at(&calls, "fsync(", &dir);
    let exit = at(&calls, "exit_group", "");
    assert!(
        renamed < file && file < folder && folder < exit,
        "{calls:#?}"
    );
    assert_eq!(job.outcome().map(|o| o.ended), Some(Ended::Exited(3)));
}

#[test]
fn a_command_that_ends_with_no_runner_left_has_its_outcome_written_durably_at_once() {
    let (job, go) = waiting_job("no-runner");
    let mut run = job.start(0, DRAIN);
    let mut trace = Trace::attach(
        i64::from(run.kept().keeper.pid),
        job.folder.path().join("strace"),
    );
    let Kept {
        mut keeper,
        control,
        ..
    } = run.0.take().expect("started");
    drop(control);
    // The keeper closes fd 3 at its EOF: gone before the command ends.
    let fd3 = format!("/proc/{}/fd/3", keeper.pid);
    assert!(
        wait_until(Duration::from_secs(10), || !Path::new(&fd3).exists()),
        "the keeper saw the runner go"
    );
    std::fs::write(&go, "").expect("go");
    assert_eq!(keeper_exit(&mut keeper), Some(3));
    let calls = trace.calls();
    let dir = std::fs::canonicalize(job.dir()).expect("attempt dir");
    let dir = format!("<{}>", dir.display());
    // The file flushed under its temporary name, renamed, then the folder flushed.
    let file = at(&calls, "fsync(", "/outcome.tmp>");
    let renamed = at(&calls, "rename", "outcome.tmp");
    let folder = at(&calls, "fsync(", &dir);
    let exit = at(&calls, "exit_group", "");
    assert!(
        file < renamed && renamed < folder && folder < exit,
        "{calls:#?}"
    );
    assert_eq!(job.outcome().map(|o| o.ended), Some(Ended::Exited(3)));
}

#[test]
fn a_released_keeper_whose_outcome_cannot_be_written_exits_at_once() {
    let job = Job::sh("exit 6", "released-unwritable");
    let blocker = job.dir().join("outcome.tmp");
    std::fs::create_dir_all(&blocker).expect("blocker");
    let mut run = job.start(0, DRAIN);
    assert!(matches!(
        run.message(),
        Message::Exited {
            ended: Ended::Exited(6),
            ..
        }
    ));
    // The runner holds the ending: the keeper does not stay to retry the file.
    let released = Instant::now();
    assert_eq!(run.release(), Some(6));
    assert!(released.elapsed() < Duration::from_millis(900));
    assert_eq!(job.outcome(), None);
}

#[test]
fn messages_parse_and_garbage_is_refused() {
    assert_eq!(
        Message::parse(b"started 42"),
        Some(Message::Started { pid: 42 })
    );
    assert_eq!(
        Message::parse(b"failed exec 2"),
        Some(Message::Failed {
            stage: Stage::Exec,
            errno: 2
        })
    );
    assert_eq!(
        Message::parse(b"exited signal 15 1"),
        Some(Message::Exited {
            ended: Ended::Signaled(15),
            pipes_open: true
        })
    );
    for bad in [
        &b"started"[..],
        b"exited exit x 0",
        b"exited exit 1 2",
        b"failed fork 1",
        b"",
    ] {
        assert_eq!(Message::parse(bad), None);
    }
}

/// The median of `samples`, in µs.
fn median_us(mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    samples[samples.len() / 2].as_secs_f64() * 1e6
}

/// The worker time of a kept `/bin/true`, part by part, as a worker spends it (figures,
/// not assertions): `cargo test --profile ci --lib keeper_parts -- --ignored --nocapture`,
/// with `KEEPER_PARTS_DIR` naming the folder to work in (a temporary one in `/tmp` by
/// default).
#[test]
#[ignore = "a measurement; run by hand"]
fn keeper_parts() {
    const N: usize = 500;
    let base = std::env::var_os("KEEPER_PARTS_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    let mut job = Job::new(&["/bin/true"], "parts");
    job.folder = tempfile::tempdir_in(base).expect("tempdir");
    let cmd = job.command();
    let program = c"/bin/true";
    let argv = [c"true".to_owned()];
    let env = c_pointers([]);
    let names = [
        "folders (job + attempt, 0700)",
        "keeper spawn to `started` (exec, its files, pipes, fork)",
        "`started` to `exited` (the command, its exit, the outcome, the message)",
        "tails read (64 KiB of each file)",
        "release, then a wait for the exit in 100 µs polls (before issue 21)",
        "  of which the keeper's exit after the release, seen by its pidfd",
        "release as kept.rs does it (the reap left to the reaper thread)",
        "total, with the release of kept.rs",
    ];
    let mut parts: Vec<Vec<Duration>> = vec![Vec::new(); names.len()];
    for i in 0..N {
        let mut token = job.token.clone();
        token.push_str(&format!("-{i}"));
        // A new job each time, as a runner of fresh jobs makes them.
        let job_id = i64::try_from(i).expect("N fits") + 1;
        let dir = files::attempt_dir(&job.folder.path().join("db-attempts"), job_id, 1, &token);
        let t0 = Instant::now();
        files::make_attempt_dir(&dir).expect("attempt dir");
        let t1 = Instant::now();
        let mut kept = spawn_keeper(&KeeperSpec {
            name: "true",
            token: &token,
            attempt_dir: &dir,
            cap: 0,
            drain: DRAIN,
            cwd: None,
            program,
            argv: &argv,
            envp: &env,
            fallback_dir: job.folder.path(),
        })
        .expect("starts");
        let t2 = Instant::now();
        let got = kept.control.wait(Instant::now() + Duration::from_secs(10));
        assert!(matches!(got, Ok(Received::Message(Message::Exited { .. }))));
        let t3 = Instant::now();
        let tails = super::super::kept::OutputFiles::new(dir.clone()).tails(64 * 1024);
        std::hint::black_box(tails);
        let t4 = Instant::now();
        let Kept {
            mut keeper,
            control,
            ..
        } = kept;
        let mut times = vec![t1 - t0, t2 - t1, t3 - t2, t4 - t3];
        if i % 2 == 0 {
            // The keeper's own exit, seen without a poll's granularity, then the wait
            // that kept.rs did until issue 21.
            let pidfd = super::super::child::pidfd_open(keeper.pid).expect("pidfd");
            control.release();
            let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
            poll(&mut fds, PollTimeout::from(10_000u16)).expect("poll");
            let exit = t4.elapsed();
            while !keeper.exited().expect("waitid") {
                std::thread::sleep(Duration::from_micros(100));
            }
            keeper.reap().expect("reap");
            times.extend([t4.elapsed(), exit]);
        } else {
            super::super::kept::Keeping::new(keeper, control, dir).release();
            let released = t4.elapsed();
            times.extend([Duration::ZERO, Duration::ZERO, released, t0.elapsed()]);
        }
        for (part, d) in parts.iter_mut().zip(times) {
            if !d.is_zero() {
                part.push(d);
            }
        }
    }
    let _ = cmd;
    let mut direct = Vec::new();
    for _ in 0..N {
        let t = Instant::now();
        let mut spawned = super::super::spawn::spawn(&job.command(), "/bin/true").expect("spawns");
        spawned.child.reap().expect("waitpid");
        direct.push(t.elapsed());
    }
    for (name, part) in names.iter().zip(parts) {
        eprintln!("{name:<75} {:>8.0} µs", median_us(part));
    }
    eprintln!(
        "{:<75} {:>8.0} µs",
        "direct posix_spawn + wait of /bin/true",
        median_us(direct)
    );
    eprintln!("(medians of {N}; parts' medians need not add up to the total's)");
}

/// Figures, not assertions: `cargo test --profile ci --lib keeper_figures -- --ignored
/// --nocapture`.
#[test]
#[ignore = "a measurement; run by hand"]
fn keeper_figures() {
    const N: usize = 500;
    // The keeper program alone (no arguments: it exits 2 at once), spawned and reaped:
    // its start cost from memory and from a file, against /bin/true.
    let folder = tempfile::tempdir().expect("tempdir");
    let (_ours, theirs) = control_pair().expect("socketpair");
    let argv = c_pointers([NAME]);
    let envp = c_pointers([]);
    for (label, file) in [("memfd", false), ("file", true)] {
        let mut alone = Vec::new();
        for _ in 0..N {
            let t = Instant::now();
            let (pid, _) =
                spawn_program(&argv, &envp, theirs.as_fd(), folder.path(), file).expect("spawns");
            let status = ChildProc::new(pid).reap().expect("waitpid");
            alone.push(t.elapsed());
            assert_eq!(status.code(), Some(2));
        }
        eprintln!(
            "keeper program alone ({label}): spawn + wait {:.0} µs (median of {N})",
            median_us(alone)
        );
    }
    let mut job = Job::new(&["/bin/true"], "bench");
    for (label, file, shm) in [
        ("memfd", false, false),
        ("file", true, false),
        ("memfd, tmpfs", false, true),
    ] {
        if shm {
            // The same on tmpfs, where the outcome's two fsyncs cost nothing: the
            // processes' own cost.
            match tempfile::tempdir_in("/dev/shm") {
                Ok(dir) => job.folder = dir,
                Err(_) => continue,
            }
        }
        let (mut start, mut total) = (Vec::new(), Vec::new());
        for _ in 0..N {
            let t = Instant::now();
            let mut run = job.try_start(0, DRAIN, file).expect("starts");
            start.push(t.elapsed());
            assert!(matches!(run.message(), Message::Exited { .. }));
            total.push(t.elapsed());
            run.release();
        }
        eprintln!(
            "keeper ({label}): spawn to started {:.0} µs, spawn to exited {:.0} µs (median of {N})",
            median_us(start),
            median_us(total)
        );
    }
    let mut direct = Vec::new();
    for _ in 0..N {
        let t = Instant::now();
        let mut spawned = super::super::spawn::spawn(&job.command(), "/bin/true").expect("spawns");
        spawned.child.reap().expect("waitpid");
        direct.push(t.elapsed());
    }
    eprintln!(
        "direct posix_spawn + wait: {:.0} µs (median of {N})",
        median_us(direct)
    );
}
