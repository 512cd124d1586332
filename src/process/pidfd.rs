//! Processes held by pidfd: opened, then checked against the start time they were found
//! with, so that every later signal reaches that process or nobody, however long the kill
//! sequence waits and whatever the kernel does with its pid meanwhile.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::libc;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::Signal;

use super::child::pidfd_open;
use super::proc::{ProcInfo, start_time};

/// Processes not signalled because their identity could not be verified, since this process
/// started: a soak can read it (with the debug log line each one writes) to see that nothing
/// unverified was signalled, only left alone.
static REFUSED: AtomicU64 = AtomicU64::new(0);

/// How many targets were left unsignalled for want of a verified identity.
#[cfg_attr(not(test), expect(dead_code, reason = "read by tests and soaks"))]
pub(crate) fn refused_signals() -> u64 {
    REFUSED.load(Ordering::Relaxed)
}

/// Counts and logs a target left unsignalled.
pub(super) fn refuse(what: &str, id: i32, why: &str) {
    REFUSED.fetch_add(1, Ordering::Relaxed);
    log::debug!("not signalled: {what} {id}: {why}");
}

/// A process held by a pidfd whose identity was verified when it was opened.
#[derive(Debug)]
pub(super) struct Held {
    /// The pid it had when opened (for reports; never signalled as a number).
    pub pid: i32,
    fd: OwnedFd,
}

impl Held {
    /// Opens a pidfd for the process `found` describes, if it still is that process: the
    /// pidfd is opened first, then the start time is read again, so a pid recycled before
    /// the open shows another start time and is refused (`None`), as is a process already
    /// gone.
    pub(super) fn open(found: &ProcInfo) -> Option<Held> {
        let fd = pidfd_open(found.pid).ok()?;
        if start_time(found.pid) != Some(found.start_time) {
            refuse(
                "pid",
                found.pid,
                "its start time changed since it was found",
            );
            return None;
        }
        Some(Held { pid: found.pid, fd })
    }

    /// Sends `sig` to the process through its pidfd. A process that has exited (ESRCH) is
    /// not an error.
    pub(super) fn signal(&self, sig: Signal) -> io::Result<()> {
        // SAFETY: pidfd_send_signal(int pidfd, int sig, siginfo_t *info, unsigned int flags)
        // with a null info (the kernel fills it in as kill(2) would) reads no memory of ours;
        // the descriptor is open, owned by `self`.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.fd.as_raw_fd(),
                sig as libc::c_int,
                std::ptr::null::<libc::siginfo_t>(),
                0 as libc::c_uint,
            )
        };
        if ret == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ESRCH) {
            Ok(())
        } else {
            Err(err)
        }
    }

    /// Whether the process has exited (a zombie counts): its pidfd is then readable.
    pub(super) fn exited(&self) -> bool {
        let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::ZERO) {
            Ok(n) => n > 0,
            // Cannot tell: count it alive, so the kill sequence waits rather than stops early.
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::process::proc::proc_info;
    use crate::process::proc::tests::{spawn_group, token, wait_until};

    #[test]
    fn a_process_found_with_another_start_time_is_never_held_or_signalled() {
        let g = spawn_group("sleep 300", &token("heldwrong"));
        let pid = g.child.id() as i32;
        let mut found = proc_info(pid).expect("the sleep runs");
        found.start_time += 1;
        let refused = refused_signals();
        assert!(Held::open(&found).is_none());
        assert!(refused_signals() > refused);
        assert!(proc_info(pid).is_some_and(|p| !p.is_dead()), "still alive");
        found.start_time -= 1;
        let held = Held::open(&found).expect("the right start time is held");
        assert!(!held.exited());
        held.signal(Signal::SIGKILL).expect("signalled");
        assert!(wait_until(Duration::from_secs(3), || held.exited()));
        // After it exited, signalling is not an error.
        held.signal(Signal::SIGTERM).expect("ESRCH is no error");
        drop(g);
    }
}
