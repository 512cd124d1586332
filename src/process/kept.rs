//! The supervisor's side of an attempt run under the runner's keeper (see
//! [`keeper`](super::keeper)): the keeper is the command's parent, reports its pid and its
//! end over the attempt's control socket, with its output when it was short, or in the
//! attempt's files.
//!
//! While the keeper holds the attempt and the runner has not released it, the command is
//! held unreaped by the keeper, so its pid and process group id are the attempt's: the
//! supervisor signals the group by its id as it does a command it spawned itself. The keeper
//! reaps the command only once the runner releases it, after its ending is committed
//! ([`Release`]), or once the runner is gone, after it journaled the outcome durably.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;

use super::keeper::{Control, Message, Output, Received};
use super::output::Tail;
use crate::files::{self, Ended};

/// The files a kept attempt writes, and their cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeptFiles {
    /// The attempts folder beside the database (`files::folder`).
    pub folder: PathBuf,
    /// The cap of each stream's file, in bytes (0: none).
    pub cap: u64,
    /// When the keeper stops the command unless the runner renews the lease; `None`: the
    /// keeper never stops it itself.
    pub fence: Option<crate::files::LeaseFence>,
}

/// An attempt's output files as a supervisor reads them: their change times, which the idle
/// timeout reads, and their tails, which the database keeps.
pub(crate) struct OutputFiles {
    /// The attempt's folder.
    pub(super) dir: PathBuf,
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

/// An attempt the keeper holds, from its spawn until it is released or left.
pub(super) struct Keeping {
    /// The keeper's pid.
    keeper: i32,
    /// The runner's end of the control socket; `None` at its EOF.
    control: Option<Control>,
    /// The attempt's output files.
    files: OutputFiles,
    /// The command's end as the keeper reported it.
    pub ended: Option<Ended>,
    /// The output, when the keeper sent it with the end; `None` while it is in the files.
    pub output: Option<(Vec<u8>, Vec<u8>)>,
    /// Whether a pipe of the command was still held open when the keeper stopped draining.
    pub pipes_open: bool,
    /// Nothing of the attempt outlived its main process, as the keeper (their subreaper)
    /// knows: no member of its group is looked for.
    pub alone: bool,
    /// The keeper let the attempt go before it reported the command's end (it died, or its
    /// lease fence stopped the command): the command is no longer held, and its group id no
    /// longer provably the attempt's.
    pub lost: bool,
    /// The attempt's cgroup, in the cgroup mode: its processes, whatever their group.
    pub cgroup: Option<PathBuf>,
}

impl Keeping {
    /// The attempt kept by `keeper`, talking over `control`, whose folder is `dir`, in
    /// `cgroup` if it has one.
    pub(super) fn new(
        keeper: i32,
        control: Control,
        dir: PathBuf,
        cgroup: Option<PathBuf>,
    ) -> Self {
        Self {
            cgroup,
            keeper,
            control: Some(control),
            files: OutputFiles::new(dir),
            ended: None,
            output: None,
            pipes_open: false,
            alone: false,
            lost: false,
        }
    }

    /// The keeper's pid.
    pub(super) fn pid(&self) -> i32 {
        self.keeper
    }

    /// The control socket, to poll while the keeper has not reported the end.
    pub(super) fn control_fd(&self) -> Option<BorrowedFd<'_>> {
        self.control
            .as_ref()
            .filter(|_| self.ended.is_none())
            .map(AsFd::as_fd)
    }

    /// Reads what the keeper sent: notes the command's end, or the attempt's loss at an EOF
    /// that came before it.
    pub(super) fn read(&mut self) {
        let Some(control) = &mut self.control else {
            return;
        };
        let eof = loop {
            match control.next() {
                Ok(Received::Message(Message::Exited {
                    ended,
                    pipes_open,
                    alone,
                    output,
                })) => {
                    self.ended = Some(ended);
                    self.pipes_open = pipes_open;
                    self.alone = alone;
                    if let Output::Memory(out, err) = output {
                        self.output = Some((out, err));
                    }
                    break false;
                }
                Ok(Received::Message(other)) => {
                    log::warn!("keeper pid {}: unexpected {other:?}", self.keeper);
                }
                Ok(Received::Pending) => break false,
                Ok(Received::Closed) => break true,
                Err(e) => {
                    log::error!("reading keeper pid {}: {e}", self.keeper);
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

    /// The tails of the output: from the keeper's message, or from the files.
    pub(super) fn tails(&self, tail: usize) -> (Tail, Tail) {
        match &self.output {
            Some((out, err)) => (memory_tail(out, tail), memory_tail(err, tail)),
            None => self.files.tails(tail),
        }
    }

    /// What releases the command once its ending is committed. The attempt's folder goes
    /// with the release when the database's tails hold all of its output (`whole`).
    pub(super) fn release(self, whole: bool) -> Release {
        let cleanup = (whole && self.output.is_none()).then(|| self.files.dir.clone());
        Release(Arc::new(Mutex::new(Some((self.control, cleanup)))))
    }

    /// Leaves the attempt running under the keeper, without a runner: it journals the
    /// outcome itself.
    pub(super) fn leave(self) {
        drop(self.control);
    }
}

/// The last `tail` bytes of `bytes`, as a stream's tail.
fn memory_tail(bytes: &[u8], tail: usize) -> Tail {
    let start = bytes.len().saturating_sub(tail);
    Tail {
        bytes: bytes[start..].to_vec(),
        truncated: start > 0,
    }
}

/// Lets the keeper go of an ended attempt once the runner's commit of its ending is done
/// ([`Release::release`]): until then the keeper holds the command unreaped and its outcome
/// in memory, so a runner that dies before the commit has the outcome journaled, not lost.
/// Dropped without a release, it is the runner going away: the keeper journals the outcome.
#[derive(Debug, Clone)]
pub(crate) struct Release(Arc<Mutex<Option<Releasing>>>);

/// What a release does, once: the control socket to say `release` on (none for a lost
/// attempt), and the folder to remove after.
type Releasing = (Option<Control>, Option<PathBuf>);

impl PartialEq for Release {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Release {}

impl Release {
    /// Says `release` to the keeper (once; later calls do nothing), then removes the
    /// attempt's folder when the database holds all of its output.
    pub(crate) fn release(&self) {
        let Some((control, cleanup)) = self.0.lock().take() else {
            return;
        };
        if let Some(control) = control {
            control.release();
        }
        if let Some(dir) = cleanup {
            files::remove_attempt_dir(&dir);
        }
    }
}
