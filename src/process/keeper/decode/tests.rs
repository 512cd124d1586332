//! The keeper's C parsers held to the Rust side's grammar: what the runner writes is read back
//! field by field, and both refuse, or read the same, for bytes nobody meant.

use proptest::prelude::*;

use super::c;
use super::*;

fn parts() -> KeeperRequest {
    KeeperRequest {
        token: "a1-B_c".into(),
        attempt_dir: b"/db-attempts/7/1-a1-B_c".to_vec(),
        journal: b"/db-attempts/keeper-1-2.journal".to_vec(),
        cap: 64 << 20,
        mem: 4096,
        drain_ms: 1000,
        fence: Some((5_000, 9_000)),
        nice: Some(-3),
        io_class: Some(Some(4)),
        memory_max: Some(i64::MAX as u64),
        cpu_weight: Some(10000),
        pids_max: Some(1),
        cwd: Some(b"/tmp/\xff work".to_vec()),
        program: b"/bin/sh".to_vec(),
        argv: vec![
            b"sh".to_vec(),
            b"-c".to_vec(),
            Vec::new(),
            b"\x01 \n".to_vec(),
        ],
        env: vec![b"LEASEHOLD_RUN_TOKEN=a1-B_c".to_vec(), b"X=".to_vec()],
    }
}

/// The Rust side's decoding and the C parser's of `body`, which must agree.
fn agree_on_request(body: &[u8]) -> Vec<u8> {
    let rust = request_form(request(body).as_ref());
    assert_eq!(
        String::from_utf8_lossy(&c::request(body)),
        String::from_utf8_lossy(&rust),
        "on {:?}",
        String::from_utf8_lossy(body)
    );
    rust
}

#[test]
fn the_c_parser_reads_every_field_the_rust_encoder_writes() {
    let none = KeeperRequest {
        fence: None,
        nice: None,
        io_class: Some(None),
        memory_max: None,
        cpu_weight: None,
        pids_max: None,
        cwd: None,
        env: Vec::new(),
        ..parts()
    };
    for p in [parts(), none] {
        let (body, expected) = written(&p).expect("a runner writes these");
        assert_eq!(c::request(&body), request_form(Some(&expected)));
        assert_eq!(request(&body), Some(expected));
    }
}

#[test]
fn a_request_number_with_a_space_a_sign_or_past_its_range_is_refused() {
    let (body, _) = written(&parts()).expect("a runner writes these");
    let fields: Vec<&[u8]> = body.split(|&b| b == 0).collect();
    // CAP, then NICE: strtoull and strtoll took " -5" (as 2^64 - 5), " 5" and "+5".
    for (at, bad) in [
        (3, &b" -5"[..]),
        (3, b" 5"),
        (3, b"+5"),
        (3, b"5 "),
        (3, b"18446744073709551616"),
        (8, b" 5"),
        (8, b"+5"),
        (8, b"-21"),
        (15, b"+4"),
    ] {
        let mut f = fields.clone();
        f[at] = bad;
        let body = f.join(&0);
        assert_eq!(agree_on_request(&body), b"refused\0", "field {at} {bad:?}");
    }
}

#[test]
fn a_lease_datagram_is_taken_only_as_the_runner_writes_it() {
    let token = "A".repeat(128);
    for (datagram, taken) in [
        (format!("lease {token} 5 6"), true),
        ("lease t 0 0".into(), true),
        ("attempt".into(), true),
        // sscanf took each of these: bytes past the times, a token cut at 128 bytes whose
        // rest read as the times, runs of spaces, signs, a byte that is no token's.
        ("lease t 1 2x".into(), false),
        (format!("lease {token}5 6 7"), false),
        ("lease  t 1  2".into(), false),
        ("lease t +1 2".into(), false),
        ("lease t -0 2".into(), false),
        ("lease t\t1 2".into(), false),
        ("lease t.x 1 2".into(), false),
        ("lease t 1 2 ".into(), false),
        ("attempt\0x".into(), false),
        ("lease t 9223372036854775808 1".into(), false),
        // Cut at 511 bytes by the keeper's buffer: leading zeros are digits, but not this many.
        (format!("lease t {:0>600} 1", 5), false),
    ] {
        let bytes = datagram.as_bytes();
        let rust = hub_form(hub(bytes).as_ref());
        assert_eq!(c::hub(bytes), rust, "{datagram:?}");
        assert_eq!(rust != b"none\0", taken, "{datagram:?}");
    }
}

#[test]
fn a_lease_file_is_taken_only_whole_as_the_runner_writes_it() {
    let line = |t: u64, k: u64, c: u64| format!("{t:020} {k:020} {c:020}\n");
    for (text, taken) in [
        (line(5, 3, 6), true),
        (
            crate::files::lease_line(crate::files::LeaseFence {
                term_at: 7,
                kill_at: 9,
            }),
            true,
        ),
        // sscanf took each of these: a sign, numbers not 20 digits wide, bytes past the line,
        // no line end.
        (format!("+{}", &line(5, 3, 6)[1..]), false),
        (format!("-{}", &line(0, 3, 3)[1..]), false),
        (format!("{:<62}\n", "5 3 6"), false),
        (format!("{}x", line(5, 3, 6)), false),
        (line(5, 3, 6).replace('\n', " "), false),
        (line(5, 3, 7), false),
    ] {
        let bytes = text.as_bytes();
        let rust = lease_file_form(lease_file(bytes));
        assert_eq!(c::lease_file(bytes), rust, "{text:?}");
        assert_eq!(rust != b"none\0", taken, "{text:?}");
    }
}

#[test]
fn a_release_counts_whole_and_first_whatever_the_reads() {
    for (bytes, sizes, at) in [
        (&b"release\n"[..], &[8][..], Some(0)),
        (b"release\nrelease\n", &[16], Some(0)),
        // memmem in each read missed a `release` cut between two reads, and took one after
        // other bytes or without its line end.
        (b"release\n", &[3, 5], Some(1)),
        (b"release\n", &[1, 1, 1, 1, 1, 1, 1, 1], Some(7)),
        (b"xrelease\n", &[9], None),
        (b"release", &[7], None),
        (b"releasE\nrelease\n", &[16], None),
    ] {
        assert_eq!(release_at(bytes, sizes), at, "{bytes:?} in {sizes:?}");
        assert_eq!(c::release_at(bytes, sizes), at, "{bytes:?} in {sizes:?}");
    }
}

#[test]
fn exec_mode_takes_its_numbers_only_as_the_runner_writes_them() {
    let args = |nice: &str, ioprio: &str| -> Vec<Vec<u8>> {
        [
            "leasehold-keeper",
            "exec",
            nice,
            ioprio,
            "",
            "7",
            "/bin/true",
            "true",
        ]
        .map(|s| s.as_bytes().to_vec())
        .to_vec()
    };
    for (nice, ioprio, taken) in [
        ("-20", "16388", true),
        ("", "", true),
        // strtoll took each of these.
        (" 5", "", false),
        ("+5", "", false),
        ("", " 1", false),
        ("5 ", "", false),
        ("-20", "65536", false),
    ] {
        let a = args(nice, ioprio);
        let rust = exec_form(exec(&a).as_ref());
        assert_eq!(c::exec(&a), rust, "{nice:?} {ioprio:?}");
        assert_eq!(rust != b"refused\0", taken, "{nice:?} {ioprio:?}");
    }
    let mut short = args("", "");
    short.pop();
    assert_eq!(c::exec(&short), b"refused\0");
}

fn some_parts() -> impl Strategy<Value = KeeperRequest> {
    let bytes = || prop::collection::vec(any::<u8>(), 0..12);
    (
        (
            "[a-zA-Z0-9_-]{1,128}",
            bytes(),
            bytes(),
            any::<u64>(),
            any::<u64>(),
        ),
        (
            0..=i32::MAX as u64,
            prop::option::of((0..=i64::MAX as u64, 0..=i64::MAX as u64)),
        ),
        (
            prop::option::of(-20..=19i32),
            prop::option::of(prop::option::of(0..=7u8)),
        ),
        (
            prop::option::of(1..=i64::MAX as u64),
            prop::option::of(1..=10000u32),
        ),
        (
            prop::option::of(1..=i64::MAX as u64),
            prop::option::of(bytes()),
            bytes(),
        ),
        (
            prop::collection::vec(bytes(), 1..4),
            prop::collection::vec(bytes(), 0..4),
        ),
    )
        .prop_map(
            |(
                (token, dir, journal, cap, mem),
                (drain_ms, fence),
                (nice, io_class),
                (memory_max, cpu_weight),
                (pids_max, cwd, program),
                (argv, env),
            )| {
                let no_nul = |b: Vec<u8>| b.into_iter().map(|c| c.max(1)).collect::<Vec<u8>>();
                KeeperRequest {
                    token,
                    attempt_dir: [b"/".to_vec(), no_nul(dir)].concat(),
                    journal: [b"/".to_vec(), no_nul(journal)].concat(),
                    cap,
                    mem,
                    drain_ms,
                    fence,
                    nice,
                    io_class,
                    memory_max,
                    cpu_weight,
                    pids_max,
                    cwd: cwd.map(no_nul),
                    program: no_nul(program),
                    argv: argv.into_iter().map(no_nul).collect(),
                    env: env.into_iter().map(no_nul).collect(),
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever the encoder writes, the C parser reads back as written; and a byte of it
    /// changed, both refuse it or read the same.
    #[test]
    fn the_c_parser_reads_any_request_as_the_rust_side(
        p in some_parts(),
        at in any::<prop::sample::Index>(),
        byte in prop::sample::select(&b"\0 +-0189/aZ_"[..]),
    ) {
        let (body, expected) = written(&p).expect("the strategy makes what a runner writes");
        prop_assert_eq!(c::request(&body), request_form(Some(&expected)));
        let mut changed = body.clone();
        changed[at.index(body.len())] = byte;
        agree_on_request(&changed);
    }

    #[test]
    fn the_c_parser_reads_any_hub_datagram_as_the_rust_side(
        text in "(attempt|lease)?[ a-z0-9+-]{0,12}( [0-9]{0,20}){0,3} ?",
    ) {
        prop_assert_eq!(c::hub(text.as_bytes()), hub_form(hub(text.as_bytes()).as_ref()));
    }

    #[test]
    fn the_c_parser_reads_any_lease_file_as_the_rust_side(
        t in 0..=i64::MAX as u64,
        k in 0..=i64::MAX as u64,
        at in any::<prop::sample::Index>(),
        byte in prop::sample::select(&b"\0\n +-09x"[..]),
    ) {
        let mut bytes = crate::files::lease_line(crate::files::LeaseFence { term_at: t, kill_at: k })
            .into_bytes();
        prop_assert_eq!(c::lease_file(&bytes), lease_file_form(Some((t, k))));
        let i = at.index(bytes.len());
        bytes[i] = byte;
        prop_assert_eq!(c::lease_file(&bytes), lease_file_form(lease_file(&bytes)));
    }
}
