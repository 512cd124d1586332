//! The PostgreSQL side of [`Connection`](super::Connection): statements, values, columns.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use postgres::types::{IsNull, ToSql as PgToSql, Type};

use super::{Kind, ValueRef, numbered_marks};

use crate::error::{Error, Result};

/// A client and its prepared statements, keyed by text and parameter kinds.
///
/// The connection comes back after it was lost (a server restart, a network cut): the first
/// call outside a transaction connects again, and prepares its statements anew. A call inside
/// a transaction fails instead, as the transaction is gone with the connection; the caller's
/// retry begins a new one.
pub(crate) struct Conn {
    inner: RefCell<Inner>,
}

struct Inner {
    config: postgres::Config,
    /// `None` once a call found the connection lost, until the next call connects again.
    client: Option<postgres::Client>,
    texts: HashMap<String, Arc<str>>,
    prepared: HashMap<(Arc<str>, Vec<Kind>), postgres::Statement>,
    in_transaction: bool,
    /// The server's time, read once in the open transaction.
    transaction_now: Option<i64>,
    /// Whether to act at the caller's times rather than the server's.
    given_times: bool,
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
    /// and no transaction is open.
    fn client(&mut self) -> Result<&mut postgres::Client> {
        self.forget_if_lost();
        if self.client.is_none() {
            if self.in_transaction {
                return Err(Error::ConnectionLost);
            }
            let config = &self.config;
            let client = blocking(|| config.connect(postgres::NoTls))?;
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

    /// Runs `f` on the live client (see [`Inner::client`] and [`blocking`]). A failure that
    /// closed the connection ends the transaction that was open on it.
    ///
    /// `again`: whether `f` may run a second time on a new connection when the first found
    /// the connection lost (the server ended it, or the network did, before this call): a
    /// `BEGIN`, or a read outside a transaction, which change nothing. A write is never sent
    /// twice: whether the first reached the server is not known.
    fn with<T: Send>(
        &mut self,
        again: bool,
        f: impl Fn(&mut postgres::Client) -> std::result::Result<T, postgres::Error> + Sync,
    ) -> Result<T> {
        let client = self.client()?;
        let result = blocking(|| f(client));
        let lost = result.is_err()
            && self
                .client
                .as_ref()
                .is_some_and(postgres::Client::is_closed);
        if !lost {
            return Ok(result?);
        }
        let in_transaction = std::mem::replace(&mut self.in_transaction, false);
        self.transaction_now = None;
        if !again || in_transaction {
            return Ok(result?);
        }
        log::warn!(
            "the connection to PostgreSQL was lost ({}): connecting again",
            result.err().map_or_else(String::new, |e| e.to_string())
        );
        let client = self.client()?;
        Ok(blocking(|| f(client))?)
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
    pub(crate) fn connect(config: postgres::Config) -> Result<Conn> {
        let client = blocking(|| config.connect(postgres::NoTls))?;
        Ok(Conn {
            inner: RefCell::new(Inner {
                config,
                client: Some(client),
                texts: HashMap::new(),
                prepared: HashMap::new(),
                in_transaction: false,
                transaction_now: None,
                given_times: false,
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
    /// track of whether a transaction is open.
    pub(crate) fn batch(&self, sql: &str) -> Result<()> {
        let mut inner = self.inner.borrow_mut();
        let head = sql.trim_start().to_ascii_uppercase();
        let ends = head.starts_with("COMMIT")
            || head.starts_with("ROLLBACK") && !head.starts_with("ROLLBACK TO")
            || head.starts_with("END");
        if ends && inner.client.is_none() {
            // The connection, and the transaction with it, were lost: nothing to end.
            inner.in_transaction = false;
            return if head.starts_with("COMMIT") {
                Err(Error::ConnectionLost)
            } else {
                Ok(())
            };
        }
        let begins = head.starts_with("BEGIN") || head.starts_with("START TRANSACTION");
        let result = inner.with(begins, |c| c.batch_execute(sql));
        inner.transaction_now = None;
        if begins {
            inner.in_transaction = result.is_ok();
        } else if ends {
            inner.in_transaction = false;
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
        if inner.in_transaction {
            inner.transaction_now = Some(now);
        }
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
        self.inner.borrow().in_transaction
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
    pub(crate) fn start(config: &postgres::Config) -> Result<Listening> {
        let mut client = blocking(|| config.connect(postgres::NoTls))?;
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
        let again = !inner.in_transaction && self.reads_only();
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
