//! Progress: on a terminal (a pty made by `script`), long commands draw a bar on stderr; piped,
//! they print their result and nothing else.

use std::path::Path;
use std::process::Command;

use crate::helper::{cli, ok};
use crate::util::{TestDb, leasehold_vars};

/// Runs `leasehold --db DB ARGS` under `script`, so that its stdout and stderr are a
/// terminal; returns the transcript (both streams, as the terminal got them).
fn on_a_terminal(db: &Path, args: &[&str]) -> String {
    let bin = assert_cmd::cargo::cargo_bin("leasehold");
    let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let mut line = format!(
        "{} --db {}",
        quote(&bin.display().to_string()),
        quote(&db.display().to_string())
    );
    for a in args {
        line.push(' ');
        line.push_str(&quote(a));
    }
    let mut cmd = Command::new("script");
    cmd.args(["-qec", &line, "/dev/null"]);
    for var in leasehold_vars() {
        cmd.env_remove(var);
    }
    let out = cmd.output().expect("script (util-linux) runs");
    let transcript = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{line}: {transcript}");
    transcript
}

fn lines_file(t: &TestDb, n: usize) -> String {
    let path = t.sibling("lines.txt");
    let text: String = (0..n).map(|i| format!("echo {i}\n")).collect();
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[test]
fn jobs_add_from_file_shows_lines_enqueued_on_a_terminal_only() {
    let t = TestDb::new();
    let file = lines_file(&t, 5000);
    let transcript = on_a_terminal(&t.path, &["jobs", "add", "--from-file", &file]);
    assert!(
        transcript.contains("/5000 lines enqueued"),
        "no progress in {transcript:?}"
    );
    assert!(transcript.contains("5000\r\n"), "{transcript:?}");

    let out = cli(&t.path, &["jobs", "add", "--from-file", &file])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "5000\n");
    assert!(
        out.stderr.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(t.store().counts().unwrap().pending, 10_000);
}

#[test]
fn db_prune_shows_jobs_pruned_on_a_terminal_only() {
    let t = TestDb::new();
    let file = lines_file(&t, 3000);
    ok(&mut cli(&t.path, &["jobs", "add", "--from-file", &file]));
    // Finished long ago, without running 3,000 processes.
    t.bare()
        .execute(
            "UPDATE jobs SET status = 'succeeded', completed_at = 1 WHERE id <= 2000",
            [],
        )
        .unwrap();
    let transcript = on_a_terminal(&t.path, &["db", "prune", "--keep-succeeded", "0"]);
    assert!(
        transcript.contains("/2000 jobs pruned"),
        "no progress in {transcript:?}"
    );
    assert!(transcript.contains("pruned 2000 jobs"), "{transcript:?}");
    let counts = t.store().counts().unwrap();
    assert_eq!((counts.succeeded, counts.pending), (0, 1000));

    t.bare()
        .execute(
            "UPDATE jobs SET status = 'succeeded', completed_at = 1 WHERE id <= 2500",
            [],
        )
        .unwrap();
    let out = cli(&t.path, &["db", "prune", "--keep-succeeded", "0"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("pruned 500 jobs ("), "{stdout}");
    assert_eq!(stdout.lines().count(), 1);
    assert!(
        out.stderr.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&out.stderr)
    );
}
