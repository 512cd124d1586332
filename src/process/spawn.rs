//! Starting an attempt's main process: glibc's `posix_spawn` called directly,
//! with the attempt's environment, its program found on its PATH, its working
//! directory checked, and pipes for its output.
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

use std::collections::BTreeMap;
use std::ffi::{CStr, CString, OsStr, OsString};
use std::io;
use std::mem::{self, MaybeUninit};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::libc;
use nix::unistd::AccessFlags;

use super::child::ChildProc;
use super::proc::{self, RUN_TOKEN_VAR};
use crate::files;
use crate::manners::Limits;

/// The environment variable carrying the job id into the attempt.
pub(crate) const JOB_ID_VAR: &str = "LEASEHOLD_JOB_ID";

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

/// The flags of [`SpawnAttr::new`]. The values are 2, 4 and 8, so the narrowing
/// to the `short` that `posix_spawnattr_setflags` takes is lossless.
const SPAWN_FLAGS: libc::c_short = (libc::POSIX_SPAWN_SETPGROUP
    | libc::POSIX_SPAWN_SETSIGMASK
    | libc::POSIX_SPAWN_SETSIGDEF) as libc::c_short;

/// The flags of [`SpawnAttr::new_session`]: SETSID (128) instead of SETPGROUP.
const SESSION_FLAGS: libc::c_short = libc::POSIX_SPAWN_SETSID
    | (libc::POSIX_SPAWN_SETSIGMASK | libc::POSIX_SPAWN_SETSIGDEF) as libc::c_short;

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
pub(super) struct SpawnAttr(Box<MaybeUninit<libc::posix_spawnattr_t>>);

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
        Self::with_flags(SPAWN_FLAGS)
    }

    /// As [`SpawnAttr::new`], but the child starts a session of its own
    /// (SETSID: it leads a new session and a new process group) instead of
    /// only a group: an attempt's keeper, which no signal to the runner's
    /// group or session may reach.
    pub(super) fn new_session() -> io::Result<Self> {
        Self::with_flags(SESSION_FLAGS)
    }

    /// The attributes with `flags`: the signal mask and defaults as
    /// [`SpawnAttr::new`] says, and group 0 if SETPGROUP is among them.
    fn with_flags(flags: libc::c_short) -> io::Result<Self> {
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
            spawn_check(libc::posix_spawnattr_setflags(attr, flags))?;
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
pub(super) struct FileActions(Box<MaybeUninit<libc::posix_spawn_file_actions_t>>);

impl FileActions {
    /// No actions yet.
    fn empty() -> io::Result<Self> {
        let mut actions = Box::new(MaybeUninit::uninit());
        // SAFETY: init initialises the object the pointer points to, which
        // is on the heap and never moves.
        spawn_check(unsafe { libc::posix_spawn_file_actions_init(actions.as_mut_ptr()) })?;
        // From here on, dropping the value destroys the object.
        Ok(Self(actions))
    }

    /// For an attempt's keeper: `/dev/null` read-write as fds 0, 1 and 2,
    /// `control` dup'ed to 3, every fd from 4 up closed. `control` must be
    /// above 3, or the earlier actions would replace it first (and a dup2 of
    /// an fd onto itself would leave its close-on-exec flag set).
    pub(super) fn for_keeper(control: BorrowedFd<'_>) -> io::Result<Self> {
        debug_assert!(control.as_raw_fd() > 3);
        let mut this = Self::empty()?;
        let fa = this.0.as_mut_ptr();
        // SAFETY: as in `new`: `fa` points to the initialised object, the
        // path is a static C string that glibc copies, and the descriptors
        // are only used by the child.
        unsafe {
            spawn_check(libc::posix_spawn_file_actions_addopen(
                fa,
                0,
                c"/dev/null".as_ptr(),
                libc::O_RDWR,
                0,
            ))?;
            spawn_check(libc::posix_spawn_file_actions_adddup2(fa, 0, 1))?;
            spawn_check(libc::posix_spawn_file_actions_adddup2(fa, 0, 2))?;
            spawn_check(libc::posix_spawn_file_actions_adddup2(
                fa,
                control.as_raw_fd(),
                3,
            ))?;
            spawn_check(libc::posix_spawn_file_actions_addclosefrom_np(fa, 4))?;
        }
        Ok(this)
    }

    /// In order: `/dev/null` read-only as fd 0, `stdout` dup'ed to 1 and
    /// `stderr` to 2, every fd from 3 up closed (so none survives, even one
    /// the runner inherited or opened without close-on-exec), then the
    /// change to `cwd` if given. `stdout` and `stderr` must be above 2, or
    /// the earlier actions would replace them first.
    fn new(stdout: BorrowedFd<'_>, stderr: BorrowedFd<'_>, cwd: Option<&CStr>) -> io::Result<Self> {
        let mut this = Self::empty()?;
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
pub(super) fn c_pointers<'a>(
    strings: impl IntoIterator<Item = &'a CStr>,
) -> Vec<*mut libc::c_char> {
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
pub(super) fn posix_spawn(
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
pub(super) fn c_string(bytes: impl Into<Vec<u8>>) -> io::Result<CString> {
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

/// The attempt's environment: the runner's (`cmd.base_env`), with the job's
/// variables added or overriding (the last of a name wins), plus the job id
/// and run token, which override all. The C strings the base does not hold,
/// and the child's PATH.
pub(super) struct ChildEnv<'a> {
    /// The base's entries that are not overridden.
    base: Vec<&'a CStr>,
    /// The job's entries and the two leasehold variables.
    own: Vec<CString>,
    /// The PATH the child sees (the program is searched on it).
    path: Option<&'a OsStr>,
}

impl<'a> ChildEnv<'a> {
    /// The environment of `cmd`, with its job id and run token (whatever the base or the
    /// job's own variables said of them).
    fn new(cmd: &Command<'a>) -> io::Result<Self> {
        let job_id = cmd.job_id.to_string();
        // The job's variables, the last of each name winning, then ours.
        let mut overrides: Vec<(&[u8], &[u8])> = Vec::with_capacity(cmd.env.len() + 2);
        for (k, v) in cmd.env {
            let k = k.as_bytes();
            overrides.retain(|(n, _)| *n != k);
            overrides.push((k, v.as_bytes()));
        }
        for (k, v) in [
            (JOB_ID_VAR.as_bytes(), job_id.as_bytes()),
            (RUN_TOKEN_VAR.as_bytes(), cmd.run_token.as_bytes()),
        ] {
            overrides.retain(|(n, _)| *n != k);
            overrides.push((k, v));
        }
        let base = cmd
            .base_env
            .vars
            .iter()
            .filter(|(name, _)| {
                name.as_slice() != RUN_TOKEN_VAR.as_bytes()
                    && !overrides.iter().any(|(n, _)| *n == name.as_slice())
            })
            .map(|(_, entry)| entry.as_c_str())
            .collect();
        let path = match cmd.env.iter().rev().find(|(k, _)| k == "PATH") {
            Some((_, v)) => Some(OsStr::new(v.as_str())),
            None => cmd.base_env.path.as_deref(),
        };
        let own = overrides
            .iter()
            .map(|(k, v)| env_entry(k, v))
            .collect::<io::Result<Vec<_>>>()?;
        Ok(Self { base, own, path })
    }

    /// The entries, each `NAME=VALUE`.
    pub(super) fn entries(&self) -> Vec<&CStr> {
        self.base
            .iter()
            .copied()
            .chain(self.own.iter().map(CString::as_c_str))
            .collect()
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

/// What to start: the command part of an attempt's spec, borrowed from it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Command<'a> {
    /// The command; `argv[0]` is the program. Must not be empty.
    pub argv: &'a [String],
    /// Variables added to the runner's environment.
    pub env: &'a [(String, String)],
    /// The runner's environment, which the attempt's starts from.
    pub base_env: &'a BaseEnv,
    /// Working directory; the runner's if `None`.
    pub cwd: Option<&'a Path>,
    /// Exported to the attempt as `LEASEHOLD_JOB_ID`.
    pub job_id: i64,
    /// Exported to the attempt as `LEASEHOLD_RUN_TOKEN`.
    pub run_token: &'a str,
    /// Under a keeper: the lease fence it starts with.
    pub fence: Option<files::LeaseFence>,
    /// Its manners and caps (the runner's manners filled in).
    pub limits: Limits,
}

/// A started main process and the parent's ends of its output pipes.
pub(super) struct Spawned {
    /// The main process.
    pub child: ChildProc,
    /// The read end of its stdout.
    pub stdout: OwnedFd,
    /// The read end of its stderr.
    pub stderr: OwnedFd,
    /// Its start time in clock ticks since boot, when the spawn fell within one
    /// tick (see [`proc::start_time_between`]).
    pub start_time: Option<u64>,
}

/// Why a spawn failed, and whose fault it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SpawnError {
    /// What failed and the OS reason.
    pub message: String,
    /// The runner ran out of something (descriptors, processes, memory) or
    /// could not start the attempt's keeper: the job is not at fault and may
    /// start once the runner can.
    pub resources: bool,
}

/// Whether an error is the runner's (or the system's) lack of a resource
/// rather than anything about the job: descriptors (EMFILE, ENFILE),
/// processes or threads (EAGAIN), memory (ENOMEM).
pub(super) fn out_of_resources(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::EAGAIN | libc::ENOMEM)
    )
}

/// What both kinds of spawn need of a command, checked and converted: its environment (with
/// the run token, or without it for a keeper, which passes it on to the command alone), the
/// program resolved on its PATH, and its argv as C strings.
pub(super) struct Prepared<'a> {
    pub env: ChildEnv<'a>,
    pub path: CString,
    pub argv: Vec<CString>,
}

/// Turns an OS error of spawning `program` into the spawn's error.
fn failure<'a>(
    program: &'a str,
    cwd: Option<&'a Path>,
) -> impl Fn(io::Error) -> SpawnError + Copy + 'a {
    move |e: io::Error| SpawnError {
        message: spawn_error(program, cwd, &e),
        resources: out_of_resources(&e),
    }
}

/// Checks `cmd`'s working directory and prepares what its spawn needs (see [`Prepared`]).
pub(super) fn prepare<'a>(cmd: &Command<'a>, program: &str) -> Result<Prepared<'a>, SpawnError> {
    let cwd = cmd.cwd;
    let fail = failure(program, cwd);
    if let Some(dir) = cwd {
        check_cwd(dir).map_err(|e| SpawnError {
            message: format!("spawn {program:?}: working directory {dir:?}: {e}"),
            resources: out_of_resources(&e),
        })?;
    }
    let env = ChildEnv::new(cmd).map_err(&fail)?;
    let path = resolve_program(OsStr::new(program), env.path, cwd).map_err(&fail)?;
    let path = c_string(path.into_os_string().into_vec()).map_err(&fail)?;
    let argv = cmd
        .argv
        .iter()
        .map(|a| c_string(a.as_bytes()))
        .collect::<io::Result<Vec<_>>>()
        .map_err(&fail)?;
    Ok(Prepared { env, path, argv })
}

/// Starts the attempt's main process (`program` is `cmd.argv[0]`). The
/// error's message is the text of [`Exit::SpawnFailed`](super::attempt::Exit::SpawnFailed).
pub(super) fn spawn(cmd: &Command<'_>, program: &str) -> Result<Spawned, SpawnError> {
    spawn_wrapped(cmd, program, None)
}

/// [`spawn`], through `wrapper` (a program and its first arguments, which exec the command
/// after them: the keeper's `exec` mode, which applies manners and caps) when given.
pub(super) fn spawn_wrapped(
    cmd: &Command<'_>,
    program: &str,
    wrapper: Option<(CString, Vec<CString>)>,
) -> Result<Spawned, SpawnError> {
    let cwd = cmd.cwd;
    let fail = failure(program, cwd);
    let Prepared {
        env,
        mut path,
        mut argv,
    } = prepare(cmd, program)?;
    if let Some((wrapper_path, mut first)) = wrapper {
        // `exec ... PROGRAM ARGV...`: the wrapper resolves no path and runs a script itself.
        first.push(std::mem::replace(&mut path, wrapper_path));
        first.append(&mut argv);
        argv = first;
    }
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
    let before = proc::boot_clock_ns();
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
    let start_time = before
        .zip(proc::boot_clock_ns())
        .and_then(|(before, after)| proc::start_time_between(before, after));
    // The child has its copies; with ours closed, EOF on the read ends means
    // every process of the attempt closed them.
    drop((stdout_w, stderr_w));
    Ok(Spawned {
        child: ChildProc::new(pid),
        stdout,
        stderr,
        start_time,
    })
}

/// Describes a spawn failure: what failed and the OS reason.
pub(super) fn spawn_error(program: &str, cwd: Option<&Path>, err: &io::Error) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::io::Read;
    use std::process::ExitStatus;
    use std::time::{Duration, Instant};

    use nix::sys::signal::Signal;

    /// What a test starts: an owned [`Command`].
    struct Spec {
        argv: Vec<String>,
        env: Vec<(String, String)>,
        base_env: BaseEnv,
        cwd: Option<PathBuf>,
        run_token: String,
    }

    /// A spec running `sh -c script`, adjusted per test.
    fn sh(script: &str, name: &str) -> Spec {
        Spec {
            argv: vec!["sh".into(), "-c".into(), script.into()],
            env: Vec::new(),
            base_env: BaseEnv::current(),
            cwd: None,
            run_token: format!("test-spawn-{}-{name}", std::process::id()),
        }
    }

    impl Spec {
        /// Starts it as an attempt of job 7.
        fn start(&self) -> Result<Spawned, String> {
            self.try_start().map_err(|e| {
                assert!(!e.resources, "out of resources: {}", e.message);
                e.message
            })
        }

        /// Starts it, with the error as spawn gives it.
        fn try_start(&self) -> Result<Spawned, SpawnError> {
            let cmd = Command {
                argv: &self.argv,
                env: &self.env,
                base_env: &self.base_env,
                cwd: self.cwd.as_deref(),
                job_id: 7,
                run_token: &self.run_token,
                fence: None,
                limits: Limits::default(),
            };
            spawn(&cmd, &self.argv[0])
        }
    }

    /// Waits, polling with a deadline, for `child` to exit, and reaps it.
    fn reap(child: &mut ChildProc) -> ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if child.exited().expect("waitid") {
                return child.reap().expect("waitpid");
            }
            assert!(Instant::now() < deadline, "pid {} did not exit", child.pid);
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Runs `spec` to its end: its exit code and stdout, or the spawn error.
    fn run_to_end(spec: &Spec) -> Result<(Option<i32>, String), String> {
        let Spawned {
            mut child,
            stdout,
            stderr,
            ..
        } = spec.start()?;
        let mut out = String::new();
        File::from(stdout)
            .read_to_string(&mut out)
            .expect("read stdout");
        let status = reap(&mut child);
        drop(stderr);
        Ok((status.code(), out))
    }

    #[test]
    fn running_out_of_descriptors_is_the_runners_fault_and_a_missing_program_the_jobs() {
        assert!(out_of_resources(&io::Error::from_raw_os_error(
            libc::EMFILE
        )));
        assert!(out_of_resources(&io::Error::from_raw_os_error(
            libc::EAGAIN
        )));
        assert!(!out_of_resources(&io::Error::from_raw_os_error(
            libc::ENOENT
        )));
        assert!(!out_of_resources(&io::Error::from_raw_os_error(
            libc::EACCES
        )));
    }

    #[test]
    fn the_start_time_from_the_boot_clock_is_the_one_proc_gives() {
        let spec = sh("sleep 1", "start-time");
        let mut known = 0;
        for _ in 0..20 {
            let mut spawned = spec.start().expect("spawn");
            let from_proc = proc::start_time(spawned.child.pid).expect("/proc/PID/stat");
            if let Some(t) = spawned.start_time {
                assert_eq!(t, from_proc);
                known += 1;
            }
            spawned.child.kill();
            reap(&mut spawned.child);
        }
        // A spawn crosses a 10 ms tick now and then, not most of the time.
        assert!(
            known >= 10,
            "only {known} of 20 spawns fell within one tick"
        );
    }

    #[test]
    fn env_job_id_token_and_cwd_are_applied() {
        let mut spec = sh(
            "echo $LEASEHOLD_JOB_ID $LEASEHOLD_RUN_TOKEN $FOO; pwd",
            "env",
        );
        spec.env = vec![("FOO".into(), "bar baz".into())];
        spec.cwd = Some(PathBuf::from("/tmp"));
        assert_eq!(
            run_to_end(&spec),
            Ok((Some(0), format!("7 {} bar baz\n/tmp\n", spec.run_token)))
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
            // `sleep` itself is the spawned process: what it shows is exactly
            // what the spawn gave it (a shell would change its own mask).
            let Spawned {
                mut child,
                stdout: _stdout,
                stderr: _stderr,
                ..
            } = spec.start().expect("spawns");
            // `sleep` briefly opens files of its own while it starts
            // (locale data); an inherited fd would stay, so wait, with a
            // deadline, for those to be closed.
            let deadline = Instant::now() + Duration::from_secs(2);
            let mut seen = status_and_fds(child.pid);
            while seen.1 != [0, 1, 2] && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
                seen = status_and_fds(child.pid);
            }
            child.kill();
            assert_eq!(reap(&mut child).code(), None, "killed by SIGKILL");
            drop(leaky);
            seen
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
    fn missing_program_fails_to_spawn_with_the_os_reason() {
        let mut spec = sh("", "missing");
        spec.argv = vec!["/no/such/program".into()];
        assert_eq!(
            run_to_end(&spec),
            Err("spawn \"/no/such/program\": No such file or directory (os error 2)".into())
        );
    }

    #[test]
    fn non_executable_program_fails_to_spawn() {
        let path = std::env::temp_dir().join(format!("leasehold-noexec-{}", std::process::id()));
        std::fs::write(&path, "echo hi\n").expect("write script");
        let mut spec = sh("", "noexec");
        spec.argv = vec![path.to_string_lossy().into_owned()];
        let r = run_to_end(&spec);
        std::fs::remove_file(&path).expect("remove script");
        assert!(
            matches!(&r, Err(m) if m.contains("Permission denied")),
            "{r:?}"
        );
    }

    #[test]
    fn bad_cwd_fails_to_spawn_naming_the_directory() {
        let mut spec = sh("exit 0", "badcwd");
        spec.cwd = Some(PathBuf::from("/no/such/dir"));
        match &run_to_end(&spec) {
            Err(m) => {
                assert!(m.contains("\"/no/such/dir\""), "{m}");
                assert!(m.contains("No such file or directory"), "{m}");
            }
            other => panic!("unexpected {other:?}"),
        }
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
        assert_eq!(run_to_end(&spec), Ok((Some(0), "found bin/hello\n".into())));

        // Only the non-executable match: EACCES, like execvp.
        spec.env = vec![("PATH".into(), "first".into())];
        assert_eq!(
            run_to_end(&spec),
            Err("spawn \"hello\": Permission denied (os error 13)".into())
        );

        // The job's PATH, not the runner's, is searched.
        let mut spec = sh("exit 0", "nopath");
        spec.env = vec![("PATH".into(), "/no/such/dir".into())];
        assert_eq!(
            run_to_end(&spec),
            Err("spawn \"sh\": No such file or directory (os error 2)".into())
        );
    }

    #[test]
    fn executable_without_shebang_runs_under_sh() {
        let dir = tempfile::tempdir().expect("tempdir");
        let script = dir.path().join("plain");
        write_file(&script, "echo via sh $0 $1\n", 0o755);
        let mut spec = sh("", "noshebang");
        spec.argv = vec![script.to_string_lossy().into_owned(), "arg".into()];
        assert_eq!(
            run_to_end(&spec),
            Ok((Some(0), format!("via sh {} arg\n", script.display())))
        );
    }

    #[test]
    fn nul_byte_fails_to_spawn() {
        let mut spec = sh("exit 0", "nul");
        spec.env = vec![("FOO".into(), "a\0b".into())];
        assert_eq!(
            run_to_end(&spec),
            Err("spawn \"sh\": nul byte found in provided data".into())
        );
    }
}
