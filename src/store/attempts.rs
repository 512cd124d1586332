//! An attempt's files beside the database (see the crate's `files` module): listing a job's
//! attempt folders, and removing the folders of jobs that are gone and the journals of
//! keepers whose attempts are all recorded.

use std::path::Path;
use std::time::Instant;

use crate::store::db::{Connection, sql};

use crate::error::{Error, Result};
use crate::files::{self, AttemptDir};

use super::Store;

/// The ids among `ids` that name no job. One statement for the whole batch: the ids go in as
/// one JSON array.
pub(super) fn missing_jobs(conn: &Connection, ids: &[i64]) -> Result<Vec<i64>> {
    let list = format!(
        "[{}]",
        ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
    );
    let mut stmt = conn.prepare_cached(sql!(
        sqlite: "SELECT CAST(value AS BIGINT) FROM json_each(?1)
     WHERE CAST(value AS BIGINT) NOT IN (SELECT id FROM jobs)",
        postgres: "SELECT CAST(value AS BIGINT) FROM json_array_elements_text(?1::json)
     WHERE CAST(value AS BIGINT) NOT IN (SELECT id FROM jobs)",
    ))?;
    let rows = stmt.query_map([list], |r| r.get::<_, i64>(0))?;
    rows.collect::<Result<_>>()
}

/// The tokens among `tokens` of attempts still to be recorded: a running job's, or a lost
/// attempt's still to be torn down. One statement: the tokens go in as one JSON array.
fn live_tokens(conn: &Connection, tokens: &[String]) -> Result<Vec<String>> {
    let list = serde_json::to_string(tokens).map_err(|e| Error::Invalid {
        setting: "journal tokens",
        reason: e.to_string(),
    })?;
    let mut stmt = conn.prepare_cached(sql!(
        sqlite: "SELECT value FROM json_each(?1)
     WHERE value IN (SELECT run_token FROM jobs WHERE status = 'running')
        OR value IN (SELECT teardown_token FROM jobs WHERE teardown_token IS NOT NULL)",
        postgres: "SELECT value FROM json_array_elements_text(?1::json) AS t(value)
     WHERE value IN (SELECT run_token FROM jobs WHERE status = 'running')
        OR value IN (SELECT teardown_token FROM jobs WHERE teardown_token IS NOT NULL)",
    ))?;
    let rows = stmt.query_map([list], |r| r.get::<_, String>(0))?;
    rows.collect::<Result<_>>()
}

/// How long a journal is left alone after its last change, whatever it says: a keeper
/// creates its journal, then writes the line that names the attempt, and keeps the file
/// open to append the attempt's outcome later. Far longer than that moment.
const JOURNAL_SETTLE: std::time::Duration = std::time::Duration::from_secs(60);

/// Removes the keepers' journals in `folder` that are done: unchanged for
/// [`JOURNAL_SETTLE`], and naming no attempt still to be recorded (every attempt in it
/// ended and was recorded by a runner, or its job is gone). A journal is read only for the
/// attempts whose outcome its keeper could not hand to a runner: once they are recorded,
/// nobody reads it again. Stops once `deadline` passes. Returns how many it removed.
fn remove_done_journals(
    folder: &Path,
    conn: &Connection,
    deadline: Option<Instant>,
) -> Result<usize> {
    let context = || format!("cannot list {}", folder.display());
    let entries = match std::fs::read_dir(folder) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(Error::io(context(), e)),
    };
    let mut removed = 0;
    for entry in entries {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let entry = entry.map_err(|e| Error::io(context(), e))?;
        if entry
            .file_name()
            .to_str()
            .and_then(files::journal_keeper)
            .is_none()
        {
            continue;
        }
        let path = entry.path();
        let settled = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= JOURNAL_SETTLE);
        if !settled {
            continue;
        }
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io(format!("cannot read {}", path.display()), e)),
        };
        let tokens = files::journal_tokens(&bytes);
        if !tokens.is_empty() && !live_tokens(conn, &tokens)?.is_empty() {
            continue;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => removed += 1,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(format!("cannot remove {}", path.display()), e)),
        }
    }
    Ok(removed)
}

/// How many job folders [`remove_orphans`] checks against the database in one statement.
const ORPHAN_BATCH: usize = 500;

/// Removes the folders in `folder` of jobs that no longer exist in `store` (a prune deleted
/// them), checking a batch of names per statement; returns how many it removed. A folder
/// whose job exists is never removed: job ids are never reused (`AUTOINCREMENT`), so a
/// missing id stays missing. Names that are not a job id are left alone. Stops once
/// `deadline` passes, before the next folder (the next call goes on). An absent `folder` has
/// nothing to remove. A folder that cannot be removed is passed over, and the first such
/// error returned after the others were tried.
fn remove_orphans(
    folder: &Path,
    store: &Store,
    deadline: Option<std::time::Instant>,
) -> Result<usize> {
    let context = || format!("cannot list {}", folder.display());
    let entries = match std::fs::read_dir(folder) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(Error::io(context(), e)),
    };
    let mut ids = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(context(), e))?;
        // Only names a job folder would have: the decimal id, nothing else.
        if let Some(id) = entry
            .file_name()
            .to_str()
            .filter(|n| !n.starts_with(['+', '-', '0']))
            .and_then(|n| n.parse::<i64>().ok())
        {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    let past = || deadline.is_some_and(|d| std::time::Instant::now() >= d);
    let mut removed = 0;
    // One folder that cannot be removed does not keep the others: the first error is
    // returned once the rest were tried.
    let mut failed = None;
    'batches: for batch in ids.chunks(ORPHAN_BATCH) {
        if past() {
            break;
        }
        for id in store.missing_jobs(batch)? {
            // Removing is the slow part (on a busy disk, milliseconds a folder).
            if past() {
                break 'batches;
            }
            let dir = files::job_dir(folder, id);
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => removed += 1,
                // Another runner's sweeper or a `db prune` removed it first.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    failed.get_or_insert_with(|| {
                        Error::io(format!("cannot remove {}", dir.display()), e)
                    });
                }
            }
        }
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(removed),
    }
}

impl Store {
    /// The folders of job `id`'s attempts that have output files beside the database
    /// (`<db>-attempts/<id>/<attempt>-<run token>/`), oldest first: by attempt number, then
    /// by the folder's age, as an operator's retry counts attempts from 1 again. Empty when
    /// the job has none, whether or not it exists.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when the job's folder cannot be read.
    pub fn attempt_files(&self, id: i64) -> Result<Vec<AttemptDir>> {
        let folder = files::folder(&self.path);
        files::attempt_dirs(&folder, id).map_err(|e| {
            Error::io(
                format!("cannot list {}", files::job_dir(&folder, id).display()),
                e,
            )
        })
    }

    /// Removes the output files of jobs that no longer exist (a prune deleted them): every
    /// `<db>-attempts/<id>/` folder whose job is gone. A job that exists keeps its files.
    /// Stops once `deadline` passes, before the next folder; the next call goes on.
    /// Returns how many job folders it removed. [`Store::prune`] leaves the files alone; the
    /// runner's sweeper and `leasehold db prune` call this after it. Keepers' journals that
    /// name no attempt still to be recorded, and unchanged for a minute, go too (logged).
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when the folder cannot be read or a job's folder removed, and
    /// [`Error::Sqlite`] when the database cannot be read.
    pub fn remove_orphan_files(&self, deadline: Option<Instant>) -> Result<usize> {
        let folder = files::folder(&self.path);
        let removed = remove_orphans(&folder, self, deadline)?;
        let journals = remove_done_journals(&folder, &self.conn, deadline)?;
        if journals > 0 {
            log::info!("removed {journals} keepers' journals whose attempts are all recorded");
        }
        Ok(removed)
    }

    /// The ids among `ids` that name no job.
    pub(crate) fn missing_jobs(&self, ids: &[i64]) -> Result<Vec<i64>> {
        missing_jobs(&self.conn, ids)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn only_the_folders_of_jobs_that_are_gone_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("jobs.db")).unwrap();
        let jobs: Vec<crate::Job> = (0..3).map(|_| crate::Job::shell("true")).collect();
        let ids = store.enqueue_many_at(&jobs, 1_700_000_000_000).unwrap();
        let folder = files::folder(store.path());
        for &id in ids.iter().chain(&[99]) {
            let attempt = files::attempt_dir(&folder, id, 1, "tok");
            std::fs::create_dir_all(&attempt).unwrap();
            std::fs::write(attempt.join(files::STDOUT), b"out\n").unwrap();
        }
        // Not a job's folder: left alone, as are files beside the job folders.
        std::fs::create_dir_all(folder.join("junk")).unwrap();
        std::fs::create_dir_all(folder.join("0042")).unwrap();
        store
            .conn()
            .execute("DELETE FROM jobs WHERE id = ?1", [ids[1]])
            .unwrap();

        // A deadline already passed checks nothing.
        let past = Instant::now().checked_sub(Duration::from_millis(1));
        assert_eq!(store.remove_orphan_files(past).unwrap(), 0);
        assert!(files::job_dir(&folder, ids[1]).exists());

        assert_eq!(store.remove_orphan_files(None).unwrap(), 2);
        assert!(files::job_dir(&folder, ids[0]).exists());
        assert!(!files::job_dir(&folder, ids[1]).exists());
        assert!(files::job_dir(&folder, ids[2]).exists());
        assert!(!files::job_dir(&folder, 99).exists());
        assert!(folder.join("junk").exists() && folder.join("0042").exists());
        assert_eq!(store.remove_orphan_files(None).unwrap(), 0);

        let listed = store.attempt_files(ids[0]).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!((listed[0].attempt, listed[0].token.as_str()), (1, "tok"));
        assert_eq!(
            listed[0].tail(crate::Stream::Stdout, 2).unwrap(),
            (b"t\n".to_vec(), true)
        );
        assert!(store.attempt_files(ids[1]).unwrap().is_empty());
    }

    /// A keeper's journal goes once every attempt it names is recorded (and it is a minute
    /// old); one that names a running attempt, or a lost one still to be torn down, stays,
    /// as does a fresh one whatever it says and a file that is not a journal.
    #[test]
    fn a_journal_goes_once_its_attempts_are_recorded_and_it_is_settled() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("jobs.db")).unwrap();
        let jobs: Vec<crate::Job> = (0..2).map(|_| crate::Job::shell("true")).collect();
        let ids = store.enqueue_many_at(&jobs, 1_700_000_000_000).unwrap();
        let conn = store.conn();
        conn.execute(
            "UPDATE jobs SET status = 'running', attempt = 1, run_token = 'live1',
                 worker_id = 'w', lease_expires_at = 1 WHERE id = ?1",
            [ids[0]],
        )
        .unwrap();
        conn.execute(
            "UPDATE jobs SET teardown_token = 'tear1' WHERE id = ?1",
            [ids[1]],
        )
        .unwrap();
        let folder = files::folder(store.path());
        std::fs::create_dir_all(&folder).unwrap();
        let old = std::time::SystemTime::now() - Duration::from_secs(3600);
        let journal = |pid: i32, lines: &[&str], settled: bool| {
            let path = files::journal_path(&folder, pid, Some(1));
            let text: String = lines
                .iter()
                .map(|l| files::journal_line(l) + "\n")
                .collect();
            std::fs::write(&path, text).unwrap();
            if settled {
                let file = std::fs::File::options().write(true).open(&path).unwrap();
                file.set_modified(old).unwrap();
            }
            path
        };
        let running = journal(1, &["outcome done1 exit 0 1", "kept live1 5"], true);
        let torn_down = journal(2, &["fenced tear1"], true);
        let done = journal(3, &["kept done2 6", "outcome done2 exit 1 2"], true);
        let empty = journal(4, &[], true);
        let fresh = journal(5, &["outcome done3 exit 0 3"], false);
        let other = folder.join("keeper-x.journal");
        std::fs::write(&other, b"not a journal").unwrap();

        store.remove_orphan_files(None).unwrap();
        assert!(running.exists() && torn_down.exists() && fresh.exists() && other.exists());
        assert!(!done.exists() && !empty.exists());

        // The running attempt is recorded: its journal goes at the next call.
        conn.execute(
            "UPDATE jobs SET status = 'succeeded', completed_at = 2 WHERE id = ?1",
            [ids[0]],
        )
        .unwrap();
        store.remove_orphan_files(None).unwrap();
        assert!(!running.exists() && torn_down.exists());
    }

    #[test]
    fn missing_jobs_are_found_in_batches_larger_than_sqlites_variable_limit() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("jobs.db")).unwrap();
        let id = store
            .enqueue_at(&crate::Job::shell("true"), 1_700_000_000_000)
            .unwrap();
        let ids: Vec<i64> = (1..=40_000).collect();
        let missing = store.missing_jobs(&ids).unwrap();
        assert_eq!(missing.len(), 39_999);
        assert!(!missing.contains(&id));
        assert!(store.missing_jobs(&[]).unwrap().is_empty());
    }
}
