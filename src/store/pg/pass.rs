//! The password file, read as libpq reads it: `PGPASSFILE`, else `~/.pgpass`.
//!
//! Each line is `hostname:port:database:username:password`. Each of the first four fields is a
//! literal or `*`, which matches anything; `\:` and `\\` stand for `:` and `\`. The first line
//! that matches gives the password. Lines that begin with `#` are comments. A file that its
//! group or others may read or write is ignored, with a warning, as libpq ignores it.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

/// Where the password file is: `PGPASSFILE`, else `~/.pgpass`.
fn path() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    match var("PGPASSFILE") {
        Some(file) => Some(PathBuf::from(file)),
        None => Some(PathBuf::from(var("HOME")?).join(".pgpass")),
    }
}

/// The password the file gives for a connection to `host` (a host name, or a Unix socket's
/// folder) and `port` as `user` to `dbname`; `None` when there is no file, it is not this
/// user's alone, or no line matches.
pub(crate) fn lookup(host: &str, port: u16, dbname: &str, user: &str) -> Option<String> {
    let path = path()?;
    let meta = std::fs::metadata(&path).ok()?;
    if !meta.is_file() {
        log::warn!(
            "password file {} is not a plain file: not read",
            path.display()
        );
        return None;
    }
    if meta.permissions().mode() & 0o077 != 0 {
        log::warn!(
            "password file {} has group or world access; permissions should be u=rw (0600) \
             or less: not read",
            path.display()
        );
        return None;
    }
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) => {
            log::warn!("cannot read the password file {}: {e}", path.display());
            return None;
        }
    };
    find(&text, host, port, dbname, user)
}

/// The password of the first line of `text` that matches (see the module's docs).
pub(super) fn find(text: &str, host: &str, port: u16, dbname: &str, user: &str) -> Option<String> {
    // libpq: a socket in the default folder is `localhost` to the file.
    let local = host.starts_with('/')
        && ["/tmp", "/var/run/postgresql", "/run/postgresql"].contains(&host.trim_end_matches('/'));
    let port = port.to_string();
    text.lines().find_map(|line| {
        let line = line.trim_end_matches('\r');
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let fields = split(line);
        let [h, p, d, u, password] = fields.as_slice() else {
            return None;
        };
        let matches = |field: &Field, value: &str| field.any || field.text == value;
        let host_matches = matches(h, host) || local && matches(h, "localhost");
        (host_matches && matches(p, &port) && matches(d, dbname) && matches(u, user))
            .then(|| password.text.clone())
    })
}

/// One field of a line: its text with the escapes taken out, and whether it was a bare `*`.
struct Field {
    text: String,
    any: bool,
}

/// The fields of `line`, split at each `:` that no `\` escapes. The fifth field, the password,
/// ends at the next unescaped `:` too, as in libpq.
fn split(line: &str) -> Vec<Field> {
    let mut fields = Vec::new();
    let mut text = String::new();
    let mut raw = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                raw.push(c);
                if let Some(next) = chars.next() {
                    raw.push(next);
                    text.push(next);
                }
            }
            ':' if fields.len() < 4 => {
                fields.push(Field {
                    any: raw == "*",
                    text: std::mem::take(&mut text),
                });
                raw.clear();
            }
            ':' => break,
            c => {
                raw.push(c);
                text.push(c);
            }
        }
    }
    fields.push(Field {
        any: raw == "*" && fields.len() < 4,
        text,
    });
    fields
}

#[cfg(test)]
mod tests {
    use super::find;

    #[test]
    fn the_first_matching_line_gives_the_password_with_escapes_and_wildcards() {
        let file = "\
# a comment
other:5432:*:*:no
db.example:*:jobs:app:first\\:half\\\\x
db.example:*:*:app:second
*:*:*:*:any
";
        assert_eq!(
            find(file, "db.example", 5432, "jobs", "app").as_deref(),
            Some("first:half\\x")
        );
        assert_eq!(
            find(file, "db.example", 6000, "other", "app").as_deref(),
            Some("second")
        );
        assert_eq!(find(file, "elsewhere", 1, "d", "u").as_deref(), Some("any"));
        assert_eq!(find("h:1:d:u:p", "h", 2, "d", "u"), None);
        // An escaped `*` is a literal star, not a wildcard.
        assert_eq!(find("\\*:*:*:*:p", "h", 1, "d", "u"), None);
        assert_eq!(find("\\*:*:*:*:p", "*", 1, "d", "u").as_deref(), Some("p"));
        // A host field with an escaped colon, and a socket in the default folder as localhost.
        assert_eq!(
            find("a\\:b:*:*:*:p", "a:b", 1, "d", "u").as_deref(),
            Some("p")
        );
        assert_eq!(
            find("localhost:*:*:*:p", "/var/run/postgresql", 1, "d", "u").as_deref(),
            Some("p")
        );
        assert_eq!(find("too:few:fields", "too", 1, "few", "u"), None);
    }
}
