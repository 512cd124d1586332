//! The process's keeper, starting attempts under it, and reading what it says.
//!
//! The keeper (`keeper.c`, built by `build.rs` and embedded here) is a small static
//! program, one per runner process, that becomes the parent of every attempt's command and
//! outlives the runner: it keeps each command's output (in memory while it is short, else in
//! the attempt's files), waits for it without reaping it, and reports on a socket of the
//! attempt's own; when the runner is gone it journals what became of each attempt (see
//! `keeper.c` for the protocol and [`crate::files`] for the files). It is started from
//! memory, so an embedder installs nothing: the program is written once per process into a
//! sealed memfd and exec'ed by its `/proc/<pid>/fd/<n>` path. Where that path cannot be exec'ed (a process that is not
//! dumpable owns no `/proc/<pid>/fd` it may open), the program is written once to an
//! owner-only file in a folder the caller names, and exec'ed from there.
//!
//! The keeper is spawned with `posix_spawn` (never a fork of the runner: it holds no copy
//! of the application's memory) in a session of its own, with only `/dev/null` as fds 0
//! to 2, its end of the hub socket as fd 3 and an empty environment. Each attempt's
//! request goes over a stream socket of its own, whose keeper's end is passed over the hub
//! socket: the worker that runs the attempt reads its messages as it would a keeper's of
//! its own, and a runner that goes closes them all at once.

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

use super::cgroup::{self, Containment};
use super::child::ChildProc;
use super::proc;
use super::spawn::{
    Command, FileActions, Prepared, SpawnAttr, SpawnError, c_pointers, c_string, out_of_resources,
    posix_spawn, prepare, spawn_error,
};
use crate::files::Ended;
use crate::manners::Limits;

/// The keeper program, as built by `build.rs`.
static PROGRAM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/leasehold-keeper"));

/// The name the keeper runs under (its `argv[0]`, and the memfd's name).
pub(super) const NAME: &CStr = c"leasehold-keeper";

/// The line that releases a keeper (see [`Control::release`]).
const RELEASE: &[u8] = b"release\n";

/// How long a spawn waits for the keeper's first message before it gives up on it.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// How old an empty keeper node must be before a starting keeper's sweep removes it: a node
/// is empty between its keeper's `mkdir` and its move into it, a moment within its start.
const NODE_SETTLE: Duration = START_TIMEOUT;

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

/// What to start under the keeper: the command, resolved and converted by the caller.
pub(super) struct KeeperSpec<'a> {
    /// The command's program as the job names it (for messages).
    pub name: &'a str,
    /// The attempt's run token (also in `env`).
    pub token: &'a str,
    /// The attempt's folder, made by the keeper only if the output goes to files.
    pub attempt_dir: &'a Path,
    /// The attempts folder (`<db>-attempts`): the keeper's journal goes there, and its
    /// program if it cannot be exec'ed from memory.
    pub folder: &'a Path,
    /// The cap of each stream's file in bytes; 0 for none.
    pub cap: u64,
    /// How many bytes of each stream the keeper keeps in memory before it makes a file.
    pub mem: u64,
    /// How long the pipes may stay open after the command exits.
    pub drain: Duration,
    /// When the keeper stops the command unless the lease is renewed; `None`: never.
    pub fence: Option<crate::files::LeaseFence>,
    /// The command's working directory; the runner's if `None`.
    pub cwd: Option<&'a Path>,
    /// The resolved path of the program to exec.
    pub program: &'a CStr,
    /// The command's argv.
    pub argv: &'a [CString],
    /// The command's environment, with its run token.
    pub env: Vec<&'a CStr>,
    /// Its manners and caps.
    pub limits: Limits,
}

/// A command started under the keeper.
#[derive(Debug)]
pub(super) struct Kept {
    /// The keeper's pid.
    pub keeper: i32,
    /// The keeper's start time in clock ticks since boot, when known.
    pub keeper_start_time: Option<u64>,
    /// The runner's end of the attempt's control socket.
    pub control: Control,
    /// The command's pid, which leads its own process group.
    pub pid: i32,
    /// The attempt's cgroup, in the cgroup mode.
    pub cgroup: Option<PathBuf>,
}

/// What failed in the keeper before its command started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// The change to the working directory.
    Chdir,
    /// The exec of the program.
    Exec,
    /// The keeper's own preparations (the request, pipes, the fork).
    Setup,
}

/// Where the output of an ended command is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Output {
    /// All of it came with the message: stdout, then stderr.
    Memory(Vec<u8>, Vec<u8>),
    /// In the attempt's files.
    Files,
}

/// One message on an attempt's control socket.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// The command ended.
    Exited {
        /// How it ended.
        ended: Ended,
        /// A pipe was still open when the drain time ran out: processes of the attempt
        /// outlive its main process, and the runner kills them before it releases.
        pipes_open: bool,
        /// No descendant of any command the keeper started is alive (each would be its child
        /// or below one, the keeper being their subreaper): nothing of the attempt outlives
        /// its main process, and its group need not be looked for in /proc.
        alone: bool,
        /// Its output.
        output: Output,
    },
}

/// A message's line parsed: the message, and for `exited ... mem OUT ERR` the byte counts
/// that follow the line.
fn parse(line: &[u8]) -> Option<(Message, usize, usize)> {
    let line = std::str::from_utf8(line).ok()?;
    let words: Vec<&str> = line.split(' ').collect();
    let message = match words.as_slice() {
        ["started", pid] => Message::Started {
            pid: pid.parse().ok()?,
        },
        ["failed", stage, errno] => Message::Failed {
            stage: match *stage {
                "chdir" => Stage::Chdir,
                "exec" => Stage::Exec,
                "setup" => Stage::Setup,
                _ => return None,
            },
            errno: errno.parse().ok()?,
        },
        ["exited", how, n, open, place, out, err] => {
            let (out, err): (usize, usize) = (out.parse().ok()?, err.parse().ok()?);
            let output = match *place {
                "mem" => Output::Memory(Vec::new(), Vec::new()),
                "files" if out == 0 && err == 0 => Output::Files,
                _ => return None,
            };
            let message = Message::Exited {
                ended: match *how {
                    "exit" => Ended::Exited(n.parse().ok()?),
                    "signal" => Ended::Signaled(n.parse().ok()?),
                    _ => return None,
                },
                pipes_open: *open == "1",
                alone: match *open {
                    "0" | "1" => false,
                    "2" => true,
                    _ => return None,
                },
                output,
            };
            return Some((message, out, err));
        }
        _ => return None,
    };
    Some((message, 0, 0))
}

/// A whole message at the front of `partial` (bytes read from a control socket), taken out
/// of it.
///
/// # Errors
///
/// A line that is not a message, or one that announces more output than a message carries
/// (`InvalidData`).
fn take(partial: &mut Vec<u8>) -> io::Result<Option<Message>> {
    let Some(end) = partial.iter().take(MAX_LINE + 1).position(|&b| b == b'\n') else {
        // Without this bound a keeper that never ends its line (a bug, a stray writer on
        // the socket) would have the runner gather its bytes for ever.
        if partial.len() > MAX_LINE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("keeper sent {} bytes without a line end", partial.len()),
            ));
        }
        return Ok(None);
    };
    let (message, out, err) = parse(&partial[..end]).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("keeper sent {:?}", String::from_utf8_lossy(&partial[..end])),
        )
    })?;
    if out.saturating_add(err) > MAX_MESSAGE_OUTPUT {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("keeper sent {out} + {err} bytes of output in one message"),
        ));
    }
    let whole = end + 1 + out + err;
    if partial.len() < whole {
        return Ok(None);
    }
    let mut bytes: Vec<u8> = partial.drain(..whole).skip(end + 1).collect();
    let message = match message {
        Message::Exited {
            ended,
            pipes_open,
            alone,
            output: Output::Memory(..),
        } => {
            let err_bytes = bytes.split_off(out);
            Message::Exited {
                ended,
                pipes_open,
                alone,
                output: Output::Memory(bytes, err_bytes),
            }
        }
        other => other,
    };
    Ok(Some(message))
}

/// Every message that the bytes `received` from a control socket hold, taken as the runner
/// takes them: for the fuzz target of the control lines (feature `fuzzing`).
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_control(received: &[u8]) {
    let mut partial = received.to_vec();
    while let Ok(Some(message)) = take(&mut partial) {
        if let Message::Exited {
            output: Output::Memory(out, err),
            ..
        } = message
        {
            assert!(
                out.len() + err.len() <= MAX_MESSAGE_OUTPUT,
                "output past the bound"
            );
        }
    }
}

/// What a read of the control socket found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Received {
    /// A whole message.
    Message(Message),
    /// Nothing whole yet.
    Pending,
    /// The keeper closed its end: the attempt is no longer kept.
    Closed,
}

/// The longest line a keeper sends: `exited signal N 1 files 0 0` and `exited exit N 1 mem OUT
/// ERR` with the widest numbers are under 80 bytes.
const MAX_LINE: usize = 128;

/// The most output one `exited` message may carry (the keeper keeps at most 1 MiB a stream).
const MAX_MESSAGE_OUTPUT: usize = 2 << 20;

/// The runner's end of an attempt's control socket (nonblocking, close-on-exec).
///
/// [`Control::release`] lets the command go once the runner's commit of its ending is
/// done: the keeper reaps it and forgets the attempt. Dropping it without a release is the
/// runner going away: the keeper goes on alone, and journals the outcome durably.
#[derive(Debug)]
pub(super) struct Control {
    /// The socket.
    fd: OwnedFd,
    /// Bytes read that do not make a whole message yet.
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
    fn new(fd: OwnedFd) -> Self {
        Self {
            fd,
            partial: Vec::new(),
            closed: false,
        }
    }

    /// The next message if one has arrived, without blocking.
    ///
    /// # Errors
    ///
    /// A read error, or a line that is not a message (`InvalidData`).
    pub(super) fn next(&mut self) -> io::Result<Received> {
        loop {
            if let Some(message) = take(&mut self.partial)? {
                return Ok(Received::Message(message));
            }
            if self.closed {
                return Ok(Received::Closed);
            }
            let mut buf = [0u8; 16 * 1024];
            match nix::unistd::read(&self.fd, &mut buf) {
                Ok(0) => self.closed = true,
                Ok(n) => self.partial.extend_from_slice(&buf[..n]),
                Err(nix::errno::Errno::EAGAIN) => return Ok(Received::Pending),
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Releases the command, whose ending the runner has committed: says `release` and
    /// closes the socket. The keeper then reaps the command and forgets it. A keeper that is
    /// gone already is no error: there is nobody left to release.
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
            if !matches!(e.raw_os_error(), Some(libc::EPIPE | libc::ECONNRESET)) {
                log::warn!("releasing an attempt to its keeper: {e}");
            }
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

    /// Writes all of `bytes` (the request), waiting for room until `deadline`.
    fn write_all(&self, mut bytes: &[u8], deadline: Instant) -> io::Result<()> {
        while !bytes.is_empty() {
            // SAFETY: send reads bytes.len() bytes from the slice, which outlives the call.
            let sent = unsafe {
                libc::send(
                    self.fd.as_raw_fd(),
                    bytes.as_ptr().cast(),
                    bytes.len(),
                    libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                )
            };
            if sent >= 0 {
                bytes = &bytes[sent.unsigned_abs()..];
                continue;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => {}
                Some(libc::EAGAIN) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "keeper is not reading",
                        ));
                    }
                    let ms = u16::try_from(left.as_millis().saturating_add(1)).unwrap_or(u16::MAX);
                    let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLOUT)];
                    match poll(&mut fds, PollTimeout::from(ms)) {
                        Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                _ => return Err(e),
            }
        }
        Ok(())
    }
}

/// A connected pair of sockets of `kind`, both close-on-exec: the runner's end (made
/// nonblocking unless `blocking`) and the other (moved above fd 3, where the keeper's file
/// actions want its end of the hub socket).
fn socket_pair(kind: libc::c_int, blocking: bool) -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: socketpair writes two descriptors into the array, which outlives the call.
    let ret = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            kind | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned these two descriptors; nothing else owns them.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    if !blocking {
        fcntl(&ours, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    }
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

/// The process's keeper, as this process started it.
#[derive(Debug)]
pub(super) struct Hub {
    /// The keeper: this process's child.
    child: Mutex<ChildProc>,
    /// Its pid.
    pub pid: i32,
    /// Its start time in clock ticks since boot, when it could be read.
    pub start_time: Option<u64>,
    /// The hub socket (blocking, SOCK_SEQPACKET).
    socket: OwnedFd,
    /// Where its program was exec'ed from.
    pub source: Source,
    /// How its attempts are contained: in cgroups of their own, or by process groups.
    pub containment: Containment,
}

/// The keeper this process started last; another is started when it is gone.
static HUB: Mutex<Option<std::sync::Arc<Hub>>> = Mutex::new(None);

/// Keepers replaced while alive (only where a test asks for a keeper from its file), never
/// dropped: a dropped [`Hub`] kills its keeper.
static RETIRED: Mutex<Vec<std::sync::Arc<Hub>>> = Mutex::new(Vec::new());

impl Hub {
    /// Whether the keeper still runs (it is this process's child, so its exit is seen
    /// without a race on its pid).
    fn alive(&self) -> bool {
        matches!(self.child.lock().exited(), Ok(false))
    }

    /// Starts a keeper and waits for its `ready`.
    fn start(fallback_dir: &Path, force_file: bool) -> Result<Self, String> {
        let (ours, theirs) =
            socket_pair(libc::SOCK_SEQPACKET, true).map_err(|e| format!("its hub socket: {e}"))?;
        // Where the cgroup v2 folder is known, the keeper tries the cgroup mode there; the
        // empty nodes of keepers killed before they could remove theirs go first.
        let base = cgroup::base();
        if let Ok(base) = &base {
            // A node whose keeper leaf is empty is a dead keeper's; one made in the last
            // seconds may be a keeper's that is moving into it.
            cgroup::sweep(base, NODE_SETTLE);
        }
        let base_arg = base
            .as_ref()
            .ok()
            .and_then(|b| CString::new(b.as_os_str().as_bytes()).ok());
        let argv = match &base_arg {
            Some(b) => c_pointers([NAME, c"serve", b.as_c_str()]),
            None => c_pointers([NAME, c"serve"]),
        };
        let envp = c_pointers([]);
        let before = proc::boot_clock_ns();
        let (pid, source) = spawn_program(&argv, &envp, theirs.as_fd(), fallback_dir, force_file)
            .map_err(|e| format!("cannot start it: {e}"))?;
        let start_time = before
            .zip(proc::boot_clock_ns())
            .and_then(|(before, after)| proc::start_time_between(before, after))
            .or_else(|| proc::start_time(pid));
        drop(theirs);
        let mut child = ChildProc::new(pid);
        let mut fds = [PollFd::new(ours.as_fd(), PollFlags::POLLIN)];
        let ms = u16::try_from(START_TIMEOUT.as_millis()).unwrap_or(u16::MAX);
        let said = match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) => Err(format!("it said nothing in {}s", START_TIMEOUT.as_secs())),
            Ok(_) => {
                let mut buf = [0u8; 64];
                match nix::unistd::read(&ours, &mut buf) {
                    Ok(0) => Err("it ended without saying ready".to_owned()),
                    Ok(n) => containment(&buf[..n], &base, pid).ok_or_else(|| {
                        format!(
                            "it said {:?} instead of ready",
                            String::from_utf8_lossy(&buf[..n])
                        )
                    }),
                    Err(e) => Err(format!("its hub socket: {e}")),
                }
            }
            Err(e) => Err(format!("its hub socket: {e}")),
        };
        let containment = match said {
            Ok(c) => c,
            Err(e) => {
                // Killed (it may hang) and reaped in the background.
                drop(child);
                return Err(e);
            }
        };
        let _ = child.exited();
        log::debug!(
            "keeper pid {pid} runs, from {source:?}; attempts contained by {}",
            containment.describe()
        );
        Ok(Self {
            child: Mutex::new(child),
            pid,
            start_time,
            socket: ours,
            source,
            containment,
        })
    }

    /// Sends one datagram, with `fd` passed along if given.
    fn send(&self, text: &[u8], fd: Option<BorrowedFd<'_>>, wait: bool) -> io::Result<()> {
        let mut iov = libc::iovec {
            iov_base: text.as_ptr().cast_mut().cast(),
            iov_len: text.len(),
        };
        // Room for one cmsghdr carrying one int, aligned as the kernel wants it.
        let mut space = [0u64; 8];
        // SAFETY: zeroed is a valid msghdr (pointers null, lengths zero).
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        if let Some(fd) = fd {
            // SAFETY: CMSG_SPACE computes a size from an int; no memory is touched.
            let len = unsafe { libc::CMSG_SPACE(4) } as usize;
            debug_assert!(len <= std::mem::size_of_val(&space));
            msg.msg_control = space.as_mut_ptr().cast();
            msg.msg_controllen = len as _;
            // SAFETY: msg_control points to `space`, large enough for one header and an int
            // (checked above), so CMSG_FIRSTHDR returns a pointer inside it, and CMSG_DATA a
            // pointer to its int, written unaligned.
            unsafe {
                let header = libc::CMSG_FIRSTHDR(&raw const msg);
                (*header).cmsg_level = libc::SOL_SOCKET;
                (*header).cmsg_type = libc::SCM_RIGHTS;
                (*header).cmsg_len = libc::CMSG_LEN(4) as _;
                std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<i32>(), fd.as_raw_fd());
            }
        }
        let flags = libc::MSG_NOSIGNAL | if wait { 0 } else { libc::MSG_DONTWAIT };
        loop {
            // SAFETY: msg points to the iovec and control buffer above, which outlive the call.
            let sent = unsafe { libc::sendmsg(self.socket.as_raw_fd(), &raw const msg, flags) };
            if sent >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(e);
            }
        }
    }
}

/// The containment a keeper's `ready` line says it set up, given the cgroup folder it was
/// handed (or why there was none); `None` for a line that is no `ready`.
fn containment(line: &[u8], base: &Result<PathBuf, String>, pid: i32) -> Option<Containment> {
    let line = std::str::from_utf8(line).ok()?;
    match (line.split(' ').collect::<Vec<_>>().as_slice(), base) {
        (["ready"], Err(why)) => Some(Containment::Groups(why.clone())),
        (["ready", "cgroup"], Ok(base)) => Some(Containment::Cgroup(
            base.join(format!("leasehold-keeper-{pid}")),
        )),
        (["ready", "groups", errno], Ok(base)) => {
            let e = io::Error::from_raw_os_error(errno.parse().ok()?);
            Some(Containment::Groups(format!(
                "cannot make a cgroup in {}: {e}",
                base.display()
            )))
        }
        _ => None,
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        // A dropped hub kills its keeper (its attempts, if any, are then lost and reclaimed):
        // in the cgroup mode, killed and reaped here so that its node's empty cgroups go too.
        if let Containment::Cgroup(node) = &self.containment {
            let mut child = self.child.lock();
            child.kill();
            if let Err(e) = child.reap() {
                log::debug!("reaping keeper pid {}: {e}", self.pid);
            }
            cgroup::remove_node(node);
        }
    }
}

/// The process's keeper, started (again) if it is not running.
fn hub(fallback_dir: &Path, force_file: bool) -> Result<std::sync::Arc<Hub>, String> {
    let mut current = HUB.lock();
    if let Some(hub) = current.as_ref()
        && hub.alive()
        && (!force_file || hub.source == Source::File)
    {
        return Ok(std::sync::Arc::clone(hub));
    }
    if let Some(old) = current.take()
        && old.alive()
    {
        // Replaced for a test that wants the file: kept (dropping it would kill it and the
        // attempts it holds), it serves them to their end.
        log::debug!("keeper pid {} replaced", old.pid);
        RETIRED.lock().push(old);
    }
    let hub = std::sync::Arc::new(Hub::start(fallback_dir, force_file)?);
    *current = Some(std::sync::Arc::clone(&hub));
    Ok(hub)
}

/// Starts the process's keeper (from memory, else from its file in `fallback_dir`) if it
/// does not run yet, and waits for it to say `ready`: a runner's check at its start that
/// keepers can run here at all. A folder mounted `noexec` (with no memfd to run from:
/// `vm.memfd_noexec=2`, a process that is not dumpable), a security policy or a keeper built
/// for another machine would otherwise fail each attempt.
///
/// # Errors
///
/// What failed, as a lowercase fragment: the exec (with the path tried), a keeper that
/// ended or said nothing in [`START_TIMEOUT`], or something other than `ready`. Otherwise,
/// how its attempts are contained.
pub(crate) fn probe(fallback_dir: &Path) -> Result<Containment, String> {
    hub(fallback_dir, false).map(|h| h.containment.clone())
}

/// Moves the lease fence of the attempt with `token` (a renewal), or disarms it for good
/// with `None` (the runner leaves the attempt running). Never blocks: a keeper too busy to
/// take the message keeps the earlier times, which stop the command sooner, not later.
pub(crate) fn move_fence(token: &str, fence: Option<crate::files::LeaseFence>) {
    let Some(hub) = HUB.lock().clone() else {
        return;
    };
    let text = lease_datagram(token, fence);
    if let Err(e) = hub.send(text.as_bytes(), None, false) {
        log::debug!("moving the lease fence of attempt {token}: {e}");
    }
}

/// The hub datagram that moves the fence of the attempt with `token` (`None`: disarms it).
pub(crate) fn lease_datagram(token: &str, fence: Option<crate::files::LeaseFence>) -> String {
    let (term, kill) = fence.map_or((0, 0), |f| (f.term_at, f.kill_at));
    format!("lease {token} {term} {kill}")
}

/// Warns when this process is PID 1 of its PID namespace (a container's first process):
/// when it exits the kernel kills every process of the namespace, so its keeper, and the
/// attempts it keeps, do not outlive it as they are meant to.
pub(crate) fn warn_if_namespace_init() {
    if std::process::id() == 1 {
        log::warn!(
            "this runner is PID 1 of its PID namespace (a container's first process): when it \
             exits, the kernel kills every process of the namespace, its keeper and their \
             jobs with them; run it under an init (`docker run --init`, tini, or \
             `shareProcessNamespace: true` in Kubernetes) so that its jobs outlive it \
             (docs/deploy.md)"
        );
    }
}

/// The request's bytes: its length, then its fields (see `keeper.c`).
fn request(spec: &KeeperSpec<'_>, journal: &Path) -> io::Result<Vec<u8>> {
    let drain_ms = u64::try_from(spec.drain.as_millis()).unwrap_or(u64::MAX);
    let (term, kill) = spec.fence.map_or((0, 0), |f| (f.term_at, f.kill_at));
    let numbers = [spec.cap, spec.mem, drain_ms, term, kill].map(|n| n.to_string());
    let mut body: Vec<u8> = Vec::with_capacity(4096);
    let mut field = |bytes: &[u8]| -> io::Result<()> {
        if bytes.contains(&0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "nul byte found in provided data",
            ));
        }
        body.extend_from_slice(bytes);
        body.push(0);
        Ok(())
    };
    field(spec.token.as_bytes())?;
    field(spec.attempt_dir.as_os_str().as_bytes())?;
    field(journal.as_os_str().as_bytes())?;
    for n in &numbers {
        field(n.as_bytes())?;
    }
    for n in limit_fields(&spec.limits) {
        field(n.as_bytes())?;
    }
    field(spec.cwd.map_or(&[][..], |d| d.as_os_str().as_bytes()))?;
    field(spec.program.to_bytes())?;
    field(spec.argv.len().to_string().as_bytes())?;
    for a in spec.argv {
        field(a.to_bytes())?;
    }
    for e in &spec.env {
        field(e.to_bytes())?;
    }
    let len = u32::try_from(body.len()).map_err(|_| io::Error::from_raw_os_error(libc::E2BIG))?;
    let mut bytes = len.to_le_bytes().to_vec();
    bytes.append(&mut body);
    Ok(bytes)
}

/// The request's NICE, IOPRIO, MEM_MAX, PIDS_MAX and CPU_WEIGHT fields, each empty for none.
fn limit_fields(l: &Limits) -> [String; 5] {
    let text = |v: Option<String>| v.unwrap_or_default();
    [
        text(l.nice.map(|n| n.to_string())),
        text(l.io_class.map(|c| c.ioprio().to_string())),
        text(l.memory_max.map(|n| n.to_string())),
        text(l.pids_max.map(|n| n.to_string())),
        text(l.cpu_weight.map(|n| n.to_string())),
    ]
}

/// What the keeper's program takes to exec a command with manners or caps (its `exec`
/// mode, for the runner's own spawn): the program's path in memory and the arguments before
/// the command's; `None` where the program cannot run from memory.
pub(super) fn exec_wrapper(l: &Limits) -> Option<(CString, Vec<CString>)> {
    let memfd = memfd()?;
    let path = format!("/proc/{}/fd/{}", std::process::id(), memfd.as_raw_fd());
    let [nice, ioprio, mem, pids, _] = limit_fields(l);
    let args = [
        NAME.to_bytes(),
        b"exec",
        nice.as_bytes(),
        ioprio.as_bytes(),
        mem.as_bytes(),
        pids.as_bytes(),
    ]
    .into_iter()
    .map(|a| CString::new(a).ok())
    .collect::<Option<Vec<_>>>()?;
    Some((CString::new(path).ok()?, args))
}

/// Starts the attempt's main process (`program` is `cmd.argv[0]`) under the process's
/// keeper, which keeps up to `mem` bytes of each stream in memory
/// and writes the rest into `attempt_dir` (made by the keeper when it must be). The program
/// is resolved, the working directory checked and the environment built as [`spawn`](super::spawn::spawn) does.
/// `cap` is each stream's cap in bytes (0: none); `drain` how long the pipes may stay open
/// after the command exits. The error's message is the text of
/// [`Exit::SpawnFailed`](super::attempt::Exit::SpawnFailed), as [`spawn`](super::spawn::spawn)'s is.
pub(super) fn spawn_kept(
    cmd: &Command<'_>,
    program: &str,
    attempt_dir: &Path,
    output: (u64, u64),
    drain: Duration,
) -> Result<Kept, SpawnError> {
    spawn_kept_from(cmd, program, attempt_dir, output, drain, false).map(|(kept, _)| kept)
}

/// [`spawn_kept`], also saying where the keeper's program came from;
/// `force_file` starts a keeper from its file (for the figures and the fallback's test).
pub(super) fn spawn_kept_from(
    cmd: &Command<'_>,
    program: &str,
    attempt_dir: &Path,
    (cap, mem): (u64, u64),
    drain: Duration,
    force_file: bool,
) -> Result<(Kept, Source), SpawnError> {
    let cwd = cmd.cwd;
    let Prepared { env, path, argv } = prepare(cmd, program)?;
    spawn_keeper_from(
        &KeeperSpec {
            name: program,
            token: cmd.run_token,
            attempt_dir,
            folder: crate::files::folder_of(attempt_dir),
            cap,
            mem,
            drain,
            fence: cmd.fence,
            cwd,
            program: &path,
            argv: &argv,
            env: env.entries(),
            limits: cmd.limits,
        },
        force_file,
    )
}

/// Starts `spec`'s command under the process's keeper (started first if it is not running)
/// and waits (at most 10 s) for it to start.
///
/// # Errors
///
/// The command could not start: the keeper could not be started (the runner's fault), or
/// it reported that the working directory or the exec failed (with the message a direct
/// spawn gives), or it said nothing in time (then whatever of the command started is torn
/// down by its token).
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
    // The keeper itself could not be exec'ed (a `noexec` folder, a policy, another
    // machine's program): the runner's fault, never the job's, whatever the errno says.
    let hub = hub(spec.folder, force_file).map_err(|e| SpawnError {
        message: format!("spawn {name:?}: the runner cannot start its keeper: {e}"),
        resources: true,
    })?;
    let journal = crate::files::journal_path(spec.folder, hub.pid, hub.start_time);
    let request = request(spec, &journal).map_err(fail)?;
    let (ours, theirs) = socket_pair(libc::SOCK_STREAM, false).map_err(fail)?;
    hub.send(b"attempt", Some(theirs.as_fd()), true)
        .map_err(|e| keeper_failed(&format!("hub socket: {e}")))?;
    drop(theirs);
    let mut control = Control::new(ours);
    let deadline = Instant::now() + START_TIMEOUT;
    if let Err(e) = control.write_all(&request, deadline) {
        return Err(keeper_failed(&format!("request: {e}")));
    }
    let error = match control.wait(deadline) {
        Ok(Received::Message(Message::Started { pid })) => {
            return Ok((
                Kept {
                    keeper: hub.pid,
                    keeper_start_time: hub.start_time,
                    control,
                    pid,
                    cgroup: hub.containment.attempt(spec.token),
                },
                hub.source,
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
            // The command may run without anyone having heard of it: it goes, by its token,
            // before the job is given back.
            drop(control);
            let report = super::teardown(
                &super::AttemptIdentity {
                    pgid: None,
                    start_time: None,
                    token: spec.token.to_owned(),
                },
                Duration::from_secs(1),
            );
            log::warn!("a keeper start timed out: {}", report.describe());
            return Err(keeper_failed("did not start the command in time"));
        }
        Err(e) => keeper_failed(&format!("control socket: {e}")),
    };
    Err(error)
}

#[cfg(any(test, feature = "fuzzing"))]
pub(crate) mod decode;
#[cfg(test)]
mod tests;
