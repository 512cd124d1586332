//! Supervises one attempt of a job: spawn it in its own process group, collect
//! the tails of its output, enforce its time limits, honour stop requests, and
//! make sure nothing of it is left running when [`run`] returns.
//!
//! Supervision is a single `poll(2)` loop in the calling thread over the
//! stdout and stderr pipes, a pidfd for the main process and the stop
//! handle's wake-up eventfd, with the nearest deadline as the timeout: a job
//! that sleeps costs its supervisor no CPU.
//!
//! The child must start clean whatever state the runner's thread is in: an
//! empty signal mask, no ignored signals and only fds 0, 1 and 2. It is
//! started with glibc's `posix_spawn` (a vfork-like clone: no page tables are
//! copied and the runner's other threads take no copy-on-write faults, as
//! they do after a `fork`), whose attributes and file actions set exactly
//! that up (see [`SpawnAttr`] and [`FileActions`]). std's `Command` cannot do
//! it without a `pre_exec` hook, which forces `fork`: it passes the spawning
//! thread's mask on, and glibc's `posix_spawn` leaves its internal signals 32
//! and 33 ignored unless they are in the SETSIGDEF set.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::{CStr, CString, OsStr, OsString};
use std::fs::File;
use std::io::{self, Read};
use std::mem::{self, MaybeUninit};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::libc;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::Signal;
use nix::unistd::AccessFlags;

use super::proc::{self as process, ProcInfo, RUN_TOKEN_VAR};

/// The environment variable carrying the job id into the attempt.
pub(crate) const JOB_ID_VAR: &str = "LEASEHOLD_JOB_ID";

/// While waiting for killed processes to die we must poll `/proc`, since
/// only the main process has a pidfd; this is the interval.
const KILL_POLL_INTERVAL: Duration = Duration::from_millis(20);

/// After SIGKILL, how long to wait for the kernel to finish the kill before
/// giving up on waiting (only a process in uninterruptible sleep is slower).
const AFTER_KILL_WAIT: Duration = Duration::from_secs(2);

/// If a pidfd cannot be had, the loop falls back to checking the child this
/// often, which is the only periodic wake-up in that (unexpected) case.
const NO_PIDFD_INTERVAL: Duration = Duration::from_millis(50);

/// How much one wake-up reads from one pipe before giving the other pipe and
/// the deadlines a turn; poll is level-triggered so the rest is read next.
const READ_BUDGET: usize = 1 << 20;

/// The highest signal number (`_NSIG - 1`) on the 64-signal architectures
/// leasehold supports (x86_64, aarch64 and the other generic ones).
const MAX_SIGNAL: usize = 64;

// Every signal up to MAX_SIGNAL has its bit inside a sigset_t (glibc's has
// 1024 bits); `all_signals` relies on it.
const _: () = assert!(8 * mem::size_of::<libc::sigset_t>() >= MAX_SIGNAL);

/// The search path `execvp` uses when PATH is not set (glibc's `_CS_PATH`).
const DEFAULT_SEARCH_PATH: &str = "/bin:/usr/bin";

/// The shell `execvp` hands a file the kernel cannot execute (`ENOEXEC`: no
/// `#!` line) to, as `/bin/sh FILE ARGS...`; done here too, as std did.
const SCRIPT_SHELL: &CStr = c"/bin/sh";

/// The flags of [`SpawnAttr`]. The values are 2, 4 and 8, so the narrowing
/// to the `short` that `posix_spawnattr_setflags` takes is lossless.
const SPAWN_FLAGS: libc::c_short = (libc::POSIX_SPAWN_SETPGROUP
    | libc::POSIX_SPAWN_SETSIGMASK
    | libc::POSIX_SPAWN_SETSIGDEF) as libc::c_short;

/// Turns the return value of a `posix_spawn*` function (0 or an error
/// number; they do not set `errno`) into a result.
fn spawn_check(ret: libc::c_int) -> io::Result<()> {
    if ret == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(ret))
    }
}

/// The empty signal set.
fn empty_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is an array of integers, for which all zeros is a
    // valid value; it is the empty set (exactly what sigemptyset stores).
    unsafe { mem::zeroed() }
}

/// The set of every signal 1 to [`MAX_SIGNAL`], glibc's internal 32 and 33
/// included: `sigfillset` leaves those two out and `sigaddset` refuses them,
/// so the bits are set directly.
fn all_signals() -> libc::sigset_t {
    let mut set = empty_signals();
    let word_bits = 8 * mem::size_of::<libc::c_ulong>();
    let words = (&raw mut set).cast::<libc::c_ulong>();
    for bit in 0..MAX_SIGNAL {
        // SAFETY: glibc's sigset_t is `unsigned long __val[1024 / ULONG_WIDTH]`
        // and holds signal `sig` as bit `(sig - 1) % ULONG_WIDTH` of word
        // `(sig - 1) / ULONG_WIDTH` (its `__sigmask` and `__sigword`). The
        // libc crate mirrors that layout but keeps the array private, so its
        // words are written through a pointer to the set, which is aligned
        // for them; the assertion on the set's size keeps every word written
        // (64 bits' worth) inside the set.
        unsafe { *words.add(bit / word_bits) |= 1 << (bit % word_bits) };
    }
    set
}

/// A `posix_spawnattr_t` that makes the child start clean; destroyed on drop.
/// Boxed because POSIX does not say an initialised one may be moved.
struct SpawnAttr(Box<MaybeUninit<libc::posix_spawnattr_t>>);

impl SpawnAttr {
    /// Sets:
    ///
    /// - SETPGROUP with group 0: a new process group per attempt (pgid ==
    ///   pid), so the attempt and all its descendants can be signalled
    ///   together;
    /// - SETSIGMASK with the empty set: the spawning thread's mask is not
    ///   inherited (a runner that blocks SIGTERM to handle it synchronously
    ///   would otherwise start jobs that cannot be terminated);
    /// - SETSIGDEF with every signal: glibc's child resets each signal that
    ///   is a member (tested bit by bit, so 32 and 33 count too) to SIG_DFL,
    ///   so neither signals the runner ignores nor glibc's internal ones are
    ///   ignored in the job.
    fn new() -> io::Result<Self> {
        let mut attr = Box::new(MaybeUninit::uninit());
        // SAFETY: init initialises the object the pointer points to, which
        // is on the heap and never moves.
        spawn_check(unsafe { libc::posix_spawnattr_init(attr.as_mut_ptr()) })?;
        // From here on, dropping `this` destroys the object.
        let mut this = Self(attr);
        let (empty, all) = (empty_signals(), all_signals());
        let attr = this.0.as_mut_ptr();
        // SAFETY: `attr` points to the initialised object; the setters only
        // write into it, and copy the signal sets, keeping no pointer to them.
        unsafe {
            spawn_check(libc::posix_spawnattr_setflags(attr, SPAWN_FLAGS))?;
            spawn_check(libc::posix_spawnattr_setpgroup(attr, 0))?;
            spawn_check(libc::posix_spawnattr_setsigmask(attr, &raw const empty))?;
            spawn_check(libc::posix_spawnattr_setsigdefault(attr, &raw const all))?;
        }
        Ok(this)
    }
}

impl Drop for SpawnAttr {
    fn drop(&mut self) {
        // SAFETY: a SpawnAttr exists only once its object was initialised,
        // and it is destroyed only here, once.
        unsafe { libc::posix_spawnattr_destroy(self.0.as_mut_ptr()) };
    }
}

/// A `posix_spawn_file_actions_t` giving the child exactly fds 0, 1 and 2
/// (and its working directory); destroyed on drop. Boxed like [`SpawnAttr`].
struct FileActions(Box<MaybeUninit<libc::posix_spawn_file_actions_t>>);

impl FileActions {
    /// In order: `/dev/null` read-only as fd 0, `stdout` dup'ed to 1 and
    /// `stderr` to 2, every fd from 3 up closed (so none survives, even one
    /// the runner inherited or opened without close-on-exec), then the
    /// change to `cwd` if given. `stdout` and `stderr` must be above 2, or
    /// the earlier actions would replace them first.
    fn new(stdout: BorrowedFd<'_>, stderr: BorrowedFd<'_>, cwd: Option<&CStr>) -> io::Result<Self> {
        let mut actions = Box::new(MaybeUninit::uninit());
        // SAFETY: init initialises the object the pointer points to, which
        // is on the heap and never moves.
        spawn_check(unsafe { libc::posix_spawn_file_actions_init(actions.as_mut_ptr()) })?;
        // From here on, dropping `this` destroys the object.
        let mut this = Self(actions);
        let fa = this.0.as_mut_ptr();
        // SAFETY: `fa` points to the initialised object. The add functions
        // take integers and NUL-terminated strings, which glibc copies (the
        // borrowed ones outlive the calls anyway); the descriptors are only
        // used by the child.
        unsafe {
            spawn_check(libc::posix_spawn_file_actions_addopen(
                fa,
                0,
                c"/dev/null".as_ptr(),
                libc::O_RDONLY,
                0,
            ))?;
            spawn_check(libc::posix_spawn_file_actions_adddup2(
                fa,
                stdout.as_raw_fd(),
                1,
            ))?;
            spawn_check(libc::posix_spawn_file_actions_adddup2(
                fa,
                stderr.as_raw_fd(),
                2,
            ))?;
            spawn_check(libc::posix_spawn_file_actions_addclosefrom_np(fa, 3))?;
            if let Some(dir) = cwd {
                spawn_check(libc::posix_spawn_file_actions_addchdir_np(fa, dir.as_ptr()))?;
            }
        }
        Ok(this)
    }
}

impl Drop for FileActions {
    fn drop(&mut self) {
        // SAFETY: a FileActions exists only once its object was initialised,
        // and it is destroyed only here, once.
        unsafe { libc::posix_spawn_file_actions_destroy(self.0.as_mut_ptr()) };
    }
}

/// The NULL-terminated pointer array `posix_spawn` takes for argv and envp;
/// valid while the strings are.
fn c_pointers<'a>(strings: impl IntoIterator<Item = &'a CStr>) -> Vec<*mut libc::c_char> {
    strings
        .into_iter()
        .map(|s| s.as_ptr().cast_mut())
        .chain(std::iter::once(std::ptr::null_mut()))
        .collect()
}

/// Starts `path` (exec'ed as is: no PATH search) with `argv` and `envp` (both
/// NULL-terminated pointer arrays made by [`c_pointers`], whose strings must
/// outlive the call), set up by `actions` and `attr`. Returns the pid; an
/// exec or file-action failure in the child is returned as its error (glibc
/// reports it and reaps the failed child before returning).
fn posix_spawn(
    path: &CStr,
    argv: &[*mut libc::c_char],
    envp: &[*mut libc::c_char],
    actions: &mut FileActions,
    attr: &mut SpawnAttr,
) -> io::Result<i32> {
    debug_assert!(argv.last().is_some_and(|p| p.is_null()));
    debug_assert!(envp.last().is_some_and(|p| p.is_null()));
    let mut pid: libc::pid_t = 0;
    // SAFETY: every pointer is valid for the whole call: `pid` is ours to
    // write, `path` is a borrowed C string, `argv` and `envp` are
    // NULL-terminated arrays (made by `c_pointers`) of pointers to C strings
    // the caller keeps alive across the call (glibc reads them, never writes:
    // the `*mut` is C's historic prototype), and `actions` and `attr` are
    // initialised objects.
    spawn_check(unsafe {
        libc::posix_spawn(
            &raw mut pid,
            path.as_ptr(),
            actions.0.as_ptr(),
            attr.0.as_ptr(),
            argv.as_ptr(),
            envp.as_ptr(),
        )
    })?;
    Ok(pid)
}

/// A C string of `bytes`, or the error std gives for an embedded NUL.
fn c_string(bytes: impl Into<Vec<u8>>) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "nul byte found in provided data",
        )
    })
}

/// The environment attempts start from: a snapshot of the runner's process
/// environment, taken once (by [`BaseEnv::current`], when a runner starts)
/// and kept as ready-made `NAME=VALUE` C strings, so a spawn does not read and
/// convert the whole environment again. The process environment is not
/// expected to change while a runner runs; a change made after the snapshot
/// does not reach its attempts.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct BaseEnv {
    /// `(name, "NAME=VALUE")`, one per name, sorted by name.
    vars: Vec<(Vec<u8>, CString)>,
    /// The value of PATH, if set.
    path: Option<OsString>,
}

impl BaseEnv {
    /// A snapshot of the calling process's environment.
    pub(crate) fn current() -> Self {
        // A map, like std's: the last of duplicate names wins, and the order
        // is by name.
        let map: BTreeMap<OsString, OsString> = std::env::vars_os().collect();
        let path = map.get(OsStr::new("PATH")).cloned();
        let vars = map
            .into_iter()
            .filter_map(|(k, v)| {
                let name = k.into_vec();
                let entry = env_entry(&name, v.as_bytes()).ok()?;
                Some((name, entry))
            })
            .collect();
        Self { vars, path }
    }
}

/// `NAME=VALUE` as a C string.
fn env_entry(name: &[u8], value: &[u8]) -> io::Result<CString> {
    let mut entry = Vec::with_capacity(name.len() + 1 + value.len() + 1);
    entry.extend_from_slice(name);
    entry.push(b'=');
    entry.extend_from_slice(value);
    c_string(entry)
}

/// The attempt's environment: the runner's (`spec.base_env`), with the job's
/// variables added or overriding (the last of a name wins), plus the job id
/// and run token, which override all. The C strings the base does not hold,
/// and the child's PATH.
struct ChildEnv<'a> {
    /// The base's entries that are not overridden.
    base: Vec<&'a CStr>,
    /// The job's entries and the two leasehold variables.
    own: Vec<CString>,
    /// The PATH the child sees (the program is searched on it).
    path: Option<&'a OsStr>,
}

impl<'a> ChildEnv<'a> {
    fn new(spec: &'a AttemptSpec) -> io::Result<Self> {
        let job_id = spec.job_id.to_string();
        // The job's variables, the last of each name winning, then ours.
        let mut overrides: Vec<(&[u8], &[u8])> = Vec::with_capacity(spec.env.len() + 2);
        for (k, v) in &spec.env {
            let k = k.as_bytes();
            overrides.retain(|(n, _)| *n != k);
            overrides.push((k, v.as_bytes()));
        }
        for (k, v) in [
            (JOB_ID_VAR.as_bytes(), job_id.as_bytes()),
            (RUN_TOKEN_VAR.as_bytes(), spec.run_token.as_bytes()),
        ] {
            overrides.retain(|(n, _)| *n != k);
            overrides.push((k, v));
        }
        let base = spec
            .base_env
            .vars
            .iter()
            .filter(|(name, _)| !overrides.iter().any(|(n, _)| *n == name.as_slice()))
            .map(|(_, entry)| entry.as_c_str())
            .collect();
        let path = match spec.env.iter().rev().find(|(k, _)| k == "PATH") {
            Some((_, v)) => Some(OsStr::new(v.as_str())),
            None => spec.base_env.path.as_deref(),
        };
        let own = overrides
            .iter()
            .map(|(k, v)| env_entry(k, v))
            .collect::<io::Result<Vec<_>>>()?;
        Ok(Self { base, own, path })
    }

    /// The NULL-terminated envp array; valid while `self` is.
    fn pointers(&self) -> Vec<*mut libc::c_char> {
        c_pointers(
            self.base
                .iter()
                .copied()
                .chain(self.own.iter().map(CString::as_c_str)),
        )
    }
}

/// Finds the file to exec for `program` as `execvp` would in the child: a
/// name containing a slash is used as is; any other is looked up in each
/// directory of `search_path` (the child's PATH; glibc's default when unset),
/// an empty entry meaning the working directory, and the first executable
/// regular file wins. A relative result is relative to the child's working
/// directory: it is checked there (`cwd`, the runner's if `None`), and exec
/// resolves it there too since the child changes directory first.
///
/// Not found: ENOENT, or EACCES if a match was not executable (or a directory
/// was not searchable), as `execvp` reports.
fn resolve_program(
    program: &OsStr,
    search_path: Option<&OsStr>,
    cwd: Option<&Path>,
) -> io::Result<PathBuf> {
    if program.as_bytes().contains(&b'/') {
        return Ok(PathBuf::from(program));
    }
    if program.is_empty() {
        return Err(io::Error::from_raw_os_error(libc::ENOENT));
    }
    let mut denied = false;
    let search_path = search_path.unwrap_or(OsStr::new(DEFAULT_SEARCH_PATH));
    for dir in std::env::split_paths(search_path) {
        let candidate = dir.join(program);
        let checked = match cwd {
            Some(cwd) if candidate.is_relative() => cwd.join(&candidate),
            _ => candidate.clone(),
        };
        let executable = || nix::unistd::eaccess(&checked, AccessFlags::X_OK).is_ok();
        match std::fs::metadata(&checked) {
            Ok(meta) if meta.is_file() && executable() => return Ok(candidate),
            // A directory or a file we may not execute: exec would fail with
            // EACCES, and execvp goes on to the next directory.
            Ok(_) => denied = true,
            Err(e) if e.raw_os_error() == Some(libc::EACCES) => denied = true,
            Err(_) => {}
        }
    }
    let errno = if denied { libc::EACCES } else { libc::ENOENT };
    Err(io::Error::from_raw_os_error(errno))
}

/// Checks that `dir` can be the child's working directory, so that a bad one
/// is reported as such (the child's chdir fails with the same errors as a
/// bad program).
fn check_cwd(dir: &Path) -> io::Result<()> {
    if !std::fs::metadata(dir)?.is_dir() {
        return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
    }
    nix::unistd::eaccess(dir, AccessFlags::X_OK)?;
    Ok(())
}

/// A pipe for one output stream: the parent's read end and the child's
/// write end, both close-on-exec (the child gets the write end through a
/// dup2, which clears it). The write end is moved above fd 2 if it is one of
/// the standard fds, which only happens when the runner runs with one of
/// them closed: the child's file actions replace 0, 1 and 2.
fn output_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    if write.as_raw_fd() > 2 {
        return Ok((read, write));
    }
    let moved = fcntl(&write, FcntlArg::F_DUPFD_CLOEXEC(3))?;
    // SAFETY: fcntl just returned this new descriptor, so it is open and
    // nothing else owns it.
    Ok((read, unsafe { OwnedFd::from_raw_fd(moved) }))
}

/// The attempt's main process until it is reaped. Exactly one `waitpid`
/// collects it; dropping it unreaped (a process stuck even after SIGKILL, or
/// unwinding) SIGKILLs it and leaves the wait to a background thread, so it
/// never stays a zombie. Until reaped its pid cannot be recycled, so
/// signalling the pid always hits it.
#[derive(Debug)]
struct ChildProc {
    /// The pid.
    pid: i32,
    /// Whether it was reaped (or someone else reaped it).
    reaped: bool,
}

/// `waitpid(pid, options)`, retried on EINTR: `Ok(None)` while (with
/// WNOHANG) the process has not exited, else its raw status. The raw libc
/// call rather than nix's: nix decodes the status into its `Signal` enum,
/// which lacks the real-time signals, and fails with EINVAL after reaping a
/// process they killed, losing its status.
fn waitpid(pid: i32, options: libc::c_int) -> io::Result<Option<ExitStatus>> {
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: waitpid writes one int through the pointer, which points to
        // `status`.
        let ret = unsafe { libc::waitpid(pid, &raw mut status, options) };
        if ret == pid {
            return Ok(Some(ExitStatus::from_raw(status)));
        }
        if ret == 0 {
            return Ok(None);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

impl ChildProc {
    /// The exit status, if the process has exited (reaping it).
    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        let result = waitpid(self.pid, libc::WNOHANG);
        match &result {
            Ok(Some(_)) => self.reaped = true,
            // Someone else reaped it (e.g. SIGCHLD set to SIG_IGN elsewhere
            // in the process): there is nothing left to reap.
            Err(e) if e.raw_os_error() == Some(libc::ECHILD) => self.reaped = true,
            _ => {}
        }
        result
    }

    /// Sends SIGKILL to the process (not its group).
    fn kill(&self) {
        if let Err(e) = process::signal_pid(self.pid, Signal::SIGKILL) {
            log::error!("SIGKILL to attempt pid {}: {e}", self.pid);
        }
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        self.kill();
        let pid = self.pid;
        let spawned = std::thread::Builder::new()
            .name(format!("reap-{pid}"))
            .spawn(move || {
                if let Err(e) = waitpid(pid, 0) {
                    log::error!("reaping attempt pid {pid}: {e}");
                }
            });
        if let Err(e) = spawned {
            log::error!("cannot start a reaper thread for pid {pid}: {e}");
        }
    }
}

/// A started main process and the parent's ends of its output pipes.
struct Spawned {
    /// The main process.
    child: ChildProc,
    /// The read end of its stdout.
    stdout: OwnedFd,
    /// The read end of its stderr.
    stderr: OwnedFd,
}

/// Starts the attempt's main process (`program` is `spec.argv[0]`). The
/// error is the text of [`Ending::SpawnFailed`].
fn spawn(spec: &AttemptSpec, program: &str) -> Result<Spawned, String> {
    let cwd = spec.cwd.as_deref();
    let fail = |e: io::Error| spawn_error(program, cwd, &e);
    if let Some(dir) = cwd {
        check_cwd(dir).map_err(|e| format!("spawn {program:?}: working directory {dir:?}: {e}"))?;
    }
    let env = ChildEnv::new(spec).map_err(fail)?;
    let path = resolve_program(OsStr::new(program), env.path, cwd).map_err(fail)?;
    let path = c_string(path.into_os_string().into_vec()).map_err(fail)?;
    let argv = spec
        .argv
        .iter()
        .map(|a| c_string(a.as_bytes()))
        .collect::<io::Result<Vec<_>>>()
        .map_err(fail)?;
    let envp = env.pointers();
    let cwd_c = cwd
        .map(|d| c_string(d.as_os_str().as_bytes()))
        .transpose()
        .map_err(fail)?;

    let (stdout, stdout_w) = output_pipe().map_err(fail)?;
    let (stderr, stderr_w) = output_pipe().map_err(fail)?;
    let mut attr = SpawnAttr::new().map_err(fail)?;
    let mut actions =
        FileActions::new(stdout_w.as_fd(), stderr_w.as_fd(), cwd_c.as_deref()).map_err(fail)?;
    let argv_p = c_pointers(argv.iter().map(CString::as_c_str));
    let pid = match posix_spawn(&path, &argv_p, &envp, &mut actions, &mut attr) {
        Err(e) if e.raw_os_error() == Some(libc::ENOEXEC) => {
            // What execvp does with a file that has no `#!` line.
            let script_argv = c_pointers(
                [SCRIPT_SHELL, path.as_c_str()]
                    .into_iter()
                    .chain(argv.iter().skip(1).map(CString::as_c_str)),
            );
            posix_spawn(SCRIPT_SHELL, &script_argv, &envp, &mut actions, &mut attr)
        }
        other => other,
    }
    .map_err(fail)?;
    // The child has its copies; with ours closed, EOF on the read ends means
    // every process of the attempt closed them.
    drop((stdout_w, stderr_w));
    Ok(Spawned {
        child: ChildProc { pid, reaped: false },
        stdout,
        stderr,
    })
}

/// What to run for one attempt and the limits to enforce on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AttemptSpec {
    /// The command; `argv[0]` is the program. Must not be empty.
    pub argv: Vec<String>,
    /// Variables added to the runner's environment.
    pub env: Vec<(String, String)>,
    /// The runner's environment, which the attempt's starts from.
    pub base_env: Arc<BaseEnv>,
    /// Working directory; the runner's if `None`.
    pub cwd: Option<PathBuf>,
    /// Exported to the attempt as `LEASEHOLD_JOB_ID`.
    pub job_id: i64,
    /// Exported to the attempt as `LEASEHOLD_RUN_TOKEN`; it is how processes
    /// that leave the attempt's process group are still found.
    pub run_token: String,
    /// Wall-clock bound on the attempt.
    pub timeout: Option<Duration>,
    /// Kill the attempt when neither stdout nor stderr produced output for
    /// this long.
    pub idle_timeout: Option<Duration>,
    /// Time between SIGTERM to the group and SIGKILL.
    pub kill_grace: Duration,
    /// How long to keep reading the pipes after the main process exits.
    pub drain: Duration,
    /// How many trailing bytes of each stream to keep.
    pub tail_bytes: usize,
}

/// Identifies a spawned attempt; passed to `on_started` so the caller can
/// record it (it is what a later `process::teardown` verifies against).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Started {
    /// The main process's pid.
    pub pid: i32,
    /// The attempt's process group; equal to `pid`.
    pub pgid: i32,
    /// The main process's start time, in clock ticks since boot.
    pub start_time: u64,
}

/// Why [`StopHandle::stop`] was called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopReason {
    /// The job was cancelled.
    Cancelled,
    /// The runner lost the lease on the job.
    LeaseLost,
    /// The runner is shutting down.
    Shutdown,
    /// The runner can no longer prove it holds the lease and stops itself.
    SelfFenced,
}

impl StopReason {
    /// The non-zero code under which the reason is stored atomically.
    fn code(self) -> u8 {
        match self {
            Self::Cancelled => 1,
            Self::LeaseLost => 2,
            Self::Shutdown => 3,
            Self::SelfFenced => 4,
        }
    }

    /// The inverse of [`StopReason::code`]; `None` for 0 ("not stopped").
    fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::Cancelled),
            2 => Some(Self::LeaseLost),
            3 => Some(Self::Shutdown),
            4 => Some(Self::SelfFenced),
            _ => None,
        }
    }
}

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ending {
    /// The main process exited with this code (-1 in the should-not-happen
    /// case that its status was lost: reaped by someone else).
    Exited(i32),
    /// The main process was killed by this signal (not sent by us).
    Signaled(i32),
    /// Killed because it ran longer than this timeout.
    TimedOut(Duration),
    /// Killed because it produced no output for this long.
    IdleTimedOut(Duration),
    /// Killed because [`StopHandle::stop`] was called.
    Stopped(StopReason),
    /// Could not be started; the OS reason and what failed.
    SpawnFailed(String),
}

/// The last bytes of one output stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Tail {
    /// At most `tail_bytes` bytes: the end of the stream.
    pub bytes: Vec<u8>,
    /// Whether the stream produced more than `tail_bytes` bytes.
    pub truncated: bool,
}

/// A process of the attempt still alive after the main process exited (or
/// outside its group), which was killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Leak {
    /// The leaked process.
    pub pid: i32,
    /// Whether it had left the attempt's process group (found by run token).
    pub escaped_group: bool,
}

/// Everything [`run`] learned about an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AttemptResult {
    /// How it ended.
    pub ending: Ending,
    /// The tail of its stdout.
    pub stdout: Tail,
    /// The tail of its stderr.
    pub stderr: Tail,
    /// Processes that outlived the main process, or escaped its group, and
    /// were killed.
    pub leaked: Vec<Leak>,
    /// Wall time from spawn to the end of supervision.
    pub duration: Duration,
}

/// State shared by all clones of a [`StopHandle`].
#[derive(Debug)]
struct StopShared {
    /// 0 while not stopped, else [`StopReason::code`] of the first reason.
    reason: AtomicU8,
    /// The wake-up eventfd: written by `stop`, polled by the supervisor and
    /// never read, so once stopped it stays readable. One descriptor, where
    /// a pipe would take two.
    wake: OwnedFd,
}

/// A cloneable handle another thread uses to stop a running attempt. Stopping
/// wakes the supervising `poll` at once through an eventfd in its poll set.
/// Stopping before [`run`] is called makes it return without spawning.
#[derive(Debug, Clone)]
pub(crate) struct StopHandle {
    /// The shared reason and wake-up eventfd.
    shared: Arc<StopShared>,
}

impl StopHandle {
    /// A handle that has not been stopped.
    pub(crate) fn new() -> io::Result<Self> {
        // Non-blocking so stop() can never block (an eventfd only would once
        // its counter neared u64::MAX); close-on-exec so attempts never
        // inherit it.
        // SAFETY: eventfd takes no pointers; a non-negative return is a new
        // descriptor that nothing else owns, so OwnedFd may take it.
        let wake = unsafe {
            let fd = libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            OwnedFd::from_raw_fd(fd)
        };
        Ok(Self {
            shared: Arc::new(StopShared {
                reason: AtomicU8::new(0),
                wake,
            }),
        })
    }

    /// Asks the attempt to stop. The first reason given wins; later calls
    /// only wake the supervisor again.
    pub(crate) fn stop(&self, reason: StopReason) {
        // The reason is stored before the wake-up is written, so a woken
        // supervisor always finds it.
        let _ = self.shared.reason.compare_exchange(
            0,
            reason.code(),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        match nix::unistd::write(&self.shared.wake, &1u64.to_ne_bytes()) {
            // EAGAIN: the counter is full, hence already readable.
            Ok(_) | Err(Errno::EAGAIN) => {}
            Err(e) => log::error!("stop handle: cannot write wake-up eventfd: {e}"),
        }
    }

    /// The reason the attempt was stopped, if it was.
    pub(crate) fn reason(&self) -> Option<StopReason> {
        StopReason::from_code(self.shared.reason.load(Ordering::Acquire))
    }
}

/// Keeps the last `cap` bytes written to it.
#[derive(Debug)]
struct TailBuf {
    /// The kept bytes, oldest first.
    buf: VecDeque<u8>,
    /// How many bytes to keep.
    cap: usize,
    /// Whether any byte was dropped.
    truncated: bool,
}

impl TailBuf {
    /// An empty tail keeping at most `cap` bytes.
    fn new(cap: usize) -> Self {
        Self {
            // Grows on demand: most jobs print far less than the cap.
            buf: VecDeque::new(),
            cap,
            truncated: false,
        }
    }

    /// Appends `data`, dropping the oldest bytes beyond the cap.
    fn push(&mut self, data: &[u8]) {
        if self.buf.len() + data.len() > self.cap {
            self.truncated = true;
        }
        if data.len() >= self.cap {
            self.buf.clear();
            self.buf.extend(&data[data.len() - self.cap..]);
            return;
        }
        let overflow = (self.buf.len() + data.len()).saturating_sub(self.cap);
        self.buf.drain(..overflow);
        self.buf.extend(data);
    }

    /// The kept bytes as a [`Tail`].
    fn finish(self) -> Tail {
        Tail {
            bytes: self.buf.into(),
            truncated: self.truncated,
        }
    }
}

/// One output pipe of the attempt and the tail collected from it.
struct Stream {
    /// The read end; `None` once it reached EOF or was closed.
    pipe: Option<File>,
    /// Whether the pipe is non-blocking, so reading until EAGAIN is safe.
    nonblocking: bool,
    /// What was read so far.
    tail: TailBuf,
}

impl Stream {
    /// Wraps a pipe read end, making it non-blocking so reading what is
    /// available can never stall the supervisor.
    fn new(pipe: OwnedFd, cap: usize) -> Self {
        let pipe = File::from(pipe);
        let nonblocking = set_nonblocking(&pipe)
            // Still correct: we only read after poll reports the pipe ready,
            // and such a read does not block; reading just shortens to one
            // read per wake-up.
            .inspect_err(|e| log::warn!("cannot make an attempt pipe non-blocking: {e}"))
            .is_ok();
        Self {
            pipe: Some(pipe),
            nonblocking,
            tail: TailBuf::new(cap),
        }
    }

    /// Reads what is available (up to a budget) into the tail. Returns whether
    /// anything was read. Closes the pipe on EOF or error.
    fn read_available(&mut self, buf: &mut [u8]) -> bool {
        let mut got = 0;
        while let Some(pipe) = &mut self.pipe {
            match pipe.read(buf) {
                Ok(0) => self.pipe = None,
                Ok(n) => {
                    self.tail.push(&buf[..n]);
                    got += n;
                    if got >= READ_BUDGET || !self.nonblocking {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    log::warn!("reading attempt output: {e}");
                    self.pipe = None;
                }
            }
        }
        got > 0
    }
}

/// Sets `O_NONBLOCK` on `fd`.
/// `fd` is the read end of a pipe made by [`output_pipe`], whose file status
/// flags are otherwise clear (O_CLOEXEC is a descriptor flag), so they are set
/// without reading them first: one syscall a stream instead of two.
fn set_nonblocking(fd: &impl AsFd) -> io::Result<()> {
    fcntl(fd, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    Ok(())
}

/// Opens a pidfd for `pid`: a descriptor that becomes readable when the
/// process exits, which lets the exit wake the same `poll` as output and
/// stop requests.
fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    let flags: libc::c_uint = 0;
    // SAFETY: pidfd_open(pid_t, unsigned int) reads no memory of ours; it
    // returns a new descriptor or -1 with errno set.
    let ret = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, flags) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = RawFd::try_from(ret).map_err(io::Error::other)?;
    // SAFETY: the kernel just returned this descriptor to us, so it is open
    // and nothing else owns it. pidfd_open always sets O_CLOEXEC.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Converts a wait into a poll timeout, rounding up so that poll does not
/// return just before a deadline and make the loop spin until it passes.
fn poll_timeout(wait: Option<Duration>) -> PollTimeout {
    match wait {
        None => PollTimeout::NONE,
        Some(d) => {
            let ms = d.as_nanos().div_ceil(1_000_000);
            i32::try_from(ms)
                .ok()
                .and_then(|ms| PollTimeout::try_from(ms).ok())
                .unwrap_or(PollTimeout::MAX)
        }
    }
}

/// The earliest of some optional deadlines.
fn earliest(deadlines: &[Option<Instant>]) -> Option<Instant> {
    deadlines.iter().flatten().min().copied()
}

/// Describes a spawn failure: what failed and the OS reason.
fn spawn_error(program: &str, cwd: Option<&Path>, err: &io::Error) -> String {
    // The child's chdir fails with the same errors as a bad program (ENOENT,
    // EACCES, ENOTDIR); point at the directory when it is the one that is
    // unusable (`spawn` checks it first, but it may have changed since).
    match cwd {
        Some(dir) if check_cwd(dir).is_err() => {
            format!("spawn {program:?}: working directory {dir:?}: {err}")
        }
        _ => format!("spawn {program:?}: {err}"),
    }
}

/// What one `poll` wake-up slot watches.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// The stdout pipe.
    Stdout,
    /// The stderr pipe.
    Stderr,
    /// The main process's pidfd.
    Exit,
    /// The stop handle's wake-up eventfd.
    Stop,
}

/// The state of one running attempt.
struct Supervisor<'a> {
    /// What is being run.
    spec: &'a AttemptSpec,
    /// Stop requests.
    stop: &'a StopHandle,
    /// The main process; `None` once reaped.
    child: Option<ChildProc>,
    /// The main process's exit status, once reaped.
    status: Option<ExitStatus>,
    /// The main process's pid, which is also the attempt's process group.
    pgid: i32,
    /// Readable when the main process exits; `None` once reaped (or if the
    /// kernel refused one).
    pidfd: Option<OwnedFd>,
    /// The stdout pipe and tail.
    out: Stream,
    /// The stderr pipe and tail.
    err: Stream,
    /// When output was last seen (or the spawn), for the idle timeout.
    last_output: Instant,
    /// When the attempt was spawned.
    spawned: Instant,
    /// Scratch buffer for reads.
    buf: Vec<u8>,
}

impl Supervisor<'_> {
    /// Whether either pipe is still open.
    fn pipes_open(&self) -> bool {
        self.out.pipe.is_some() || self.err.pipe.is_some()
    }

    /// Waits (at most `wait`, or forever if `None`) for output, the main
    /// process's exit or, with `watch_stop`, a stop request; then reads the
    /// output and reaps the main process if it exited. Callers check the
    /// stop handle and their deadlines themselves.
    fn pump(&mut self, wait: Option<Duration>, watch_stop: bool) {
        let mut wait = wait;
        if self.child.is_some() && self.pidfd.is_none() {
            wait = Some(wait.map_or(NO_PIDFD_INTERVAL, |w| w.min(NO_PIDFD_INTERVAL)));
        }
        let mut ready = [false; 4];
        let mut slots = [Slot::Stop; 4];
        let mut fds = Vec::with_capacity(4);
        let candidates = [
            (Slot::Stdout, self.out.pipe.as_ref().map(AsFd::as_fd)),
            (Slot::Stderr, self.err.pipe.as_ref().map(AsFd::as_fd)),
            (Slot::Exit, self.pidfd.as_ref().map(AsFd::as_fd)),
            (
                Slot::Stop,
                watch_stop.then(|| self.stop.shared.wake.as_fd()),
            ),
        ];
        for (slot, fd) in candidates {
            if let Some(fd) = fd {
                slots[fds.len()] = slot;
                fds.push(PollFd::new(fd, PollFlags::POLLIN));
            }
        }
        match poll(&mut fds, poll_timeout(wait)) {
            Ok(_) => {
                let wake = PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR;
                for (i, fd) in fds.iter().enumerate() {
                    // POLLNVAL cannot happen: every fd is owned by us and open.
                    ready[i] = fd.revents().is_some_and(|r| r.intersects(wake));
                }
            }
            Err(Errno::EINTR) => {}
            Err(e) => {
                // poll only fails for EINVAL/ENOMEM/EFAULT; sleep rather than
                // spin, and let the callers' deadlines move things on.
                log::error!("poll failed: {e}");
                std::thread::sleep(wait.unwrap_or(KILL_POLL_INTERVAL).min(KILL_POLL_INTERVAL));
            }
        }
        let n = fds.len();
        drop(fds);
        for (slot, _) in slots.iter().zip(ready).take(n).filter(|(_, r)| *r) {
            match slot {
                Slot::Stdout => {
                    if self.out.read_available(&mut self.buf) {
                        self.last_output = Instant::now();
                    }
                }
                Slot::Stderr => {
                    if self.err.read_available(&mut self.buf) {
                        self.last_output = Instant::now();
                    }
                }
                Slot::Exit => self.reap(),
                Slot::Stop => {}
            }
        }
        if self.pidfd.is_none() {
            self.reap();
        }
    }

    /// Collects the main process's exit status if it has exited.
    fn reap(&mut self) {
        let Some(child) = &mut self.child else {
            return;
        };
        match child.try_wait() {
            Ok(Some(status)) => self.status = Some(status),
            Ok(None) => return,
            Err(e) => {
                // Only ECHILD is possible: someone else reaped it (e.g.
                // SIGCHLD set to SIG_IGN elsewhere in the process). It is gone,
                // its status is lost. (Were it anything else, dropping the
                // child below would still kill and reap it.)
                log::error!("waiting for attempt pid {}: {e}", self.pgid);
            }
        }
        self.child = None;
        self.pidfd = None;
    }

    /// The ending for a main process that exited by itself.
    fn exit_ending(&self) -> Ending {
        match self.status {
            Some(s) => match (s.code(), s.signal()) {
                (Some(code), _) => Ending::Exited(code),
                (None, Some(sig)) => Ending::Signaled(sig),
                // A reaped (not stopped/continued) status is always one of the
                // two; keep something recognisable if it is not.
                (None, None) => Ending::Exited(-1),
            },
            // The status was lost (see `reap`).
            None => Ending::Exited(-1),
        }
    }

    /// Runs the attempt until it ends by itself or must be killed.
    fn supervise(&mut self) -> (Ending, Vec<Leak>) {
        let spec = self.spec;
        let deadline = spec.timeout.and_then(|t| self.spawned.checked_add(t));
        while self.child.is_some() {
            if let Some(reason) = self.stop.reason() {
                return (Ending::Stopped(reason), self.terminate(false, true));
            }
            let now = Instant::now();
            if let (Some(d), Some(t)) = (deadline, spec.timeout)
                && now >= d
            {
                return (Ending::TimedOut(t), self.terminate(false, true));
            }
            let idle_deadline = spec
                .idle_timeout
                .and_then(|i| self.last_output.checked_add(i));
            if let (Some(d), Some(i)) = (idle_deadline, spec.idle_timeout)
                && now >= d
            {
                return (Ending::IdleTimedOut(i), self.terminate(false, true));
            }
            let wait = earliest(&[deadline, idle_deadline]).map(|d| d - now);
            self.pump(wait, true);
        }
        let ending = self.exit_ending();
        (ending, self.drain())
    }

    /// After the main process exited by itself: read the pipes until EOF for
    /// at most `drain`, then kill whatever of the attempt is left.
    fn drain(&mut self) -> Vec<Leak> {
        let deadline = Instant::now().checked_add(self.spec.drain);
        while self.pipes_open() && self.stop.reason().is_none() {
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                break;
            }
            self.pump(deadline.map(|d| d - now), true);
        }
        if self.pipes_open() {
            // Someone still holds the pipes: descendants, possibly outside
            // the group, so the (costly) token scan is warranted.
            self.terminate(true, true)
        } else if process::group_has_live_members(self.pgid) {
            self.terminate(true, false)
        } else {
            Vec::new()
        }
    }

    /// Whether the main process is reaped, the group has no live member and
    /// none of `escaped` is alive.
    fn all_gone(&self, escaped: &[i32]) -> bool {
        self.child.is_none()
            && !process::group_has_live_members(self.pgid)
            && escaped.iter().all(|&p| !process::is_alive(p))
    }

    /// Keeps reading output and reaping until [`Self::all_gone`] or `deadline`.
    fn wait_gone(&mut self, deadline: Option<Instant>, escaped: &[i32]) {
        while !self.all_gone(escaped) {
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return;
            }
            let step = deadline.map_or(KILL_POLL_INTERVAL, |d| (d - now).min(KILL_POLL_INTERVAL));
            self.pump(Some(step), false);
        }
    }

    /// Signals the group and, with `scan_token`, every process carrying the
    /// run token outside it; returns those outside the group as leaks (all of
    /// them with `record_group`, used once the main process has exited).
    fn signal_all(
        &self,
        sig: Signal,
        record_group: bool,
        scan_token: bool,
        leaks: &mut BTreeMap<i32, bool>,
    ) -> Vec<i32> {
        let pgid = self.pgid;
        if record_group {
            for m in process::group_members(pgid) {
                leaks.insert(m.pid, false);
            }
        }
        if let Err(e) = process::signal_group(pgid, sig) {
            log::error!("{sig} to process group {pgid}: {e}");
        }
        let mut escaped = Vec::new();
        if scan_token {
            let carriers: Vec<ProcInfo> = process::processes_with_token(&self.spec.run_token);
            for p in carriers {
                if p.pgid == pgid {
                    // Already signalled with the group.
                    if record_group {
                        leaks.insert(p.pid, false);
                    }
                    continue;
                }
                if let Err(e) = process::signal_pid(p.pid, sig) {
                    log::error!("{sig} to escaped pid {}: {e}", p.pid);
                }
                leaks.insert(p.pid, true);
                escaped.push(p.pid);
            }
        }
        escaped
    }

    /// Kills what is left of the attempt: SIGTERM to the group (and escaped
    /// token carriers with `scan_token`), SIGKILL after `kill_grace` while
    /// anything is still alive, then a bounded wait until it is all gone and
    /// the main process is reaped. Output is read throughout. Closes the
    /// pipes. Returns the leaks (see [`Self::signal_all`]).
    fn terminate(&mut self, record_group: bool, scan_token: bool) -> Vec<Leak> {
        let mut leaks = BTreeMap::new();
        let escaped = self.signal_all(Signal::SIGTERM, record_group, scan_token, &mut leaks);
        let grace_end = Instant::now().checked_add(self.spec.kill_grace);
        self.wait_gone(grace_end, &escaped);
        if !self.all_gone(&escaped) {
            let escaped = self.signal_all(Signal::SIGKILL, record_group, scan_token, &mut leaks);
            if let Some(child) = &self.child {
                // The main process may have moved itself out of the group.
                child.kill();
            }
            self.wait_gone(Instant::now().checked_add(AFTER_KILL_WAIT), &escaped);
        }
        if let Some(child) = self.child.take() {
            // Stuck in uninterruptible sleep even after SIGKILL: dropping it
            // lets a thread reap it whenever it dies rather than leave a
            // zombie.
            log::error!(
                "attempt pid {} did not die after SIGKILL; reaping it in the background",
                child.pid
            );
            drop(child);
            self.pidfd = None;
        }
        // Whatever the dead writers left in the pipes; a pipe still held by a
        // survivor reports EAGAIN and is closed anyway. (A blocking pipe could
        // block here, so it is read only after poll says it is ready.)
        for stream in [&mut self.out, &mut self.err] {
            if stream.nonblocking {
                stream.read_available(&mut self.buf);
            }
        }
        self.out.pipe = None;
        self.err.pipe = None;
        leaks
            .into_iter()
            .map(|(pid, escaped_group)| Leak { pid, escaped_group })
            .collect()
    }
}

/// The size of the buffer output is read through.
const READ_BUF_SIZE: usize = 64 * 1024;

thread_local! {
    /// The read buffer of the thread's last attempt, kept for its next one: a worker runs
    /// one attempt at a time, and a fresh zeroed 64 KiB per attempt shows on short jobs.
    static READ_BUF: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The thread's read buffer (a new one if it has none).
fn read_buffer() -> Vec<u8> {
    let buf = READ_BUF.take();
    if buf.len() == READ_BUF_SIZE {
        buf
    } else {
        vec![0; READ_BUF_SIZE]
    }
}

/// Runs one attempt of `spec` to its end; see the module documentation.
///
/// `on_started` is called right after a successful spawn, before any waiting,
/// so the caller can record the attempt's identity. When this returns, no
/// process of the attempt is alive (barring one stuck in uninterruptible
/// sleep, which is logged) and the main process has been reaped.
pub(crate) fn run(
    spec: &AttemptSpec,
    stop: &StopHandle,
    on_started: impl FnOnce(&Started),
) -> AttemptResult {
    let spawned = Instant::now();
    let unstarted = |ending| AttemptResult {
        ending,
        stdout: Tail::default(),
        stderr: Tail::default(),
        leaked: Vec::new(),
        duration: spawned.elapsed(),
    };
    let Some(program) = spec.argv.first() else {
        return unstarted(Ending::SpawnFailed(
            "spawn: empty command line (no program to run)".to_owned(),
        ));
    };
    if let Some(reason) = stop.reason() {
        return unstarted(Ending::Stopped(reason));
    }

    let Spawned {
        child,
        stdout,
        stderr,
    } = match spawn(spec, program) {
        Ok(spawned) => spawned,
        Err(message) => return unstarted(Ending::SpawnFailed(message)),
    };
    let pid = child.pid;
    let pidfd = pidfd_open(pid)
        .inspect_err(|e| log::warn!("pidfd_open({pid}): {e}; falling back to periodic checks"))
        .ok();
    // The child is not reaped yet, so /proc/PID exists (possibly as a
    // zombie); only an unreadable /proc could leave this unknown.
    let start_time = process::start_time(pid).unwrap_or_else(|| {
        log::error!("cannot read the start time of attempt pid {pid}");
        0
    });
    on_started(&Started {
        pid,
        pgid: pid,
        start_time,
    });

    let mut sup = Supervisor {
        spec,
        stop,
        child: Some(child),
        status: None,
        pgid: pid,
        pidfd,
        out: Stream::new(stdout, spec.tail_bytes),
        err: Stream::new(stderr, spec.tail_bytes),
        last_output: spawned,
        spawned,
        buf: read_buffer(),
    };
    let (ending, leaked) = sup.supervise();
    READ_BUF.set(mem::take(&mut sup.buf));
    AttemptResult {
        ending,
        stdout: sup.out.tail.finish(),
        stderr: sup.err.tail.finish(),
        leaked,
        duration: spawned.elapsed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::sync::atomic::AtomicUsize;

    /// A run token unique to one test run of one test.
    fn unique_token(name: &str) -> String {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        format!("test-attempt-{}-{name}-{n}", std::process::id())
    }

    /// A spec running `sh -c script` with generous limits, adjusted per test.
    fn sh(script: &str, name: &str) -> AttemptSpec {
        AttemptSpec {
            argv: vec!["sh".into(), "-c".into(), script.into()],
            env: Vec::new(),
            base_env: Arc::new(BaseEnv::current()),
            cwd: None,
            job_id: 7,
            run_token: unique_token(name),
            timeout: Some(Duration::from_secs(20)),
            idle_timeout: None,
            kill_grace: Duration::from_secs(1),
            drain: Duration::from_millis(500),
            tail_bytes: 64 * 1024,
        }
    }

    /// Kills, on drop, whatever of an attempt might survive a failed test:
    /// its process group and every process carrying its token (by pid).
    struct Cleanup {
        started: Option<Started>,
        token: String,
    }

    impl Drop for Cleanup {
        fn drop(&mut self) {
            if let Some(s) = self.started {
                let _ = process::signal_group(s.pgid, Signal::SIGKILL);
            }
            for p in process::processes_with_token(&self.token) {
                let _ = process::signal_pid(p.pid, Signal::SIGKILL);
            }
        }
    }

    /// Runs `spec` with a fresh stop handle; returns the result and a guard
    /// that cleans up after the test.
    fn run_spec(spec: &AttemptSpec) -> (AttemptResult, Cleanup) {
        let stop = StopHandle::new().expect("stop handle");
        run_with(spec, &stop)
    }

    /// Runs `spec` with `stop`; see [`run_spec`].
    fn run_with(spec: &AttemptSpec, stop: &StopHandle) -> (AttemptResult, Cleanup) {
        let started = Cell::new(None);
        let result = run(spec, stop, |s| started.set(Some(*s)));
        let cleanup = Cleanup {
            started: started.get(),
            token: spec.run_token.clone(),
        };
        (result, cleanup)
    }

    /// Asserts that nothing of the attempt is alive.
    fn assert_all_gone(c: &Cleanup) {
        let s = c.started.expect("attempt was started");
        assert!(process::group_members(s.pgid).is_empty(), "group alive");
        assert!(
            process::processes_with_token(&c.token).is_empty(),
            "token carriers alive"
        );
        assert!(!process::is_alive(s.pid));
    }

    fn text(t: &Tail) -> String {
        String::from_utf8_lossy(&t.bytes).into_owned()
    }

    #[test]
    fn exit_zero_is_exited_0_with_output_captured() {
        let (r, c) = run_spec(&sh("echo out; echo err >&2", "exit0"));
        assert_eq!(r.ending, Ending::Exited(0));
        assert_eq!(text(&r.stdout), "out\n");
        assert_eq!(text(&r.stderr), "err\n");
        assert!(!r.stdout.truncated && r.leaked.is_empty());
        let s = c.started.expect("started");
        assert_eq!((s.pid, s.pgid), (s.pgid, s.pid));
        assert!(s.start_time > 0);
        assert_all_gone(&c);
    }

    #[test]
    fn exit_code_3_is_exited_3() {
        let (r, _c) = run_spec(&sh("exit 3", "exit3"));
        assert_eq!(r.ending, Ending::Exited(3));
    }

    #[test]
    fn death_by_signal_is_signaled() {
        let (r, _c) = run_spec(&sh("kill -9 $$", "signaled"));
        assert_eq!(r.ending, Ending::Signaled(9));
    }

    #[test]
    fn env_job_id_token_and_cwd_are_applied() {
        let mut spec = sh(
            "echo $LEASEHOLD_JOB_ID $LEASEHOLD_RUN_TOKEN $FOO; pwd",
            "env",
        );
        spec.env = vec![("FOO".into(), "bar baz".into())];
        spec.cwd = Some(PathBuf::from("/tmp"));
        let (r, _c) = run_spec(&spec);
        assert_eq!(r.ending, Ending::Exited(0));
        assert_eq!(
            text(&r.stdout),
            format!("7 {} bar baz\n/tmp\n", spec.run_token)
        );
    }

    /// Reads `/proc/PID/status` and the fd numbers in `/proc/PID/fd`.
    fn status_and_fds(pid: i32) -> (String, Vec<i32>) {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
        let mut fds: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .expect("fd dir")
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        fds.sort_unstable();
        (status, fds)
    }

    /// The value of `field` (e.g. `SigBlk:`) in a `/proc/PID/status` text.
    fn status_field(status: &str, field: &str) -> String {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .map(|v| v.trim().to_owned())
            .unwrap_or_else(|| panic!("no {field} in {status}"))
    }

    #[test]
    fn child_starts_with_only_std_fds_and_no_blocked_or_ignored_signals() {
        use nix::sys::signal::{SigHandler, SigSet, SigmaskHow, pthread_sigmask, signal};
        // The runner's state the child must not inherit: SIGTERM blocked in
        // the spawning thread (its own thread, so no other test sees it), an
        // fd without close-on-exec, and an ignored signal (SIGUSR2, which no
        // test uses; restored below).
        // SAFETY: SIG_IGN installs no handler code; SIGUSR2 is not used by the
        // test harness or any other test.
        let previous = unsafe { signal(Signal::SIGUSR2, SigHandler::SigIgn) }.expect("ignore");
        let observed = std::thread::spawn(|| {
            let mut set = SigSet::empty();
            set.add(Signal::SIGTERM);
            pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), None).expect("block SIGTERM");
            let stdin = std::io::stdin();
            let leaky = nix::unistd::dup(stdin.as_fd()).expect("dup without CLOEXEC");
            let mut spec = sh("", "clean");
            spec.argv = vec!["sleep".into(), "5".into()];
            let stop = StopHandle::new().expect("stop handle");
            let seen = Cell::new(None);
            // `sleep` itself is the spawned process: what it shows is exactly
            // what the spawn gave it (a shell would change its own mask).
            let (r, _c) = {
                let started = Cell::new(None);
                let r = run(&spec, &stop, |s| {
                    started.set(Some(*s));
                    // `sleep` briefly opens files of its own while it starts
                    // (locale data); an inherited fd would stay, so wait,
                    // with a deadline, for those to be closed.
                    let deadline = Instant::now() + Duration::from_secs(2);
                    let mut now = status_and_fds(s.pid);
                    while now.1 != [0, 1, 2] && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(5));
                        now = status_and_fds(s.pid);
                    }
                    seen.set(Some(now));
                    stop.stop(StopReason::Cancelled);
                });
                let c = Cleanup {
                    started: started.get(),
                    token: spec.run_token.clone(),
                };
                (r, c)
            };
            drop(leaky);
            assert_eq!(r.ending, Ending::Stopped(StopReason::Cancelled));
            seen.take().expect("on_started ran")
        })
        .join();
        // SAFETY: restores the disposition saved above.
        unsafe { signal(Signal::SIGUSR2, previous) }.expect("restore SIGUSR2");
        let (status, fds) = observed.expect("observer thread");
        assert_eq!(status_field(&status, "SigBlk:"), "0000000000000000");
        assert_eq!(status_field(&status, "SigIgn:"), "0000000000000000");
        assert_eq!(fds, [0, 1, 2]);
    }

    #[test]
    fn timeout_kills_the_whole_group() {
        let mut spec = sh("sleep 300 & sleep 300", "timeout");
        spec.timeout = Some(Duration::from_secs(1));
        let (r, c) = run_spec(&spec);
        assert_eq!(r.ending, Ending::TimedOut(Duration::from_secs(1)));
        assert!(r.duration >= Duration::from_secs(1));
        // Both sleeps die of SIGTERM; no need to wait out the grace.
        assert!(r.duration < Duration::from_millis(1900), "{:?}", r.duration);
        assert!(r.leaked.is_empty());
        assert_all_gone(&c);
    }

    #[test]
    fn timeout_kills_a_job_that_ignores_sigterm() {
        let mut spec = sh("trap '' TERM; sleep 300", "ignoreterm");
        spec.timeout = Some(Duration::from_millis(300));
        spec.kill_grace = Duration::from_millis(300);
        let (r, c) = run_spec(&spec);
        assert_eq!(r.ending, Ending::TimedOut(Duration::from_millis(300)));
        assert!(r.duration >= Duration::from_millis(600));
        assert!(r.duration < Duration::from_secs(3), "{:?}", r.duration);
        assert_all_gone(&c);
    }

    #[test]
    fn timeout_kills_a_member_ignoring_sigterm_after_the_leader_died() {
        // SIGTERM kills the shell and its foreground sleep; the background
        // sleep ignores it and must still be SIGKILLed after the grace.
        let mut spec = sh("(trap '' TERM; exec sleep 300) & sleep 300", "bgterm");
        spec.timeout = Some(Duration::from_millis(300));
        spec.kill_grace = Duration::from_millis(300);
        let (r, c) = run_spec(&spec);
        assert_eq!(r.ending, Ending::TimedOut(Duration::from_millis(300)));
        assert!(r.duration >= Duration::from_millis(600));
        assert_all_gone(&c);
    }

    #[test]
    fn group_member_left_after_a_clean_exit_is_killed_as_a_leak() {
        let mut spec = sh(
            "(trap '' TERM; exec sleep 300) >/dev/null 2>&1 & echo $!; exit 0",
            "leftover",
        );
        spec.kill_grace = Duration::from_millis(300);
        let (r, c) = run_spec(&spec);
        assert_eq!(r.ending, Ending::Exited(0));
        let bg: i32 = text(&r.stdout).trim().parse().expect("background pid");
        assert_eq!(
            r.leaked,
            vec![Leak {
                pid: bg,
                escaped_group: false
            }]
        );
        // The pipes closed at once, so no drain was waited for.
        assert!(
            r.duration < Duration::from_millis(300 + 1000),
            "{:?}",
            r.duration
        );
        assert_all_gone(&c);
    }

    #[test]
    fn setsid_escapee_holding_stdout_is_killed_after_the_drain() {
        let mut spec = sh("setsid sleep 300 & exit 0", "setsid");
        spec.drain = Duration::from_millis(300);
        spec.kill_grace = Duration::from_millis(500);
        let begun = Instant::now();
        let (r, c) = run_spec(&spec);
        assert!(begun.elapsed() < Duration::from_millis(300 + 500 + 1000));
        assert_eq!(r.ending, Ending::Exited(0));
        assert_eq!(r.leaked.len(), 1, "{:?}", r.leaked);
        assert!(r.leaked[0].escaped_group);
        assert!(!process::is_alive(r.leaked[0].pid));
        assert_all_gone(&c);
    }

    #[test]
    fn output_beyond_tail_bytes_keeps_the_end() {
        let mut spec = sh("head -c 100000 /dev/zero | tr '\\0' a; printf END", "tail");
        spec.tail_bytes = 1000;
        let (r, _c) = run_spec(&spec);
        assert_eq!(r.ending, Ending::Exited(0));
        assert_eq!(r.stdout.bytes.len(), 1000);
        assert!(r.stdout.bytes.ends_with(b"aaaEND"));
        assert!(r.stdout.truncated);
        assert_eq!(r.stderr, Tail::default());
    }

    #[test]
    fn large_output_on_both_streams_at_once_does_not_deadlock() {
        let mut spec = sh(
            "head -c 2000000 /dev/zero | tr '\\0' e >&2 & \
             head -c 2000000 /dev/zero | tr '\\0' o; wait; printf END; printf END >&2",
            "both",
        );
        spec.tail_bytes = 10;
        spec.timeout = Some(Duration::from_secs(10));
        let (r, _c) = run_spec(&spec);
        assert_eq!(r.ending, Ending::Exited(0));
        assert_eq!(text(&r.stdout), "oooooooEND");
        assert_eq!(text(&r.stderr), "eeeeeeeEND");
        assert!(r.stdout.truncated && r.stderr.truncated);
    }

    #[test]
    fn tail_keeps_the_last_bytes_across_pushes() {
        let mut t = TailBuf::new(5);
        t.push(b"abc");
        assert!(!t.truncated);
        t.push(b"de");
        assert!(!t.truncated);
        t.push(b"fg");
        assert!(t.truncated);
        assert_eq!(t.finish().bytes, b"cdefg");
        let mut t = TailBuf::new(3);
        t.push(b"abcdef");
        assert_eq!(t.finish().bytes, b"def");
        let mut t = TailBuf::new(0);
        t.push(b"");
        assert!(!t.truncated);
        t.push(b"x");
        let t = t.finish();
        assert!(t.truncated && t.bytes.is_empty());
    }

    #[test]
    fn idle_timeout_kills_a_silent_job() {
        let mut spec = sh("echo hi; sleep 300", "idle");
        spec.idle_timeout = Some(Duration::from_millis(300));
        let (r, c) = run_spec(&spec);
        assert_eq!(r.ending, Ending::IdleTimedOut(Duration::from_millis(300)));
        assert_eq!(text(&r.stdout), "hi\n");
        assert!(r.duration < Duration::from_secs(2), "{:?}", r.duration);
        assert_all_gone(&c);
    }

    #[test]
    fn stop_from_another_thread_kills_promptly_and_first_reason_wins() {
        let mut spec = sh("sleep 300", "stop");
        spec.kill_grace = Duration::from_secs(5);
        let stop = StopHandle::new().expect("stop handle");
        let (tx, rx) = crossbeam_channel::bounded::<()>(1);
        let stopper = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                rx.recv().expect("started");
                let at = Instant::now();
                stop.stop(StopReason::Cancelled);
                stop.stop(StopReason::LeaseLost);
                at
            })
        };
        let started = Cell::new(None);
        let r = run(&spec, &stop, |s| {
            started.set(Some(*s));
            tx.send(()).expect("stopper waits");
        });
        let returned = Instant::now();
        let c = Cleanup {
            started: started.get(),
            token: spec.run_token.clone(),
        };
        let stopped_at = stopper.join().expect("stopper");
        assert_eq!(r.ending, Ending::Stopped(StopReason::Cancelled));
        assert_eq!(stop.reason(), Some(StopReason::Cancelled));
        // Far below the 5 s grace: the stop woke the poll and SIGTERM did it.
        assert!(returned - stopped_at < Duration::from_millis(500));
        assert_all_gone(&c);
    }

    #[test]
    fn stop_before_spawn_does_not_start_the_attempt() {
        let stop = StopHandle::new().expect("stop handle");
        stop.stop(StopReason::Shutdown);
        let called = Cell::new(false);
        let r = run(&sh("exit 0", "prestop"), &stop, |_| called.set(true));
        assert_eq!(r.ending, Ending::Stopped(StopReason::Shutdown));
        assert!(!called.get());
    }

    #[test]
    fn missing_program_fails_to_spawn_with_the_os_reason() {
        let mut spec = sh("", "missing");
        spec.argv = vec!["/no/such/program".into()];
        let called = Cell::new(false);
        let stop = StopHandle::new().expect("stop handle");
        let r = run(&spec, &stop, |_| called.set(true));
        assert_eq!(
            r.ending,
            Ending::SpawnFailed(
                "spawn \"/no/such/program\": No such file or directory (os error 2)".into()
            )
        );
        assert!(!called.get());
    }

    #[test]
    fn non_executable_program_fails_to_spawn() {
        let path = std::env::temp_dir().join(format!("leasehold-noexec-{}", std::process::id()));
        std::fs::write(&path, "echo hi\n").expect("write script");
        let mut spec = sh("", "noexec");
        spec.argv = vec![path.to_string_lossy().into_owned()];
        let (r, c) = run_spec(&spec);
        std::fs::remove_file(&path).expect("remove script");
        assert!(
            matches!(&r.ending, Ending::SpawnFailed(m) if m.contains("Permission denied")),
            "{:?}",
            r.ending
        );
        assert!(c.started.is_none());
    }

    #[test]
    fn bad_cwd_fails_to_spawn_naming_the_directory() {
        let mut spec = sh("exit 0", "badcwd");
        spec.cwd = Some(PathBuf::from("/no/such/dir"));
        let (r, c) = run_spec(&spec);
        match &r.ending {
            Ending::SpawnFailed(m) => {
                assert!(m.contains("\"/no/such/dir\""), "{m}");
                assert!(m.contains("No such file or directory"), "{m}");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(c.started.is_none());
    }

    #[test]
    fn empty_argv_fails_to_spawn() {
        let mut spec = sh("", "empty");
        spec.argv.clear();
        let (r, c) = run_spec(&spec);
        assert!(matches!(r.ending, Ending::SpawnFailed(_)));
        assert!(c.started.is_none());
    }

    #[test]
    fn death_by_a_real_time_signal_is_signaled() {
        let (r, _c) = run_spec(&sh("kill -40 $$", "rtsignal"));
        assert_eq!(r.ending, Ending::Signaled(40));
    }

    /// Writes `text` to `path` with permissions `mode`.
    fn write_file(path: &Path, text: &str, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(path, text).expect("write file");
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }

    #[test]
    fn program_is_searched_on_the_jobs_path_relative_to_its_cwd() {
        let dir = tempfile::tempdir().expect("tempdir");
        for sub in ["first", "bin"] {
            std::fs::create_dir(dir.path().join(sub)).expect("mkdir");
        }
        // Not executable: skipped, as execvp skips it.
        write_file(
            &dir.path().join("first/hello"),
            "#!/bin/sh\necho wrong\n",
            0o644,
        );
        write_file(
            &dir.path().join("bin/hello"),
            "#!/bin/sh\necho found $0\n",
            0o755,
        );
        let mut spec = sh("", "path");
        spec.argv = vec!["hello".into()];
        spec.cwd = Some(dir.path().to_owned());
        spec.env = vec![("PATH".into(), "first:bin".into())];
        let (r, _c) = run_spec(&spec);
        assert_eq!(r.ending, Ending::Exited(0), "{r:?}");
        assert_eq!(text(&r.stdout), "found bin/hello\n");

        // Only the non-executable match: EACCES, like execvp.
        spec.env = vec![("PATH".into(), "first".into())];
        let (r, _c) = run_spec(&spec);
        assert_eq!(
            r.ending,
            Ending::SpawnFailed("spawn \"hello\": Permission denied (os error 13)".into())
        );

        // The job's PATH, not the runner's, is searched.
        let mut spec = sh("exit 0", "nopath");
        spec.env = vec![("PATH".into(), "/no/such/dir".into())];
        let (r, c) = run_spec(&spec);
        assert_eq!(
            r.ending,
            Ending::SpawnFailed("spawn \"sh\": No such file or directory (os error 2)".into())
        );
        assert!(c.started.is_none());
    }

    #[test]
    fn executable_without_shebang_runs_under_sh() {
        let dir = tempfile::tempdir().expect("tempdir");
        let script = dir.path().join("plain");
        write_file(&script, "echo via sh $0 $1\n", 0o755);
        let mut spec = sh("", "noshebang");
        spec.argv = vec![script.to_string_lossy().into_owned(), "arg".into()];
        let (r, _c) = run_spec(&spec);
        assert_eq!(r.ending, Ending::Exited(0), "{r:?}");
        assert_eq!(
            text(&r.stdout),
            format!("via sh {} arg\n", script.display())
        );
    }

    #[test]
    fn nul_byte_fails_to_spawn() {
        let mut spec = sh("exit 0", "nul");
        spec.env = vec![("FOO".into(), "a\0b".into())];
        let (r, c) = run_spec(&spec);
        assert_eq!(
            r.ending,
            Ending::SpawnFailed("spawn \"sh\": nul byte found in provided data".into())
        );
        assert!(c.started.is_none());
    }

    /// Whether the process `s` describes is gone, not even a zombie (its pid
    /// may belong to a newer process by now).
    fn reaped(s: &Started) -> bool {
        process::proc_info(s.pid).is_none_or(|p| p.start_time != s.start_time)
    }

    #[test]
    fn main_process_is_reaped_when_run_returns() {
        let (r, c) = run_spec(&sh("exit 0", "reaped"));
        assert_eq!(r.ending, Ending::Exited(0));
        assert!(reaped(&c.started.expect("started")));
        let mut spec = sh("sleep 300", "reapedkill");
        spec.timeout = Some(Duration::from_millis(100));
        let (r, c) = run_spec(&spec);
        assert_eq!(r.ending, Ending::TimedOut(Duration::from_millis(100)));
        assert!(reaped(&c.started.expect("started")));
    }

    #[test]
    fn main_process_is_killed_and_reaped_if_on_started_panics() {
        let mut spec = sh("", "panic");
        spec.argv = vec!["sleep".into(), "300".into()];
        let stop = StopHandle::new().expect("stop handle");
        let started = Cell::new(None);
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run(&spec, &stop, |s| {
                started.set(Some(*s));
                panic!("on_started fails");
            })
        }));
        let c = Cleanup {
            started: started.get(),
            token: spec.run_token.clone(),
        };
        assert!(unwound.is_err());
        let s = c.started.expect("started");
        let deadline = Instant::now() + Duration::from_secs(3);
        while !reaped(&s) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(reaped(&s));
    }

    /// CPU used so far by the calling thread (`RUSAGE_THREAD`) or the whole
    /// process (`RUSAGE_SELF`).
    fn cpu(who: libc::c_int) -> Duration {
        let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
        // SAFETY: getrusage writes a whole rusage through the pointer, which
        // points to space for one; it is read only when the call succeeded.
        let usage = unsafe {
            if libc::getrusage(who, usage.as_mut_ptr()) != 0 {
                return Duration::ZERO;
            }
            usage.assume_init()
        };
        let tv = |t: libc::timeval| {
            Duration::from_secs(t.tv_sec.unsigned_abs())
                + Duration::from_micros(t.tv_usec.unsigned_abs())
        };
        tv(usage.ru_utime) + tv(usage.ru_stime)
    }

    /// Measures (does not assert) the CPU of 50 supervisors while 50 attempts
    /// of `sleep 1` run at once, one per thread: per thread, in total and
    /// after the spawn (i.e. the waiting itself). Run it alone with
    /// `--nocapture` to see the figures; RUSAGE_SELF then has no other test
    /// mixed in.
    #[test]
    fn fifty_sleeping_attempts_cost_their_supervisors_almost_no_cpu() {
        let process_before = cpu(libc::RUSAGE_SELF);
        let threads: Vec<_> = (0..50)
            .map(|i| {
                std::thread::spawn(move || {
                    let mut spec = sh("", &format!("cpu{i}"));
                    spec.argv = vec!["sleep".into(), "1".into()];
                    let stop = StopHandle::new().expect("stop handle");
                    let before = cpu(libc::RUSAGE_THREAD);
                    let after_spawn = Cell::new(before);
                    let r = run(&spec, &stop, |_| after_spawn.set(cpu(libc::RUSAGE_THREAD)));
                    let end = cpu(libc::RUSAGE_THREAD);
                    (r.ending, end - before, end - after_spawn.get())
                })
            })
            .collect();
        let (mut total, mut waiting) = (Duration::ZERO, Duration::ZERO);
        for t in threads {
            let (ending, all, after_spawn) = t.join().expect("thread");
            assert_eq!(ending, Ending::Exited(0));
            total += all;
            waiting += after_spawn;
        }
        eprintln!(
            "50 x `sleep 1`: supervising threads used {total:?} CPU in total ({:?} each), \
             of which {waiting:?} after the spawn; RUSAGE_SELF delta {:?}",
            total / 50,
            cpu(libc::RUSAGE_SELF) - process_before
        );
    }
}
