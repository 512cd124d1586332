//! The test that prepares every statement of both backends against its schema, so that a
//! statement that does not parse, or names a column the schema lacks, fails here rather than
//! in a runner.
//!
//! Every statement is an [`Sql`], and the [`Connection`](super::db::Connection) runs nothing
//! else outside tests, so the compiler sees to it that none is written as a bare text. Each is
//! reached in one of three ways, and the test checks that none escapes them:
//! - `sql!(...)` at the call: found in the source (the macro takes only literals);
//! - a `const NAME: Sql`: named in its file's `statements()` list;
//! - a text built at run time (`Sql::built`): its builder is called in that list with a
//!   representative input (a list of queues, of ids).

use std::path::{Path, PathBuf};

use super::db::Sql;

/// Every statement: its place (`file:line` or `module::NAME`) and its texts.
fn every_statement() -> Vec<(String, Sql)> {
    let mut all = from_source()
        .into_iter()
        .map(|(place, sql, _)| (place, sql))
        .collect::<Vec<_>>();
    for (module, list) in listed() {
        all.extend(
            list.into_iter()
                .map(|(name, sql)| (format!("{module}::{name}"), sql)),
        );
    }
    all
}

/// The `statements()` lists of the store's files.
fn listed() -> Vec<(&'static str, Vec<(&'static str, Sql)>)> {
    vec![
        ("batch", super::batch::statements()),
        ("counter", super::counter::statements()),
        ("enqueue", super::enqueue::statements()),
        ("failure", super::failure::statements()),
        ("leader", super::leader::statements()),
        ("lease", super::lease::statements()),
        ("metrics", super::metrics::statements()),
        ("queue", super::queue::statements()),
        ("read", super::read::statements()),
        ("reclaim", super::reclaim::statements()),
        ("retention", super::retention::statements()),
        ("sample", super::sample::statements()),
        ("schedule", super::schedule::statements()),
    ]
}

/// The library's source files.
fn sources() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("the source folder reads") {
            let path = entry.expect("a folder entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut out);
    out.sort();
    out
}

/// `source` with its comments blanked (spaces, newlines kept), so that what a comment says
/// about `sql!` is not read as code; string and character literals are kept whole.
fn without_comments(source: &str) -> String {
    let b = source.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    out.push(b' ');
                    i += 1;
                }
            }
            b'"' => {
                let end = string_end(b, i);
                out.extend_from_slice(&b[i..end]);
                i = end;
            }
            b'r' if b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#') => {
                let end = raw_end(b, i).unwrap_or(i + 1);
                out.extend_from_slice(&b[i..end]);
                i = end;
            }
            b'\'' => {
                // A character literal ('x', '\n', '"'), or a lifetime ('a): copied either way.
                let end = if b.get(i + 1) == Some(&b'\\') {
                    b[i + 2..]
                        .iter()
                        .position(|&c| c == b'\'')
                        .map_or(i + 1, |p| i + 3 + p)
                } else if b.get(i + 2) == Some(&b'\'') {
                    i + 3
                } else {
                    i + 1
                };
                out.extend_from_slice(&b[i..end]);
                i = end;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).expect("blanking comments keeps UTF-8")
}

/// The index just past the string literal that opens at `start` (a `"`).
fn string_end(b: &[u8], start: usize) -> usize {
    let mut i = start + 1;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    b.len()
}

/// The index just past the raw string literal that opens at `start` (`r"`, `r#"`), if it is one.
fn raw_end(b: &[u8], start: usize) -> Option<usize> {
    let hashes = b[start + 1..].iter().take_while(|&&c| c == b'#').count();
    let open = start + 1 + hashes;
    if b.get(open) != Some(&b'"') {
        return None;
    }
    let mut close = vec![b'"'];
    close.extend(std::iter::repeat_n(b'#', hashes));
    b[open + 1..]
        .windows(close.len())
        .position(|w| w == close.as_slice())
        .map(|p| open + 1 + p + close.len())
}

/// The value of the string literal at the start of `s` (after blanks), and the rest of `s`.
fn literal(s: &str) -> Option<(String, &str)> {
    let s = s.trim_start();
    let b = s.as_bytes();
    if b.first() == Some(&b'r') {
        let end = raw_end(b, 0)?;
        let hashes = b[1..].iter().take_while(|&&c| c == b'#').count();
        return Some((s[2 + hashes..end - 1 - hashes].to_owned(), &s[end..]));
    }
    if b.first() != Some(&b'"') {
        return None;
    }
    let end = string_end(b, 0);
    let mut value = String::new();
    let mut chars = s[1..end - 1].chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            value.push(c);
            continue;
        }
        match chars.next()? {
            'n' => value.push('\n'),
            't' => value.push('\t'),
            'r' => value.push('\r'),
            '0' => value.push('\0'),
            '\n' => {
                while chars.peek().is_some_and(|c| c.is_whitespace()) {
                    chars.next();
                }
            }
            other => value.push(other),
        }
    }
    Some((value, &s[end..]))
}

/// What follows `word` (and a colon) at the start of `s`, after blanks.
fn after_label<'s>(s: &'s str, word: &str) -> Option<&'s str> {
    s.trim_start()
        .strip_prefix(word)?
        .trim_start()
        .strip_prefix(':')
}

/// The arguments of one `sql!(...)`, from just after its parenthesis.
fn sql_arguments(s: &str) -> Option<Sql> {
    let leak = |t: String| -> &'static str { Box::leak(t.into_boxed_str()) };
    let end = |rest: &str| {
        let rest = rest.trim_start();
        let rest = rest.strip_prefix(',').unwrap_or(rest);
        rest.trim_start().starts_with(')')
    };
    if let Some(rest) = after_label(s, "sqlite") {
        let (sqlite, rest) = literal(rest)?;
        if end(rest) {
            return Some(Sql::sqlite_only(leak(sqlite)));
        }
        let rest = rest.trim_start().strip_prefix(',')?;
        let (postgres, rest) = literal(after_label(rest, "postgres")?)?;
        return end(rest).then(|| Sql::new(leak(sqlite), leak(postgres)));
    }
    if let Some(rest) = after_label(s, "postgres") {
        let (postgres, rest) = literal(rest)?;
        return end(rest).then(|| Sql::postgres_only(leak(postgres)));
    }
    let (text, rest) = literal(s)?;
    end(rest).then(|| Sql::same(leak(text)))
}

/// Every `sql!(...)` of the library's source, with its place; panics at one that cannot be
/// read (the macro takes only literals, so every one can).
fn from_source() -> Vec<(String, Sql, PathBuf)> {
    let mut found = Vec::new();
    for path in sources() {
        // This file names the macro in its own texts.
        if short(&path) == "store/statements.rs" {
            continue;
        }
        let source = std::fs::read_to_string(&path).expect("a source file reads");
        let code = without_comments(&source);
        for (at, _) in code.match_indices("sql!(") {
            // `to_sql!(` is another macro.
            if code[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
            {
                continue;
            }
            let line = code[..at].matches('\n').count() + 1;
            let place = format!("{}:{line}", short(&path));
            let sql = sql_arguments(&code[at + 5..])
                .unwrap_or_else(|| panic!("{place}: cannot read this sql!(...)"));
            found.push((place, sql, path.clone()));
        }
    }
    found
}

/// `path` from `src/`.
fn short(path: &Path) -> String {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    path.strip_prefix(&src)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The names of the functions (before each `(`) and constants in `listed()`'s places.
#[cfg(feature = "postgres")]
fn listed_names() -> Vec<String> {
    listed()
        .into_iter()
        .flat_map(|(_, list)| list.into_iter().map(|(name, _)| name))
        .map(|name| name.split('(').next().unwrap_or(name).to_owned())
        .collect()
}

/// With the `postgres` feature only: without it the PostgreSQL-only builders are compiled out
/// of the lists, while the source this scans still has them.
#[cfg(feature = "postgres")]
#[test]
fn every_statement_is_reached() {
    let names = listed_names();
    let mut missing = Vec::new();
    let item = regex_lite_items();
    for path in sources() {
        if short(&path) == "store/db.rs" || short(&path) == "store/statements.rs" {
            continue;
        }
        let code = without_comments(&std::fs::read_to_string(&path).expect("a source reads"));
        for (at, what) in item(&code) {
            let line = code[..at].matches('\n').count() + 1;
            if !names.contains(&what) {
                missing.push(format!("{}:{line}: {what}", short(&path)));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "statements no `statements()` list names (add each to its file's list):\n{}",
        missing.join("\n")
    );
}

/// A finder of the statements that a list must name in `code`: each `const NAME: Sql` (its
/// name), and each `Sql::built`/`Sql::built_same` (the function it is built in). Also panics
/// at an `Sql::same`/`Sql::new`/`Sql::..._only` outside a `const` item's value, which no list
/// would reach.
#[cfg(feature = "postgres")]
fn regex_lite_items() -> impl Fn(&str) -> Vec<(usize, String)> {
    |code: &str| {
        let mut out = Vec::new();
        for (at, _) in code.match_indices("const ") {
            let rest = &code[at + 6..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if rest[name.len()..].trim_start().starts_with(": Sql ") {
                out.push((at, name));
            }
        }
        for (at, what) in code.match_indices("Sql::") {
            let call: String = code[at + 5..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let before = &code[..at];
            if call.starts_with("built") {
                let function = before
                    .rmatch_indices("fn ")
                    .next()
                    .map(|(f, _)| {
                        before[f + 3..]
                            .chars()
                            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                            .collect::<String>()
                    })
                    .unwrap_or_default();
                out.push((at, function));
            } else {
                let statement = &before[before.rfind(';').unwrap_or(0)..];
                assert!(
                    statement.contains(": Sql ="),
                    "{what}{call} outside a `const NAME: Sql` item: {}",
                    &code[at..(at + 80).min(code.len())]
                );
            }
        }
        out
    }
}

#[test]
fn every_statement_prepares_on_sqlite() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let store = super::Store::open(dir.path().join("jobs.db")).expect("a store opens");
    let conn = store.conn().sqlite().expect("a SQLite store");
    let mut failed = Vec::new();
    let all = every_statement();
    for (place, sql) in &all {
        if sql.sqlite().is_empty() {
            continue;
        }
        if let Err(e) = conn.prepare(sql.sqlite()) {
            failed.push(format!("{place}: {e}\n{}", sql.sqlite()));
        }
    }
    assert!(all.len() > 150, "only {} statements found", all.len());
    assert!(
        failed.is_empty(),
        "{} of {} statements do not prepare on SQLite:\n{}",
        failed.len(),
        all.len(),
        failed.join("\n\n")
    );
}

#[cfg(feature = "postgres")]
#[test]
fn every_statement_prepares_on_postgres() {
    use postgres::NoTls;

    let server = std::env::var("LEASEHOLD_TEST_PG").unwrap_or_else(|_| {
        panic!(
            "LEASEHOLD_TEST_PG is not set: this test needs a PostgreSQL server; start one \
             with `export LEASEHOLD_TEST_PG=$(bash .ci/pg start)`"
        )
    });
    let name = format!("lh_statements_{}", std::process::id());
    let mut admin = postgres::Client::connect(server.trim(), NoTls).expect("the server answers");
    for command in [
        format!("DROP DATABASE IF EXISTS {name}"),
        format!("CREATE DATABASE {name}"),
    ] {
        admin
            .batch_execute(&command)
            .expect("a database of its own");
    }
    let url = with_database(server.trim(), &name);
    let result = std::panic::catch_unwind(|| {
        // Opening makes the schema.
        drop(super::Store::open(&url).expect("a PostgreSQL store opens"));
        let mut client = postgres::Client::connect(&url, NoTls).expect("the database answers");
        let mut failed = Vec::new();
        let all = every_statement();
        for (place, sql) in &all {
            if sql.postgres().is_empty() {
                continue;
            }
            let text = super::db::numbered_marks(sql.postgres());
            let outcome = prepare_as_the_store_does(&mut client, &text);
            if let Err(e) = outcome {
                let e = e
                    .as_db_error()
                    .map_or(e.to_string(), |d| d.message().to_owned());
                failed.push(format!("{place}: {e}\n{text}"));
            }
        }
        assert!(all.len() > 150, "only {} statements found", all.len());
        assert!(
            failed.is_empty(),
            "{} of {} statements do not prepare on PostgreSQL:\n{}",
            failed.len(),
            all.len(),
            failed.join("\n\n")
        );
    });
    let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

/// `url` naming `database` instead of its own.
#[cfg(feature = "postgres")]
fn with_database(url: &str, database: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let authority = base.find("://").map_or(0, |i| i + 3);
    let server = base[authority..]
        .find('/')
        .map_or(base, |slash| &base[..authority + slash]);
    match query {
        Some(query) => format!("{server}/{database}?{query}"),
        None => format!("{server}/{database}"),
    }
}

/// Prepares `text` as the store would: each parameter's type inferred by the server, except
/// where it cannot infer one (`$2 IS NULL`, `$3 + $5`), which the store's statements leave to
/// the type of the value bound (every integer an `int8`): such a parameter is given `int8`,
/// or `text` where `int8` meets text.
#[cfg(feature = "postgres")]
fn prepare_as_the_store_does(
    client: &mut postgres::Client,
    text: &str,
) -> Result<(), postgres::Error> {
    use postgres::error::SqlState;
    use postgres::types::{Kind, Type};

    // Oid 0: left to the server.
    let inferred = Type::new(String::new(), 0, Kind::Pseudo, String::new());
    let mut types: Vec<Type> = Vec::new();
    loop {
        let e = match client.prepare_typed(text, &types) {
            Ok(_) => return Ok(()),
            Err(e) => e,
        };
        let Some(db) = e.as_db_error() else {
            return Err(e);
        };
        // The parameters the error is about: the one its message names, or those next to
        // where it points (`$3 + $5`: "operator is not unique").
        // A parameter given `int8` that meets text (`worker_id != $1`, `$6::json`) is text.
        let wrong = [SqlState::UNDEFINED_FUNCTION, SqlState::CANNOT_COERCE];
        let (from, to) = if wrong.contains(db.code()) {
            (Type::INT8, Type::TEXT)
        } else {
            (inferred.clone(), Type::INT8)
        };
        let named = match db.code() {
            c if *c == SqlState::INDETERMINATE_DATATYPE || *c == SqlState::AMBIGUOUS_PARAMETER => {
                db.message().to_owned()
            }
            c if *c == SqlState::AMBIGUOUS_FUNCTION || wrong.contains(c) => match db.position() {
                Some(postgres::error::ErrorPosition::Original(at)) => {
                    let at = usize::try_from(*at).unwrap_or(0);
                    let chars: Vec<char> = text.chars().collect();
                    chars[at.saturating_sub(8).min(chars.len())..(at + 8).min(chars.len())]
                        .iter()
                        .collect()
                }
                _ => return Err(e),
            },
            _ => return Err(e),
        };
        let mut changed = false;
        for mark in named.split('$').skip(1) {
            let digits: String = mark.chars().take_while(char::is_ascii_digit).collect();
            let Some(n) = digits.parse::<usize>().ok().filter(|&n| n > 0) else {
                continue;
            };
            if types.len() < n {
                types.resize(n, inferred.clone());
            }
            if types[n - 1] == from {
                types[n - 1] = to.clone();
                changed = true;
            }
        }
        if !changed {
            return Err(e);
        }
    }
}
