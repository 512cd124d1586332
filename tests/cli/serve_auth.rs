//! `serve`'s secret, Host check and masked environment: nothing without the secret (for a
//! request without the cookie and for another local user), forged and rebinding Hosts
//! refused on and off loopback, the printed URL logging a real browser in, `/metrics` with a
//! bearer from `--token-file`, and environment values hidden unless `--show-env`.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use serde_json::json;

use crate::cdp::Browser;
use crate::helper::{OtherUser, add, cli, fails};
use crate::serve::{Server, status_of, three_jobs};
use crate::util::{TestDb, wait_until};

/// The value no response may show without `--show-env`.
const SECRET_VALUE: &str = "s3cret";

/// Every route but `/healthz`, as a path to GET.
fn guarded_routes(job: i64) -> Vec<String> {
    vec![
        "/".into(),
        "/jobs".into(),
        "/jobs?status=pending".into(),
        format!("/jobs/{job}"),
        "/metrics".into(),
        "/style.css".into(),
        "/no/such/page".into(),
    ]
}

#[test]
fn without_the_secret_every_route_but_healthz_is_refused() {
    let t = TestDb::new();
    let (_, failed, _) = three_jobs(&t);
    let job = add(&t.path, &["--env", "API_KEY=s3cret"], &["true"]);
    let server = Server::start(&t.path, &["--allow-actions", "--show-env"]);
    assert_eq!(
        server.secret.as_deref().map(str::len),
        Some(64),
        "32 bytes, hex"
    );

    for path in guarded_routes(job) {
        let reply = server.anonymous(&path, "");
        assert_eq!(reply.status, 401, "{path}: {reply:?}");
        assert!(reply.header("set-cookie").is_none(), "{path}");
        assert!(!reply.body.contains(SECRET_VALUE), "{path}: {reply:?}");
        assert!(!reply.body.contains("csrf"), "{path}: {reply:?}");
        assert!(
            reply
                .header("www-authenticate")
                .is_some_and(|h| h.starts_with("Bearer")),
            "{path}: {reply:?}"
        );
        if path != "/metrics" {
            assert!(
                reply.body.contains("printed"),
                "says how to log in: {reply:?}"
            );
        }
    }
    // A wrong cookie is no cookie, and a HEAD or a POST get nothing either.
    let wrong = server.anonymous(&format!("/jobs/{job}"), "Cookie: leasehold_session=0\r\n");
    wrong.refused(401);
    let forged = format!(
        "POST /jobs/{failed}/retry HTTP/1.1\r\nHost: {}\r\nContent-Length: 10\r\n\r\ncsrf=guess",
        server.addr
    );
    server.raw(forged.as_bytes()).refused(401);
    assert_eq!(status_of(&t, failed), "failed", "nothing changed");

    // /login without the secret, or with another: 403, no cookie.
    for path in [
        "/login".to_string(),
        "/login?token=".to_string(),
        format!("/login?token={}", "0".repeat(64)),
    ] {
        let reply = server.anonymous(&path, "");
        reply.refused(403);
        assert!(reply.header("set-cookie").is_none(), "{reply:?}");
    }

    // /healthz stays open, for a load balancer or a supervisor.
    let health = server.anonymous("/healthz", "");
    assert_eq!((health.status, health.body.as_str()), (200, "ok\n"));

    // With the secret: a cookie the page's scripts cannot read, and a clean URL.
    let login = server.anonymous(&server.login_url()[server.url("").len()..], "");
    assert_eq!(login.status, 303, "{login:?}");
    assert_eq!(login.header("location"), Some("/"));
    let cookie = login.header("set-cookie").unwrap();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(cookie.contains(attribute), "{cookie}");
    }
    let page = server.get(&format!("/jobs/{job}"));
    assert_eq!(page.status, 200, "{page:?}");
    assert!(page.body.contains(SECRET_VALUE), "--show-env, logged in");
    // The cookie is a session value, not the secret: a browser sends 127.0.0.1's cookies to
    // every port, so the cookie must not be what a scraper or a later login needs.
    let secret = server.secret.clone().unwrap();
    assert!(!cookie.contains(&secret), "{cookie}");
    server
        .anonymous("/", &format!("Cookie: leasehold_session={secret}\r\n"))
        .refused(401);
}

/// A raw HTTP GET of `path` on `port` as `user`, with `headers` (CRLF-ended), by bash's
/// /dev/tcp (curl may not be installed).
fn get_as(user: &OtherUser, port: u16, path: &str, headers: &str) -> String {
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{headers}Connection: close\r\n\r\n"
    );
    user.bash(&format!(
        "exec 3<>/dev/tcp/127.0.0.1/{port} && printf '%s' '{request}' >&3 && cat <&3"
    ))
}

/// The status code of a raw response.
fn status(response: &str) -> u16 {
    response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"))
}

#[test]
fn another_local_user_reads_nothing_without_the_secret() {
    let t = TestDb::new();
    let job = add(&t.path, &["--env", "API_KEY=s3cret"], &["true"]);
    // --show-env: the value would be on the page for whoever gets in.
    let server = Server::start(&t.path, &["--show-env"]);
    let port = server.addr.port();
    let user = OtherUser::new();
    let uid = user.bash("id -u");
    assert!(
        !uid.trim().is_empty() && uid.trim() != "0",
        "runs as {uid:?}"
    );
    // The file itself is closed to them (mode 0600)...
    assert_eq!(
        std::fs::metadata(&t.path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // ...and so is the dashboard.
    for path in guarded_routes(job) {
        let reply = get_as(&user, port, &path, "");
        assert_eq!(status(&reply), 401, "{path}: {reply}");
        assert!(!reply.contains(SECRET_VALUE), "{path}: {reply}");
        assert!(!reply.contains("API_KEY"), "{path}: {reply}");
    }
    let login = get_as(&user, port, "/login", "");
    assert_eq!(status(&login), 403, "{login}");
    assert!(
        !login.to_ascii_lowercase().contains("set-cookie"),
        "{login}"
    );
    // The same client with the cookie gets in: the refusals above were the secret's doing.
    let page = get_as(
        &user,
        port,
        &format!("/jobs/{job}"),
        &format!("Cookie: {}\r\n", server.cookie()),
    );
    assert_eq!(status(&page), 200, "{page}");
    assert!(page.contains(SECRET_VALUE));
}

#[test]
fn a_forged_or_rebinding_host_is_refused_on_and_off_loopback() {
    let t = TestDb::new();
    let (_, failed, _) = three_jobs(&t);
    let loopback = Server::start(&t.path, &[]);
    let wildcard = Server::start_on(&t.path, "0.0.0.0:0", &["--allow-host", "dash.example"]);
    for server in [&loopback, &wildcard] {
        let port = server.addr.port();
        for host in [
            "evil.example".to_string(),
            format!("rebind.example.com:{port}"),
            format!("localhost.rebind.example.com:{port}"),
            format!("127.0.0.1.nip.io:{port}"),
        ] {
            // Even with a valid cookie: a page under that name must not read ours.
            for path in [
                "/".to_string(),
                format!("/jobs/{failed}"),
                "/metrics".into(),
            ] {
                let raw = format!(
                    "GET {path} HTTP/1.1\r\nHost: {host}\r\nCookie: {}\r\n\r\n",
                    server.cookie()
                );
                let reply = server.raw(raw.as_bytes());
                reply.refused(421);
                assert!(!reply.body.contains("boom"), "{reply:?}");
            }
        }
        // An address or localhost, with the cookie, is served.
        assert_eq!(server.get("/").status, 200);
        let localhost = format!(
            "GET / HTTP/1.1\r\nHost: localhost:{port}\r\nCookie: {}\r\n\r\n",
            server.cookie()
        );
        assert_eq!(server.raw(localhost.as_bytes()).status, 200);
    }
    // A name given with --allow-host passes the Host check, and still needs the secret.
    let port = wildcard.addr.port();
    let proxied = |cookie: &str| {
        wildcard
            .raw(format!("GET / HTTP/1.1\r\nHost: dash.example:{port}\r\n{cookie}\r\n").as_bytes())
    };
    proxied("").refused(401);
    assert_eq!(
        proxied(&format!("Cookie: {}\r\n", wildcard.cookie())).status,
        200
    );
    assert!(
        loopback
            .raw(b"GET / HTTP/1.1\r\nHost: dash.example\r\n\r\n")
            .status
            == 421,
        "allowed on the server that was told only"
    );
    // Off loopback, one warning at start that nothing is encrypted; none on loopback.
    assert!(
        wait_until(Duration::from_secs(10), || wildcard
            .log()
            .contains("not encrypted")),
        "{}",
        wildcard.log()
    );
    assert_eq!(wildcard.log().matches("not encrypted").count(), 1);
    assert!(wildcard.log().contains("SSH tunnel"), "{}", wildcard.log());
    assert!(!loopback.log().contains("not encrypted"));
    // A malformed --allow-host is a usage error.
    fails(
        &mut cli(
            &t.path,
            &["serve", "--listen", "127.0.0.1:0", "--allow-host", "a b"],
        ),
        2,
    );
}

#[test]
fn the_browser_logs_in_with_the_printed_url_and_retries_a_job() {
    let t = TestDb::new();
    let (_, failed, _) = three_jobs(&t);
    let server = Server::start(&t.path, &["--allow-actions"]);
    let mut browser = Browser::start();

    // Before logging in: the page says how, and shows nothing of the job.
    browser.navigate(&server.url(&format!("/jobs/{failed}")));
    let before = browser.html();
    assert!(before.contains("not logged in"), "{before}");
    assert!(!before.contains("<form"), "{before}");

    // The printed URL: the cookie, then the overview at a clean URL.
    browser.navigate(&server.login_url());
    assert_eq!(browser.location(), server.url("/"));
    let overview = browser.html();
    assert!(overview.contains("<h1>Overview</h1>"), "{overview}");
    assert!(overview.contains("id=\"status-counts\""), "{overview}");
    let cookies = browser.call("Network.getCookies", json!({}));
    let session = cookies["cookies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "leasehold_session")
        .unwrap_or_else(|| panic!("no session cookie in {cookies}"))
        .clone();
    assert_eq!(session["httpOnly"], json!(true), "{session}");
    assert_eq!(session["sameSite"], json!("Strict"), "{session}");
    assert_eq!(browser.evaluate("document.cookie"), json!(""), "HttpOnly");

    // The job's page, and its Retry button pressed.
    browser.navigate(&server.url(&format!("/jobs/{failed}")));
    let page = browser.html();
    assert!(page.contains("name=\"csrf\""), "{page}");
    browser.evaluate_and_wait(r#"document.querySelector('form[action$="/retry"]').submit()"#);
    assert_eq!(browser.location(), server.url(&format!("/jobs/{failed}")));
    assert_eq!(status_of(&t, failed), "pending", "retried from the browser");
    assert_eq!(
        browser.evaluate("document.getElementById('status').textContent"),
        json!("pending"),
        "the page it lands on shows the new status"
    );
}

#[test]
fn metrics_takes_the_bearer_and_a_token_file_must_be_private() {
    let t = TestDb::new();
    three_jobs(&t);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    let secret = "prometheus-secret-0123456789";
    std::fs::write(&file, format!("{secret}\n")).unwrap();
    let path = file.to_str().unwrap();
    let refused = |why: &str| {
        let line = fails(
            &mut cli(
                &t.path,
                &["serve", "--listen", "127.0.0.1:0", "--token-file", path],
            ),
            1,
        );
        assert!(line.contains(why), "{line}");
        assert!(line.contains(path), "names the file: {line}");
    };

    // Readable by others: refused before listening.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    refused("mode 0644");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
    refused("mode 0640");
    // Another user's file (root may chown it to `nobody`): refused even at 0600.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&file, Some(65534), None).unwrap();
    refused("owned by uid 65534");
    std::os::unix::fs::chown(&file, Some(nix::unistd::geteuid().as_raw()), None).unwrap();

    // Mode 0600, ours: its secret (the newline trimmed) is the bearer and the login.
    let server = Server::start(&t.path, &["--token-file", path]);
    assert_eq!(server.secret.as_deref(), Some(secret));
    let without = server.anonymous("/metrics", "");
    assert_eq!(without.status, 401, "{without:?}");
    assert!(!without.body.contains("leasehold_jobs"));
    assert_eq!(
        without.header("www-authenticate"),
        Some("Bearer realm=\"leasehold\"")
    );
    let wrong = server.anonymous(
        "/metrics",
        "Authorization: Bearer not-the-secret-at-all\r\n",
    );
    assert_eq!(wrong.status, 401);
    let scraped = server.anonymous("/metrics", &format!("Authorization: Bearer {secret}\r\n"));
    assert_eq!(scraped.status, 200, "{scraped:?}");
    assert!(scraped.body.contains("leasehold_jobs{"), "{scraped:?}");
    // The bearer is for /metrics: a page wants the cookie (a browser never sends a bearer).
    server
        .anonymous("/", &format!("Authorization: Bearer {secret}\r\n"))
        .refused(401);
    // Restarted with the same file: the same secret and login URL, but a new session, so a
    // cookie the last process handed out is worth nothing now.
    let old_cookie = server.cookie().to_string();
    drop(server);
    let server = Server::start(&t.path, &["--token-file", path]);
    assert_eq!(server.secret.as_deref(), Some(secret));
    assert_ne!(server.cookie(), old_cookie);
    server
        .anonymous("/", &format!("Cookie: {old_cookie}\r\n"))
        .refused(401);
    assert_eq!(server.get("/").status, 200);
    drop(server);

    // Missing, empty, a folder: refused.
    std::fs::write(&file, "\n").unwrap();
    refused("is empty");
    std::fs::remove_file(&file).unwrap();
    refused("cannot open");
    std::fs::create_dir(&file).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o700)).unwrap();
    refused("not a regular file");

    // A random secret (no --token-file) is a bearer for /metrics too.
    let server = Server::start(&t.path, &[]);
    let secret = server.secret.clone().unwrap();
    let scraped = server.anonymous("/metrics", &format!("Authorization: Bearer {secret}\r\n"));
    assert_eq!(scraped.status, 200, "{scraped:?}");
}

#[test]
fn environment_values_are_masked_unless_show_env() {
    let t = TestDb::new();
    let short = add(&t.path, &["--env", "API_KEY=s3cret"], &["true"]);
    let long = add(
        &t.path,
        &["--env", &format!("LONG={}", "x".repeat(40))],
        &["true"],
    );
    let server = Server::start(&t.path, &[]);
    let page = server.get(&format!("/jobs/{short}"));
    assert_eq!(page.status, 200, "{page:?}");
    assert!(page.body.contains("<code>API_KEY</code>"), "{}", page.body);
    assert!(!page.body.contains(SECRET_VALUE), "{}", page.body);
    let masked = |body: &str| -> String {
        let env = &body[body.find("id=\"env\"").expect("an env table")..];
        let env = &env[..env.find("</table>").unwrap()];
        let td = &env[env.find("<td><code>").unwrap() + 10..];
        td[..td.find('<').unwrap()].to_string()
    };
    let other = server.get(&format!("/jobs/{long}"));
    assert!(!other.body.contains(&"x".repeat(40)));
    // One mask for every value: not even the length is told.
    assert_eq!(masked(&page.body), masked(&other.body));
    assert!(!masked(&page.body).is_empty());
    drop(server);

    let server = Server::start(&t.path, &["--show-env"]);
    let page = server.get(&format!("/jobs/{short}"));
    assert!(page.body.contains("<code>s3cret</code>"), "{}", page.body);
}
