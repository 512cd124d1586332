//! The runner's own CPU cost while its jobs wait: in a test binary of its own, so that no
//! other test's work is counted.

use std::time::{Duration, Instant};

use leasehold::{Job, Outcome, Runner};
use nix::sys::resource::{UsageWho, getrusage};

mod util;

use util::TestDb;

fn cpu_seconds() -> f64 {
    let u = getrusage(UsageWho::RUSAGE_SELF).expect("getrusage");
    let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
    t(u.user_time()) + t(u.system_time())
}

#[test]
fn two_hundred_sleeping_jobs_cost_the_runner_almost_no_cpu() {
    let db = TestDb::new();
    let runner = Runner::builder(&db.path)
        .workers(200)
        .lease_ttl(Duration::from_secs(6))
        .heartbeat_interval(Duration::from_secs(1))
        .kill_grace(Duration::from_secs(1))
        .sweep_interval(Duration::from_secs(1))
        .start()
        .unwrap();
    let jobs: Vec<Job> = (0..200).map(|_| Job::command(["sleep", "4"])).collect();
    let before = cpu_seconds();
    let wall = Instant::now();
    let ids = runner.enqueue_many(&jobs).unwrap();
    while runner.running() < 200 && wall.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let all_started = wall.elapsed();
    let started = cpu_seconds() - before;
    eprintln!(
        "all started after {:.2}s, cpu {started:.3}",
        all_started.as_secs_f64()
    );
    // The window in which every job sleeps: from all started until 2 s after the first
    // start (no job of `sleep 4` can end before 4 s), through two heartbeats and two sweeps.
    // Its CPU is the runner's cost of waiting, with no start or ending in it.
    let quiet = Duration::from_secs(2).saturating_sub(all_started);
    let window_start = cpu_seconds();
    std::thread::sleep(quiet);
    let waiting = cpu_seconds() - window_start;
    assert_eq!(runner.running(), 200, "no job ended within the window");
    for id in &ids {
        assert_eq!(
            runner.wait(*id, Duration::from_secs(60)).unwrap(),
            Some(Outcome::Succeeded)
        );
    }
    let cpu = cpu_seconds() - before;
    let mut by_name: std::collections::BTreeMap<String, u64> = Default::default();
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let ns: u64 = std::fs::read_to_string(t.path().join("schedstat"))
            .unwrap_or_default()
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let key: String = comm
            .trim()
            .chars()
            .filter(|c| !c.is_ascii_digit())
            .collect();
        *by_name.entry(key).or_default() += ns / 1_000_000;
    }
    eprintln!("ms by thread: {by_name:?}");
    eprintln!(
        "200 jobs of sleep 4 on 200 workers: {:.2}s wall, runner CPU {cpu:.3} core-seconds in \
         all, {waiting:.3} while all {:.2}s of the window slept",
        wall.elapsed().as_secs_f64(),
        quiet.as_secs_f64()
    );
    // Starting and ending 200 attempts under keepers (spawns, files, 600 transitions) is the
    // work, and costs what the machine's load makes it (0.15 to 0.55 core-seconds measured,
    // which made a bound on the total fail under load): it is not what this test is about.
    // Waiting must cost close to nothing: 200 leases renewed in one statement a heartbeat, a
    // sweep a second. Measured: 0.045 core-seconds over 1.7 s (about 2.7% of a core for 200
    // sleeping attempts); a worker polling every few milliseconds would cost ten times that.
    assert!(
        waiting < 0.15,
        "the runner used {waiting:.3} core-seconds while 200 jobs slept for {:.2}s",
        quiet.as_secs_f64()
    );
}
