//! A PostgreSQL cluster of a test's own (`.ci/pg` on a port and folder of its own), for a test
//! that restarts or stops its server: the shared test server (`LEASEHOLD_TEST_PG`) is never
//! restarted, since other tests use it meanwhile.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::pg::{connect, pg_script, with_database};

/// A throwaway cluster, stopped (and its folder removed) when this is dropped.
pub struct Cluster {
    port: u16,
    dir: PathBuf,
    /// The URL of its `postgres` database.
    pub url: String,
}

impl Cluster {
    /// Starts a cluster on 127.0.0.1:`port` with its data under `dir` (`bash .ci/pg start`,
    /// which reuses one left running there). Fails the test with the script's output when it
    /// cannot start.
    pub fn start(port: u16, dir: impl Into<PathBuf>) -> Cluster {
        let mut cluster = Cluster {
            port,
            dir: dir.into(),
            url: String::new(),
        };
        let out = cluster.script("start").output().expect("bash runs .ci/pg");
        assert!(
            out.status.success(),
            "bash .ci/pg start (port {port}, folder {}) failed ({}): {}",
            cluster.dir.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.url = String::from_utf8_lossy(&out.stdout).trim().to_string();
        cluster
    }

    /// Database `name` on this cluster, dropped (with whatever is connected to it) and made
    /// anew, so that a rerun after a crash starts afresh; returns its URL.
    pub fn fresh_database(&self, name: &str) -> String {
        let mut admin = connect(&self.url);
        // Two calls: CREATE DATABASE cannot run in the implicit transaction of a batch.
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .and_then(|()| admin.batch_execute(&format!("CREATE DATABASE {name}")))
            .unwrap_or_else(|e| panic!("cannot make the database {name} on {}: {e}", self.url));
        with_database(&self.url, name)
    }

    /// `pg_ctl restart -m fast` (`bash .ci/pg restart`), which ends every connection; returns
    /// once the server accepts connections again.
    pub fn restart(&self) {
        let out = self.script("restart").output().expect("bash runs .ci/pg");
        assert!(
            out.status.success(),
            "bash .ci/pg restart failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Appends `settings` to the server's `postgresql.conf`, replaces its `pg_hba.conf` with
    /// `hba`, and copies `files` (each a name in the data folder and the file to copy there)
    /// owner-only and owned by the server's user, as PostgreSQL wants a key file. They take
    /// effect at the next [`Cluster::restart`].
    pub fn configure(&self, settings: &str, hba: &str, files: &[(&str, &Path)]) {
        use std::io::Write;
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let data = self.dir.join("data");
        let owner = std::fs::metadata(&data).expect("the data folder exists");
        let own = |path: &Path| {
            std::os::unix::fs::chown(path, Some(owner.uid()), Some(owner.gid())).unwrap();
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
        };
        let mut conf = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))
            .expect("postgresql.conf opens");
        writeln!(conf, "\n{settings}").unwrap();
        std::fs::write(data.join("pg_hba.conf"), hba).unwrap();
        own(&data.join("pg_hba.conf"));
        for (name, from) in files {
            std::fs::copy(from, data.join(name)).unwrap();
            own(&data.join(name));
        }
    }

    /// The server's log so far (`pg_ctl -l`), empty if it cannot be read.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    /// `bash .ci/pg ACTION` for this cluster.
    fn script(&self, action: &str) -> Command {
        let mut cmd = Command::new("bash");
        cmd.arg(pg_script())
            .arg(action)
            .env("LEASEHOLD_PG_PORT", self.port.to_string())
            .env("LEASEHOLD_PG_DIR", &self.dir);
        cmd
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // No panic here: this runs as a failed test unwinds too.
        match self.script("stop").output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!(
                "bash .ci/pg stop (port {}) failed ({}): {}",
                self.port,
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => eprintln!("cannot run bash .ci/pg stop (port {}): {e}", self.port),
        }
    }
}
