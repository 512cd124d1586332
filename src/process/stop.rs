//! Stopping a running attempt from another thread: the reason, and the
//! eventfd that wakes the attempt's supervisor.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use nix::errno::Errno;
use nix::libc;

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
    /// The runner is shutting down and leaves the attempt running under its keeper: nothing
    /// is killed, and the next runner adopts it.
    Leave,
    /// A condition of the job ([`crate::Condition`]) stopped holding and its `when_lost` is
    /// `stop`: killed as a shutdown kills it, and put back to wait without spending anything.
    ConditionLost,
}

impl StopReason {
    /// The non-zero code under which the reason is stored atomically.
    fn code(self) -> u8 {
        match self {
            Self::Cancelled => 1,
            Self::LeaseLost => 2,
            Self::Shutdown => 3,
            Self::SelfFenced => 4,
            Self::Leave => 5,
            Self::ConditionLost => 6,
        }
    }

    /// The inverse of [`StopReason::code`]; `None` for 0 ("not stopped").
    fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::Cancelled),
            2 => Some(Self::LeaseLost),
            3 => Some(Self::Shutdown),
            4 => Some(Self::SelfFenced),
            5 => Some(Self::Leave),
            6 => Some(Self::ConditionLost),
            _ => None,
        }
    }
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
/// Stopping before [`run`](super::attempt::run) is called makes it return
/// without spawning.
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

    /// The wake-up eventfd, for the supervisor's poll set: readable once
    /// stopped.
    pub(super) fn wake(&self) -> BorrowedFd<'_> {
        self.shared.wake.as_fd()
    }

    /// The reason the attempt was stopped, if it was.
    pub(crate) fn reason(&self) -> Option<StopReason> {
        StopReason::from_code(self.shared.reason.load(Ordering::Acquire))
    }
}
