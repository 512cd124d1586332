//! A keeper's journal and a stream file's marker line: files left on disk by another
//! process, or torn by a crash halfway through a write.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| leasehold::fuzzing::journal(bytes));
