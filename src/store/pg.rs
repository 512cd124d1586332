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
use super::open::{Migration, OpenOptions, SCHEMA_VERSION};
use crate::error::{Error, Result};

/// The advisory lock every migration of a leasehold database holds: the bytes of `leasehol`.
#[cfg(feature = "postgres")]
pub(crate) const MIGRATION_LOCK: i64 = 0x6c65_6173_6568_6f6c;

/// The newest schema.
#[cfg(feature = "postgres")]
const SCHEMA: &str = include_str!("pg/schema.sql");

/// Whether `path` is a PostgreSQL URL (`postgres://` or `postgresql://`) rather than a file.
pub(crate) fn is_url(path: &Path) -> bool {
    path.to_str()
        .is_some_and(|s| s.starts_with("postgres://") || s.starts_with("postgresql://"))
}

/// The URL without its password, to show in messages and logs.
pub(crate) fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((user, host)) => {
            let user = user.split_once(':').map_or(user, |(name, _)| name);
            format!("{scheme}://{user}@{host}{tail}")
        }
        None => url.to_owned(),
    }
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
    let pg = db::pg::Conn::connect(config(url)?)?;
    pg.use_given_times(options.uses_given_times());
    let conn = Connection::Postgres(Box::new(pg));
    let migration = migrate(&conn, url, options)?;
    Ok((conn, migration))
}

/// A connection of its own to the database at `url` that listens for the announcements of
/// work to start (see [`Store::poke`](super::Store::poke)).
#[cfg(feature = "postgres")]
pub(crate) fn listen(url: &Path) -> Result<db::pg::Listening> {
    let url = url.to_str().ok_or(Error::Invalid {
        setting: "database URL",
        reason: "not UTF-8".to_string(),
    })?;
    db::pg::Listening::start(&config(url)?)
}

/// The connection's settings: the URL's, then the `PG*` variables for what it leaves out.
#[cfg(feature = "postgres")]
fn config(url: &str) -> Result<postgres::Config> {
    let mut config: postgres::Config = url.parse().map_err(|e| Error::Invalid {
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
    if config.get_password().is_none()
        && let Some(password) = env("PGPASSWORD")
    {
        config.password(password);
    }
    if config.get_dbname().is_none()
        && let Some(name) = env("PGDATABASE")
    {
        config.dbname(&name);
    }
    if config.get_application_name().is_none() {
        config.application_name("leasehold");
    }
    Ok(config)
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
        }
        // The first schema on PostgreSQL is the newest: versions after it will migrate here.
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
    let conn = Connection::Postgres(Box::new(db::pg::Conn::connect(config(url)?)?));
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
    }
}
