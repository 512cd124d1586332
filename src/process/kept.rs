//! The supervisor's side of an attempt run under a keeper (see [`keeper`](super::keeper)):
//! the keeper is the runner's child and the command's parent, reports the command's pid and
//! end over its control socket, and writes the output to files the runner reads at the end.
//!
//! While the keeper lives and the runner has not released it, the command is held unreaped
//! by the keeper, so its pid and process group id are the attempt's: the supervisor signals
//! the group by its id as it does a command it spawned itself. The keeper reaps the command
//! only once the runner releases it (says `release` once it has the command's end) or is
//! gone. A released keeper exits without making the outcome file durable: the runner's own
//! commit of the ending is the record. One whose runner went without a release fsyncs the
//! outcome before it exits.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use crossbeam_channel::{Receiver, Sender};

use super::child::ChildProc;
use super::keeper::{Control, Message, Received};
use super::output::Tail;
use crate::files::{self, Ended};

/// The process's one reaper of released keepers, started at the first release; `None` if
/// its thread could not be started.
static REAPER: OnceLock<Option<Sender<ChildProc>>> = OnceLock::new();

/// Where released keepers go to be reaped (see [`Keeping::release`]).
fn reaper() -> Option<&'static Sender<ChildProc>> {
    REAPER
        .get_or_init(|| {
            let (released, reaped) = crossbeam_channel::unbounded();
            let spawned = std::thread::Builder::new()
                .name("leasehold-keeper-reaper".to_owned())
                .spawn(move || reap_released(&reaped));
            match spawned {
                Ok(_) => Some(released),
                Err(e) => {
                    log::error!("cannot start the keepers' reaper thread: {e}");
                    None
                }
            }
        })
        .as_ref()
}

/// The reaper's loop: reaps each released keeper in the order they were released, which is
/// about the order they exit (a released keeper exits at once: it reaps its command, already
/// a zombie, and flushes nothing). The sender is a static, so the loop never ends.
fn reap_released(released: &Receiver<ChildProc>) {
    while let Ok(mut keeper) = released.recv() {
        if let Err(e) = keeper.reap() {
            log::error!("reaping keeper pid {}: {e}", keeper.pid);
        }
    }
}

/// The files a kept attempt writes, and their cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeptFiles {
    /// The attempts folder beside the database (`files::folder`).
    pub folder: PathBuf,
    /// The cap of each stream's file, in bytes (0: none).
    pub cap: u64,
    /// When the keeper stops the command unless the runner renews the lease (written to the
    /// attempt's folder before the keeper starts); `None`: the keeper never stops it itself.
    pub fence: Option<crate::files::LeaseFence>,
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

    /// Lets the keeper go: says `release` (it reaps the command and exits, with no fsync of
    /// the outcome, the runner holding the ending) and hands it to the process's reaper
    /// thread, so the worker does not wait the 0.1–0.2 ms of its exit. Called once the
    /// command's end was taken from the keeper's message, or once the keeper is lost (there
    /// is nobody to release then). The command's group is not signalled after this: the
    /// attempt is over, and the keeper reaps the command only now, whoever reaps the keeper.
    pub(super) fn release(mut self) {
        if let Some(control) = self.control.take() {
            control.release();
        }
        match reaper() {
            Some(reaper) => {
                if let Err(e) = reaper.send(self.keeper) {
                    // Cannot happen (the reaper's receiver lives as long as the process);
                    // its own thread then waits for it.
                    e.into_inner().leave();
                }
            }
            None => self.keeper.leave(),
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
