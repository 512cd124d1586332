//! TLS and passwords on PostgreSQL, on a cluster of this test's own whose `pg_hba.conf` takes
//! no plain TCP connection (only `hostssl` rules): libpq's sslmodes and `sslrootcert`, the password file, and no
//! password in what leasehold shows (messages, errors, local folders).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use leasehold::Store;

use crate::util::Watchdog;
use crate::util::cluster::Cluster;
use crate::util::pg::fresh_db;

const PORT: u16 = 55447;
/// The role `app`'s password: a `:` and a `\`, which the password file escapes.
const PASSWORD: &str = r"pw:wi\th";
/// A password that never works; it must never show either.
const WRONG: &str = "WrongHorseBattery";

/// `e` and its sources, as the command prints them (`{:#}`).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Runs `openssl ARGS` in `dir`, failing the test with its output when it fails.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the openssl command runs (.ci/run installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Makes in `dir` a CA (`ca.crt`), a server certificate it signs for `localhost` only
/// (`server.crt`, `server.key`), and a CA that signed nothing here (`other.crt`).
fn certificates(dir: &Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let ca = [
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ];
    for (name, cn) in [("ca", "leasehold test CA"), ("other", "another CA")] {
        let (key, crt, subj) = (
            format!("{name}.key"),
            format!("{name}.crt"),
            format!("/CN={cn}"),
        );
        let mut args = vec![
            "req", "-x509", "-days", "2", "-subj", &subj, "-keyout", &key, "-out", &crt,
        ];
        args.extend(ec);
        args.extend(ca);
        openssl(dir, &args);
    }
    let mut args = vec![
        "req",
        "-new",
        "-subj",
        "/CN=localhost",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ];
    args.extend(ec);
    openssl(dir, &args);
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n\
         keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-days",
            "2",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-extfile",
            "server.ext",
            "-out",
            "server.crt",
        ],
    );
}

/// The cluster, with a role `app` (password [`PASSWORD`]) owning the database `app`, a
/// database `tls` for the superuser, and TLS required on every TCP connection: `trust` for
/// `postgres`, SCRAM for `app`. The test's own statements go through the Unix socket.
struct TlsCluster {
    _cluster: Cluster,
    certs: PathBuf,
    _dir: tempfile::TempDir,
}

impl TlsCluster {
    fn start() -> TlsCluster {
        let dir = tempfile::tempdir().unwrap();
        certificates(dir.path());
        let data = format!("/tmp/leasehold-pg-tls-{PORT}");
        let cluster = Cluster::start(PORT, &data);
        let mut admin = TlsCluster::admin(&data);
        // One at a time: DROP DATABASE runs in no transaction, nor in a batch's.
        for sql in [
            "DROP DATABASE IF EXISTS app WITH (FORCE)",
            "DROP DATABASE IF EXISTS tls WITH (FORCE)",
            "DROP ROLE IF EXISTS app",
            &format!("CREATE ROLE app LOGIN PASSWORD '{PASSWORD}'"),
            "CREATE DATABASE app OWNER app",
            "CREATE DATABASE tls",
        ] {
            admin.batch_execute(sql).unwrap();
        }
        cluster.configure(
            "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'",
            // No rule takes a plain TCP connection.
            "local all all trust\n\
             hostssl all app all scram-sha-256\n\
             hostssl all all all trust\n",
            &[
                ("server.crt", &dir.path().join("server.crt")),
                ("server.key", &dir.path().join("server.key")),
            ],
        );
        cluster.restart();
        TlsCluster {
            _cluster: cluster,
            certs: dir.path().to_path_buf(),
            _dir: dir,
        }
    }

    /// A connection through the cluster's Unix socket, which `pg_hba.conf` trusts.
    fn admin(data: &str) -> postgres::Client {
        postgres::Config::new()
            .host_path(Path::new(data).join("sockets"))
            .port(PORT)
            .user("postgres")
            .dbname("postgres")
            .connect(postgres::NoTls)
            .expect("the cluster's socket takes a connection")
    }

    /// Whether leasehold has sessions on `db`, all of them over TLS (a session closed just
    /// before may still be listed).
    fn encrypted(&self, db: &str) -> bool {
        let row = TlsCluster::admin(&format!("/tmp/leasehold-pg-tls-{PORT}"))
            .query_one(
                "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl)
                 FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
                 WHERE a.application_name = 'leasehold' AND a.datname = $1",
                &[&db],
            )
            .unwrap();
        let (tls, plain): (i64, i64) = (row.get(0), row.get(1));
        tls > 0 && plain == 0
    }

    fn cert(&self, name: &str) -> String {
        self.certs.join(name).to_str().unwrap().to_string()
    }
}

/// `leasehold --db URL db version` with only `env` of the PG* variables set (and HOME in a
/// folder with no password file or root certificate unless the test puts one there).
fn db_version(url: &str, home: &Path, env: &[(&str, &str)]) -> Output {
    leasehold(url, home, env, &["db", "version"])
}

/// `leasehold --db URL ARGS...`, as [`db_version`] runs it.
fn leasehold(url: &str, home: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("leasehold"));
    cmd.args(["--db", url]).args(args);
    for var in crate::util::leasehold_vars() {
        cmd.env_remove(var);
    }
    for var in [
        "PGPASSWORD",
        "PGPASSFILE",
        "PGSSLMODE",
        "PGSSLROOTCERT",
        "PGHOST",
        "PGUSER",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("HOME", home)
        .env("RUST_LOG", "warn")
        .envs(env.iter().copied());
    cmd.output().expect("leasehold runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// One cluster for the three parts: starting one takes seconds.
#[test]
fn tls_and_passwords_on_a_server_that_requires_tls() {
    let _watchdog = Watchdog::with_timeout(Duration::from_secs(240));
    let c = TlsCluster::start();
    sslmodes_connect_and_verify_as_libpq_does(&c);
    passwords_come_from_the_url_then_pgpassword_then_the_password_file();
    no_password_shows_in_errors_or_folder_names();
}

fn sslmodes_connect_and_verify_as_libpq_does(c: &TlsCluster) {
    let by_ip = format!("postgres://postgres@127.0.0.1:{PORT}/tls");
    let by_name = format!("postgres://postgres@localhost:{PORT}/tls");
    let ca = c.cert("ca.crt");
    let open = |url: &str| Store::open(url).map_err(|e| chain(&e));

    // require: TLS, nothing verified. The server sees an encrypted session.
    let store = open(&format!("{by_ip}?sslmode=require")).expect("sslmode=require connects");
    assert!(c.encrypted("tls"), "the session is encrypted");
    drop(store);
    // prefer, the default: TLS where the server offers it.
    let store = open(&by_ip).expect("the default sslmode connects to a server that requires TLS");
    assert!(c.encrypted("tls"));
    drop(store);
    // disable: plain, which this server refuses, and says why.
    let e = open(&format!("{by_ip}?sslmode=disable")).expect_err("a plain connection is refused");
    assert!(
        e.contains("no pg_hba.conf entry") && e.contains("no encryption"),
        "{e}"
    );

    // verify-full: the chain and the name. The certificate names localhost, not 127.0.0.1.
    let store = open(&format!("{by_name}?sslmode=verify-full&sslrootcert={ca}"))
        .expect("verify-full accepts the certificate for the host it names");
    drop(store);
    let e = open(&format!("{by_ip}?sslmode=verify-full&sslrootcert={ca}"))
        .expect_err("verify-full refuses a certificate for another host name");
    assert!(
        e.contains("certificate") && e.contains("not valid for name"),
        "{e}"
    );
    // verify-ca: the chain only, so the same connection is taken; sslrootcert percent-encoded.
    let encoded = ca.replace('/', "%2F");
    let store = open(&format!("{by_ip}?sslrootcert={encoded}&sslmode=verify-ca"))
        .expect("verify-ca accepts a certificate its root signed, whatever its name");
    drop(store);
    // A root that did not sign the server's certificate: refused by both verifying modes, and
    // by require, which verifies once given a root file (as libpq).
    let other = c.cert("other.crt");
    for mode in ["verify-ca", "verify-full", "require"] {
        let e = open(&format!("{by_name}?sslmode={mode}&sslrootcert={other}"))
            .expect_err("a certificate from an unknown issuer is refused");
        assert!(e.contains("UnknownIssuer"), "{mode}: {e}");
    }
    // Settings that cannot work are said to be wrong before connecting.
    let e = open(&format!("{by_ip}?sslmode=strict")).expect_err("no such sslmode");
    assert!(e.contains("sslmode") && e.contains("strict"), "{e}");

    // The variables, for what the URL leaves out; the URL's own setting wins.
    let home = tempfile::tempdir().unwrap();
    let env = [("PGSSLMODE", "verify-full"), ("PGSSLROOTCERT", ca.as_str())];
    let out = db_version(&by_name, home.path(), &env);
    assert!(out.status.success(), "{}", text(&out));
    let out = db_version(&by_ip, home.path(), &env);
    assert!(
        !out.status.success(),
        "verify-full from PGSSLMODE: {}",
        text(&out)
    );
    assert!(text(&out).contains("not valid for name"), "{}", text(&out));
    let out = db_version(&format!("{by_ip}?sslmode=require"), home.path(), &env);
    assert!(
        out.status.success(),
        "the URL's sslmode wins: {}",
        text(&out)
    );
    // verify-full with no root file given and none at ~/.postgresql/root.crt.
    let out = db_version(&format!("{by_name}?sslmode=verify-full"), home.path(), &[]);
    assert!(
        !out.status.success() && text(&out).contains("root certificate"),
        "{}",
        text(&out)
    );
    // libpq's default root file is read when it exists.
    std::fs::create_dir(home.path().join(".postgresql")).unwrap();
    std::fs::copy(&ca, home.path().join(".postgresql/root.crt")).unwrap();
    let out = db_version(&format!("{by_name}?sslmode=verify-full"), home.path(), &[]);
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn prefer_takes_a_plain_server_and_require_refuses_it() {
    // The shared test server has no TLS.
    let db = fresh_db("tls_plain");
    let store = Store::open(format!("{}?sslmode=prefer", db.url)).expect("prefer goes on plain");
    drop(store);
    let e = Store::open(format!("{}?sslmode=require", db.url)).expect_err("no TLS to require");
    assert!(
        chain(&e).contains("server does not support TLS"),
        "{}",
        chain(&e)
    );
    // The URL's other keys still go to the postgres crate, which refuses what it does not know.
    let e = Store::open(format!("{}?sslmode=disable&bogus=1", db.url)).expect_err("bogus key");
    assert!(chain(&e).contains("bogus"), "{}", chain(&e));
}

fn passwords_come_from_the_url_then_pgpassword_then_the_password_file() {
    let url = format!("postgres://app@127.0.0.1:{PORT}/app?sslmode=require");
    let home = tempfile::tempdir().unwrap();
    let file = home.path().join("passwords");
    // The first matching line wins: the wrong ones are for another database, or come after.
    let escaped = PASSWORD.replace('\\', r"\\").replace(':', r"\:");
    std::fs::write(
        &file,
        format!(
            "# leasehold's test\n\
             127.0.0.1:*:other:app:{WRONG}\n\
             *:{PORT}:app:app:{escaped}\n\
             *:*:*:*:{WRONG}\n",
        ),
    )
    .unwrap();
    let passfile = file.to_str().unwrap();
    let mode = |m: u32| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(m)).unwrap();
    };

    let out = db_version(&url, home.path(), &[]);
    assert!(!out.status.success(), "no password: {}", text(&out));
    mode(0o600);
    let out = db_version(&url, home.path(), &[("PGPASSFILE", passfile)]);
    assert!(out.status.success(), "the password file's: {}", text(&out));
    // ~/.pgpass when PGPASSFILE is not set.
    std::fs::copy(&file, home.path().join(".pgpass")).unwrap();
    let out = db_version(&url, home.path(), &[]);
    assert!(out.status.success(), "~/.pgpass: {}", text(&out));
    std::fs::remove_file(home.path().join(".pgpass")).unwrap();
    // PGPASSWORD before the file; the URL's before both.
    let out = db_version(
        &url,
        home.path(),
        &[("PGPASSFILE", passfile), ("PGPASSWORD", WRONG)],
    );
    assert!(!out.status.success(), "PGPASSWORD wins: {}", text(&out));
    assert!(!text(&out).contains(WRONG), "{}", text(&out));
    let with_password = url.replace("app@", &format!("app:{}@", encode(PASSWORD)));
    let out = db_version(&with_password, home.path(), &[("PGPASSWORD", WRONG)]);
    assert!(
        out.status.success(),
        "the URL's password wins: {}",
        text(&out)
    );
    // A file its group or others may read is ignored, with libpq's warning.
    mode(0o644);
    let out = db_version(&url, home.path(), &[("PGPASSFILE", passfile)]);
    assert!(
        !out.status.success(),
        "a 0644 file is not read: {}",
        text(&out)
    );
    assert!(
        text(&out).contains("group or world access"),
        "{}",
        text(&out)
    );
    assert!(!text(&out).contains("pw:wi"), "{}", text(&out));
}

/// `text` percent-encoded for a URL's user information.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            b => format!("%{b:02X}"),
        })
        .collect()
}

fn no_password_shows_in_errors_or_folder_names() {
    let port = PORT;
    let urls = [
        format!("postgres://app:{WRONG}@127.0.0.1:{port}/app?sslmode=require"),
        format!("postgres://app@127.0.0.1:{port}/app?password={WRONG}&sslmode=require"),
        format!("postgres://app@127.0.0.1:{port}/app?sslmode=require&pass%77ord={WRONG}"),
        // Refused by the postgres crate's parser, which the message names: with the URL.
        format!("postgres://app:{WRONG}@127.0.0.1:{port}/app?bogus=1&password={WRONG}"),
    ];
    for url in &urls {
        let e = chain(&Store::open(url).expect_err("a wrong password is refused"));
        assert!(!e.contains(WRONG), "{e}");
        // Each command that names its database in a message or a log line: refused at the
        // password, before any work.
        for args in [
            &["db", "version"][..],
            &["status"],
            &["run", "--until-idle"],
            &["db", "migrate"],
        ] {
            let out = leasehold(
                url,
                Path::new("/nonexistent"),
                &[("RUST_LOG", "info")],
                args,
            );
            assert!(!out.status.success(), "{args:?}: {}", text(&out));
            assert!(!text(&out).contains(WRONG), "{args:?}: {}", text(&out));
        }
    }
    assert!(
        chain(&Store::open(&urls[0]).unwrap_err()).contains("password authentication failed"),
        "the server's reason is kept"
    );
    // prefer (the default) tries plain after TLS is refused: the TLS attempt's reason is kept.
    let e =
        chain(&Store::open(format!("postgres://app:{WRONG}@127.0.0.1:{port}/app")).unwrap_err());
    assert!(
        e.contains("password authentication failed") && !e.contains(WRONG),
        "{e}"
    );
    // The local folders: no password, and the same for URLs that differ only in the password
    // or the TLS settings.
    let plain = format!("postgres://app@127.0.0.1:{port}/app");
    for url in urls.iter().chain([
        &format!("{plain}?sslmode=verify-full&sslrootcert=/x/ca.crt"),
        &format!("postgres://app:other@127.0.0.1:{port}/app"),
    ]) {
        for (folder, expected) in leasehold::local_folders(url)
            .iter()
            .zip(leasehold::local_folders(&plain))
        {
            assert!(
                !folder.to_string_lossy().contains(WRONG),
                "{}",
                folder.display()
            );
            if !url.contains("bogus") {
                assert_eq!(folder, &expected, "{url}");
            }
        }
    }
}
