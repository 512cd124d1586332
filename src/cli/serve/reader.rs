//! The reader: the one thread that accepts connections and gathers their requests, so that a
//! pool thread is only ever given a whole request to answer.
//!
//! Every accepted connection is nonblocking and waits in one `poll(2)` set until its head (and
//! small body) has arrived, within [`HEAD_DEADLINE`] of its accept; then the parsed request
//! goes to the pool. A connection that sends nothing, or too little, holds no thread and is
//! closed at its deadline. The connections waiting here are bounded in total and per peer
//! address, and past either bound a connection is answered 503 at once.

use std::io::{ErrorKind, Read};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use crossbeam_channel::{Sender, TrySendError};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::http::{self, HEAD_DEADLINE, MAX_REQUEST, ReadError, Request, Response};

/// Connections whose request has not all arrived yet, from every peer. Local clients all
/// come from 127.0.0.1 (or ::1), so a per-peer bound cannot tell local users apart: this
/// total and the head deadline are what keep a loopback listener serving, since a silent
/// connection costs a place here for [`HEAD_DEADLINE`] and no thread at all.
pub const MAX_READING: usize = 256;
/// Connections from one remote peer address whose request has not all arrived yet: one
/// remote host cannot take every place of [`MAX_READING`]. Not applied to loopback peers:
/// there it would let any local process lock every local user out with 32 connections.
pub const MAX_READING_PER_PEER: usize = 32;
/// Connections accepted in one round before the waiting ones are read again, so that a flood
/// of connects cannot starve them.
const ACCEPTS_PER_ROUND: usize = 64;

/// A whole request (or why it is not one), with its connection, for a pool thread.
pub type Ready = (TcpStream, Result<Request, ReadError>);

/// A connection whose request has not all arrived.
struct Reading {
    stream: TcpStream,
    peer: IpAddr,
    buf: Vec<u8>,
    deadline: Instant,
}

/// What one round did with a waiting connection.
enum Step {
    Wait(Reading),
    Done(TcpStream, Result<Request, ReadError>),
    Close,
}

/// Accepts and reads until the process is killed; returns only when `listener` cannot be
/// made nonblocking or `poll` fails for a reason other than a signal.
pub fn run(listener: &TcpListener, pool: &Sender<Ready>) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let mut reading: Vec<Reading> = Vec::new();
    loop {
        let wait = reading
            .iter()
            .map(|r| r.deadline)
            .min()
            .map(|d| d.saturating_duration_since(Instant::now()));
        let (accept, ready) = {
            let mut fds = Vec::with_capacity(reading.len() + 1);
            fds.push(PollFd::new(listener.as_fd(), PollFlags::POLLIN));
            fds.extend(
                reading
                    .iter()
                    .map(|r| PollFd::new(r.stream.as_fd(), PollFlags::POLLIN)),
            );
            match poll(&mut fds, poll_timeout(wait)) {
                Ok(_) => {}
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
            let ready: Vec<bool> = fds.iter().map(|f| f.any().unwrap_or(false)).collect();
            (ready[0], ready[1..].to_vec())
        };
        let now = Instant::now();
        reading = reading
            .into_iter()
            .zip(ready)
            .filter_map(|(r, ready)| match step(r, ready, now) {
                Step::Wait(r) => Some(r),
                Step::Done(stream, request) => {
                    hand_over(pool, stream, request);
                    None
                }
                Step::Close => None,
            })
            .collect();
        if accept {
            accept_some(listener, &mut reading, now);
        }
    }
}

/// Reads what `r`'s connection has sent (when `ready`), and decides: a whole request (or a
/// refused one) is done, a connection that went away or is past its deadline is closed.
fn step(mut r: Reading, ready: bool, now: Instant) -> Step {
    let mut gone = false;
    if ready {
        let mut chunk = [0u8; 4096];
        while r.buf.len() <= MAX_REQUEST {
            match r.stream.read(&mut chunk) {
                Ok(0) => {
                    gone = true;
                    break;
                }
                Ok(n) => r.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(_) => {
                    gone = true;
                    break;
                }
            }
        }
        // A client may send its request and then shut its side down: parse before closing.
        match http::parse_request(&r.buf) {
            Ok(Some(request)) => return Step::Done(r.stream, Ok(request)),
            Err(e) => return Step::Done(r.stream, Err(e)),
            Ok(None) => {}
        }
    }
    if gone {
        return Step::Close;
    }
    if now >= r.deadline {
        // A client that sent nothing gets no answer (a browser may open a connection ahead
        // of need); one that sent part of a request is told why it is closed.
        if !r.buf.is_empty() {
            refuse(&mut r.stream, 408, "the request did not arrive in time\n");
        }
        return Step::Close;
    }
    Step::Wait(r)
}

/// Accepts the connections waiting on `listener` (at most [`ACCEPTS_PER_ROUND`]), admitting
/// each within the bounds or answering it 503.
fn accept_some(listener: &TcpListener, reading: &mut Vec<Reading>, now: Instant) {
    for _ in 0..ACCEPTS_PER_ROUND {
        let (mut stream, peer) = match listener.accept() {
            Ok(accepted) => accepted,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => {
                // Out of descriptors, most likely: wait a little rather than spin.
                log::warn!("serve: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
                return;
            }
        };
        // An accepted socket does not inherit the listener's O_NONBLOCK on Linux.
        if let Err(e) = stream.set_nonblocking(true) {
            log::warn!("serve: cannot make a connection nonblocking: {e}");
            continue;
        }
        let peer = peer.ip();
        match refusal(reading.iter().map(|r| r.peer), peer) {
            Some(why) => refuse(&mut stream, 503, why),
            None => reading.push(Reading {
                stream,
                peer,
                buf: Vec::new(),
                deadline: now + HEAD_DEADLINE,
            }),
        }
    }
}

/// Why a new connection from `peer` is refused, beside the waiting ones from `waiting`;
/// `None` when it is admitted.
fn refusal(waiting: impl ExactSizeIterator<Item = IpAddr>, peer: IpAddr) -> Option<&'static str> {
    if waiting.len() >= MAX_READING {
        Some("busy: try again\n")
    } else if !peer.is_loopback() && waiting.filter(|&p| p == peer).count() >= MAX_READING_PER_PEER
    {
        Some("too many connections from your address\n")
    } else {
        None
    }
}

/// Gives a whole request to the pool, or answers 503 when its queue is full.
fn hand_over(pool: &Sender<Ready>, stream: TcpStream, request: Result<Request, ReadError>) {
    if let Err(TrySendError::Full((mut stream, _)) | TrySendError::Disconnected((mut stream, _))) =
        pool.try_send((stream, request))
    {
        refuse(&mut stream, 503, "busy: try again\n");
    }
}

/// Answers a short plain-text refusal on a nonblocking connection: it fits in the socket's
/// buffer, and a client that does not take it loses only it.
fn refuse(stream: &mut TcpStream, status: u16, body: &str) {
    http::write_response(stream, &Response::text(status, body), false);
    // Closing with unread bytes sends a reset, which may discard the answer before the
    // client reads it: take what has arrived (a request, usually) first.
    let mut chunk = [0u8; 4096];
    for _ in 0..MAX_REQUEST / chunk.len() + 1 {
        if !matches!(stream.read(&mut chunk), Ok(n) if n > 0) {
            break;
        }
    }
}

/// `wait` as a poll timeout, rounded up to a millisecond so that a deadline is never polled
/// just short of; no deadline is an endless wait.
fn poll_timeout(wait: Option<Duration>) -> PollTimeout {
    match wait {
        None => PollTimeout::NONE,
        Some(d) => u32::try_from(d.as_nanos().div_ceil(1_000_000))
            .ok()
            .and_then(|ms| PollTimeout::try_from(ms).ok())
            .unwrap_or(PollTimeout::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_bounded_in_total_and_per_remote_peer() {
        let local: IpAddr = "127.0.0.1".parse().unwrap();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let peers = |n: usize, p: IpAddr| std::iter::repeat_n(p, n).collect::<Vec<_>>();
        let full_a = peers(MAX_READING_PER_PEER, a);
        assert!(refusal(full_a.iter().copied(), a).is_some());
        assert_eq!(refusal(full_a.iter().copied(), b), None);
        assert_eq!(refusal(full_a.iter().copied(), local), None);
        assert_eq!(
            refusal(peers(MAX_READING_PER_PEER - 1, a).into_iter(), a),
            None
        );
        // Local clients share one address: only the total bounds them.
        let many_local = peers(MAX_READING - 1, local);
        assert_eq!(refusal(many_local.iter().copied(), local), None);
        let full = peers(MAX_READING, local);
        for p in [local, a, b] {
            assert!(refusal(full.iter().copied(), p).is_some());
        }
    }

    /// A connection accepted from a real loopback listener, as the reader holds it, and the
    /// client's end.
    fn pair() -> (Reading, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (stream, peer) = listener.accept().unwrap();
        stream.set_nonblocking(true).unwrap();
        let reading = Reading {
            stream,
            peer: peer.ip(),
            buf: Vec::new(),
            deadline: Instant::now() + HEAD_DEADLINE,
        };
        (reading, client)
    }

    /// Steps `r` as the loop does once its connection is readable (polled here with a bound).
    fn step_when_readable(r: Reading, now: Instant) -> Step {
        let ready = {
            let mut fds = [PollFd::new(r.stream.as_fd(), PollFlags::POLLIN)];
            poll(&mut fds, PollTimeout::from(5000u16)).unwrap() == 1
        };
        step(r, ready, now)
    }

    #[test]
    fn a_request_is_done_once_whole_and_a_half_one_is_closed_at_its_deadline() {
        use std::io::Write;
        let (r, mut client) = pair();
        client
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            .unwrap();
        let Step::Wait(r) = step_when_readable(r, Instant::now()) else {
            panic!("half a head waits for the rest");
        };
        assert!(!r.buf.is_empty());
        client.write_all(b"\r\n").unwrap();
        let Step::Done(_, Ok(req)) = step_when_readable(r, Instant::now()) else {
            panic!("a whole head is a request");
        };
        assert_eq!(
            (req.method.as_str(), req.path.as_str()),
            ("GET", "/healthz")
        );

        // Part of a head, then the deadline: a 408, and the connection closed.
        let (r, mut client) = pair();
        client.write_all(b"GET / HTTP/1.1\r\n").unwrap();
        let Step::Wait(r) = step_when_readable(r, Instant::now()) else {
            panic!("waits");
        };
        let late = r.deadline;
        assert!(matches!(step(r, false, late), Step::Close));
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut answer = String::new();
        client.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");

        // Nothing, then the deadline: closed without an answer; a client gone: closed.
        let (r, mut client) = pair();
        let late = r.deadline;
        assert!(matches!(step(r, false, late), Step::Close));
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).unwrap();
        assert!(answer.is_empty());
        let (r, client) = pair();
        drop(client);
        assert!(matches!(step_when_readable(r, Instant::now()), Step::Close));
    }

    #[test]
    fn poll_timeouts_round_up_and_saturate() {
        assert_eq!(poll_timeout(None), PollTimeout::NONE);
        assert_eq!(i32::from(poll_timeout(Some(Duration::from_micros(1)))), 1);
        assert_eq!(i32::from(poll_timeout(Some(Duration::ZERO))), 0);
        assert_eq!(poll_timeout(Some(Duration::MAX)), PollTimeout::MAX);
    }
}
