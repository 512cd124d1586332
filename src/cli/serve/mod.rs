//! `leasehold serve`: a small read-only dashboard over HTTP, with retry and cancel buttons
//! only when asked for.
//!
//! Safe by default: it listens on 127.0.0.1, every route but `/healthz` needs the secret it
//! prints at start (see [`auth`]), it answers only to a Host that is an IP address,
//! `localhost` or a name allowed by the operator, it masks environment values, and it changes
//! nothing unless started with `--allow-actions`, and then only through POST forms that carry
//! a per-process random token. It never creates or migrates the database. One reader thread
//! accepts connections and gathers each request within a deadline and a size limit, without a
//! thread per connection (see [`reader`]); a fixed pool of threads, each with its own read
//! connection, answers whole requests.

mod action;
mod auth;
mod chart;
mod http;
mod page;
mod reader;
mod times;

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use crossbeam_channel::Receiver;
use leasehold::{Error, JobRecord, ListFilter, Status, Store, Stream, now_ms, operator};

pub use self::auth::host_name;
use self::http::{ReadError, Request, Response};
use self::reader::Ready;
use super::open_read_only;

/// Where `serve` listens unless told otherwise: this machine only.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7433";
/// Threads answering requests.
const THREADS: usize = 4;
/// Whole requests waiting for a thread; past it a client gets a 503 at once.
const BACKLOG: usize = 64;
/// Jobs on a page of the list. A page is the jobs below an id (`before=`), read from an
/// index from that id on, so a deep page costs what the first one does.
pub const PAGE_SIZE: u64 = 50;
/// What Prometheus expects of a text exposition.
const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Failed or lost attempts listed on the overview.
const RECENT_FAILURES: u32 = 20;
/// The longest queue name taken in a filter.
const MAX_QUEUE_PARAM: usize = 256;

/// Bytes of randomness in the CSRF token.
const CSRF_BYTES: usize = 16;

/// How `serve` was asked to run.
#[derive(Debug)]
pub struct Options {
    pub listen: SocketAddr,
    /// Retry and cancel buttons.
    pub allow_actions: bool,
    /// A file holding the secret, instead of a random one.
    pub token_file: Option<PathBuf>,
    /// Names the Host header may carry besides IP addresses and `localhost`.
    pub allow_hosts: Vec<String>,
    /// Show environment values on a job's page instead of a mask.
    pub show_env: bool,
}

/// What every thread shares.
struct App {
    db: PathBuf,
    /// The CSRF token, when actions are allowed.
    token: Option<String>,
    /// The secret and the Host check.
    auth: auth::Auth,
    /// Whether a job's page shows its environment's values.
    show_env: bool,
    /// This machine's zone, offered beside UTC for the pages' times.
    system_zone: Option<String>,
}

/// Serves the dashboard of `db` until the process is killed.
pub fn serve(db: &Path, options: Options) -> anyhow::Result<()> {
    // Refuse a missing, foreign, older or newer file, and a bad token file, before listening.
    open_read_only(db)?.counts()?;
    let auth = auth::Auth::new(options.token_file.as_deref(), options.allow_hosts)?;
    let listen = options.listen;
    let listener =
        TcpListener::bind(listen).with_context(|| format!("cannot listen on {listen}"))?;
    let addr = listener.local_addr()?;
    let allow_actions = options.allow_actions;
    let token = if allow_actions {
        Some(random_hex(CSRF_BYTES).context("cannot read /dev/urandom for the CSRF token")?)
    } else {
        None
    };
    let login = auth.login_path();
    let app = Arc::new(App {
        db: db.to_path_buf(),
        token,
        auth,
        show_env: options.show_env,
        system_zone: times::system_zone(),
    });
    let (tx, rx) = crossbeam_channel::bounded::<Ready>(BACKLOG);
    for i in 0..THREADS {
        let rx = rx.clone();
        let app = Arc::clone(&app);
        std::thread::Builder::new()
            .name(format!("serve-{i}"))
            .spawn(move || worker(&app, &rx))
            .context("cannot start a server thread")?;
    }
    // One line, so a script (or a test) can find a port chosen by `:0` and the secret. Only
    // stdout has the secret: the log may go where others read it.
    let mut out = std::io::stdout().lock();
    writeln!(out, "http://{addr}{login}")?;
    out.flush()?;
    drop(out);
    if !addr.ip().is_loopback() {
        log::warn!(
            "serve: listening on {addr}, off loopback: the traffic, the secret and the pages \
             included, is not encrypted; reach it through an SSH tunnel to a loopback address, \
             or a reverse proxy with TLS"
        );
    }
    log::info!(
        "serving {} on http://{addr}/ ({})",
        leasehold::redacted_db(db),
        if allow_actions {
            "actions allowed"
        } else {
            "read-only"
        }
    );
    reader::run(&listener, &tx).context("serve: cannot wait for connections")
}

/// A pool thread: one whole request at a time, with its own read connection to the database.
fn worker(app: &App, rx: &Receiver<Ready>) {
    let mut store: Option<Store> = None;
    while let Ok((mut stream, request)) = rx.recv() {
        // The reader polls nonblocking connections; the answer is written with a deadline.
        if let Err(e) = stream.set_nonblocking(false) {
            log::debug!("serve: a connection went away: {e}");
            continue;
        }
        let (response, head_only) = match request {
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
    // Before anything else: a page under another name is a DNS-rebinding attempt.
    if !app.auth.host_allowed(req.host.as_deref()) {
        return error_page(
            421,
            "this dashboard answers only to an IP address, localhost or a name given with --allow-host",
        );
    }
    if req.path.split('/').any(|s| s == ".." || s == ".") {
        return error_page(400, "a path with `.` or `..` segments");
    }
    let segments: Vec<&str> = req.path.split('/').filter(|s| !s.is_empty()).collect();
    let get = matches!(req.method.as_str(), "GET" | "HEAD");
    match (segments.as_slice(), get) {
        (["healthz"], true) => return healthz(app, store),
        (["login"], true) => return app.auth.login(req),
        (["healthz"] | ["login"] | ["times"], false) => {
            return error_page(405, "this page takes GET").header("Allow", "GET, HEAD");
        }
        _ => {}
    }
    let metrics_route = segments.as_slice() == ["metrics"];
    if app.auth.check(req, metrics_route) == auth::Verdict::Denied {
        return auth::denied(metrics_route);
    }
    let view = page::View {
        times: times::Times::of(req),
        system_zone: app.system_zone.as_deref(),
        back: &req.target,
        now: now_ms(),
    };
    match (segments.as_slice(), get) {
        ([], true) => with_store(app, store, |s| overview(s, app, &view)),
        (["jobs"], true) => with_store(app, store, |s| jobs(s, app, &req.query, &view)),
        (["jobs", id], true) => with_store(app, store, |s| job(s, app, id, &view)),
        (["times"], true) => times::choose(req),
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
        ([] | ["jobs"] | ["jobs", _] | ["metrics"] | ["style.css"], false) => {
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
    /// The runners by host, each judged from here, with their running jobs.
    pub hosts: Vec<operator::Host>,
    /// The newest failed or lost attempts, newest first.
    pub failures: Vec<leasehold::RecentFailure>,
    /// The runners' samples for the charts, oldest first.
    pub samples: Vec<leasehold::Sample>,
    /// When the page was read, in milliseconds since the epoch.
    pub now: i64,
    /// Pending jobs per condition no running runner sees hold (those with any).
    pub waiting_for_conditions: Vec<(leasehold::Condition, u64)>,
    /// What running runners assume of the conditions they cannot tell.
    pub condition_notes: Vec<String>,
}

fn overview(store: &Store, app: &App, view: &page::View) -> Result<Response, Error> {
    let settings = operator::lease_settings(store)?;
    let now = now_ms();
    let data = Overview {
        size: store.size()?,
        counts: store.counts()?,
        queues: store.all_queues()?,
        schedules: store.schedules()?,
        leases: store.lease_counts(settings.max_recovery_attempts, now)?,
        settings,
        hosts: operator::hosts(store, super::hosts::LOST_READ)?,
        failures: store.recent_failures(RECENT_FAILURES)?,
        samples: store.samples()?,
        waiting_for_conditions: store
            .jobs_waiting_for_conditions()?
            .into_iter()
            .filter(|&(_, n)| n > 0)
            .collect(),
        condition_notes: store
            .runners()?
            .into_iter()
            .filter_map(|r| {
                r.conditions_note
                    .map(|n| format!("runner {}: {n}", r.worker_id))
            })
            .collect(),
        now,
    };
    Ok(Response::html(
        200,
        page::overview(&data, app.token.is_some(), view),
    ))
}

/// The job list's filters and page, from the query.
#[derive(Debug, Default)]
pub struct ListQuery {
    pub status: Option<Status>,
    pub queue: Option<String>,
    /// The page: jobs with an id below this one; the first page when `None`.
    pub before: Option<i64>,
}

impl ListQuery {
    /// Parses `status`, `queue` and `before`; `Err` is a 400 page.
    fn parse(query: &[(String, String)]) -> Result<ListQuery, Response> {
        let mut q = ListQuery::default();
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
                ("before", v) => {
                    q.before = Some(v.parse().ok().filter(|&id| id >= 1).ok_or_else(|| {
                        error_page(400, "before must be a job id, a whole number from 1")
                    })?);
                }
                // Numbered pages are gone: refused rather than ignored, so that an old link
                // does not silently show the first page as if it were page N.
                ("page", _) => {
                    return Err(error_page(
                        400,
                        "numbered pages are gone: follow the list's \"older\" link (before=ID)",
                    ));
                }
                _ => {}
            }
        }
        Ok(q)
    }

    /// The list's link to the jobs below `before` (the first page when `None`), with the
    /// same filters.
    pub fn link(&self, before: Option<i64>) -> String {
        let mut params = Vec::new();
        if let Some(st) = self.status {
            params.push(format!("status={}", st.as_str()));
        }
        if let Some(q) = &self.queue {
            params.push(format!("queue={}", http::percent_encode(q)));
        }
        if let Some(id) = before {
            params.push(format!("before={id}"));
        }
        if params.is_empty() {
            "/jobs".to_string()
        } else {
            format!("/jobs?{}", params.join("&"))
        }
    }
}

fn jobs(
    store: &Store,
    app: &App,
    query: &[(String, String)],
    view: &page::View,
) -> Result<Response, Error> {
    let q = match ListQuery::parse(query) {
        Ok(q) => q,
        Err(page) => return Ok(page),
    };
    let filter = ListFilter {
        status: q.status,
        queue: q.queue.clone(),
        failed_stale: None,
        before: q.before,
        // One more than a page tells whether there is a next one, without counting.
        limit: Some(PAGE_SIZE + 1),
    };
    let mut rows = store.list(&filter)?;
    let more = rows.len() as u64 > PAGE_SIZE;
    rows.truncate(PAGE_SIZE as usize);
    Ok(Response::html(
        200,
        page::jobs(&q, &rows, more, app.token.is_some(), view),
    ))
}

fn job(store: &Store, app: &App, id: &str, view: &page::View) -> Result<Response, Error> {
    let Ok(id) = id.parse::<i64>() else {
        return Ok(error_page(400, "a job id is a whole number"));
    };
    let record = store.job(id)?;
    let events = store.events(id)?;
    let output = store.output(id, None)?;
    let live = live_tail(store, &record)?;
    let waits = if record.teardown_pending {
        operator::teardown_wait(store, id)?
    } else {
        None
    };
    let kept = operator::kept_without_runner(store, &record)?;
    let conditions = super::render::waiting_conditions(&record, &store.conditions_not_held()?);
    Ok(Response::html(
        200,
        page::job(
            &record,
            &events,
            output.as_ref(),
            live.as_ref(),
            waits.as_deref(),
            kept.as_deref(),
            &conditions,
            app.token.as_deref(),
            app.show_env,
            view,
        ),
    ))
}

/// The most of each stream's file a running job's page shows.
const LIVE_TAIL: usize = 64 << 10;

/// The last [`LIVE_TAIL`] bytes of a running attempt's files, when it has a folder (its keeper
/// writes them as the command runs).
fn live_tail(store: &Store, job: &JobRecord) -> Result<Option<page::Live>, Error> {
    if job.status != Status::Running {
        return Ok(None);
    }
    let Some(token) = job.run_token.as_deref() else {
        return Ok(None);
    };
    let dirs = store.attempt_files(job.id)?;
    let Some(dir) = dirs.iter().find(|d| d.token == token) else {
        return Ok(None);
    };
    let tail = |stream: Stream| {
        dir.tail(stream, LIVE_TAIL).map_err(|source| Error::Io {
            context: format!("cannot read {}", dir.stream(stream).display()),
            source,
        })
    };
    Ok(Some(page::Live {
        attempt: dir.attempt,
        stdout: tail(Stream::Stdout)?,
        stderr: tail(Stream::Stderr)?,
    }))
}

/// `n` random bytes from the kernel, as hex.
fn random_hex(n: usize) -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = vec![0u8; n];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_hex() {
        let (a, b) = (random_hex(16).unwrap(), random_hex(16).unwrap());
        assert_eq!(a.len(), 32);
        assert_eq!(random_hex(32).unwrap().len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn list_query_refuses_bad_before_ids_pages_and_statuses() {
        let q = |s: &str| ListQuery::parse(&http::parse_pairs(s).unwrap());
        let parsed = q("before=120&status=failed&queue=a%20b").unwrap();
        assert_eq!(parsed.before, Some(120));
        assert_eq!(
            parsed.link(Some(70)),
            "/jobs?status=failed&queue=a%20b&before=70"
        );
        assert_eq!(q("").unwrap().before, None);
        assert_eq!(q("").unwrap().link(None), "/jobs");
        for bad in [
            "before=0",
            "before=-1",
            "before=x",
            "before=1.5",
            "before=99999999999999999999999",
            "page=2",
            "status=done",
        ] {
            assert_eq!(q(bad).unwrap_err().status, 400, "{bad}");
        }
    }
}
