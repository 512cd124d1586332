//! The supervisor's side of an attempt run under a keeper (see [`keeper`](super::keeper)):
//! the keeper is the runner's child and the command's parent, reports the command's pid and
//! end over its control socket, and writes the output to files the runner reads at the end.
//!
//! While the keeper lives and the runner has not released it, the command is held unreaped
//! by the keeper, so its pid and process group id are the attempt's: the supervisor signals
//! the group by its id as it does a command it spawned itself. The keeper reaps the command
//! only once the runner closes its end of the socket (the release) or is gone.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use super::child::ChildProc;
use super::keeper::{Control, Message, Received};
use super::output::Tail;
use crate::files::{self, Ended};

/// How long a worker waits for a released keeper to exit before leaving it to a background
/// reaper.
const RELEASE_WAIT: Duration = Duration::from_millis(20);

/// The files a kept attempt writes, and their cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeptFiles {
    /// The attempts folder beside the database (`files::folder`).
    pub folder: PathBuf,
    /// The cap of each stream's file, in bytes (0: none).
    pub cap: u64,
}

/// An attempt's output files as a supervisor reads them: their change times, which the idle
/// timeout reads, and their tails, which the database keeps.
pub(crate) struct OutputFiles {
    /// The attempt's folder.
    dir: PathBuf,
    /// When the files were last seen to change.
    last_change: Option<SystemTime>,
}

impl OutputFiles {
    /// The files in the attempt's folder `dir`.
    pub(crate) fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            last_change: None,
        }
    }

    /// The age of the newest change to either file, when it is newer than the last one seen.
    pub(super) fn new_change_age(&mut self) -> Option<Duration> {
        let newest = files::newest_change(&self.dir)?;
        if self.last_change.is_some_and(|seen| seen >= newest) {
            return None;
        }
        self.last_change = Some(newest);
        Some(SystemTime::now().duration_since(newest).unwrap_or_default())
    }

    /// The last `tail` bytes of each stream (empty where a file cannot be read, which is
    /// logged).
    pub(crate) fn tails(&self, tail: usize) -> (Tail, Tail) {
        let read = |name: &str| match files::read_tail(&self.dir.join(name), tail) {
            Ok((bytes, truncated)) => Tail { bytes, truncated },
            Err(e) => {
                log::warn!("reading {}: {e}", self.dir.join(name).display());
                Tail::default()
            }
        };
        (read(files::STDOUT), read(files::STDERR))
    }
}

/// A running keeper, from its spawn until it is reaped.
pub(super) struct Keeping {
    /// The keeper: the runner's child.
    keeper: ChildProc,
    /// The runner's end of the control socket; `None` once released or at its EOF.
    control: Option<Control>,
    /// The attempt's output files.
    files: OutputFiles,
    /// The command's end as the keeper reported it.
    pub ended: Option<Ended>,
    /// Whether a pipe of the command was still held open when the keeper stopped draining.
    pub pipes_open: bool,
    /// The keeper went away before it reported the command's end: the command is no longer
    /// held, and its group id no longer provably the attempt's.
    pub lost: bool,
}

impl Keeping {
    /// The keeper `keeper`, talking over `control`, of the attempt whose folder is `dir`.
    pub(super) fn new(keeper: ChildProc, control: Control, dir: PathBuf) -> Self {
        Self {
            keeper,
            control: Some(control),
            files: OutputFiles::new(dir),
            ended: None,
            pipes_open: false,
            lost: false,
        }
    }

    /// The keeper's pid.
    pub(super) fn pid(&self) -> i32 {
        self.keeper.pid
    }

    /// The control socket, to poll while the keeper has not reported the end.
    pub(super) fn control_fd(&self) -> Option<BorrowedFd<'_>> {
        self.control.as_ref().map(AsFd::as_fd)
    }

    /// Reads what the keeper sent: notes the command's end, or the keeper's loss at an EOF
    /// that came before it.
    pub(super) fn read(&mut self) {
        let Some(control) = &mut self.control else {
            return;
        };
        let eof = loop {
            match control.next() {
                Ok(Received::Message(Message::Exited { ended, pipes_open })) => {
                    self.ended = Some(ended);
                    self.pipes_open = pipes_open;
                }
                Ok(Received::Message(other)) => {
                    log::warn!("keeper pid {}: unexpected {other:?}", self.keeper.pid);
                }
                Ok(Received::Pending) => break false,
                Ok(Received::Closed) => break true,
                Err(e) => {
                    log::error!("reading keeper pid {}: {e}", self.keeper.pid);
                    break true;
                }
            }
        };
        if eof {
            self.control = None;
            if self.ended.is_none() {
                self.lost = true;
            }
        }
    }

    /// The attempt's output files.
    pub(super) fn files(&mut self) -> &mut OutputFiles {
        &mut self.files
    }

    /// Lets the keeper go (it reaps the command and exits) and reaps it. A released keeper
    /// exits at once, unless its outcome could not be written (a full disk): it then retries
    /// that every second, and is left to a background reaper rather than hold the worker.
    pub(super) fn release(mut self) {
        self.control = None;
        let deadline = Instant::now() + RELEASE_WAIT;
        loop {
            match self.keeper.exited() {
                Ok(true) => {
                    if let Err(e) = self.keeper.reap() {
                        log::error!("reaping keeper pid {}: {e}", self.keeper.pid);
                    }
                    return;
                }
                Ok(false) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_micros(100));
                }
                Ok(false) => {
                    log::debug!(
                        "keeper pid {} still runs once released; reaped when it exits",
                        self.keeper.pid
                    );
                    self.keeper.leave();
                    return;
                }
                Err(e) => {
                    log::error!("waiting for keeper pid {}: {e}", self.keeper.pid);
                    return;
                }
            }
        }
    }

    /// Leaves the keeper running on its own, without a runner: it records the outcome
    /// itself. The process is not the runner's to reap any more once the runner exits; until
    /// then a background thread waits for it.
    pub(super) fn leave(self) {
        let Self {
            keeper, control, ..
        } = self;
        drop(control);
        keeper.leave();
    }
}
