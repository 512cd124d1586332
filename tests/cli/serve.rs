//! `serve`: every route's status and content type, bad input, keyset pages, the actions'
//! safety (off by default, CSRF token), idle and slow clients, and the pages in a real browser
//! (headless Chromium).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

use std::collections::BTreeMap;

use leasehold::ListFilter;

use crate::cdp::Browser;
use crate::helper::{add, cli, fails, ok, run_until_idle};
use crate::util::exposition::parse;
use crate::util::{TestDb, leasehold_vars, poll, wait_for};

/// A `leasehold serve` on a free port, logged in; killed by pid when dropped.
pub struct Server {
    child: Child,
    pub addr: SocketAddr,
    /// The secret in the printed login URL (`None` if it printed none).
    pub secret: Option<String>,
    /// `leasehold_session=...`, as `/login` set it.
    cookie: Option<String>,
    /// Where its stderr goes.
    log: tempfile::NamedTempFile,
}

impl Server {
    /// On 127.0.0.1, port 0.
    pub fn start(db: &Path, extra: &[&str]) -> Server {
        Server::start_on(db, "127.0.0.1:0", extra)
    }

    /// On `listen`; a wildcard address is reached through 127.0.0.1.
    pub fn start_on(db: &Path, listen: &str, extra: &[&str]) -> Server {
        let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("leasehold"));
        cmd.arg("--db")
            .arg(db)
            .args(["serve", "--listen", listen])
            .args(extra);
        for var in leasehold_vars() {
            cmd.env_remove(var);
        }
        let log = tempfile::NamedTempFile::new().unwrap();
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log.reopen().unwrap())
            .spawn()
            .expect("leasehold serve starts");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout is piped");
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("serve prints its URL");
        assert!(
            !line.is_empty(),
            "serve printed nothing: {}",
            std::fs::read_to_string(log.path()).unwrap()
        );
        let rest = line
            .trim()
            .strip_prefix("http://")
            .unwrap_or_else(|| panic!("serve printed {line:?}, not its URL"));
        let (addr, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let mut addr: SocketAddr = addr.parse().expect("the URL holds an address");
        if addr.ip().is_unspecified() {
            addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        let secret = path.strip_prefix("/login?token=").map(str::to_string);
        let mut server = Server {
            child,
            addr,
            secret,
            cookie: None,
            log,
        };
        if let Some(secret) = server.secret.clone() {
            let login = server.anonymous(&format!("/login?token={secret}"), "");
            assert_eq!(login.status, 303, "{login:?}");
            let set = login.header("set-cookie").expect("the login sets a cookie");
            server.cookie = Some(set.split(';').next().unwrap().to_string());
        }
        server
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The session cookie `/login` set, as a `Cookie` header's value.
    pub fn cookie(&self) -> &str {
        self.cookie.as_deref().expect("serve set a session cookie")
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap()
    }

    /// The URL `serve` printed: it logs in and goes on to the overview.
    pub fn login_url(&self) -> String {
        let secret = self.secret.as_deref().expect("serve printed a login URL");
        self.url(&format!("/login?token={secret}"))
    }

    /// Sends `raw` as is and reads the whole response.
    pub fn raw(&self, raw: &[u8]) -> Reply {
        let mut s = TcpStream::connect(self.addr).expect("the server accepts");
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        // The server may answer (and close) before it has read all of an oversized request.
        let _ = s.write_all(raw);
        let mut bytes = Vec::new();
        let _ = s.read_to_end(&mut bytes);
        Reply::parse(&bytes)
    }

    /// `method path` with the session cookie and `headers` (each ending in CRLF).
    pub fn request(&self, method: &str, path: &str, headers: &str, body: &str) -> Reply {
        let cookie = self
            .cookie
            .as_ref()
            .map(|c| format!("Cookie: {c}\r\n"))
            .unwrap_or_default();
        self.raw(
            format!(
                "{method} {path} HTTP/1.1\r\nHost: {}\r\n{cookie}{headers}Content-Length: {}\r\n\r\n{body}",
                self.addr,
                body.len()
            )
            .as_bytes(),
        )
    }

    /// A GET without the cookie, with `headers` (each ending in CRLF).
    pub fn anonymous(&self, path: &str, headers: &str) -> Reply {
        self.raw(
            format!(
                "GET {path} HTTP/1.1\r\nHost: {}\r\n{headers}\r\n",
                self.addr
            )
            .as_bytes(),
        )
    }

    pub fn get(&self, path: &str) -> Reply {
        self.request("GET", path, "", "")
    }

    pub fn post(&self, path: &str, body: &str) -> Reply {
        self.request(
            "POST",
            path,
            "Content-Type: application/x-www-form-urlencoded\r\n",
            body,
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub head: String,
    pub body: String,
}

impl Reply {
    fn parse(bytes: &[u8]) -> Reply {
        let text = String::from_utf8_lossy(bytes).into_owned();
        let (head, body) = text
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("not an HTTP response: {text:?}"));
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status in {head:?}"));
        Reply {
            status,
            head: head.to_string(),
            body: body.to_string(),
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    pub fn content_type(&self) -> &str {
        self.header("content-type").unwrap_or("")
    }

    /// Checks a 4xx page: HTML, no panic, no trace.
    pub fn refused(&self, status: u16) -> &Reply {
        assert_eq!(self.status, status, "{self:?}");
        assert!(self.content_type().starts_with("text/html"), "{self:?}");
        assert!(!self.body.contains("panicked"), "{self:?}");
        assert!(!self.body.contains("backtrace"), "{self:?}");
        self
    }
}

/// A database with one succeeded, one failed and one pending job.
pub fn three_jobs(t: &TestDb) -> (i64, i64, i64) {
    let target = t.target();
    let db = target.as_path();
    let ok_id = add(db, &[], &["true"]);
    let failed = add(db, &[], &["sh", "-c", "echo boom >&2; exit 3"]);
    run_until_idle(db, &[]);
    let pending = add(db, &["--queue", "later"], &["true"]);
    (ok_id, failed, pending)
}

#[test]
fn a_job_page_shows_its_dependencies_as_links_its_unique_key_and_its_schedule() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let first = add(db, &[], &["true"]);
    run_until_idle(db, &[]);
    let second = add(db, &[], &["true"]);
    let dependent = add(
        db,
        &[
            "--after",
            &format!("{first},{second}"),
            "--unique-key",
            "report<2026>",
        ],
        &["true"],
    );
    let record = t.job(dependent);
    assert_eq!(
        (record.after.clone(), record.waiting_for.clone()),
        (vec![first, second], vec![second])
    );
    let now = leasehold::now_ms();
    let store = t.store();
    store
        .put_schedule_at(
            "every-minute",
            &leasehold::Schedule::every(Duration::from_secs(60))
                .catch_up(leasehold::CatchUp::One)
                .job(leasehold::Job::shell("true")),
            now - 90_000,
        )
        .unwrap();
    assert_eq!(store.fire_due_at(now).unwrap().enqueued, 1);
    let fired = store
        .list(&ListFilter::default())
        .unwrap()
        .into_iter()
        .find(|j| j.schedule.is_some())
        .unwrap();
    let server = Server::start(db, &[]);

    let page = server.get(&format!("/jobs/{dependent}"));
    assert_eq!(page.status, 200, "{page:?}");
    let after = &page.body[page.body.find("id=\"after\"").unwrap()..];
    let after = &after[..after.find("</td>").unwrap()];
    assert!(
        after.contains(&format!("<a href=\"/jobs/{first}\">{first}</a>")),
        "{after}"
    );
    assert!(
        after.contains(&format!("<a href=\"/jobs/{second}\">{second}</a>")),
        "{after}"
    );
    let waiting = &page.body[page.body.find("id=\"waiting-for\"").unwrap()..];
    let waiting = &waiting[..waiting.find("</td>").unwrap()];
    assert!(waiting.contains(&format!("/jobs/{second}\"")), "{waiting}");
    assert!(!waiting.contains(&format!("/jobs/{first}\"")), "{waiting}");
    assert!(
        page.body.contains("<td>report&lt;2026&gt;</td>"),
        "escaped: {}",
        page.body
    );

    let page = server.get(&format!("/jobs/{}", fired.id));
    assert!(
        page.body.contains("<th>schedule</th><td>every-minute</td>"),
        "{}",
        page.body
    );
    let slot = fired.slot_at.expect("a fired job has its slot");
    let shown = page.body.split("<th>slot_at</th><td>").nth(1).unwrap();
    assert!(
        shown.starts_with(&format!("{} (", render_time(slot))),
        "{shown}"
    );
    assert!(page.body.contains("None: it runs without waiting"));

    // The overview counts the waiting job.
    let home = server.get("/");
    assert!(
        home.body.contains("<b id=\"waiting-total\">1</b>"),
        "{}",
        home.body
    );
}

/// A job whose lost attempt waits for a runner in another PID namespace: its page says why,
/// and whether a runner is registered there. The state is made with plain SQL: a runner row of
/// this host and boot in a namespace that is not this one, named by the job's marker
/// (`teardown_worker`); tests/recovery/namespace.rs makes it with `unshare`.
#[test]
fn a_job_page_says_why_its_teardown_waits_for_a_runner_in_another_namespace() {
    use std::os::unix::fs::MetadataExt;
    let t = TestDb::new();
    let db = t.path.as_path();
    let id = add(db, &[], &["true"]);
    let host = nix::unistd::gethostname().unwrap().into_string().unwrap();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let boot = boot.trim();
    let elsewhere = std::fs::metadata("/proc/self/ns/pid").unwrap().ino() + 1;
    let worker = format!("{host}:1:0123abcd");
    let now = leasehold::now_ms();
    let conn = t.bare();
    // Alive by its lease (an hour from now): from another namespace its pid proves nothing.
    conn.execute(
        "INSERT INTO runners (worker_id, pid, proc_start_time, boot_id, host, started_at,
             heartbeat_at, lease_ttl_ms, heartbeat_interval_ms, max_recovery_attempts, pid_ns)
         VALUES (?1, 1, 1, ?2, ?3, ?4, ?4, 3600000, 1000, 3, ?5)",
        rusqlite::params![worker, boot, host, now, elsewhere as i64],
    )
    .unwrap();
    conn.execute(
        "UPDATE jobs SET teardown_token = '0123456789abcdef0123456789abcdef',
             teardown_pgid = 1, teardown_start_time = 1, teardown_worker = ?2
         WHERE id = ?1",
        rusqlite::params![id, worker],
    )
    .unwrap();
    let server = Server::start(db, &[]);
    let teardown = || {
        let page = server.get(&format!("/jobs/{id}"));
        assert_eq!(page.status, 200, "{page:?}");
        let at = page
            .body
            .find("id=\"teardown\"")
            .unwrap_or_else(|| panic!("no teardown line: {}", page.body));
        let line = &page.body[at..];
        line[..line.find("</p>").unwrap()].to_string()
    };
    let why = format!(
        "teardown waits for a runner in PID namespace {elsewhere} on host {host} (boot {boot})"
    );
    let line = teardown();
    assert!(line.contains(&why), "{line}");
    assert!(
        line.contains(&format!(
            "runner {worker} is there and tears it down at its next sweep"
        )),
        "{line}"
    );
    // Once that runner has stopped, none is there: start one there, or force it.
    conn.execute(
        "UPDATE runners SET stopped_at = ?2 WHERE worker_id = ?1",
        rusqlite::params![worker, now],
    )
    .unwrap();
    let line = teardown();
    assert!(line.contains(&why), "{line}");
    assert!(line.contains("no runner is registered there"), "{line}");
    assert!(line.contains("leasehold jobs retry --force"), "{line}");
}

/// A time as the pages show it (`2024-01-31T12:00:00.000Z`), computed by date(1).
fn render_time(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let out = Command::new("date")
        .args(["-u", "-d", &format!("@{secs}"), "+%Y-%m-%dT%H:%M:%S"])
        .output()
        .unwrap();
    format!(
        "{}.{:03}Z",
        String::from_utf8(out.stdout).unwrap().trim(),
        ms.rem_euclid(1000)
    )
}

#[test]
fn bad_paths_and_parameters_get_400_or_404_and_the_server_goes_on() {
    let t = TestDb::new();
    three_jobs(&t);
    let server = Server::start(&t.path, &[]);
    server.get("/jobs/999999").refused(404);
    server.get("/jobs/abc").refused(400);
    server.get("/jobs/1.5").refused(400);
    server.get("/jobs/99999999999999999999999").refused(400);
    server
        .get("/jobs?before=99999999999999999999999")
        .refused(400);
    server.get("/jobs?before=0").refused(400);
    server.get("/jobs?before=-1").refused(400);
    server.get("/jobs?before=x").refused(400);
    // Numbered pages are gone, and an old link says so rather than showing the first page.
    let numbered = server.get("/jobs?page=2");
    numbered.refused(400);
    assert!(numbered.body.contains("before="), "{numbered:?}");
    server.get("/jobs?status=done").refused(400);
    server.get("/jobs?queue=%ff").refused(400);
    server.get("/jobs/../etc/passwd").refused(400);
    server.get("/%2e%2e/%2e%2e/etc/passwd").refused(400);
    server.get("/jobs/%2E%2E").refused(400);
    server.raw(b"NOT HTTP\r\n\r\n").refused(400);
    server
        .raw(b"GET http://example.com/ HTTP/1.1\r\n\r\n")
        .refused(400);
    // A DNS-rebinding page reaches us under its own name: refused.
    server
        .raw(b"GET / HTTP/1.1\r\nHost: attacker.example:7433\r\n\r\n")
        .refused(421);
    // Oversized: a 64 KiB header, then a 1 MiB body.
    let big = format!("GET / HTTP/1.1\r\nX-Big: {}\r\n\r\n", "a".repeat(64 * 1024));
    server.raw(big.as_bytes()).refused(400);
    let body = "a".repeat(1024 * 1024);
    server
        .raw(
            format!(
                "POST /jobs/1/retry HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .refused(400);
    assert_eq!(server.get("/healthz").status, 200, "still serving");
}

/// The job ids a list page links to, in its order, and its link to the next page.
fn list_page(reply: &Reply) -> (Vec<i64>, Option<String>) {
    assert_eq!(reply.status, 200, "{reply:?}");
    let table = reply.body.split("id=\"job-list\"").nth(1).unwrap_or("");
    let ids = table
        .split("href=\"/jobs/")
        .skip(1)
        .map(|s| s.split('"').next().unwrap().parse().unwrap())
        .collect();
    let next = reply
        .body
        .split("rel=\"next\" href=\"")
        .nth(1)
        .map(|s| s.split('"').next().unwrap().replace("&amp;", "&"));
    (ids, next)
}

/// Follows a list's "older" links from `first`: every id it shows, and how many pages.
fn walk(server: &Server, first: &str) -> (Vec<i64>, usize) {
    let (mut ids, mut pages, mut next) = (Vec::new(), 0, Some(first.to_string()));
    while let Some(link) = next {
        assert!(pages < 10, "the pages end");
        let (page, after) = list_page(&server.get(&link));
        assert!(page.len() <= 50, "{link}: {page:?}");
        ids.extend(page);
        pages += 1;
        next = after;
    }
    (ids, pages)
}

#[test]
fn keyset_pages_visit_every_job_of_a_filter_once_newest_first() {
    let t = TestDb::new();
    // 120 jobs, interleaved over two queues: 72 in `a`, 48 in `b`.
    let queue = |i: usize| if i % 5 < 3 { "a" } else { "b" };
    let jobs: Vec<leasehold::Job> = (0..120)
        .map(|i| leasehold::Job::shell("true").queue(queue(i)))
        .collect();
    let ids = t.store().enqueue_many(&jobs).unwrap();
    let of = |q: &str| -> Vec<i64> {
        let mut v: Vec<i64> = ids
            .iter()
            .enumerate()
            .filter(|(i, _)| queue(*i) == q)
            .map(|(_, id)| *id)
            .collect();
        v.reverse();
        v
    };
    let mut all = ids.clone();
    all.reverse();
    let server = Server::start(&t.path, &[]);
    assert_eq!(walk(&server, "/jobs?queue=a"), (of("a"), 2));
    assert_eq!(walk(&server, "/jobs?queue=b"), (of("b"), 1));
    assert_eq!(walk(&server, "/jobs?status=pending&queue=a"), (of("a"), 2));
    assert_eq!(walk(&server, "/jobs"), (all, 3));
    // A page starts below its id, with the filters kept in its links.
    let (page, next) = list_page(&server.get(&format!("/jobs?queue=b&before={}", of("b")[9])));
    assert_eq!(page, of("b")[10..]);
    assert_eq!(next, None);
    assert!(walk(&server, "/jobs?status=failed&queue=a").0.is_empty());
    server.get("/jobs?queue=a&before=a").refused(400);
}

/// The CSRF token in a job page's forms.
fn token(page: &str) -> String {
    let at = page
        .find("name=\"csrf\" value=\"")
        .unwrap_or_else(|| panic!("no CSRF field in {page}"));
    page[at + 19..].split('"').next().unwrap().to_string()
}

pub fn status_of(t: &TestDb, id: i64) -> String {
    t.job(id).status.as_str().to_string()
}

#[test]
fn actions_are_off_by_default_and_a_post_changes_nothing() {
    let t = TestDb::new();
    let (_, failed, pending) = three_jobs(&t);
    let server = Server::start(&t.path, &[]);
    let page = server.get(&format!("/jobs/{failed}"));
    assert!(!page.body.contains("<form method=\"post\""), "no buttons");
    assert!(!page.body.contains("csrf"));
    let events_before = t.store().events(failed).unwrap().len();
    server
        .post(&format!("/jobs/{failed}/retry"), "csrf=anything")
        .refused(403);
    server
        .post(&format!("/jobs/{pending}/cancel"), "")
        .refused(403);
    server.get(&format!("/jobs/{failed}/retry")).refused(405);
    assert_eq!(status_of(&t, failed), "failed");
    assert_eq!(status_of(&t, pending), "pending");
    assert_eq!(t.store().events(failed).unwrap().len(), events_before);
}

#[test]
fn actions_need_the_token_and_with_it_retry_and_cancel() {
    let t = TestDb::new();
    let (_, failed, pending) = three_jobs(&t);
    let server = Server::start(&t.path, &["--allow-actions"]);
    let page = server.get(&format!("/jobs/{failed}"));
    let token = token(&page.body);
    assert_eq!(token.len(), 32);

    let retry = format!("/jobs/{failed}/retry");
    server.post(&retry, "").refused(403);
    server.post(&retry, "csrf=").refused(403);
    server
        .post(&retry, &format!("csrf={}", "0".repeat(32)))
        .refused(403);
    assert_eq!(status_of(&t, failed), "failed", "nothing changed");

    let done = server.post(&retry, &format!("csrf={token}"));
    assert_eq!(done.status, 303, "{done:?}");
    assert_eq!(
        done.header("location"),
        Some(format!("/jobs/{failed}").as_str())
    );
    assert_eq!(status_of(&t, failed), "pending");

    let cancel = format!("/jobs/{pending}/cancel");
    server.post(&cancel, "csrf=wrong").refused(403);
    assert_eq!(status_of(&t, pending), "pending");
    assert_eq!(server.post(&cancel, &format!("csrf={token}")).status, 303);
    assert_eq!(status_of(&t, pending), "cancelled");
    // What the library refuses is a 409 page, not a change.
    server.post(&cancel, &format!("csrf={token}")).refused(409);
    server
        .post("/jobs/424242/retry", &format!("csrf={token}"))
        .refused(404);
}

#[test]
fn a_missing_database_is_one_line_and_exit_1_and_is_not_created() {
    let t = TestDb::new();
    let line = fails(&mut cli(&t.path, &["serve", "--listen", "127.0.0.1:0"]), 1);
    assert!(
        line.contains("does not exist") || line.contains("no such"),
        "{line}"
    );
    assert!(!t.path.exists());
    fails(&mut cli(&t.path, &["serve", "--listen", "nowhere"]), 2);
}

#[test]
fn an_older_schema_is_refused_and_left_as_it_was() {
    let t = TestDb::new();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1.db");
    std::fs::copy(&fixture, &t.path).unwrap();
    let before = std::fs::read(&t.path).unwrap();
    let line = fails(&mut cli(&t.path, &["serve", "--listen", "127.0.0.1:0"]), 1);
    assert!(line.contains("db migrate"), "{line}");
    assert_eq!(std::fs::read(&t.path).unwrap(), before, "not migrated");
}

/// The sockets `pid` holds open (its listener and its connections).
fn sockets_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.filter_map(Result::ok)
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter(|target| target.to_string_lossy().starts_with("socket:"))
                .count()
        })
        .unwrap_or(0)
}

/// Sends `raw` and reads the response until the server closes, within `limit` in all; `None`
/// when it has not closed by then. A behaviour check with a generous bound, not a benchmark.
fn answer_within(addr: SocketAddr, raw: &[u8], limit: Duration) -> Option<Vec<u8>> {
    let deadline = Instant::now() + limit;
    let mut s = TcpStream::connect_timeout(&addr, limit).ok()?;
    s.write_all(raw).ok()?;
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut chunk) {
            Ok(0) => return Some(bytes),
            Ok(n) => bytes.extend_from_slice(&chunk[..n]),
            // Closed with a reset: what arrived before it is the answer.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Some(bytes),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

#[test]
fn idle_connections_do_not_stop_others_from_being_answered() {
    let t = TestDb::new();
    three_jobs(&t);
    let server = Server::start(&t.path, &[]);
    let before = sockets_of(server.child.id());
    // Twice as many idle connections as the server has threads: half send nothing, half
    // half a request head.
    let idle: Vec<TcpStream> = (0..8)
        .map(|i| {
            let mut s = TcpStream::connect(server.addr).unwrap();
            if i % 2 == 1 {
                s.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                    .unwrap();
            }
            s
        })
        .collect();
    // The server has accepted them all (each is a socket of its own).
    wait_for(
        "the idle connections' accept",
        Duration::from_secs(5),
        || (sockets_of(server.child.id()) >= before + idle.len()).then_some(()),
    );
    let host = server.addr;
    let health = answer_within(
        server.addr,
        format!("GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes(),
        Duration::from_secs(1),
    )
    .expect("/healthz is answered within a second beside 8 idle connections");
    assert_eq!(Reply::parse(&health).status, 200);
    let home = answer_within(
        server.addr,
        format!(
            "GET / HTTP/1.1\r\nHost: {host}\r\nCookie: {}\r\n\r\n",
            server.cookie()
        )
        .as_bytes(),
        Duration::from_secs(1),
    )
    .expect("/ is answered within a second beside 8 idle connections");
    assert_eq!(Reply::parse(&home).status, 200, "the overview, logged in");
    drop(idle);
}

#[test]
fn a_connection_without_a_whole_request_is_closed_at_the_head_deadline() {
    let t = TestDb::new();
    three_jobs(&t);
    let server = Server::start(&t.path, &[]);
    // The deadline is 2 s from the accept; 8 s leaves room for a loaded machine and is short
    // of the 10 s the server allowed before. (Once, in CI, the half head below was not
    // answered within 6 s; not seen again in 60 runs, 24 of them 8 at a time: the log and
    // the time taken are printed should it come back.)
    let limit = Duration::from_secs(8);
    let started = std::time::Instant::now();
    let silent = answer_within(server.addr, b"", limit).unwrap_or_else(|| {
        panic!(
            "a silent connection is not closed after {:?}; serve's log:\n{}",
            started.elapsed(),
            server.log()
        )
    });
    assert!(silent.is_empty(), "closed without an answer: {silent:?}");
    let started = std::time::Instant::now();
    let half = answer_within(
        server.addr,
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n",
        limit,
    )
    .unwrap_or_else(|| {
        panic!(
            "a connection with half a head is not closed after {:?}; serve's log:\n{}",
            started.elapsed(),
            server.log()
        )
    });
    assert_eq!(Reply::parse(&half).status, 408, "{half:?}");
    assert_eq!(server.get("/healthz").status, 200, "still serving");
}

#[test]
fn past_256_connections_without_a_request_a_client_gets_503_and_then_service_resumes() {
    let t = TestDb::new();
    three_jobs(&t);
    let server = Server::start(&t.path, &[]);
    let before = sockets_of(server.child.id());
    // All from 127.0.0.1, so the bound on one remote peer (32) does not apply: the total does.
    let idle: Vec<TcpStream> = (0..256)
        .map(|_| TcpStream::connect(server.addr).unwrap())
        .collect();
    wait_for(
        "the idle connections' accept",
        Duration::from_secs(10),
        || (sockets_of(server.child.id()) >= before + idle.len()).then_some(()),
    );
    let busy = answer_within(
        server.addr,
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        Duration::from_secs(5),
    )
    .expect("refused at once");
    let busy = Reply::parse(&busy);
    assert_eq!(busy.status, 503, "{busy:?}");
    assert_eq!(busy.body, "busy: try again\n");
    drop(idle);
    // Once they are closed, the places are free again.
    wait_for("/healthz answered 200", Duration::from_secs(10), || {
        (server.get("/healthz").status == 200).then_some(())
    });
}

// --- A real browser -------------------------------------------------------------------------

/// Fails the test, saying how to fix it, when Chromium is not installed.
pub fn need_chromium() {
    let which = Command::new("sh")
        .args(["-c", "command -v chromium"])
        .output()
        .unwrap();
    assert!(
        which.status.success(),
        "these tests need Chromium: apt-get install -y chromium (.ci/run does)"
    );
}

/// How the tests start headless Chromium: no sandbox (CI runs as root), no GPU, and nothing
/// fetched from the network behind the page's back.
pub const CHROMIUM_FLAGS: [&str; 8] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
];

/// Headless Chromium with the flags that keep it quiet and local.
pub(crate) fn chromium(args: &[&str]) -> String {
    need_chromium();
    let profile = tempfile::tempdir().unwrap();
    let out = tempfile::NamedTempFile::new().unwrap();
    let mut child = {
        use std::os::unix::process::CommandExt;
        Command::new("chromium")
            .args(CHROMIUM_FLAGS)
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.reopen().unwrap())
            .stderr(Stdio::null())
            // Its own group, so that it and its helpers are ended together.
            .process_group(0)
            .spawn()
            .expect("chromium starts")
    };
    let pgid = Pid::from_raw(child.id() as i32);
    let status = poll(Duration::from_secs(90), || child.try_wait().unwrap());
    let _ = killpg(pgid, Signal::SIGKILL);
    let _ = child.wait();
    let status = status.expect("chromium finished within 90 s");
    assert!(status.success(), "chromium failed: {status:?}");
    std::fs::read_to_string(out.path()).unwrap()
}

/// The DOM after the page loaded (and ran whatever script it could).
pub(crate) fn dump_dom(url: &str) -> String {
    chromium(&["--dump-dom", url])
}

/// The text of the element after `marker` in a serialized DOM, up to the next tag.
pub(crate) fn number_after(dom: &str, marker: &str) -> u64 {
    let at = dom
        .find(marker)
        .unwrap_or_else(|| panic!("{marker} not in the DOM"));
    let rest = &dom[at + marker.len()..];
    let text = &rest[rest.find("\">").unwrap() + 2..];
    let text = &text[..text.find('<').unwrap()];
    text.parse()
        .unwrap_or_else(|_| panic!("{marker}: {text:?} is not a number in {dom}"))
}

/// The text of the element after `marker`, up to the next tag.
pub(crate) fn text_after<'a>(dom: &'a str, marker: &str) -> &'a str {
    let at = dom
        .find(marker)
        .unwrap_or_else(|| panic!("{marker} not in the DOM"));
    let rest = &dom[at + marker.len()..];
    let text = &rest[rest.find('>').unwrap() + 1..];
    &text[..text.find('<').unwrap()]
}

#[test]
fn the_browser_shows_the_counts_the_database_holds_and_saves_a_screenshot() {
    let t = TestDb::new();
    let db = t.path.as_path();
    add(db, &[], &["true"]);
    add(db, &[], &["true"]);
    add(db, &[], &["false"]);
    run_until_idle(db, &[]);
    let cancel = add(db, &[], &["true"]);
    ok(&mut cli(db, &["jobs", "cancel", &cancel.to_string()]));
    let mail: Vec<i64> = (0..3)
        .map(|_| add(db, &["--queue", "mail"], &["true"]))
        .collect();
    // Two jobs that wait for a dependency, one of them in a paused queue with a limit.
    add(
        db,
        &["--queue", "mail", "--after", &mail[0].to_string()],
        &["true"],
    );
    add(db, &["--after", &mail[1].to_string()], &["true"]);
    ok(&mut cli(db, &["queues", "limit", "mail", "2"]));
    ok(&mut cli(db, &["queues", "pause", "mail"]));
    ok(&mut cli(
        db,
        &[
            "schedules",
            "add",
            "nightly<b>",
            "--cron",
            "0 3 * * *",
            "--tz",
            "Europe/Paris",
            "--",
            "true",
        ],
    ));
    let counts = t.store().counts().unwrap();
    assert_eq!(
        (
            counts.pending,
            counts.succeeded,
            counts.failed,
            counts.cancelled
        ),
        (5, 2, 1, 1)
    );
    let queues = t.store().queues().unwrap();
    let held_waiting: u64 = queues.iter().map(|q| q.waiting).sum();
    assert_eq!(held_waiting, 2);
    let server = Server::start(db, &[]);
    // The URL `serve` printed logs in and lands on the overview.
    let dom = dump_dom(&server.login_url());
    for (status, n) in [
        ("pending", counts.pending),
        ("running", counts.running),
        ("succeeded", counts.succeeded),
        ("failed", counts.failed),
        ("cancelled", counts.cancelled),
    ] {
        assert_eq!(
            number_after(&dom, &format!("data-status=\"{status}\"")),
            n,
            "{status} in {dom}"
        );
    }
    assert_eq!(number_after(&dom, "id=\"total\""), 9);
    assert_eq!(
        number_after(&dom, "data-queue=\"mail\" data-queue-status=\"pending\""),
        4,
        "the queue's depth in {dom}"
    );
    // The queue's limit and pause, and its waiting job, as the database holds them.
    let mail = queues.iter().find(|q| q.name == "mail").unwrap();
    assert_eq!((mail.limit, mail.paused, mail.waiting), (Some(2), true, 1));
    assert_eq!(
        text_after(&dom, "data-queue=\"mail\" data-queue-field=\"limit\""),
        "2",
        "{dom}"
    );
    assert_eq!(
        text_after(&dom, "data-queue=\"mail\" data-queue-field=\"paused\""),
        "yes"
    );
    assert_eq!(
        text_after(&dom, "data-queue=\"mail\" data-queue-status=\"waiting\""),
        "1"
    );
    assert_eq!(
        text_after(&dom, "data-queue=\"default\" data-queue-field=\"paused\""),
        "no"
    );
    assert_eq!(
        text_after(&dom, "id=\"waiting-total\""),
        held_waiting.to_string()
    );
    // The schedule, its name shown as text (not markup), with its next slot in both zones.
    let schedule = &t.store().schedules().unwrap()[0];
    assert!(!dom.contains("nightly<b>"), "{dom}");
    let row = &dom[dom
        .find("data-schedule=\"nightly&lt;b&gt;\"")
        .unwrap_or_else(|| panic!("no schedule row in {dom}"))..];
    assert_eq!(text_after(row, "class=\"name\""), "nightly&lt;b&gt;");
    assert_eq!(text_after(row, "class=\"zone\""), "Europe/Paris");
    assert_eq!(text_after(row, "class=\"paused\""), "no");
    assert!(row.contains("<code>0 3 * * *</code>"), "{row}");
    let next = schedule
        .next_slot_at
        .expect("a cron schedule has a next slot");
    let row = &row[..row.find("</tr>").unwrap()];
    assert!(
        row.contains(&schedule.schedule.local_time(next)),
        "the next slot in Paris time in {row}"
    );
    assert!(
        row.contains("T02:00:00.000Z") || row.contains("T01:00:00.000Z"),
        "{row}"
    );

    let shot = screenshot_path();
    let _ = std::fs::remove_file(&shot);
    chromium(&[
        &format!("--screenshot={}", shot.display()),
        "--window-size=1280,1400",
        &server.login_url(),
    ]);
    let png = std::fs::read(&shot).expect("the screenshot is written");
    assert!(png.starts_with(b"\x89PNG"), "a PNG at {}", shot.display());
}

/// Where the overview's screenshot is kept: `target/tmp/dashboard/overview.png`.
fn screenshot_path() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("overview.png")
}

#[test]
fn the_browser_shows_a_jobs_events_and_runs_none_of_its_markup() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let evil = "<script>document.title='pwned';document.body.appendChild(document.createElement('blink')).id='xss'</script><img src=x onerror=\"document.title='pwned'\">";
    let id = add(
        db,
        &["--env", &format!("EVIL={evil}")],
        &[
            "sh",
            "-c",
            "printf '%s\\n' \"$0\"; printf '%s' \"$0\" >&2",
            evil,
        ],
    );
    run_until_idle(db, &[]);
    let events: Vec<String> = t
        .store()
        .events(id)
        .unwrap()
        .iter()
        .map(|e| e.kind.to_string())
        .collect();
    // --show-env: the environment's value is shown (as text) too.
    let server = Server::start(db, &["--show-env"]);
    let mut browser = Browser::start();
    browser.navigate(&server.login_url());
    browser.navigate(&server.url(&format!("/jobs/{id}")));
    let dom = browser.html();

    // Its events, in order.
    let shown: Vec<&str> = dom
        .split("<td class=\"kind\">")
        .skip(1)
        .map(|s| &s[..s.find('<').unwrap()])
        .collect();
    assert_eq!(shown, events, "{dom}");
    assert!(events.contains(&"succeeded".to_string()));

    // Nothing ran: the title is ours, no element was added, no image was made.
    assert!(dom.contains("<title>Job "), "{dom}");
    assert!(!dom.contains("pwned</title>"));
    assert!(!dom.contains("id=\"xss\""), "{dom}");
    assert!(!dom.contains("<blink"), "{dom}");
    assert!(!dom.contains("<img"), "{dom}");
    assert!(!dom.contains("<script"), "{dom}");
    // And all of it is there as text: in argv, env, stdout and stderr.
    let as_text = "&lt;script&gt;document.title='pwned'";
    assert!(dom.matches(as_text).count() >= 4, "{dom}");
    assert!(dom.contains("&lt;img src=x onerror=\"document.title='pwned'\"&gt;"));
}

crate::on_both! {
    fn every_route_answers_with_its_status_and_content_type(t) {
        let (ok_id, failed, _) = three_jobs(&t);
        let server = Server::start(&t.target(), &[]);

        let home = server.get("/");
        assert_eq!(home.status, 200, "{home:?}");
        assert_eq!(home.content_type(), "text/html; charset=utf-8");
        assert!(home.body.contains("Lease counters (job_leases)"));
        assert!(home.body.contains("stale_running"));
        for section in [
            "id=\"schedules\"",
            "id=\"queue-counts\"",
            "id=\"dependencies\"",
        ] {
            assert!(home.body.contains(section), "{section} missing");
        }
        // Safe headers on every page: no script may run, nothing may frame it.
        let csp = home.header("content-security-policy").unwrap();
        assert!(csp.contains("default-src 'none'"), "{csp}");
        assert_eq!(home.header("x-frame-options"), Some("DENY"));

        let list = server.get("/jobs?status=failed");
        assert_eq!(list.status, 200);
        assert_eq!(list.content_type(), "text/html; charset=utf-8");
        assert!(list.body.contains(&format!("href=\"/jobs/{failed}\"")));
        assert!(!list.body.contains(&format!("href=\"/jobs/{ok_id}\"")));
        assert_eq!(server.get("/jobs?queue=later&before=1000").status, 200);

        let job = server.get(&format!("/jobs/{failed}"));
        assert_eq!(job.status, 200);
        assert_eq!(job.content_type(), "text/html; charset=utf-8");
        assert!(job.body.contains("boom"), "the stderr tail is shown");
        assert!(job.body.contains("exit 3"));

        let health = server.get("/healthz");
        assert_eq!(health.status, 200);
        assert_eq!(health.content_type(), "text/plain; charset=utf-8");
        assert_eq!(health.body, "ok\n");

        // The stylesheet is its own route: the CSP allows no inline style.
        assert!(home.body.contains("href=\"/style.css\""));
        assert!(csp.contains("style-src 'self'"), "{csp}");
        let css = server.get("/style.css");
        assert_eq!(css.status, 200);
        assert_eq!(css.content_type(), "text/css; charset=utf-8");
        assert!(css.body.contains("font"), "{css:?}");

        let head = server.request("HEAD", "/", "", "");
        assert_eq!(head.status, 200);
        assert!(head.body.is_empty());

        let delete = server.request("DELETE", "/jobs", "", "");
        delete.refused(405);
        assert_eq!(delete.header("allow"), Some("GET, HEAD"));
        server.get("/nothing/here").refused(404);
    }


    fn metrics_is_the_exposition_and_its_job_counts_are_the_databases(t) {
        let target = t.target();
        let db = target.as_path();
        let (_, failed, _) = three_jobs(&t);
        ok(&mut cli(db, &["jobs", "retry", &failed.to_string()]));
        let cancel = add(db, &["--queue", "mail"], &["true"]);
        ok(&mut cli(db, &["jobs", "cancel", &cancel.to_string()]));
        add(db, &["--queue", "mail"], &["true"]);
        let server = Server::start(db, &[]);

        let reply = server.get("/metrics");
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_eq!(
            reply.content_type(),
            "text/plain; version=0.0.4; charset=utf-8"
        );
        // Strict: every line a comment or a valid sample, each family typed before its samples.
        let exposition = parse(&reply.body);
        assert_eq!(
            exposition.types.get("leasehold_jobs").map(String::as_str),
            Some("gauge")
        );
        let mut held: BTreeMap<(String, String), u64> = BTreeMap::new();
        for j in t.store().list(&ListFilter::default()).unwrap() {
            *held
                .entry((j.queue.clone(), j.status.as_str().to_string()))
                .or_default() += 1;
        }
        assert_eq!(held.values().sum::<u64>(), 5);
        for ((queue, status), n) in &held {
            assert_eq!(
                exposition.value("leasehold_jobs", &[("queue", queue), ("status", status)]),
                *n as f64,
                "{queue} {status} in {}",
                reply.body
            );
        }
        assert_eq!(exposition.sum("leasehold_jobs"), 5.0, "{}", reply.body);

        // HEAD has the headers and no body; anything else is refused and changes nothing.
        let head = server.request("HEAD", "/metrics", "", "");
        assert_eq!(head.status, 200);
        assert!(head.body.is_empty());
        let before = t.store().counts().unwrap();
        let post = server.post("/metrics", "");
        post.refused(405);
        assert_eq!(post.header("allow"), Some("GET, HEAD"));
        assert_eq!(t.store().counts().unwrap(), before);
        let jobs_lines = |body: &str| -> Vec<String> {
            body.lines()
                .filter(|l| l.starts_with("leasehold_jobs{") || l.contains("_total"))
                .map(str::to_string)
                .collect()
        };
        assert_eq!(
            jobs_lines(&server.get("/metrics").body),
            jobs_lines(&reply.body),
            "a scrape changes no count"
        );
    }
}
