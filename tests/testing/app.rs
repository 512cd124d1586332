//! The example of docs/testing.md: a small notes app that enqueues a backup a minute after
//! each save (one backup waiting at most, however many saves: a unique key) and keeps a
//! nightly backup schedule; and its tests, on the test database and clock, through the public
//! API only.

mod notes {
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    use leasehold::{Job, Schedule, Store};

    pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

    /// Notes saved as files in a folder, backed up to a tarball by leasehold jobs.
    pub struct Notes {
        folder: PathBuf,
        tarball: PathBuf,
        jobs: Store,
    }

    impl Notes {
        /// Opens the notes in `folder`, backed up to `tarball`, with their jobs in the
        /// database at `jobs_db`; keeps the nightly backup at 03:00 UTC.
        pub fn open(folder: &Path, tarball: &Path, jobs_db: &Path) -> Result<Notes> {
            let jobs = Store::open(jobs_db)?;
            let nightly = Schedule::cron("0 3 * * *")?.job(backup(folder, tarball));
            jobs.replace_schedule("nightly-backup", &nightly)?;
            Ok(Notes {
                folder: folder.to_path_buf(),
                tarball: tarball.to_path_buf(),
                jobs,
            })
        }

        /// Saves a note, and asks for a backup a minute later; saves meanwhile share it.
        pub fn save(&self, name: &str, text: &str) -> Result<()> {
            std::fs::write(self.folder.join(name), text)?;
            let job = backup(&self.folder, &self.tarball).delay(Duration::from_secs(60));
            self.jobs.enqueue(&job)?;
            Ok(())
        }
    }

    /// The backup job: a tarball of the folder, retried twice.
    pub fn backup(folder: &Path, tarball: &Path) -> Job {
        let (tarball, folder) = (tarball.display().to_string(), folder.display().to_string());
        Job::command(["tar", "-czf", &tarball, "-C", &folder, "."])
            .queue("backups")
            .unique_key("backup")
            .max_attempts(3)
    }
}

use std::path::PathBuf;
use std::time::Duration;

use leasehold::parse_rfc3339;
use leasehold::testing::{Expected, TestDb};
use leasehold::{Outcome, Status};

use notes::{Notes, backup};

/// The app's folders, beside the test database.
fn folders(db: &TestDb) -> (PathBuf, PathBuf) {
    let beside = db.path().parent().unwrap();
    let notes = beside.join("notes");
    std::fs::create_dir(&notes).unwrap();
    (notes, beside.join("notes.tgz"))
}

#[test]
fn saves_within_a_minute_share_one_backup() {
    let db = TestDb::new();
    let (folder, tarball) = folders(&db);
    let app = Notes::open(&folder, &tarball, db.path()).unwrap();
    let saved_at = db.clock().now_ms();
    app.save("a.txt", "one").unwrap();
    db.clock().advance(Duration::from_secs(10));
    app.save("b.txt", "two").unwrap();
    let job = db.assert_enqueued_times(
        &Expected::command(backup(&folder, &tarball).argv().to_vec())
            .queue("backups")
            .unique_key("backup")
            .due_at(saved_at + 60_000),
        1,
    );
    assert_eq!(job[0].max_attempts, 3);
}

#[test]
fn the_backup_runs_a_minute_after_the_save() {
    let db = TestDb::new();
    let (folder, tarball) = folders(&db);
    let app = Notes::open(&folder, &tarball, db.path()).unwrap();
    app.save("a.txt", "one").unwrap();
    assert!(db.drain().ended.is_empty(), "nothing is due yet");
    db.clock().advance(Duration::from_secs(60));
    let drained = db.drain();
    assert_eq!(drained.succeeded(), 1);
    assert_eq!(drained.ended[0].argv[0], "tar");
    assert!(tarball.exists());
    db.refute_enqueued(&Expected::any().queue("backups"));
}

#[test]
fn the_nightly_backup_fires_at_three_and_a_save_just_before_takes_its_place() {
    let db = TestDb::new();
    db.clock()
        .set(parse_rfc3339("2026-03-01T02:00:00Z").unwrap());
    let (folder, tarball) = folders(&db);
    let app = Notes::open(&folder, &tarball, db.path()).unwrap();
    let three = parse_rfc3339("2026-03-01T03:00:00Z").unwrap();
    assert_eq!(
        db.store().schedule("nightly-backup").unwrap().next_slot_at,
        Some(three)
    );

    // 03:00: the slot fires its backup, which the drain runs.
    db.clock().set(three);
    let drained = db.drain();
    assert_eq!(drained.ended.len(), 1);
    assert_eq!(drained.ended[0].schedule.as_deref(), Some("nightly-backup"));
    assert_eq!(
        drained.outcome(drained.ended[0].id),
        Some(Outcome::Succeeded)
    );

    // The next night, a save at 02:59:30 has a backup waiting at 03:00:30: the slot, whose
    // job has the same unique key, enqueues nothing.
    db.clock().set(three + 86_400_000 - 30_000);
    app.save("late.txt", "night owl").unwrap();
    db.clock().set(three + 86_400_000);
    assert!(db.drain().ended.is_empty());
    let waiting = db.assert_enqueued(
        &Expected::any()
            .unique_key("backup")
            .due_at(three + 86_400_000 + 30_000),
    );
    assert!(waiting.schedule.is_none());
    db.clock().advance(Duration::from_secs(30));
    let drained = db.drain();
    assert_eq!(drained.succeeded(), 1);
    assert_eq!(db.job(waiting.id).status, Status::Succeeded);
}

#[test]
fn docs_testing_md_shows_this_example_as_it_is() {
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/testing.md")).unwrap();
    let this = include_str!("app.rs");
    let module = &this[this.find("mod notes {").unwrap()..this.find("\nuse std::path").unwrap()];
    assert!(
        page.contains(module.trim_end()),
        "docs/testing.md shows another app than tests/testing/app.rs"
    );
}
