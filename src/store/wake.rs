//! Wake-up across processes: a folder of Unix datagram sockets beside the database.
//!
//! SQLite has no LISTEN/NOTIFY. Each running runner binds one socket in `<db>-wake/`, named
//! after its process and a random suffix; whoever commits work that a runner could start now
//! (an enqueue, a retry, a cleared teardown marker) sends one byte to every socket there,
//! best-effort and without blocking. A runner's listener turns a datagram into the same
//! wake-up an enqueue in its own process gives its dispatcher.
//!
//! Nothing depends on a poke arriving: a runner still polls the database (slowly), so a lost
//! datagram, a full socket buffer, a deleted socket or a folder that cannot be created costs
//! latency, never a job. A socket whose runner died refuses datagrams (`ECONNREFUSED`); the
//! first poke that finds it so deletes it.
//!
//! The folder carries jobs (argv and environment) that commands hand to runners, and their
//! answers, so it must be this user's alone: [`check`] refuses one that another user could
//! create, bind a socket in, or swap, and nothing is ever sent to a socket in a folder it
//! refuses (see [`sockets`]).
//!
//! This lives in the store, beside the file it is named after, because both sides use it:
//! [`Store`](super::Store)'s writes poke, and the runner (a layer up) listens.

use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use nix::libc;
use parking_lot::Mutex;

use super::Store;
use crate::error::{Error, Result};

/// The largest request a command sends; a larger job (a huge environment) is stored by the
/// command itself.
pub(crate) const MAX_REQUEST: usize = 64 * 1024;

/// The folder of wake-up sockets for the database at `db`: `<db>-wake`, beside SQLite's own
/// `-wal` and `-shm` files.
///
/// Named after the file, not after how `db` spells it: `../jobs.db`, a symlink to the file or
/// to its folder all name the folder beside the real file (symlinks resolved, as SQLite
/// resolves them for its `-wal`), so that a command finds the runners whatever spelling each
/// was given, and takes the answer from the socket path it sent to. A runner and a command
/// that spelled the file differently once compared different strings: the command got no
/// answer it would take, or no folder at all, and stored every job itself after its wait.
pub(crate) fn folder(db: &Path) -> PathBuf {
    let mut name = canonical(db).into_os_string();
    name.push("-wake");
    PathBuf::from(name)
}

/// The file's canonical path; for a file not made yet, its folder's canonical path and its
/// name; failing that, absolute (so that a process that changes its working folder later
/// still finds the same sockets, and a runner can remove its own).
///
/// A PostgreSQL URL names no file: its folders are this host's, under [`local_base`].
pub(crate) fn canonical(db: &Path) -> PathBuf {
    if super::pg::is_url(db) {
        return local_base(db);
    }
    if let Ok(path) = std::fs::canonicalize(db) {
        return path;
    }
    if let Some(name) = db.file_name() {
        let parent = match db.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        if let Ok(parent) = std::fs::canonicalize(parent) {
            return parent.join(name);
        }
    }
    std::path::absolute(db).unwrap_or_else(|_| db.to_path_buf())
}

/// Where this host keeps what a PostgreSQL database's runners keep beside a SQLite file (the
/// wake-up sockets, the attempts' files): `$XDG_STATE_HOME/leasehold`, else
/// `~/.local/state/leasehold`, else `/tmp/leasehold-<uid>`, then a name made of the URL
/// (without its password and TLS settings: [`identity`](super::pg::identity)), this host's name and a hash of both, so that two databases never
/// share folders, nor two hosts whose home folders are one network share (the attempts' files
/// of one host's runners are no other host's to read, adopt or remove). The folder is made
/// (owner-only) when missing; a failure shows when the folders beside it are made.
pub(crate) fn local_base(url: &Path) -> PathBuf {
    let url = super::pg::identity(&url.to_string_lossy());
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty());
    let state = match std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        Some(dir) => PathBuf::from(dir).join("leasehold"),
        None => match home {
            Some(home) => PathBuf::from(home).join(".local/state/leasehold"),
            None => std::env::temp_dir().join(format!("leasehold-{}", nix::unistd::geteuid())),
        },
    };
    let _ = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&state);
    // Short parts: a socket's path in the folder must fit in 108 bytes (`sun_path`).
    let readable = |text: &str, most: usize| -> String {
        text.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .take(most)
            .collect()
    };
    let host = crate::process::hostname();
    let server = readable(
        url.split_once("://").map_or(url.as_str(), |(_, rest)| rest),
        16,
    );
    // FNV-1a: the same name from every build, which std's hasher does not promise.
    let hash = [url.as_bytes(), b"\0", host.as_bytes()]
        .concat()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    state.join(format!(
        "pg-{server}-on-{}-{hash:016x}",
        readable(&host, 12)
    ))
}

/// Checks that the wake-up folder `dir` is this user's alone: a directory (not a symlink to
/// one), owned by this process's effective user, with no group or other permission bit.
/// Returns `false` when there is no folder.
///
/// The folder is checked as opened, not by its path: it is opened without following a
/// symlink (`O_PATH | O_DIRECTORY | O_NOFOLLOW`) and the open descriptor is `fstat`ed, so
/// nobody can swap what the path names between a look and the open. Sends to the sockets
/// inside still name them by path. That is sound once the folder itself is checked: only its
/// owner (and root) can add, rename or remove an entry in an owner-only folder, and in a
/// shared sticky folder such as `/tmp` nobody else can rename or remove the owner's folder to
/// put another in its place.
///
/// # Errors
///
/// [`Error::WakeFolder`] naming the folder and what is wrong with it; [`Error::Io`] when it
/// cannot be looked at (a parent folder this user may not search).
pub(crate) fn check(dir: &Path) -> Result<bool> {
    check_owned(dir, |problem| Error::WakeFolder {
        path: dir.to_path_buf(),
        problem,
    })
}

/// [`check`]'s test of a folder that must be this user's alone, with `refuse` making the
/// error that names what is wrong (the attempts folder has its own).
pub(crate) fn check_owned(dir: &Path, refuse: impl Fn(String) -> Error) -> Result<bool> {
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(dir)
        .and_then(|folder| folder.metadata());
    let meta = match opened {
        Ok(meta) => meta,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(false),
        // A symlink, even to a good folder, or a file: the lstat only words the refusal.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTDIR | libc::ELOOP)) => {
            let symlink = std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink());
            return Err(refuse(if symlink {
                "is a symlink, not a directory".into()
            } else {
                "is not a directory".into()
            }));
        }
        Err(e) => return Err(Error::io(format!("cannot open {}", dir.display()), e)),
    };
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(refuse(format!("is owned by uid {}, not {me}", meta.uid())));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(refuse(format!(
            "has mode {:04o}, not 0700",
            meta.mode() & 0o7777
        )));
    }
    Ok(true)
}

/// The runners' sockets in the wake-up folder `dir`, once [`check`] has found the folder this
/// user's alone: the entries named as runners' sockets that are sockets of this user's. A
/// socket that another user bound before the folder was made owner-only is passed over.
/// Empty when there is no folder.
///
/// # Errors
///
/// As [`check`]; [`Error::Io`] when the folder cannot be read.
pub(crate) fn sockets(dir: &Path) -> Result<Vec<PathBuf>> {
    if !check(dir)? {
        return Ok(Vec::new());
    }
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(format!("cannot read {}", dir.display()), e)),
    };
    let me = nix::unistd::geteuid().as_raw();
    Ok(entries
        .flatten()
        .filter(|e| {
            is_socket_name(&e.path())
                && e.metadata()
                    .is_ok_and(|m| m.file_type().is_socket() && m.uid() == me)
        })
        .map(|e| e.path())
        .collect())
}

/// Logs `e`, why a command sent nothing to a wake-up folder: a warning the first time this
/// process meets a folder it refuses, so that each `jobs add` says it once; else at debug.
pub(crate) fn log_unused(e: &Error) {
    static WARNED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    if let Error::WakeFolder { path, .. } = e {
        let mut warned = WARNED.lock();
        if !warned.contains(path) {
            warned.push(path.clone());
            log::warn!("not handing the job to a runner: {e}");
            return;
        }
    }
    log::debug!("not handing the job to a runner: {e}");
}

/// The sending side: one unbound socket, made on first use, kept for the store's life.
#[derive(Default)]
pub(crate) struct Poker {
    socket: OnceLock<Option<UnixDatagram>>,
}

impl Poker {
    /// Sends one byte to every runner's socket in `folder`, skipping `own` (a runner's own
    /// socket: its process wakes its dispatcher directly). Returns how many accepted it.
    /// Never blocks and never fails: a missed poke only costs latency.
    /// A folder that [`check`] refuses is not poked at all.
    pub(crate) fn poke(&self, folder: &Path, own: Option<&Path>) -> usize {
        let sockets = match sockets(folder) {
            Ok(sockets) => sockets,
            Err(e) => {
                log::debug!("no runner woken: {e}");
                return 0;
            }
        };
        // No runner has made the folder, or none is bound in it: nobody to wake.
        if sockets.is_empty() {
            return 0;
        }
        let Some(socket) = self.socket.get_or_init(unbound) else {
            return 0;
        };
        let mut woken = 0;
        for path in sockets {
            if own == Some(path.as_path()) {
                continue;
            }
            match socket.send_to(&[1], &path) {
                Ok(_) => woken += 1,
                // Its runner is gone: the socket is stale. Another poker may have deleted it
                // first; either way it is gone.
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                    let _ = std::fs::remove_file(&path);
                }
                // A full buffer means that runner has wake-ups waiting already.
                Err(e) if e.kind() == ErrorKind::WouldBlock => woken += 1,
                Err(e) => log::debug!("cannot wake {}: {e}", path.display()),
            }
        }
        woken
    }
}

fn unbound() -> Option<UnixDatagram> {
    let socket = UnixDatagram::unbound()
        .and_then(|s| s.set_nonblocking(true).map(|()| s))
        .map_err(|e| log::debug!("cannot make a wake-up socket: {e}"))
        .ok()?;
    Some(socket)
}

/// Whether a runner has its socket in `folder`: one may be running on the file (or one
/// crashed and its socket was not yet found stale). A folder [`check`] refuses has none: no
/// runner can start beside it.
pub(crate) fn any_runner(folder: &Path) -> bool {
    sockets(folder).is_ok_and(|sockets| !sockets.is_empty())
}

/// Sockets are named `<pid>-<hex>.sock`; anything else in the folder is not ours to poke or
/// delete.
pub(crate) fn is_socket_name(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "sock")
}

/// A runner's bound socket: datagrams to it wake the runner.
pub(crate) struct Listener {
    socket: UnixDatagram,
    path: PathBuf,
    /// Where each datagram is read into: room for the largest hand-off request.
    buf: Vec<u8>,
}

impl Listener {
    /// Binds a socket named `name` (`.sock` is added) in the wake-up folder of `db`, creating
    /// the folder (owner-only) when missing, and checking it ([`check`]) whether it made it
    /// or found it.
    ///
    /// # Errors
    ///
    /// [`Error::WakeFolder`] when the folder could be used by another user; [`Error::Io`]
    /// when it cannot be made, or the socket bound (its path may be longer than the 107 bytes
    /// a Unix socket address holds).
    pub(crate) fn bind(db: &Path, name: &str) -> Result<Listener> {
        let dir = folder(db);
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::io(format!("cannot make {}", dir.display()), e)),
        }
        if !check(&dir)? {
            return Err(Error::io(
                format!("{} was removed as it was made", dir.display()),
                ErrorKind::NotFound.into(),
            ));
        }
        let path = dir.join(format!("{name}.sock"));
        let socket = UnixDatagram::bind(&path)
            .map_err(|e| Error::io(format!("cannot bind {}", path.display()), e))?;
        Ok(Listener {
            socket,
            path,
            buf: vec![0; MAX_REQUEST],
        })
    }

    /// The socket's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// A handle that ends a blocked [`Listener::wait`] from another thread.
    pub(crate) fn closer(&self) -> std::io::Result<Closer> {
        Ok(Closer(self.socket.try_clone()?))
    }

    /// Blocks until a datagram comes, then drains every datagram already queued, so a burst
    /// of pokes is one wake-up. Returns the hand-off requests among them (a JSON object, see
    /// [`handoff`](super::handoff)), each with its sender, and whether a plain poke came too;
    /// or `None` once the listener is closed.
    pub(crate) fn wait(&mut self) -> Option<Received> {
        let buf = &mut self.buf;
        let mut got = Received::default();
        match self.socket.recv_from(buf) {
            // A closed socket reads as an empty datagram.
            Ok((0, _)) => return None,
            Ok((n, from)) => got.keep(&buf[..n], from),
            Err(e) if e.kind() == ErrorKind::Interrupted => return Some(got),
            Err(e) => {
                log::warn!("wake-up socket {}: {e}", self.path.display());
                return None;
            }
        }
        if self.socket.set_nonblocking(true).is_ok() {
            while let Ok((n, from)) = self.socket.recv_from(buf)
                && n > 0
            {
                got.keep(&buf[..n], from);
            }
            let _ = self.socket.set_nonblocking(false);
        }
        Some(got)
    }

    /// Sends `answer` to the sender of a request, without blocking: a sender that has gone, or
    /// whose socket's queue is full (anyone can send to it), misses it and stores its job
    /// itself after its wait.
    pub(crate) fn answer(&self, to: &SocketAddr, answer: &[u8]) {
        let sent = self
            .socket
            .set_nonblocking(true)
            .and_then(|()| self.socket.send_to_addr(answer, to));
        if let Err(e) = sent {
            log::debug!("cannot answer a handed job: {e}");
        }
        if let Err(e) = self.socket.set_nonblocking(false) {
            // The next wait then fails, and the listener stops (removing its socket).
            log::warn!("wake-up socket {}: {e}", self.path.display());
        }
    }
}

/// A hand-off request a listener received, and who sent it.
pub(crate) struct Request {
    pub(crate) body: Vec<u8>,
    pub(crate) from: SocketAddr,
}

/// What one [`Listener::wait`] read.
#[derive(Default)]
pub(crate) struct Received {
    /// The hand-off requests, in the order they came.
    pub(crate) requests: Vec<Request>,
    /// A plain poke came: something changed in the file that a hand-off does not say (an
    /// enqueue by another process, a schedule added or resumed, a queue resumed).
    pub(crate) poked: bool,
}

impl Received {
    /// Keeps a datagram that is a hand-off request (a JSON object); a poke is one byte.
    fn keep(&mut self, datagram: &[u8], from: SocketAddr) {
        if datagram.first() == Some(&b'{') {
            self.requests.push(Request {
                body: datagram.to_vec(),
                from,
            });
        } else {
            self.poked = true;
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Ends a listener's wait: see [`Listener::closer`].
pub(crate) struct Closer(UnixDatagram);

impl Closer {
    /// Shuts the socket down: the listener's wait returns `None`, now and from then on.
    pub(crate) fn close(&self) {
        let _ = self.0.shutdown(std::net::Shutdown::Both);
    }
}

impl Store {
    /// Wakes every runner on this database (but this store's own) at once, best-effort: after
    /// a commit that made a job ready. A runner that misses it finds the job on its next poll.
    ///
    /// On SQLite through the sockets beside the file; on PostgreSQL by `NOTIFY`, which reaches
    /// the runners of every host (this one's too: its runners listen rather than bind
    /// sockets for pokes).
    pub(crate) fn poke(&self) {
        self.announce("jobs");
    }

    /// [`Store::poke`] after a schedule was put or resumed: runners' schedule firers read the
    /// schedules again (on SQLite every poke wakes them).
    pub(crate) fn poke_firers(&self) {
        self.announce("schedules");
    }

    fn announce(&self, what: &str) {
        if self.conn.sqlite().is_some() {
            self.poker
                .poke(&folder(&self.path), self.own_socket.as_deref());
        } else if let Err(e) = self.conn.announce(what) {
            log::debug!("cannot announce {what} to the runners (they find it on their poll): {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// A long URL and host name still make a folder name short enough that a socket in the
    /// folder beside it (`<name>-wake/<pid>-<suffix>`) fits `sun_path` under a usual home.
    #[test]
    fn a_postgres_folder_name_stays_short_and_tells_databases_apart() {
        let long = "postgres://leasehold_user@a-very-long-host-name.example.internal:5432/\
                    leasehold_test_database_with_a_long_name_0123456789";
        let a = local_base(Path::new(long));
        let b = local_base(Path::new(&format!("{long}x")));
        let name = a.file_name().unwrap().to_str().unwrap().to_owned();
        assert!(name.len() <= 3 + 16 + 4 + 12 + 1 + 16, "{name}");
        assert_ne!(a, b, "two databases, two folders");
        let socket = Path::new("/home/someone/.local/state/leasehold")
            .join(format!("{name}-wake"))
            .join("4194304-0123abcd");
        assert!(socket.as_os_str().len() < 108, "{}", socket.display());
    }

    #[test]
    fn a_poke_wakes_a_bound_listener_and_a_stale_socket_is_deleted() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let db = dir.path().join("jobs.db");
        let poker = Poker::default();
        assert_eq!(
            poker.poke(&folder(&db), None),
            0,
            "no folder, nobody to wake"
        );
        let mut listener = Listener::bind(&db, "1-aa").expect("bind");
        // A socket whose runner died: bound, then its socket closed, its file left behind.
        let stale = folder(&db).join("2-bb.sock");
        drop(UnixDatagram::bind(&stale).expect("bind"));
        assert!(stale.exists());
        assert_eq!(poker.poke(&folder(&db), None), 1);
        assert!(!stale.exists(), "the stale socket is deleted");
        assert!(
            listener
                .wait()
                .is_some_and(|got| got.requests.is_empty() && got.poked)
        );
        // Its own socket is skipped.
        assert_eq!(poker.poke(&folder(&db), Some(listener.path())), 0);
    }

    #[test]
    fn only_an_owner_only_folder_of_this_users_passes_the_check() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let wake = dir.path().join("jobs.db-wake");
        assert!(!check(&wake).expect("no folder is no error"));
        let refusal = |path: &Path| match check(path) {
            Err(Error::WakeFolder { path: p, problem }) if p == path => problem,
            other => panic!("{} not refused: {other:?}", path.display()),
        };

        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&wake)
            .expect("mkdir");
        assert!(check(&wake).expect("an owner-only folder"));
        for mode in [0o750, 0o701, 0o777, 0o1777] {
            std::fs::set_permissions(&wake, std::fs::Permissions::from_mode(mode)).expect("chmod");
            assert_eq!(refusal(&wake), format!("has mode {mode:04o}, not 0700"));
            assert!(sockets(&wake).is_err(), "listed in a refused folder");
        }

        let link = dir.path().join("link.db-wake");
        std::fs::set_permissions(&wake, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        std::os::unix::fs::symlink(&wake, &link).expect("symlink");
        assert_eq!(refusal(&link), "is a symlink, not a directory");
        let file = dir.path().join("file.db-wake");
        std::fs::write(&file, b"").expect("a file");
        assert_eq!(refusal(&file), "is not a directory");
        let Err(e) = Listener::bind(&dir.path().join("file.db"), "1-aa") else {
            panic!("a listener bound in a file");
        };
        assert!(matches!(e, Error::WakeFolder { .. }), "{e}");
    }

    #[test]
    fn only_sockets_are_listed_and_poked() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let db = dir.path().join("jobs.db");
        let listener = Listener::bind(&db, "1-aa").expect("bind");
        // A file named as a socket is neither poked nor deleted as a stale socket.
        let file = folder(&db).join("2-bb.sock");
        std::fs::write(&file, b"mine").expect("a file");
        assert_eq!(sockets(&folder(&db)).expect("listed"), [listener.path()]);
        assert_eq!(Poker::default().poke(&folder(&db), None), 1);
        assert!(file.exists());
    }

    #[test]
    fn a_closed_listener_stops_waiting_and_removes_its_socket() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let db = dir.path().join("jobs.db");
        let mut listener = Listener::bind(&db, "1-aa").expect("bind");
        let closer = listener.closer().expect("closer");
        let path = listener.path().to_path_buf();
        let t = std::thread::spawn(move || {
            let woken = listener.wait().is_some();
            drop(listener);
            woken
        });
        closer.close();
        assert!(!t.join().expect("the listener does not panic"));
        assert!(!path.exists());
    }
}
