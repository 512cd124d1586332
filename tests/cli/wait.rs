//! `jobs wait`: a shell waits for jobs and learns how they ended from the exit code.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::helper::{add, bin, cli, fails, run_until_idle};
use crate::util::{TestDb, wait_until};

/// A wait started while the jobs are pending returns once a runner has run them: exit 0 and
/// one line per job when all succeeded, exit 1 naming the job that did not.
#[test]
fn wait_returns_when_the_jobs_end_with_0_for_success_and_1_otherwise() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let good = add(db, &[], &["sh", "-c", "exit 0"]);
    let bad = add(db, &[], &["sh", "-c", "exit 3"]);
    let waits = |ids: &[i64], json: bool| {
        let mut cmd = std::process::Command::new(bin().get_program());
        cmd.arg("--db").arg(db).args(["jobs", "wait"]);
        cmd.args(ids.iter().map(i64::to_string));
        if json {
            cmd.arg("--json");
        }
        // Bounded, so that even a wait this test failed to end leaves no process behind.
        cmd.args(["--timeout", "60"]);
        Waiting(Some(
            cmd.stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("jobs wait starts"),
        ))
    };
    let mut one = waits(&[good], false);
    let mut both = waits(&[good, bad], true);
    // Each wait has the file open (so it is in its loop) and is still there while the jobs are
    // pending; a wait that did not wait would also print them pending below.
    for w in [&mut one, &mut both] {
        let fds = format!("/proc/{}/fd", w.child().id());
        assert!(
            wait_until(Duration::from_secs(10), || {
                std::fs::read_dir(&fds).is_ok_and(|d| {
                    d.flatten()
                        .any(|e| std::fs::read_link(e.path()).is_ok_and(|l| l == t.path))
                })
            }),
            "the wait opens the file"
        );
        assert!(
            w.child().try_wait().unwrap().is_none(),
            "it waits while the jobs are pending"
        );
    }
    run_until_idle(db, &[]);
    let mut ended = None;
    assert!(
        wait_until(Duration::from_secs(10), || {
            ended = one.child().try_wait().unwrap();
            ended.is_some()
        }),
        "the wait returns once its job ended"
    );
    let out = one.output();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{good} succeeded (exit 0)\n")
    );
    let out = both.output();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.trim(),
        format!("leasehold: job {bad} failed"),
        "{stderr}"
    );
    let outcomes: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(outcomes[0]["id"], good);
    assert_eq!(outcomes[0]["status"], "succeeded");
    assert_eq!(outcomes[1]["id"], bad);
    assert_eq!(outcomes[1]["status"], "failed");
    assert_eq!(outcomes[1]["exit_code"], 3);
    assert_eq!(outcomes[1]["error_kind"], "exit");
}

/// A running `jobs wait`, killed by its pid if the test ends without collecting it.
struct Waiting(Option<std::process::Child>);

impl Waiting {
    fn child(&mut self) -> &mut std::process::Child {
        self.0.as_mut().expect("not collected yet")
    }

    /// Waits for it to exit and collects its output.
    fn output(mut self) -> std::process::Output {
        self.0
            .take()
            .expect("not collected yet")
            .wait_with_output()
            .expect("jobs wait can be waited for")
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

crate::on_both! {
    /// With no runner, `--timeout` gives up with exit 124 and says where each job stands; an
    /// unknown id is refused before any wait (exit 1); no id at all is a usage error.
    fn a_wait_times_out_with_124_and_an_unknown_id_is_refused(t) {
        let target = t.target();
        let db = target.as_path();
        let id = add(db, &[], &["true"]);
        let line = fails(
            &mut cli(db, &["jobs", "wait", &id.to_string(), "--timeout", "0.3"]),
            124,
        );
        assert_eq!(
            line,
            format!("leasehold: timed out: job {id} (pending) not ended yet")
        );
        let out = cli(
            db,
            &[
                "jobs",
                "wait",
                &id.to_string(),
                "--timeout",
                "0.1",
                "--json",
            ],
        )
        .output()
        .unwrap();
        assert_eq!(out.status.code(), Some(124));
        let outcomes: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(outcomes[0]["status"], "pending");
        let line = fails(&mut cli(db, &["jobs", "wait", &id.to_string(), "999"]), 1);
        assert!(line.contains("999"), "{line}");
        fails(&mut cli(db, &["jobs", "wait"]), 2);
        fails(&mut cli(db, &["jobs", "wait", "1", "--timeout", "-1"]), 2);
    }
}
