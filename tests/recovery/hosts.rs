//! Two (or three) hosts on one machine, on one PostgreSQL database: each `leasehold run` is the
//! init of a UTS and a PID namespace of its own, with its own host name, and all share one
//! HOME (as a home on a network share would be). A runner on another host is never proven
//! dead; only a lease's expiry counts, and nothing it started may run twice at once.

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Output, Stdio};

use leasehold::{CatchUp, Event, Job, JobRecord, Overlap, Schedule, Status, Store, now_ms};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::helper::{WAIT, args, args_with_workers};
use crate::util::host::{Host, require_namespaces};
use crate::util::{
    TestDb, leasehold_vars, max_overlap, poll, processes_with_env, spans, timed, token_alive,
};

/// Each attempt holds an exclusive flock on `lock-<job>` for as long as any of its processes
/// lives (the `sleep` inherits the descriptor), and notes an overlap when it cannot take it at
/// once: two attempts of one job ran at the same moment. It notes its start (job, host, run
/// token, ns clock); the job's first attempt then hangs, its second succeeds.
const ATTEMPT: &str = r#"
exec 9>>"lock-$LEASEHOLD_JOB_ID"
flock -n 9 || echo "job $LEASEHOLD_JOB_ID: an attempt on $(hostname) started while another held the lock" >> overlap
echo "start $LEASEHOLD_JOB_ID $(hostname) $LEASEHOLD_RUN_TOKEN $(date +%s%N)" >> runs
if [ "$(grep -c "^start $LEASEHOLD_JOB_ID " runs)" -ge 2 ]; then
  echo "end $LEASEHOLD_JOB_ID $(hostname) $LEASEHOLD_RUN_TOKEN $(date +%s%N)" >> runs
  exit 0
fi
exec sleep 300
"#;

/// A test's hosts on one PostgreSQL database of its own, and a marker every process they
/// start carries in its environment, so that cleanup ends them by pid whatever happens.
struct Farm {
    // Dropped first: each host's runner is killed by pid, which ends its namespace.
    hosts: Vec<Host>,
    db: TestDb,
    marker: (String, String),
}

impl Farm {
    /// A fresh database with leasehold's schema, and a shared home folder for the hosts.
    /// Fails, saying why, where namespaces cannot be made.
    fn new(hint: &str) -> Farm {
        require_namespaces();
        let db = TestDb::postgres(hint);
        std::fs::create_dir_all(db.dir.path().join("home")).unwrap();
        let marker = (
            "LEASEHOLD_TEST_CASE".to_string(),
            db.pg.as_ref().unwrap().name().to_string(),
        );
        let farm = Farm {
            hosts: Vec::new(),
            db,
            marker,
        };
        drop(farm.store());
        farm
    }

    fn url(&self) -> &str {
        &self.db.pg.as_ref().expect("a PostgreSQL database").url
    }

    /// A new store on the database, at the server's clock as the runners are.
    fn store(&self) -> Store {
        Store::open(self.url()).expect("the test database opens")
    }

    /// Starts host `name`'s runner with `args` (and the debug log, for its sweeps).
    fn start(&mut self, name: &str, args: &[&str]) -> usize {
        let host = Host::start(
            name,
            self.url(),
            &self.db.dir.path().join("home"),
            self.db.dir.path(),
            args,
            &[
                (&self.marker.0, &self.marker.1),
                ("RUST_LOG", "leasehold=debug"),
            ],
        );
        self.hosts.push(host);
        self.hosts.len() - 1
    }

    /// Waits until host `name`'s runner has registered on the database.
    fn up(&self, name: &str) {
        self.wait_for(&format!("host {name}'s runner to register"), |f| {
            let runners = f.store().runners().unwrap();
            runners
                .iter()
                .any(|r| r.host == name && r.stopped_at.is_none())
                .then_some(())
        });
    }

    /// Enqueues `job` to run in the test's folder.
    fn enqueue(&self, job: Job) -> i64 {
        self.store()
            .enqueue(&job.cwd(self.db.dir.path()))
            .expect("enqueue")
    }

    fn job(&self, id: i64) -> JobRecord {
        self.store().job(id).expect("the job exists")
    }

    fn events(&self, id: i64) -> Vec<Event> {
        self.store()
            .events(id)
            .expect("the job's events can be read")
    }

    /// The text of file `name` in the test's folder, empty if there is none.
    fn file(&self, name: &str) -> String {
        std::fs::read_to_string(self.db.dir.path().join(name)).unwrap_or_default()
    }

    /// The hosts' logs, the last lines of each, for a failure's message.
    fn logs(&self) -> String {
        let mut out = String::new();
        for h in &self.hosts {
            let log = h.log();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(40)..];
            out += &format!("--- host {} (last lines):\n{}\n", h.name(), tail.join("\n"));
        }
        out
    }

    /// Waits until `f` holds; fails naming `what`, with the hosts' logs.
    fn wait_for<T>(&self, what: &str, mut f: impl FnMut(&Farm) -> Option<T>) -> T {
        poll(WAIT, || f(self))
            .unwrap_or_else(|| panic!("timed out waiting for {what}\n{}", self.logs()))
    }

    /// Waits until job `id` runs on host `host` with its process recorded.
    fn running_on(&self, id: i64, host: &str) -> JobRecord {
        self.wait_for(&format!("job {id} to run on {host}"), |f| {
            let j = f.job(id);
            (j.status == Status::Running && j.pid.is_some() && on(&j, host)).then_some(j)
        })
    }

    /// Waits until job `id` has ended; fails with `jobs inspect` (which says what a waiting
    /// teardown waits for) and the logs.
    fn ended(&self, id: i64) -> JobRecord {
        poll(WAIT, || {
            let j = self.job(id);
            j.status.is_terminal().then_some(j)
        })
        .unwrap_or_else(|| {
            panic!(
                "timed out waiting for job {id} to end; jobs inspect:\n{}\n{}",
                String::from_utf8_lossy(
                    &self.leasehold(&["jobs", "inspect", &id.to_string()]).stdout
                ),
                self.logs()
            )
        })
    }

    /// `leasehold --db URL ARGS` on this host (no namespace), with the hosts' home.
    fn leasehold(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("leasehold"));
        for var in leasehold_vars() {
            cmd.env_remove(var);
        }
        cmd.args(["--db", self.url()])
            .args(args)
            .env("HOME", self.db.dir.path().join("home"))
            .env(&self.marker.0, &self.marker.1)
            .stdin(Stdio::null())
            .output()
            .expect("leasehold runs")
    }
}

impl Drop for Farm {
    fn drop(&mut self) {
        // The hosts first (each runner is killed by pid, and its namespace with it), then
        // whatever outlived them (a `jobs add` of the unique-key test).
        self.hosts.clear();
        for pid in processes_with_env(&format!("{}={}", self.marker.0, self.marker.1)) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// Whether job `j`'s lease is held by a runner of host `host` (worker ids are
/// `host:pid:suffix`).
fn on(j: &JobRecord, host: &str) -> bool {
    j.worker_id
        .as_deref()
        .is_some_and(|w| w.starts_with(&format!("{host}:")))
}

/// The host of the runner that claim event `e` names (its detail is `worker <id>`).
fn claimed_by(e: &Event) -> String {
    let detail = e.detail.as_deref().unwrap_or_default();
    let worker = detail.strip_prefix("worker ").unwrap_or(detail);
    worker.split(':').next().unwrap_or_default().to_string()
}

/// The host of the runner that last held job `j`'s lease.
fn host_of(j: &JobRecord) -> String {
    let worker = j.worker_id.as_deref().unwrap_or_default();
    worker.split(':').next().unwrap_or_default().to_string()
}

/// The `start` lines of `runs` for job `id`: (host, run token).
fn starts(runs: &str, id: i64) -> Vec<(String, String)> {
    runs.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.len() >= 4 && f[0] == "start" && f[1] == id.to_string())
                .then(|| (f[2].to_string(), f[3].to_string()))
        })
        .collect()
}

#[test]
fn a_dead_hosts_jobs_are_requeued_on_another_only_after_their_leases_expire() {
    let mut f = Farm::new("host_killed");
    let run = args(&["--lease-ttl", "3"]);
    let a = f.start("host-a", &run);
    f.up("host-a");
    let ids: Vec<i64> = (0..2).map(|_| f.enqueue(Job::shell(ATTEMPT))).collect();
    for &id in &ids {
        f.running_on(id, "host-a");
        f.wait_for("the first attempt's note", |f| {
            (!starts(&f.file("runs"), id).is_empty()).then_some(())
        });
    }
    f.start("host-b", &run);
    f.up("host-b");

    // Host A dies: its runner (its namespace's init) and every process it started.
    f.hosts[a].kill();
    let killed_at = now_ms();
    // Nothing renews the leases now: these are the last host A wrote.
    let held: Vec<JobRecord> = ids.iter().map(|&id| f.job(id)).collect();
    for h in &held {
        assert_eq!(h.status, Status::Running, "{h:?}");
        assert!(on(h, "host-a"), "{h:?}");
        let token = h.run_token.clone().unwrap();
        f.wait_for("the dead host's attempts to be gone", |_| {
            (!token_alive(&token)).then_some(())
        });
    }
    // Until a lease expires its job stays running under the dead runner's lease: a read that
    // ended before the expiry (server and test share this machine's clock) must see it so.
    let mut before_expiry = 0;
    for h in &held {
        let expires = h.lease_expires_at.unwrap();
        let changed = f.wait_for(&format!("job {} to be reclaimed", h.id), |f| {
            let j = f.job(h.id);
            let read_by = now_ms();
            let same = j.status == Status::Running && j.run_token == h.run_token;
            if read_by < expires {
                assert!(
                    same,
                    "job {} changed {} ms before its lease expired: {j:?}\n{}",
                    h.id,
                    expires - read_by,
                    f.logs()
                );
                before_expiry += 1;
            }
            (!same).then_some(j)
        });
        assert!(changed.recovery_count >= 1, "{changed:?}");
        let reclaimed = f
            .events(h.id)
            .into_iter()
            .find(|e| e.kind.as_str() == "reclaimed")
            .expect("a reclaimed event");
        assert!(
            reclaimed.at >= expires,
            "job {} reclaimed at {} before its lease expired at {expires}",
            h.id,
            reclaimed.at
        );
        eprintln!(
            "job {}: host A killed {} ms before the lease's expiry; reclaimed by host B {} ms \
             after it ({})",
            h.id,
            expires - killed_at,
            reclaimed.at - expires,
            reclaimed.detail.unwrap_or_default()
        );
    }
    assert!(
        before_expiry >= 10,
        "only {before_expiry} reads before the leases expired: the test proves nothing"
    );

    // Then each is requeued, and runs (and succeeds) on host B. Its lost attempt died with
    // host A; no runner will ever run in host A's PID namespace again, so a teardown that
    // waits for one would hold the job forever.
    for h in &held {
        let expires = h.lease_expires_at.unwrap();
        if poll(WAIT, || (!f.job(h.id).teardown_pending).then_some(())).is_none() {
            panic!(
                "job {} still waits for its lost attempt's teardown {} s after host A died: \
                 a teardown only a runner in host A's PID namespace may do, and that namespace \
                 died with the host; jobs inspect:\n{}\n{}",
                h.id,
                (now_ms() - killed_at) / 1000,
                String::from_utf8_lossy(
                    &f.leasehold(&["jobs", "inspect", &h.id.to_string()]).stdout
                ),
                f.logs()
            );
        }
        let done = f.ended(h.id);
        assert_eq!(done.status, Status::Succeeded, "{done:?}");
        assert!(on(&done, "host-b"), "{done:?}");
        assert_eq!((done.attempt, done.recovery_count), (2, 1), "{done:?}");
        let events = f.events(h.id);
        let kinds: Vec<String> = events.iter().map(|e| e.kind.to_string()).collect();
        let reclaimed = events
            .iter()
            .find(|e| e.kind.as_str() == "reclaimed")
            .unwrap_or_else(|| panic!("no reclaimed event: {kinds:?}"));
        assert!(
            reclaimed.at >= expires,
            "job {} reclaimed at {} before its lease expired at {expires}: {kinds:?}",
            h.id,
            reclaimed.at
        );
        let claims: Vec<&Event> = events
            .iter()
            .filter(|e| e.kind.as_str() == "claimed")
            .collect();
        assert_eq!(claims.len(), 2, "{kinds:?}");
        assert_eq!(claimed_by(claims[0]), "host-a", "{:?}", claims[0]);
        assert_eq!(claimed_by(claims[1]), "host-b", "{:?}", claims[1]);
        assert!(claims[1].at >= reclaimed.at, "{events:?}");
        let runs = starts(&f.file("runs"), h.id);
        assert_eq!(
            runs.iter()
                .map(|(host, _)| host.as_str())
                .collect::<Vec<_>>(),
            ["host-a", "host-b"],
            "{runs:?}"
        );
        eprintln!(
            "job {}: claimed on host B {} ms after its lease expired; events {kinds:?}",
            h.id,
            claims[1].at - expires
        );
    }
    assert_eq!(f.file("overlap"), "", "attempts overlapped");
}

#[test]
fn a_frozen_hosts_attempt_is_never_run_twice_at_once() {
    let mut f = Farm::new("host_frozen");
    let run = args(&["--lease-ttl", "2"]);
    let a = f.start("host-a", &run);
    f.up("host-a");
    let id = f.enqueue(Job::shell(ATTEMPT));
    let first = f.running_on(id, "host-a");
    let token = first.run_token.clone().unwrap();
    f.wait_for("the first attempt's note", |f| {
        (!starts(&f.file("runs"), id).is_empty()).then_some(())
    });
    f.start("host-b", &run);
    f.up("host-b");

    // Host A's runner freezes; the attempt's processes (in their own group, under a keeper)
    // would run on. The keeper reads the lease file the runner renews, and stops the command
    // before the lease runs out: host B, which cannot see those processes, may then take the
    // job on the lease's expiry alone.
    f.hosts[a].signal(Signal::SIGSTOP);
    let mut checks = 0;
    f.wait_for("host A's keeper to stop the frozen runner's attempt", |f| {
        let j = f.job(id);
        assert_eq!(
            j.attempt,
            1,
            "the job was claimed again while host A's attempt ran: {j:?}\n{}",
            f.logs()
        );
        assert_eq!(starts(&f.file("runs"), id).len(), 1);
        checks += 1;
        (!token_alive(&token)).then_some(())
    });
    let stopped_at = now_ms();
    let lost = f.wait_for("host B to reclaim the expired lease", |f| {
        let j = f.job(id);
        (j.recovery_count >= 1).then_some(j)
    });
    let events = f.events(id);
    let reclaimed_at = events
        .iter()
        .find(|e| e.kind.as_str() == "reclaimed")
        .map(|e| e.at)
        .expect("a reclaimed event");
    let expires = first.lease_expires_at.unwrap();
    assert!(
        reclaimed_at >= expires,
        "reclaimed before the first lease could expire: {lost:?}"
    );
    assert!(
        stopped_at <= reclaimed_at,
        "the attempt was seen stopped at {stopped_at}, after the reclaim at {reclaimed_at}"
    );

    // Host B records the teardown as its keeper's (not verified from there) and runs the job.
    let done = f.ended(id);
    assert_eq!(done.status, Status::Succeeded, "{done:?}");
    assert_eq!((done.attempt, done.recovery_count), (2, 1), "{done:?}");
    assert!(on(&done, "host-b"), "{done:?}");
    assert_eq!(f.file("overlap"), "", "attempts overlapped");
    let runs = starts(&f.file("runs"), id);
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(runs[0].1, token);
    assert_eq!(runs[1].0, "host-b", "{runs:?}");
    let events = f.events(id);
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    let at = |kind: &str| kinds.iter().position(|k| *k == kind);
    let (reclaimed, torn, claimed_again) = (
        at("reclaimed").expect("reclaimed"),
        at("torn_down").expect("torn_down"),
        kinds.iter().rposition(|k| *k == "claimed").unwrap(),
    );
    assert!(reclaimed < torn && torn < claimed_again, "{kinds:?}");
    let torn_down = events[torn].detail.clone().unwrap_or_default();
    assert!(
        torn_down.contains("stopped by its keeper at the end of its lease"),
        "{torn_down}"
    );

    // Host A thaws: its lease is gone and its attempt with it; its late word changes nothing.
    f.hosts[a].signal(Signal::SIGCONT);
    f.wait_for("host A's runner to notice its lost lease", |f| {
        let log_a = f.hosts[a].log();
        (log_a.contains("lease lost") || log_a.contains("late") || log_a.contains("keeper"))
            .then_some(())
    });
    let after = f.job(id);
    assert_eq!(after.status, Status::Succeeded, "{after:?}");
    let kinds_after: Vec<String> = f.events(id).iter().map(|e| e.kind.to_string()).collect();
    assert_eq!(
        kinds_after.iter().filter(|k| *k == "succeeded").count(),
        1,
        "{kinds_after:?}"
    );
    assert_eq!(f.file("overlap"), "", "attempts overlapped");
    eprintln!(
        "{checks} checks while frozen; the keeper stopped the attempt {} ms before the lease \
         expired (by this host's clock); events {kinds_after:?}; torn_down: {torn_down}",
        expires - stopped_at
    );
}

#[test]
fn three_hosts_fire_every_slot_of_a_one_second_schedule_once() {
    let mut f = Farm::new("host_schedule");
    // catch_up all: a slot fired late on a loaded machine is still fired, so lateness is not
    // mistaken for a lost slot.
    let every_second = Schedule::cron("*/1 * * * * *")
        .unwrap()
        .overlap(Overlap::Allow)
        .catch_up(CatchUp::All)
        .job(Job::command(["true"]).cwd(f.db.dir.path()));
    f.store().put_schedule("tick", &every_second).unwrap();
    for name in ["host-a", "host-b", "host-c"] {
        f.start(name, &args(&[]));
    }
    for name in ["host-a", "host-b", "host-c"] {
        f.up(name);
    }
    // The window starts once all three run, and lasts six slots.
    let start = now_ms();
    let first = (start / 1000 + 1) * 1000;
    let last = first + 6000;
    let slots = f.wait_for("the window's last slot", |f| {
        let slots = crate::helper::by_slot(&f.store(), "tick");
        slots.contains_key(&last).then_some(slots)
    });
    let missing: Vec<i64> = (first..=last)
        .step_by(1000)
        .filter(|s| !slots.contains_key(s))
        .collect();
    assert!(missing.is_empty(), "slots without a job: {missing:?}");
    let early: Vec<(i64, i64)> = slots
        .iter()
        .filter(|(s, j)| **s > j.created_at)
        .map(|(&s, j)| (s, j.created_at))
        .collect();
    assert!(early.is_empty(), "slots fired before due: {early:?}");
    assert!(f.store().schedule_events("tick").unwrap().is_empty());
    // Each slot's one job ran once, on whichever host claimed it.
    let mut ran_on = BTreeMap::<String, usize>::new();
    for s in (first..=last).step_by(1000) {
        let id = slots[&s].id;
        let done = f.ended(id);
        assert_eq!(done.status, Status::Succeeded, "{done:?}");
        assert_eq!(done.attempt, 1, "{done:?}");
        *ran_on.entry(host_of(&done)).or_default() += 1;
    }
    // Nothing fired twice since either.
    crate::helper::by_slot(&f.store(), "tick");
    let late: Vec<i64> = (first..=last)
        .step_by(1000)
        .map(|s| slots[&s].created_at - s)
        .collect();
    eprintln!("slots {first}..={last}: each fired once; late by {late:?} ms; ran on {ran_on:?}");
}

#[test]
fn a_global_queue_limit_of_one_holds_across_three_hosts() {
    let mut f = Farm::new("host_limit");
    let out = f.leasehold(&["queues", "limit", "one", "1"]);
    assert!(out.status.success(), "{out:?}");
    for name in ["host-a", "host-b", "host-c"] {
        f.start(name, &args_with_workers("4", &[]));
    }
    for name in ["host-a", "host-b", "host-c"] {
        f.up(name);
    }
    let marks = f.db.dir.path().join("spans");
    std::fs::create_dir(&marks).unwrap();
    // Four groups of three jobs, a group due each second: at each, the three runners wake
    // together and race for jobs of which one may run, so the jobs spread over the hosts
    // rather than all going to the one that ended the previous job.
    let due = std::time::SystemTime::now() + std::time::Duration::from_secs(1);
    let jobs: Vec<Job> = (0..12u64)
        .map(|n| {
            timed(&marks, "0.2")
                .queue("one")
                .cwd(f.db.dir.path())
                .run_at(due + std::time::Duration::from_secs(n / 3))
        })
        .collect();
    let ids = f.store().enqueue_many(&jobs).unwrap();
    let mut ran_on = BTreeMap::<String, usize>::new();
    for &id in &ids {
        let done = f.ended(id);
        assert_eq!(done.status, Status::Succeeded, "{done:?}");
        *ran_on.entry(host_of(&done)).or_default() += 1;
    }
    let spans = spans(&marks, &ids);
    let most = max_overlap(&spans);
    eprintln!("12 jobs of a queue limited to 1: at most {most} at once; ran on {ran_on:?}");
    assert_eq!(most, 1, "the limit of 1 was exceeded: {spans:?}");
}

#[test]
fn eight_processes_adding_one_unique_key_at_once_make_one_job() {
    let mut f = Farm::new("host_unique");
    // Runners on two hosts, so that an add in host A's name may hand its job to host A's
    // runner while the others store theirs directly.
    f.start("host-a", &args(&[]));
    f.start("host-b", &args(&[]));
    f.up("host-a");
    f.up("host-b");
    let gate = f.db.dir.path().join("gate");
    for round in 0..3 {
        let key = format!("key-{round}");
        // The adds wait behind an exclusive flock this test holds, each in `flock -s`, and
        // all start at once when it is released.
        let held = nix::fcntl::Flock::lock(
            std::fs::File::create(&gate).unwrap(),
            nix::fcntl::FlockArg::LockExclusive,
        )
        .map_err(|(_, e)| e)
        .expect("the gate can be locked");
        let mut adds = Vec::new();
        for n in 0..8 {
            let host = ["host-a", "host-b", "host-c", "host-d"][n % 4];
            let out = f.db.dir.path().join(format!("add-{round}-{n}"));
            let mut cmd = Command::new("unshare");
            cmd.args(["--uts", "--pid", "--fork", "--kill-child", "--mount-proc"])
                .args([
                    "sh",
                    "-c",
                    r#"hostname "$1" && flock -s "$2" true && shift 2 && exec "$@""#,
                    "sh",
                    host,
                ])
                .arg(&gate)
                .arg(assert_cmd::cargo::cargo_bin("leasehold"))
                .args([
                    "--db",
                    f.url(),
                    "jobs",
                    "add",
                    "--json",
                    "--unique-key",
                    &key,
                ])
                .args([
                    "--cwd",
                    &f.db.dir.path().to_string_lossy(),
                    "--",
                    "sleep",
                    "30",
                ]);
            for var in leasehold_vars() {
                cmd.env_remove(var);
            }
            let child = cmd
                .env("HOME", f.db.dir.path().join("home"))
                .env("XDG_STATE_HOME", f.db.dir.path().join("home/.local/state"))
                .env(&f.marker.0, &f.marker.1)
                .stdin(Stdio::null())
                .stdout(std::fs::File::create(&out).unwrap())
                .stderr(std::fs::File::create(out.with_extension("err")).unwrap())
                .spawn()
                .expect("unshare starts");
            adds.push((child, out));
        }
        // All eight wait at the gate: eight `flock` processes of this test.
        let marker = format!("{}={}", f.marker.0, f.marker.1);
        f.wait_for("the eight adds to wait at the gate", |_| {
            let waiting = processes_with_env(&marker)
                .into_iter()
                .filter(|pid| {
                    std::fs::read_to_string(format!("/proc/{pid}/comm"))
                        .is_ok_and(|c| c.trim() == "flock")
                })
                .count();
            (waiting == 8).then_some(())
        });
        drop(held);
        let mut results = Vec::new();
        for (mut child, out) in adds {
            let status = poll(WAIT, || child.try_wait().unwrap())
                .unwrap_or_else(|| panic!("a jobs add did not end within {WAIT:?}"));
            let stdout = std::fs::read_to_string(&out).unwrap();
            let stderr = std::fs::read_to_string(out.with_extension("err")).unwrap();
            assert!(
                status.success(),
                "jobs add failed ({status}): {stdout}{stderr}"
            );
            let json: serde_json::Value = serde_json::from_str(stdout.trim())
                .unwrap_or_else(|e| panic!("jobs add printed no JSON ({e}): {stdout}{stderr}"));
            results.push((
                json["id"].as_i64().unwrap(),
                json["duplicate"].as_bool().unwrap(),
            ));
        }
        let ids: BTreeSet<i64> = results.iter().map(|r| r.0).collect();
        let fresh = results.iter().filter(|r| !r.1).count();
        eprintln!("round {round}: {results:?} (id, duplicate)");
        assert_eq!(
            ids.len(),
            1,
            "the adds reported different jobs: {results:?}"
        );
        assert_eq!(fresh, 1, "not exactly one add made the job: {results:?}");
        let made = f.db.scalar(&format!(
            "SELECT count(*) FROM jobs WHERE unique_key = '{key}'"
        ));
        assert_eq!(made, 1, "{made} jobs hold the key {key}");
    }
}
