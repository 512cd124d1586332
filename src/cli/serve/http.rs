//! Just enough HTTP/1.1 for a dashboard: one request per connection, parsed from what the
//! reader has gathered under a deadline and a size limit, answered with `Connection: close`.
//!
//! Hand-written rather than a server crate so that every bound is ours: a whole request
//! (headers and body) must arrive within [`HEAD_DEADLINE`] of its connection's accept and fit
//! in [`MAX_HEAD`] and [`MAX_BODY`] bytes. The reader (see `reader.rs`) waits for it without a
//! thread per connection, so a slow or silent client holds no pool thread at all.

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

/// The longest request line plus headers taken.
pub const MAX_HEAD: usize = 16 * 1024;
/// The longest body taken (the dashboard's forms are a few dozen bytes).
pub const MAX_BODY: usize = 4 * 1024;
/// How long a client has, from the accept of its connection, to send its whole request. Short:
/// a browser or a scraper sends its request at once, and a connection held open without one
/// holds a place among the reader's few.
pub const HEAD_DEADLINE: Duration = Duration::from_secs(2);
/// How long a client has to take the response.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// A parsed request.
#[derive(Debug)]
pub struct Request {
    pub method: String,
    /// The target as sent (`/jobs?status=failed`): where a page's links come back to.
    pub target: String,
    /// The path, percent-decoded.
    pub path: String,
    /// The query's pairs, percent-decoded.
    pub query: Vec<(String, String)>,
    /// The `Host` header, if any.
    pub host: Option<String>,
    /// Every `Cookie` header's value.
    pub cookies: Vec<String>,
    /// The `Authorization` header, if any.
    pub authorization: Option<String>,
    pub body: Vec<u8>,
}

impl Request {
    /// The values of the cookies named `name`, in the order the `Cookie` headers give them.
    pub fn cookies_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> {
        self.cookies
            .iter()
            .flat_map(|h| h.split(';'))
            .filter_map(|c| c.trim().split_once('='))
            .filter(move |(n, _)| *n == name)
            .map(|(_, value)| value)
    }
}

/// Why a request could not be read: each is answered with a 400 page.
#[derive(Debug)]
pub enum ReadError {
    /// The head or body is past the limits.
    TooLarge,
    /// Not HTTP as we take it.
    Malformed(&'static str),
}

/// The most bytes of a connection that [`parse_request`] may need: a whole head and body.
pub const MAX_REQUEST: usize = MAX_HEAD + 4 + MAX_BODY;

/// Parses the request that `buf` (the bytes a connection sent so far) starts with: `Ok(None)`
/// while its head or body is still incomplete.
pub fn parse_request(buf: &[u8]) -> Result<Option<Request>, ReadError> {
    let Some(head_end) = find(buf, b"\r\n\r\n") else {
        return if buf.len() > MAX_HEAD {
            Err(ReadError::TooLarge)
        } else {
            Ok(None)
        };
    };
    if head_end > MAX_HEAD {
        return Err(ReadError::TooLarge);
    }
    let head = String::from_utf8(buf[..head_end].to_vec())
        .map_err(|_| ReadError::Malformed("the request head is not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(ReadError::Malformed("a malformed request line"));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(ReadError::Malformed("only HTTP/1.x is served"));
    }
    let mut content_length = 0usize;
    let mut host = None;
    let mut cookies = Vec::new();
    let mut authorization = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            return Err(ReadError::Malformed("a malformed header"));
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            content_length = value
                .parse()
                .map_err(|_| ReadError::Malformed("a malformed Content-Length"))?;
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(ReadError::Malformed("chunked request bodies are not taken"));
        } else if name.eq_ignore_ascii_case("host") {
            host = Some(value.to_string());
        } else if name.eq_ignore_ascii_case("cookie") {
            cookies.push(value.to_string());
        } else if name.eq_ignore_ascii_case("authorization") {
            authorization = Some(value.to_string());
        }
    }
    if content_length > MAX_BODY {
        return Err(ReadError::TooLarge);
    }
    let body_start = head_end + 4;
    if buf.len() < body_start + content_length {
        return Ok(None);
    }
    let body = buf[body_start..body_start + content_length].to_vec();
    // Only origin-form targets ("/path?query"); no absolute URIs, no `*`.
    if !target.starts_with('/') {
        return Err(ReadError::Malformed("the target is not a path"));
    }
    let (raw_path, raw_query) = target.split_once('?').unwrap_or((target, ""));
    let path = percent_decode(raw_path, false).ok_or(ReadError::Malformed(
        "the path is not valid percent-encoded UTF-8",
    ))?;
    let query = parse_pairs(raw_query).ok_or(ReadError::Malformed(
        "the query is not valid percent-encoded UTF-8",
    ))?;
    Ok(Some(Request {
        method: method.to_string(),
        target: target.to_string(),
        path,
        query,
        host,
        cookies,
        authorization,
        body,
    }))
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// `a=1&b=x%20y` (or a form body) into pairs; `None` when an escape or the text is invalid.
pub fn parse_pairs(s: &str) -> Option<Vec<(String, String)>> {
    s.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            Some((percent_decode(k, true)?, percent_decode(v, true)?))
        })
        .collect()
}

/// Decodes `%XX` escapes (and `+` as a space in a form or query); `None` for a broken escape
/// or bytes that are not UTF-8.
pub fn percent_decode(s: &str, plus_is_space: bool) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// Escapes a query value for a link.
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A response: status, content type, extra headers, body.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn html(status: u16, body: String) -> Response {
        Response {
            status,
            content_type: "text/html; charset=utf-8",
            headers: Vec::new(),
            body: body.into_bytes(),
        }
    }

    pub fn text(status: u16, body: impl Into<String>) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            headers: Vec::new(),
            body: body.into().into_bytes(),
        }
    }

    /// 303 See Other: after a POST, the browser goes on with a GET of `location`.
    pub fn see_other(location: String) -> Response {
        let mut r = Response::text(303, format!("see {location}\n"));
        r.headers.push(("Location", location));
        r
    }

    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Response {
        self.headers.push((name, value.into()));
        self
    }
}

/// Writes `response`; a client that went away is not an error worth more than a debug line.
pub fn write_response(stream: &mut TcpStream, response: &Response, head_only: bool) {
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let mut head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\
         Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n\
         X-Frame-Options: DENY\r\nReferrer-Policy: no-referrer\r\n\
         Content-Security-Policy: default-src 'none'; style-src 'self'; \
         form-action 'self'; frame-ancestors 'none'; base-uri 'none'\r\n",
        response.status,
        reason(response.status),
        response.content_type,
        response.body.len()
    );
    for (name, value) in &response.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let result = stream.write_all(head.as_bytes()).and_then(|()| {
        if head_only {
            Ok(())
        } else {
            stream.write_all(&response.body)
        }
    });
    if let Err(e) = result.and_then(|()| stream.flush()) {
        log::debug!("serve: could not write a response: {e}");
    }
}

pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        303 => "See Other",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        421 => "Misdirected Request",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_escapes_and_refuses_broken_ones() {
        assert_eq!(percent_decode("a%20b+c", true).as_deref(), Some("a b c"));
        assert_eq!(percent_decode("a+b", false).as_deref(), Some("a+b"));
        assert_eq!(percent_decode("%2e%2E", false).as_deref(), Some(".."));
        assert_eq!(percent_decode("%zz", false), None);
        assert_eq!(percent_decode("%4", false), None);
        assert_eq!(percent_decode("%ff", false), None);
    }

    #[test]
    fn a_request_is_parsed_once_its_head_and_body_are_all_there() {
        let full = b"POST /jobs/1/retry?x=%20 HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc";
        for cut in 0..full.len() {
            assert!(matches!(parse_request(&full[..cut]), Ok(None)), "{cut}");
        }
        let req = parse_request(full).unwrap().unwrap();
        assert_eq!(
            (req.method.as_str(), req.path.as_str()),
            ("POST", "/jobs/1/retry")
        );
        assert_eq!(req.query, vec![("x".to_string(), " ".to_string())]);
        assert_eq!(
            (req.host.as_deref(), req.body.as_slice()),
            (Some("h"), &b"abc"[..])
        );
        let endless = vec![b'a'; MAX_HEAD + 1];
        assert!(matches!(parse_request(&endless), Err(ReadError::TooLarge)));
        let greedy = format!(
            "POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            MAX_BODY + 1
        );
        assert!(matches!(
            parse_request(greedy.as_bytes()),
            Err(ReadError::TooLarge)
        ));
        assert!(matches!(
            parse_request(b"GET / HTTP/2\r\n\r\n"),
            Err(ReadError::Malformed(_))
        ));
    }

    #[test]
    fn pairs_round_trip_through_encoding() {
        let v = "q <x>&y=1 ü";
        let pairs = parse_pairs(&format!("queue={}&page=2&flag", percent_encode(v))).unwrap();
        assert_eq!(
            pairs,
            vec![
                ("queue".to_string(), v.to_string()),
                ("page".to_string(), "2".to_string()),
                ("flag".to_string(), String::new()),
            ]
        );
    }
}
