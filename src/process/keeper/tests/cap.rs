//! The output cap's layout, for any sequence of writes: the keeper's `store_file` against
//! what `files` promises its readers (the layout in its module doc).

use super::*;

use proptest::collection::vec;
use proptest::strategy::{Just, Strategy};

/// The marker line's length.
const MARKER: usize =
    files::DROPPED_PREFIX.len() + files::DROPPED_WIDTH + files::DROPPED_SUFFIX.len();

/// The byte at `i` of the stream: not periodic over any short span, so that a tail taken
/// from the wrong place does not match by chance.
fn byte_at(i: usize) -> u8 {
    (i.wrapping_mul(2_654_435_761) >> 13) as u8
}

/// A cap, the sizes of the command's writes (each one `write(2)`, up to three caps), and
/// what the stream keeps in memory before it spills (at most a cap, so never all of it).
fn case() -> impl Strategy<Value = (u64, Vec<usize>, u64)> {
    (64u64..4096).prop_flat_map(|cap| {
        let size = usize::try_from(3 * cap).expect("small");
        (Just(cap), vec(0..size, 1..7), 0..=64u64)
    })
}

/// Runs the writes under the keeper and returns what the stream kept: its file, or the
/// bytes that came with the message (empty for none).
fn kept(cap: u64, writes: &[usize], mem: u64, all: &[u8]) -> Vec<u8> {
    // One `dd` a write, each reading its own slice of the data from the shared offset.
    let script: Vec<String> = writes
        .iter()
        .map(|&n| match n {
            0 => "true".to_owned(),
            n => format!("dd bs={n} count=1 2>/dev/null"),
        })
        .collect();
    // A token of its own each run: the keeper names an attempt's cgroup after it.
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let job = Job::sh_here(
        &format!("{{ {}; }} < data", script.join("; ")),
        &format!("cap-layout-{run}"),
    );
    std::fs::write(job.folder.path().join("data"), all).expect("the data file");
    let mut run = job.start(cap, mem, DRAIN);
    let (ended, output) = run.ended();
    assert_eq!(ended, Ended::Exited(0));
    let out = match output {
        Output::Memory(out, err) => {
            assert!(err.is_empty());
            out
        }
        Output::Files if all.is_empty() => {
            assert!(
                !job.dir().join(files::STDOUT).exists(),
                "made at the first byte"
            );
            Vec::new()
        }
        Output::Files => job.stream(files::STDOUT),
    };
    run.release();
    out
}

/// Checks what the stream of `writes` kept against the layout: whole within the cap; past it,
/// exactly its first half cap, one marker with the exact count dropped, and its newest `k`
/// bytes, where `k` is at least the half cap (or all but the marker's room, when fewer were
/// written) and at most three quarters of the cap, however the keeper's reads split the writes.
fn check(cap: u64, writes: &[usize], mem: u64) {
    let total: usize = writes.iter().sum();
    let all: Vec<u8> = (0..total).map(byte_at).collect();
    let file = kept(cap, writes, mem, &all);
    let cap = usize::try_from(cap).expect("small");
    if total <= cap {
        assert!(file == all, "within the cap, whole");
        return;
    }
    let half = cap / 2;
    assert!(file.len() >= half + MARKER, "{} bytes", file.len());
    assert!(file.len() <= cap * 5 / 4 + MARKER, "{} bytes", file.len());
    let k = file.len() - half - MARKER;
    assert!(k <= cap / 4 * 3, "a tail of {k}");
    assert!(k >= (total - half - MARKER).min(half), "a tail of {k}");
    assert!(file[..half] == all[..half], "the head");
    let dropped = total - half - k;
    let marker = format!("\n[leasehold: {dropped:>20} bytes dropped]\n");
    assert_eq!(&file[half..half + MARKER], marker.as_bytes());
    assert_eq!(
        files::dropped(&file[half..half + MARKER]),
        Some(dropped as u64)
    );
    assert!(file[half + MARKER..] == all[total - k..], "the newest {k}");
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config {
        cases: 24,
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    })]

    /// Whatever the writes, the cap's layout holds (see `check`).
    #[test]
    fn the_cap_keeps_the_first_half_an_exact_marker_and_the_newest_bytes_for_any_writes(
        (cap, writes, mem) in case(),
    ) {
        check(cap, &writes, mem);
    }
}

/// The case the property found: a move of the tail kept none of it (the file was opened
/// write-only, so its read back failed and the kept bytes were counted dropped), leaving
/// only the newest write after the marker.
#[test]
fn a_move_of_the_tail_keeps_the_newest_half_cap() {
    check(1432, &[1321, 519], 0);
}
