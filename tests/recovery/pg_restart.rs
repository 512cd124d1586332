//! Restart under load: `pg_ctl restart` in the middle of 2,000 jobs run by three `leasehold
//! run` processes on a PostgreSQL cluster of the test's own. Every job ends once, succeeded;
//! no two attempts of a job run at once; the runners keep going through the outage and say
//! what they wait for.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use leasehold::{Job, Store, now_ms};

use crate::util::cluster::Cluster;
use crate::util::{EndMarked, RunnerProcess, Watchdog, poll};

/// The cluster's port and folder: its own, never the shared test server's (`.ci/pg`'s default
/// is 54329, CI's shared one 54500).
const PORT: u16 = 55417;
const JOBS: usize = 2000;
const RUNNERS: usize = 3;

/// Each attempt holds an exclusive flock on `locks/<job>` while any of its processes lives,
/// and notes an overlap when it cannot take it at once; a command that ran to its end notes
/// that (job, run token) in `ends`.
const ATTEMPT: &str = r#"exec 9>>"locks/$LEASEHOLD_JOB_ID"
flock -n 9 || echo "job $LEASEHOLD_JOB_ID: attempt $LEASEHOLD_RUN_TOKEN started while another held the lock" >> overlap
sleep 0.05
echo "$LEASEHOLD_JOB_ID $LEASEHOLD_RUN_TOKEN" >> ends"#;

/// A `leasehold run` on the cluster, its stderr in a log file in `dir`; killed by pid when
/// dropped.
fn start_runner(url: &str, dir: &Path, marker: (&str, &str)) -> RunnerProcess {
    let home = dir.join("home");
    let state = dir.join("home/.local/state");
    RunnerProcess::start_logged(
        url.as_ref(),
        dir,
        &[
            "--workers",
            "4",
            "--lease-ttl",
            "5",
            "--heartbeat",
            "1",
            "--sweep",
            "1",
            "--kill-grace",
            "0.5",
            "--shutdown-grace",
            "0.5",
        ],
        &[
            ("HOME", home.to_str().expect("a UTF-8 folder")),
            ("XDG_STATE_HOME", state.to_str().expect("a UTF-8 folder")),
            marker,
        ],
    )
}

/// One integer from the cluster on a new connection (a restart ends the old ones), or None
/// while it does not answer.
fn count(url: &str, sql: &str) -> Option<i64> {
    let mut client = postgres::Client::connect(url, postgres::NoTls).ok()?;
    client.query_one(sql, &[]).ok()?.try_get(0).ok()
}

#[test]
fn a_server_restart_under_load_ends_every_job_once_and_runs_none_twice_at_once() {
    // Dropped in reverse: runners first, then what outlived them, then the cluster, then the
    // folder; the watchdog last.
    let _watchdog = Watchdog::with_timeout(Duration::from_secs(180));
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(PORT, format!("/tmp/leasehold-pg-restart-{PORT}"));
    let marker = format!("leasehold-restart-{}", std::process::id());
    let _cleanup = EndMarked(format!("LEASEHOLD_TEST_CASE={marker}"));
    // A database of this test's own on the cluster: a rerun after a crash starts afresh.
    let url = cluster.fresh_database(&format!("restart_{}", std::process::id()));
    std::fs::create_dir_all(dir.path().join("locks")).unwrap();
    std::fs::create_dir_all(dir.path().join("home")).unwrap();

    let store = Store::open(&url).expect("the database opens");
    let jobs: Vec<Job> = (0..JOBS)
        .map(|_| Job::shell(ATTEMPT).cwd(dir.path()))
        .collect();
    let ids = store.enqueue_many(&jobs).unwrap();
    drop(store);
    let mut runners: Vec<RunnerProcess> = (0..RUNNERS)
        .map(|_| start_runner(&url, dir.path(), ("LEASEHOLD_TEST_CASE", &marker)))
        .collect();
    let logs = |runners: &[RunnerProcess]| -> String {
        runners
            .iter()
            .enumerate()
            .map(|(n, r)| {
                let log = r.log();
                let lines: Vec<&str> = log.lines().collect();
                format!(
                    "--- runner {n} (last lines):\n{}\n",
                    lines[lines.len().saturating_sub(30)..].join("\n")
                )
            })
            .collect()
    };
    let succeeded = |url: &str| count(url, "SELECT count(*) FROM jobs WHERE status = 'succeeded'");
    let began = Instant::now();
    poll(Duration::from_secs(60), || {
        (succeeded(&url)? >= (JOBS / 3) as i64).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "a third of the jobs did not succeed in 60 s\n{}",
            logs(&runners)
        )
    });

    // The restart, in the middle of the load.
    let logged_before: Vec<usize> = runners.iter().map(|r| r.log().len()).collect();
    let done_before = succeeded(&url).unwrap();
    let down_at = now_ms();
    cluster.restart();
    let up_at = now_ms();
    // The runners resume: the first claim and the first ending recorded after the restart
    // (the server's clock is this machine's).
    let first_after = |kind: &str| {
        poll(Duration::from_secs(60), || {
            count(
                &url,
                &format!(
                    "SELECT coalesce(min(at), 0) FROM job_events WHERE kind = '{kind}' \
                     AND at >= {up_at}"
                ),
            )
            .filter(|&at| at > 0)
        })
        .unwrap_or_else(|| panic!("no {kind} event after the restart\n{}", logs(&runners)))
    };
    let (claimed_again, ended_again) = (first_after("claimed"), first_after("succeeded"));

    // Every job ends.
    poll(Duration::from_secs(60), || {
        (count(
            &url,
            "SELECT count(*) FROM jobs WHERE status IN ('succeeded', 'failed', 'cancelled')",
        )? == JOBS as i64)
            .then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "not every job ended within 60 s of the restart\n{}",
            logs(&runners)
        )
    });
    let took = began.elapsed();
    for (n, r) in runners.iter_mut().enumerate() {
        assert!(
            r.running(),
            "runner {n} exited through the restart\n{}",
            r.log()
        );
    }

    // Each ended once, succeeded, with one `succeeded` event.
    let by_status = |status: &str| {
        count(
            &url,
            &format!("SELECT count(*) FROM jobs WHERE status = '{status}'"),
        )
        .unwrap()
    };
    assert_eq!(by_status("succeeded"), JOBS as i64, "{}", logs(&runners));
    let endings_not_once = count(
        &url,
        "SELECT count(*) FROM (SELECT j.id FROM jobs j LEFT JOIN job_events e \
         ON e.job_id = j.id AND e.kind = 'succeeded' GROUP BY j.id HAVING count(e.id) <> 1) x",
    )
    .unwrap();
    assert_eq!(
        endings_not_once, 0,
        "jobs without exactly one succeeded event"
    );
    // No two attempts of one job at once.
    let overlap = std::fs::read_to_string(dir.path().join("overlap")).unwrap_or_default();
    assert_eq!(overlap, "", "attempts overlapped");
    // The commands that ran to their end: once per job, and the recorded attempt among them.
    let ends = std::fs::read_to_string(dir.path().join("ends")).unwrap_or_default();
    let mut ran = BTreeMap::<i64, Vec<String>>::new();
    for line in ends.lines() {
        let (id, token) = line.split_once(' ').expect("a job id and a run token");
        ran.entry(id.parse().unwrap())
            .or_default()
            .push(token.to_string());
    }
    let store = Store::open(&url).unwrap();
    let mut completed_twice = Vec::new();
    for &id in &ids {
        let job = store.job(id).unwrap();
        let tokens = ran.get(&id).cloned().unwrap_or_default();
        assert!(
            tokens.contains(job.run_token.as_ref().unwrap()),
            "job {id}'s recorded attempt did not run to its end: {tokens:?} {job:?}"
        );
        if tokens.len() > 1 {
            completed_twice.push((id, tokens.len()));
        }
    }
    let reruns = by_attempt_over_one(&url);
    let recovered = count(&url, "SELECT count(*) FROM jobs WHERE recovery_count > 0").unwrap();
    let reclaims = count(
        &url,
        "SELECT count(*) FROM job_events WHERE kind = 'reclaimed'",
    )
    .unwrap();
    eprintln!(
        "{JOBS} jobs, {RUNNERS} runners, {took:.1?} in all; restart at {done_before} succeeded, \
         server down {} ms; first claim {} ms and first ending {} ms after it was up; \
         jobs with more than one attempt: {reruns}; with a lost attempt: {recovered} \
         ({reclaims} reclaims); commands completed twice: {completed_twice:?}",
        up_at - down_at,
        claimed_again - up_at,
        ended_again - up_at,
    );
    // Each runner said what it waited for while the server was down.
    for (n, r) in runners.iter().enumerate() {
        let log = r.log();
        let during = &log[logged_before[n].min(log.len())..];
        eprintln!(
            "--- runner {n} from the restart on:\n{}",
            first_lines(during, 25)
        );
        for said in [
            "the connection to PostgreSQL was lost",
            "connecting again",
            "connected to PostgreSQL again",
        ] {
            assert!(
                during.contains(said),
                "runner {n} did not log {said:?} through the restart:\n{during}"
            );
        }
    }

    // The issue's "run nothing twice": an attempt that ran to its end has its ending recorded,
    // not discarded as late after its lease expired and the job ran again.
    if let Some(&(id, _)) = completed_twice.first() {
        // What the database and the runners say of the first such job.
        let events: Vec<String> = store
            .events(id)
            .unwrap()
            .iter()
            .map(|e| format!("{} {} attempt {} {:?}", e.at, e.kind, e.attempt, e.detail))
            .collect();
        let said: Vec<String> = runners
            .iter()
            .enumerate()
            .flat_map(|(n, r)| {
                r.log()
                    .lines()
                    .filter(|l| {
                        l.contains(&format!("job {id} ")) || l.contains(&format!("job {id}:"))
                    })
                    .map(|l| format!("runner {n}: {l}"))
                    .collect::<Vec<_>>()
            })
            .collect();
        // The server's word on what held the runners back: lock waits that ended as deadlocks.
        let server = cluster.log();
        let deadlocks: Vec<&str> = server.split("ERROR:  deadlock detected").skip(1).collect();
        let first_deadlock = deadlocks
            .first()
            .map(|d| d.lines().take(12).collect::<Vec<_>>().join("\n"))
            .unwrap_or_default();
        panic!(
            "jobs whose command ran to its end more than once (an ending lost): \
             {completed_twice:?}\njob {id}'s events:\n{}\nthe runners on job {id}:\n{}\n\
             the server detected {} deadlocks; the first:{first_deadlock}\n{}",
            events.join("\n"),
            said.join("\n"),
            deadlocks.len(),
            logs(&runners)
        );
    }
}

/// How many jobs had more than one attempt.
fn by_attempt_over_one(url: &str) -> i64 {
    count(url, "SELECT count(*) FROM jobs WHERE attempt > 1").unwrap()
}

fn first_lines(text: &str, n: usize) -> String {
    text.lines().take(n).collect::<Vec<_>>().join("\n")
}
