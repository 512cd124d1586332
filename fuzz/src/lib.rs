//! The keeper's C parsers (`src/process/keeper_parse.c`, built by `build.rs`) for the fuzz
//! targets that hold them to the Rust side's decoders (`leasehold::fuzzing::keeper`): each
//! answer in the same canonical form, compared byte for byte.

use std::ffi::c_long;

unsafe extern "C" {
    fn leasehold_fuzz_kp_request(input: *const u8, len: usize, out: *mut u8, cap: usize) -> c_long;
    fn leasehold_fuzz_kp_hub(input: *const u8, len: usize, out: *mut u8, cap: usize) -> c_long;
    fn leasehold_fuzz_kp_lease_file(
        input: *const u8,
        len: usize,
        out: *mut u8,
        cap: usize,
    ) -> c_long;
    fn leasehold_fuzz_kp_control(input: *const u8, sizes: *const usize, reads: usize) -> c_long;
    fn leasehold_fuzz_kp_exec(input: *const u8, len: usize, out: *mut u8, cap: usize) -> c_long;
}

type Parser = unsafe extern "C" fn(*const u8, usize, *mut u8, usize) -> c_long;

fn call(parser: Parser, input: &[u8]) -> Vec<u8> {
    // Every item of a form is at most the input's bytes, or a number; a few fixed ones.
    let mut out = vec![0u8; input.len() * 2 + 4096];
    // SAFETY: the parser reads `input.len()` bytes of `input` and writes at most `out.len()`
    // bytes into `out`, both alive for the call; it keeps neither.
    let n = unsafe { parser(input.as_ptr(), input.len(), out.as_mut_ptr(), out.len()) };
    out.truncate(usize::try_from(n).expect("the form fits its buffer"));
    out
}

/// An attempt's request body, as the keeper's `parse_request` reads it.
pub fn request(body: &[u8]) -> Vec<u8> {
    call(leasehold_fuzz_kp_request, body)
}

/// A hub datagram, as `parse_hub` reads it.
pub fn hub(datagram: &[u8]) -> Vec<u8> {
    call(leasehold_fuzz_kp_hub, datagram)
}

/// A lease file, as `parse_lease_file` reads it.
pub fn lease_file(bytes: &[u8]) -> Vec<u8> {
    call(leasehold_fuzz_kp_lease_file, bytes)
}

/// `exec` mode's argv, as `parse_exec` reads it.
pub fn exec(args: &[Vec<u8>]) -> Vec<u8> {
    let joined: Vec<u8> = args
        .iter()
        .flat_map(|a| a.iter().copied().chain([0]))
        .collect();
    call(leasehold_fuzz_kp_exec, &joined)
}

/// The index of the read (of `sizes` bytes each) with which `control_release` releases.
pub fn release_at(bytes: &[u8], sizes: &[usize]) -> Option<usize> {
    assert_eq!(sizes.iter().sum::<usize>(), bytes.len());
    // SAFETY: the reads' sizes add up to `bytes.len()`; both slices outlive the call.
    let at = unsafe { leasehold_fuzz_kp_control(bytes.as_ptr(), sizes.as_ptr(), sizes.len()) };
    usize::try_from(at).ok()
}

/// Both forms, shown as text where they differ.
pub fn assert_same(c: &[u8], rust: &[u8], input: &[u8]) {
    assert!(
        c == rust,
        "the keeper's C parser read {:?}, the Rust side {:?}, of {:?}",
        String::from_utf8_lossy(c),
        String::from_utf8_lossy(rust),
        String::from_utf8_lossy(input)
    );
}
