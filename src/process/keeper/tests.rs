//! The keeper per runner process, tested through its real program: real commands, real
//! signals, deadlines polled. Every test shares the process's keeper (a singleton, as in a
//! runner), so none of them kills it; each works in an attempts folder of its own.

use super::*;

use crate::manners::Limits;

use nix::sys::signal::Signal;

use crate::files::{self, Journaled};
use crate::process::kill::{signal_group, signal_pid};
use crate::process::proc::tests::{token, wait_until};
use crate::process::spawn::{BaseEnv, Command};

/// A long drain, for commands whose pipes close when they exit.
const DRAIN: Duration = Duration::from_secs(5);

/// What a stream keeps in memory unless a test says otherwise.
const MEM: u64 = 64 * 1024;

/// How long a test waits for anything the keeper does.
const LIMIT: Duration = Duration::from_secs(10);

/// The boot clock in ms, the lease fence's clock.
fn boot_ms() -> u64 {
    proc::boot_clock_ns().expect("the boot clock") / 1_000_000
}

/// A fence whose SIGTERM comes in `term` ms and its SIGKILL `grace` ms later.
fn fence_in(term: u64, grace: u64) -> files::LeaseFence {
    let now = boot_ms();
    files::LeaseFence {
        term_at: now + term,
        kill_at: now + term + grace,
    }
}

/// A command to start under the keeper, in an attempts folder of its own.
struct Job {
    argv: Vec<String>,
    cwd: Option<PathBuf>,
    base_env: BaseEnv,
    token: String,
    folder: tempfile::TempDir,
    /// The lease fence the command starts with.
    fence: Option<files::LeaseFence>,
}

impl Job {
    /// `argv` as attempt 1 of job 1, with a token named after the test.
    fn new(argv: &[&str], name: &str) -> Self {
        let folder = tempfile::tempdir().expect("tempdir");
        // Owner-only, as a runner's start makes it.
        std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
            .create(folder.path().join("db-attempts"))
            .expect("attempts folder");
        Self {
            argv: argv.iter().map(|a| (*a).to_owned()).collect(),
            cwd: None,
            base_env: BaseEnv::current(),
            token: token(&format!("keeper-{name}")),
            folder,
            fence: None,
        }
    }

    /// `sh -c script`.
    fn sh(script: &str, name: &str) -> Self {
        Self::new(&["sh", "-c", script], name)
    }

    /// `sh -c script` run in its own temporary folder (for its `go` file and the like).
    fn sh_here(script: &str, name: &str) -> Self {
        let mut job = Self::sh(script, name);
        job.cwd = Some(job.folder.path().to_owned());
        job
    }

    /// The attempts folder (`<db>-attempts`).
    fn attempts(&self) -> PathBuf {
        self.folder.path().join("db-attempts")
    }

    /// The attempt's folder.
    fn dir(&self) -> PathBuf {
        files::attempt_dir(&self.attempts(), 1, 1, &self.token)
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
            limits: Limits::default(),
        }
    }

    fn try_start(&self, cap: u64, mem: u64, drain: Duration) -> Result<Running, SpawnError> {
        let kept = spawn_kept(
            &self.command(),
            &self.argv[0],
            &self.dir(),
            (cap, mem),
            drain,
        )?;
        Ok(Running(Some(kept), false))
    }

    fn start(&self, cap: u64, mem: u64, drain: Duration) -> Running {
        self.try_start(cap, mem, drain).expect("starts")
    }

    /// A stream's file.
    fn stream(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.dir().join(name)).expect("stream file")
    }

    /// The output of an ended command, from the message or, for one that ran past
    /// `SPILL_AFTER_MS` (a slow machine), from its files.
    fn output(&self, output: Output) -> (Vec<u8>, Vec<u8>) {
        match output {
            Output::Memory(out, err) => (out, err),
            Output::Files => {
                let read = |name| std::fs::read(self.dir().join(name)).unwrap_or_default();
                (read(files::STDOUT), read(files::STDERR))
            }
        }
    }

    /// The file named `name` in the command's folder, once it is whole (ends in a newline).
    fn wait_for_line(&self, name: &str) -> String {
        let path = self.folder.path().join(name);
        assert!(
            wait_until(LIMIT, || std::fs::read_to_string(&path)
                .is_ok_and(|s| s.ends_with('\n'))),
            "{name} written"
        );
        std::fs::read_to_string(&path).expect("read")
    }

    /// Lets a command that waits for the file `go` in its folder go on.
    fn go(&self) {
        std::fs::write(self.folder.path().join("go"), "").expect("go");
    }

    /// The journal of the keeper that holds `kept`.
    fn journal_path(&self, kept: &Kept) -> PathBuf {
        files::journal_path(&self.attempts(), kept.keeper, kept.keeper_start_time)
    }

    /// What that journal says last of this attempt.
    fn journaled(&self, kept: &Kept) -> Option<Journaled> {
        files::read_journal(&self.journal_path(kept), &self.token).expect("journal readable")
    }

    /// Waits until the journal says something that `want` accepts, and returns it.
    fn wait_journaled(&self, kept: &Kept, want: impl Fn(&Journaled) -> bool) -> Journaled {
        let mut said = None;
        let found = wait_until(LIMIT, || {
            said = self.journaled(kept);
            said.as_ref().is_some_and(&want)
        });
        assert!(found, "the journal says {said:?}");
        said.expect("found")
    }
}

/// A wait, in a command run in its own folder, until the test makes the file `go` there.
const WAITS: &str = "while [ ! -e go ]; do sleep 0.01; done";

/// A started command, and whether its end was read. On drop, its group is killed while the
/// keeper still holds its leader (so the group id is still its own), and it is released.
struct Running(Option<Kept>, bool);

impl Running {
    fn kept(&mut self) -> &mut Kept {
        self.0.as_mut().expect("not yet ended")
    }

    /// The next message, within [`LIMIT`].
    fn message(&mut self) -> Message {
        match self.kept().control.wait(Instant::now() + LIMIT) {
            Ok(Received::Message(m)) => {
                self.1 |= matches!(m, Message::Exited { .. });
                m
            }
            other => panic!("no message: {other:?}"),
        }
    }

    /// The next message: the command's end, its pipes closed.
    fn ended(&mut self) -> (Ended, Output) {
        match self.message() {
            Message::Exited {
                ended,
                pipes_open: false,
                output,
                ..
            } => (ended, output),
            other => panic!("not an end: {other:?}"),
        }
    }

    /// Releases the command, as a runner does once its ending is committed, and waits until
    /// the keeper has reaped it.
    fn release(&mut self) {
        let kept = self.0.take().expect("not yet released");
        let (keeper, pid) = (kept.keeper, kept.pid);
        kept.control.release();
        assert!(wait_until(LIMIT, || !held_by(pid, keeper)), "{pid} reaped");
    }

    /// Closes the control socket without a release: the runner is gone.
    fn leave(&mut self) -> (i32, i32) {
        let kept = self.0.as_mut().expect("started");
        let (keeper, pid) = (kept.keeper, kept.pid);
        let (ours, _) = socket_pair(libc::SOCK_STREAM, false).expect("socketpair");
        drop(std::mem::replace(&mut kept.control, Control::new(ours)));
        (keeper, pid)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let Some(mut kept) = self.0.take() else {
            return;
        };
        if held_by(kept.pid, kept.keeper) {
            let _ = signal_group(kept.pid, Signal::SIGKILL);
        }
        // Released once it ended: left, the keeper would journal it into a folder that goes
        // with the test, retry that forever, and never exit.
        if self.1 {
            kept.control.release();
            return;
        }
        let deadline = Instant::now() + LIMIT;
        while let Ok(Received::Message(m)) = kept.control.wait(deadline) {
            if matches!(m, Message::Exited { .. }) {
                kept.control.release();
                return;
            }
        }
    }
}

/// Whether `pid` is still a child of `keeper` (running, or held unreaped).
fn held_by(pid: i32, keeper: i32) -> bool {
    proc::proc_info(pid).is_some_and(|p| p.ppid == keeper)
}

/// `n` lines `1\n` to `n\n`, as `seq 1 n` prints them.
fn seq(n: u32) -> Vec<u8> {
    (1..=n)
        .flat_map(|i| format!("{i}\n").into_bytes())
        .collect()
}

#[test]
fn a_short_output_and_the_exit_code_come_with_the_message_and_nothing_is_made_on_disk() {
    let job = Job::sh("echo out; echo err >&2; exit 3", "exit");
    let mut run = job.start(0, MEM, DRAIN);
    let (ended, output) = run.ended();
    assert_eq!(ended, Ended::Exited(3));
    assert_eq!(output, Output::Memory(b"out\n".to_vec(), b"err\n".to_vec()));
    let kept = run.kept();
    let journal = job.journal_path(kept);
    run.release();
    let made: Vec<_> = std::fs::read_dir(job.attempts())
        .expect("attempts folder")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert!(made.is_empty(), "made beside the database: {made:?}");
    assert!(!journal.exists());
}

#[test]
fn a_command_killed_by_a_signal_is_reported_as_killed() {
    let job = Job::sh("echo before; kill -9 $$", "signal");
    let mut run = job.start(0, MEM, DRAIN);
    let (ended, output) = run.ended();
    assert_eq!(ended, Ended::Signaled(9));
    assert_eq!(output, Output::Memory(b"before\n".to_vec(), Vec::new()));
    run.release();
}

#[test]
fn a_stream_past_mem_goes_to_its_file_with_the_other() {
    let job = Job::sh("seq 1 100000; echo err >&2", "past-mem");
    let mut run = job.start(0, 1000, DRAIN);
    let (ended, output) = run.ended();
    assert_eq!((ended, output), (Ended::Exited(0), Output::Files));
    assert_eq!(job.stream(files::STDOUT), seq(100_000));
    assert_eq!(job.stream(files::STDERR), b"err\n");
    let mode = std::fs::metadata(job.dir())
        .expect("folder")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700, "the attempt's folder is owner-only");
    run.release();
}

#[test]
fn a_stream_past_its_cap_keeps_its_head_a_marker_with_the_exact_count_and_its_tail() {
    let all = seq(100_000);
    let marker = files::DROPPED_PREFIX.len() + files::DROPPED_WIDTH + files::DROPPED_SUFFIX.len();
    // A cap larger than a pipe read, one smaller, and a tiny one; kept in memory first, or
    // not at all.
    for (cap, mem) in [(60_000u64, 4096), (1000, 4096), (7, 0)] {
        let job = Job::sh("seq 1 100000; seq 1 1000 >&2", &format!("cap-{cap}"));
        let mut run = job.start(cap, mem, DRAIN);
        assert_eq!(run.ended(), (Ended::Exited(0), Output::Files));
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
            assert_eq!(job.stream(files::STDERR), seq(1000));
        }
        run.release();
    }
}

#[test]
fn a_running_commands_output_reaches_its_files_after_a_second() {
    let job = Job::sh_here(
        &format!("echo early; echo warn >&2; {WAITS}; echo late"),
        "follow",
    );
    let mut run = job.start(0, MEM, DRAIN);
    let (out, err) = (job.dir().join(files::STDOUT), job.dir().join(files::STDERR));
    // What `jobs logs --follow` reads while the command runs.
    assert!(
        wait_until(LIMIT, || std::fs::read(&out).is_ok_and(|b| b == b"early\n")),
        "stdout spilled while running"
    );
    assert_eq!(std::fs::read(&err).expect("stderr"), b"warn\n");
    assert!(matches!(run.kept().control.next(), Ok(Received::Pending)));
    job.go();
    assert_eq!(run.ended(), (Ended::Exited(0), Output::Files));
    assert_eq!(job.stream(files::STDOUT), b"early\nlate\n");
    run.release();
}

#[test]
fn a_silent_command_leaves_no_file_and_only_the_stream_with_output_gets_one() {
    let job = Job::sh("exit 3", "silent");
    let mut run = job.start(1000, 0, DRAIN);
    assert_eq!(run.ended(), (Ended::Exited(3), Output::Files));
    assert!(!job.dir().exists(), "a folder made with no output");
    run.release();

    let job = Job::sh("echo late >&2", "one-stream");
    let mut run = job.start(0, 0, DRAIN);
    assert_eq!(run.ended(), (Ended::Exited(0), Output::Files));
    assert!(!job.dir().join(files::STDOUT).exists());
    assert_eq!(job.stream(files::STDERR), b"late\n");
    run.release();
}

#[test]
fn a_stream_that_cannot_be_written_costs_the_command_nothing() {
    // Every write of stdout fails (ENOSPC), as on a full disk.
    let job = Job::sh("seq 1 100000; echo fine >&2; exit 4", "full");
    std::fs::create_dir_all(job.dir()).expect("attempt dir");
    std::os::unix::fs::symlink("/dev/full", job.dir().join(files::STDOUT)).expect("symlink");
    let mut run = job.start(1000, 0, DRAIN);
    assert_eq!(run.ended(), (Ended::Exited(4), Output::Files));
    assert_eq!(job.stream(files::STDERR), b"fine\n");
    run.release();
}

#[test]
fn a_missing_program_and_a_bad_cwd_fail_as_a_direct_spawn_does() {
    // Resolved before the keeper hears of it.
    let job = Job::new(&["/no/such/program"], "missing");
    let err = job
        .try_start(0, MEM, DRAIN)
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
        .try_start(0, MEM, DRAIN)
        .map(|_| ())
        .expect_err("no cwd");
    assert_eq!(
        err.message,
        "spawn \"sh\": working directory \"/no/such/dir\": No such file or directory (os error 2)"
    );

    // The keeper's own exec and chdir, for a program or a folder that goes away after the
    // runner's checks.
    let argv = [c"sh".to_owned()];
    let (dir, attempts) = (job.dir(), job.attempts());
    let spec = |program, cwd| KeeperSpec {
        name: "sh",
        token: &job.token,
        attempt_dir: &dir,
        folder: &attempts,
        cap: 0,
        mem: MEM,
        drain: DRAIN,
        fence: None,
        cwd,
        program,
        argv: &argv,
        env: Vec::new(),
        limits: Limits::default(),
    };
    let err = spawn_keeper_from(&spec(c"/no/such/program", None), false)
        .map(|_| ())
        .expect_err("the keeper's exec fails");
    assert_eq!(
        (err.message.as_str(), err.resources),
        (
            "spawn \"sh\": No such file or directory (os error 2)",
            false
        )
    );
    let err = spawn_keeper_from(&spec(c"/bin/sh", job.cwd.as_deref()), false)
        .map(|_| ())
        .expect_err("the keeper's chdir fails");
    assert_eq!(
        (err.message.as_str(), err.resources),
        (
            "spawn \"sh\": working directory \"/no/such/dir\": No such file or directory (os error 2)",
            false
        )
    );
}

/// A control socket whose other end went to the keeper over the hub, by hand.
fn by_hand(hub: &Hub) -> Control {
    let (ours, theirs) = socket_pair(libc::SOCK_STREAM, false).expect("socketpair");
    hub.send(b"attempt", Some(theirs.as_fd()), true)
        .expect("sent");
    Control::new(ours)
}

#[test]
fn a_bad_request_is_refused_as_a_failed_setup() {
    let job = Job::sh("exit 0", "bad-request");
    let hub = hub(&job.attempts(), false).expect("the keeper");
    let argv = [c"sh".to_owned()];
    let dir = job.dir();
    let attempts = job.attempts();
    let spec = |token| KeeperSpec {
        name: "sh",
        token,
        attempt_dir: &dir,
        folder: &attempts,
        cap: 0,
        mem: MEM,
        drain: DRAIN,
        fence: None,
        cwd: None,
        program: c"/bin/sh",
        argv: &argv,
        env: Vec::new(),
        limits: Limits::default(),
    };
    let refused = Message::Failed {
        stage: Stage::Setup,
        errno: libc::EINVAL,
    };
    let journal = files::journal_path(&attempts, hub.pid, hub.start_time);
    // A token with a space (it would split the journal's words), one too long, a
    // request of no bytes, and one with too few fields.
    let long = "t".repeat(129);
    let mut requests: Vec<Vec<u8>> = ["bad token", long.as_str(), ""]
        .into_iter()
        .map(|t| request(&spec(t), &journal).expect("request"))
        .collect();
    requests.push(vec![0, 0, 0, 0]);
    requests.push(b"\x04\0\0\0ab\0\0".to_vec());
    for bytes in requests {
        let mut control = by_hand(&hub);
        control
            .write_all(&bytes, Instant::now() + LIMIT)
            .expect("written");
        let said = control.wait(Instant::now() + LIMIT).expect("read");
        assert_eq!(said, Received::Message(refused.clone()), "{bytes:?}");
        assert_eq!(
            control.wait(Instant::now() + LIMIT).expect("read"),
            Received::Closed
        );
    }
    // As a spawn reports it: the runner's fault, not the job's.
    let err = spawn_keeper_from(&spec("bad token"), false)
        .map(|_| ())
        .expect_err("refused");
    assert_eq!(
        (err.message.as_str(), err.resources),
        ("spawn \"sh\": keeper: Invalid argument (os error 22)", true)
    );
    // The keeper serves on.
    let mut run = Job::sh("echo on", "after-bad").start(0, MEM, DRAIN);
    assert_eq!(
        run.ended(),
        (
            Ended::Exited(0),
            Output::Memory(b"on\n".to_vec(), Vec::new())
        )
    );
    run.release();
}

/// The lease fence, the runner present but silent: SIGTERM to the group at TERM_AT, SIGKILL
/// at KILL_AT although the leader died of the SIGTERM (held unreaped, so the group id is
/// still the command's), and no `exited`: the control socket closes, the attempt is lost.
#[test]
fn the_lease_fence_kills_the_whole_group_at_kill_at_whatever_the_leader_did() {
    let mut job = Job::sh_here(
        "(trap '' TERM; exec sleep 30) & echo $! > member; exec sleep 30",
        "fence-member",
    );
    job.fence = Some(fence_in(300, 1000));
    let kill_at = job.fence.map(|f| f.kill_at).unwrap_or_default();
    let mut run = job.start(0, MEM, DRAIN);
    let member: i32 = job.wait_for_line("member").trim().parse().expect("a pid");
    let (pid, keeper) = (run.kept().pid, run.kept().keeper);
    // The leader dies of the SIGTERM and is held: the member runs on until KILL_AT.
    assert!(
        wait_until(LIMIT, || proc::proc_info(pid)
            .is_some_and(|p| p.state == 'Z')),
        "the leader died of its SIGTERM"
    );
    assert!(
        proc::is_alive(member) || boot_ms() >= kill_at,
        "the member, which ignores SIGTERM, died before KILL_AT"
    );
    let said = run
        .kept()
        .control
        .wait(Instant::now() + LIMIT)
        .expect("read");
    let killed = boot_ms();
    assert_eq!(said, Received::Closed, "a fenced attempt gets no end");
    assert!(killed >= kill_at, "closed before KILL_AT");
    // Killed, it is gone or a zombie waiting for its new parent to reap it.
    let alive = || proc::proc_info(member).is_some_and(|p| p.state != 'Z');
    let gone = wait_until(LIMIT, || !alive());
    if !gone {
        let _ = signal_pid(member, Signal::SIGKILL);
    }
    assert!(gone, "member {member}, which ignores SIGTERM, runs on");
    assert!(!held_by(pid, keeper), "the leader is reaped");
    assert_eq!(
        job.journaled(run.kept()),
        None,
        "journaled with a runner present"
    );
}

#[test]
fn a_renewal_moves_the_fence_later_and_a_disarmed_fence_never_stops_the_command() {
    let mut job = Job::new(&["sleep", "30"], "fence-moved");
    job.fence = Some(fence_in(400, 300));
    let first = job.fence.map(|f| f.kill_at).unwrap_or_default();
    let mut run = job.start(0, MEM, DRAIN);
    let later = fence_in(1500, 300);
    move_fence(&job.token, Some(later));
    // Past the first times, the command runs on.
    let early = run.kept().control.wait(Instant::now() + LIMIT);
    let stopped = boot_ms();
    assert_eq!(early.expect("read"), Received::Closed);
    assert!(
        stopped >= later.kill_at && stopped > first,
        "stopped at {stopped}, before the renewed KILL_AT {}",
        later.kill_at
    );

    let mut job = Job::new(&["sleep", "30"], "fence-disarmed");
    job.fence = Some(fence_in(300, 200));
    let kill_at = job.fence.map(|f| f.kill_at).unwrap_or_default();
    let mut run = job.start(0, MEM, DRAIN);
    move_fence(&job.token, None);
    // A later move does not arm it again.
    move_fence(&job.token, Some(fence_in(300, 200)));
    assert!(
        !wait_until(Duration::from_millis(1500), || {
            run.kept().control.next().expect("read") != Received::Pending
        }),
        "stopped although disarmed"
    );
    assert!(boot_ms() > kill_at + 500);
    let pid = run.kept().pid;
    signal_group(pid, Signal::SIGKILL).expect("killed");
    assert_eq!(run.ended().0, Ended::Signaled(9));
    run.release();
}

/// The runner gone while the command runs: the keeper journals `kept`, then the outcome at
/// the end, with the output in the attempt's files; the command is reaped once the outcome is
/// on disk.
#[test]
fn a_runner_gone_while_the_command_runs_has_its_outcome_journaled() {
    // Any signal the runner's death could bring (a hangup, a broken pipe, a termination)
    // would show in the output and the exit code.
    let job = Job::sh_here(
        &format!(
            "trap 'echo HUP; exit 91' HUP; trap 'echo PIPE; exit 92' PIPE; \
             trap 'echo TERM; exit 93' TERM; echo before; {WAITS}; echo after; exit 5"
        ),
        "gone-running",
    );
    let before = crate::job::now_ms();
    let mut run = job.start(0, MEM, DRAIN);
    let (keeper, pid) = run.leave();
    let kept = run.kept();
    assert_eq!(job.wait_journaled(kept, |_| true), Journaled::Kept);
    assert!(held_by(pid, keeper));
    // Its output so far is in its files.
    let out = job.dir().join(files::STDOUT);
    assert!(
        wait_until(LIMIT, || std::fs::read(&out)
            .is_ok_and(|b| b == b"before\n")),
        "the output so far in its file"
    );
    job.go();
    let said = job.wait_journaled(kept, |j| *j != Journaled::Kept);
    let Journaled::Outcome { ended, ended_at } = said else {
        panic!("{said:?}");
    };
    assert_eq!(ended, Ended::Exited(5));
    assert!(ended_at >= before && ended_at <= crate::job::now_ms());
    assert!(wait_until(LIMIT, || !held_by(pid, keeper)), "reaped");
    assert_eq!(job.stream(files::STDOUT), b"before\nafter\n");
    assert_eq!(
        files::journals_of(&job.attempts(), &job.token),
        [(keeper, kept.keeper_start_time.unwrap_or(0), said)]
    );
}

/// A runner crash never reruns finished work: gone after the `exited` but before its
/// release, the runner leaves the outcome to the keeper, which journals it.
#[test]
fn a_runner_gone_after_the_end_but_before_the_release_has_the_outcome_journaled() {
    let job = Job::sh("echo out; echo err >&2; exit 3", "gone-ended");
    let mut run = job.start(0, MEM, DRAIN);
    let (ended, output) = run.ended();
    assert_eq!(ended, Ended::Exited(3));
    assert_eq!(output, Output::Memory(b"out\n".to_vec(), b"err\n".to_vec()));
    let (keeper, pid) = run.leave();
    let said = job.wait_journaled(run.kept(), |_| true);
    assert!(
        matches!(
            said,
            Journaled::Outcome {
                ended: Ended::Exited(3),
                ..
            }
        ),
        "{said:?}"
    );
    assert!(wait_until(LIMIT, || !held_by(pid, keeper)), "reaped");
    // The output it held in memory went to the files, for the adopter.
    assert_eq!(job.stream(files::STDOUT), b"out\n");
    assert_eq!(job.stream(files::STDERR), b"err\n");
}

#[test]
fn a_journal_that_cannot_be_written_is_retried_and_the_command_held_meanwhile() {
    let job = Job::sh("exit 6", "journal-blocked");
    let mut run = job.start(0, MEM, DRAIN);
    assert_eq!(run.ended().0, Ended::Exited(6));
    // A folder where the journal goes: every append fails, as on a full disk (the tests
    // run as root, to whom permissions are no obstacle).
    let journal = job.journal_path(run.kept());
    std::fs::create_dir(&journal).expect("blocker");
    let (keeper, pid) = run.leave();
    assert!(
        !wait_until(Duration::from_millis(1500), || !held_by(pid, keeper)),
        "reaped before its outcome was on disk"
    );
    std::fs::remove_dir(&journal).expect("unblocked");
    let said = job.wait_journaled(run.kept(), |_| true);
    assert!(
        matches!(
            said,
            Journaled::Outcome {
                ended: Ended::Exited(6),
                ..
            }
        ),
        "{said:?}"
    );
    assert!(wait_until(LIMIT, || !held_by(pid, keeper)), "reaped");
}

/// A journal whose folder is gone (the database's attempts folder removed while a runner was
/// away) is given up after a few seconds: the keeper forgets the attempt unrecorded, and so
/// ends, rather than retry forever and hold the command and itself for good.
#[test]
fn a_journal_whose_folder_is_gone_is_given_up_and_the_attempt_forgotten() {
    let job = Job::sh("exit 7", "journal-gone");
    let mut run = job.start(0, MEM, DRAIN);
    assert_eq!(run.ended().0, Ended::Exited(7));
    std::fs::remove_dir_all(job.attempts()).expect("the attempts folder goes");
    let (keeper, pid) = run.leave();
    assert!(
        !wait_until(Duration::from_millis(1500), || !held_by(pid, keeper)),
        "given up at once"
    );
    assert!(
        wait_until(Duration::from_secs(15), || !held_by(pid, keeper)),
        "held for good"
    );
    assert!(!job.attempts().exists(), "the keeper made the folder again");
}

#[test]
fn a_runner_gone_then_fenced_has_the_attempt_journaled_fenced() {
    let mut job = Job::new(&["sleep", "30"], "gone-fenced");
    job.fence = Some(fence_in(500, 300));
    let mut run = job.start(0, MEM, DRAIN);
    let (keeper, pid) = run.leave();
    assert_eq!(job.wait_journaled(run.kept(), |_| true), Journaled::Kept);
    assert_eq!(
        job.wait_journaled(run.kept(), |j| *j != Journaled::Kept),
        Journaled::Fenced
    );
    assert!(wait_until(LIMIT, || !held_by(pid, keeper)), "reaped");
}

/// An adopter renews a gone runner's attempts by their `lease` files: for a quiet command
/// too (the keeper has made no folder of its own for it).
#[test]
fn an_adopters_lease_file_moves_and_re_arms_the_fence_of_a_gone_attempt() {
    adopted(false, "adopted-says");
    adopted(true, "adopted-quiet");
}

/// A command, quiet or not, left by its runner with its fence disarmed, then fenced by the
/// lease file an adopter writes.
fn adopted(quiet: bool, name: &str) {
    let script = if quiet {
        "exec sleep 30"
    } else {
        "echo hi; exec sleep 30"
    };
    let job = Job::sh(script, name);
    let mut run = job.start(0, MEM, DRAIN);
    move_fence(&job.token, None);
    let (keeper, pid) = run.leave();
    assert_eq!(job.wait_journaled(run.kept(), |_| true), Journaled::Kept);
    // As the heartbeat of a runner that adopted the keeper writes it.
    let fence = fence_in(300, 300);
    files::make_attempt_dir(&job.dir()).expect("attempt dir");
    files::write_lease(&job.dir(), fence).expect("lease");
    assert_eq!(
        job.wait_journaled(run.kept(), |j| *j != Journaled::Kept),
        Journaled::Fenced,
        "quiet: {quiet}"
    );
    assert!(boot_ms() >= fence.kill_at);
    assert!(wait_until(LIMIT, || !held_by(pid, keeper)), "reaped");
}

#[test]
fn a_released_attempt_is_reaped_and_forgotten() {
    let job = Job::new(&["sleep", "30"], "identity");
    let mut run = job.start(0, MEM, DRAIN);
    let (keeper, pid) = (run.kept().keeper, run.kept().pid);
    // SAFETY: getsid reads nothing of ours.
    let sid = unsafe { libc::getsid(keeper) };
    assert_eq!(sid, keeper, "the keeper leads a session");
    let (kinfo, cinfo) = (
        proc::proc_info(keeper).expect("keeper"),
        proc::proc_info(pid).expect("command"),
    );
    assert_eq!(kinfo.pgid, keeper);
    assert_eq!((cinfo.pgid, cinfo.ppid), (pid, keeper));
    // A teardown of the command's group does not reach the keeper, which holds the command
    // unreaped until it is released.
    signal_group(pid, Signal::SIGKILL).expect("kill the command's group");
    assert_eq!(run.ended().0, Ended::Signaled(9));
    assert_eq!(
        proc::proc_info(pid).map(|p| (p.state, p.ppid)),
        Some(('Z', keeper)),
        "held unreaped"
    );
    assert!(matches!(run.kept().control.next(), Ok(Received::Pending)));
    let journal = job.journal_path(run.kept());
    run.release();
    assert!(proc::is_alive(keeper), "the keeper outlives its attempts");
    assert!(!journal.exists(), "a released attempt is not journaled");
}

#[test]
fn pipes_held_past_the_drain_are_reported_and_their_holders_killed_at_the_release() {
    let job = Job::sh("sleep 30 & echo hi", "leftover");
    let mut run = job.start(0, MEM, Duration::from_millis(200));
    let message = run.message();
    assert_eq!(
        message,
        Message::Exited {
            ended: Ended::Exited(0),
            pipes_open: true,
            alone: false,
            output: Output::Memory(b"hi\n".to_vec(), Vec::new()),
        }
    );
    let pid = run.kept().pid;
    assert!(
        crate::process::group_has_live_members(pid),
        "the leftover runs"
    );
    // Released without the runner killing it: the keeper kills the group.
    run.release();
    assert!(
        wait_until(LIMIT, || !crate::process::group_has_live_members(pid)),
        "the leftover is killed"
    );
}

/// A leader that ends by itself before the fence, with a member that ignores SIGTERM and
/// holds the pipes, and a runner that never releases (frozen): the member is killed at
/// KILL_AT all the same, and the attempt keeps its outcome (it ended; it was not stopped).
#[test]
fn the_lease_fence_kills_what_outlives_a_leader_that_ended_by_itself() {
    let mut job = Job::sh_here(
        "(trap '' TERM; exec sleep 30) & echo $! > member; exit 0",
        "fence-after-end",
    );
    job.fence = Some(fence_in(300, 700));
    let kill_at = job.fence.map(|f| f.kill_at).unwrap_or_default();
    let mut run = job.start(0, MEM, Duration::from_millis(100));
    let member: i32 = job.wait_for_line("member").trim().parse().expect("a pid");
    let message = run.message();
    assert_eq!(
        message,
        Message::Exited {
            ended: Ended::Exited(0),
            pipes_open: true,
            alone: false,
            output: Output::Memory(Vec::new(), Vec::new()),
        }
    );
    // No release (a frozen runner): the member, which ignores SIGTERM, dies at KILL_AT.
    let alive = || proc::proc_info(member).is_some_and(|p| p.state != 'Z');
    let gone = wait_until(LIMIT, || !alive());
    let killed = boot_ms();
    if !gone {
        let _ = signal_pid(member, Signal::SIGKILL);
    }
    assert!(gone, "member {member} runs on past KILL_AT");
    assert!(killed >= kill_at, "killed before KILL_AT");
    // The runner gone now: the outcome it never took is journaled, not `fenced`.
    run.leave();
    let said = job.wait_journaled(run.kept(), |j| !matches!(j, Journaled::Kept));
    assert!(
        matches!(
            said,
            Journaled::Outcome {
                ended: Ended::Exited(0),
                ..
            }
        ),
        "{said:?}"
    );
}

#[test]
fn one_keeper_serves_many_attempts_at_once() {
    let jobs: Vec<Job> = (0..50)
        .map(|i| {
            Job::new(
                &["sh", "-c", "echo $0; sleep 0.2", &format!("attempt-{i}")],
                &format!("many-{i}"),
            )
        })
        .collect();
    let keepers: Vec<i32> = std::thread::scope(|scope| {
        let threads: Vec<_> = jobs
            .iter()
            .map(|job| {
                scope.spawn(move || {
                    let mut run = job.start(0, MEM, DRAIN);
                    let keeper = run.kept().keeper;
                    let want = format!("{}\n", job.argv[3]).into_bytes();
                    let (ended, output) = run.ended();
                    assert_eq!(ended, Ended::Exited(0));
                    assert_eq!(job.output(output), (want, Vec::new()));
                    run.release();
                    keeper
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("thread"))
            .collect()
    });
    assert!(keepers.iter().all(|&k| k == keepers[0]), "{keepers:?}");
}

/// The keeper is a child subreaper: a descendant that leaves its group's tree is re-parented
/// to it, and reaped by it once it exits.
#[test]
fn an_orphaned_descendant_is_the_keepers_and_is_reaped_by_it() {
    let job = Job::sh_here(
        "(sleep 30 </dev/null >/dev/null 2>&1 & echo $! > orphan); exit 0",
        "subreaper",
    );
    let mut run = job.start(0, MEM, DRAIN);
    let keeper = run.kept().keeper;
    // In the cgroup mode the orphan is a leftover of the attempt's cgroup, said as such; in
    // either mode the keeper, its parent now, does not say the attempt left nothing alive.
    let contained = run.kept().cgroup.is_some();
    assert!(matches!(run.message(),
        Message::Exited { ended: Ended::Exited(0), pipes_open, alone: false, .. }
            if pipes_open == contained));
    let orphan: i32 = job.wait_for_line("orphan").trim().parse().expect("a pid");
    let parent = proc::proc_info(orphan).map(|p| p.ppid);
    if parent != Some(keeper) {
        let _ = signal_pid(orphan, Signal::SIGKILL);
    }
    assert_eq!(parent, Some(keeper), "the orphan's parent");
    run.release();
    if !contained {
        // Process groups: a leftover that closed its pipes outlives the release.
        signal_pid(orphan, Signal::SIGKILL).expect("killed");
    }
    // In the cgroup mode the release killed it, as a leftover of the attempt's cgroup.
    assert!(
        wait_until(LIMIT, || proc::proc_info(orphan)
            .is_none_or(|p| p.ppid != keeper)),
        "the orphan is left a zombie"
    );
}

#[test]
fn the_command_gets_its_environment_cwd_and_a_shell_for_a_script_without_a_shebang() {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("plain");
    std::fs::write(
        &script,
        "echo $0 $1 $LEASEHOLD_JOB_ID $LEASEHOLD_RUN_TOKEN; pwd; exec sleep 30\n",
    )
    .expect("write script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let script = script.to_string_lossy().into_owned();
    let mut job = Job::new(&[&script, "arg"], "env");
    job.cwd = Some(PathBuf::from("/tmp"));
    let mut run = job.start(0, MEM, DRAIN);
    let (keeper, pid) = (run.kept().keeper, run.kept().pid);
    // Past its exec of `sleep` (an environment read during an exec is empty).
    assert!(
        wait_until(LIMIT, || std::fs::read(format!("/proc/{pid}/comm"))
            .is_ok_and(|c| c == b"sleep\n")),
        "the script runs sleep"
    );
    // The token is the command's alone: a scan for it never finds (or kills) the keeper.
    let entry = format!("{}={}", proc::RUN_TOKEN_VAR, job.token);
    let environ = |p: i32| std::fs::read(format!("/proc/{p}/environ")).expect("environ");
    assert_eq!(environ(keeper), b"", "the keeper's environment");
    assert!(
        environ(pid)
            .split(|&b| b == 0)
            .any(|e| e == entry.as_bytes()),
        "the command's"
    );
    assert_eq!(
        proc::processes_with_token(&job.token)
            .iter()
            .map(|p| p.pid)
            .collect::<Vec<_>>(),
        [pid]
    );
    signal_group(pid, Signal::SIGTERM).expect("stopped");
    let (ended, output) = run.ended();
    assert_eq!(ended, Ended::Signaled(libc::SIGTERM));
    let want = format!("{script} arg 1 {}\n/tmp\n", job.token).into_bytes();
    assert_eq!(job.output(output), (want, Vec::new()));
    run.release();
}

mod cap;
mod in_cgroups;
mod program;

#[test]
fn messages_parse_and_garbage_is_refused() {
    assert_eq!(
        parse(b"started 42"),
        Some((Message::Started { pid: 42 }, 0, 0))
    );
    assert_eq!(
        parse(b"failed exec 2"),
        Some((
            Message::Failed {
                stage: Stage::Exec,
                errno: 2
            },
            0,
            0
        ))
    );
    assert_eq!(
        parse(b"exited signal 15 1 files 0 0"),
        Some((
            Message::Exited {
                ended: Ended::Signaled(15),
                pipes_open: true,
                alone: false,
                output: Output::Files,
            },
            0,
            0
        ))
    );
    assert_eq!(
        parse(b"exited exit 3 0 mem 4 5"),
        Some((
            Message::Exited {
                ended: Ended::Exited(3),
                pipes_open: false,
                alone: false,
                output: Output::Memory(Vec::new(), Vec::new()),
            },
            4,
            5
        ))
    );
    assert_eq!(
        parse(b"exited exit 0 2 mem 0 0"),
        Some((
            Message::Exited {
                ended: Ended::Exited(0),
                pipes_open: false,
                alone: true,
                output: Output::Memory(Vec::new(), Vec::new()),
            },
            0,
            0
        ))
    );
    for bad in [
        &b"started"[..],
        b"exited exit x 0 mem 0 0",
        b"exited exit 1 3 mem 0 0",
        b"exited exit 1 0 files 1 0",
        b"exited exit 1 0 disk 0 0",
        b"failed fork 1",
        b"",
    ] {
        assert_eq!(parse(bad), None, "{bad:?}");
    }
}

#[test]
fn a_control_line_without_its_end_is_refused_once_past_the_longest_message() {
    // The widest message a keeper sends is taken whole.
    let widest = b"exited signal -2147483648 1 mem 1048576 1048576\n";
    let mut partial = widest.to_vec();
    partial.resize(widest.len() + (2 << 20), b'x');
    assert!(matches!(
        take(&mut partial),
        Ok(Some(Message::Exited { .. }))
    ));
    assert!(partial.is_empty());
    // A line that has not ended yet is waited for while it could still be a message...
    let mut partial = vec![b'7'; MAX_LINE];
    assert!(matches!(take(&mut partial), Ok(None)));
    // ...and refused past that, rather than gathered for ever (fuzz target keeper_control).
    partial.resize(1 << 20, b'7');
    let err = take(&mut partial).expect_err("a line past the longest message");
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
}
