//! The cgroup mode, where this process's keeper runs its attempts in cgroups (root, cgroup v2):
//! each test says so and returns where it does not.

use super::*;
use crate::process::cgroup;

/// The attempt's cgroup, or `None` with the reason printed where this process's keeper runs
/// its attempts in process groups (not root, no cgroup v2, `LEASEHOLD_CGROUPS=off`).
fn cgroup_of(run: &mut Running) -> Option<PathBuf> {
    let cgroup = run.kept().cgroup.clone();
    if cgroup.is_none() {
        let why = super::probe(Path::new("/tmp")).map(|c| c.describe());
        eprintln!("skipped: the keeper does not use cgroups here: {why:?}");
    }
    cgroup
}

/// Whether `pid` runs (a zombie does not).
fn runs(pid: i32) -> bool {
    proc::proc_info(pid).is_some_and(|p| !p.is_dead())
}

/// The cgroup mode: a process that left the command's group and session and dropped its
/// environment (so neither its group id nor its token names it) is still in the attempt's
/// cgroup, is said as a leftover once the main process ended, dies at the release, and the
/// cgroup goes with it.
#[test]
fn a_setsid_escapee_without_the_token_is_in_the_attempts_cgroup_and_dies_with_it() {
    let job = Job::sh_here(
        "env -i setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $! > escapee; exit 0",
        "cgroup-escapee",
    );
    let mut run = job.start(0, MEM, Duration::from_millis(100));
    let Some(cgroup) = cgroup_of(&mut run) else {
        return;
    };
    let escapee: i32 = job.wait_for_line("escapee").trim().parse().expect("a pid");
    let guard = Guard(escapee);
    // `env -i` drops the environment at its exec of setsid, which calls setsid() only then
    // and execs sleep after: the escapee is whole once it runs sleep.
    assert!(
        wait_until(LIMIT, || {
            std::fs::read_to_string(format!("/proc/{escapee}/comm"))
                .is_ok_and(|c| c.trim() == "sleep")
        }),
        "the escapee runs sleep"
    );
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{escapee}/environ")).ok(),
        Some(String::new()),
        "the escapee dropped its environment"
    );
    let info = proc::proc_info(escapee).expect("the escapee runs");
    assert_ne!(info.pgid, run.kept().pid, "the escapee left the group");
    assert!(cgroup::members(&cgroup).contains(&escapee));
    assert!(
        matches!(
            run.message(),
            Message::Exited {
                ended: Ended::Exited(0),
                pipes_open: true,
                ..
            }
        ),
        "the escapee is said as a leftover"
    );
    run.release();
    assert!(wait_until(LIMIT, || !runs(escapee)), "the escapee runs on");
    assert!(wait_until(LIMIT, || !cgroup.exists()), "{cgroup:?} stays");
    drop(guard);
}

/// The cgroup mode: the lease fence's SIGKILL reaches a process that left the group and
/// ignores SIGTERM, through `cgroup.kill`.
#[test]
fn the_lease_fence_kills_the_attempts_cgroup() {
    let mut job = Job::sh_here(
        "env -i setsid sh -c 'trap \"\" TERM; sleep 300' </dev/null >/dev/null 2>&1 & \
         echo $! > escapee; exec sleep 300",
        "cgroup-fence",
    );
    job.fence = Some(fence_in(500, 500));
    let mut run = job.start(0, MEM, DRAIN);
    let Some(cgroup) = cgroup_of(&mut run) else {
        return;
    };
    let escapee: i32 = job.wait_for_line("escapee").trim().parse().expect("a pid");
    let guard = Guard(escapee);
    assert!(
        wait_until(LIMIT, || !runs(escapee)),
        "the escapee outlives the fence"
    );
    assert!(wait_until(LIMIT, || !cgroup::populated(&cgroup)));
    drop(guard);
}

/// A process killed by pid when a test ends before it could check it dead.
struct Guard(i32);

impl Drop for Guard {
    fn drop(&mut self) {
        if runs(self.0) {
            let _ = signal_pid(self.0, Signal::SIGKILL);
        }
    }
}

/// The sweep at a keeper's start removes the nodes of dead keepers by what they hold, not by
/// the pid in their names: a node named after a live process (here pid 1, as a keeper in a
/// PID namespace of its own names it) whose keeper leaf is empty goes, with its empty
/// attempt cgroups; a node whose leaf holds a process stays, and so does a young one.
#[test]
fn the_sweep_removes_a_dead_keepers_node_whatever_pid_names_it() {
    let Ok(base) = cgroup::base() else {
        println!(
            "skipped: no cgroup v2 folder for this process ({:?})",
            cgroup::base()
        );
        return;
    };
    let dead = base.join(format!("leasehold-keeper-1-test{}", std::process::id()));
    if let Err(e) = std::fs::create_dir(&dead) {
        println!("skipped: cannot make a cgroup in {} ({e})", base.display());
        return;
    }
    std::fs::create_dir(dead.join("keeper")).expect("a keeper leaf");
    std::fs::create_dir(dead.join("a-gone")).expect("an attempt cgroup");
    // A live keeper's node: its leaf holds a process (a child that sleeps).
    let live = base.join(format!("leasehold-keeper-2-test{}", std::process::id()));
    std::fs::create_dir_all(live.join("keeper")).expect("a live node");
    let mut child = std::process::Command::new("sleep")
        .arg("300")
        .spawn()
        .expect("sleep");
    let pid = i32::try_from(child.id()).expect("a pid");
    let guard = Guard(pid);
    std::fs::write(live.join("keeper/cgroup.procs"), pid.to_string()).expect("moved");

    cgroup::sweep(&base, Duration::from_secs(3600));
    assert!(dead.exists(), "a young node stays");
    cgroup::sweep(&base, Duration::ZERO);
    assert!(!dead.exists(), "the dead keeper's node stays");
    assert!(
        live.join("keeper").exists(),
        "the live keeper's node is gone"
    );

    child.kill().expect("killed");
    child.wait().expect("reaped");
    drop(guard);
    assert!(wait_until(LIMIT, || !cgroup::populated(&live)));
    cgroup::sweep(&base, Duration::ZERO);
    assert!(!live.exists(), "the node stays once its keeper is gone");
}
