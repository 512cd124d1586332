//! A full disk loses nothing: a runner with jobs in flight on a small tmpfs that fills up, then
//! frees again. Every job ends exactly once, and an enqueue during the full period fails with
//! a clear error.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use leasehold::{Job, Status, Store};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tempfile::TempDir;

use crate::helper::WAIT;
use crate::util::{Watchdog, leasehold_vars, poll, wait_for};

/// A tmpfs of a few MiB mounted on a temporary folder, unmounted when dropped.
struct SmallFs {
    dir: PathBuf,
}

impl SmallFs {
    /// Mounts a tmpfs of `size` (as `mount` spells it) on `dir`; Err with mount's complaint
    /// where mounting is refused (not root, no CAP_SYS_ADMIN).
    fn mount(dir: &Path, size: &str) -> Result<SmallFs, String> {
        std::fs::create_dir_all(dir).expect("the mount point can be made");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if out.status.success() {
            Ok(SmallFs {
                dir: dir.to_path_buf(),
            })
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        // Lazy: a process still holding a file there (a runner being killed) does not keep
        // the mount alive past the test.
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

/// `leasehold run` with its log outside the small filesystem (a log on it could not be written
/// while it is full). Killed by pid when dropped.
struct Runner {
    child: Child,
    log: PathBuf,
}

impl Runner {
    fn start(db: &Path, log: PathBuf, args: &[&str]) -> Runner {
        let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("leasehold"));
        cmd.arg("--db").arg(db).arg("run").args(args);
        for var in leasehold_vars() {
            cmd.env_remove(var);
        }
        let child = cmd
            .env("LEASEHOLD_WORKERS", "3")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log).expect("the log file can be created"))
            .spawn()
            .expect("leasehold run starts");
        Runner { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn stop(&mut self) {
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        let child = &mut self.child;
        poll(WAIT, || {
            child.try_wait().expect("the runner can be waited for")
        })
        .expect("the runner exits after SIGTERM");
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

/// Writes `file` until the filesystem refuses: then it is full.
fn fill(file: &Path) -> File {
    let mut f = File::create(file).expect("the filler can be created");
    let chunk = vec![0xa5u8; 16 * 1024];
    let mut small = false;
    loop {
        let buf = if small { &chunk[..512] } else { &chunk[..] };
        match f.write(buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(nix::errno::Errno::ENOSPC as i32) => {
                // Fill the last pages too, then stop.
                if small {
                    break;
                }
                small = true;
            }
            Err(e) => panic!("filling the filesystem: {e}"),
        }
    }
    f
}

/// Mounts a 4 MiB tmpfs on `mnt`, saying which path the test takes.
fn small_fs(mnt: &Path) -> Option<SmallFs> {
    match SmallFs::mount(mnt, "4m") {
        Ok(fs) => {
            println!("full-disk test: a 4 MiB tmpfs at {}", mnt.display());
            Some(fs)
        }
        Err(why) => {
            // The same paths on a database made full by `PRAGMA max_page_count` run in the
            // crate's unit tests (`store::tx::tests`, `runner::writer::tests`): a runner in
            // another process offers no connection to set that pragma on.
            println!(
                "full-disk test: mounting a tmpfs was refused ({why}); see the max_page_count \
                 unit tests"
            );
            None
        }
    }
}

/// A database folder on a small filesystem: the mount is dropped (unmounted) before the
/// temporary folder that holds it.
struct Disk {
    _fs: SmallFs,
    mnt: PathBuf,
    db: PathBuf,
    tmp: TempDir,
}

/// A new [`Disk`], or None (having said why) where mounting is refused.
fn small_disk() -> Option<Disk> {
    let tmp = TempDir::new().expect("a temporary folder");
    let mnt = tmp.path().join("small");
    let fs = small_fs(&mnt)?;
    let db = mnt.join("jobs.db");
    Some(Disk {
        _fs: fs,
        mnt,
        db,
        tmp,
    })
}

/// Waits until every job of `ids` has ended.
fn wait_all_ended(store: &Store, ids: &[i64]) {
    wait_for("every job to end", Duration::from_secs(60), || {
        ids.iter()
            .all(|&id| store.job(id).expect("job").status.is_terminal())
            .then_some(())
    });
}

/// `leasehold --db DB jobs add ARGS`, with `stdin`.
fn jobs_add(db: &Path, args: &[&str], stdin: &str) -> std::process::Output {
    let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("leasehold"));
    cmd.arg("--db").arg(db).args(["jobs", "add"]).args(args);
    for var in leasehold_vars() {
        cmd.env_remove(var);
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("leasehold jobs add starts");
    child
        .stdin
        .take()
        .expect("a stdin pipe")
        .write_all(stdin.as_bytes())
        .expect("stdin is written");
    child.wait_with_output().expect("leasehold jobs add runs")
}

/// The enqueue failed for space: exit 1 and one clear line.
fn refused_as_full(out: &std::process::Output) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert_eq!(stderr.trim_end(), "leasehold: database or disk is full");
}

/// No runner holds the file, so the `-shm` index must be made anew on the full disk too:
/// a single and a batch enqueue are both refused, and store nothing.
#[test]
fn enqueue_on_a_full_disk_exits_1_and_stores_nothing() {
    let _watchdog = Watchdog::new();
    let Some(disk) = small_disk() else { return };
    let (mnt, db) = (&disk.mnt, &disk.db);
    assert!(jobs_add(db, &["--", "true"], "").status.success());
    let filled = fill(&mnt.join("filler"));

    refused_as_full(&jobs_add(db, &["--", "echo", "late"], ""));
    refused_as_full(&jobs_add(db, &["--from-file", "-"], "true\nfalse\ntrue\n"));

    drop(filled);
    std::fs::remove_file(mnt.join("filler")).expect("the filler can be removed");
    let store = Store::open(db).expect("open once there is room");
    let counts = store.counts().expect("counts");
    assert_eq!(counts.pending, 1, "only the first job: {counts:?}");
    drop(store);
    drop(disk);
}

#[test]
fn full_disk_loses_no_ending_and_refuses_enqueues() {
    full_disk_run(false);
}

/// The same with every attempt under a keeper, whose output files and outcome share the full
/// disk: the keepers and the runner go on, and every ending is recorded exactly once (the
/// output written while the disk was full is dropped, not the ending).
#[test]
fn full_disk_with_keepers_loses_no_ending() {
    full_disk_run(true);
}

fn full_disk_run(keepers: bool) {
    let _watchdog = Watchdog::new();
    let Some(disk) = small_disk() else { return };
    let (tmp, mnt, db) = (disk.tmp.path(), &disk.mnt, &disk.db);
    let store = Store::open(db).expect("the database is created on the tmpfs");
    let jobs: Vec<Job> = (0..20)
        .map(|_| Job::shell("sleep 0.3; echo done").cwd(tmp))
        .collect();
    let ids = store.enqueue_many(&jobs).expect("enqueue");
    drop(store);

    let mode: &[&str] = if keepers { &[] } else { &["--no-keepers"] };
    let mut runner = Runner::start(db, tmp.join("runner.log"), mode);
    let store = Store::open(db).expect("open");
    wait_for("a job to run", WAIT, || {
        ids.iter()
            .any(|&id| store.job(id).expect("job").status == Status::Running)
            .then_some(())
    });

    let filler = mnt.join("filler");
    let filled = fill(&filler);
    wait_for("the runner to report the full disk", WAIT, || {
        runner
            .log()
            .contains("database or disk is full")
            .then_some(())
    });

    // An enqueue while full fails with one clear line, and stores nothing.
    let out = jobs_add(db, &["--", "echo", "late"], "");
    refused_as_full(&out);

    // Hold it full while attempts end (each runs 0.3 s) and their endings wait in memory:
    // longer than a writer that gives up after twenty failed transactions would hold them.
    std::thread::sleep(Duration::from_secs(3));
    drop(filled);
    std::fs::remove_file(&filler).expect("the filler can be removed");

    wait_all_ended(&store, &ids);
    runner.stop();

    let counts = store.counts().expect("counts");
    assert_eq!(
        (counts.succeeded, counts.pending + counts.running),
        (ids.len() as u64, 0),
        "the refused enqueue left no job: {counts:?}"
    );
    for &id in &ids {
        let job = store.job(id).expect("job");
        let events = store.events(id).expect("events");
        let kinds: Vec<String> = events.iter().map(|e| e.kind.to_string()).collect();
        assert_eq!(job.status, Status::Succeeded, "job {id}: {kinds:?}");
        assert_eq!(job.attempt, 1, "job {id} ran once: {kinds:?}");
        assert_eq!(job.recovery_count, 0, "job {id}: {kinds:?}");
        let count = |k: &str| kinds.iter().filter(|x| *x == k).count();
        assert_eq!(count("claimed"), 1, "job {id}: {kinds:?}");
        assert_eq!(count("succeeded"), 1, "job {id}: {kinds:?}");
        assert_eq!(
            kinds.last().map(String::as_str),
            Some("succeeded"),
            "job {id}: {kinds:?}"
        );
        let out = store.output(id, None).expect("output");
        if !keepers {
            assert_eq!(out.expect("an output row").stdout, b"done\n", "job {id}");
        }
    }
    let log = runner.log();
    assert!(!log.contains("cannot record the ending"), "{log}");
    assert!(log.contains("space is back"), "{log}");
    drop(store);
    drop(disk);
}

/// A disk full for longer than the lease: the heartbeat cannot renew, so the runner kills its
/// attempts (the usual self-fence), holds their endings, and records each loss once when space
/// is back; the jobs then run again and succeed.
#[test]
fn full_disk_past_the_lease_fences_and_records_each_loss_once() {
    let _watchdog = Watchdog::new();
    let Some(disk) = small_disk() else { return };
    let (tmp, mnt, db) = (disk.tmp.path(), &disk.mnt, &disk.db);
    let store = Store::open(db).expect("the database is created on the tmpfs");
    let jobs: Vec<Job> = (0..3)
        .map(|_| Job::shell("sleep 3; echo done").cwd(tmp))
        .collect();
    let ids = store.enqueue_many(&jobs).expect("enqueue");

    let timings = [
        "--lease-ttl",
        "1.5",
        "--heartbeat",
        "0.3",
        "--sweep",
        "0.3",
        "--kill-grace",
        "0.3",
    ];
    let mut runner = Runner::start(db, tmp.join("runner.log"), &timings);
    wait_for("every job to run", WAIT, || {
        ids.iter()
            .all(|&id| {
                let j = store.job(id).expect("job");
                j.status == Status::Running && j.pgid.is_some()
            })
            .then_some(())
    });

    let filler = mnt.join("filler");
    let filled = fill(&filler);
    wait_for("the runner to fence its attempts", WAIT, || {
        (runner
            .log()
            .matches("killing the attempt so that no other runner")
            .count()
            >= ids.len())
        .then_some(())
    });
    // The losses cannot be written either: the writer holds them.
    wait_for("the writer to hold the endings", WAIT, || {
        runner
            .log()
            .contains("in memory and retrying")
            .then_some(())
    });
    drop(filled);
    std::fs::remove_file(&filler).expect("the filler can be removed");

    wait_all_ended(&store, &ids);
    runner.stop();
    let log = runner.log();
    for &id in &ids {
        let job = store.job(id).expect("job");
        let events = store.events(id).expect("events");
        let kinds: Vec<String> = events.iter().map(|e| e.kind.to_string()).collect();
        assert_eq!(job.status, Status::Succeeded, "job {id}: {kinds:?}\n{log}");
        let fenced = events.iter().any(|e| {
            e.detail
                .as_deref()
                .is_some_and(|d| d.contains("could not renew the lease"))
        });
        assert!(
            fenced,
            "job {id}'s loss is the runner's own fence: {events:?}"
        );
        assert_eq!(job.recovery_count, 1, "job {id}: {kinds:?}");
        let count = |k: &str| kinds.iter().filter(|x| *x == k).count();
        assert_eq!(count("claimed"), 2, "job {id}: {kinds:?}");
        // A self-fenced attempt with recovery budget left goes back to pending: `reclaimed`.
        assert_eq!(count("reclaimed"), 1, "job {id}: {kinds:?}");
        assert_eq!(count("succeeded"), 1, "job {id}: {kinds:?}");
        assert_eq!(count("late_result_discarded"), 0, "job {id}: {kinds:?}");
        // One ending per attempt, each after its claim.
        let endings: Vec<&str> = kinds
            .iter()
            .map(String::as_str)
            .filter(|k| matches!(*k, "claimed" | "reclaimed" | "lost" | "succeeded"))
            .collect();
        assert_eq!(
            endings,
            ["claimed", "reclaimed", "claimed", "succeeded"],
            "job {id}"
        );
    }
    assert!(log.contains("space is back"), "{log}");
    drop(store);
    drop(disk);
}
