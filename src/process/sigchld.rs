//! Whether this process can still read its children's exit statuses.
//!
//! A process whose SIGCHLD disposition is `SIG_IGN`, or whose SIGCHLD handler was installed
//! with `SA_NOCLDWAIT`, has its children reaped by the kernel as they exit: `waitpid` then
//! finds no child, and an attempt's exit status is lost. An embedding application may have
//! set either (a daemon that never wanted zombies); a runner refuses to start under it
//! rather than record every job as failed for a reason nobody can see.

use std::io;

use nix::libc;

/// Why children's exit statuses would be lost in this process; None when they are not.
///
/// # Errors
///
/// The disposition cannot be read (`sigaction` failed).
pub(crate) fn statuses_lost() -> io::Result<Option<&'static str>> {
    let mut old = std::mem::MaybeUninit::<libc::sigaction>::zeroed();
    // SAFETY: a null `act` only reads the current disposition into `old`, which is a valid,
    // writable `sigaction`; nothing is changed.
    let rc = unsafe { libc::sigaction(libc::SIGCHLD, std::ptr::null(), old.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: sigaction returned 0, so it filled `old` (it was zeroed before in any case).
    let old = unsafe { old.assume_init() };
    Ok(if old.sa_sigaction == libc::SIG_IGN {
        Some("SIGCHLD is ignored (SIG_IGN)")
    } else if old.sa_flags & libc::SA_NOCLDWAIT != 0 {
        Some("SIGCHLD's handler was installed with SA_NOCLDWAIT")
    } else {
        None
    })
}
