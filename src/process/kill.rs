//! Signals, and the one kill sequence: SIGTERM, a grace, SIGKILL while
//! anything is still alive, then a bounded wait.

use std::io;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// How often the kill sequence re-checks whether its targets have died: only
/// an attempt's main process has a pidfd, so the rest are looked up in
/// `/proc`. Short enough that a cooperative process is noticed promptly, long
/// enough that waiting costs next to no CPU.
pub(super) const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// How long to wait, after SIGKILL, for the kernel to finish killing the
/// targets before giving up on them. SIGKILL cannot be caught, so only a
/// process stuck in uninterruptible sleep takes longer than this.
pub(super) const AFTER_KILL_WAIT: Duration = Duration::from_secs(2);

/// The processes one run of the kill sequence ends, as its caller knows them:
/// an attempt's supervisor (which also reads output and reaps while it waits)
/// or the teardown of a lost attempt (which signals only what it verified).
pub(super) trait Targets {
    /// Sends `sig` to every target. Before SIGKILL the targets are looked for
    /// again: members forked and token carriers started during the grace are
    /// targets too.
    fn signal(&mut self, sig: Signal);

    /// Whether every target is gone; a zombie counts as gone.
    fn gone(&mut self) -> bool;

    /// Waits up to `step` before the next check: sleeps, or does the waiting
    /// in a `poll` that also serves the attempt's pipes.
    fn pause(&mut self, step: Duration);
}

/// THE kill sequence: SIGTERM to `targets`, up to `grace` for them to go,
/// then SIGKILL if any is still alive (any member of the group, not only its
/// leader), and up to [`AFTER_KILL_WAIT`] for the kernel to finish. Returns
/// whether all are gone; those left are stuck in uninterruptible sleep.
pub(super) fn kill_all(targets: &mut impl Targets, grace: Duration) -> bool {
    targets.signal(Signal::SIGTERM);
    if wait_gone(targets, grace) {
        return true;
    }
    targets.signal(Signal::SIGKILL);
    wait_gone(targets, AFTER_KILL_WAIT)
}

/// Checks every [`POLL_INTERVAL`] (or as `pause` returns) until `targets`
/// are gone or `limit` has passed. A limit too large for the clock means no
/// limit.
fn wait_gone(targets: &mut impl Targets, limit: Duration) -> bool {
    let deadline = Instant::now().checked_add(limit);
    loop {
        if targets.gone() {
            return true;
        }
        let left = deadline.map_or(POLL_INTERVAL, |d| {
            d.saturating_duration_since(Instant::now())
        });
        if left.is_zero() {
            return false;
        }
        targets.pause(POLL_INTERVAL.min(left));
    }
}

/// Refuses the ids whose signalling would hit init or (through the special
/// meanings of 0 and negative ids in `kill(2)`) a whole set of unrelated
/// processes.
fn check_target(what: &str, id: i32) -> io::Result<Pid> {
    if id <= 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("refusing to signal {what} {id}"),
        ));
    }
    Ok(Pid::from_raw(id))
}

/// Sends `sig` to every process of group `pgid`: only for the group of the
/// caller's own child while it is unreaped, a zombie leader included (a pgid
/// cannot be reused while a process with that pid exists). A group that no
/// longer exists is not an error: whatever we wanted to stop is already gone.
pub(crate) fn signal_group(pgid: i32, sig: Signal) -> io::Result<()> {
    match killpg(check_target("process group", pgid)?, sig) {
        Ok(()) | Err(Errno::ESRCH) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Sends `sig` to process `pid`, by number: only for the caller's own child
/// while it is unreaped (its pid cannot be recycled until then), and for the
/// tests' cleanup. Everything else is signalled through a verified pidfd. A
/// process that no longer exists is not an error.
pub(crate) fn signal_pid(pid: i32, sig: Signal) -> io::Result<()> {
    match kill(check_target("pid", pid)?, sig) {
        Ok(()) | Err(Errno::ESRCH) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_to_signal_init_or_special_ids() {
        for id in [-1, 0, 1] {
            assert!(signal_group(id, Signal::SIGTERM).is_err());
            assert!(signal_pid(id, Signal::SIGTERM).is_err());
        }
        // A group that does not exist is not an error.
        assert!(signal_group(i32::MAX, Signal::SIGTERM).is_ok());
    }
}
