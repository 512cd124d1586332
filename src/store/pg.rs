//! Opening a store on PostgreSQL: telling a URL from a path, connecting, and creating or
//! checking the schema under an advisory lock.
//!
//! The schema is `pg/schema.sql`, the newest one, readable on its own; its version is the
//! SQLite schema's ([`SCHEMA_VERSION`]). A database is migrated in one transaction that holds
//! the advisory lock [`MIGRATION_LOCK`], so that two runners starting at once on an empty
//! database create the schema once, and the second finds it made.

use std::path::Path;

#[cfg(feature = "postgres")]
use super::db::{self, Connection, params, sql};
#[cfg(feature = "postgres")]
use super::options::{Migration, OpenOptions, SCHEMA_VERSION};
use crate::error::{Error, Result};

/// The advisory lock every migration of a leasehold database holds: the bytes of `leasehol`.
#[cfg(feature = "postgres")]
pub(crate) const MIGRATION_LOCK: i64 = 0x6c65_6173_6568_6f6c;

/// The newest schema.
#[cfg(feature = "postgres")]
const SCHEMA: &str = include_str!("pg/schema.sql");

#[cfg(feature = "postgres")]
mod pass;

/// The migrations after the first schema on PostgreSQL (version 15), each with its version,
/// applied in order in the migration's transaction; each SQLite migration of the same number
/// says why.
#[cfg(feature = "postgres")]
const MIGRATIONS: &[(i64, &str)] = &[
    (
        16,
        "ALTER TABLE jobs ADD COLUMN teardown_lease_expires_at BIGINT",
    ),
    (17, "ALTER TABLE jobs ADD COLUMN name TEXT"),
    (18, include_str!("pg/0018_wal.sql")),
    (19, "ALTER TABLE runners ADD COLUMN containment TEXT"),
    (20, include_str!("pg/0020_conditions.sql")),
    (21, include_str!("pg/0021_manners.sql")),
    (22, include_str!("pg/0022_insert_counts.sql")),
];

/// Whether `path` is a PostgreSQL URL (`postgres://` or `postgresql://`) rather than a file.
pub(crate) fn is_url(path: &Path) -> bool {
    path.to_str()
        .is_some_and(|s| s.starts_with("postgres://") || s.starts_with("postgresql://"))
}

/// The database `db` as messages and logs show it: a file's path as it is, a PostgreSQL URL
/// without its password (in the authority or as a `password=` parameter).
///
/// ```
/// assert_eq!(
///     leasehold::redacted_db("postgres://app:s3cret@db.example/jobs"),
///     "postgres://app@db.example/jobs"
/// );
/// assert_eq!(leasehold::redacted_db("/var/lib/app/jobs.db"), "/var/lib/app/jobs.db");
/// ```
pub fn redacted_db(db: impl AsRef<Path>) -> String {
    let db = db.as_ref();
    match db.to_str() {
        Some(url) if is_url(db) => redacted(url),
        _ => db.display().to_string(),
    }
}

/// The URL without its password, to show in messages and logs: neither `user:password@`
/// nor a `password=` in its query.
pub(crate) fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let authority = match authority.rsplit_once('@') {
        Some((user, host)) => {
            let user = user.split_once(':').map_or(user, |(name, _)| name);
            format!("{user}@{host}")
        }
        None => authority.to_owned(),
    };
    let (path, query) = query(tail);
    let kept: Vec<&str> = query
        .iter()
        .filter(|(key, _)| decoded(key).as_deref() != Some("password"))
        .map(|(_, pair)| *pair)
        .collect();
    joined(&format!("{scheme}://{authority}{path}"), &kept)
}

/// What names the database and not how it is reached: the [`redacted`] URL without the TLS
/// settings (`sslmode`, `sslrootcert`), so that the local folders of a database keep their
/// name when only its password or TLS settings change.
pub(crate) fn identity(url: &str) -> String {
    let shown = redacted(url);
    let (base, query) = query(&shown);
    let kept: Vec<&str> = query
        .iter()
        .filter(|(key, _)| !OWN_KEYS.contains(&decoded(key).as_deref().unwrap_or("")))
        .map(|(_, pair)| *pair)
        .collect();
    joined(base, &kept)
}

/// The query parameters leasehold reads itself, which the `postgres` crate does not know.
const OWN_KEYS: [&str; 2] = ["sslmode", "sslrootcert"];

/// `text` before its query, and the query's pairs: each its key (still percent-encoded) and
/// the whole pair as written.
fn query(text: &str) -> (&str, Vec<(&str, &str)>) {
    let Some((base, query)) = text.split_once('?') else {
        return (text, Vec::new());
    };
    let pairs = query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| (pair.split_once('=').map_or(pair, |(key, _)| key), pair))
        .collect();
    (base, pairs)
}

/// `base` with the query of `pairs`, or without one when there are none.
fn joined(base: &str, pairs: &[&str]) -> String {
    if pairs.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", pairs.join("&"))
    }
}

/// `text` with its `%XX` escapes decoded; `None` when that is not UTF-8.
fn decoded(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// The URL's own settings (`sslmode`, `sslrootcert`, decoded), and the URL without them, for
/// the `postgres` crate, which refuses keys it does not know and sslmodes past `require`.
#[cfg(feature = "postgres")]
fn own_settings(url: &str) -> Result<(String, [Option<String>; 2])> {
    let (base, pairs) = query(url);
    let mut own = [None, None];
    let mut kept = Vec::new();
    for (key, pair) in pairs {
        match OWN_KEYS
            .iter()
            .position(|k| decoded(key).as_deref() == Some(*k))
        {
            Some(i) => {
                let value = pair.split_once('=').map_or("", |(_, v)| v);
                own[i] = Some(decoded(value).ok_or_else(|| Error::Invalid {
                    setting: OWN_KEYS[i],
                    reason: "not UTF-8 once decoded".to_string(),
                })?);
            }
            None => kept.push(pair),
        }
    }
    Ok((joined(base, &kept), own))
}

/// A URL as each reader of it takes it (feature `fuzzing`): shown without its password, its
/// identity, and split into leasehold's own settings and the `postgres` crate's.
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_url(url: &str) {
    let shown = redacted(url);
    let _ = identity(url);
    #[cfg(feature = "postgres")]
    if let Ok((rest, _)) = own_settings(url) {
        let _ = rest.parse::<postgres::Config>();
    }
    assert_eq!(redacted(&shown), shown, "a redacted URL redacts to itself");
}

/// The password that the password file's text `text` gives (feature `fuzzing`).
#[cfg(all(feature = "fuzzing", feature = "postgres"))]
pub(crate) fn fuzz_pgpass(
    text: &str,
    host: &str,
    port: u16,
    dbname: &str,
    user: &str,
) -> Option<String> {
    pass::find(text, host, port, dbname, user)
}

/// The error for a URL in a build without the backend.
#[cfg(not(feature = "postgres"))]
pub(crate) fn open(url: &str) -> Result<std::convert::Infallible> {
    Err(Error::NoPostgres { url: redacted(url) })
}

/// Connects to the database at `url` and brings its schema to [`SCHEMA_VERSION`] as
/// `options` allow.
///
/// The usual `PG*` variables fill in what the URL leaves out (`PGHOST`, `PGPORT`, `PGUSER`,
/// `PGPASSWORD`, `PGDATABASE`), as libpq does.
#[cfg(feature = "postgres")]
pub(crate) fn open(url: &str, options: &OpenOptions) -> Result<(Connection, Migration)> {
    let timeouts = match options.runner_lease() {
        Some((lease_ttl, heartbeat)) => Timeouts::runner(lease_ttl, heartbeat),
        None => Timeouts::one_shot(options.busy_timeout),
    };
    let mut config = config(url)?;
    timeouts.apply(config.pg_mut());
    let pg = db::pg::Conn::connect(config)?;
    pg.use_given_times(options.uses_given_times());
    let conn = Connection::Postgres(Box::new(pg));
    // Two processes migrating at once: the second waits for the first's lock, within its
    // lock timeout, and tries again while its busy timeout lasts.
    let deadline = std::time::Instant::now() + options.busy_timeout;
    let migration = loop {
        match migrate(&conn, url, options) {
            Err(e) if e.is_busy() && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            other => break other?,
        }
    };
    Ok((conn, migration))
}

/// What bounds the waits of a PostgreSQL session, so that nothing waits without bound for a
/// lock that a frozen peer holds, a server that does not answer, or a network that dropped
/// the connection without a word. Set on every connection as it is made (reconnections and
/// the listener's included): the first four as the session's settings (the `options`
/// startup parameter), the last on its socket.
#[cfg(feature = "postgres")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timeouts {
    /// How long to wait for the server to accept a connection (`connect_timeout`).
    pub(crate) connect: std::time::Duration,
    /// How long a statement waits for a lock (`lock_timeout`); then it fails as busy.
    pub(crate) lock: std::time::Duration,
    /// How long a statement may run (`statement_timeout`); then it fails as busy.
    pub(crate) statement: std::time::Duration,
    /// How long the server keeps a session that sits in an open transaction
    /// (`idle_in_transaction_session_timeout`): a frozen process's locks go with it.
    pub(crate) idle_in_transaction: std::time::Duration,
    /// How long a connection may be silent before TCP keepalives probe it (three probes, a
    /// third of it apart), and how long sent data may go unacknowledged
    /// (`tcp_user_timeout`): a server cut off is found within about twice this.
    pub(crate) network: std::time::Duration,
}

#[cfg(feature = "postgres")]
impl Timeouts {
    /// For a one-shot command, or an application's own [`Store`](super::Store): a lock is
    /// waited for up to the store's busy timeout (at most a minute), a statement runs and a
    /// transaction sits for up to two minutes, and the server has 10 s to answer.
    pub(crate) fn one_shot(busy: std::time::Duration) -> Timeouts {
        use std::time::Duration;
        Timeouts {
            connect: Duration::from_secs(10),
            lock: busy.clamp(Duration::from_millis(1), Duration::from_secs(60)),
            statement: Duration::from_secs(120),
            idle_in_transaction: Duration::from_secs(120),
            network: Duration::from_secs(10),
        }
    }

    /// For a runner's connections, from its lease TTL and heartbeat interval: a lock is
    /// waited for half a heartbeat (so a renewal tries again within its heartbeat, and a
    /// start or a shutdown is never held by a lock), a statement runs for half a lease TTL,
    /// a session of the runner left in a transaction (a frozen runner) is ended after a
    /// lease TTL, its locks with it; connecting and the network get a heartbeat (at least
    /// 1 s).
    pub(crate) fn runner(lease_ttl: std::time::Duration, heartbeat: std::time::Duration) -> Self {
        use std::time::Duration;
        let second = Duration::from_secs(1);
        Timeouts {
            connect: heartbeat.max(second),
            lock: (heartbeat / 2).max(Duration::from_millis(10)),
            statement: (lease_ttl / 2).max(second),
            idle_in_transaction: lease_ttl.max(second),
            network: heartbeat.max(second),
        }
    }

    /// Sets these on `config`, after the options the URL gave.
    pub(crate) fn apply(&self, config: &mut postgres::Config) {
        let ms = |d: std::time::Duration| d.as_millis().clamp(1, i32::MAX as u128);
        let settings = format!(
            "-c lock_timeout={} -c statement_timeout={} -c idle_in_transaction_session_timeout={}",
            ms(self.lock),
            ms(self.statement),
            ms(self.idle_in_transaction)
        );
        let options = match config.get_options() {
            Some(given) if !given.is_empty() => format!("{given} {settings}"),
            _ => settings,
        };
        let second = std::time::Duration::from_secs(1);
        config
            .options(&options)
            .connect_timeout(self.connect)
            .keepalives(true)
            .keepalives_idle(self.network.max(second))
            .keepalives_interval((self.network / 3).max(second))
            .keepalives_retries(3)
            .tcp_user_timeout(self.network);
    }
}

/// A connection of its own to the database at `url` that listens for the announcements of
/// work to start (see [`Store::poke`](super::Store::poke)).
#[cfg(feature = "postgres")]
pub(crate) fn listen(url: &Path) -> Result<db::pg::Listening> {
    let url = url.to_str().ok_or(Error::Invalid {
        setting: "database URL",
        reason: "not UTF-8".to_string(),
    })?;
    let mut config = config(url)?;
    Timeouts::one_shot(crate::store::DEFAULT_BUSY_TIMEOUT).apply(config.pg_mut());
    db::pg::Listening::start(&config)
}

/// The connection's settings: the URL's, then the `PG*` variables for what it leaves out, then
/// the password file for a password (see `pass`).
#[cfg(feature = "postgres")]
fn config(url: &str) -> Result<db::tls::Settings> {
    let (rest, [sslmode, sslrootcert]) = own_settings(url)?;
    // The postgres crate's message names the key or value at fault, never the URL's password.
    let mut config: postgres::Config = rest.parse().map_err(|e| Error::Invalid {
        setting: "database URL",
        reason: format!("{}: {e}", redacted(url)),
    })?;
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    if config.get_hosts().is_empty() {
        match env("PGHOST") {
            Some(host) => {
                config.host(&host);
            }
            None => {
                config.host("localhost");
            }
        }
    }
    if config.get_ports().is_empty()
        && let Some(port) = env("PGPORT").and_then(|p| p.parse().ok())
    {
        config.port(port);
    }
    if config.get_user().is_none() {
        match env("PGUSER").or_else(|| env("USER")) {
            Some(user) => {
                config.user(&user);
            }
            None => {
                config.user("postgres");
            }
        }
    }
    if config.get_dbname().is_none()
        && let Some(name) = env("PGDATABASE")
    {
        config.dbname(&name);
    }
    // libpq's order: the URL's password, then PGPASSWORD, then the password file.
    if config.get_password().is_none() {
        let password = env("PGPASSWORD").or_else(|| {
            let host = match config.get_hosts().first() {
                Some(postgres::config::Host::Tcp(host)) => host.clone(),
                Some(postgres::config::Host::Unix(path)) => path.to_string_lossy().into_owned(),
                None => "localhost".to_string(),
            };
            let port = config.get_ports().first().copied().unwrap_or(5432);
            let user = config.get_user().unwrap_or_default();
            let dbname = config.get_dbname().unwrap_or(user);
            pass::lookup(&host, port, dbname, user)
        });
        if let Some(password) = password {
            config.password(password);
        }
    }
    if config.get_application_name().is_none() {
        config.application_name("leasehold");
    }
    let sslrootcert = sslrootcert.or_else(|| env("PGSSLROOTCERT"));
    let sslmode = match sslmode.or_else(|| env("PGSSLMODE")) {
        Some(mode) => db::tls::SslMode::parse(&mode)?,
        // libpq: the system's roots are for verify-full, its default then.
        None if sslrootcert.as_deref() == Some("system") => db::tls::SslMode::VerifyFull,
        None => db::tls::SslMode::Prefer,
    };
    db::tls::Settings::new(config, sslmode, sslrootcert.as_deref())
}

/// Creates the schema in an empty database, or checks the version of one made already.
#[cfg(feature = "postgres")]
fn migrate(conn: &Connection, url: &str, options: &OpenOptions) -> Result<Migration> {
    conn.begin()?;
    let result = (|| {
        conn.execute(
            sql!(postgres: "SELECT pg_advisory_xact_lock(?1)"),
            params![MIGRATION_LOCK],
        )?;
        let made: bool = conn.query_row(
            sql!(postgres: "SELECT to_regclass('leasehold_migrations') IS NOT NULL"),
            params![],
            |r| r.get(0),
        )?;
        let from = if made {
            conn.query_row(
                sql!(postgres: "SELECT coalesce(max(version), 0) FROM leasehold_migrations"),
                params![],
                |r| r.get(0),
            )?
        } else {
            let tables: i64 = conn.query_row(
                sql!(postgres: "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()
                     AND tablename IN ('jobs', 'job_events', 'runners')"),
                params![],
                |r| r.get(0),
            )?;
            if tables > 0 {
                return Err(Error::NotADatabase {
                    path: redacted(url).into(),
                    reason: "it has tables named as leasehold's but no leasehold_migrations".into(),
                });
            }
            0
        };
        if from > SCHEMA_VERSION {
            return Err(Error::SchemaTooNew {
                found: from,
                supported: SCHEMA_VERSION,
            });
        }
        if from == 0 {
            if !options.creates() {
                return Err(Error::Missing(redacted(url).into()));
            }
            conn.execute_batch(SCHEMA)?;
        } else if from < SCHEMA_VERSION {
            if !options.migrates() {
                return Err(Error::SchemaTooOld {
                    found: from,
                    supported: SCHEMA_VERSION,
                });
            }
            for &(version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > from) {
                conn.execute_batch(sql)?;
                conn.execute(
                    sql!(postgres: "INSERT INTO leasehold_migrations (version, applied_at)
                     VALUES (?1, leasehold_now_ms())"),
                    params![version],
                )?;
            }
        }
        Ok(Migration {
            from,
            to: SCHEMA_VERSION,
        })
    })();
    match result {
        Ok(m) => {
            conn.command("COMMIT")?;
            Ok(m)
        }
        Err(e) => {
            // The rollback's own failure adds nothing to the error already returned.
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// The schema version of the database at `url`, read without creating or migrating
/// anything: 0 for a database with no leasehold schema yet.
#[cfg(feature = "postgres")]
pub(crate) fn probe_version(url: &str) -> Result<i64> {
    let mut config = config(url)?;
    Timeouts::one_shot(crate::store::DEFAULT_BUSY_TIMEOUT).apply(config.pg_mut());
    let conn = Connection::Postgres(Box::new(db::pg::Conn::connect(config)?));
    let made: bool = conn.query_row(
        sql!(postgres: "SELECT to_regclass('leasehold_migrations') IS NOT NULL"),
        params![],
        |r| r.get(0),
    )?;
    if made { schema_version(&conn) } else { Ok(0) }
}

/// The schema version of a PostgreSQL database: the newest migration applied.
#[cfg(feature = "postgres")]
pub(crate) fn schema_version(conn: &Connection) -> Result<i64> {
    conn.query_row(
        sql!(postgres: "SELECT coalesce(max(version), 0) FROM leasehold_migrations"),
        params![],
        |r| r.get(0),
    )
}

/// The database's size: `pg_database_size`, with no free pages or WAL of its own to report
/// (the server's autovacuum reuses the space of pruned rows; its WAL is the server's).
#[cfg(feature = "postgres")]
pub(crate) fn size(conn: &Connection, url: &Path) -> Result<crate::metrics::DatabaseSize> {
    let bytes: i64 = conn.query_row(
        sql!(postgres: "SELECT pg_database_size(current_database())"),
        params![],
        |r| r.get(0),
    )?;
    Ok(crate::metrics::DatabaseSize {
        path: url.to_path_buf(),
        schema_version: schema_version(conn)?,
        bytes: u64::try_from(bytes).unwrap_or(0),
        free_bytes: 0,
        wal_bytes: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An embedder's build without the backend: a URL is refused with an error that names
    /// the feature (and not the URL's password), for opening and for reading the version.
    #[cfg(not(feature = "postgres"))]
    #[test]
    fn a_url_without_the_feature_names_the_feature() {
        let url = "postgres://u:secret@h/db";
        for e in [
            crate::Store::open(url).expect_err("no backend"),
            crate::Store::probe_version(url).expect_err("no backend"),
        ] {
            assert!(matches!(e, Error::NoPostgres { .. }), "{e:?}");
            let message = e.to_string();
            assert!(message.contains("`postgres` cargo feature"), "{message}");
            assert!(message.contains("postgres://u@h/db"), "{message}");
            assert!(!message.contains("secret"), "{message}");
        }
    }

    #[test]
    fn urls_are_told_from_paths_and_shown_without_their_password() {
        assert!(is_url(Path::new("postgres://u@h/db")));
        assert!(is_url(Path::new("postgresql://h/db")));
        assert!(!is_url(Path::new("jobs.db")));
        assert!(!is_url(Path::new("./postgres://x")));
        assert_eq!(
            redacted("postgres://u:secret@h:5432/db?x=1"),
            "postgres://u@h:5432/db?x=1"
        );
        assert_eq!(redacted("postgres://h/db"), "postgres://h/db");
        assert_eq!(redacted("postgres://u@h/d:b@c"), "postgres://u@h/d:b@c");
        // A password in the query, spelled plainly or percent-encoded, goes too.
        assert_eq!(
            redacted("postgres://u:s@h/db?password=secret&sslmode=require"),
            "postgres://u@h/db?sslmode=require"
        );
        assert_eq!(
            redacted("postgres://h?pass%77ord=secret&a=1&password"),
            "postgres://h?a=1"
        );
    }

    #[test]
    fn the_folders_identity_leaves_out_the_password_and_the_tls_settings() {
        let plain = "postgres://u@h:5432/db?application_name=x";
        for url in [
            "postgres://u:pw@h:5432/db?application_name=x",
            "postgres://u@h:5432/db?sslmode=verify-full&application_name=x&sslrootcert=%2Fa",
            "postgres://u@h:5432/db?password=pw&application_name=x",
        ] {
            assert_eq!(identity(url), plain, "{url}");
        }
        assert_eq!(identity("postgres://u@h/db"), "postgres://u@h/db");
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn leaseholds_own_keys_are_taken_out_of_the_url_and_decoded() {
        let (rest, own) = own_settings(
            "postgres://h/db?sslmode=verify-ca&connect_timeout=5&sslrootcert=%2Fca.crt",
        )
        .unwrap();
        assert_eq!(rest, "postgres://h/db?connect_timeout=5");
        assert_eq!(own, [Some("verify-ca".into()), Some("/ca.crt".into())]);
        let (rest, own) = own_settings("postgres://h/db").unwrap();
        assert_eq!((rest.as_str(), own), ("postgres://h/db", [None, None]));
    }
}
