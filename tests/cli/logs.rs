//! An attempt's output files: `jobs logs` reads them whole and follows a running attempt's,
//! the dashboard shows a running job's file tail, and the files go with their job when it is
//! pruned. Until runners write the files (the keeper), the tests write an attempt's folder by
//! hand, in the layout of `src/files.rs`, beside a real database made with `jobs add`.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::helper::{FAST, add, cli, fails, inspect, json, ok, run_until_idle, stop};
use crate::serve::Server;
use crate::util::{RunnerProcess, TestDb, wait_until};

/// The folder of one job's attempts beside the database at `db`: `<db>-attempts/<id>/`.
fn job_dir(db: &Path, id: i64) -> PathBuf {
    let real = std::fs::canonicalize(db).expect("the database exists");
    let mut name = real.into_os_string();
    name.push("-attempts");
    PathBuf::from(name).join(id.to_string())
}

/// Writes an attempt's folder as its keeper would: `<db>-attempts/<id>/<attempt>-<token>/`
/// with `stdout` and `stderr`. Returns the folder.
fn write_attempt(
    db: &Path,
    id: i64,
    attempt: i64,
    token: &str,
    stdout: &[u8],
    stderr: &[u8],
) -> PathBuf {
    let dir = job_dir(db, id).join(format!("{attempt}-{token}"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("stdout"), stdout).unwrap();
    std::fs::write(dir.join("stderr"), stderr).unwrap();
    dir
}

/// Sets job `id` running attempt 1 with `token`, as a runner's claim and start would (plain
/// SQL: no runner holds it).
fn set_running(t: &TestDb, id: i64, token: &str) {
    let changed = t
        .bare()
        .execute(
            "UPDATE jobs SET status = 'running', attempt = 1, run_token = ?2, \
             started_at = ?3 WHERE id = ?1",
            rusqlite::params![id, token, leasehold::now_ms()],
        )
        .unwrap();
    assert_eq!(changed, 1);
}

/// `n` bytes of numbered lines, so that a wrong slice shows.
fn numbered(n: usize) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(n + 32);
    let mut i = 0;
    while bytes.len() < n {
        writeln!(bytes, "line {i:08}").unwrap();
        i += 1;
    }
    bytes.truncate(n);
    bytes
}

/// A finished job whose attempt has a folder: `jobs logs` prints the whole file (more than
/// the tail the database keeps), `--stderr` the other one, `--attempt` picks an attempt, and
/// `--follow` on a job that is not running prints the same and exits. Without a folder it
/// prints the tail kept in the database, as before.
#[test]
fn logs_print_an_attempts_whole_file_and_fall_back_to_the_kept_tail() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let id = add(db, &[], &["sh", "-c", "echo recorded; echo oops >&2"]);
    let other = add(db, &[], &["sh", "-c", "echo only-in-the-db"]);
    run_until_idle(db, &[]);
    let logs = |args: &[&str]| {
        let mut all = vec!["jobs", "logs"];
        all.extend_from_slice(args);
        cli(db, &all).output().unwrap()
    };
    let sid = id.to_string();
    // No folder yet: the database's tail.
    assert_eq!(logs(&[&sid]).stdout, b"recorded\n");

    let token = inspect(db, id)["run_token"].as_str().unwrap().to_string();
    // 200 KiB: three times the tail the database keeps.
    let big = numbered(200 << 10);
    write_attempt(db, id, 1, &token, &big, b"from the file\n");
    // An older folder of the same attempt number (before an operator's retry): not picked.
    write_attempt(db, id, 1, "older", b"old\n", b"old\n");

    for args in [
        vec![sid.as_str()],
        vec![sid.as_str(), "--attempt", "1"],
        vec![sid.as_str(), "--follow"],
    ] {
        let out = logs(&args);
        assert!(out.status.success(), "{args:?}: {out:?}");
        assert_eq!(out.stdout.len(), big.len(), "{args:?}");
        assert!(out.stdout == big, "{args:?}: not the whole file");
    }
    let out = logs(&[&sid, "--stderr"]);
    assert_eq!(out.stdout, b"from the file\n");
    let out = logs(&[&sid, "--stderr", "--follow"]);
    assert_eq!(out.stdout, b"from the file\n");

    // A second attempt in a folder of its own, picked by --attempt 2 and (the job's attempt
    // now) by default.
    let changed = t
        .bare()
        .execute(
            "UPDATE jobs SET attempt = 2, run_token = 'second' WHERE id = ?1",
            [id],
        )
        .unwrap();
    assert_eq!(changed, 1);
    write_attempt(db, id, 2, "second", b"two\n", b"");
    assert_eq!(logs(&[&sid]).stdout, b"two\n");
    assert_eq!(logs(&[&sid, "--attempt", "2"]).stdout, b"two\n");
    assert_eq!(logs(&[&sid, "--attempt", "1"]).stdout, b"old\n");

    // A job without folders, and the refusals.
    assert_eq!(logs(&[&other.to_string()]).stdout, b"only-in-the-db\n");
    let line = fails(&mut cli(db, &["jobs", "logs", &sid, "--attempt", "3"]), 1);
    assert!(line.contains("attempt 3"), "{line}");
    let line = fails(&mut cli(db, &["jobs", "logs", "999", "--follow"]), 1);
    assert!(line.contains("999"), "{line}");
}

/// A `jobs logs --follow` child, killed by pid if the test ends before it did; its stdout
/// and stderr lines arrive on channels as they are printed.
struct Follower {
    child: Child,
    stdout: mpsc::Receiver<String>,
    stderr: mpsc::Receiver<String>,
}

impl Follower {
    fn start(db: &Path, args: &[&str]) -> Follower {
        let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("leasehold"));
        cmd.arg("--db").arg(db).args(["jobs", "logs"]).args(args);
        for var in crate::util::leasehold_vars() {
            cmd.env_remove(var);
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("jobs logs starts");
        let lines = |pipe: Box<dyn std::io::Read + Send>| {
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
            rx
        };
        let stdout = lines(Box::new(child.stdout.take().unwrap()));
        let stderr = lines(Box::new(child.stderr.take().unwrap()));
        Follower {
            child,
            stdout,
            stderr,
        }
    }

    /// The next stdout line, within `timeout`.
    fn line(&self, timeout: Duration) -> String {
        self.stdout
            .recv_timeout(timeout)
            .unwrap_or_else(|e| panic!("no line from jobs logs --follow within {timeout:?}: {e}"))
    }

    /// Whether it still runs.
    fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `jobs logs --follow` on a running job prints the lines its file gets while the job runs,
/// says so when the file's size goes down (the cap's move) and goes on from the new end, and
/// exits 0 once the job is no longer running, with the last bytes printed.
/// A command that says little leaves nothing beside the database: its keeper held its
/// output in memory and handed it over with its end, so the database's tails are all there
/// is. `jobs logs` prints them (nothing for a silent stream), with `--follow` too, and the
/// ending recorded is the command's.
#[test]
fn a_quiet_attempt_leaves_no_folder_and_its_logs_come_from_the_database() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let silent = add(db, &[], &["sh", "-c", "exit 3"]);
    let loud = add(db, &[], &["sh", "-c", "echo only-err >&2"]);
    run_until_idle(db, &[]);
    for id in [silent, loud] {
        assert!(!job_dir(db, id).exists(), "job {id} has a folder");
    }
    let job = inspect(db, silent);
    assert_eq!(job["status"], "failed", "{job}");
    let sid = silent.to_string();
    for args in [
        vec![sid.as_str()],
        vec![sid.as_str(), "--stderr"],
        vec![sid.as_str(), "--follow"],
        vec![sid.as_str(), "--stderr", "--follow"],
    ] {
        let mut all = vec!["jobs", "logs"];
        all.extend_from_slice(&args);
        assert_eq!(ok(&mut cli(db, &all)), "", "{args:?}");
    }
    let lid = loud.to_string();
    assert_eq!(ok(&mut cli(db, &["jobs", "logs", &lid])), "");
    assert_eq!(
        ok(&mut cli(db, &["jobs", "logs", &lid, "--stderr"])),
        "only-err\n"
    );
}

#[test]
fn follow_prints_lines_as_they_are_written_and_exits_when_the_job_ends() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let id = add(db, &[], &["true"]);
    set_running(&t, id, "tokf");
    let dir = write_attempt(db, id, 1, "tokf", b"line 0\n", b"");
    let mut follower = Follower::start(db, &[&id.to_string(), "--follow"]);
    assert_eq!(follower.line(Duration::from_secs(10)), "line 0");

    // A line every 200 ms from another thread, as a job's output comes.
    let path = dir.join("stdout");
    let writer = {
        let path = path.clone();
        std::thread::spawn(move || {
            let mut file = std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .unwrap();
            for i in 1..=10 {
                std::thread::sleep(Duration::from_millis(200));
                writeln!(file, "line {i}").unwrap();
            }
            Instant::now()
        })
    };
    let first = follower.line(Duration::from_secs(10));
    let first_at = Instant::now();
    assert_eq!(first, "line 1");
    assert!(follower.running(), "it follows while the job runs");
    for i in 2..=10 {
        assert_eq!(follower.line(Duration::from_secs(10)), format!("line {i}"));
    }
    let last_written = writer.join().unwrap();
    assert!(
        first_at < last_written,
        "line 1 came {:?} after the last line was written: not while the job ran",
        first_at - last_written
    );
    assert!(follower.running(), "it still follows: the job runs");

    // The size goes down: a notice on stderr, and the bytes after the new end follow.
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(7).unwrap();
    drop(file);
    let notice = follower
        .stderr
        .recv_timeout(Duration::from_secs(10))
        .expect("a notice that the file got shorter");
    assert!(notice.contains("went down"), "{notice}");
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    writeln!(file, "after the cut").unwrap();
    assert_eq!(follower.line(Duration::from_secs(10)), "after the cut");

    // The last line, then the job ends: it is printed, and the command exits 0.
    writeln!(file, "the last line").unwrap();
    let changed = t
        .bare()
        .execute(
            "UPDATE jobs SET status = 'succeeded', exit_code = 0, completed_at = ?2 \
             WHERE id = ?1",
            rusqlite::params![id, leasehold::now_ms()],
        )
        .unwrap();
    assert_eq!(changed, 1);
    let mut status = None;
    assert!(
        wait_until(Duration::from_secs(10), || {
            status = follower.child.try_wait().unwrap();
            status.is_some()
        }),
        "jobs logs --follow exits once the job ended"
    );
    assert_eq!(status.unwrap().code(), Some(0));
    let rest: Vec<String> = follower.stdout.try_iter().collect();
    assert_eq!(rest, ["the last line"]);
}

/// A running attempt whose folder is not there yet is waited for, not confused with an older
/// folder of the same number (an attempt before an operator's retry): `--follow` prints the
/// running attempt's lines once its folder appears, and exits when the job ends.
#[test]
fn follow_waits_for_the_running_attempts_own_folder() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let id = add(db, &[], &["true"]);
    set_running(&t, id, "new");
    write_attempt(db, id, 1, "old", b"from before the retry\n", b"");
    let mut follower = Follower::start(db, &[&id.to_string(), "--follow"]);
    // It waits: nothing printed, still running, while only the old folder exists.
    assert!(
        follower
            .stdout
            .recv_timeout(Duration::from_millis(700))
            .is_err(),
        "the older attempt's file is not the running attempt's"
    );
    assert!(
        follower.running(),
        "it waits for the running attempt's folder"
    );
    write_attempt(db, id, 1, "new", b"the running attempt\n", b"");
    assert_eq!(
        follower.line(Duration::from_secs(10)),
        "the running attempt"
    );
    t.bare()
        .execute("UPDATE jobs SET status = 'succeeded' WHERE id = ?1", [id])
        .unwrap();
    let mut status = None;
    assert!(
        wait_until(Duration::from_secs(10), || {
            status = follower.child.try_wait().unwrap();
            status.is_some()
        }),
        "it exits once the job ended"
    );
    assert_eq!(status.unwrap().code(), Some(0));
    assert_eq!(follower.stdout.try_iter().count(), 0);
}

/// A running job's page shows the end of its attempt's files, escaped, and says it is live;
/// it still reloads every 5 s.
#[test]
fn the_dashboard_shows_a_running_jobs_file_tail() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let id = add(db, &[], &["true"]);
    set_running(&t, id, "tokd");
    // More than the 64 KiB shown, ending in markup that must come out escaped.
    let mut out = numbered(100 << 10);
    out.extend_from_slice(b"<b>bold</b> & the end\n");
    write_attempt(db, id, 1, "tokd", &out, b"warning: <careful>\n");
    let server = Server::start(db, &[]);
    let page = server.get(&format!("/jobs/{id}"));
    assert_eq!(page.status, 200);
    let body = &page.body;
    assert!(body.contains("http-equiv=\"refresh\""), "{body}");
    assert!(body.contains("id=\"live\""), "{body}");
    assert!(body.contains("live, reloads every 5 s"), "{body}");
    assert!(
        body.contains("&lt;b&gt;bold&lt;/b&gt; &amp; the end"),
        "the tail, escaped"
    );
    assert!(!body.contains("<b>bold</b>"), "nothing unescaped");
    assert!(body.contains("warning: &lt;careful&gt;"), "stderr");
    // The last 64 KiB only: the first line is not on the page, a line near the end is.
    assert!(!body.contains("line 00000000"), "only the tail");
    let near_end = String::from_utf8_lossy(&out[out.len() - 200..]).into_owned();
    let near_end = near_end.lines().nth(1).unwrap().to_string();
    assert!(body.contains(&near_end), "{near_end}");

    // Once it ended, the page neither reloads nor shows the files as live.
    t.bare()
        .execute(
            "UPDATE jobs SET status = 'succeeded', exit_code = 0 WHERE id = ?1",
            [id],
        )
        .unwrap();
    let page = server.get(&format!("/jobs/{id}"));
    assert!(!page.body.contains("http-equiv=\"refresh\""));
    assert!(!page.body.contains("id=\"live\""));
}

/// `db prune` removes the folder of the job it pruned and keeps that of a job that stays; a
/// runner's sweeper does the same after a prune.
#[test]
fn pruning_a_job_removes_its_files_and_keeps_a_live_ones() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let done = add(db, &[], &["true"]);
    let failed = add(db, &[], &["false"]);
    run_until_idle(db, &[]);
    let live = add(db, &["--queue", "elsewhere"], &["true"]);
    set_running(&t, live, "tokl");
    for (id, token) in [(done, "a"), (failed, "b"), (live, "tokl")] {
        write_attempt(db, id, 1, token, b"out\n", b"");
    }
    let v = json(&mut cli(
        db,
        &["db", "prune", "--keep-succeeded", "0", "--json"],
    ));
    assert_eq!(v["pruned"], 1, "{v}");
    assert_eq!(v["files_removed"], 1, "{v}");
    assert!(
        !job_dir(db, done).exists(),
        "the pruned job's files are gone"
    );
    assert!(job_dir(db, failed).exists(), "a kept job keeps its files");
    assert!(job_dir(db, live).exists(), "a running job keeps its files");
    // A dry run removes nothing.
    let v = json(&mut cli(
        db,
        &["db", "prune", "--keep-failed", "0", "--dry-run", "--json"],
    ));
    assert_eq!(
        (v["pruned"].as_u64(), v["files_removed"].as_u64()),
        (Some(1), Some(0))
    );
    assert!(job_dir(db, failed).exists());

    // A runner's sweeper prunes the failed job and removes its folder. The running job's
    // stays: its queue is not served, and even if the sweeper reclaims it (it holds no
    // lease), the job still exists.
    let mut args = FAST.to_vec();
    args.extend(["--keep-failed", "0", "--queue", "default"]);
    let runner = RunnerProcess::start(db, &args);
    assert!(
        wait_until(Duration::from_secs(15), || !job_dir(db, failed).exists()),
        "the sweeper removes the pruned job's files: {}",
        runner.log()
    );
    assert!(job_dir(db, live).exists(), "the live job keeps its files");
    stop(runner);
    assert!(job_dir(db, live).exists());
    ok(&mut cli(db, &["jobs", "inspect", &live.to_string()]));
}

/// A running job whose runner stopped and left it to its keeper is shown as such on its page:
/// running, kept with no runner, and whether its keeper still runs it.
#[test]
fn the_dashboard_says_a_running_job_is_kept_with_no_runner() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let id = add(db, &[], &["true"]);
    set_running(&t, id, "tokk");
    let now = leasehold::now_ms();
    let conn = t.bare();
    // A runner recorded as stopped still holds the job; the keeper's pid is one no process has.
    conn.execute(
        "INSERT INTO runners (worker_id, pid, proc_start_time, boot_id, host, started_at,
             heartbeat_at, stopped_at, lease_ttl_ms, heartbeat_interval_ms,
             max_recovery_attempts, pid_ns)
         VALUES ('left:1:aa', 1, 1, 'b', 'h', ?1, ?1, ?1, 30000, 1000, 3, 1)",
        [now],
    )
    .unwrap();
    conn.execute(
        "UPDATE jobs SET worker_id = 'left:1:aa', keeper_pid = 2147483646 WHERE id = ?1",
        [id],
    )
    .unwrap();
    let server = Server::start(db, &[]);
    let page = server.get(&format!("/jobs/{id}"));
    assert_eq!(page.status, 200);
    let body = &page.body;
    assert!(body.contains("id=\"kept\""), "{body}");
    assert!(
        body.contains("kept, no runner: its runner left:1:aa stopped"),
        "{body}"
    );
    assert!(body.contains("has ended"), "{body}");
    // The same words in `jobs inspect`.
    let out = cli(db, &["jobs", "inspect", &id.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("kept, no runner"), "{text}");
}

/// Issue 34: `jobs logs ID --follow` on a job that had not started exited 0 at once, printing
/// nothing. It waits now, saying so once on stderr, then follows the job's output to its end;
/// a job cancelled before it started ends the follow, saying how it ended.
#[test]
fn follow_waits_for_a_pending_job_to_start_and_follows_it_to_its_end() {
    let t = TestDb::new();
    let db = t.path.as_path();
    ok(&mut cli(db, &["db", "migrate"]));
    ok(&mut cli(db, &["queues", "pause", "held"]));
    let id = add(
        db,
        &["--queue", "held"],
        &["sh", "-c", "echo first; sleep 0.3; echo second"],
    );
    let mut follower = Follower::start(db, &[&id.to_string(), "--follow"]);
    let said = follower
        .stderr
        .recv_timeout(Duration::from_secs(10))
        .expect("it says it waits");
    assert!(said.contains("has not started yet"), "{said}");
    // A runner that leaves the paused queue alone: the follower keeps waiting.
    let runner = RunnerProcess::start(db, &FAST);
    assert!(
        follower
            .stdout
            .recv_timeout(Duration::from_millis(700))
            .is_err()
    );
    assert!(follower.running(), "it waits while the queue is paused");
    ok(&mut cli(db, &["queues", "resume", "held"]));
    assert_eq!(follower.line(Duration::from_secs(10)), "first");
    assert_eq!(follower.line(Duration::from_secs(10)), "second");
    let mut status = None;
    assert!(
        wait_until(Duration::from_secs(10), || {
            status = follower.child.try_wait().unwrap();
            status.is_some()
        }),
        "it exits once the job ended"
    );
    assert_eq!(status.unwrap().code(), Some(0));
    assert_eq!(inspect(db, id)["status"], "succeeded");
    let waits: Vec<String> = follower.stderr.try_iter().collect();
    assert!(waits.is_empty(), "the wait is said once: {waits:?}");

    // Cancelled before it starts: the follow ends with its status.
    ok(&mut cli(db, &["queues", "pause", "held"]));
    let id = add(db, &["--queue", "held"], &["echo", "never"]);
    let mut follower = Follower::start(db, &[&id.to_string(), "--follow"]);
    follower
        .stderr
        .recv_timeout(Duration::from_secs(10))
        .expect("it says it waits");
    ok(&mut cli(db, &["jobs", "cancel", &id.to_string()]));
    let said = follower
        .stderr
        .recv_timeout(Duration::from_secs(10))
        .expect("it says how the job ended");
    assert!(said.contains("cancelled without starting"), "{said}");
    assert!(
        wait_until(Duration::from_secs(10), || !follower.running()),
        "it exits once the job was cancelled"
    );
    assert_eq!(follower.stdout.try_iter().count(), 0);
    stop(runner);
}
