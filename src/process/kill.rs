//! Signals, and the one kill sequence: SIGTERM, a grace, SIGKILL while
//! anything is still alive, then a bounded wait.

use std::io;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

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

/// Sends `sig` to every process of group `pgid`. A group that no longer
/// exists is not an error: whatever we wanted to stop is already gone.
pub(crate) fn signal_group(pgid: i32, sig: Signal) -> io::Result<()> {
    match killpg(check_target("process group", pgid)?, sig) {
        Ok(()) | Err(Errno::ESRCH) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Sends `sig` to process `pid`. A process that no longer exists is not an
/// error.
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
