//! The keeper's lines on an attempt's control socket, as the runner reads them: `started`,
//! `failed`, `exited` with the output bytes that follow.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|received: &[u8]| leasehold::fuzzing::keeper_control(received));
