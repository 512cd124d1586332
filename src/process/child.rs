//! The attempt's main process from its spawn until it is reaped: waiting for
//! it (`waitpid`, a pidfd that wakes a `poll` when it exits) and killing it.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use nix::libc;
use nix::sys::signal::Signal;

use super::kill;

/// The attempt's main process until it is reaped. Exactly one `waitpid`
/// collects it; dropping it unreaped (a process stuck even after SIGKILL, or
/// unwinding) SIGKILLs it and leaves the wait to a background thread, so it
/// never stays a zombie. Until reaped its pid cannot be recycled, so
/// signalling the pid (or, as its leader, its process group) always hits
/// the attempt: the supervisor reaps it only once the attempt is over.
#[derive(Debug)]
pub(super) struct ChildProc {
    /// The pid.
    pub pid: i32,
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
    /// The process `pid`, just spawned and not yet reaped.
    pub(super) fn new(pid: i32) -> Self {
        Self { pid, reaped: false }
    }

    /// Whether the process has exited, WITHOUT reaping it (`waitid` with
    /// `WNOWAIT`): an exited main process stays a zombie, so neither its pid
    /// nor its process group id can be reused while the attempt's group may
    /// still be signalled. An error (ECHILD: someone else reaped it) means it
    /// is gone and its status lost.
    pub(super) fn exited(&mut self) -> io::Result<bool> {
        let id = libc::id_t::try_from(self.pid).map_err(io::Error::other)?;
        loop {
            // SAFETY: zeroed is a valid siginfo_t (plain integers and unions of them).
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: waitid writes one siginfo_t through the pointer, which points
            // to `info`.
            let ret = unsafe {
                libc::waitid(
                    libc::P_PID,
                    id,
                    &raw mut info,
                    libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
                )
            };
            if ret == 0 {
                // SAFETY: after a successful waitid the pid field is set: 0 when no
                // child has changed state (WNOHANG), else the child's pid.
                return Ok(unsafe { info.si_pid() } != 0);
            }
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EINTR) => {}
                Some(libc::ECHILD) => {
                    self.reaped = true;
                    return Err(err);
                }
                _ => return Err(err),
            }
        }
    }

    /// Reaps the process, which [`ChildProc::exited`] said has exited, and
    /// returns its status.
    pub(super) fn reap(&mut self) -> io::Result<ExitStatus> {
        let result = waitpid(self.pid, 0);
        // Reaped now, or by someone else (ECHILD): either way there is nothing
        // left to reap.
        self.reaped = true;
        result?.ok_or_else(|| io::Error::other("waitpid without WNOHANG returned no status"))
    }

    /// Sends SIGKILL to the process (not its group).
    pub(super) fn kill(&self) {
        if let Err(e) = kill::signal_pid(self.pid, Signal::SIGKILL) {
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
        reap_in_background(self.pid);
    }
}

/// Waits for child `pid` in a thread of its own, so that it never stays a zombie.
fn reap_in_background(pid: i32) {
    let spawned = std::thread::Builder::new()
        .name(format!("reap-{pid}"))
        .spawn(move || {
            if let Err(e) = waitpid(pid, 0) {
                log::error!("reaping pid {pid}: {e}");
            }
        });
    if let Err(e) = spawned {
        log::error!("cannot start a reaper thread for pid {pid}: {e}");
    }
}

/// Opens a pidfd for `pid`: a descriptor that becomes readable when the
/// process exits, which lets the exit wake the same `poll` as output and
/// stop requests.
pub(super) fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
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
