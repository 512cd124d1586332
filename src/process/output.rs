//! An attempt's output: its pipes, read without blocking, and the bounded
//! tail kept of each stream.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};

use nix::fcntl::{FcntlArg, OFlag, fcntl};

/// How much one wake-up reads from one pipe before giving the other pipe and
/// the deadlines a turn; poll is level-triggered so the rest is read next.
const READ_BUDGET: usize = 1 << 20;

/// The last bytes of one output stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Tail {
    /// At most `tail_bytes` bytes: the end of the stream.
    pub bytes: Vec<u8>,
    /// Whether the stream produced more than `tail_bytes` bytes.
    pub truncated: bool,
}

/// Keeps the last `cap` bytes written to it.
#[derive(Debug)]
pub(super) struct TailBuf {
    /// The kept bytes, oldest first.
    buf: VecDeque<u8>,
    /// How many bytes to keep.
    cap: usize,
    /// Whether any byte was dropped.
    truncated: bool,
}

impl TailBuf {
    /// An empty tail keeping at most `cap` bytes.
    pub(super) fn new(cap: usize) -> Self {
        Self {
            // Grows on demand: most jobs print far less than the cap.
            buf: VecDeque::new(),
            cap,
            truncated: false,
        }
    }

    /// Appends `data`, dropping the oldest bytes beyond the cap.
    fn push(&mut self, data: &[u8]) {
        if self.buf.len() + data.len() > self.cap {
            self.truncated = true;
        }
        if data.len() >= self.cap {
            self.buf.clear();
            self.buf.extend(&data[data.len() - self.cap..]);
            return;
        }
        let overflow = (self.buf.len() + data.len()).saturating_sub(self.cap);
        self.buf.drain(..overflow);
        self.buf.extend(data);
    }

    /// The kept bytes as a [`Tail`].
    pub(super) fn finish(self) -> Tail {
        Tail {
            bytes: self.buf.into(),
            truncated: self.truncated,
        }
    }
}

/// One output pipe of the attempt and the tail collected from it.
pub(super) struct Stream {
    /// The read end; `None` once it reached EOF or was closed.
    pub pipe: Option<File>,
    /// Whether the pipe is non-blocking, so reading until EAGAIN is safe.
    pub nonblocking: bool,
    /// What was read so far.
    pub tail: TailBuf,
}

impl Stream {
    /// Wraps a pipe read end, making it non-blocking so reading what is
    /// available can never stall the supervisor.
    pub(super) fn new(pipe: OwnedFd, cap: usize) -> Self {
        let pipe = File::from(pipe);
        let nonblocking = set_nonblocking(&pipe)
            // Still correct: we only read after poll reports the pipe ready,
            // and such a read does not block; reading just shortens to one
            // read per wake-up.
            .inspect_err(|e| log::warn!("cannot make an attempt pipe non-blocking: {e}"))
            .is_ok();
        Self {
            pipe: Some(pipe),
            nonblocking,
            tail: TailBuf::new(cap),
        }
    }

    /// A stream without a pipe: a kept attempt's output goes to files.
    pub(super) fn closed(cap: usize) -> Self {
        Self {
            pipe: None,
            nonblocking: true,
            tail: TailBuf::new(cap),
        }
    }

    /// Reads what is available (up to a budget) into the tail. Returns whether
    /// anything was read. Closes the pipe on EOF or error.
    pub(super) fn read_available(&mut self, buf: &mut [u8]) -> bool {
        let mut got = 0;
        while let Some(pipe) = &mut self.pipe {
            match pipe.read(buf) {
                Ok(0) => self.pipe = None,
                Ok(n) => {
                    self.tail.push(&buf[..n]);
                    got += n;
                    if got >= READ_BUDGET || !self.nonblocking {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    log::warn!("reading attempt output: {e}");
                    self.pipe = None;
                }
            }
        }
        got > 0
    }
}

/// Sets `O_NONBLOCK` on `fd`.
/// `fd` is the read end of a pipe made by `spawn::output_pipe`, whose file
/// status flags are otherwise clear (O_CLOEXEC is a descriptor flag), so they
/// are set without reading them first: one syscall a stream instead of two.
fn set_nonblocking(fd: &impl AsFd) -> io::Result<()> {
    fcntl(fd, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    Ok(())
}

/// The size of the buffer output is read through.
const READ_BUF_SIZE: usize = 64 * 1024;

thread_local! {
    /// The read buffer of the thread's last attempt, kept for its next one: a worker runs
    /// one attempt at a time, and a fresh zeroed 64 KiB per attempt shows on short jobs.
    static READ_BUF: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The thread's read buffer (a new one if it has none).
pub(super) fn read_buffer() -> Vec<u8> {
    let buf = READ_BUF.take();
    if buf.len() == READ_BUF_SIZE {
        buf
    } else {
        vec![0; READ_BUF_SIZE]
    }
}

/// Keeps `buf` as the thread's read buffer, for its next attempt.
pub(super) fn keep_read_buffer(buf: Vec<u8>) {
    READ_BUF.set(buf);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_bytes_across_pushes() {
        let mut t = TailBuf::new(5);
        t.push(b"abc");
        assert!(!t.truncated);
        t.push(b"de");
        assert!(!t.truncated);
        t.push(b"fg");
        assert!(t.truncated);
        assert_eq!(t.finish().bytes, b"cdefg");
        let mut t = TailBuf::new(3);
        t.push(b"abcdef");
        assert_eq!(t.finish().bytes, b"def");
        let mut t = TailBuf::new(0);
        t.push(b"");
        assert!(!t.truncated);
        t.push(b"x");
        let t = t.finish();
        assert!(t.truncated && t.bytes.is_empty());
    }
}
