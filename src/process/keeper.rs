//! Starting an attempt under its keeper, and reading what the keeper says.
//!
//! The keeper (`keeper.c`, built by `build.rs` and embedded here) is a small static
//! program that becomes the parent of an attempt's command and outlives the runner: it
//! copies the command's output into the attempt's files, waits for it without reaping it,
//! writes its outcome durably and reports on a socket (see [`crate::files`] for the files
//! and `keeper.c` for the protocol). It is started from memory, so an embedder installs
//! nothing: the program is written once per process into a sealed memfd and exec'ed by
//! its `/proc/<pid>/fd/<n>` path. Where that path cannot be exec'ed (a process that is not
//! dumpable owns no `/proc/<pid>/fd` it may open), the program is written once to an
//! owner-only file in a folder the caller names, and exec'ed from there.
//!
//! The keeper is spawned with `posix_spawn` (never a fork of the runner: it holds no copy
//! of the application's memory) in a session of its own, with only `/dev/null` as fds 0
//! to 2 and its end of the control socket as fd 3.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::hash::Hasher;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::libc;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use parking_lot::Mutex;

use super::child::ChildProc;
use super::proc;
use super::spawn::{
    FileActions, SpawnAttr, SpawnError, c_pointers, c_string, out_of_resources, posix_spawn,
    spawn_error,
};
use crate::files::Ended;

/// The keeper program, as built by `build.rs`.
static PROGRAM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/leasehold-keeper"));

/// The name the keeper runs under (its `argv[0]`, and the memfd's name).
pub(super) const NAME: &CStr = c"leasehold-keeper";

/// The line that releases a keeper (see [`Control::release`]).
const RELEASE: &[u8] = b"release\n";

/// How long a spawn waits for the keeper's first message before it gives up on it.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// The sealed memfd holding the program, made once per process.
static MEMFD: OnceLock<OwnedFd> = OnceLock::new();

/// Set once making the memfd failed for a reason that will not pass (no memfd, no /proc);
/// a lack of descriptors or memory is tried again at the next spawn.
static NO_MEMFD: AtomicBool = AtomicBool::new(false);

/// The memfd, made at the first call that can make it.
fn memfd() -> Option<&'static OwnedFd> {
    if let Some(fd) = MEMFD.get() {
        return Some(fd);
    }
    if NO_MEMFD.load(Ordering::Relaxed) {
        return None;
    }
    match make_memfd() {
        // Two threads may both make one; the loser's is closed.
        Ok(fd) => Some(MEMFD.get_or_init(|| fd)),
        Err(e) => {
            log::debug!("no memfd for the keeper ({e}); it runs from a file");
            if !out_of_resources(&e) {
                NO_MEMFD.store(true, Ordering::Relaxed);
            }
            None
        }
    }
}

/// The program's file in a caller's folder, once one was written (the fallback).
static FILE: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Makes the memfd: the program written into it, then sealed so that nobody can change
/// it, and reopened read-only (an exec refuses a file open for writing, ETXTBSY).
fn make_memfd() -> io::Result<OwnedFd> {
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // SAFETY: memfd_create reads the NUL-terminated name and returns a new fd or -1.
    let mut ret = unsafe { libc::memfd_create(NAME.as_ptr(), flags | libc::MFD_EXEC) };
    if ret < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
        // A kernel before 6.3 knows no MFD_EXEC (and makes every memfd executable).
        // SAFETY: as above.
        ret = unsafe { libc::memfd_create(NAME.as_ptr(), flags) };
    }
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor, so it is open and ours alone.
    let mut file = File::from(unsafe { OwnedFd::from_raw_fd(ret) });
    file.write_all(PROGRAM)?;
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: F_ADD_SEALS takes an int argument and touches no memory of ours.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let path = format!("/proc/self/fd/{}", file.as_raw_fd());
    let read_only = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)?;
    Ok(read_only.into())
}

/// The fallback: the program written once, as an owner-only file in `folder`, named
/// after its content so that another build's program is never taken for it.
fn program_file(folder: &Path) -> io::Result<PathBuf> {
    let mut known = FILE.lock();
    if let Some(path) = known.as_ref().filter(|p| p.starts_with(folder)) {
        return Ok(path.clone());
    }
    let mut hash = std::hash::DefaultHasher::new();
    hash.write(PROGRAM);
    let path = folder.join(format!(".leasehold-keeper-{:016x}", hash.finish()));
    let fresh = std::fs::metadata(&path)
        .is_ok_and(|m| m.len() == PROGRAM.len() as u64 && m.permissions().mode() & 0o777 == 0o700);
    if !fresh {
        // Written whole under a temporary name and renamed, so an exec never sees a
        // partial program; closed before any exec, so none fails with ETXTBSY for it.
        let tmp = folder.join(format!(".leasehold-keeper.tmp-{}", std::process::id()));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o700)
            .custom_flags(libc::O_CLOEXEC)
            .open(&tmp)?;
        file.write_all(PROGRAM)?;
        file.sync_all()?;
        drop(file);
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o700))?;
        std::fs::rename(&tmp, &path)?;
    }
    *known = Some(path.clone());
    Ok(path)
}

/// What to start under a keeper: the command, resolved and converted by the caller.
pub(super) struct KeeperSpec<'a> {
    /// The command's program as the job names it (for messages).
    pub name: &'a str,
    /// The attempt's run token; the keeper puts it in the command's environment only.
    pub token: &'a str,
    /// The attempt's folder (it exists); the keeper writes its files there.
    pub attempt_dir: &'a Path,
    /// The cap of each stream's file in bytes; 0 for none.
    pub cap: u64,
    /// How long the pipes may stay open after the command exits.
    pub drain: Duration,
    /// The command's working directory; the runner's if `None`.
    pub cwd: Option<&'a Path>,
    /// The resolved path of the program to exec.
    pub program: &'a CStr,
    /// The command's argv.
    pub argv: &'a [CString],
    /// The command's environment, without `LEASEHOLD_RUN_TOKEN`: a NULL-terminated array
    /// (made by `c_pointers`) of strings that outlive the call.
    pub envp: &'a [*mut libc::c_char],
    /// Where the program is written if it cannot be exec'ed from memory.
    pub fallback_dir: &'a Path,
}

/// A command started under its keeper.
#[derive(Debug)]
pub(super) struct Kept {
    /// The keeper: the runner's child. It exits after the runner releases the command
    /// (closes [`Control`]), with the command's status (128 + n for signal n).
    pub keeper: ChildProc,
    /// The keeper's start time in clock ticks since boot, when the spawn fell within one
    /// tick (see [`proc::start_time_between`]).
    pub keeper_start_time: Option<u64>,
    /// The runner's end of the control socket.
    pub control: Control,
    /// The command's pid, which leads its own process group.
    pub pid: i32,
}

/// What failed in the keeper before its command started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// The change to the working directory.
    Chdir,
    /// The exec of the program.
    Exec,
    /// The keeper's own preparations (its files, pipes, the fork).
    Setup,
}

/// One message from a keeper.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Message {
    /// The command runs, as this pid.
    Started {
        /// The command's pid.
        pid: i32,
    },
    /// The command could not start: what failed, and the OS error number.
    Failed {
        /// What failed.
        stage: Stage,
        /// The error number.
        errno: i32,
    },
    /// The keeper started in its probe mode runs (see [`probe`]).
    Ready,
    /// The command ended, and its outcome file was written (or is being retried).
    Exited {
        /// How it ended.
        ended: Ended,
        /// A pipe was still open when the drain time ran out: processes of the attempt
        /// outlive its main process, and the runner kills them before it releases.
        pipes_open: bool,
    },
}

impl Message {
    /// Parses one line (without its newline).
    fn parse(line: &[u8]) -> Option<Self> {
        let line = std::str::from_utf8(line).ok()?;
        let words: Vec<&str> = line.split(' ').collect();
        match words.as_slice() {
            ["ready"] => Some(Self::Ready),
            ["started", pid] => Some(Self::Started {
                pid: pid.parse().ok()?,
            }),
            ["failed", stage, errno] => Some(Self::Failed {
                stage: match *stage {
                    "chdir" => Stage::Chdir,
                    "exec" => Stage::Exec,
                    "setup" => Stage::Setup,
                    _ => return None,
                },
                errno: errno.parse().ok()?,
            }),
            ["exited", how, n, open] => Some(Self::Exited {
                ended: match *how {
                    "exit" => Ended::Exited(n.parse().ok()?),
                    "signal" => Ended::Signaled(n.parse().ok()?),
                    _ => return None,
                },
                pipes_open: match *open {
                    "0" => false,
                    "1" => true,
                    _ => return None,
                },
            }),
            _ => None,
        }
    }
}

/// What a read of the control socket found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Received {
    /// A whole message.
    Message(Message),
    /// Nothing whole yet.
    Pending,
    /// The keeper closed its end: it is gone.
    Closed,
}

/// The runner's end of a keeper's control socket (nonblocking, close-on-exec).
///
/// [`Control::release`] lets the command go once its end was taken from
/// [`Message::Exited`]: the keeper reaps it and exits without making the outcome file
/// durable, the runner's own commit being the record. Dropping it without a release is the
/// runner going away: the keeper goes on alone, and makes the outcome durable (file, then
/// folder) before it exits.
#[derive(Debug)]
pub(super) struct Control {
    /// The socket.
    fd: OwnedFd,
    /// Bytes read that do not make a whole line yet.
    partial: Vec<u8>,
    /// The keeper closed its end.
    closed: bool,
}

impl AsFd for Control {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Control {
    /// The next message if one has arrived, without blocking.
    ///
    /// # Errors
    ///
    /// A read error, or a line that is not a message (`InvalidData`).
    pub(super) fn next(&mut self) -> io::Result<Received> {
        loop {
            if let Some(end) = self.partial.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.partial.drain(..=end).collect();
                let line = &line[..line.len() - 1];
                return Message::parse(line).map(Received::Message).ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("keeper sent {:?}", String::from_utf8_lossy(line)),
                    )
                });
            }
            if self.closed {
                return Ok(Received::Closed);
            }
            let mut buf = [0u8; 256];
            match nix::unistd::read(&self.fd, &mut buf) {
                Ok(0) => self.closed = true,
                Ok(n) => self.partial.extend_from_slice(&buf[..n]),
                Err(nix::errno::Errno::EAGAIN) => return Ok(Received::Pending),
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Releases the command, whose end the runner has taken from [`Message::Exited`]: says
    /// `release` and closes the socket. The keeper then reaps the command and exits at once,
    /// without an fsync of the outcome file. A keeper that is gone already is no error: there
    /// is nobody left to release.
    pub(super) fn release(self) {
        let flags = libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT;
        // SAFETY: send reads RELEASE.len() bytes from RELEASE, a static that outlives the call,
        // on a descriptor this value owns; MSG_NOSIGNAL keeps a gone keeper from raising
        // SIGPIPE in the application.
        let sent = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                RELEASE.as_ptr().cast(),
                RELEASE.len(),
                flags,
            )
        };
        if sent < 0 {
            let e = io::Error::last_os_error();
            // A keeper that is gone already has nobody left to release.
            if !matches!(e.raw_os_error(), Some(libc::EPIPE | libc::ECONNRESET)) {
                log::warn!("releasing a keeper: {e}");
            }
        } else if sent.unsigned_abs() != RELEASE.len() {
            // The keeper only ever drains its end, so eight bytes go whole or not at all.
            log::warn!("releasing a keeper: {sent} of {} bytes sent", RELEASE.len());
        }
    }

    /// The next message, waiting for it until `deadline` (then `Pending`).
    ///
    /// # Errors
    ///
    /// As [`Control::next`], or a failed `poll`.
    pub(super) fn wait(&mut self, deadline: Instant) -> io::Result<Received> {
        loop {
            let received = self.next()?;
            let left = deadline.saturating_duration_since(Instant::now());
            if received != Received::Pending || left.is_zero() {
                return Ok(received);
            }
            let ms = u16::try_from(left.as_millis().saturating_add(1)).unwrap_or(u16::MAX);
            let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// A connected pair of stream sockets, both close-on-exec: the runner's end (made
/// nonblocking) and the keeper's end (moved above fd 3, where its file actions want it).
fn control_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: socketpair writes two descriptors into the array, which outlives the call.
    let ret = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned these two descriptors; nothing else owns them.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    fcntl(&ours, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    if theirs.as_raw_fd() > 3 {
        return Ok((ours, theirs));
    }
    let moved = fcntl(&theirs, FcntlArg::F_DUPFD_CLOEXEC(4))?;
    // SAFETY: fcntl just returned this new descriptor, so it is open and nothing else owns it.
    Ok((ours, unsafe { OwnedFd::from_raw_fd(moved) }))
}

/// Where the keeper program was exec'ed from (for the start-cost figures).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    /// The memfd, by its `/proc/<pid>/fd/<n>` path.
    Memory,
    /// The fallback file.
    File,
}

/// Spawns the keeper with `argv`, from memory unless that cannot work (or `force_file`),
/// then from the fallback file. Returns its pid and where it came from.
fn spawn_program(
    argv: &[*mut libc::c_char],
    envp: &[*mut libc::c_char],
    control: BorrowedFd<'_>,
    fallback_dir: &Path,
    force_file: bool,
) -> io::Result<(i32, Source)> {
    let mut attr = SpawnAttr::new_session()?;
    let mut actions = FileActions::for_keeper(control)?;
    if !force_file {
        if let Some(memfd) = memfd() {
            let path = format!("/proc/{}/fd/{}", std::process::id(), memfd.as_raw_fd());
            let path = c_string(path)?;
            match posix_spawn(&path, argv, envp, &mut actions, &mut attr) {
                Ok(pid) => return Ok((pid, Source::Memory)),
                // Not ours to open (EACCES: a process that is not dumpable), no /proc
                // (ENOENT), or an exec refused from memory: the file it is.
                Err(e) if !out_of_resources(&e) => {
                    log::debug!("keeper from memory: {e}; from a file instead");
                }
                Err(e) => return Err(context(e, "exec from memory")),
            }
        }
    }
    let path = program_file(fallback_dir).map_err(|e| {
        context(
            e,
            &format!("write its program into {}", fallback_dir.display()),
        )
    })?;
    let shown = path.display().to_string();
    let path = c_string(path.into_os_string().into_encoded_bytes())?;
    let mut tries = 0;
    loop {
        match posix_spawn(&path, argv, envp, &mut actions, &mut attr) {
            Ok(pid) => return Ok((pid, Source::File)),
            // A child another thread was spawning while the file was written may still
            // hold a copy of its (close-on-exec) write descriptor, for a moment.
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 10 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(context(e, &format!("exec {shown}"))),
        }
    }
}

/// `e` with what was being done in front of its message (its kind kept).
fn context(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Starts the keeper program as an attempt's keeper is started (from memory, else from its
/// file in `fallback_dir`), in its probe mode, and waits for it to say `ready`: a runner's
/// check at its start that its keepers can run here at all. A folder mounted `noexec`
/// (with no memfd to run from: `vm.memfd_noexec=2`, a process that is not dumpable), a
/// security policy or a keeper built for another machine would otherwise fail each attempt.
///
/// # Errors
///
/// What failed, as a lowercase fragment: the exec (with the path tried), a keeper that
/// ended or said nothing in [`START_TIMEOUT`], or something other than `ready`.
pub(crate) fn probe(fallback_dir: &Path) -> Result<(), String> {
    probe_from(fallback_dir, false)
}

/// Warns when this process is PID 1 of its PID namespace (a container's first process):
/// when it exits the kernel kills every process of the namespace, so its keepers, and the
/// attempts they keep, do not outlive it as they are meant to.
pub(crate) fn warn_if_namespace_init() {
    if std::process::id() == 1 {
        log::warn!(
            "this runner is PID 1 of its PID namespace (a container's first process): when it \
             exits, the kernel kills every process of the namespace, its keepers and their \
             jobs with them; run it under an init (`docker run --init`, tini, or \
             `shareProcessNamespace: true` in Kubernetes) so that its jobs outlive it \
             (docs/deploy.md)"
        );
    }
}

/// [`probe`]; `force_file` skips the memfd (for the tests).
fn probe_from(fallback_dir: &Path, force_file: bool) -> Result<(), String> {
    let (ours, theirs) = control_pair().map_err(|e| format!("its control socket: {e}"))?;
    let argv = c_pointers([NAME, c"probe"]);
    let envp = c_pointers([]);
    let (pid, source) = spawn_program(&argv, &envp, theirs.as_fd(), fallback_dir, force_file)
        .map_err(|e| format!("cannot start it: {e}"))?;
    drop(theirs);
    let keeper = ChildProc::new(pid);
    let mut control = Control {
        fd: ours,
        partial: Vec::new(),
        closed: false,
    };
    let said = control.wait(Instant::now() + START_TIMEOUT);
    let result = match said {
        Ok(Received::Message(Message::Ready)) => {
            log::debug!("keeper probe: ready, run from {source:?}");
            Ok(())
        }
        Ok(Received::Message(other)) => Err(format!("it said {other:?} instead of ready")),
        Ok(Received::Closed) => Err("it ended without saying ready".to_owned()),
        Ok(Received::Pending) => {
            keeper.kill();
            Err(format!("it said nothing in {}s", START_TIMEOUT.as_secs()))
        }
        Err(e) => Err(format!("its control socket: {e}")),
    };
    reap_soon(keeper);
    result
}

/// Starts `spec`'s command under a keeper and waits (at most 10 s) for it to start.
///
/// # Errors
///
/// The command could not start: the keeper could not be spawned, or it reported that the
/// working directory or the exec failed (with the message a direct spawn gives), or it
/// ended or said nothing in time (then it is killed).
#[cfg(test)]
pub(super) fn spawn_keeper(spec: &KeeperSpec<'_>) -> Result<Kept, SpawnError> {
    spawn_keeper_from(spec, false).map(|(kept, _)| kept)
}

/// [`spawn_keeper`], also saying where the program came from; `force_file` skips the
/// memfd (for the figures and the fallback's test).
pub(super) fn spawn_keeper_from(
    spec: &KeeperSpec<'_>,
    force_file: bool,
) -> Result<(Kept, Source), SpawnError> {
    let (name, cwd) = (spec.name, spec.cwd);
    let fail = |e: io::Error| SpawnError {
        message: spawn_error(name, cwd, &e),
        resources: out_of_resources(&e),
    };
    let keeper_failed = |what: &str| SpawnError {
        message: format!("spawn {name:?}: keeper {what}"),
        resources: true,
    };
    let drain_ms = u64::try_from(spec.drain.as_millis()).unwrap_or(u64::MAX);
    let words = [
        NAME.to_owned(),
        c_string(spec.token).map_err(fail)?,
        c_string(spec.attempt_dir.as_os_str().as_bytes()).map_err(fail)?,
        c_string(spec.cap.to_string()).map_err(fail)?,
        c_string(drain_ms.to_string()).map_err(fail)?,
        c_string(cwd.map_or(&[][..], |d| d.as_os_str().as_bytes())).map_err(fail)?,
        spec.program.to_owned(),
    ];
    let argv = c_pointers(
        words
            .iter()
            .map(CString::as_c_str)
            .chain(spec.argv.iter().map(CString::as_c_str)),
    );
    let (ours, theirs) = control_pair().map_err(fail)?;
    let before = proc::boot_clock_ns();
    // The keeper itself could not be exec'ed (a `noexec` folder, a policy, another
    // machine's program): the runner's fault, never the job's, whatever the errno says.
    let (pid, source) = spawn_program(
        &argv,
        spec.envp,
        theirs.as_fd(),
        spec.fallback_dir,
        force_file,
    )
    .map_err(|e| SpawnError {
        message: format!("spawn {name:?}: the runner cannot start its keeper: {e}"),
        resources: true,
    })?;
    let keeper_start_time = before
        .zip(proc::boot_clock_ns())
        .and_then(|(before, after)| proc::start_time_between(before, after));
    // The keeper has its copy; with ours closed, EOF means the keeper is gone.
    drop(theirs);
    let keeper = ChildProc::new(pid);
    let mut control = Control {
        fd: ours,
        partial: Vec::new(),
        closed: false,
    };
    let first = control.wait(Instant::now() + START_TIMEOUT);
    let error = match first {
        Ok(Received::Message(Message::Started { pid })) => {
            return Ok((
                Kept {
                    keeper,
                    keeper_start_time,
                    control,
                    pid,
                },
                source,
            ));
        }
        Ok(Received::Message(Message::Failed { stage, errno })) => {
            let e = io::Error::from_raw_os_error(errno);
            match (stage, cwd) {
                (Stage::Chdir, Some(dir)) => SpawnError {
                    message: format!("spawn {name:?}: working directory {dir:?}: {e}"),
                    resources: out_of_resources(&e),
                },
                (Stage::Exec | Stage::Chdir, _) => fail(e),
                (Stage::Setup, _) => SpawnError {
                    message: format!("spawn {name:?}: keeper: {e}"),
                    resources: true,
                },
            }
        }
        Ok(Received::Message(other)) => keeper_failed(&format!("began with {other:?}")),
        Ok(Received::Closed) => keeper_failed("ended before starting the command"),
        Ok(Received::Pending) => {
            keeper.kill();
            keeper_failed("did not start the command in time")
        }
        Err(e) => keeper_failed(&format!("control socket: {e}")),
    };
    reap_soon(keeper);
    Err(error)
}

/// Reaps a keeper that is exiting, waiting a second at most; one that takes longer is
/// killed and left to `ChildProc`'s background reaper.
fn reap_soon(mut keeper: ChildProc) {
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        match keeper.exited() {
            Ok(true) => {
                let _ = keeper.reap();
                return;
            }
            Ok(false) => std::thread::sleep(Duration::from_millis(1)),
            Err(_) => return,
        }
    }
}

/// The strace helper of the keeper's tests, shared with the integration tests.
#[cfg(test)]
#[path = "../../tests/util/strace.rs"]
mod strace;

#[cfg(test)]
mod tests;
