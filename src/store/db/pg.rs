//! The PostgreSQL side of [`Connection`](super::Connection): statements, values, columns.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use postgres::types::{IsNull, ToSql as PgToSql, Type};

use super::{Kind, ValueRef, numbered_marks};

use super::tls::{Settings, connect_client};
use crate::error::{Error, Result};

/// A client and its prepared statements, keyed by text and parameter kinds.
///
/// The connection comes back after it was lost (a server restart, a network cut): the first
/// call outside a transaction connects again, and prepares its statements anew.
///
/// A transaction lives on one session: the one that ran its `BEGIN` (sessions are numbered,
/// one more at each connect). Once its connection is lost the transaction is **poisoned**:
/// every later statement of it, and its `COMMIT`, fail with [`Error::ConnectionLost`], and
/// nothing connects again until its `ROLLBACK` (or the failed `COMMIT`) ends it. So a
/// `COMMIT` never runs on a new session, where PostgreSQL would answer "there is no
/// transaction in progress" (a warning) and success for a transaction that was lost, and a
/// statement after the loss never runs alone outside the transaction it was written for.
pub(crate) struct Conn {
    inner: RefCell<Inner>,
}

struct Inner {
    config: Settings,
    /// `None` once a call found the connection lost, until the next call connects again.
    client: Option<postgres::Client>,
    /// The session `client` is: one more at each connect.
    session: u64,
    texts: HashMap<String, Arc<str>>,
    prepared: HashMap<(Arc<str>, Vec<Kind>), postgres::Statement>,
    /// The open transaction, from its `BEGIN` to its `COMMIT` or `ROLLBACK`.
    transaction: Option<Open>,
    /// The server's time, read once in the open transaction.
    transaction_now: Option<i64>,
    /// Whether to act at the caller's times rather than the server's.
    given_times: bool,
    /// Whether `leasehold_now_ms()` was read on this database (its schema is loaded): from
    /// then on a `BEGIN` reads it in the same round trip (see [`Conn::batch`]).
    clock_known: bool,
}

/// An open transaction.
#[derive(Debug, Clone, Copy)]
struct Open {
    /// The session that ran its `BEGIN`: the only one it may go on, and commit, on.
    session: u64,
    /// Whether a statement failed in it since its `BEGIN` or its last `ROLLBACK TO`: the
    /// server then has aborted it, and would end it at `COMMIT` with a rollback, which it
    /// reports only in the command's tag. Such a `COMMIT` fails with [`Error::Aborted`].
    failed: bool,
}

/// Runs `f` where the `postgres` crate can block: on this thread, unless this thread runs an
/// async runtime's task (an embedder calling from a tokio task), where the crate's own
/// runtime would panic ("Cannot start a runtime from within a runtime"); then on a thread of
/// its own for the call, which this one waits for.
fn blocking<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    if tokio::runtime::Handle::try_current().is_err() {
        return f();
    }
    std::thread::scope(|scope| match scope.spawn(f).join() {
        Ok(v) => v,
        Err(panic) => std::panic::resume_unwind(panic),
    })
}

impl Inner {
    /// The live client: the one this store has, or a new connection when that one was lost
    /// and no transaction is open. Inside a transaction, only the session that ran its
    /// `BEGIN`: [`Error::ConnectionLost`] once that one is gone.
    fn client(&mut self) -> Result<&mut postgres::Client> {
        self.forget_if_lost();
        if let Some(open) = self.transaction
            && (self.client.is_none() || open.session != self.session)
        {
            return Err(Error::ConnectionLost);
        }
        if self.client.is_none() {
            let config = &self.config;
            let client = blocking(|| connect_client(config))?;
            self.session += 1;
            log::info!("connected to PostgreSQL again");
            self.client = Some(client);
        }
        // Set just above when it was not.
        self.client.as_mut().ok_or(Error::ConnectionLost)
    }

    /// Forgets a client that found its connection lost, and the statements prepared on it.
    fn forget_if_lost(&mut self) {
        if self
            .client
            .as_ref()
            .is_some_and(postgres::Client::is_closed)
        {
            self.client = None;
            self.prepared.clear();
        }
    }

    /// Runs `f` on the live client (see [`Inner::client`] and [`blocking`]).
    ///
    /// Inside a transaction, a failure marks the transaction failed (the server aborted
    /// it), and one that lost the connection (or that the server ended the session with) is
    /// [`Error::ConnectionLost`]: the transaction stays poisoned until it is ended, and `f`
    /// never runs again on another session.
    ///
    /// Outside a transaction, `again`: whether `f` may run a second time on a new
    /// connection when the first found the connection lost (the server ended it, or the
    /// network did, before this call): a `BEGIN`, or a read, which change nothing. A write is
    /// never sent twice: whether the first reached the server is not known.
    fn with<T: Send>(
        &mut self,
        again: bool,
        f: impl Fn(&mut postgres::Client) -> std::result::Result<T, postgres::Error> + Sync,
    ) -> Result<T> {
        let client = self.client()?;
        let e = match blocking(|| f(client)) {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        let lost = self
            .client
            .as_ref()
            .is_some_and(postgres::Client::is_closed);
        if let Some(open) = self.transaction.as_mut() {
            open.failed = true;
            if lost || crate::error::is_connection(&e) {
                log::warn!("the connection to PostgreSQL was lost in a transaction ({e})");
                return Err(Error::ConnectionLost);
            }
            return Err(e.into());
        }
        if !lost || !again {
            return Err(e.into());
        }
        log::warn!("the connection to PostgreSQL was lost ({e}): connecting again");
        let client = self.client()?;
        Ok(blocking(|| f(client))?)
    }
}

impl Inner {
    /// `BEGIN` and the server's time for the transaction (see [`Conn::now`]) in one round
    /// trip: a transaction's first statement no longer waits for a read of the clock first.
    /// Sent again on a new connection when the first was lost, as a `BEGIN` is: it changes
    /// nothing.
    fn begin_reading_clock(&mut self) -> Result<()> {
        use postgres::SimpleQueryMessage;
        let result = self.with(true, |c| c.simple_query("BEGIN; SELECT leasehold_now_ms()"));
        let now = match result {
            Ok(messages) => messages.iter().find_map(|m| match m {
                SimpleQueryMessage::Row(row) => row.get(0).and_then(|t| t.parse::<i64>().ok()),
                _ => None,
            }),
            Err(e) => {
                // The BEGIN may have opened a transaction that the read then aborted.
                let _ = self.with(false, |c| c.batch_execute("ROLLBACK"));
                return Err(e);
            }
        };
        self.transaction = Some(Open {
            session: self.session,
            failed: false,
        });
        self.transaction_now = now;
        Ok(())
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // Closing a client runs the crate's runtime too: off an async runtime's thread.
        let client = self.inner.get_mut().client.take();
        blocking(move || drop(client));
    }
}

impl Conn {
    /// Connects with `config`.
    pub(crate) fn connect(config: Settings) -> Result<Conn> {
        let client = blocking(|| connect_client(&config))?;
        Ok(Conn {
            inner: RefCell::new(Inner {
                config,
                client: Some(client),
                session: 1,
                texts: HashMap::new(),
                prepared: HashMap::new(),
                transaction: None,
                transaction_now: None,
                given_times: false,
                clock_known: false,
            }),
        })
    }

    /// A statement of this text (PostgreSQL's, with SQLite's marks), prepared at its first run.
    pub(crate) fn statement(&self, sql: &str) -> Statement<'_> {
        let mut inner = self.inner.borrow_mut();
        let text = match inner.texts.get(sql) {
            Some(t) => t.clone(),
            None => {
                let t: Arc<str> = numbered_marks(sql).into();
                inner.texts.insert(sql.to_owned(), t.clone());
                t
            }
        };
        Statement { conn: self, text }
    }

    /// Runs statements with no parameters (`BEGIN`, `COMMIT`, a schema), and keeps
    /// track of the open transaction (see [`Conn`]): a `COMMIT` runs only on the session of
    /// its `BEGIN`, and fails with [`Error::ConnectionLost`] when that one is gone, or with
    /// [`Error::Aborted`] after a statement of the transaction failed (it is rolled back);
    /// either way it ends the transaction, as a `ROLLBACK` does.
    pub(crate) fn batch(&self, sql: &str) -> Result<()> {
        let mut inner = self.inner.borrow_mut();
        let head = sql.trim_start().to_ascii_uppercase();
        let rollback_to = head.starts_with("ROLLBACK TO");
        let commits = head.starts_with("COMMIT") || head.starts_with("END");
        let ends = commits || head.starts_with("ROLLBACK") && !rollback_to;
        let begins = head.starts_with("BEGIN") || head.starts_with("START TRANSACTION");
        inner.transaction_now = None;
        if ends {
            let Some(open) = inner.transaction else {
                // No transaction: the BEGIN failed, or a lost connection took it. A
                // COMMIT must not succeed on a session that never ran it.
                return if commits {
                    Err(Error::ConnectionLost)
                } else {
                    Ok(())
                };
            };
            let result = if commits && open.failed {
                let rolled_back = inner.with(false, |c| c.batch_execute("ROLLBACK"));
                Err(match rolled_back {
                    Err(Error::ConnectionLost) => Error::ConnectionLost,
                    _ => Error::Aborted,
                })
            } else {
                // The transaction stays open during the call, so that the call cannot
                // connect again and run it on a new session.
                inner.with(false, |c| c.batch_execute(sql))
            };
            inner.transaction = None;
            return match result {
                // Lost with the connection: rolled back all the same.
                Err(Error::ConnectionLost) if !commits => Ok(()),
                other => other,
            };
        }
        if sql == "BEGIN" && inner.clock_known && !inner.given_times {
            return inner.begin_reading_clock();
        }
        let result = inner.with(begins, |c| c.batch_execute(sql));
        if begins && result.is_ok() {
            inner.transaction = Some(Open {
                session: inner.session,
                failed: false,
            });
        } else if rollback_to
            && result.is_ok()
            && let Some(open) = inner.transaction.as_mut()
        {
            // Back to a point before the failure: the transaction goes on.
            open.failed = false;
        }
        result
    }

    /// Acts at the caller's times, not the server's (see [`Connection::now`]).
    ///
    /// [`Connection::now`]: super::Connection::now
    pub(crate) fn use_given_times(&self, given: bool) {
        self.inner.borrow_mut().given_times = given;
    }

    /// The time to act at: see [`Connection::now`](super::Connection::now).
    pub(crate) fn now(&self, given: i64) -> Result<i64> {
        let inner = self.inner.borrow();
        if inner.given_times {
            return Ok(given);
        }
        if let Some(now) = inner.transaction_now {
            return Ok(now);
        }
        drop(inner);
        // Prepared once and kept, as every statement is: sent as text, the read cost a
        // second round trip (a prepare) each time.
        let rows = self.statement("SELECT leasehold_now_ms()").query(&[])?;
        let now: i64 = rows
            .first()
            .ok_or(Error::NoRows)?
            .try_get(0)
            .map_err(Error::from)?;
        let mut inner = self.inner.borrow_mut();
        if inner.transaction.is_some() {
            inner.transaction_now = Some(now);
        }
        inner.clock_known = true;
        Ok(now)
    }

    /// Announces `what` on [`WAKE_CHANNEL`] to every listening runner, on any host. Outside a
    /// transaction it is sent at once; inside one, PostgreSQL delivers it at the commit, and
    /// not at all after a rollback.
    pub(crate) fn announce(&self, what: &str) -> Result<()> {
        let mut inner = self.inner.borrow_mut();
        // A repeated announcement only wakes a runner twice.
        inner.with(true, |c| {
            c.execute("SELECT pg_notify($1, $2)", &[&WAKE_CHANNEL, &what])
                .map(drop)
        })
    }

    /// Whether a transaction is open.
    pub(crate) fn in_transaction(&self) -> bool {
        self.inner.borrow().transaction.is_some()
    }
}

/// The channel runners `LISTEN` on: commits that leave work to start announce it there
/// ([`Conn::announce`]), `jobs` for a job that may start now, `schedules` for a schedule put or
/// resumed.
pub(crate) const WAKE_CHANNEL: &str = "leasehold_wake";

/// A connection of its own that listens on [`WAKE_CHANNEL`], for a runner's wake-up thread.
pub(crate) struct Listening {
    /// Taken only by `drop`.
    client: Option<postgres::Client>,
}

impl Listening {
    /// Connects with `config` and listens.
    pub(crate) fn start(config: &Settings) -> Result<Listening> {
        let mut client = blocking(|| connect_client(config))?;
        blocking(|| client.batch_execute(&format!("LISTEN {WAKE_CHANNEL}")))?;
        Ok(Listening {
            client: Some(client),
        })
    }

    /// Waits up to `timeout` for announcements and returns those that came (none at the
    /// timeout), every one pending read at once. [`Error::ConnectionLost`] once the
    /// connection is gone: announcements made meanwhile are lost with it, and the caller
    /// listens again on a new one.
    pub(crate) fn wait(&mut self, timeout: std::time::Duration) -> Result<Vec<String>> {
        use postgres::fallible_iterator::FallibleIterator;
        let Some(client) = self.client.as_mut() else {
            return Err(Error::ConnectionLost);
        };
        let got = blocking(|| -> std::result::Result<Vec<String>, postgres::Error> {
            let mut got = Vec::new();
            let mut notifications = client.notifications();
            let first = notifications.timeout_iter(timeout).next()?;
            if let Some(first) = first {
                got.push(first.payload().to_owned());
                let mut pending = notifications.iter();
                while let Some(more) = pending.next()? {
                    got.push(more.payload().to_owned());
                }
            }
            Ok(got)
        })?;
        if got.is_empty() && client.is_closed() {
            return Err(Error::ConnectionLost);
        }
        Ok(got)
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        // As for [`Conn`]: closing runs the crate's runtime, off an async runtime's thread.
        let client = self.client.take();
        blocking(move || drop(client));
    }
}

/// A statement's text, prepared with the kinds of the values of its first run.
pub(crate) struct Statement<'c> {
    conn: &'c Conn,
    text: Arc<str>,
}

impl Statement<'_> {
    /// Whether the statement only reads (a SELECT, whose FOR UPDATE locks end with the
    /// connection), so that it may be sent again on a new connection.
    fn reads_only(&self) -> bool {
        let head = self.text.trim_start();
        head.get(..6)
            .is_some_and(|w| w.eq_ignore_ascii_case("SELECT"))
    }

    fn prepared(&self, inner: &mut Inner, values: &[ValueRef<'_>]) -> Result<postgres::Statement> {
        inner.forget_if_lost();
        let kinds: Vec<Kind> = values.iter().map(ValueRef::kind).collect();
        let key = (self.text.clone(), kinds);
        if let Some(s) = inner.prepared.get(&key) {
            return Ok(s.clone());
        }
        let types: Vec<Type> = key.1.iter().map(|k| pg_type(*k)).collect();
        let text = &self.text;
        // Preparing changes nothing: it may be sent again on a new connection.
        let s = inner.with(true, |c| c.prepare_typed(text, &types))?;
        inner.prepared.insert(key, s.clone());
        Ok(s)
    }

    /// Runs the statement; how many rows it changed.
    pub(crate) fn execute(&mut self, values: &[ValueRef<'_>]) -> Result<usize> {
        let mut inner = self.conn.inner.borrow_mut();
        let stmt = self.prepared(&mut inner, values)?;
        let n = inner.with(false, |c| {
            let params: Vec<&(dyn PgToSql + Sync)> =
                values.iter().map(|v| v as &(dyn PgToSql + Sync)).collect();
            c.execute(&stmt, &params)
        })?;
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    /// Runs the query and returns its rows. A read outside a transaction that found the
    /// connection lost is sent again, once, on a new one (see [`Inner::with`]).
    pub(crate) fn query(&mut self, values: &[ValueRef<'_>]) -> Result<Vec<postgres::Row>> {
        let mut inner = self.conn.inner.borrow_mut();
        let again = inner.transaction.is_none() && self.reads_only();
        let run = |inner: &mut Inner| {
            let stmt = self.prepared(inner, values)?;
            inner.with(false, |c| {
                let params: Vec<&(dyn PgToSql + Sync)> =
                    values.iter().map(|v| v as &(dyn PgToSql + Sync)).collect();
                c.query(&stmt, &params)
            })
        };
        match run(&mut inner) {
            Err(e)
                if again
                    && inner
                        .client
                        .as_ref()
                        .is_some_and(postgres::Client::is_closed) =>
            {
                log::warn!("the connection to PostgreSQL was lost ({e}): connecting again");
                run(&mut inner)
            }
            other => other,
        }
    }
}

fn pg_type(k: Kind) -> Type {
    match k {
        Kind::Int => Type::INT8,
        Kind::Real => Type::FLOAT8,
        Kind::Text => Type::TEXT,
        Kind::Blob => Type::BYTEA,
    }
}

impl PgToSql for ValueRef<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut postgres::types::private::BytesMut,
    ) -> std::result::Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match *self {
            ValueRef::Null(_) => Ok(IsNull::Yes),
            ValueRef::Int(i) => i.to_sql(ty, out),
            ValueRef::Real(r) => r.to_sql(ty, out),
            ValueRef::Text(t) => t.to_sql(ty, out),
            ValueRef::Blob(b) => b.to_sql(ty, out),
        }
    }

    fn accepts(_: &Type) -> bool {
        // Each statement is prepared with the types of the values bound to it.
        true
    }

    postgres::types::to_sql_checked!();
}

/// Whether column `i` is NULL.
pub(crate) fn is_null(row: &postgres::Row, i: usize) -> Result<bool> {
    let ty = column_type(row, i)?;
    Ok(match ty {
        t if *t == Type::INT8 => row.try_get::<_, Option<i64>>(i)?.is_none(),
        t if *t == Type::INT4 => row.try_get::<_, Option<i32>>(i)?.is_none(),
        t if *t == Type::INT2 => row.try_get::<_, Option<i16>>(i)?.is_none(),
        t if *t == Type::BOOL => row.try_get::<_, Option<bool>>(i)?.is_none(),
        t if *t == Type::FLOAT8 => row.try_get::<_, Option<f64>>(i)?.is_none(),
        t if *t == Type::FLOAT4 => row.try_get::<_, Option<f32>>(i)?.is_none(),
        t if *t == Type::BYTEA => row.try_get::<_, Option<Vec<u8>>>(i)?.is_none(),
        _ => row.try_get::<_, Option<&str>>(i)?.is_none(),
    })
}

fn column_type(row: &postgres::Row, i: usize) -> Result<&Type> {
    row.columns()
        .get(i)
        .map(|c| c.type_())
        .ok_or_else(|| Error::Column(format!("no column {i}")))
}

/// The error for a NULL where a value must be.
pub(crate) fn null(row: &postgres::Row, i: usize) -> Error {
    let name = row.columns().get(i).map_or("?", |c| c.name());
    Error::Column(format!("column {i} ({name}) is NULL"))
}

/// Column `i` as an integer, from any integer or boolean type.
pub(crate) fn int(row: &postgres::Row, i: usize) -> Result<Option<i64>> {
    let ty = column_type(row, i)?;
    Ok(match ty {
        t if *t == Type::INT8 => row.try_get::<_, Option<i64>>(i)?,
        t if *t == Type::INT4 => row.try_get::<_, Option<i32>>(i)?.map(i64::from),
        t if *t == Type::INT2 => row.try_get::<_, Option<i16>>(i)?.map(i64::from),
        t if *t == Type::BOOL => row.try_get::<_, Option<bool>>(i)?.map(i64::from),
        // `sum()` of bigints is numeric on PostgreSQL (an integer on SQLite).
        t if *t == Type::NUMERIC => row.try_get::<_, Option<WholeNumeric>>(i)?.map(|n| n.0),
        other => {
            return Err(Error::Column(format!(
                "column {i} ({}) is {other}, not an integer (cast it to bigint)",
                row.columns()[i].name()
            )));
        }
    })
}

/// A `numeric` that holds a whole number within i64, as `sum()` of bigints gives.
struct WholeNumeric(i64);

impl<'a> postgres::types::FromSql<'a> for WholeNumeric {
    /// The binary `numeric`: digit count, weight (of the first digit, in powers of
    /// 10,000), sign and display scale (four u16/i16), then the base-10,000 digits.
    fn from_sql(
        _: &Type,
        raw: &'a [u8],
    ) -> std::result::Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let word = |i: usize| -> std::result::Result<i16, String> {
            raw.get(i * 2..i * 2 + 2)
                .map(|b| i16::from_be_bytes([b[0], b[1]]))
                .ok_or_else(|| "a numeric value cut short".to_owned())
        };
        let (ndigits, weight, sign) = (word(0)?, word(1)?, word(2)? as u16);
        if sign != 0 && sign != 0x4000 {
            return Err("a numeric NaN or infinity is not an integer".into());
        }
        let mut value: i128 = 0;
        for d in 0..usize::try_from(ndigits).unwrap_or(0) {
            let digit = i128::from(word(4 + d)?);
            let power = i32::from(weight) - i32::try_from(d).unwrap_or(i32::MAX);
            if power < 0 {
                if digit != 0 {
                    return Err("a numeric value with a fraction is not an integer".into());
                }
                continue;
            }
            let scale = 10_000i128
                .checked_pow(u32::try_from(power).unwrap_or(u32::MAX))
                .ok_or("a numeric value beyond i64")?;
            value = value
                .checked_add(digit * scale)
                .ok_or("a numeric value beyond i64")?;
        }
        if sign == 0x4000 {
            value = -value;
        }
        Ok(WholeNumeric(
            i64::try_from(value).map_err(|_| "a numeric value beyond i64")?,
        ))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::NUMERIC
    }
}

/// Column `i` as a float, from any float or integer type.
pub(crate) fn real(row: &postgres::Row, i: usize) -> Result<Option<f64>> {
    let ty = column_type(row, i)?;
    Ok(match ty {
        t if *t == Type::FLOAT8 => row.try_get::<_, Option<f64>>(i)?,
        t if *t == Type::FLOAT4 => row.try_get::<_, Option<f32>>(i)?.map(f64::from),
        _ => int(row, i)?.map(|v| v as f64),
    })
}

/// Column `i` as text.
pub(crate) fn text(row: &postgres::Row, i: usize) -> Result<Option<String>> {
    Ok(row.try_get::<_, Option<String>>(i)?)
}

/// Column `i`, text or bytes, as text with what is not UTF-8 replaced (see
/// [`LossyText`](super::LossyText)); `None` for NULL.
pub(crate) fn lossy_text(row: &postgres::Row, i: usize) -> Result<Option<String>> {
    if row.columns().get(i).map(postgres::Column::type_) == Some(&Type::BYTEA) {
        let bytes: Option<Vec<u8>> = row.try_get(i)?;
        return Ok(bytes.map(|b| String::from_utf8_lossy(&b).into_owned()));
    }
    text(row, i)
}

#[cfg(test)]
mod tests {
    use crate::error::Error;
    use crate::job::Job;
    use crate::store::{Store, transaction};

    /// A database of its own on the test server (`LEASEHOLD_TEST_PG`), dropped at the end.
    struct Db {
        server: String,
        name: String,
        url: String,
    }

    impl Db {
        fn new(hint: &str) -> Db {
            let server = std::env::var("LEASEHOLD_TEST_PG")
                .expect("LEASEHOLD_TEST_PG names the test server (bash .ci/pg start)");
            let name = format!(
                "lh_unit_{hint}_{}_{}",
                std::process::id(),
                crate::job::now_ms() % 1_000_000_000
            );
            let mut admin = postgres::Client::connect(&server, postgres::NoTls).expect("admin");
            admin
                .batch_execute(&format!("CREATE DATABASE \"{name}\""))
                .expect("create the database");
            let (base, query) = server.split_once('?').unwrap_or((&server, ""));
            let at = base.find("://").map_or(0, |i| i + 3);
            let host = base[at..].find('/').map_or(base, |s| &base[..at + s]);
            let url = if query.is_empty() {
                format!("{host}/{name}")
            } else {
                format!("{host}/{name}?{query}")
            };
            Db { server, name, url }
        }

        fn client(&self) -> postgres::Client {
            postgres::Client::connect(&self.url, postgres::NoTls).expect("a second connection")
        }
    }

    impl Drop for Db {
        fn drop(&mut self) {
            if let Ok(mut admin) = postgres::Client::connect(&self.server, postgres::NoTls) {
                let _ = admin.batch_execute(&format!(
                    "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                    self.name
                ));
            }
        }
    }

    fn jobs(other: &mut postgres::Client) -> i64 {
        other
            .query_one("SELECT count(*) FROM jobs", &[])
            .expect("count")
            .get(0)
    }

    /// The server ends the session while it sits idle in a transaction (as
    /// `pg_terminate_backend` or a network cut does): the next statement of the transaction
    /// fails, so does every later one (none runs alone on a new session), and so does the
    /// COMMIT, even when the caller passed over those failures; nothing of the transaction
    /// is stored. Outside the transaction after its ROLLBACK, the connection comes back.
    #[test]
    fn a_transaction_whose_session_was_cut_is_never_committed() {
        let db = Db::new("cut_tx");
        let store = Store::open(&db.url).expect("open");
        let mut other = db.client();
        let conn = store.conn();
        let job = Job::shell("true");

        for swallow in [false, true] {
            let result = transaction(conn, &mut |c| {
                crate::store::enqueue::insert_job(c, &job, 1)?;
                let pid: i64 =
                    c.query_row("SELECT pg_backend_pid()::bigint", params![], |r| r.get(0))?;
                let state: String = other
                    .query_one(
                        "SELECT state FROM pg_stat_activity WHERE pid = $1::int",
                        &[&(pid as i32)],
                    )
                    .expect("the session's state")
                    .get(0);
                assert_eq!(state, "idle in transaction");
                other
                    .execute("SELECT pg_terminate_backend($1::int)", &[&(pid as i32)])
                    .expect("terminate");
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
                while other
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity WHERE pid = $1::int",
                        &[&(pid as i32)],
                    )
                    .expect("the session's end")
                    .get::<_, i64>(0)
                    > 0
                {
                    assert!(std::time::Instant::now() < deadline, "the session ends");
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                let next = crate::store::enqueue::insert_job(c, &job, 1);
                assert!(matches!(next, Err(Error::ConnectionLost)), "{next:?}");
                let later = crate::store::enqueue::insert_job(c, &job, 1);
                assert!(matches!(later, Err(Error::ConnectionLost)), "{later:?}");
                if swallow {
                    // A caller that logs and goes on, as the writer's look-ahead did.
                    Ok(())
                } else {
                    later.map(drop)
                }
            });
            let e = result.expect_err("the transaction was lost with its session");
            assert!(matches!(e, Error::ConnectionLost), "{e:?}");
            assert!(e.is_busy(), "a lost transaction is run again whole");
            assert_eq!(jobs(&mut other), 0, "swallow {swallow}: nothing was stored");
        }
        // The next transaction connects again.
        store
            .enqueue_at(&job, 1)
            .expect("an enqueue on a new session");
        assert_eq!(jobs(&mut other), 1);
    }

    /// Once a connection has read the server's clock, a `BEGIN` reads it in the same round
    /// trip: the transaction's time is set before its first statement, and no statement of
    /// the transaction reads it again.
    #[test]
    fn a_begin_brings_the_servers_time_with_it() {
        let db = Db::new("begin_clock");
        let store = Store::open(&db.url).expect("open");
        let crate::store::db::Connection::Postgres(pg) = store.conn() else {
            panic!("a PostgreSQL store");
        };
        let before = pg.now(0).expect("the server's time, outside a transaction");
        assert!(pg.inner.borrow().clock_known);
        transaction(store.conn(), &mut |c| {
            let at = pg
                .inner
                .borrow()
                .transaction_now
                .expect("the time came with the BEGIN");
            assert!(at >= before, "{at} < {before}");
            assert_eq!(c.now(0)?, at);
            Ok(())
        })
        .expect("the transaction commits");
        assert!(pg.inner.borrow().transaction_now.is_none());
    }

    /// A statement that fails inside a transaction aborts it on PostgreSQL, whose COMMIT
    /// then answers as if it committed and stores nothing: a caller that passed over the
    /// failure gets [`Error::Aborted`] from the COMMIT instead. A failure undone by a
    /// `ROLLBACK TO` leaves the transaction whole.
    #[test]
    fn a_commit_after_a_passed_over_failure_is_an_error() {
        let db = Db::new("aborted_tx");
        let store = Store::open(&db.url).expect("open");
        let mut other = db.client();
        let conn = store.conn();
        let job = Job::shell("true");
        let result = transaction(conn, &mut |c| {
            crate::store::enqueue::insert_job(c, &job, 1)?;
            let bad = c.execute("SELECT 1 / 0", params![]);
            assert!(bad.is_err());
            Ok(())
        });
        let e = result.expect_err("the transaction was aborted");
        assert!(matches!(e, Error::Aborted), "{e:?}");
        assert_eq!(jobs(&mut other), 0);

        let kept = transaction(conn, &mut |c| {
            crate::store::enqueue::insert_job(c, &job, 1)?;
            let undone = crate::store::savepoint(c, |c| c.execute("SELECT 1 / 0", params![]))?;
            assert!(undone.is_err());
            Ok(())
        });
        kept.expect("a failure undone by its savepoint leaves the transaction whole");
        assert_eq!(jobs(&mut other), 1);
    }
}
