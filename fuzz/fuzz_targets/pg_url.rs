//! A PostgreSQL URL given as a database: shown without its password, named, and split for the
//! `postgres` crate.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    if let Ok(url) = std::str::from_utf8(bytes) {
        leasehold::fuzzing::pg_url(url);
        let _ = leasehold::redacted_db(url);
    }
});
