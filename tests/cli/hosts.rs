//! Runners by host, and a host gone for good: `status`, `hosts ls` and `hosts gone` beside a
//! real runner on "another host" (its own UTS and PID namespaces, with its own host name),
//! killed by pid, on both backends.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

use crate::helper::{FAST, add, cli, fails, inspect, json, ok};
use crate::serve::Server;
use crate::util::{leasehold_vars, token_alive, wait_for};

/// The host name the other runner records.
const OTHER: &str = "other-host";

/// How long a test waits for a runner to do something.
const WAIT: Duration = Duration::from_secs(30);

/// A `leasehold run` in the background with the fast settings, its log in a file: on another
/// host ([`Runner::other_host`]) or on this one ([`Runner::here`]). Dropping it kills it
/// ([`Runner::kill`]).
struct Runner {
    /// `unshare`, or the runner itself.
    child: Child,
    log: PathBuf,
}

impl Runner {
    /// `leasehold run` as pid 1 of new UTS and PID namespaces whose host name is [`OTHER`]:
    /// a runner of another host, as far as leasehold can tell. Panics saying why when
    /// namespaces are refused.
    fn other_host(db: &Path, folder: &Path, extra: &[&str]) -> Runner {
        let probe = Command::new("unshare")
            .args(["--uts", "--pid", "--fork", "--mount-proc", "true"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .unwrap_or_else(|e| panic!("this test needs unshare(1) (util-linux): {e}"));
        assert!(
            probe.status.success(),
            "this test needs new UTS and PID namespaces (root): unshare --uts --pid --fork \
             --mount-proc is refused here ({}): {}",
            probe.status,
            String::from_utf8_lossy(&probe.stderr).trim()
        );
        let log = folder.join("other-host.log");
        let mut cmd = Command::new("unshare");
        cmd.args(["--uts", "--pid", "--fork", "--kill-child", "--mount-proc"])
            .args([
                "sh",
                "-c",
                r#"hostname "$1" && shift && exec "$@""#,
                "sh",
                OTHER,
            ])
            .arg(assert_cmd::cargo::cargo_bin("leasehold"))
            .arg("--db")
            .arg(db)
            .arg("run")
            .args(FAST)
            .args(extra);
        for var in leasehold_vars() {
            cmd.env_remove(var);
        }
        let unshare = cmd
            .env("RUST_LOG", "leasehold=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("the log file can be created"))
            .spawn()
            .expect("unshare starts");
        Runner {
            child: unshare,
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A plain `leasehold run` of this host on `db` with the fast settings, logging to a
    /// file in `folder` (a PostgreSQL URL has no folder of its own); killed by pid when
    /// dropped.
    fn here(db: &Path, folder: &Path) -> Runner {
        let log = folder.join("this-host.log");
        let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("leasehold"));
        cmd.arg("--db").arg(db).arg("run").args(FAST);
        for var in leasehold_vars() {
            cmd.env_remove(var);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("the log file can be created"))
            .spawn()
            .expect("leasehold run starts");
        Runner { child, log }
    }

    /// Kills its children by pid (for `unshare`, the namespace's init: the kernel then kills
    /// every process of the namespace, the runner, its keepers and its jobs), then itself,
    /// and reaps it.
    fn kill(&mut self) {
        let me = self.child.id() as i32;
        for pid in crate::util::host::children_of(me) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        let _ = kill(Pid::from_raw(me), Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        self.kill();
    }
}

/// This host's name, as a runner here records it.
fn this_host() -> String {
    nix::unistd::gethostname()
        .expect("the host name can be read")
        .into_string()
        .expect("the host name is UTF-8")
}

/// `hosts ls --json`'s entry for `host`, if listed.
fn listed(db: &Path, host: &str) -> Option<Value> {
    let all = json(&mut cli(db, &["hosts", "ls", "--json"]));
    all.as_array()
        .expect("hosts ls --json prints an array")
        .iter()
        .find(|h| h["host"] == host)
        .cloned()
}

/// A job that sleeps on its first run and succeeds on the next: its file `ran` marks the first.
fn first_run_sleeps(db: &Path, folder: &Path) -> i64 {
    let ran = folder.join("ran");
    let script = format!(
        "test -e '{0}' && exit 0; touch '{0}'; exec sleep 300",
        ran.display()
    );
    add(db, &[], &["sh", "-c", &script])
}

/// How many events of `kind` job `id` has, read with plain SQL on either backend.
fn events(t: &crate::util::TestDb, id: i64, kind: &str) -> i64 {
    t.scalar(&format!(
        "SELECT count(*) FROM job_events WHERE job_id = {id} AND kind = '{kind}'"
    ))
}

crate::on_both! {
    /// A runner of another host runs a job: `status` and `hosts ls` list it under its host,
    /// not checkable from here; `hosts gone` refuses while it renews, and changes nothing
    /// then. Once killed and silent, `hosts gone --yes` ends the job's lease (pending again,
    /// within its budget), records its attempt torn down saying it was not verified, and
    /// records the runner stopped; a runner here then runs the job.
    fn a_host_gone_for_good_has_its_jobs_requeued_and_its_attempts_torn_down_unverified(t) {
        let target = t.target();
        let db = target.as_path();
        let folder = t.dir.path();
        let id = first_run_sleeps(db, folder);
        let mut other = Runner::other_host(db, folder, &[]);
        let host = wait_for("the other host's runner to run the job", WAIT, || {
            listed(db, OTHER).filter(|h| h["running_jobs"] == 1)
        });
        let runner = &host["runners"][0];
        let worker = runner["worker_id"].as_str().expect("a worker id").to_string();
        assert_eq!(host["this_host"], false, "{host}");
        assert_eq!(runner["alive"], true, "{host}");
        assert_eq!(runner["checked"], false, "{host}");
        assert_eq!(
            runner["liveness"], "cannot be checked from here: another host",
            "{host}"
        );
        assert_eq!(runner["running_jobs"], 1, "{host}");
        assert_eq!(host["leases"][0]["job"], id, "{host}");
        let status = json(&mut cli(db, &["status", "--json"]));
        let hosts = status["hosts"].as_array().expect("status has hosts");
        assert_eq!(hosts.len(), 1, "{status}");
        assert_eq!(hosts[0]["host"], OTHER);
        assert_eq!(hosts[0]["running_jobs"], 1);
        assert_eq!(hosts[0]["runners"][0]["worker_id"], worker.as_str());
        assert!(hosts[0]["heartbeat_at"].is_i64(), "{status}");
        assert_eq!(status["runners"][0]["host"], OTHER, "the old field stays");
        let text = ok(&mut cli(db, &["status"]));
        assert!(
            text.contains(&format!("runners by host:\n  host {OTHER}: 1 runner, 1 running job, last heartbeat ")),
            "{text}"
        );
        assert!(
            text.contains("alive=unknown (cannot be checked from here: another host)"),
            "{text}"
        );

        // The dashboard's overview: the same, under the host's row.
        let server = Server::start(db, &[]);
        let page = server.get("/");
        assert_eq!(page.status, 200, "{page:?}");
        let at = page
            .body
            .find(&format!("<tr class=\"runner\" data-host=\"{OTHER}\" data-worker=\"{worker}\">"))
            .unwrap_or_else(|| panic!("no runner row under {OTHER}: {}", page.body));
        let row = &page.body[at..];
        let row = &row[..row.find("</tr>").expect("the row ends")];
        assert!(
            row.contains("cannot be checked from here: another host"),
            "{row}"
        );
        assert!(
            page.body.contains(&format!("<tr class=\"host\" data-host=\"{OTHER}\">")),
            "{}",
            page.body
        );
        drop(server);

        // Refusals change nothing.
        let before = inspect(db, id);
        let line = fails(&mut cli(db, &["hosts", "gone", OTHER]), 2);
        assert!(line.contains("--yes"), "{line}");
        let line = fails(&mut cli(db, &["hosts", "gone", OTHER, "--yes"]), 1);
        assert!(line.contains(&format!("host {OTHER:?} is not silent: ")), "{line}");
        let line = fails(&mut cli(db, &["hosts", "gone", "no-such-host", "--yes"]), 1);
        assert!(line.contains("has no runner recorded"), "{line}");
        let here = this_host();
        let line = fails(&mut cli(db, &["hosts", "gone", &here, "--yes"]), 1);
        assert!(line.contains("is the host this command runs on"), "{line}");
        let after = inspect(db, id);
        assert_eq!(after["status"], "running");
        assert_eq!(after["run_token"], before["run_token"]);
        assert_eq!(after["recovery_count"], 0);

        // The host goes: every process of its namespace dies with its init.
        wait_for("the job's first run to start", WAIT, || {
            folder.join("ran").exists().then_some(())
        });
        other.kill();
        // Silent once its runner's last renewal is a lease TTL old (nothing here can tell
        // sooner): refused until then, with the same reason.
        let gone = wait_for("the other host to be silent", WAIT, || {
            let out = cli(db, &["hosts", "gone", OTHER, "--yes", "--json"])
                .output()
                .expect("hosts gone runs");
            if out.status.success() {
                return Some(serde_json::from_slice::<Value>(&out.stdout).expect("JSON"));
            }
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{err}");
            assert!(err.contains("is not silent"), "{err}");
            None
        });
        assert_eq!(gone["host"], OTHER);
        assert_eq!(gone["runners_stopped"], serde_json::json!([worker]));
        assert_eq!(gone["runners_left"], serde_json::json!([]));
        let jobs = gone["jobs"].as_array().expect("jobs");
        assert_eq!(jobs.len(), 1, "{gone}");
        let job = &jobs[0];
        assert_eq!(job["id"], id);
        assert_eq!(job["attempt"], 1);
        assert_eq!(job["worker_id"], worker.as_str());
        assert_eq!(job["lease_ended"], true);
        assert_eq!(job["status"], "pending");
        assert_eq!(job["verified"], false);
        let detail = job["teardown"].as_str().expect("a teardown detail");
        assert!(
            detail.starts_with(&format!(
                "forced by the operator, host {OTHER} declared gone: not verified that attempt 1 is gone (it ran in PID namespace "
            )) && detail.contains(&format!("on host {OTHER} (boot "))
                && detail.contains("this command runs in PID namespace "),
            "{detail}"
        );
        let requeued = inspect(db, id);
        assert_eq!(requeued["status"], "pending");
        assert_eq!(requeued["recovery_count"], 1);
        assert_eq!(requeued["teardown_pending"], false);
        assert!(
            requeued["last_error"]
                .as_str()
                .is_some_and(|e| e.contains(&format!("its host {OTHER} was declared gone by the operator"))),
            "{requeued}"
        );
        assert_eq!(events(&t, id, "reclaimed"), 1);
        assert_eq!(events(&t, id, "torn_down"), 1);

        // Nothing waits on that host any more.
        let status = json(&mut cli(db, &["status", "--json"]));
        assert_eq!(status["hosts"], serde_json::json!([]), "{status}");
        assert_eq!(status["runners"], serde_json::json!([]), "{status}");
        assert!(listed(db, OTHER).is_none());
        // Declaring it gone again does nothing, and says so.
        let again = ok(&mut cli(db, &["hosts", "gone", OTHER, "--yes"]));
        assert_eq!(
            again,
            format!("host {OTHER}: 0 leases ended, 0 lost attempts recorded torn down (0 not verified), 0 runners recorded stopped\n")
        );

        // A runner here runs the job again, to its end.
        ok(cli(db, &["run", "--until-idle"]).args(FAST));
        assert_eq!(inspect(db, id)["status"], "succeeded", "{}", other.log());
    }

    /// A lost attempt that a runner here reclaimed but cannot tear down (it ran on another
    /// host) waits, listed under that host; `hosts gone` records it torn down, unverified,
    /// and the waiting runner runs the job.
    fn a_lost_attempt_waiting_for_a_gone_host_is_released(t) {
        let target = t.target();
        let db = target.as_path();
        let folder = t.dir.path();
        let id = first_run_sleeps(db, folder);
        let mut other = Runner::other_host(
            db,
            folder,
            // No keeper, so no lease fence ends the attempt (on PostgreSQL a keeper would
            // stop it by its lease's end, and a runner here would then take the job): its
            // teardown waits for a runner of that host.
            &["--no-keepers"],
        );
        wait_for("the other host's runner to run the job", WAIT, || {
            listed(db, OTHER).filter(|h| h["running_jobs"] == 1)
        });
        wait_for("the job's first run to start", WAIT, || {
            folder.join("ran").exists().then_some(())
        });
        other.kill();
        // A runner here reclaims the job once its lease expires, and cannot tear it down.
        let here = Runner::here(db, folder);
        let host = wait_for("the reclaimed attempt to wait for the other host", WAIT, || {
            listed(db, OTHER).filter(|h| h["teardown_waits"] == 1)
        });
        assert_eq!(host["lost"][0]["job"], id, "{host}");
        assert_eq!(host["lost"][0]["attempt"], 1, "{host}");
        assert_eq!(inspect(db, id)["teardown_pending"], true);
        let text = ok(&mut cli(db, &["hosts", "ls"]));
        assert!(
            text.contains(&format!("  teardown: job {id} attempt 1 waits for a runner there")),
            "{text}"
        );
        let status = ok(&mut cli(db, &["status"]));
        assert!(
            status.contains("is registered there but silent for")
                && status.contains(&format!("`leasehold hosts gone {OTHER} --yes`")),
            "{status}"
        );

        let out = ok(&mut cli(db, &["hosts", "gone", OTHER, "--yes"]));
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[0],
            format!("host {OTHER}: 0 leases ended, 1 lost attempt recorded torn down (1 not verified), 1 runner recorded stopped"),
            "{out}"
        );
        assert!(
            lines[1].starts_with(&format!(
                "job {id} attempt 1: recorded torn down, NOT verified: forced by the operator, host {OTHER} declared gone: not verified that attempt 1 is gone"
            )),
            "{out}"
        );
        assert!(
            lines[2].starts_with("runner ") && lines[2].ends_with(": recorded stopped"),
            "{out}"
        );
        assert_eq!(lines.len(), 3, "{out}");
        let ran = crate::util::poll(WAIT, || {
            (inspect(db, id)["status"] == "succeeded").then_some(())
        });
        assert!(
            ran.is_some(),
            "the runner here did not run the job: {}\n{}\nrunner here:\n{}",
            inspect(db, id),
            ok(&mut cli(db, &["jobs", "inspect", &id.to_string()])),
            here.log()
        );
        assert_eq!(events(&t, id, "torn_down"), 1);
        assert_eq!(events(&t, id, "succeeded"), 1, "{}", here.log());
        drop(here);
    }
    /// `--force` beside a live runner of that host: its job's lease ends at once and its
    /// attempt is recorded torn down, unverified, but the runner, which renews, stays
    /// registered. At its next renewal it finds the lease gone and kills the attempt itself:
    /// the runner's self-fence is what makes the forced teardown true.
    fn forcing_a_live_host_leaves_its_runner_and_the_runner_kills_its_attempt(t) {
        let target = t.target();
        let db = target.as_path();
        let folder = t.dir.path();
        let id = first_run_sleeps(db, folder);
        let _other = Runner::other_host(db, folder, &[]);
        let host = wait_for("the other host's runner to run the job", WAIT, || {
            listed(db, OTHER).filter(|h| h["running_jobs"] == 1)
        });
        let worker = host["runners"][0]["worker_id"].clone();
        wait_for("the job's first run to start", WAIT, || {
            folder.join("ran").exists().then_some(())
        });
        let token = inspect(db, id)["run_token"]
            .as_str()
            .expect("a run token")
            .to_string();
        assert!(token_alive(&token), "the attempt runs");
        let gone = json(&mut cli(db, &["hosts", "gone", OTHER, "--yes", "--force", "--json"]));
        assert_eq!(gone["runners_stopped"], serde_json::json!([]), "{gone}");
        assert_eq!(gone["runners_left"], serde_json::json!([worker]), "{gone}");
        assert_eq!(gone["jobs"][0]["id"], id, "{gone}");
        assert_eq!(gone["jobs"][0]["lease_ended"], true, "{gone}");
        assert_eq!(gone["jobs"][0]["verified"], false, "{gone}");
        let text = ok(&mut cli(db, &["status"]));
        assert!(text.contains(&format!("host {OTHER}: 1 runner, ")), "{text}");
        wait_for("the other host's runner to kill the attempt", WAIT, || {
            (!token_alive(&token)).then_some(())
        });
    }
}
