//! The JSON columns of a job's row (argv, env, after) and a schedule's job template.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    if let Ok(text) = std::str::from_utf8(bytes) {
        leasehold::fuzzing::json_columns(text);
    }
});
