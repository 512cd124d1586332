//! Unique jobs: a key that matches an unfinished job (or, with a window, any recent job of
//! that key) enqueues nothing, across processes.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use leasehold::protocol::Ending;
use leasehold::{Error, Job, ListFilter, Status, Store};

use crate::helper::{Children, claim_one, files_in, finish, spawn_test_child};
use crate::util::{self, T0, TestDb, wait_until};

const CHILD_DB: &str = "LEASEHOLD_TEST_UNIQUE_DB";
const PROCESSES: usize = 8;
const ENQUEUES: usize = 20;

/// Not a test: what `eight_processes_enqueueing_one_key_make_one_job` runs in each child.
#[test]
#[ignore = "a helper that other tests run in a child process"]
fn unique_child_process() {
    let Ok(path) = std::env::var(CHILD_DB) else {
        return;
    };
    let _watchdog = util::Watchdog::new();
    let path = PathBuf::from(path);
    let ready = format!("{}.ready.{}", path.display(), std::process::id());
    std::fs::write(ready, b"").unwrap();
    let go = PathBuf::from(format!("{}.go", path.display()));
    assert!(wait_until(Duration::from_secs(30), || go.exists()));
    let store = Store::open(&path).unwrap_or_else(|e| panic!("open: {e:?}"));
    let mut new = 0;
    for _ in 0..ENQUEUES {
        let done = store
            .enqueue_unique(&Job::shell("echo sync").unique_key("sync"))
            .unwrap_or_else(|e| panic!("enqueue: {e:?}"));
        if !done.duplicate {
            new += 1;
        }
        println!("ID {}", done.id);
    }
    println!("NEW {new}");
    println!("CHILD-DONE");
}

fn spawn_child(path: &Path) -> Child {
    let (_crate, module) = module_path!()
        .split_once("::")
        .expect("this module is inside the test binary");
    spawn_test_child(
        &format!("{module}::unique_child_process"),
        &[(CHILD_DB, &path.display().to_string())],
    )
}

#[test]
fn eight_processes_enqueueing_one_key_make_one_job() {
    let db = TestDb::new();
    drop(db.store());
    let mut children = Children((0..PROCESSES).map(|_| spawn_child(&db.path)).collect());
    let ready = wait_until(Duration::from_secs(60), || {
        files_in(db.dir.path())
            .iter()
            .filter(|n| n.contains(".ready."))
            .count()
            == PROCESSES
    });
    assert!(ready, "the children did not start");
    std::fs::write(format!("{}.go", db.path.display()), b"").unwrap();
    let mut ids = Vec::new();
    let mut created = 0;
    for child in children.0.drain(..) {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("CHILD-DONE"),
            "child failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for line in stdout.lines() {
            if let Some(id) = line.strip_prefix("ID ") {
                ids.push(id.parse::<i64>().unwrap());
            }
            if let Some(n) = line.strip_prefix("NEW ") {
                created += n.parse::<usize>().unwrap();
            }
        }
    }
    assert_eq!(ids.len(), PROCESSES * ENQUEUES);
    let store = db.store();
    let jobs = store.list(&ListFilter::default()).unwrap();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(created, 1, "exactly one enqueue created the job");
    assert!(ids.iter().all(|&id| id == jobs[0].id), "{ids:?}");
    assert_eq!(jobs[0].unique_key.as_deref(), Some("sync"));
    assert_eq!(store.events(jobs[0].id).unwrap().len(), 1);
}

crate::on_both! {
    fn a_finished_job_frees_its_key_and_a_running_one_holds_it(db) {
        let store = db.store();
        let job = Job::shell("echo sync").unique_key("sync");
        let first = store.enqueue_unique_at(&job, T0).unwrap();
        assert!(!first.duplicate);
        // Pending: a duplicate, the same id; `enqueue` says the same without the flag.
        let again = store.enqueue_unique_at(&job, T0 + 1).unwrap();
        assert_eq!((again.id, again.duplicate), (first.id, true));
        assert_eq!(store.enqueue_at(&job, T0 + 2).unwrap(), first.id);
        // Running: still a duplicate.
        let claimed = claim_one(&store, "w", T0 + 10);
        assert_eq!(claimed.id, first.id);
        assert!(store.enqueue_unique_at(&job, T0 + 11).unwrap().duplicate);
        // Another key, or no key, is not held back.
        assert!(
            !store
                .enqueue_unique_at(&Job::shell("echo sync").unique_key("other"), T0 + 12)
                .unwrap()
                .duplicate
        );
        // Finished: the next enqueue makes a new job.
        finish(&store, &claimed, Ending::Succeeded, T0 + 20);
        assert_eq!(store.job(first.id).unwrap().status, Status::Succeeded);
        let next = store.enqueue_unique_at(&job, T0 + 21).unwrap();
        assert!(!next.duplicate);
        assert_ne!(next.id, first.id);
    }

    fn a_window_matches_recent_jobs_whatever_their_status(db) {
        let store = db.store();
        let job = Job::shell("echo report")
            .unique_key("report")
            .unique_window(Duration::from_secs(60));
        let first = store.enqueue_unique_at(&job, T0).unwrap();
        let claimed = claim_one(&store, "w", T0 + 1_000);
        finish(&store, &claimed, Ending::Succeeded, T0 + 2_000);
        // Finished, but created within the window: a duplicate.
        let dup = store.enqueue_unique_at(&job, T0 + 59_000).unwrap();
        assert_eq!((dup.id, dup.duplicate), (first.id, true));
        // A millisecond inside the window: a duplicate.
        let dup = store.enqueue_unique_at(&job, T0 + 59_999).unwrap();
        assert_eq!((dup.id, dup.duplicate), (first.id, true));
        // Created exactly `window` ago is outside it: a new job.
        let later = store.enqueue_unique_at(&job, T0 + 60_000).unwrap();
        assert!(!later.duplicate);
        // A running job matches whatever the window.
        let c = claim_one(&store, "w", T0 + 61_000);
        assert_eq!(c.id, later.id);
        assert!(store.enqueue_unique_at(&job, T0 + 200_000).unwrap().duplicate);
    }

    fn bad_unique_settings_are_refused(db) {
        let store = db.store();
        for (job, setting) in [
            (Job::shell("true").unique_key(""), "unique_key"),
            (
                Job::shell("true").unique_window(Duration::from_secs(1)),
                "unique_window",
            ),
            (
                Job::shell("true")
                    .unique_key("k")
                    .unique_window(Duration::ZERO),
                "unique_window",
            ),
        ] {
            match store.enqueue_unique_at(&job, T0) {
                Err(Error::Invalid { setting: s, .. }) => assert_eq!(s, setting),
                other => panic!("{job:?}: {other:?}"),
            }
        }
        assert_eq!(store.counts().unwrap().pending, 0);
    }
}
