//! Who may read the dashboard: a secret made at start (or kept by the operator in a file),
//! exchanged once at `/login` for a cookie, and a Host check against DNS rebinding.
//!
//! Every route but `/healthz` needs the secret: the database is mode 0600, and a page shows
//! what the file holds (argv, environment, output, run tokens) to whoever can connect, which
//! on a shared machine is every local user. `/metrics` also takes it as a bearer token, for
//! Prometheus.
//!
//! The cookie is not the secret but a session value made at start: a browser sends its
//! cookies for 127.0.0.1 to every port of it, so a cookie may reach another local user's
//! server. What it carries then is worth only this process's pages until it exits, not the
//! secret an operator keeps in `--token-file` for Prometheus.

use std::fs::File;
use std::io::Read;
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use anyhow::{Context, bail};

use super::http::{Request, Response};

/// The session cookie's name.
pub const COOKIE: &str = "leasehold_session";
/// Bytes of randomness in a secret made at start, and in the session cookie's value.
const SECRET_BYTES: usize = 32;
/// The shortest secret taken from `--token-file`.
const MIN_SECRET_LEN: usize = 16;
/// The longest secret taken from `--token-file` (it travels in a URL and a cookie).
const MAX_SECRET_LEN: usize = 512;

/// The secret, the session, and the names the Host header may carry.
pub struct Auth {
    secret: String,
    /// The session cookie's value, random for this process.
    session: String,
    /// Names given with `--allow-host` (lowercase), for a reverse proxy.
    allowed_hosts: Vec<String>,
}

/// What a request may see.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It carries the secret (cookie, or bearer where taken).
    Allowed,
    /// It does not.
    Denied,
}

impl Auth {
    /// A new random secret, or the one kept in `token_file`.
    ///
    /// # Errors
    /// When `/dev/urandom` cannot be read, or the file is refused (see [`read_token_file`]).
    pub fn new(token_file: Option<&Path>, allowed_hosts: Vec<String>) -> anyhow::Result<Auth> {
        let secret = match token_file {
            Some(path) => read_token_file(path)?,
            None => super::random_hex(SECRET_BYTES)
                .context("cannot read /dev/urandom for the dashboard's secret")?,
        };
        let session = super::random_hex(SECRET_BYTES)
            .context("cannot read /dev/urandom for the dashboard's session")?;
        Ok(Auth {
            secret,
            session,
            allowed_hosts,
        })
    }

    /// The path and query that exchange the secret for the cookie.
    pub fn login_path(&self) -> String {
        format!("/login?token={}", super::http::percent_encode(&self.secret))
    }

    /// Whether `req` carries the session cookie, or (when `bearer` is true) the secret as
    /// `Authorization: Bearer`.
    pub fn check(&self, req: &Request, bearer: bool) -> Verdict {
        let cookie = req
            .cookies_named(COOKIE)
            .any(|value| same(value.as_bytes(), self.session.as_bytes()));
        let token = bearer
            && req.authorization.as_deref().is_some_and(|a| {
                a.split_once(' ').is_some_and(|(scheme, value)| {
                    scheme.eq_ignore_ascii_case("bearer")
                        && same(value.trim().as_bytes(), self.secret.as_bytes())
                })
            });
        if cookie || token {
            Verdict::Allowed
        } else {
            Verdict::Denied
        }
    }

    /// `GET /login?token=SECRET`: the cookie and a 303 to the overview; 403 without it.
    pub fn login(&self, req: &Request) -> Response {
        let given = req
            .query
            .iter()
            .find(|(k, _)| k == "token")
            .map(|(_, v)| v.as_str());
        if !given.is_some_and(|t| same(t.as_bytes(), self.secret.as_bytes())) {
            return super::error_page(
                403,
                "wrong or missing token: open the URL `leasehold serve` printed on its standard output",
            );
        }
        // The redirect takes the secret out of the address bar.
        Response::see_other("/".to_string()).header(
            "Set-Cookie",
            format!(
                "{COOKIE}={}; HttpOnly; SameSite=Strict; Path=/",
                self.session
            ),
        )
    }

    /// Whether `host` (a Host header) names this server: an IP address, `localhost`, or a name
    /// given with `--allow-host`, each with or without a port. A request without a Host
    /// (HTTP/1.0) passes: a browser always sends one, so DNS rebinding cannot omit it.
    pub fn host_allowed(&self, host: Option<&str>) -> bool {
        let Some(host) = host else { return true };
        let Some((name, _port)) = split_host(host) else {
            return false;
        };
        if name.eq_ignore_ascii_case("localhost") || name.parse::<IpAddr>().is_ok() {
            return true;
        }
        let host = host.to_ascii_lowercase();
        let name = name.to_ascii_lowercase();
        self.allowed_hosts.iter().any(|a| *a == name || *a == host)
    }
}

/// The 401 for a page or `/metrics` asked without the secret: no data, only how to log in.
pub fn denied(metrics: bool) -> Response {
    let response = if metrics {
        Response::text(
            401,
            "401 unauthorized: send the secret as Authorization: Bearer (the token in the \
             URL `leasehold serve` printed, or the content of its --token-file)\n",
        )
    } else {
        super::error_page(
            401,
            "you are not logged in: open the URL `leasehold serve` printed on its standard \
             output (it ends in /login?token=…)",
        )
    };
    response.header("WWW-Authenticate", "Bearer realm=\"leasehold\"")
}

/// A Host header's name and port; `None` when it is not `name[:port]` or `[v6][:port]`.
fn split_host(host: &str) -> Option<(&str, Option<&str>)> {
    let (name, port) = if let Some(rest) = host.strip_prefix('[') {
        let (v6, after) = rest.split_once(']')?;
        // Only an IPv6 literal goes in brackets.
        v6.parse::<std::net::Ipv6Addr>().ok()?;
        match after {
            "" => (v6, None),
            p => (v6, Some(p.strip_prefix(':')?)),
        }
    } else {
        match host.split_once(':') {
            None => (host, None),
            Some((h, p)) => (h, Some(p)),
        }
    };
    let port_ok =
        port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
    (!name.is_empty() && port_ok).then_some((name, port))
}

/// A value of `--allow-host`: a DNS name, with an optional port (usage error otherwise).
pub fn host_name(s: &str) -> Result<String, String> {
    let bad = || format!("{s:?} is not a host name (NAME or NAME:PORT)");
    let (name, _) = split_host(s).ok_or_else(bad)?;
    let name_ok = name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    if name_ok {
        Ok(s.to_ascii_lowercase())
    } else {
        Err(bad())
    }
}

/// The secret kept in `path`, refused unless the file is the current user's alone.
///
/// # Errors
/// A missing or unreadable file, one that is not a regular file, is owned by another user or
/// has any group or other permission bit, or whose content (a trailing newline trimmed) is
/// empty, shorter than 16 or longer than 512 characters, or has a character outside
/// `A-Z a-z 0-9 - . _ ~ + / =`.
pub fn read_token_file(path: &Path) -> anyhow::Result<String> {
    let shown = path.display();
    let mut file = File::open(path).with_context(|| format!("cannot open --token-file {shown}"))?;
    let meta = file
        .metadata()
        .with_context(|| format!("cannot stat --token-file {shown}"))?;
    if !meta.is_file() {
        bail!("--token-file {shown} is not a regular file");
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        bail!(
            "--token-file {shown} is owned by uid {}, not by this user (uid {me})",
            meta.uid()
        );
    }
    if meta.mode() & 0o077 != 0 {
        bail!(
            "--token-file {shown} has mode {:04o}: other users may read it; chmod 600 it",
            meta.mode() & 0o7777
        );
    }
    let mut text = String::new();
    (&mut file)
        .take(MAX_SECRET_LEN as u64 + 3)
        .read_to_string(&mut text)
        .with_context(|| format!("cannot read --token-file {shown} as UTF-8"))?;
    let secret = text
        .strip_suffix('\n')
        .map(|s| s.strip_suffix('\r').unwrap_or(s))
        .unwrap_or(&text);
    if secret.is_empty() {
        bail!("--token-file {shown} is empty");
    }
    if secret.len() < MIN_SECRET_LEN || secret.len() > MAX_SECRET_LEN {
        bail!(
            "the secret in --token-file {shown} must be {MIN_SECRET_LEN} to {MAX_SECRET_LEN} characters"
        );
    }
    if !secret
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._~+/=".contains(&b))
    {
        bail!("the secret in --token-file {shown} may hold only letters, digits and - . _ ~ + / =");
    }
    Ok(secret.to_string())
}

/// Compares in time independent of where the first difference is.
pub fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(hosts: &[&str]) -> Auth {
        Auth {
            secret: "s".repeat(20),
            session: "c".repeat(64),
            allowed_hosts: hosts.iter().map(|h| host_name(h).unwrap()).collect(),
        }
    }

    #[test]
    fn only_addresses_localhost_and_allowed_names_pass_the_host_check() {
        let a = auth(&["Dash.Example.com"]);
        for ok in [
            "127.0.0.1:7433",
            "localhost:80",
            "LOCALHOST",
            "[::1]:7433",
            "[::1]",
            "10.0.0.2",
            "dash.example.com",
            "dash.example.com:443",
        ] {
            assert!(a.host_allowed(Some(ok)), "{ok}");
        }
        assert!(a.host_allowed(None));
        for bad in [
            "evil.example:7433",
            "localhost.evil.example",
            "rebind.example.com:7433",
            "127.0.0.1:x",
            "127.0.0.1:",
            "[localhost]:80",
            "::1",
            "",
            "example.com.dash.example.com",
        ] {
            assert!(!a.host_allowed(Some(bad)), "{bad}");
        }
        // A name given with a port allows that port only.
        let a = auth(&["proxy.example:8443"]);
        assert!(a.host_allowed(Some("proxy.example:8443")));
        assert!(!a.host_allowed(Some("proxy.example:80")));
        assert!(!a.host_allowed(Some("proxy.example")));
    }

    #[test]
    fn allow_host_takes_names_only() {
        assert_eq!(host_name("A.example:8080").unwrap(), "a.example:8080");
        for bad in ["", "a b", "a/b", "a..b", "x:", "x:abc", "http://x"] {
            assert!(host_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn same_compares_whole_values() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"abcd"));
        assert!(!same(b"", b"a"));
    }
}
