//! An attempt's request, read by the keeper's C parser and by the Rust side's decoder of the
//! same grammar: both refuse it or read every field the same. The same bytes, taken as the
//! parts of a request (`arbitrary`), are written by the runner's encoder, and the C parser
//! must read back every field as written.
#![no_main]
use arbitrary::{Arbitrary, Unstructured};
use leasehold::fuzzing::{KeeperRequest, keeper};
use libfuzzer_sys::fuzz_target;

/// The parts of a request, as `arbitrary` makes them up.
#[derive(Arbitrary, Debug)]
struct Parts {
    token: String,
    attempt_dir: Vec<u8>,
    journal: Vec<u8>,
    cap: u64,
    mem: u64,
    drain_ms: u32,
    fence: Option<(u64, u64)>,
    nice: Option<i8>,
    io_class: Option<Option<u8>>,
    memory_max: Option<u64>,
    cpu_weight: Option<u16>,
    pids_max: Option<u64>,
    cwd: Option<Vec<u8>>,
    program: Vec<u8>,
    argv: Vec<Vec<u8>>,
    env: Vec<Vec<u8>>,
}

fuzz_target!(|body: &[u8]| {
    leasehold_fuzz::assert_same(&leasehold_fuzz::request(body), &keeper::request(body), body);
    let Ok(p) = Parts::arbitrary(&mut Unstructured::new(body)) else {
        return;
    };
    // Made absolute, as a runner's folders are, so that most parts are written.
    let absolute = |b: Vec<u8>| [b"/".to_vec(), b].concat();
    let parts = KeeperRequest {
        token: p.token,
        attempt_dir: absolute(p.attempt_dir),
        journal: absolute(p.journal),
        cap: p.cap,
        mem: p.mem,
        drain_ms: u64::from(p.drain_ms >> 1),
        fence: p.fence.map(|(t, k)| (t >> 1, k >> 1)),
        nice: p.nice.map(i32::from),
        io_class: p.io_class,
        memory_max: p.memory_max.map(|n| n >> 1),
        cpu_weight: p.cpu_weight.map(u32::from),
        pids_max: p.pids_max.map(|n| n >> 1),
        cwd: p.cwd,
        program: p.program,
        argv: p.argv,
        env: p.env,
    };
    if let Some((written, expected)) = keeper::request_written(&parts) {
        leasehold_fuzz::assert_same(&leasehold_fuzz::request(&written), &expected, &written);
    }
});
