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
