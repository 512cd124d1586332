//! A job handed to a running runner: how `leasehold jobs add` stores a job without opening
//! SQLite itself when a runner is on the file.
//!
//! A one-shot command that opens the database pays for SQLite's start (reading the schema,
//! preparing each statement) on top of its commit. A runner's connections have paid for
//! theirs. So a command that finds a runner's socket in the wake-up folder (see
//! [`wake`](super::wake)) sends it the job as one datagram, from a socket of its own, and the
//! runner stores it with a durable (FULL) commit of its own connection and answers with the
//! id. The command prints the id only after that answer: the job is on disk as surely as if
//! the command had committed it.
//!
//! A command that gets no answer (the runner is frozen, busy past the wait, or died) cannot
//! tell whether the job was stored. It then stores the job itself, under the token it sent:
//! the job and its token are written in one transaction, and a transaction that finds the
//! token stores nothing and returns the job it names. Whichever of the runner and the command
//! commits first stores the job, once. A runner refuses a request past its deadline (which
//! the command waits out before storing the job itself), so one that wakes up hours later
//! does not store a job whose token has since expired.
//!
//! A runner declines (and the command stores the job itself, with every error it would have
//! had) anything it cannot store: a request it cannot read, a job the store refuses, a
//! runner shutting down.

use std::path::Path;

use crate::store::db::{Connection, OptionalExtension, params, sql};
use serde_json::{Value, json};

use super::OpenOptions;
use super::Store;
use super::enqueue::{self, Enqueued};
use crate::error::Result;
use crate::job::Job;

/// How long a token is kept after its deadline: long past the last moment a command could
/// still be storing the job itself (its wait, then a busy timeout of 10 s).
pub(super) const TOKEN_KEPT_MS: i64 = 10 * 60 * 1000;

/// The command's side: see [`Store::hand_off`].
mod client {
    use std::io::{ErrorKind, Read};
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    use std::path::Path;
    use std::time::{Duration, Instant};

    use serde_json::Value;

    use crate::job::Job;
    use crate::store::enqueue::Enqueued;
    use crate::store::wake;
    use crate::store::wake::MAX_REQUEST;

    /// How long a runner has to store a handed job: it refuses the request after this.
    const DEADLINE: Duration = Duration::from_secs(2);

    /// How long a command waits for the answer: past the runner's deadline, so that a runner
    /// that did not answer has stopped trying when the command stores the job itself.
    const WAIT: Duration = Duration::from_secs(3);

    /// What became of a command's attempt to hand its job to a runner.
    #[derive(Debug)]
    pub(crate) enum HandOff {
        /// No runner got the request (none is on the file, or none could be sent it): nothing
        /// was sent, and the command stores the job as it would without runners.
        NotSent,
        /// A runner stored the job (or found its unique key taken): its answer.
        Stored(Enqueued),
        /// A runner answered that it did not store the job (it refused it, or is shutting
        /// down): the command stores it as it would without runners, and gets the error the
        /// runner got, if any.
        Declined,
        /// A runner got the request and did not answer in time: it may yet store the job, so
        /// the command stores it under this token ([`Store::enqueue_handed`]), once.
        Unanswered(String),
    }

    /// A runner's answer to a request.
    enum Answer {
        Stored(Enqueued),
        Declined,
    }

    /// Hands `job`, enqueued at `now`, to a runner on the database at `db`, and waits for the
    /// answer. Never fails: whatever goes wrong leaves the job for the command to store.
    pub(crate) fn hand_off(db: &Path, job: &Job, now: i64) -> HandOff {
        // Nothing is sent into a folder another user could use: they could read the job
        // (its environment too) and forge the answer.
        let runners = match wake::sockets(&wake::folder(db)) {
            Ok(runners) => runners,
            Err(e) => {
                wake::log_unused(&e);
                return HandOff::NotSent;
            }
        };
        if runners.is_empty() {
            return HandOff::NotSent;
        }
        let Some(token) = new_token() else {
            return HandOff::NotSent;
        };
        let request = format!(
            r#"{{"token":"{token}","deadline_ms":{},"job":{}}}"#,
            now.saturating_add(DEADLINE.as_millis() as i64),
            job.to_handoff(now)
        );
        if request.len() > MAX_REQUEST {
            return HandOff::NotSent;
        }
        let socket = match SocketAddr::from_abstract_name(format!("leasehold-{token}"))
            .and_then(|addr| UnixDatagram::bind_addr(&addr))
        {
            Ok(s) => s,
            Err(e) => {
                log::debug!("cannot make a socket to hand the job over: {e}");
                return HandOff::NotSent;
            }
        };
        // No send may block: a runner that is frozen, or whose listener stopped reading, has
        // a full queue (requests and pokes, `net.unix.max_dgram_qlen` of them), and a
        // blocking send to it would wait for ever. A full queue means "not sent to that
        // runner": the next one is tried, and with none left the command stores the job.
        if let Err(e) = socket.set_nonblocking(true) {
            log::debug!("cannot make the hand-off socket nonblocking: {e}");
            return HandOff::NotSent;
        }
        let sent_at = Instant::now();
        let sent = runners
            .iter()
            .find(|path| match socket.send_to(request.as_bytes(), path) {
                Ok(_) => true,
                Err(e) => {
                    // A dead runner's socket refuses; the wake-up's pokes delete such sockets too.
                    if e.kind() == ErrorKind::ConnectionRefused {
                        let _ = std::fs::remove_file(path);
                    }
                    log::debug!("cannot hand the job to {}: {e}", path.display());
                    false
                }
            });
        let Some(runner) = sent else {
            return HandOff::NotSent;
        };
        if let Err(e) = socket.set_nonblocking(false) {
            // Sent, so the runner may store it: the command stores it under the token.
            log::debug!("cannot wait for the runner's answer: {e}");
            return HandOff::Unanswered(token);
        }
        match wait_for_answer(&socket, runner, &token, sent_at + WAIT) {
            Some(Answer::Stored(stored)) => {
                log::debug!(
                    "job {} stored by the runner at {}",
                    stored.id,
                    runner.display()
                );
                HandOff::Stored(stored)
            }
            Some(Answer::Declined) => HandOff::Declined,
            None => {
                log::debug!(
                    "no answer from the runner at {} within {WAIT:?}: storing the job here",
                    runner.display()
                );
                HandOff::Unanswered(token)
            }
        }
    }

    /// The runner's answer to the request `token`, or `None` when it did not answer by `until`
    /// (or its answer cannot be read).
    ///
    /// Only a datagram from `runner`'s own socket counts. The command's socket is abstract,
    /// and any local user can read its name (in `/proc/net/unix`) and send to it, but none
    /// can send from the runner's socket, which is in a folder checked owner-only (see
    /// [`wake::check`]): a forged answer would make the command report a job stored that no
    /// one stored.
    fn wait_for_answer(
        socket: &UnixDatagram,
        runner: &Path,
        token: &str,
        until: Instant,
    ) -> Option<Answer> {
        let mut buf = [0u8; 512];
        loop {
            let left = until.checked_duration_since(Instant::now())?;
            socket
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .ok()?;
            let n = match socket.recv_from(&mut buf) {
                Ok((n, from)) if from.as_pathname() == Some(runner) => n,
                Ok(_) => continue,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return None,
            };
            let Ok(answer) = serde_json::from_slice::<Value>(&buf[..n]) else {
                continue;
            };
            if answer["token"] != token {
                continue;
            }
            if let Some(reason) = answer["declined"].as_str() {
                log::debug!("the runner declined the job: {reason}");
                return Some(Answer::Declined);
            }
            return Some(Answer::Stored(Enqueued {
                id: answer["id"].as_i64()?,
                duplicate: answer["duplicate"].as_bool()?,
            }));
        }
    }

    /// A token no other request has: 128 random bits, in hex.
    fn new_token() -> Option<String> {
        let mut bytes = [0u8; 16];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut bytes))
            .map_err(|e| log::debug!("cannot read /dev/urandom: {e}"))
            .ok()?;
        Some(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }
}

pub(super) use client::{HandOff, hand_off};

/// A token as [`new_token`] makes them: anything else is not read as one.
fn is_token(s: &str) -> bool {
    s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// What a runner answers to a request datagram, after storing its job with `store` at `now`
/// (or declining to), and whether it enqueued a job (the runner then wakes the other runners,
/// after it has answered). A runner that is shutting down answers [`decline`] instead.
pub(crate) fn answer(store: &Store, request: &[u8], now: i64) -> (Vec<u8>, bool) {
    let v = parse(request);
    let token = token_of(&v);
    let declined = |reason: &str| declined(token, reason);
    let (answer, new) = if token.is_empty() {
        (declined("no token"), false)
    } else {
        match (Job::from_handoff(&v["job"]), v["deadline_ms"].as_i64()) {
            (Err(e), _) => (declined(&e), false),
            (_, None) => (declined("no deadline"), false),
            (Ok(job), Some(deadline)) => {
                match store.enqueue_handed(&job, token, Some(deadline), now) {
                    Ok(Some((e, new))) => (
                        json!({"token": token, "id": e.id, "duplicate": e.duplicate}).to_string(),
                        new,
                    ),
                    Ok(None) => (declined("past its deadline"), false),
                    Err(e) => {
                        log::debug!("a handed job was not stored: {e}");
                        (declined(&e.to_string()), false)
                    }
                }
            }
        }
    };
    (answer.into_bytes(), new)
}

/// Why a runner that is shutting down declines a request.
pub(crate) const SHUTTING_DOWN: &str = "the runner is shutting down";

/// The answer that declines `request` for `reason`, which needs no database: the command then
/// stores its job itself at once, instead of waiting out its deadline.
pub(crate) fn decline(request: &[u8], reason: &str) -> Vec<u8> {
    declined(token_of(&parse(request)), reason).into_bytes()
}

/// What a runner that is shutting down, and one that is not, answer to the datagram
/// `request` (feature `fuzzing`): with `store`, at `now`.
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_request(store: &Store, request: &[u8], now: i64) -> [Vec<u8>; 2] {
    [
        decline(request, SHUTTING_DOWN),
        answer(store, request, now).0,
    ]
}

/// A request datagram as JSON; `Null` when it is not JSON.
fn parse(request: &[u8]) -> Value {
    serde_json::from_slice(request).unwrap_or(Value::Null)
}

/// The request's token, or "" when it has none that [`new_token`] could have made.
fn token_of(request: &Value) -> &str {
    request["token"]
        .as_str()
        .filter(|t| is_token(t))
        .unwrap_or("")
}

/// The answer that declines the request `token` for `reason`.
fn declined(token: &str, reason: &str) -> String {
    json!({"token": token, "declined": reason}).to_string()
}

/// In the caller's transaction: the job the token `token` names, or the job enqueued now
/// under it; `None` (and nothing enqueued) when `deadline` has passed at `now` or at the
/// clock read in the transaction, whichever is later. Expired tokens are deleted first. The
/// bool says whether the job was enqueued by this call.
pub(super) fn enqueue(
    conn: &Connection,
    job: &Job,
    token: &str,
    deadline: Option<i64>,
    now: i64,
) -> Result<Option<(Enqueued, bool)>> {
    let now = conn.now(now)?;
    conn.prepare_cached(sql!("DELETE FROM handoffs WHERE expires_at < ?1"))?
        .execute([now])?;
    if let Some(e) = stored(conn, token)? {
        return Ok(Some((e, false)));
    }
    let expires = deadline
        .unwrap_or(now)
        .max(now)
        .saturating_add(TOKEN_KEPT_MS);
    // The token's row is the check: inserted before the job, so that of two transactions
    // that both found no token (on PostgreSQL a runner's and its command's can run at once),
    // the second waits at this insert for the first's commit, and then finds its job.
    let claimed = conn
        .prepare_cached(sql!(
            sqlite: "INSERT OR IGNORE INTO handoffs (token, job_id, duplicate, expires_at)
                     VALUES (?1, 0, 0, ?2)",
            postgres: "INSERT INTO handoffs (token, job_id, duplicate, expires_at)
                       VALUES (?1, 0, 0, ?2) ON CONFLICT (token) DO NOTHING",
        ))?
        .execute(params![token, expires])?;
    if claimed == 0 {
        // The row that conflicted may be gone again only if it expired, which a token
        // does long after any transaction that stores its job: run the whole again.
        return Ok(Some((
            stored(conn, token)?.ok_or_else(changed_under)?,
            false,
        )));
    }
    // The deadline is checked against the clock read now, after the wait for the write lock
    // and the insert, not only the caller's `now`: a request that waited past its deadline
    // (behind another writer, or in a frozen runner) could otherwise be stored after its
    // command stored the job itself and its token expired and was deleted.
    if deadline.is_some_and(|d| now.max(crate::job::now_ms()) > d) {
        conn.prepare_cached(sql!("DELETE FROM handoffs WHERE token = ?1"))?
            .execute([token])?;
        return Ok(None);
    }
    let e = enqueue::enqueue(conn, job, now, None)?;
    let named = conn
        .prepare_cached(sql!(
            "UPDATE handoffs SET job_id = ?2, duplicate = ?3 WHERE token = ?1"
        ))?
        .execute(params![token, e.id, e.duplicate])?;
    if named != 1 {
        return Err(changed_under());
    }
    Ok(Some((e, !e.duplicate)))
}

/// The error when the token's row changed under this transaction: busy, so that the store
/// runs it again whole.
fn changed_under() -> crate::error::Error {
    crate::error::Error::Busy {
        operation: "storing a handed job",
        waited: std::time::Duration::ZERO,
    }
}

/// The job the token `token` names, if a committed transaction (or this one) stored it.
fn stored(conn: &Connection, token: &str) -> Result<Option<Enqueued>> {
    conn.prepare_cached(sql!(
        "SELECT job_id, duplicate FROM handoffs WHERE token = ?1"
    ))?
    .query_row([token], |r| {
        Ok(Enqueued {
            id: r.get(0)?,
            duplicate: r.get(1)?,
        })
    })
    .optional()
}

impl Store {
    /// Enqueues one job, at the time on `options`' clock, into the database at `path` from a process that does not
    /// keep it open: a command, a script, a second program. When a runner is running on the
    /// file, the job is handed to it over its wake-up socket, and the runner stores it with a
    /// durable (FULL) commit of its own connection and answers with the id: this process
    /// opens no SQLite connection, and the job is on disk when this returns. Otherwise, or
    /// when the runner declines or does not answer within 3 s, this opens the file with
    /// `options` and enqueues the job itself, once: a runner that stored it before it stopped
    /// answering is found by the request's token (see docs/cross-process.md, *A `jobs add`
    /// handed to a running runner*). Returns what [`Store::enqueue_unique`] would.
    ///
    /// # Errors
    ///
    /// As [`Store::open_with`] and [`Store::enqueue_unique`]; a job the store refuses is
    /// refused the same way, whichever path it took.
    pub fn hand_off(path: impl AsRef<Path>, options: &OpenOptions, job: &Job) -> Result<Enqueued> {
        let path = path.as_ref();
        let now = Store::clock_for(path, options).now_ms();
        job.validate_at(now)?;
        match hand_off(path, job, now) {
            HandOff::Stored(done) => Ok(done),
            HandOff::NotSent | HandOff::Declined => {
                Store::open_with(path, options)?.enqueue_unique_at(job, now)
            }
            HandOff::Unanswered(token) => {
                let store = Store::open_with(path, options)?;
                // Without a deadline, the token's job is found or enqueued: never None.
                let (done, new) =
                    store
                        .enqueue_handed(job, &token, None, now)?
                        .ok_or_else(|| {
                            crate::error::Error::invalid("deadline", "a handed job was refused")
                        })?;
                if new {
                    store.poke();
                }
                Ok(done)
            }
        }
    }

    /// Enqueues a job that a command handed to a runner under `token` (see
    /// [`handoff`](self)), once: the job the token names when a transaction already
    /// stored it, else the job enqueued now, with its token. `None`, with nothing enqueued,
    /// when `deadline` (the runner's, for a request) has passed at `now` or at the clock read
    /// once the transaction holds the write lock; the command, which
    /// stores the job itself when the runner did not answer, passes none.
    ///
    /// # Errors
    ///
    /// As [`Store::enqueue`].
    ///
    /// The bool says whether this call enqueued the job. Unlike [`Store::enqueue`], this wakes
    /// no runner: the caller pokes ([`Store::poke`]) once it has answered whoever waits.
    pub(crate) fn enqueue_handed(
        &self,
        job: &Job,
        token: &str,
        deadline: Option<i64>,
        now: i64,
    ) -> Result<Option<(Enqueued, bool)>> {
        job.validate_at(now)?;
        self.write(|c| enqueue(c, job, token, deadline, now))
    }
}

#[cfg(test)]
mod tests {
    use crate::store::db::params;
    use std::time::Duration;

    use super::TOKEN_KEPT_MS;
    use crate::job::{Job, now_ms};
    use crate::store::Store;

    /// A runner reads its clock, then waits for the write lock (another process holds it, or
    /// the runner is frozen) past the request's deadline. Meanwhile the command, which got no
    /// answer, stored the job itself, and its token expired and was deleted (here the token
    /// expires already, as it would after a long freeze, and the runner's own transaction
    /// deletes it). The request must be refused for its deadline, not stored again.
    #[test]
    fn a_request_whose_deadline_passes_during_the_lock_wait_is_not_stored() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("jobs.db");
        let command = Store::open(&db).unwrap();
        let job = Job::shell("true");
        let token = "0123456789abcdef0123456789abcdef";
        let read_at = now_ms();
        let long_ago = read_at - TOKEN_KEPT_MS - 60_000;
        let (stored, _) = command
            .enqueue_handed(&job, token, None, long_ago)
            .unwrap()
            .unwrap();

        // A second connection holds the write lock past the request's deadline.
        let holder = rusqlite::Connection::open(&db).unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        let deadline = read_at + 300;
        let runner = Store::open(&db).unwrap();
        let waiting = {
            let job = job.clone();
            std::thread::spawn(move || runner.enqueue_handed(&job, token, Some(deadline), read_at))
        };
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while now_ms() <= deadline + 50 && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        holder.execute_batch("COMMIT").unwrap();
        let answered = waiting.join().unwrap().unwrap();

        let jobs: Vec<i64> = {
            let mut stmt = command.conn().prepare("SELECT id FROM jobs").unwrap();
            stmt.query_map(params![], |r| r.get(0))
                .unwrap()
                .map(Result::unwrap)
                .collect()
        };
        assert_eq!(answered, None, "stored past its deadline: {jobs:?}");
        assert_eq!(jobs, [stored.id], "the job is stored once");
    }
}
