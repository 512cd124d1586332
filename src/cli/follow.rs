//! `jobs logs --follow`: prints a running attempt's output file as it grows, as `tail -f` and
//! pueue's `follow` do, until the attempt is no longer running; a job not started yet is
//! waited for.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use leasehold::{AttemptDir, JobRecord, Status, Store, Stream};

use super::attempt::{attempt_dir, is_running};

/// How often the file is looked at for new bytes.
const FILE_POLL: Duration = Duration::from_millis(100);
/// How often the job's row is read to learn whether the attempt still runs.
const JOB_POLL: Duration = Duration::from_millis(200);
/// The most bytes read from the file at once.
const CHUNK: usize = 64 << 10;

/// Follows `stream` of the attempt in `dir`: prints what the file has, then its new bytes as
/// they are written, until `job` is no longer running that attempt; then the rest. A file
/// whose size goes down (its keeper moved the tail region back, past the cap) is followed
/// from its new end, with a notice on stderr.
pub fn file(
    store: &Store,
    job: &JobRecord,
    dir: &AttemptDir,
    stream: Stream,
) -> anyhow::Result<()> {
    let path = dir.stream(stream);
    let mut out = std::io::stdout().lock();
    let mut file = None;
    let mut pos = 0u64;
    let mut buf = vec![0u8; CHUNK];
    let mut checked = Instant::now();
    let mut ended = !is_running(job, dir.attempt, Some(dir));
    loop {
        // The row is read before the file: an attempt's keeper has written all its output
        // before the runner records its ending, so reading on after seeing the end gets it all.
        if !ended && checked.elapsed() >= JOB_POLL {
            checked = Instant::now();
            ended = match store.job(job.id) {
                Ok(now) => !is_running(&now, dir.attempt, Some(dir)),
                // Cancelled and pruned while followed: nothing more comes.
                Err(leasehold::Error::NoSuchJob(_)) => true,
                Err(e) => return Err(e.into()),
            };
        }
        if file.is_none() {
            file = open(&path)?;
        }
        if let Some(f) = file.as_mut() {
            let len = f
                .metadata()
                .with_context(|| format!("cannot read {}", path.display()))?
                .len();
            if len < pos {
                eprintln!(
                    "leasehold: {} went down from {pos} to {len} bytes (its cap keeps the \
                     newest bytes): following from its new end",
                    path.display()
                );
                pos = len;
            }
            pos = copy_from(f, pos, &mut buf, &mut out)
                .with_context(|| format!("cannot read {}", path.display()))?;
        }
        if ended {
            return Ok(());
        }
        std::thread::sleep(FILE_POLL);
    }
}

/// Follows attempt `attempt` of a running job that has no folder of its own (yet): waits for
/// its keeper to make one and follows that. When the attempt ends first, prints its folder's
/// file if one appeared, else (a runner that writes no files) the tail the database kept.
pub fn until_files(
    store: &Store,
    job: &JobRecord,
    attempt: i64,
    stream: Stream,
) -> anyhow::Result<()> {
    let mut job = job.clone();
    loop {
        let running = is_running(&job, attempt, None);
        if let Some(dir) = attempt_dir(&store.attempt_files(job.id)?, attempt, &job) {
            // While it runs, only its own folder (its run token's) is followed.
            if !running || is_running(&job, attempt, Some(&dir)) {
                return file(store, &job, &dir, stream);
            }
        }
        if !running {
            let bytes = store.output(job.id, Some(attempt))?.map(|o| match stream {
                Stream::Stdout => o.stdout,
                Stream::Stderr => o.stderr,
            });
            let mut out = std::io::stdout().lock();
            out.write_all(&bytes.unwrap_or_default())?;
            out.flush()?;
            return Ok(());
        }
        std::thread::sleep(JOB_POLL);
        job = match store.job(job.id) {
            Ok(job) => job,
            Err(leasehold::Error::NoSuchJob(_)) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
    }
}

/// Waits for a pending `job` to start, saying so on stderr once: returns the job as it is once
/// it started (running, or already ended after starting), or `None` when it ended without
/// starting (cancelled, or pruned), which is said on stderr with its status.
pub fn until_started(store: &Store, job: JobRecord) -> anyhow::Result<Option<JobRecord>> {
    let id = job.id;
    eprintln!(
        "leasehold: job {id} has not started yet ({}): waiting for it to start",
        job.status
    );
    let mut now = job.clone();
    loop {
        if now.attempt > job.attempt || now.status == Status::Running {
            return Ok(Some(now));
        }
        if now.status != Status::Pending {
            eprintln!("leasehold: job {id} ended {} without starting", now.status);
            return Ok(None);
        }
        std::thread::sleep(JOB_POLL);
        now = match store.job(id) {
            Ok(now) => now,
            Err(leasehold::Error::NoSuchJob(_)) => {
                eprintln!("leasehold: job {id} was deleted without starting");
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        };
    }
}

/// The file at `path`, or `None` when its keeper has not created it yet.
fn open(path: &Path) -> anyhow::Result<Option<File>> {
    match File::open(path) {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Writes the bytes of `f` from `pos` to its end to `out`, flushing after each write; returns
/// the position reached.
fn copy_from(
    f: &mut File,
    mut pos: u64,
    buf: &mut [u8],
    out: &mut impl Write,
) -> std::io::Result<u64> {
    f.seek(SeekFrom::Start(pos))?;
    loop {
        let n = match f.read(buf) {
            Ok(0) => return Ok(pos),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        out.write_all(&buf[..n])?;
        out.flush()?;
        pos += n as u64;
    }
}
