//! Manners, caps and "try me later" on real processes: the nice value and I/O class read back
//! from the running command in both spawn paths, a memory cap that ends a job as `memory` in
//! the cgroup mode and the rlimit mode, and exits 75 that requeue without spending an attempt.

use std::time::Duration;

use leasehold::{ErrorKind, IoClass, Job, Outcome, Runner, Status, Store};

use crate::helper::{WAIT, events, fast, outcome, running};
use crate::util::{TestDb, wait_for};

/// Field 19 of `/proc/PID/stat`: the process's nice value.
fn nice_of(pid: i64) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the command's stat");
    // After the command's name in parentheses, which may hold spaces: field 3 on.
    let rest = &stat[stat.rfind(')').expect("a stat line") + 2..];
    rest.split(' ')
        .nth(19 - 3)
        .expect("field 19")
        .parse()
        .expect("a nice value")
}

/// `ioprio_get(IOPRIO_WHO_PROCESS, pid)`: the class in bits 13 and up, the level below.
fn ioprio_of(pid: i64) -> i64 {
    // SAFETY: ioprio_get takes two ints and touches no memory.
    let v = unsafe { nix::libc::syscall(nix::libc::SYS_ioprio_get, 1, pid as nix::libc::c_int) };
    assert!(v >= 0, "ioprio_get: {}", std::io::Error::last_os_error());
    v
}

/// The containment and caps the runners of `store` recorded at their start.
fn containment(store: &Store) -> String {
    store
        .runners()
        .expect("runners")
        .into_iter()
        .find_map(|r| r.containment)
        .expect("a runner recorded its containment")
}

/// Runs a job that sleeps, with a nice value and an I/O class of its own beside one that
/// takes the runner's, and reads them back from the running commands.
fn manners_are_read_back(db: &TestDb, keepers: bool) {
    let runner = fast(&db.target())
        .keepers(keepers)
        .nice(3)
        .io_class(IoClass::Idle)
        .start()
        .expect("start");
    let own = runner
        .enqueue(
            &Job::command(["sleep", "30"])
                .nice(7)
                .io_class(IoClass::BestEffort(6)),
        )
        .expect("enqueue");
    let defaults = runner
        .enqueue(&Job::command(["sleep", "30"]))
        .expect("enqueue");
    let (own_pid, default_pid) = (
        running(db, own).pid.expect("a pid"),
        running(db, defaults).pid.expect("a pid"),
    );
    // The pid is recorded once the command runs: its exec is done (the wrapper's too).
    wait_for("the commands' exec", WAIT, || {
        let comm = |pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        (comm(own_pid).trim() == "sleep" && comm(default_pid).trim() == "sleep").then_some(())
    });
    assert_eq!(
        nice_of(own_pid),
        7,
        "the job's own nice (keepers {keepers})"
    );
    assert_eq!(
        ioprio_of(own_pid),
        (2 << 13) | 6,
        "best-effort 6 (keepers {keepers})"
    );
    assert_eq!(
        nice_of(default_pid),
        3,
        "the runner's nice (keepers {keepers})"
    );
    assert_eq!(ioprio_of(default_pid), 3 << 13, "the runner's idle class");
    for id in [own, defaults] {
        runner.cancel(id).expect("cancel");
    }
}

/// A job that allocates 512 MiB under a 64 MiB cap ends `memory`; the runner's `status` line
/// says which way the cap was in force.
fn memory_cap_ends_memory(db: &TestDb, keepers: bool) {
    let runner = fast(&db.target()).keepers(keepers).start().expect("start");
    let how = containment(&Store::open(db.target()).expect("open"));
    // Printed for the record: on a machine whose cgroup v2 has no memory controller (v1
    // holds it) the cgroup mode's caps are refused and the rlimits stand in.
    eprintln!("keepers {keepers}: attempts contained by {how}");
    assert!(how.contains("caps: memory by "), "{how}");
    if how.starts_with("cgroup ") && !how.contains("memory by memory.max") {
        assert!(how.contains("refused"), "a refusal is reported: {how}");
    }
    if !keepers {
        assert!(how.contains("memory by RLIMIT_DATA"), "{how}");
    }
    let id = runner
        .enqueue(
            &Job::command([
                "/usr/bin/python3",
                "-c",
                "b = bytearray(512 * 1024 * 1024); print(len(b))",
            ])
            .memory_max(64 << 20),
        )
        .expect("enqueue");
    match outcome(&runner, id) {
        Outcome::Failed { kind, message, .. } => {
            assert_eq!(kind, ErrorKind::Memory, "{message}");
            assert!(message.contains("memory cap"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(db.job(id).error_kind, Some(ErrorKind::Memory));
    // Under the cap, the same command with room succeeds: the cap is what failed it.
    let fits = runner
        .enqueue(
            &Job::command(["/usr/bin/python3", "-c", "b = bytearray(8 * 1024 * 1024)"])
                .memory_max(256 << 20),
        )
        .expect("enqueue");
    assert_eq!(outcome(&runner, fits), Outcome::Succeeded);
}

crate::on_both! {
    fn exit_75_three_times_then_0_succeeds_on_attempt_1(db) {
        let runner = fast(&db.target()).start().expect("start");
        let count = db.sibling("count");
        let script = format!(
            "n=$(cat {c} 2>/dev/null || echo 0); n=$((n + 1)); echo $n > {c}; \
             [ $n -le 3 ] && exit 75; exit 0",
            c = count.display()
        );
        let id = runner
            .enqueue(
                &Job::shell(script)
                    .backoff(Duration::from_millis(20), Duration::from_millis(100)),
            )
            .expect("enqueue");
        assert_eq!(outcome(&runner, id), Outcome::Succeeded);
        let rec = db.job(id);
        assert_eq!(
            (rec.status, rec.attempt, rec.failed_attempts, rec.tempfails),
            (Status::Succeeded, 1, 0, 3)
        );
        let evs = events(&runner_store(&db), id);
        let later: Vec<&(String, i64, String)> =
            evs.iter().filter(|e| e.0 == "try_later").collect();
        assert_eq!(later.len(), 3, "{evs:?}");
        assert!(later.iter().all(|e| e.1 == 1 && e.2.starts_with("try later")), "{evs:?}");
        assert!(later[2].2.contains("try later 3 of 10"), "{evs:?}");
        }

    fn past_its_tempfail_max_75_is_an_ordinary_failure(db) {
        let runner = fast(&db.target()).start().expect("start");
        let id = runner
            .enqueue(
                &Job::shell("exit 75")
                    .tempfail_max(2)
                    .max_attempts(2)
                    .backoff(Duration::from_millis(20), Duration::from_millis(50)),
            )
            .expect("enqueue");
        match outcome(&runner, id) {
            Outcome::Failed { kind, exit_code, .. } => {
                assert_eq!((kind, exit_code), (ErrorKind::Exit, Some(75)));
            }
            other => panic!("{other:?}"),
        }
        let rec = db.job(id);
        // Two "try later", then two ordinary failures: attempts 1 (retried) and 2.
        assert_eq!((rec.attempt, rec.failed_attempts, rec.tempfails), (2, 2, 2));
        let kinds: Vec<String> = events(&runner_store(&db), id)
            .into_iter()
            .map(|e| e.0)
            .filter(|k| k != "claimed" && k != "started")
            .collect();
        assert_eq!(
            kinds,
            ["enqueued", "try_later", "try_later", "retry_scheduled", "failed"],
        );
        }

    fn manners_and_caps_are_stored_and_read_back(db) {
        let store = db.store();
        let job = Job::command(["true"])
            .nice(-2)
            .io_class(IoClass::Idle)
            .memory_max(512 << 20)
            .cpu_weight(50)
            .pids_max(64)
            .tempfail_max(4);
        let id = store.enqueue(&job).expect("enqueue");
        let rec = store.job(id).expect("read");
        assert_eq!(rec.limits, *job.limits());
        assert_eq!((rec.tempfail_max, rec.tempfails), (Some(4), 0));
        assert!(store.enqueue(&Job::command(["true"]).nice(20)).is_err());
        assert!(store.enqueue(&Job::command(["true"]).cpu_weight(0)).is_err());
    }

    fn a_memory_kill_is_stored_as_memory_in_the_cgroup_mode(db) {
        memory_cap_ends_memory(&db, true);
    }

    fn a_memory_kill_is_stored_as_memory_in_the_rlimit_mode(db) {
        memory_cap_ends_memory(&db, false);
    }
}

/// A store of the test's database.
fn runner_store(db: &TestDb) -> Store {
    Store::open(db.target()).expect("open")
}

#[test]
fn nice_and_io_class_are_applied_under_keepers() {
    manners_are_read_back(&TestDb::new(), true);
}

#[test]
fn nice_and_io_class_are_applied_without_keepers() {
    manners_are_read_back(&TestDb::new(), false);
}

#[test]
fn runner_refuses_a_nice_out_of_range() {
    let db = TestDb::new();
    let Err(err) = Runner::builder(&db.path).nice(25).start() else {
        panic!("a nice of 25 was taken");
    };
    assert!(err.to_string().contains("nice"), "{err}");
}
