//! An attempt's files beside the database, written by the runner's keeper (see the process
//! layer's `keeper`): where they are, and how to read them.
//!
//! ```text
//! <db>-attempts/                        owner-only (0700), made by a runner
//!   .leasehold-keeper-<hash>            the keeper program (0700), written only where it cannot
//!                                       be exec'ed from memory (a process that is not dumpable)
//!   keeper-<pid>-<start>.journal        a keeper's journal, made once a runner went without
//!                                       taking an attempt's ending (see below)
//!   <job id>/                           made only for a job whose output goes to files
//!     <attempt>-<run token>/            one per such attempt (an operator's retry counts again)
//!       stdout, stderr                  the streams, capped (see below), 0600; each made
//!                                       at its stream's first byte (none: no output)
//!       lease                           an adopting runner's lease fence for the keeper
//! ```
//!
//! A stream is kept in the keeper's memory while it fits the database's tail of it, and
//! reaches the runner with the command's end: a job that says little leaves nothing here. It
//! goes to its file once it outgrows that, once the attempt has run a second (for `jobs logs
//! --follow`), or once the runner is gone; a finished attempt whose output fit the tail
//! has its folder removed once its ending is committed.
//!
//! A stream's file holds everything up to its cap. Past the cap it keeps the first half of
//! the cap, then one marker line (fixed width, rewritten in place as the count grows), then
//! the newest bytes: half the cap of them or more (all but the marker's room when fewer are
//! past the head), three quarters at most, for the tail region is moved back to just after
//! the marker, its newest half cap kept, whenever it would pass three quarters of the cap.
//! So the file never passes about `cap * 5 / 4` bytes, and a reader following it sees its
//! size go down at a move.
//!
//! A journal is text, one record a line, each ending in the FNV-1a hash of the rest (16 hex
//! digits), so that a line torn by a crash is told from a whole one:
//!
//! ```text
//! kept <run token> <pid>                        the runner went while the command ran
//! outcome <run token> exit|signal <n> <ended_at ms>   the command ended (fdatasync'ed)
//! fenced <run token>                            the lease fence stopped it (fdatasync'ed)
//! ```

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// The name of the stdout file in an attempt's folder.
pub(crate) const STDOUT: &str = "stdout";
/// The name of the stderr file in an attempt's folder.
pub(crate) const STDERR: &str = "stderr";
/// How a marker line of dropped bytes begins (the whole line is
/// `\n[leasehold: <20-wide count> bytes dropped]\n`).
pub(crate) const DROPPED_PREFIX: &[u8] = b"\n[leasehold: ";
/// How a marker line of dropped bytes ends.
pub(crate) const DROPPED_SUFFIX: &[u8] = b" bytes dropped]\n";
/// The width the dropped count is padded to, with spaces on the left.
pub(crate) const DROPPED_WIDTH: usize = 20;
/// The default cap of one stream's file: 64 MiB.
pub const DEFAULT_OUTPUT_CAP: u64 = 64 << 20;

/// The attempts folder of the database at `db`: `<db>-attempts`, named after the real file
/// as the wake-up folder is (symlinks resolved).
pub(crate) fn folder(db: &Path) -> PathBuf {
    let mut name = crate::store::wake::canonical(db).into_os_string();
    name.push("-attempts");
    PathBuf::from(name)
}

/// The folders this host keeps for the database at `db` outside it: its runners' wake-up
/// sockets and its attempts' files. Beside a SQLite file (`<db>-wake`, `<db>-attempts`); for
/// a PostgreSQL URL under this user's state folder (`$XDG_STATE_HOME/leasehold`, named after
/// the URL and this host). They may not exist. What to remove once the database is dropped
/// and no runner of this host uses it.
pub fn local_folders(db: impl AsRef<Path>) -> [PathBuf; 2] {
    let db = db.as_ref();
    [crate::store::wake::folder(db), folder(db)]
}

/// Makes the attempts folder `folder` (0700) if it is missing, and checks that it is this
/// user's alone, as the wake-up folder is checked.
///
/// # Errors
///
/// [`Error::AttemptsFolder`](crate::Error::AttemptsFolder) naming what is wrong with it;
/// [`Error::Io`](crate::Error::Io) when it cannot be made or looked at.
pub(crate) fn prepare_folder(folder: &Path) -> crate::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(folder) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(crate::Error::io(
                format!("cannot make {}", folder.display()),
                e,
            ));
        }
    }
    crate::store::wake::check_owned(folder, |problem| crate::Error::AttemptsFolder {
        path: folder.to_path_buf(),
        problem,
    })?;
    Ok(())
}

/// The folder of one job's attempts.
pub(crate) fn job_dir(folder: &Path, job_id: i64) -> PathBuf {
    folder.join(job_id.to_string())
}

/// The folder of one attempt.
pub(crate) fn attempt_dir(folder: &Path, job_id: i64, attempt: i64, token: &str) -> PathBuf {
    job_dir(folder, job_id).join(format!("{attempt}-{token}"))
}

/// Makes the folder `dir` of one attempt (an [`attempt_dir`]) and, if it is missing, its
/// job's folder, both owner-only (0700). Two `mkdir` calls for a job's first attempt, the
/// job's folder first: `create_dir_all` would try the attempt's folder first, fail, and then
/// make both, a third call. On ext4 each call is a metadata operation that waits behind the
/// journal's commits, which SQLite's `fsync`s force (docs/performance.md).
///
/// A job's folder made anew is made in an attempts folder checked as [`prepare_folder`] checks
/// it (one more `lstat` for a job's first attempt): one removed since the runner's start is
/// made again, and one that another user made in its place is refused.
///
/// # Errors
///
/// Either folder cannot be made (a full disk, most likely), or the attempts folder is not
/// this user's alone (`PermissionDenied`, with [`crate::Error::AttemptsFolder`]'s words). One
/// that exists is not an error, as with `create_dir_all`.
pub(crate) fn make_attempt_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let mut builder = std::fs::DirBuilder::new();
    builder.mode(0o700);
    // The job's folder exists for a later attempt of the job (or an operator's retry).
    if let Some(job) = dir.parent() {
        match builder.create(job) {
            Ok(()) => check_folder(folder_of(dir))?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            // The attempts folder is gone (a runner makes it at its start): made and
            // checked again, then the job's folder.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                check_folder(folder_of(dir))?;
                builder.create(job)?;
            }
            Err(e) => return Err(e),
        }
    }
    match builder.create(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

/// [`prepare_folder`], with its refusal as an I/O error.
fn check_folder(folder: &Path) -> io::Result<()> {
    prepare_folder(folder).map_err(|e| match e {
        crate::Error::Io { source, .. } => source,
        refused => io::Error::new(io::ErrorKind::PermissionDenied, refused.to_string()),
    })
}

/// The name of the file in an attempt's folder that tells its keeper when the attempt's lease
/// runs out unless renewed (see [`write_lease`]).
pub(crate) const LEASE_FILE: &str = "lease";

/// When a keeper must stop its command because the runner could not renew the lease, by this
/// host's boot clock (`CLOCK_BOOTTIME`, ms: counts a suspend, never stepped): SIGTERM to the
/// group at `term_at`, SIGKILL at `kill_at`, both before the lease runs out by the margin the
/// runner's own self-fence keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseFence {
    pub term_at: u64,
    pub kill_at: u64,
}

impl LeaseFence {
    /// The fence of a lease that runs `ttl` from `since_boot_ns` (a boot-clock reading taken
    /// before the claim or the renewal), stopping the command `grace + margin` before its end
    /// and killing it `margin` before. `None` when the boot clock is unreadable.
    pub(crate) fn of(
        since_boot_ns: Option<u64>,
        ttl: std::time::Duration,
        grace: std::time::Duration,
        margin: std::time::Duration,
    ) -> Option<LeaseFence> {
        let since = since_boot_ns? / 1_000_000;
        let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let end = since.saturating_add(ms(ttl));
        let kill_at = end.saturating_sub(ms(margin)).max(since);
        Some(LeaseFence {
            term_at: kill_at.saturating_sub(ms(grace)).max(since),
            kill_at,
        })
    }
}

/// Writes `fence` into the attempt folder `dir`'s [`LEASE_FILE`], for its keeper: three
/// 20-digit numbers (`term_at`, `kill_at`, and their XOR, which tells a whole line from one
/// read while it was being written), always at offset 0 of the same file, so that a renewal
/// allocates nothing on a full disk after the first write.
///
/// # Errors
///
/// The file cannot be opened or written (the folder is gone: the attempt ended).
pub(crate) fn write_lease(dir: &Path, fence: LeaseFence) -> io::Result<()> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let line = lease_line(fence);
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_CLOEXEC)
        .open(dir.join(LEASE_FILE))?
        .write_all_at(line.as_bytes(), 0)
}

/// The line of a [`LEASE_FILE`] that holds `fence`.
pub(crate) fn lease_line(fence: LeaseFence) -> String {
    format!(
        "{:020} {:020} {:020}\n",
        fence.term_at,
        fence.kill_at,
        fence.term_at ^ fence.kill_at
    )
}

/// Removes an attempt's folder, and its job's folder if that is empty then: what a finished
/// attempt whose output the database holds whole leaves behind. A folder already gone, or
/// one that cannot be removed (logged), is passed over: retention removes it with its job.
pub(crate) fn remove_attempt_dir(dir: &Path) {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            log::debug!("removing {}: {e}", dir.display());
            return;
        }
    }
    if let Some(job) = dir.parent() {
        // Another attempt's folder is still there: kept.
        let _ = std::fs::remove_dir(job);
    }
}

/// The attempts folder (`<db>-attempts`) that holds the attempt folder `dir`.
pub(crate) fn folder_of(dir: &Path) -> &Path {
    dir.ancestors().nth(2).unwrap_or(dir)
}

/// One attempt's folder found on disk, as [`Store::attempt_files`](crate::Store::attempt_files)
/// lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptDir {
    /// The attempt number.
    pub attempt: i64,
    /// Its run token.
    pub token: String,
    /// The folder.
    pub path: PathBuf,
}

/// The attempts of one job that have a folder, oldest first (by attempt number, then by the
/// folder's change time: an operator's retry counts attempts again). Empty when the job has
/// none.
pub(crate) fn attempt_dirs(folder: &Path, job_id: i64) -> io::Result<Vec<AttemptDir>> {
    let entries = match std::fs::read_dir(job_dir(folder, job_id)) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let Some((attempt, token)) = name.to_str().and_then(|n| n.split_once('-')) else {
            continue;
        };
        let Ok(attempt) = attempt.parse::<i64>() else {
            continue;
        };
        let changed = entry
            .metadata()
            .and_then(|m| m.modified())
            .unwrap_or(std::time::SystemTime::UNIX_EPOCH);
        found.push((attempt, changed, token.to_owned(), entry.path()));
    }
    found.sort();
    Ok(found
        .into_iter()
        .map(|(attempt, _, token, path)| AttemptDir {
            attempt,
            token,
            path,
        })
        .collect())
}

/// One of an attempt's two output streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stream {
    /// The command's standard output.
    Stdout,
    /// The command's standard error.
    Stderr,
}

impl Stream {
    /// The name of its file in an attempt's folder: `stdout` or `stderr`.
    pub fn file_name(self) -> &'static str {
        match self {
            Stream::Stdout => STDOUT,
            Stream::Stderr => STDERR,
        }
    }
}

impl AttemptDir {
    /// The path of one stream's file (which may not exist: its keeper creates it at the
    /// stream's first byte, so a silent stream has none, which reads as empty).
    pub fn stream(&self, stream: Stream) -> PathBuf {
        self.path.join(stream.file_name())
    }

    /// The last at most `n` bytes of one stream's file, and whether anything before them is
    /// missing (the file is longer, or its keeper dropped bytes past the cap). A file not
    /// created yet reads as empty.
    ///
    /// # Errors
    ///
    /// The file cannot be read.
    pub fn tail(&self, stream: Stream, n: usize) -> io::Result<(Vec<u8>, bool)> {
        read_tail(&self.stream(stream), n)
    }
}

/// When the newest of an attempt's two output files last changed, if either exists: what an
/// idle timeout reads of a kept attempt.
pub(crate) fn newest_change(dir: &Path) -> Option<std::time::SystemTime> {
    [STDOUT, STDERR]
        .iter()
        .filter_map(|name| std::fs::metadata(dir.join(name)).ok()?.modified().ok())
        .max()
}

/// How an attempt's command ended, as its keeper saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// It exited with this code.
    Exited(i32),
    /// A signal killed it.
    Signaled(i32),
}

/// What a keeper journaled of an attempt once its runner was gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Journaled {
    /// The runner went while the command ran (the keeper's pid is the journal's).
    Kept,
    /// The command ended, at this time (ms since the Unix epoch).
    Outcome { ended: Ended, ended_at: i64 },
    /// The lease fence stopped the command: the attempt is lost.
    Fenced,
}

/// The journal of the keeper with `pid` and start time `start_time` (clock ticks since
/// boot): a file in the attempts folder `folder`, made by the keeper only once a runner has
/// gone without taking an attempt's ending.
pub(crate) fn journal_path(folder: &Path, pid: i32, start_time: Option<u64>) -> PathBuf {
    folder.join(format!("keeper-{pid}-{}.journal", start_time.unwrap_or(0)))
}

/// The keeper's pid and start time a journal's file name says, for a name
/// [`journal_path`] makes.
pub(crate) fn journal_keeper(name: &str) -> Option<(i32, u64)> {
    let rest = name.strip_prefix("keeper-")?.strip_suffix(".journal")?;
    let (pid, start) = rest.split_once('-')?;
    Some((pid.parse().ok()?, start.parse().ok()?))
}

/// The 64-bit FNV-1a hash of `bytes`: a journal line's checksum (`keeper.c` computes the
/// same).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Parses one journal line (without its newline): the token and what it says, or `None`
/// for a line that is not whole (torn by a crash) or not a record.
pub(crate) fn parse_journal_line(line: &str) -> Option<(&str, Journaled)> {
    let (text, check) = line.rsplit_once(' ')?;
    if check.len() != 16 || u64::from_str_radix(check, 16).ok()? != fnv1a(text.as_bytes()) {
        return None;
    }
    let words: Vec<&str> = text.split(' ').collect();
    match words.as_slice() {
        ["kept", token, pid] => {
            pid.parse::<i32>().ok()?;
            Some((token, Journaled::Kept))
        }
        ["fenced", token] => Some((token, Journaled::Fenced)),
        ["outcome", token, how, n, at] => {
            let ended = match *how {
                "exit" => Ended::Exited(n.parse().ok()?),
                "signal" => Ended::Signaled(n.parse().ok()?),
                _ => return None,
            };
            Some((
                token,
                Journaled::Outcome {
                    ended,
                    ended_at: at.parse().ok()?,
                },
            ))
        }
        _ => None,
    }
}

/// What the journal at `path` says last of the attempt with `token`; `None` when it says
/// nothing (or does not exist). A torn or foreign line is passed over.
///
/// # Errors
///
/// The journal cannot be read.
pub(crate) fn read_journal(path: &Path, token: &str) -> io::Result<Option<Journaled>> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(journal_says(&bytes, token))
}

/// What the journal's bytes `journal` say last of the attempt with `token`: its last line
/// about the token, whole and a record (a torn or foreign line is passed over).
pub(crate) fn journal_says(journal: &[u8], token: &str) -> Option<Journaled> {
    journal
        .split(|&b| b == b'\n')
        .rev()
        .filter_map(|line| std::str::from_utf8(line).ok())
        .filter_map(parse_journal_line)
        .find(|(t, _)| *t == token)
        .map(|(_, said)| said)
}

/// A journal line as the keeper writes it (without its newline), for tests.
#[cfg(test)]
pub(crate) fn journal_line(text: &str) -> String {
    format!("{text} {:016x}", fnv1a(text.as_bytes()))
}

/// The tokens of the attempts a journal's whole lines mention, each once.
pub(crate) fn journal_tokens(bytes: &[u8]) -> Vec<String> {
    let mut tokens: Vec<String> = bytes
        .split(|&b| b == b'\n')
        .filter_map(|line| std::str::from_utf8(line).ok())
        .filter_map(parse_journal_line)
        .map(|(token, _)| token.to_owned())
        .collect();
    tokens.sort_unstable();
    tokens.dedup();
    tokens
}

/// The journals in the attempts folder `folder` that mention `token`, with their keepers'
/// pids and start times: how the keeper of an attempt whose runner died before recording
/// it is found.
pub(crate) fn journals_of(folder: &Path, token: &str) -> Vec<(i32, u64, Journaled)> {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let (pid, start) = journal_keeper(e.file_name().to_str()?)?;
            let said = read_journal(&e.path(), token).ok()??;
            Some((pid, start, said))
        })
        .collect()
}

/// The last at most `n` bytes of a stream's file, and whether anything before them is
/// missing from those bytes (the file is longer, or its keeper dropped bytes). An absent file
/// is empty.
pub(crate) fn read_tail(path: &Path, n: usize) -> io::Result<(Vec<u8>, bool)> {
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((Vec::new(), false)),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    let want = u64::try_from(n).unwrap_or(u64::MAX).min(len);
    file.seek(SeekFrom::Start(len - want))?;
    let mut bytes = Vec::with_capacity(usize::try_from(want).unwrap_or(0));
    file.take(want).read_to_end(&mut bytes)?;
    let cut = want < len || dropped(&bytes).is_some();
    Ok((bytes, cut))
}

/// The dropped count of the first marker line in `bytes`, if there is one.
pub(crate) fn dropped(bytes: &[u8]) -> Option<u64> {
    let start = bytes
        .windows(DROPPED_PREFIX.len())
        .position(|w| w == DROPPED_PREFIX)?
        + DROPPED_PREFIX.len();
    let count = bytes.get(start..start + DROPPED_WIDTH)?;
    let rest = bytes.get(start + DROPPED_WIDTH..)?;
    if !rest.starts_with(DROPPED_SUFFIX) {
        return None;
    }
    std::str::from_utf8(count).ok()?.trim_start().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempts_folder_another_user_could_use_is_refused_when_a_job_folder_is_made_in_it() {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let base = tempfile::tempdir().expect("tempdir");
        let folder = base.path().join("db-attempts");
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o7777;
        // Gone since the runner's start: made again, owner-only.
        make_attempt_dir(&attempt_dir(&folder, 1, 1, "ab12")).expect("made again");
        assert_eq!(mode(&folder), 0o700);
        // Gone, and made again open to all, as another user's could be.
        std::fs::remove_dir_all(&folder).expect("remove");
        std::fs::DirBuilder::new()
            .mode(0o777)
            .create(&folder)
            .expect("mkdir");
        std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let err = make_attempt_dir(&attempt_dir(&folder, 2, 1, "cd34")).expect_err("0777");
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
        assert!(err.to_string().contains("has mode 0777, not 0700"), "{err}");
        if !nix::unistd::geteuid().is_root() {
            return eprintln!("not root: no folder of another user to test with");
        }
        // Another user's, owner-only.
        std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        std::os::unix::fs::chown(&folder, Some(65534), None).expect("chown to nobody");
        let err = make_attempt_dir(&attempt_dir(&folder, 3, 1, "ef56")).expect_err("nobody's");
        assert!(err.to_string().contains("is owned by uid 65534"), "{err}");
    }

    #[test]
    fn a_journal_line_reads_back_as_the_keeper_writes_it_and_a_torn_one_is_passed_over() {
        let line = journal_line;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = journal_path(dir.path(), 42, Some(7));
        assert_eq!(
            journal_keeper(path.file_name().and_then(|n| n.to_str()).expect("name")),
            Some((42, 7))
        );
        assert_eq!(read_journal(&path, "ab12").expect("no journal"), None);
        let whole = [
            line("kept ab12 100"),
            line("outcome cd34 signal 9 1700000000123"),
            line("outcome ab12 exit 3 1700000000456"),
            line("fenced ef56"),
        ];
        for l in &whole {
            assert!(parse_journal_line(l).is_some(), "{l}");
            // Any prefix of a line is not a record.
            for cut in 0..l.len() {
                assert_eq!(parse_journal_line(&l[..cut]), None, "{:?}", &l[..cut]);
            }
        }
        // The last line torn by a crash: passed over.
        let text = format!("{}\n{}", whole.join("\n"), &line("fenced ab12")[..20]);
        std::fs::write(&path, text).expect("write");
        let said = |token| read_journal(&path, token).expect("read");
        assert_eq!(
            said("ab12"),
            Some(Journaled::Outcome {
                ended: Ended::Exited(3),
                ended_at: 1_700_000_000_456
            })
        );
        assert_eq!(
            said("cd34"),
            Some(Journaled::Outcome {
                ended: Ended::Signaled(9),
                ended_at: 1_700_000_000_123
            })
        );
        assert_eq!(said("ef56"), Some(Journaled::Fenced));
        assert_eq!(said("none"), None);
        assert_eq!(
            journals_of(dir.path(), "ef56"),
            vec![(42, 7, Journaled::Fenced)]
        );
    }

    #[test]
    fn an_attempt_folder_is_made_owner_only_with_its_job_folder_when_missing() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let folder = dir.path().join("db-attempts");
        let mode = |p: &Path| std::fs::metadata(p).expect("made").permissions().mode() & 0o777;
        // The attempts folder is missing too: all of it is made.
        let first = attempt_dir(&folder, 7, 1, "aa");
        make_attempt_dir(&first).expect("first attempt");
        // A later attempt, its job's folder there; an attempt's folder made twice.
        let second = attempt_dir(&folder, 7, 2, "bb");
        make_attempt_dir(&second).expect("second attempt");
        make_attempt_dir(&second).expect("made again");
        make_attempt_dir(&attempt_dir(&folder, 8, 1, "cc")).expect("another job");
        for path in [job_dir(&folder, 7), first, second, job_dir(&folder, 8)] {
            assert_eq!(mode(&path), 0o700, "{}", path.display());
        }
        assert_eq!(folder_of(&attempt_dir(&folder, 7, 1, "aa")), folder);
        let seen: Vec<_> = attempt_dirs(&folder, 7)
            .expect("list")
            .into_iter()
            .map(|d| d.attempt)
            .collect();
        assert_eq!(seen, [1, 2]);
    }

    #[test]
    fn attempt_dirs_are_listed_oldest_first_and_the_dropped_marker_is_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (attempt, token) in [(2, "bb"), (1, "aa"), (10, "cc")] {
            std::fs::create_dir_all(attempt_dir(dir.path(), 7, attempt, token)).expect("mkdir");
        }
        std::fs::create_dir_all(job_dir(dir.path(), 7).join("junk")).expect("mkdir");
        let found = attempt_dirs(dir.path(), 7).expect("list");
        let seen: Vec<_> = found
            .iter()
            .map(|d| (d.attempt, d.token.as_str()))
            .collect();
        assert_eq!(seen, [(1, "aa"), (2, "bb"), (10, "cc")]);
        assert!(attempt_dirs(dir.path(), 8).expect("none").is_empty());

        let mut text = b"head".to_vec();
        text.extend_from_slice(DROPPED_PREFIX);
        text.extend_from_slice(format!("{:>DROPPED_WIDTH$}", 1234).as_bytes());
        text.extend_from_slice(DROPPED_SUFFIX);
        text.extend_from_slice(b"tail\n");
        assert_eq!(dropped(&text), Some(1234));
        let path = dir.path().join("stdout");
        std::fs::write(&path, &text).expect("write");
        assert_eq!(
            read_tail(&path, 5).expect("tail"),
            (b"tail\n".to_vec(), true)
        );
        assert_eq!(read_tail(&path, 1 << 20).expect("all"), (text, true));
        std::fs::write(&path, b"short\n").expect("write");
        assert_eq!(
            read_tail(&path, 100).expect("short"),
            (b"short\n".to_vec(), false)
        );
    }
}
