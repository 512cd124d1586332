//! A `<db>-wake/` folder that someone else could use (another user's, or open to group or
//! others) is never sent a job or a poke: `jobs add` stores its job itself, and `leasehold
//! run` refuses to start, naming the folder and what is wrong with it.
//!
//! These tests need root, as CI runs them: they create a second, real user (`useradd`) and
//! give it the folder (`chown`). Run as anyone else, the user cannot be made: the tests that
//! need one say so and fail.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};

use crate::helper::{FAST, OtherUser, bin, cli, fails, ok};
use crate::util::{TestDb, bare};

/// The wake-up folder of `db`, as the library names it (beside the file's real path).
fn folder(db: &Path) -> PathBuf {
    let dir = std::fs::canonicalize(db.parent().unwrap()).unwrap();
    let mut name = dir.join(db.file_name().unwrap()).into_os_string();
    name.push("-wake");
    PathBuf::from(name)
}

/// An "attacker's" socket in `folder`, named as a runner's, that reads without blocking.
fn attacker(folder: &Path) -> UnixDatagram {
    let socket = UnixDatagram::bind(folder.join("1-attacker.sock")).unwrap();
    socket.set_nonblocking(true).unwrap();
    socket
}

/// Checks that `socket` received nothing at all: no request, no poke.
fn received_nothing(socket: &UnixDatagram) {
    let mut buf = vec![0u8; 64 * 1024];
    match socket.recv(&mut buf) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        Ok(n) => panic!(
            "the attacker's socket received {n} bytes: {}",
            String::from_utf8_lossy(&buf[..n])
        ),
        Err(e) => panic!("the attacker's socket failed: {e}"),
    }
}

/// The ids of the jobs in `db`, read directly.
fn job_ids(db: &Path) -> Vec<i64> {
    let conn = bare(db);
    let mut stmt = conn.prepare("SELECT id FROM jobs ORDER BY id").unwrap();
    stmt.query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// `jobs add` beside a folder it must not use: it stores the job itself, warns once naming
/// the folder and `problem`, and sends the attacker's socket nothing. Then `leasehold run`
/// refuses to start (exit 1, one line naming both), and the database is as it was.
fn refused(db: &Path, socket: &UnixDatagram, problem: &str) {
    let wake = folder(db);
    let out = cli(db, &["jobs", "add", "--json", "--", "true"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{out:?}");
    let id = serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["id"]
        .as_i64()
        .unwrap();
    received_nothing(socket);
    assert_eq!(job_ids(db), [id], "the command stored the job itself");
    let handed: i64 = bare(db)
        .query_row("SELECT count(*) FROM handoffs", [], |r| r.get(0))
        .unwrap();
    assert_eq!(handed, 0, "nothing was sent, so no token was stored");
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warnings.len(), 1, "one warning: {stderr}");
    assert!(
        warnings[0].contains(&wake.display().to_string()) && warnings[0].contains(problem),
        "the warning names the folder and {problem:?}: {stderr}"
    );

    // A command's poke (after a retry) skips the folder too.
    ok(&mut cli(db, &["jobs", "cancel", &id.to_string()]));
    ok(&mut cli(db, &["jobs", "retry", &id.to_string()]));
    received_nothing(socket);

    // `--until-idle` on a queue with no work: a runner that started would exit 0 at once.
    let mut run = cli(db, &["run", "--until-idle", "--queue", "elsewhere"]);
    run.args(FAST);
    let line = fails(&mut run, 1);
    assert!(
        line.contains(&wake.display().to_string()) && line.contains(problem),
        "the refusal names the folder and {problem:?}: {line}"
    );
    received_nothing(socket);
    let runners: i64 = bare(db)
        .query_row("SELECT count(*) FROM runners", [], |r| r.get(0))
        .unwrap();
    assert_eq!(runners, 0, "the refused runner registered");
    assert_eq!(job_ids(db), [id]);
}

#[test]
fn a_wake_folder_open_to_others_is_never_sent_a_job() {
    let t = TestDb::new();
    let db = t.path.as_path();
    ok(&mut cli(db, &["db", "migrate"]));
    let wake = folder(db);
    std::fs::create_dir(&wake).unwrap();
    // Set after creating it: the umask would have taken bits off.
    std::fs::set_permissions(&wake, std::fs::Permissions::from_mode(0o777)).unwrap();
    let socket = attacker(&wake);
    refused(db, &socket, "has mode 0777");
}

#[test]
fn a_wake_folder_of_another_user_is_never_sent_a_job() {
    let t = TestDb::new();
    let db = t.path.as_path();
    ok(&mut cli(db, &["db", "migrate"]));
    let user = OtherUser::new();
    let wake = folder(db);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&wake)
        .unwrap();
    let socket = attacker(&wake);
    std::os::unix::fs::chown(&wake, Some(user.uid), None).unwrap();
    std::os::unix::fs::chown(wake.join("1-attacker.sock"), Some(user.uid), None).unwrap();
    let me = nix::unistd::Uid::effective().as_raw();
    refused(
        db,
        &socket,
        &format!("is owned by uid {}, not {me}", user.uid),
    );
}

#[test]
fn a_wake_folder_that_is_a_symlink_is_never_sent_a_job() {
    let t = TestDb::new();
    let db = t.path.as_path();
    ok(&mut cli(db, &["db", "migrate"]));
    // An owner-only folder elsewhere, and the wake-up folder's name a link to it.
    let elsewhere = t.sibling("elsewhere");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&elsewhere)
        .unwrap();
    std::os::unix::fs::symlink(&elsewhere, folder(db)).unwrap();
    let socket = attacker(&elsewhere);
    refused(db, &socket, "is a symlink");
}

#[test]
fn a_socket_of_another_user_in_the_wake_folder_is_not_sent_a_job() {
    // The folder is this user's and owner-only, but holds a socket another user bound before
    // it was made so (say it was 0777 once): that socket is passed over, alone or beside a
    // runner's, which still gets the job.
    let t = TestDb::new();
    let db = t.path.as_path();
    ok(&mut cli(db, &["db", "migrate"]));
    let user = OtherUser::new();
    let wake = folder(db);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&wake)
        .unwrap();
    let socket = attacker(&wake);
    std::os::unix::fs::chown(wake.join("1-attacker.sock"), Some(user.uid), None).unwrap();
    let add = || {
        let out = bin()
            .env("RUST_LOG", "leasehold=debug")
            .arg("--db")
            .arg(db)
            .args(["jobs", "add", "--json", "--", "true"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let id = serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["id"]
            .as_i64()
            .unwrap();
        (id, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let handed = || -> Vec<i64> {
        let conn = bare(db);
        let mut stmt = conn.prepare("SELECT job_id FROM handoffs").unwrap();
        stmt.query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };

    // Alone: nothing to hand the job to, so the command stores it, with no token.
    let (first, _) = add();
    received_nothing(&socket);
    assert_eq!(job_ids(db), [first]);
    assert!(handed().is_empty(), "the job was sent somewhere");

    // Beside a runner: the runner stores it, under the command's token.
    let runner = crate::helper::idle_runner(db);
    let (second, stderr) = add();
    assert!(stderr.contains("stored by the runner"), "{stderr}");
    assert_eq!(handed(), [second]);
    // A command's poke (after a retry) wakes the runner and skips the other user's socket.
    ok(&mut cli(db, &["jobs", "cancel", &first.to_string()]));
    ok(&mut cli(db, &["jobs", "retry", &first.to_string()]));
    received_nothing(&socket);
    crate::helper::stop(runner);
}
