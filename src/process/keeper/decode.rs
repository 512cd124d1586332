//! The grammar of what the runner writes to its keeper, decoded on the Rust side: the
//! reference that the keeper's C parsers (`keeper_parse.h`) are held to, by the tests below
//! and the fuzz targets of `fuzz/` (feature `fuzzing`). Each answer is written out in the
//! canonical form `keeper_parse.c` writes for the C parser's (NUL-terminated items), so the two
//! are compared byte for byte.
//!
//! The grammar is what the Rust side writes, and nothing looser: numbers are ASCII digits
//! (a `-` before a signed one), no spaces, signs or other bytes around them.

/// The most bytes a request may have (`MAX_REQUEST` in `keeper_parse.h`).
const MAX_REQUEST: usize = 16 << 20;

/// The longest run token (`MAX_TOKEN`).
const MAX_TOKEN: usize = 128;

/// The runner's line that releases an attempt.
const RELEASE: &[u8] = super::RELEASE;

/// The parts of an attempt's request that a runner writes for its keeper (`keeper.rs`'s
/// encoder), as a fuzz target makes them up. `io_class`: `Some(None)` idle, `Some(Some(level))`
/// best effort. Parts outside what a runner gives the encoder (a token not of the runner's
/// alphabet, a relative folder, no argv, a setting past its bound) are passed over.
#[derive(Debug, Clone, Default)]
pub struct KeeperRequest {
    /// TOKEN.
    pub token: String,
    /// DIR.
    pub attempt_dir: Vec<u8>,
    /// JOURNAL.
    pub journal: Vec<u8>,
    /// CAP.
    pub cap: u64,
    /// MEM.
    pub mem: u64,
    /// DRAIN_MS.
    pub drain_ms: u64,
    /// TERM_AT and KILL_AT.
    pub fence: Option<(u64, u64)>,
    /// NICE.
    pub nice: Option<i32>,
    /// IOPRIO.
    pub io_class: Option<Option<u8>>,
    /// MEM_MAX.
    pub memory_max: Option<u64>,
    /// CPU_WEIGHT.
    pub cpu_weight: Option<u32>,
    /// PIDS_MAX.
    pub pids_max: Option<u64>,
    /// CWD (none: empty).
    pub cwd: Option<Vec<u8>>,
    /// PROGRAM.
    pub program: Vec<u8>,
    /// ARGV.
    pub argv: Vec<Vec<u8>>,
    /// ENV.
    pub env: Vec<Vec<u8>>,
}

/// An attempt's request, decoded (see `keeper.c` for its fields).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    pub token: Vec<u8>,
    pub dir: Vec<u8>,
    pub journal: Vec<u8>,
    pub cap: u64,
    pub mem: u64,
    pub drain_ms: u64,
    pub term_at: u64,
    pub kill_at: u64,
    /// NICE, IOPRIO, MEM_MAX, PIDS_MAX and CPU_WEIGHT.
    pub limits: [Option<i64>; 5],
    pub cwd: Vec<u8>,
    pub program: Vec<u8>,
    pub argv: Vec<Vec<u8>>,
    pub env: Vec<Vec<u8>>,
}

/// The ranges of the request's NICE, IOPRIO, MEM_MAX, PIDS_MAX and CPU_WEIGHT.
const LIMITS: [(i64, i64); 5] = [
    (-20, 19),
    (1, 65535),
    (1, i64::MAX),
    (1, i64::MAX),
    (1, 10000),
];

fn token_ok(t: &[u8]) -> bool {
    (1..=MAX_TOKEN).contains(&t.len())
        && t.iter()
            .all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
}

/// One or more ASCII digits, in u64.
fn unsigned(s: &[u8]) -> Option<u64> {
    if s.is_empty() || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(s).ok()?.parse().ok()
}

/// Digits, after a `-` for a negative number, in `lo..=hi`.
fn signed(s: &[u8], (lo, hi): (i64, i64)) -> Option<i64> {
    let digits = s.strip_prefix(b"-").unwrap_or(s);
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let v: i64 = std::str::from_utf8(s).ok()?.parse().ok()?;
    (lo..=hi).contains(&v).then_some(v)
}

/// An optional number: empty is none; `None` for one that is not a number in range.
fn optional(s: &[u8], range: (i64, i64)) -> Option<Option<i64>> {
    if s.is_empty() {
        return Some(None);
    }
    signed(s, range).map(Some)
}

/// An attempt's request body (the bytes after its length), or `None` where the keeper must
/// refuse it.
pub(crate) fn request(body: &[u8]) -> Option<Request> {
    if body.len() > MAX_REQUEST || body.last() != Some(&0) {
        return None;
    }
    let items: Vec<&[u8]> = body[..body.len() - 1].split(|&b| b == 0).collect();
    let (f, rest) = items.split_at_checked(16)?;
    let max = |v: u64, max: u64| (v <= max).then_some(v);
    let mut limits = [None; 5];
    for (i, range) in LIMITS.into_iter().enumerate() {
        limits[i] = optional(f[8 + i], range)?;
    }
    let argc = usize::try_from(unsigned(f[15])?).ok()?;
    if !token_ok(f[0]) || !f[1].starts_with(b"/") || !f[2].starts_with(b"/") || argc == 0 {
        return None;
    }
    let (argv, env) = rest.split_at_checked(argc)?;
    Some(Request {
        token: f[0].to_vec(),
        dir: f[1].to_vec(),
        journal: f[2].to_vec(),
        cap: unsigned(f[3])?,
        mem: unsigned(f[4])?,
        drain_ms: max(unsigned(f[5])?, i32::MAX as u64)?,
        term_at: max(unsigned(f[6])?, i64::MAX as u64)?,
        kill_at: max(unsigned(f[7])?, i64::MAX as u64)?,
        limits,
        cwd: f[13].to_vec(),
        program: f[14].to_vec(),
        argv: argv.iter().map(|a| a.to_vec()).collect(),
        env: env.iter().map(|e| e.to_vec()).collect(),
    })
}

/// The canonical form of a request's decoding (`keeper_parse.c`'s).
pub(crate) fn request_form(r: Option<&Request>) -> Vec<u8> {
    let mut out = Form::default();
    let Some(r) = r else {
        out.item("refused");
        return out.0;
    };
    out.item("ok");
    for s in [&r.token, &r.dir, &r.journal] {
        out.item(s);
    }
    for n in [r.cap, r.mem, r.drain_ms, r.term_at, r.kill_at] {
        out.item(n.to_string());
    }
    for l in r.limits {
        out.item(l.map(|n| n.to_string()).unwrap_or_default());
    }
    out.item(&r.cwd);
    out.item(&r.program);
    out.item(r.argv.len().to_string());
    for a in &r.argv {
        out.item(a);
    }
    out.item(r.env.len().to_string());
    for e in &r.env {
        out.item(e);
    }
    out.0
}

/// A hub datagram: `attempt`, or `lease TOKEN TERM_AT KILL_AT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Hub {
    Attempt,
    Lease {
        token: Vec<u8>,
        term_at: u64,
        kill_at: u64,
    },
}

/// The most bytes of a datagram the keeper reads (`read_hub`'s buffer): a longer one is cut
/// there, and no whole datagram of the runner's is that long.
const MAX_DATAGRAM: usize = 511;

/// A hub datagram's bytes, or `None` for one the keeper must pass over.
pub(crate) fn hub(datagram: &[u8]) -> Option<Hub> {
    if datagram.len() > MAX_DATAGRAM {
        return None;
    }
    if datagram == b"attempt" {
        return Some(Hub::Attempt);
    }
    let words: Vec<&[u8]> = datagram
        .strip_prefix(b"lease ")?
        .split(|&b| b == b' ')
        .collect();
    let [token, term, kill] = words.as_slice() else {
        return None;
    };
    let time = |s: &[u8]| unsigned(s).filter(|&v| v <= i64::MAX as u64);
    Some(Hub::Lease {
        token: token_ok(token).then(|| token.to_vec())?,
        term_at: time(term)?,
        kill_at: time(kill)?,
    })
}

/// The canonical form of a hub datagram's decoding.
pub(crate) fn hub_form(h: Option<&Hub>) -> Vec<u8> {
    let mut out = Form::default();
    match h {
        None => out.item("none"),
        Some(Hub::Attempt) => out.item("attempt"),
        Some(Hub::Lease {
            token,
            term_at,
            kill_at,
        }) => {
            out.item("lease");
            out.item(token);
            out.item(term_at.to_string());
            out.item(kill_at.to_string());
        }
    }
    out.0
}

/// A lease file's bytes (`crate::files::write_lease`): the fence's times, or `None` for a
/// file that does not hold one whole line.
pub(crate) fn lease_file(bytes: &[u8]) -> Option<(u64, u64)> {
    let line = bytes.strip_suffix(b"\n")?;
    let words: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    let [t, k, c] = words.as_slice() else {
        return None;
    };
    let number = |s: &[u8]| if s.len() == 20 { unsigned(s) } else { None };
    let (t, k, c) = (number(t)?, number(k)?, number(c)?);
    (t ^ k == c && t <= i64::MAX as u64 && k <= i64::MAX as u64).then_some((t, k))
}

/// The canonical form of a lease file's decoding.
pub(crate) fn lease_file_form(l: Option<(u64, u64)>) -> Vec<u8> {
    let mut out = Form::default();
    match l {
        None => out.item("none"),
        Some((t, k)) => {
            out.item("lease");
            out.item(t.to_string());
            out.item(k.to_string());
        }
    }
    out.0
}

/// The bytes a runner sends on an attempt's control socket after the request, in reads of
/// `sizes`: the index of the read with which they say `release\n`.
pub(crate) fn release_at(bytes: &[u8], sizes: &[usize]) -> Option<usize> {
    if !bytes.starts_with(RELEASE) {
        return None;
    }
    let mut seen = 0;
    sizes.iter().position(|&n| {
        seen += n;
        seen >= RELEASE.len()
    })
}

/// `exec` mode's manners: NICE, IOPRIO (as the keeper applies it: 0 for none), MEM and PIDS
/// (0 for none), PROGRAM and the command's argv.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Exec {
    pub nice: Option<i64>,
    pub ioprio: u64,
    pub data_rlimit: u64,
    pub nproc_rlimit: u64,
    pub program: Vec<u8>,
    pub argv: Vec<Vec<u8>>,
}

/// `exec NICE IOPRIO MEM PIDS PROGRAM ARGV...` (`args` with the keeper's own argv[0]), or
/// `None` where the keeper must refuse it.
pub(crate) fn exec(args: &[Vec<u8>]) -> Option<Exec> {
    if args.len() < 8 {
        return None;
    }
    let unset = |v: Option<i64>| v.map_or(0, |n| n as u64);
    Some(Exec {
        nice: optional(&args[2], LIMITS[0])?,
        ioprio: unset(optional(&args[3], LIMITS[1])?),
        data_rlimit: unset(optional(&args[4], LIMITS[2])?),
        nproc_rlimit: unset(optional(&args[5], LIMITS[3])?),
        program: args[6].clone(),
        argv: args[7..].to_vec(),
    })
}

/// The canonical form of `exec` mode's decoding.
pub(crate) fn exec_form(e: Option<&Exec>) -> Vec<u8> {
    let mut out = Form::default();
    let Some(e) = e else {
        out.item("refused");
        return out.0;
    };
    out.item("ok");
    out.item(e.nice.map(|n| n.to_string()).unwrap_or_default());
    for n in [e.ioprio, e.data_rlimit, e.nproc_rlimit] {
        out.item(n.to_string());
    }
    out.item(&e.program);
    for a in &e.argv {
        out.item(a);
    }
    out.0
}

/// NUL-terminated items.
#[derive(Default)]
struct Form(Vec<u8>);

impl Form {
    fn item(&mut self, s: impl AsRef<[u8]>) {
        self.0.extend_from_slice(s.as_ref());
        self.0.push(0);
    }
}

/// The request the runner writes for these parts (`keeper.rs`'s encoder), without its length,
/// and what it says decoded: `None` where the encoder refuses them (a NUL byte) or they are
/// outside what a runner gives it (see [`KeeperRequest`]).
pub(crate) fn written(parts: &KeeperRequest) -> Option<(Vec<u8>, Request)> {
    use std::ffi::{CStr, CString, OsStr};
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    let p = parts;
    let limits = crate::manners::Limits {
        nice: p.nice,
        io_class: p.io_class.map(|l| match l {
            None => crate::manners::IoClass::Idle,
            Some(level) => crate::manners::IoClass::BestEffort(level),
        }),
        memory_max: p.memory_max,
        cpu_weight: p.cpu_weight,
        pids_max: p.pids_max,
    };
    // What a runner gives the encoder: a run token of its own making, absolute folders, a
    // command with an argv[0], and settings within their bounds.
    let within = token_ok(p.token.as_bytes())
        && p.attempt_dir.starts_with(b"/")
        && p.journal.starts_with(b"/")
        && !p.argv.is_empty()
        && p.drain_ms <= i32::MAX as u64
        && p.fence
            .is_none_or(|(t, k)| t <= i64::MAX as u64 && k <= i64::MAX as u64)
        && limits.validate().is_ok();
    if !within {
        return None;
    }
    let program = CString::new(p.program.clone()).ok()?;
    let argv = p
        .argv
        .iter()
        .map(|a| CString::new(a.clone()).ok())
        .collect::<Option<Vec<_>>>()?;
    let env = p
        .env
        .iter()
        .map(|e| CString::new(e.clone()).ok())
        .collect::<Option<Vec<_>>>()?;
    let cwd = p.cwd.as_deref().map(|c| Path::new(OsStr::from_bytes(c)));
    let attempt_dir = Path::new(OsStr::from_bytes(&p.attempt_dir));
    let spec = super::KeeperSpec {
        name: "fuzz",
        token: &p.token,
        attempt_dir,
        folder: attempt_dir,
        cap: p.cap,
        mem: p.mem,
        drain: std::time::Duration::from_millis(p.drain_ms),
        fence: p
            .fence
            .map(|(term_at, kill_at)| crate::files::LeaseFence { term_at, kill_at }),
        cwd,
        program: &program,
        argv: &argv,
        env: env.iter().map(CString::as_c_str).collect::<Vec<&CStr>>(),
        limits,
    };
    let bytes = super::request(&spec, Path::new(OsStr::from_bytes(&p.journal))).ok()?;
    let (fence_t, fence_k) = p.fence.unwrap_or((0, 0));
    let limit_fields = super::limit_fields(&limits);
    let expected = Request {
        token: p.token.as_bytes().to_vec(),
        dir: p.attempt_dir.clone(),
        journal: p.journal.clone(),
        cap: p.cap,
        mem: p.mem,
        drain_ms: p.drain_ms,
        term_at: fence_t,
        kill_at: fence_k,
        limits: [
            p.nice.map(i64::from),
            limit_fields[1].parse().ok(),
            p.memory_max.map(|n| n as i64),
            p.pids_max.map(|n| n as i64),
            p.cpu_weight.map(i64::from),
        ],
        cwd: p.cwd.clone().unwrap_or_default(),
        program: p.program.clone(),
        argv: p.argv.clone(),
        env: p.env.clone(),
    };
    Some((bytes[4..].to_vec(), expected))
}

/// The keeper's C parsers (`keeper_parse.c`, built by `build.rs`), each answer in its
/// canonical form.
#[cfg(test)]
pub(crate) mod c {
    use nix::libc::{c_long, size_t};

    unsafe extern "C" {
        fn leasehold_kp_request(input: *const u8, len: size_t, out: *mut u8, cap: size_t)
        -> c_long;
        fn leasehold_kp_hub(input: *const u8, len: size_t, out: *mut u8, cap: size_t) -> c_long;
        fn leasehold_kp_lease_file(
            input: *const u8,
            len: size_t,
            out: *mut u8,
            cap: size_t,
        ) -> c_long;
        fn leasehold_kp_control(input: *const u8, sizes: *const size_t, reads: size_t) -> c_long;
        fn leasehold_kp_exec(input: *const u8, len: size_t, out: *mut u8, cap: size_t) -> c_long;
    }

    type Parser = unsafe extern "C" fn(*const u8, size_t, *mut u8, size_t) -> c_long;

    fn call(parser: Parser, input: &[u8]) -> Vec<u8> {
        // Every item of a form is at most the input's bytes, or a number; a few fixed ones.
        let mut out = vec![0u8; input.len() * 2 + 4096];
        // SAFETY: the parser reads `input.len()` bytes of `input` and writes at most
        // `out.len()` bytes into `out`, both alive for the call; it keeps neither.
        let n = unsafe { parser(input.as_ptr(), input.len(), out.as_mut_ptr(), out.len()) };
        let n = usize::try_from(n).expect("the form fits its buffer");
        out.truncate(n);
        out
    }

    pub(crate) fn request(body: &[u8]) -> Vec<u8> {
        call(leasehold_kp_request, body)
    }

    pub(crate) fn hub(datagram: &[u8]) -> Vec<u8> {
        call(leasehold_kp_hub, datagram)
    }

    pub(crate) fn lease_file(bytes: &[u8]) -> Vec<u8> {
        call(leasehold_kp_lease_file, bytes)
    }

    /// `args` given as NUL-terminated strings.
    pub(crate) fn exec(args: &[Vec<u8>]) -> Vec<u8> {
        let joined: Vec<u8> = args
            .iter()
            .flat_map(|a| a.iter().copied().chain([0]))
            .collect();
        call(leasehold_kp_exec, &joined)
    }

    pub(crate) fn release_at(bytes: &[u8], sizes: &[usize]) -> Option<usize> {
        assert_eq!(sizes.iter().sum::<usize>(), bytes.len());
        // SAFETY: the reads' sizes add up to `bytes.len()`; both slices outlive the call.
        let at = unsafe { leasehold_kp_control(bytes.as_ptr(), sizes.as_ptr(), sizes.len()) };
        usize::try_from(at).ok()
    }
}

#[cfg(test)]
mod tests;
