//! The keeper's program: run from memory or an owner-only file, and refused where it cannot
//! be exec'ed.

use super::*;

/// The program runs from an owner-only file where memory will not do, and a keeper that
/// cannot be exec'ed at all (a `noexec` folder and no memfd) fails the start a runner's
/// probe makes. Both use keepers of their own, not the process's.
#[test]
fn the_program_runs_from_an_owner_only_file_and_one_that_cannot_be_execed_fails_its_start() {
    let job = Job::sh("echo from-file", "file");
    let hub = Hub::start(&job.attempts(), true).expect("a keeper from its file");
    assert_eq!(hub.source, Source::File);
    let written: Vec<_> = std::fs::read_dir(job.attempts())
        .expect("attempts folder")
        .map(|e| e.expect("entry"))
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(".leasehold-keeper-")
        })
        .collect();
    assert_eq!(written.len(), 1);
    let mode = written[0].metadata().expect("stat").permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    // An attempt sent to it by hand, as spawn_keeper_from does.
    let argv = [
        c"sh".to_owned(),
        c"-c".to_owned(),
        c"echo from-file".to_owned(),
    ];
    let dir = job.dir();
    let attempts = job.attempts();
    let spec = KeeperSpec {
        name: "sh",
        token: &job.token,
        attempt_dir: &dir,
        folder: &attempts,
        cap: 0,
        mem: MEM,
        drain: DRAIN,
        fence: None,
        cwd: None,
        program: c"/bin/sh",
        argv: &argv,
        env: Vec::new(),
        limits: Limits::default(),
    };
    let journal = files::journal_path(&attempts, hub.pid, hub.start_time);
    let mut control = by_hand(&hub);
    control
        .write_all(
            &request(&spec, &journal).expect("request"),
            Instant::now() + LIMIT,
        )
        .expect("written");
    let said = |control: &mut Control| match control.wait(Instant::now() + LIMIT) {
        Ok(Received::Message(m)) => m,
        other => panic!("{other:?}"),
    };
    assert!(matches!(said(&mut control), Message::Started { .. }));
    assert_eq!(
        said(&mut control),
        Message::Exited {
            ended: Ended::Exited(0),
            pipes_open: false,
            alone: true,
            output: Output::Memory(b"from-file\n".to_vec(), Vec::new()),
        }
    );
    control.release();
    drop(hub);

    let Some(noexec) = Noexec::mount() else {
        return;
    };
    let refused = Hub::start(noexec.0.path(), true).expect_err("a noexec folder");
    assert!(
        refused.starts_with("cannot start it: exec ") && refused.contains("Permission denied"),
        "{refused}"
    );
    // The process's keeper runs, so its probe holds wherever it is asked.
    assert!(probe(noexec.0.path()).is_ok());
}

/// A tmpfs mounted `noexec` on a folder of its own, unmounted (lazily) on drop; `None`,
/// with the reason printed, where the system refuses the mount (not root).
struct Noexec(tempfile::TempDir);

impl Noexec {
    fn mount() -> Option<Self> {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "noexec,mode=0700", "leasehold-test"])
            .arg(dir.path())
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Self(dir)),
            Ok(o) => {
                let why = String::from_utf8_lossy(&o.stderr);
                eprintln!("SKIPPED: mount -t tmpfs -o noexec is refused here: {why}");
                None
            }
            Err(e) => {
                eprintln!("SKIPPED: cannot run mount: {e}");
                None
            }
        }
    }
}

impl Drop for Noexec {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.0.path())
            .status();
    }
}
