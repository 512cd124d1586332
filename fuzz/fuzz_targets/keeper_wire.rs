//! The keeper's other readers of the runner's bytes, each by its C parser and by the Rust
//! side's decoder of the same grammar, which must agree: the first byte picks a hub datagram
//! (`attempt`, `lease TOKEN TERM_AT KILL_AT`), a lease file, the control socket's bytes after
//! a request (in reads of sizes the input gives), or `exec` mode's argv. What the runner
//! itself writes for a datagram and a lease file is read back by the C parser as written.
#![no_main]
use leasehold::fuzzing::keeper;
use leasehold_fuzz::assert_same;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Some((&pick, bytes)) = input.split_first() else {
        return;
    };
    match pick % 4 {
        0 => {
            assert_same(&leasehold_fuzz::hub(bytes), &keeper::hub(bytes), bytes);
            let numbers = |b: &[u8]| {
                b.iter()
                    .fold(0u64, |n, &d| n.wrapping_mul(257) ^ u64::from(d))
            };
            let (token, times) = bytes.split_at(bytes.len() / 2);
            let fence = (pick & 4 != 0).then(|| {
                let (t, k) = times.split_at(times.len() / 2);
                (numbers(t) >> (pick >> 4), numbers(k) >> (pick >> 4))
            });
            if let Some((datagram, expected)) =
                keeper::hub_written(&String::from_utf8_lossy(token), fence)
            {
                assert_same(&leasehold_fuzz::hub(&datagram), &expected, &datagram);
            }
        }
        1 => {
            assert_same(
                &leasehold_fuzz::lease_file(bytes),
                &keeper::lease_file(bytes),
                bytes,
            );
            let mut words = [0u8; 16];
            for (w, b) in words.iter_mut().zip(bytes) {
                *w = *b;
            }
            let t = u64::from_le_bytes(words[..8].try_into().expect("8 bytes")) >> 1;
            let k = u64::from_le_bytes(words[8..].try_into().expect("8 bytes")) >> 1;
            let (written, expected) =
                keeper::lease_file_written(t, k).expect("within the boot clock");
            assert_same(&leasehold_fuzz::lease_file(&written), &expected, &written);
        }
        2 => {
            // Each read is 1 to 64 bytes (read_control's buffer): the sizes cycle through the
            // input's first bytes.
            let (cuts, bytes) = bytes.split_at(bytes.len().min(4));
            let mut sizes = Vec::new();
            let mut left = bytes.len();
            for i in 0.. {
                if left == 0 {
                    break;
                }
                let n = (usize::from(cuts.get(i % cuts.len().max(1)).copied().unwrap_or(63)) % 64
                    + 1)
                .min(left);
                sizes.push(n);
                left -= n;
            }
            assert_eq!(
                leasehold_fuzz::release_at(bytes, &sizes),
                keeper::release_at(bytes, &sizes),
                "release in {bytes:?} read as {sizes:?}"
            );
        }
        _ => {
            let args: Vec<Vec<u8>> = bytes.split(|&b| b == 0).map(<[u8]>::to_vec).collect();
            assert_same(&leasehold_fuzz::exec(&args), &keeper::exec(&args), bytes);
        }
    }
});
