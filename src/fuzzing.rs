//! Thin entry points into the parsers of what leasehold reads but did not write itself, for
//! the fuzz targets of `fuzz/` (feature `fuzzing`). Not part of the API: hidden, and changed
//! with the parsers. Each takes the untrusted input whole and checks what a fuzzer can judge
//! beside "no panic, no hang": an answer that must be well formed is.

use crate::store::Store;

/// The bytes a runner read from an attempt's control socket (the keeper's lines), taken
/// message by message.
pub fn keeper_control(received: &[u8]) {
    crate::process::fuzz_control(received);
}

/// A keeper's journal (a file left on disk by another process, or torn by a crash): each line
/// parsed, and what the journal says last of each token it names; a stream file's marker line;
/// a journal's file name.
pub fn journal(bytes: &[u8]) {
    for line in bytes.split(|&b| b == b'\n') {
        let Ok(line) = std::str::from_utf8(line) else {
            continue;
        };
        if let Some((token, _)) = crate::files::parse_journal_line(line) {
            assert!(
                crate::files::journal_says(bytes, token).is_some(),
                "a whole record about {token:?} is found by the journal's reader"
            );
        }
    }
    let _ = crate::files::dropped(bytes);
    if let Ok(name) = std::str::from_utf8(bytes) {
        let _ = crate::files::journal_keeper(name);
    }
}

/// A hand-off request datagram, from any local process of the same user, answered by a
/// runner on `store` at `now` and by one that is shutting down: both answers are JSON objects
/// with a token.
pub fn handoff(store: &Store, request: &[u8], now: i64) {
    for answer in crate::store::handoff::fuzz_request(store, request, now) {
        let v: serde_json::Value = serde_json::from_slice(&answer).expect("an answer is JSON");
        assert!(v["token"].is_string(), "an answer has a token: {v}");
    }
}

/// A PostgreSQL URL, as every reader of it takes it.
pub fn pg_url(url: &str) {
    crate::store::pg::fuzz_url(url);
}

/// The password a `.pgpass` file's text gives for a connection (with feature `postgres`).
#[cfg(feature = "postgres")]
pub fn pgpass(text: &str, host: &str, port: u16, dbname: &str, user: &str) -> Option<String> {
    crate::store::pg::fuzz_pgpass(text, host, port, dbname, user)
}

/// A JSON column of a job's row (argv, env, after) and a schedule's job template: a
/// template that reads back writes itself again.
pub fn json_columns(text: &str) {
    crate::store::fuzz_columns(text);
    if let Ok(job) = crate::job::Job::from_template(text) {
        let written = job.to_template();
        let again = crate::job::Job::from_template(&written).expect("a written template reads");
        assert_eq!(
            again.to_template(),
            written,
            "a template reads back as written"
        );
    }
}

pub use crate::process::keeper_decode::KeeperRequest;

/// The keeper's grammars as the Rust side decodes them (`process/keeper/decode.rs`), each
/// answer in the canonical form that `src/process/keeper_parse.c` writes for the keeper's C
/// parsers: a fuzz target compares the two.
pub mod keeper {
    use super::KeeperRequest;
    use crate::process::keeper_decode as decode;

    /// An attempt's request body (after its 4-byte length).
    pub fn request(body: &[u8]) -> Vec<u8> {
        decode::request_form(decode::request(body).as_ref())
    }

    /// The body the runner's encoder writes for `parts` and its canonical form, once checked
    /// that the Rust decoder reads it back so; `None` for parts a runner never writes.
    pub fn request_written(parts: &KeeperRequest) -> Option<(Vec<u8>, Vec<u8>)> {
        let (body, expected) = decode::written(parts)?;
        assert_eq!(
            decode::request(&body).as_ref(),
            Some(&expected),
            "the decoder reads back what the encoder wrote"
        );
        Some((body, decode::request_form(Some(&expected))))
    }

    /// A hub datagram.
    pub fn hub(datagram: &[u8]) -> Vec<u8> {
        decode::hub_form(decode::hub(datagram).as_ref())
    }

    /// The datagram a runner sends to move (`Some`) or disarm the fence of `token`'s attempt,
    /// and its canonical form; `None` for a token a runner never makes.
    pub fn hub_written(token: &str, fence: Option<(u64, u64)>) -> Option<(Vec<u8>, Vec<u8>)> {
        let fence = fence.map(|(term_at, kill_at)| crate::files::LeaseFence { term_at, kill_at });
        let (t, k) = fence.map_or((0, 0), |f| (f.term_at, f.kill_at));
        let token_ok = (1..=128).contains(&token.len())
            && token
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_');
        if !token_ok || t > i64::MAX as u64 || k > i64::MAX as u64 {
            return None;
        }
        let datagram = crate::process::lease_datagram(token, fence).into_bytes();
        let expected = decode::Hub::Lease {
            token: token.as_bytes().to_vec(),
            term_at: t,
            kill_at: k,
        };
        assert_eq!(decode::hub(&datagram).as_ref(), Some(&expected));
        Some((datagram, decode::hub_form(Some(&expected))))
    }

    /// A lease file's bytes.
    pub fn lease_file(bytes: &[u8]) -> Vec<u8> {
        decode::lease_file_form(decode::lease_file(bytes))
    }

    /// The lease file a runner writes for a fence and its canonical form; `None` past the
    /// boot clock's range.
    pub fn lease_file_written(term_at: u64, kill_at: u64) -> Option<(Vec<u8>, Vec<u8>)> {
        if term_at > i64::MAX as u64 || kill_at > i64::MAX as u64 {
            return None;
        }
        let line = crate::files::lease_line(crate::files::LeaseFence { term_at, kill_at });
        let bytes = line.into_bytes();
        assert_eq!(decode::lease_file(&bytes), Some((term_at, kill_at)));
        Some((bytes, decode::lease_file_form(Some((term_at, kill_at)))))
    }

    /// The index of the read (of `sizes` bytes each) with which the runner's bytes after a
    /// request release the attempt.
    pub fn release_at(bytes: &[u8], sizes: &[usize]) -> Option<usize> {
        decode::release_at(bytes, sizes)
    }

    /// `exec` mode's argv (with the keeper's own argv[0]).
    pub fn exec(args: &[Vec<u8>]) -> Vec<u8> {
        decode::exec_form(decode::exec(args).as_ref())
    }
}
