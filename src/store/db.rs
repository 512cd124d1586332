//! The store's one connection type over both backends: SQLite (always) and PostgreSQL (the
//! `postgres` feature).
//!
//! The store's files are written against this module, not against `rusqlite` or `postgres`:
//! [`Connection`], [`Statement`], [`Row`], and the `params!` macro have the shape of
//! rusqlite's (`prepare_cached(sql)?.execute(params![...])`, `query_row`, `query_map`,
//! `row.get(i)`), so the store's logic between its statements (fences, verdicts, cascades)
//! is written once for both backends. What differs is inside this file: how a value is bound,
//! how a column is read, how a statement is prepared and cached, and the few statements whose
//! text differs by dialect ([`Connection::dialect`]).
//!
//! A statement is an [`Sql`]: its text for each backend, written out, so that a reader sees the
//! text that runs. Most statements read the same on both (`sql!("...")`, [`Sql::same`]); one
//! that uses what only one dialect has (`UPDATE OR FAIL`, `INDEXED BY`, `json_each`, `rowid`...)
//! spells each (`sql!(sqlite: "...", postgres: "...")`, [`Sql::new`]). Both are written with
//! numbered (`?1`) or bare (`?`) parameters: the only rewriting at run time is PostgreSQL's of
//! the marks to `$1` ([`numbered_marks`]). PostgreSQL prepares the statement with the parameter
//! types of the values bound (every integer is an `int8`), so that a mark whose type it cannot
//! infer (`?5 > 0`) still binds. The store's test `every_statement_prepares` prepares every
//! statement of both backends against its schema.

use std::borrow::Cow;
use std::fmt;

use crate::error::{Error, Result};

/// Which SQL dialect a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// SQLite, through rusqlite.
    Sqlite,
    /// PostgreSQL, through the `postgres` crate.
    #[cfg(feature = "postgres")]
    Postgres,
}

/// A statement's text for each backend, with SQLite's parameter marks (`?1`, `?`).
///
/// Written as `sql!("...")` where both read the same, `sql!(sqlite: "...", postgres: "...")`
/// where they differ, or as a `const` (of `concat!`ed pieces) that the file's `statements()`
/// list names; a text built at run time is [`Sql::built`], in a function that list calls with a
/// representative input. The [`Connection`] runs nothing else (outside tests), so that the test
/// `every_statement_prepares` reaches every statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sql {
    sqlite: Cow<'static, str>,
    postgres: Cow<'static, str>,
}

impl Sql {
    /// A statement that reads the same on both backends.
    pub(crate) const fn same(text: &'static str) -> Sql {
        Sql {
            sqlite: Cow::Borrowed(text),
            postgres: Cow::Borrowed(text),
        }
    }

    /// A statement spelled for each backend.
    pub(crate) const fn new(sqlite: &'static str, postgres: &'static str) -> Sql {
        Sql {
            sqlite: Cow::Borrowed(sqlite),
            postgres: Cow::Borrowed(postgres),
        }
    }

    /// A statement that only PostgreSQL runs (the SQLite text is empty).
    pub(crate) const fn postgres_only(text: &'static str) -> Sql {
        Sql::new("", text)
    }

    /// A statement that only SQLite runs (the PostgreSQL text is empty).
    pub(crate) const fn sqlite_only(text: &'static str) -> Sql {
        Sql::new(text, "")
    }

    /// A statement built at run time (a list of queues, of ids), spelled for each backend.
    pub(crate) fn built(sqlite: String, postgres: String) -> Sql {
        Sql {
            sqlite: Cow::Owned(sqlite),
            postgres: Cow::Owned(postgres),
        }
    }

    /// A statement built at run time that reads the same on both backends.
    pub(crate) fn built_same(text: String) -> Sql {
        Sql::built(text.clone(), text)
    }

    /// SQLite's text.
    #[cfg(test)]
    pub(crate) fn sqlite(&self) -> &str {
        &self.sqlite
    }

    /// PostgreSQL's text, with SQLite's marks ([`numbered_marks`] rewrites them).
    #[cfg(all(test, feature = "postgres"))]
    pub(crate) fn postgres(&self) -> &str {
        &self.postgres
    }
}

/// What a [`Connection`] runs: an [`Sql`]; in tests, a text too, the same on both backends.
pub(crate) trait Text {
    /// The text for `dialect`.
    fn text(&self, dialect: Dialect) -> &str;
}

impl Text for Sql {
    fn text(&self, dialect: Dialect) -> &str {
        match dialect {
            Dialect::Sqlite => &self.sqlite,
            #[cfg(feature = "postgres")]
            Dialect::Postgres => &self.postgres,
        }
    }
}

#[cfg(test)]
impl Text for str {
    fn text(&self, _: Dialect) -> &str {
        self
    }
}

#[cfg(test)]
impl Text for String {
    fn text(&self, _: Dialect) -> &str {
        self
    }
}

/// `sql!("...")`: a `&'static` [`Sql`] that reads the same on both backends;
/// `sql!(sqlite: "...", postgres: "...")`: one spelled for each; `sql!(postgres: "...")`, one
/// that only that backend runs. Only literals, so that the
/// test `every_statement_prepares` finds every one in the source.
macro_rules! sql {
    ($text:literal) => {
        const { &$crate::store::db::Sql::same($text) }
    };
    (sqlite: $sqlite:literal, postgres: $postgres:literal $(,)?) => {
        const { &$crate::store::db::Sql::new($sqlite, $postgres) }
    };
    (postgres: $postgres:literal $(,)?) => {
        const { &$crate::store::db::Sql::postgres_only($postgres) }
    };
    (sqlite: $sqlite:literal $(,)?) => {
        const { &$crate::store::db::Sql::sqlite_only($sqlite) }
    };
}
pub(crate) use sql;

/// A store connection: SQLite or PostgreSQL.
pub(crate) enum Connection {
    /// A SQLite connection.
    Sqlite(rusqlite::Connection),
    /// A PostgreSQL connection, with its prepared statements.
    #[cfg(feature = "postgres")]
    Postgres(Box<pg::Conn>),
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Connection({:?})", self.dialect())
    }
}

impl From<rusqlite::Connection> for Connection {
    fn from(conn: rusqlite::Connection) -> Connection {
        Connection::Sqlite(conn)
    }
}

impl Connection {
    /// The dialect this connection speaks.
    pub(crate) fn dialect(&self) -> Dialect {
        match self {
            Connection::Sqlite(_) => Dialect::Sqlite,
            #[cfg(feature = "postgres")]
            Connection::Postgres(_) => Dialect::Postgres,
        }
    }

    /// The SQLite connection under this one, for what only SQLite has (PRAGMAs, the WAL, the
    /// file); `None` on PostgreSQL.
    pub(crate) fn sqlite(&self) -> Option<&rusqlite::Connection> {
        match self {
            Connection::Sqlite(c) => Some(c),
            #[cfg(feature = "postgres")]
            Connection::Postgres(_) => None,
        }
    }

    /// The SQLite connection under this one, for `what`, an operation only a SQLite file has;
    /// [`Error::SqliteOnly`] on PostgreSQL.
    pub(crate) fn sqlite_only(&self, what: &'static str) -> Result<&rusqlite::Connection> {
        self.sqlite().ok_or(Error::SqliteOnly(what))
    }

    /// A statement, prepared once and kept for the next call with the same text.
    pub(crate) fn prepare_cached<S: Text + ?Sized>(&self, sql: &S) -> Result<Statement<'_>> {
        let text = sql.text(self.dialect());
        match self {
            Connection::Sqlite(c) => Ok(Statement::Sqlite(Stmt::Cached(c.prepare_cached(text)?))),
            #[cfg(feature = "postgres")]
            Connection::Postgres(c) => Ok(Statement::Postgres(c.statement(text))),
        }
    }

    /// A statement prepared for this use only: for texts built at run time that would crowd
    /// the cache. (PostgreSQL keeps every statement: its cache is per text, and texts built
    /// at run time come from a few shapes.)
    pub(crate) fn prepare<S: Text + ?Sized>(&self, sql: &S) -> Result<Statement<'_>> {
        let text = sql.text(self.dialect());
        match self {
            Connection::Sqlite(c) => Ok(Statement::Sqlite(Stmt::Once(c.prepare(text)?))),
            #[cfg(feature = "postgres")]
            Connection::Postgres(c) => Ok(Statement::Postgres(c.statement(text))),
        }
    }

    /// Runs one statement and returns how many rows it changed.
    pub(crate) fn execute<S: Text + ?Sized, P: Params>(&self, sql: &S, params: P) -> Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }

    /// Runs a query and maps its first row; an error when it has none.
    pub(crate) fn query_row<S: Text + ?Sized, T, P: Params>(
        &self,
        sql: &S,
        params: P,
        f: impl FnOnce(&Row<'_>) -> Result<T>,
    ) -> Result<T> {
        self.prepare_cached(sql)?.query_row(params, f)
    }

    /// Runs statements separated by semicolons, with no parameters and no rows.
    pub(crate) fn execute_batch(&self, sql: &str) -> Result<()> {
        match self {
            Connection::Sqlite(c) => Ok(c.execute_batch(sql)?),
            #[cfg(feature = "postgres")]
            Connection::Postgres(c) => c.batch(sql),
        }
    }

    /// Opens a write transaction: SQLite's `BEGIN IMMEDIATE`, which takes the write lock now
    /// (so that a busy database fails here, before any work); PostgreSQL's `BEGIN`, at READ
    /// COMMITTED, whose guarded UPDATEs re-check their guard against a row changed meanwhile.
    pub(crate) fn begin(&self) -> Result<()> {
        match self {
            Connection::Sqlite(c) => {
                c.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
                Ok(())
            }
            #[cfg(feature = "postgres")]
            Connection::Postgres(c) => c.batch("BEGIN"),
        }
    }

    /// Runs a statement with no parameters and no rows that runs often (`COMMIT`, a
    /// savepoint's): cached on SQLite, sent as a simple query on PostgreSQL.
    pub(crate) fn command(&self, sql: &str) -> Result<()> {
        match self {
            Connection::Sqlite(c) => {
                c.prepare_cached(sql)?.execute([])?;
                Ok(())
            }
            #[cfg(feature = "postgres")]
            Connection::Postgres(c) => c.batch(sql),
        }
    }

    /// Runs `f` in one read-only transaction: one consistent snapshot of the database. On
    /// SQLite a deferred transaction, which in WAL mode neither blocks a writer nor waits for
    /// one; on PostgreSQL a `REPEATABLE READ READ ONLY` one.
    pub(crate) fn snapshot<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let begin = match self.dialect() {
            Dialect::Sqlite => "BEGIN DEFERRED",
            #[cfg(feature = "postgres")]
            Dialect::Postgres => "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
        };
        self.execute_batch(begin)?;
        let result = f(self);
        // Only reads were made: a rollback ends the snapshot as a commit would, and its own
        // failure adds nothing to `f`'s result.
        let _ = self.execute_batch("ROLLBACK");
        result
    }

    /// The time to act at, in ms since the epoch: `given` (the caller's clock) on SQLite, whose
    /// database lives on the one host that reads it. On PostgreSQL the server's clock, as
    /// runners on hosts whose clocks differ share its leases: read once per transaction, so
    /// that one transaction acts at one time, as on SQLite. (A store opened with
    /// `OpenOptions::given_times` uses `given` on PostgreSQL too: tests that drive time.)
    pub(crate) fn now(&self, given: i64) -> Result<i64> {
        match self {
            Connection::Sqlite(_) => Ok(given),
            #[cfg(feature = "postgres")]
            Connection::Postgres(c) => c.now(given),
        }
    }

    /// Announces `what` to the runners listening on PostgreSQL (`leasehold_wake`);
    /// nothing on SQLite, whose runners are poked through sockets beside the file.
    pub(crate) fn announce(&self, what: &str) -> Result<()> {
        match self {
            Connection::Sqlite(_) => {
                let _ = what;
                Ok(())
            }
            #[cfg(feature = "postgres")]
            Connection::Postgres(c) => c.announce(what),
        }
    }

    /// Whether no transaction is open: after a failed write, whether the database already
    /// rolled the transaction back.
    pub(crate) fn is_autocommit(&self) -> bool {
        match self {
            Connection::Sqlite(c) => c.is_autocommit(),
            #[cfg(feature = "postgres")]
            Connection::Postgres(c) => !c.in_transaction(),
        }
    }
}

/// A prepared statement of either backend.
pub(crate) enum Statement<'c> {
    /// SQLite's.
    Sqlite(Stmt<'c>),
    /// PostgreSQL's: the text, prepared at its first run with its values' types.
    #[cfg(feature = "postgres")]
    Postgres(pg::Statement<'c>),
}

/// A SQLite statement, from the cache or not.
pub(crate) enum Stmt<'c> {
    Cached(rusqlite::CachedStatement<'c>),
    Once(rusqlite::Statement<'c>),
}

impl<'c> Stmt<'c> {
    fn get(&mut self) -> &mut rusqlite::Statement<'c> {
        match self {
            Stmt::Cached(s) => s,
            Stmt::Once(s) => s,
        }
    }
}

impl<'c> Statement<'c> {
    /// The SQLite statement under this one (for its counters); `None` on PostgreSQL.
    #[cfg(test)]
    pub(crate) fn sqlite(&mut self) -> Option<&mut rusqlite::Statement<'c>> {
        match self {
            Statement::Sqlite(s) => Some(s.get()),
            #[cfg(feature = "postgres")]
            Statement::Postgres(_) => None,
        }
    }

    /// Runs the statement; how many rows it changed.
    pub(crate) fn execute<P: Params>(&mut self, params: P) -> Result<usize> {
        let values = params.values()?;
        match self {
            Statement::Sqlite(s) => Ok(s.get().execute(rusqlite::params_from_iter(values))?),
            #[cfg(feature = "postgres")]
            Statement::Postgres(s) => s.execute(&values),
        }
    }

    /// The first row, mapped; [`Error::NoRows`] when there is none.
    pub(crate) fn query_row<T, P: Params>(
        &mut self,
        params: P,
        f: impl FnOnce(&Row<'_>) -> Result<T>,
    ) -> Result<T> {
        let mut rows = self.query(params)?;
        match rows.next()? {
            Some(row) => f(&row),
            None => Err(Error::NoRows),
        }
    }

    /// Every row, mapped. The rows are read as they are mapped on SQLite, all at once on
    /// PostgreSQL; the first error ends the iteration.
    pub(crate) fn query_map<T, P: Params, F: FnMut(&Row<'_>) -> Result<T>>(
        &mut self,
        params: P,
        mut f: F,
    ) -> Result<std::vec::IntoIter<Result<T>>> {
        let mut rows = self.query(params)?;
        let mut out = Vec::new();
        loop {
            match rows.next() {
                Ok(Some(row)) => {
                    let mapped = f(&row);
                    let failed = mapped.is_err();
                    out.push(mapped);
                    if failed {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    out.push(Err(e));
                    break;
                }
            }
        }
        Ok(out.into_iter())
    }

    /// The rows, to step through with [`Rows::next`].
    pub(crate) fn query<P: Params>(&mut self, params: P) -> Result<Rows<'_>> {
        let values = params.values()?;
        match self {
            Statement::Sqlite(s) => Ok(Rows::Sqlite(
                s.get().query(rusqlite::params_from_iter(values))?,
            )),
            #[cfg(feature = "postgres")]
            Statement::Postgres(s) => Ok(Rows::Postgres(s.query(&values)?.into_iter(), None)),
        }
    }
}

/// The rows of a query.
pub(crate) enum Rows<'s> {
    Sqlite(rusqlite::Rows<'s>),
    #[cfg(feature = "postgres")]
    Postgres(std::vec::IntoIter<postgres::Row>, Option<postgres::Row>),
}

impl Rows<'_> {
    /// The next row, or `None` after the last.
    pub(crate) fn next(&mut self) -> Result<Option<Row<'_>>> {
        match self {
            Rows::Sqlite(r) => Ok(r.next()?.map(Row::Sqlite)),
            #[cfg(feature = "postgres")]
            Rows::Postgres(it, current) => {
                *current = it.next();
                Ok(current.as_ref().map(Row::Postgres))
            }
        }
    }
}

/// One row of a query's result.
#[derive(Clone, Copy)]
pub(crate) enum Row<'r> {
    Sqlite(&'r rusqlite::Row<'r>),
    #[cfg(feature = "postgres")]
    Postgres(&'r postgres::Row),
}

impl Row<'_> {
    /// Column `i` (from 0) as a `T`.
    pub(crate) fn get<I: ColumnIndex, T: FromSql>(&self, i: I) -> Result<T> {
        let i = i.index();
        match self {
            Row::Sqlite(r) => T::from_sqlite(r.get_ref(i)?).map_err(|e| {
                Error::Sqlite(rusqlite::Error::FromSqlConversionFailure(
                    i,
                    r.get_ref(i)
                        .map(|v| v.data_type())
                        .unwrap_or(rusqlite::types::Type::Null),
                    e.into(),
                ))
            }),
            #[cfg(feature = "postgres")]
            Row::Postgres(r) => T::from_pg(r, i),
        }
    }
}

/// A column's position. Only `usize`, so that a literal `0` is one.
pub(crate) trait ColumnIndex {
    fn index(self) -> usize;
}

impl ColumnIndex for usize {
    fn index(self) -> usize {
        self
    }
}

/// A value bound to a statement's parameter, borrowed from the caller.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ValueRef<'a> {
    /// NULL of a kind (its type, for PostgreSQL).
    Null(#[cfg_attr(not(feature = "postgres"), allow(dead_code))] Kind),
    Int(i64),
    Real(f64),
    Text(&'a str),
    Blob(&'a [u8]),
}

/// The kind of a bound value: what PostgreSQL prepares its parameter as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Int,
    Real,
    Text,
    Blob,
}

impl ValueRef<'_> {
    /// This value's kind.
    #[cfg(feature = "postgres")]
    pub(crate) fn kind(&self) -> Kind {
        match self {
            ValueRef::Null(k) => *k,
            ValueRef::Int(_) => Kind::Int,
            ValueRef::Real(_) => Kind::Real,
            ValueRef::Text(_) => Kind::Text,
            ValueRef::Blob(_) => Kind::Blob,
        }
    }
}

impl rusqlite::ToSql for ValueRef<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef as V};
        Ok(ToSqlOutput::Borrowed(match *self {
            ValueRef::Null(_) => V::Null,
            ValueRef::Int(i) => V::Integer(i),
            ValueRef::Real(r) => V::Real(r),
            ValueRef::Text(t) => V::Text(t.as_bytes()),
            ValueRef::Blob(b) => V::Blob(b),
        }))
    }
}

/// An owned value, for parameter lists built at run time ([`params_from_iter`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    /// A NULL (tests bind one; no statement of the store builds one at run time yet).
    #[cfg_attr(not(test), allow(dead_code))]
    Null(Kind),
    Int(i64),
    Text(String),
}

impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::Int(v)
    }
}

impl From<String> for Value {
    fn from(v: String) -> Value {
        Value::Text(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::Text(v.to_owned())
    }
}

/// What can be bound to a parameter.
pub(crate) trait ToSql {
    /// The value to bind.
    fn to_value(&self) -> Result<ValueRef<'_>>;
}

/// The kind of a type's values, which a NULL of it (an `Option`'s `None`) is bound as.
pub(crate) trait Kinded {
    const KIND: Kind;
}

macro_rules! int_to_sql {
    ($($t:ty),*) => {$(
        impl ToSql for $t {
            fn to_value(&self) -> Result<ValueRef<'_>> {
                Ok(ValueRef::Int(i64::from(*self)))
            }
        }
        impl Kinded for $t {
            const KIND: Kind = Kind::Int;
        }
    )*};
}
int_to_sql!(i64, i32, u32, u16, u8, bool);

impl ToSql for u64 {
    fn to_value(&self) -> Result<ValueRef<'_>> {
        i64::try_from(*self)
            .map(ValueRef::Int)
            .map_err(|_| Error::Column(format!("{self} does not fit a 64-bit signed integer")))
    }
}

impl ToSql for usize {
    fn to_value(&self) -> Result<ValueRef<'_>> {
        i64::try_from(*self)
            .map(ValueRef::Int)
            .map_err(|_| Error::Column(format!("{self} does not fit a 64-bit signed integer")))
    }
}

impl ToSql for f64 {
    fn to_value(&self) -> Result<ValueRef<'_>> {
        Ok(ValueRef::Real(*self))
    }
}

impl ToSql for str {
    fn to_value(&self) -> Result<ValueRef<'_>> {
        Ok(ValueRef::Text(self))
    }
}

impl ToSql for String {
    fn to_value(&self) -> Result<ValueRef<'_>> {
        Ok(ValueRef::Text(self))
    }
}

impl ToSql for [u8] {
    fn to_value(&self) -> Result<ValueRef<'_>> {
        Ok(ValueRef::Blob(self))
    }
}

impl ToSql for Vec<u8> {
    fn to_value(&self) -> Result<ValueRef<'_>> {
        Ok(ValueRef::Blob(self))
    }
}

impl ToSql for Value {
    fn to_value(&self) -> Result<ValueRef<'_>> {
        Ok(match self {
            Value::Null(k) => ValueRef::Null(*k),
            Value::Int(i) => ValueRef::Int(*i),
            Value::Text(t) => ValueRef::Text(t),
        })
    }
}

impl<T: ToSql + Kinded> ToSql for Option<T> {
    fn to_value(&self) -> Result<ValueRef<'_>> {
        match self {
            Some(v) => v.to_value(),
            None => Ok(ValueRef::Null(T::KIND)),
        }
    }
}

macro_rules! kinded {
    ($($t:ty => $k:ident),*) => {$(
        impl Kinded for $t {
            const KIND: Kind = Kind::$k;
        }
    )*};
}
kinded!(u64 => Int, usize => Int, f64 => Real, str => Text, String => Text, [u8] => Blob, Vec<u8> => Blob);

impl<T: Kinded + ?Sized> Kinded for &T {
    const KIND: Kind = T::KIND;
}

impl<T: ToSql + ?Sized> ToSql for &T {
    fn to_value(&self) -> Result<ValueRef<'_>> {
        (**self).to_value()
    }
}

/// A statement's parameters.
pub(crate) trait Params {
    /// The values to bind, in order.
    fn values(&self) -> Result<Vec<ValueRef<'_>>>;
}

impl Params for &[&dyn ToSql] {
    fn values(&self) -> Result<Vec<ValueRef<'_>>> {
        self.iter().map(|v| v.to_value()).collect()
    }
}

impl<T: ToSql, const N: usize> Params for [T; N] {
    fn values(&self) -> Result<Vec<ValueRef<'_>>> {
        self.iter().map(|v| v.to_value()).collect()
    }
}

/// Parameters from a list built at run time.
pub(crate) struct ParamsFromIter<T>(Vec<T>);

/// Parameters from a list built at run time (as rusqlite's `params_from_iter`).
pub(crate) fn params_from_iter<T: ToSql>(values: impl IntoIterator<Item = T>) -> ParamsFromIter<T> {
    ParamsFromIter(values.into_iter().collect())
}

impl<T: ToSql> Params for ParamsFromIter<T> {
    fn values(&self) -> Result<Vec<ValueRef<'_>>> {
        self.0.iter().map(|v| v.to_value()).collect()
    }
}

/// `params![a, b, c]`: a statement's parameters, each anything [`ToSql`].
macro_rules! params {
    () => {
        &[] as &[&dyn $crate::store::db::ToSql]
    };
    ($($p:expr),+ $(,)?) => {
        &[$(&$p as &dyn $crate::store::db::ToSql),+] as &[&dyn $crate::store::db::ToSql]
    };
}
pub(crate) use params;

/// What a column can be read as.
pub(crate) trait FromSql: Sized {
    /// From a SQLite value.
    fn from_sqlite(v: rusqlite::types::ValueRef<'_>) -> std::result::Result<Self, String>;
    /// From column `i` of a PostgreSQL row.
    #[cfg(feature = "postgres")]
    fn from_pg(row: &postgres::Row, i: usize) -> Result<Self>;
}

impl FromSql for i64 {
    fn from_sqlite(v: rusqlite::types::ValueRef<'_>) -> std::result::Result<Self, String> {
        v.as_i64().map_err(|e| e.to_string())
    }
    #[cfg(feature = "postgres")]
    fn from_pg(row: &postgres::Row, i: usize) -> Result<Self> {
        pg::int(row, i)?.ok_or_else(|| pg::null(row, i))
    }
}

macro_rules! narrow_from_sql {
    ($($t:ty),*) => {$(
        impl FromSql for $t {
            fn from_sqlite(v: rusqlite::types::ValueRef<'_>) -> std::result::Result<Self, String> {
                let wide = v.as_i64().map_err(|e| e.to_string())?;
                <$t>::try_from(wide).map_err(|_| format!("{wide} is out of range"))
            }
            #[cfg(feature = "postgres")]
            fn from_pg(row: &postgres::Row, i: usize) -> Result<Self> {
                let wide = i64::from_pg(row, i)?;
                <$t>::try_from(wide)
                    .map_err(|_| Error::Column(format!("column {i}: {wide} is out of range")))
            }
        }
    )*};
}
narrow_from_sql!(i32, u32, u64, usize, u16, u8);

impl FromSql for bool {
    fn from_sqlite(v: rusqlite::types::ValueRef<'_>) -> std::result::Result<Self, String> {
        Ok(v.as_i64().map_err(|e| e.to_string())? != 0)
    }
    #[cfg(feature = "postgres")]
    fn from_pg(row: &postgres::Row, i: usize) -> Result<Self> {
        Ok(i64::from_pg(row, i)? != 0)
    }
}

impl FromSql for f64 {
    fn from_sqlite(v: rusqlite::types::ValueRef<'_>) -> std::result::Result<Self, String> {
        match v {
            rusqlite::types::ValueRef::Integer(i) => Ok(i as f64),
            other => other.as_f64().map_err(|e| e.to_string()),
        }
    }
    #[cfg(feature = "postgres")]
    fn from_pg(row: &postgres::Row, i: usize) -> Result<Self> {
        pg::real(row, i)?.ok_or_else(|| pg::null(row, i))
    }
}

impl FromSql for String {
    fn from_sqlite(v: rusqlite::types::ValueRef<'_>) -> std::result::Result<Self, String> {
        Ok(v.as_str().map_err(|e| e.to_string())?.to_owned())
    }
    #[cfg(feature = "postgres")]
    fn from_pg(row: &postgres::Row, i: usize) -> Result<Self> {
        pg::text(row, i)?.ok_or_else(|| pg::null(row, i))
    }
}

impl FromSql for Vec<u8> {
    fn from_sqlite(v: rusqlite::types::ValueRef<'_>) -> std::result::Result<Self, String> {
        Ok(v.as_blob().map_err(|e| e.to_string())?.to_vec())
    }
    #[cfg(feature = "postgres")]
    fn from_pg(row: &postgres::Row, i: usize) -> Result<Self> {
        Ok(row.try_get::<_, Vec<u8>>(i)?)
    }
}

/// Text, or bytes read as text, with what is not UTF-8 replaced (U+FFFD): the tail of an
/// output, whose cut may fall inside a character, shown rather than refused.
pub(crate) struct LossyText(pub(crate) String);

impl FromSql for LossyText {
    fn from_sqlite(v: rusqlite::types::ValueRef<'_>) -> std::result::Result<Self, String> {
        match v {
            rusqlite::types::ValueRef::Text(b) | rusqlite::types::ValueRef::Blob(b) => {
                Ok(LossyText(String::from_utf8_lossy(b).into_owned()))
            }
            other => Err(format!("{} is not text", other.data_type())),
        }
    }
    #[cfg(feature = "postgres")]
    fn from_pg(row: &postgres::Row, i: usize) -> Result<Self> {
        pg::lossy_text(row, i)?
            .map(LossyText)
            .ok_or_else(|| pg::null(row, i))
    }
}

impl<T: FromSql> FromSql for Option<T> {
    fn from_sqlite(v: rusqlite::types::ValueRef<'_>) -> std::result::Result<Self, String> {
        match v {
            rusqlite::types::ValueRef::Null => Ok(None),
            v => T::from_sqlite(v).map(Some),
        }
    }
    #[cfg(feature = "postgres")]
    fn from_pg(row: &postgres::Row, i: usize) -> Result<Self> {
        if pg::is_null(row, i)? {
            Ok(None)
        } else {
            T::from_pg(row, i).map(Some)
        }
    }
}

/// Rows into tuples (`|r| r.try_into()`), as rusqlite has.
macro_rules! tuple_from_row {
    ($($name:ident $i:tt),+) => {
        impl<$($name: FromSql),+> TryFrom<&Row<'_>> for ($($name,)+) {
            type Error = Error;
            fn try_from(r: &Row<'_>) -> Result<Self> {
                Ok(($(r.get::<_, $name>($i)?,)+))
            }
        }
    };
}
tuple_from_row!(A 0);
tuple_from_row!(A 0, B 1);
tuple_from_row!(A 0, B 1, C 2);
tuple_from_row!(A 0, B 1, C 2, D 3);
tuple_from_row!(A 0, B 1, C 2, D 3, E 4);
tuple_from_row!(A 0, B 1, C 2, D 3, E 4, F 5);
tuple_from_row!(A 0, B 1, C 2, D 3, E 4, F 5, G 6);
tuple_from_row!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7);

/// What a query that must return a row says when it returned none, as `Option`.
pub(crate) trait OptionalExtension<T> {
    /// `None` for no row, the error for any other failure.
    fn optional(self) -> Result<Option<T>>;
}

impl<T> OptionalExtension<T> for Result<T> {
    fn optional(self) -> Result<Option<T>> {
        match self {
            Ok(v) => Ok(Some(v)),
            Err(Error::NoRows) | Err(Error::Sqlite(rusqlite::Error::QueryReturnedNoRows)) => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

/// `sql` with SQLite's parameter marks (`?3`, or a bare `?` numbered after the highest so
/// far) written as PostgreSQL's (`$3`). Marks inside quoted strings, quoted names and
/// comments are left alone.
#[cfg(any(test, feature = "postgres"))]
pub(crate) fn numbered_marks(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut highest = 0u32;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' => {
                out.push(c);
                for d in chars.by_ref() {
                    out.push(d);
                    if d == c {
                        break;
                    }
                }
            }
            '-' if chars.peek() == Some(&'-') => {
                out.push(c);
                for d in chars.by_ref() {
                    out.push(d);
                    if d == '\n' {
                        break;
                    }
                }
            }
            '?' => {
                let mut digits = String::new();
                while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                    digits.push(*d);
                    chars.next();
                }
                let n = if digits.is_empty() {
                    highest + 1
                } else {
                    // A run of digits too long for a u32 is no SQLite parameter either.
                    digits.parse().unwrap_or(u32::MAX)
                };
                highest = highest.max(n);
                out.push('$');
                out.push_str(&n.to_string());
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(feature = "postgres")]
pub(crate) mod pg;
#[cfg(feature = "postgres")]
pub(crate) mod tls;

#[cfg(test)]
mod tests {
    use super::numbered_marks;

    #[test]
    fn marks_are_numbered_as_sqlite_numbers_them() {
        assert_eq!(numbered_marks("a = ?1 AND b = ?2"), "a = $1 AND b = $2");
        assert_eq!(numbered_marks("a = ? AND b = ?"), "a = $1 AND b = $2");
        assert_eq!(numbered_marks("a = ?3 AND b = ?"), "a = $3 AND b = $4");
        assert_eq!(
            numbered_marks("x = '?1' AND \"q?\" = ?1 -- ?2\n AND y = ?2"),
            "x = '?1' AND \"q?\" = $1 -- ?2\n AND y = $2"
        );
    }
}
