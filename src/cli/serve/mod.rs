//! `leasehold serve`: a small read-only dashboard over HTTP, with retry and cancel buttons
//! only when asked for.
//!
//! Safe by default: it listens on 127.0.0.1, changes nothing unless started with
//! `--allow-actions`, and then only through POST forms that carry a per-process random
//! token. It never creates or migrates the database. Requests are served one per connection
//! by a fixed pool of threads, each with its own read connection; every request must arrive
//! within a deadline and a size limit (see [`http`]).

mod action;
mod chart;
mod http;
mod page;

use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use crossbeam_channel::{Receiver, TrySendError};
use leasehold::{Error, ListFilter, Status, Store, now_ms, operator};

use self::http::{ReadError, Request, Response};
use super::open_read_only;

/// Where `serve` listens unless told otherwise: this machine only.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7433";
/// Threads answering requests.
const THREADS: usize = 4;
/// Connections accepted and waiting for a thread; past it a client gets a 503 at once.
const BACKLOG: usize = 64;
/// Jobs on a page of the list.
pub const PAGE_SIZE: u64 = 50;
/// The deepest page served: 5,000,000 jobs in. A page is read with OFFSET, which steps over
/// the jobs before it, so a bound keeps every page cheap.
pub const MAX_PAGE: u64 = 100_000;
/// What Prometheus expects of a text exposition.
const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Failed or lost attempts listed on the overview.
const RECENT_FAILURES: u32 = 20;
/// The longest queue name taken in a filter.
const MAX_QUEUE_PARAM: usize = 256;

/// What every thread shares.
struct App {
    db: PathBuf,
    /// The CSRF token, when actions are allowed.
    token: Option<String>,
    /// Whether the listening address is a loopback one: then only a Host header naming an IP
    /// address or `localhost` is served, which defeats DNS rebinding.
    loopback: bool,
}

/// Serves the dashboard of `db` on `listen` until the process is killed.
pub fn serve(db: &Path, listen: SocketAddr, allow_actions: bool) -> anyhow::Result<()> {
    // Refuse a missing, foreign, older or newer file before listening.
    open_read_only(db)?.counts()?;
    let listener =
        TcpListener::bind(listen).with_context(|| format!("cannot listen on {listen}"))?;
    let addr = listener.local_addr()?;
    let token = if allow_actions {
        Some(random_token().context("cannot read /dev/urandom for the CSRF token")?)
    } else {
        None
    };
    let app = Arc::new(App {
        db: db.to_path_buf(),
        token,
        loopback: addr.ip().is_loopback(),
    });
    let (tx, rx) = crossbeam_channel::bounded::<TcpStream>(BACKLOG);
    for i in 0..THREADS {
        let rx = rx.clone();
        let app = Arc::clone(&app);
        std::thread::Builder::new()
            .name(format!("serve-{i}"))
            .spawn(move || worker(&app, &rx))
            .context("cannot start a server thread")?;
    }
    // One line, so a script (or a test) can find a port chosen by `:0`.
    let mut out = std::io::stdout().lock();
    writeln!(out, "http://{addr}/")?;
    out.flush()?;
    drop(out);
    log::info!(
        "serving {} on http://{addr}/ ({})",
        db.display(),
        if allow_actions {
            "actions allowed"
        } else {
            "read-only"
        }
    );
    for conn in listener.incoming() {
        match conn {
            Ok(stream) => {
                if let Err(TrySendError::Full(mut stream)) = tx.try_send(stream) {
                    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
                    http::write_response(
                        &mut stream,
                        &Response::text(503, "busy: try again\n"),
                        false,
                    );
                }
            }
            Err(e) => {
                // Out of descriptors, most likely: wait a little rather than spin.
                log::warn!("serve: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    Ok(())
}

/// A pool thread: one connection at a time, with its own read connection to the database.
fn worker(app: &App, rx: &Receiver<TcpStream>) {
    let mut store: Option<Store> = None;
    while let Ok(mut stream) = rx.recv() {
        let (response, head_only) = match http::read_request(&mut stream) {
            Err(ReadError::Gone) => continue,
            Err(ReadError::TooLarge) => (
                error_page(400, "the request is larger than this server takes"),
                false,
            ),
            Err(ReadError::Malformed(why)) => (error_page(400, why), false),
            Ok(req) => {
                let head_only = req.method == "HEAD";
                log::debug!("serve: {} {}", req.method, req.path);
                // A bug must cost one response, never the thread or a stack trace on the page.
                let routed =
                    std::panic::catch_unwind(AssertUnwindSafe(|| route(app, &mut store, &req)));
                let response = routed.unwrap_or_else(|_| {
                    store = None;
                    error_page(500, "internal error (logged)")
                });
                (response, head_only)
            }
        };
        http::write_response(&mut stream, &response, head_only);
    }
}

/// The router: every path the dashboard serves.
fn route(app: &App, store: &mut Option<Store>, req: &Request) -> Response {
    if app.loopback && !host_is_local(req.host.as_deref()) {
        return error_page(
            400,
            "this dashboard answers only to an IP address or localhost",
        );
    }
    if req.path.split('/').any(|s| s == ".." || s == ".") {
        return error_page(400, "a path with `.` or `..` segments");
    }
    let segments: Vec<&str> = req.path.split('/').filter(|s| !s.is_empty()).collect();
    let get = matches!(req.method.as_str(), "GET" | "HEAD");
    match (segments.as_slice(), get) {
        ([], true) => with_store(app, store, |s| overview(s, app)),
        (["jobs"], true) => with_store(app, store, |s| jobs(s, app, &req.query)),
        (["jobs", id], true) => with_store(app, store, |s| job(s, app, id)),
        (["healthz"], true) => healthz(app, store),
        (["style.css"], true) => Response {
            status: 200,
            content_type: "text/css; charset=utf-8",
            headers: Vec::new(),
            body: page::CSS.as_bytes().to_vec(),
        },
        (["metrics"], true) => with_store(app, store, metrics),
        (["jobs", id, verb @ ("retry" | "cancel")], false) if req.method == "POST" => {
            with_store(app, store, |s| action::post(s, app, id, verb, &req.body))
        }
        (["jobs", _, "retry" | "cancel"], _) => {
            error_page(405, "retry and cancel take a POST").header("Allow", "POST")
        }
        ([] | ["jobs"] | ["jobs", _] | ["healthz"] | ["metrics"] | ["style.css"], false) => {
            error_page(405, "this page takes GET").header("Allow", "GET, HEAD")
        }
        _ => error_page(404, "no such page"),
    }
}

/// Runs `f` with this thread's connection, opening it first when needed (never creating or
/// migrating the file); a database error becomes an error page.
fn with_store(
    app: &App,
    store: &mut Option<Store>,
    f: impl FnOnce(&Store) -> Result<Response, Error>,
) -> Response {
    if store.is_none() {
        match open_read_only(&app.db) {
            Ok(s) => *store = Some(s),
            Err(e) => return store_error(&e),
        }
    }
    let Some(s) = store.as_ref() else {
        return error_page(500, "no database connection");
    };
    f(s).unwrap_or_else(|e| store_error(&e))
}

/// An error from the library as a page: 404 for an unknown job, 409 for a refused action,
/// 503 for a database that cannot be read.
fn store_error(e: &Error) -> Response {
    let status = match e {
        Error::NoSuchJob(_) => 404,
        Error::WrongState { .. } => 409,
        Error::Invalid { .. } => 400,
        _ => 503,
    };
    if status == 503 {
        log::warn!("serve: {e}");
    }
    error_page(status, &super::one_line(&e.to_string()))
}

pub(super) fn error_page(status: u16, message: &str) -> Response {
    Response::html(status, page::error(status, http::reason(status), message))
}

/// 200 while the database can be read, 503 otherwise.
fn healthz(app: &App, store: &mut Option<Store>) -> Response {
    let ok = match store.as_ref() {
        Some(s) => s.counts().map(|_| ()),
        None => open_read_only(&app.db).and_then(|s| {
            s.counts()?;
            *store = Some(s);
            Ok(())
        }),
    };
    match ok {
        Ok(()) => Response::text(200, "ok\n"),
        Err(e) => Response::text(
            503,
            format!("database unreadable: {}\n", super::one_line(&e.to_string())),
        ),
    }
}

/// The Prometheus text exposition (format 0.0.4) of the file's metrics, read in one read
/// transaction: a scrape never takes a write lock.
fn metrics(store: &Store) -> Result<Response, Error> {
    let text = store.metrics()?.to_prometheus();
    Ok(Response {
        status: 200,
        content_type: PROMETHEUS_CONTENT_TYPE,
        headers: Vec::new(),
        body: text.into_bytes(),
    })
}

/// Everything the overview shows.
pub struct Overview {
    pub size: leasehold::DatabaseSize,
    pub counts: leasehold::Counts,
    /// Every queue with a job or a setting: counts, limit, pause, lag.
    pub queues: Vec<leasehold::QueueInfo>,
    pub schedules: Vec<leasehold::ScheduleRecord>,
    pub leases: leasehold::LeaseCounts,
    pub settings: operator::LeaseSettings,
    pub runners: Vec<(leasehold::RunnerRecord, bool)>,
    /// The newest failed or lost attempts, newest first.
    pub failures: Vec<leasehold::RecentFailure>,
    /// The runners' samples for the charts, oldest first.
    pub samples: Vec<leasehold::Sample>,
    /// When the page was read, in milliseconds since the epoch.
    pub now: i64,
}

fn overview(store: &Store, app: &App) -> Result<Response, Error> {
    let settings = operator::lease_settings(store)?;
    let now = now_ms();
    let data = Overview {
        size: store.size()?,
        counts: store.counts()?,
        queues: store.all_queues(now)?,
        schedules: store.schedules()?,
        leases: store.lease_counts(settings.max_recovery_attempts, now)?,
        settings,
        runners: store
            .runners()?
            .into_iter()
            .map(|r| {
                let alive = operator::runner_alive(&r);
                (r, alive)
            })
            .collect(),
        failures: store.recent_failures(RECENT_FAILURES)?,
        samples: store.samples()?,
        now,
    };
    Ok(Response::html(
        200,
        page::overview(&data, app.token.is_some()),
    ))
}

/// The job list's filters and page, from the query.
#[derive(Debug, Default)]
pub struct ListQuery {
    pub status: Option<Status>,
    pub queue: Option<String>,
    pub page: u64,
}

impl ListQuery {
    /// Parses `status`, `queue` and `page`; `Err` is a 400 or 404 page.
    fn parse(query: &[(String, String)]) -> Result<ListQuery, Response> {
        let mut q = ListQuery {
            page: 1,
            ..ListQuery::default()
        };
        for (k, v) in query {
            match (k.as_str(), v.as_str()) {
                (_, "") => {}
                ("status", v) => {
                    q.status = Some(v.parse().map_err(|_| {
                        error_page(400, &format!("no status {v:?}: use pending, running, succeeded, failed or cancelled"))
                    })?);
                }
                ("queue", v) if v.len() > MAX_QUEUE_PARAM => {
                    return Err(error_page(400, "the queue name is too long"));
                }
                ("queue", v) => q.queue = Some(v.to_string()),
                ("page", v) => {
                    q.page = v
                        .parse()
                        .ok()
                        .filter(|&p| p >= 1)
                        .ok_or_else(|| error_page(400, "page must be a whole number from 1"))?;
                    if q.page > MAX_PAGE {
                        return Err(error_page(404, "no such page"));
                    }
                }
                _ => {}
            }
        }
        Ok(q)
    }

    /// The list's link for `page`, with the same filters.
    pub fn link(&self, page: u64) -> String {
        let mut s = format!("/jobs?page={page}");
        if let Some(st) = self.status {
            s.push_str(&format!("&status={}", st.as_str()));
        }
        if let Some(q) = &self.queue {
            s.push_str(&format!("&queue={}", http::percent_encode(q)));
        }
        s
    }
}

fn jobs(store: &Store, app: &App, query: &[(String, String)]) -> Result<Response, Error> {
    let q = match ListQuery::parse(query) {
        Ok(q) => q,
        Err(page) => return Ok(page),
    };
    let filter = ListFilter {
        status: q.status,
        queue: q.queue.clone(),
        failed_stale: None,
        // One more than a page tells whether there is a next one, without counting.
        limit: Some(PAGE_SIZE + 1),
    };
    let mut rows = store.list_page(&filter, (q.page - 1) * PAGE_SIZE)?;
    if rows.is_empty() && q.page > 1 {
        return Ok(error_page(404, "no such page: the list is shorter"));
    }
    let more = rows.len() as u64 > PAGE_SIZE;
    rows.truncate(PAGE_SIZE as usize);
    Ok(Response::html(
        200,
        page::jobs(&q, &rows, more, app.token.is_some()),
    ))
}

fn job(store: &Store, app: &App, id: &str) -> Result<Response, Error> {
    let Ok(id) = id.parse::<i64>() else {
        return Ok(error_page(400, "a job id is a whole number"));
    };
    let record = store.job(id)?;
    let events = store.events(id)?;
    let output = store.output(id, None)?;
    let waits = if record.teardown_pending {
        operator::teardown_wait(store, id)?
    } else {
        None
    };
    Ok(Response::html(
        200,
        page::job(
            &record,
            &events,
            output.as_ref(),
            waits.as_deref(),
            app.token.as_deref(),
        ),
    ))
}

/// Whether a Host header names this machine by address or as `localhost` (or is absent, as
/// from an HTTP/1.0 client).
fn host_is_local(host: Option<&str>) -> bool {
    let Some(host) = host else { return true };
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or_default()
    } else {
        host.rsplit_once(':').map_or(host, |(h, _)| h)
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<IpAddr>().is_ok()
}

/// 16 random bytes from the kernel, as hex.
fn random_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_addresses_and_localhost_are_local_hosts() {
        assert!(host_is_local(None));
        assert!(host_is_local(Some("127.0.0.1:7433")));
        assert!(host_is_local(Some("localhost:80")));
        assert!(host_is_local(Some("[::1]:7433")));
        assert!(host_is_local(Some("10.0.0.2")));
        assert!(!host_is_local(Some("evil.example:7433")));
        assert!(!host_is_local(Some("localhost.evil.example")));
    }

    #[test]
    fn tokens_are_random_hex() {
        let (a, b) = (random_token().unwrap(), random_token().unwrap());
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn list_query_refuses_bad_pages_and_statuses() {
        let q = |s: &str| ListQuery::parse(&http::parse_pairs(s).unwrap());
        assert_eq!(q("page=2&status=failed&queue=a%20b").unwrap().page, 2);
        assert_eq!(q("").unwrap().page, 1);
        assert_eq!(q("page=0").unwrap_err().status, 400);
        assert_eq!(q("page=x").unwrap_err().status, 400);
        assert_eq!(q("page=99999999999999999999999").unwrap_err().status, 400);
        assert_eq!(
            q(&format!("page={}", MAX_PAGE + 1)).unwrap_err().status,
            404
        );
        assert_eq!(q("status=done").unwrap_err().status, 400);
    }
}
