//! The overview as a dashboard: every queue, the recent failures and the charts, read over
//! HTTP from a real `leasehold serve` (the `Server` helper of `serve.rs`) and in Chromium.

use std::path::{Path, PathBuf};
use std::time::Duration;

use leasehold::Sample;

use crate::helper::{FAST, add, cli, ok, run_until_idle, stop};
use crate::serve::{Server, chromium, number_after};
use crate::util::{RunnerProcess, TestDb, wait_for};

#[test]
fn queues_with_only_finished_jobs_each_have_their_row_and_counts() {
    let t = TestDb::new();
    let db = t.path.as_path();
    // Three queues, each with only finished jobs once the runner is idle.
    add(db, &["--queue", "alpha"], &["true"]);
    add(db, &["--queue", "alpha"], &["true"]);
    add(db, &["--queue", "beta"], &["true"]);
    add(db, &["--queue", "beta"], &["false"]);
    add(db, &["--queue", "gamma"], &["false"]);
    let cancelled = add(db, &["--queue", "gamma"], &["true"]);
    ok(&mut cli(db, &["jobs", "cancel", &cancelled.to_string()]));
    run_until_idle(db, &[]);
    let counts = t.store().counts().unwrap();
    assert_eq!((counts.pending, counts.running), (0, 0));

    let server = Server::start(db, &[]);
    let page = server.get("/");
    assert_eq!(page.status, 200, "{page:?}");
    let cell = |queue: &str, status: &str| {
        number_after(
            &page.body,
            &format!("data-queue=\"{queue}\" data-queue-status=\"{status}\""),
        )
    };
    // (pending, running, succeeded, failed, cancelled) by queue.
    for (queue, want) in [
        ("alpha", [0, 0, 2, 0, 0]),
        ("beta", [0, 0, 1, 1, 0]),
        ("gamma", [0, 0, 0, 1, 1]),
    ] {
        let got =
            ["pending", "running", "succeeded", "failed", "cancelled"].map(|s| cell(queue, s));
        assert_eq!(got, want, "{queue} in {}", page.body);
        // Each count links to the job list filtered by queue and status.
        assert!(
            page.body
                .contains(&format!("href=\"/jobs?queue={queue}&amp;status=failed\"")),
            "{queue}'s link in {}",
            page.body
        );
    }
    // The links lead to the jobs they count.
    let list = server.get("/jobs?queue=beta&status=failed");
    assert_eq!(list.status, 200);
    assert_eq!(
        list.body
            .matches("<td class=\"failed\">failed</td>")
            .count(),
        1
    );
}

#[test]
fn recent_failures_name_the_failed_jobs_of_a_mix_newest_first() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let mut failing = Vec::new();
    for i in 0..30 {
        let queue = ["alpha", "beta", "gamma"][i % 3];
        if i % 5 == 2 {
            let script = format!("echo starting >&2; echo 'boom {i}' >&2; exit 3");
            failing.push(add(db, &["--queue", queue], &["sh", "-c", &script]));
        } else {
            add(db, &["--queue", queue], &["true"]);
        }
    }
    assert_eq!(failing.len(), 6);
    run_until_idle(db, &[]);
    assert_eq!(t.store().counts().unwrap().failed, 6);
    // Newest first, as the database ordered the endings.
    let newest_first: Vec<i64> = t
        .bare()
        .prepare("SELECT job_id FROM job_events WHERE kind = 'failed' ORDER BY id DESC")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    let mut sorted = newest_first.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, failing);

    let server = Server::start(db, &[]);
    let page = server.get("/");
    assert_eq!(page.status, 200, "{page:?}");
    let rows: Vec<&str> = page
        .body
        .split("<tr class=\"failure\" data-job=\"")
        .skip(1)
        .collect();
    let listed: Vec<i64> = rows
        .iter()
        .map(|r| r[..r.find('"').unwrap()].parse().unwrap())
        .collect();
    assert_eq!(listed, newest_first, "{}", page.body);
    for (row, id) in rows.iter().zip(&listed) {
        let row = &row[..row.find("</tr>").unwrap()];
        let i = failing.iter().position(|f| f == id).unwrap() * 5 + 2;
        assert!(row.contains(&format!("<code>boom {i}</code>")), "{row}");
        assert!(row.contains("<td class=\"kind\">exit</td>"), "{row}");
        assert!(row.contains(&format!("href=\"/jobs/{id}\"")), "{row}");
        assert!(row.contains("exit 3"), "the command in {row}");
    }
}

/// Every `<svg>…</svg>` of a page, each parsed as XML: the charts are well formed.
fn svgs(page: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = page;
    while let Some(at) = rest.find("<svg") {
        let end = rest[at..].find("</svg>").expect("every svg is closed") + at + "</svg>".len();
        let svg = &rest[at..end];
        let doc = roxmltree::Document::parse(svg).unwrap_or_else(|e| panic!("{e}: {svg}"));
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        out.push(svg.to_string());
        rest = &rest[end..];
    }
    out
}

/// The figure `id` of a page, up to its end.
fn figure<'a>(page: &'a str, id: &str) -> &'a str {
    let at = page
        .find(&format!("<figure class=\"chart\" id=\"{id}\""))
        .unwrap_or_else(|| panic!("no figure {id} in {page}"));
    let rest = &page[at..];
    &rest[..rest.find("</figure>").unwrap()]
}

/// The table behind a figure: per row, its `data-from` and the text of each series' cell.
fn table_rows(figure: &str) -> Vec<(i64, Vec<(String, String)>)> {
    figure
        .split("<tr data-from=\"")
        .skip(1)
        .map(|row| {
            let from = row[..row.find('"').unwrap()].parse().unwrap();
            let cells = row
                .split("data-series=\"")
                .skip(1)
                .map(|c| {
                    let name = c[..c.find('"').unwrap()].to_string();
                    let text = &c[c.find('>').unwrap() + 1..];
                    (name, text[..text.find('<').unwrap()].to_string())
                })
                .collect();
            (from, cells)
        })
        .collect()
}

/// Where the chart screenshots are kept: `target/tmp/dashboard/charts-WIDTH[-dark].png`.
fn chart_screenshot(width: u32, dark: bool) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!(
        "charts-{width}{}.png",
        if dark { "-dark" } else { "" }
    ))
}

#[test]
fn charts_of_a_real_runner_agree_with_its_samples_and_render_in_chromium() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let mut args = FAST.to_vec();
    args.extend(["--sample-interval", "1"]);
    let runner = RunnerProcess::start(db, &args);
    let samples = || t.store().samples().unwrap();
    // Waves of a known mix, each ended and sampled before the next: the charts get several
    // intervals with jobs in them.
    let mut ended = 0u64;
    for wave in 0..4 {
        for q in ["alpha", "beta", "gamma"] {
            add(db, &["--queue", q], &["true"]);
        }
        add(db, &["--queue", "beta"], &["false"]);
        add(db, &["--queue", "gamma"], &["sh", "-c", "sleep 0.2"]);
        if wave == 1 {
            // Fails once, is retried after its backoff, and fails again.
            add(db, &["--max-attempts", "2"], &["false"]);
            ended += 1;
        }
        ended += 5;
        wait_for(
            "the wave to end and be sampled",
            Duration::from_secs(60),
            || {
                samples()
                    .last()
                    .filter(|s| s.succeeded + s.failed == ended)
                    .map(|_| ())
            },
        );
    }
    // One sample more, so that the last interval is a whole one.
    let before = samples().last().unwrap().at;
    wait_for("one more sample", Duration::from_secs(30), || {
        samples().last().filter(|s| s.at > before).map(|_| ())
    });
    stop(runner);

    let all: Vec<Sample> = samples();
    assert!(all.len() >= 6, "{} samples", all.len());
    let counts = t.store().counts().unwrap();
    let last = all.last().unwrap();
    // The newest sample's counters are the database's.
    assert_eq!(
        (last.succeeded, last.failed),
        (counts.succeeded, counts.failed)
    );
    assert_eq!((counts.succeeded, counts.failed), (16, 5));
    assert_eq!(last.retried, 1);
    assert_eq!((last.running, last.ready), (0, 0));

    let server = Server::start(db, &[]);
    let page = server.get("/");
    assert_eq!(page.status, 200, "{page:?}");
    let svgs = svgs(&page.body);
    assert!(svgs.len() >= 4, "{} charts", svgs.len());
    for svg in &svgs {
        assert!(svg.contains("<title id="), "a title in {svg}");
    }
    // The table behind the jobs-ended chart is the differences of consecutive samples, and
    // adds up to the jobs the database holds as ended since the first sample.
    let rows = table_rows(figure(&page.body, "ended-fine"));
    assert_eq!(rows.len(), all.len() - 1);
    let mut shown = [0u64; 5];
    for ((from, cells), pair) in rows.iter().zip(all.windows(2)) {
        assert_eq!(*from, pair[0].at);
        let want = [
            ("succeeded", pair[1].succeeded - pair[0].succeeded),
            ("failed", pair[1].failed - pair[0].failed),
            ("retried", pair[1].retried - pair[0].retried),
            ("lost", pair[1].lost - pair[0].lost),
            ("cancelled", pair[1].cancelled - pair[0].cancelled),
        ];
        for (i, (name, n)) in want.iter().enumerate() {
            let cell = cells.iter().find(|(c, _)| c == name).unwrap();
            assert_eq!(cell.1, n.to_string(), "{name} from {from}");
            shown[i] += n;
        }
    }
    let first = &all[0];
    assert_eq!(shown[0], counts.succeeded - first.succeeded);
    assert_eq!(shown[1], counts.failed - first.failed);
    // The wait and run charts have a point wherever attempts ended.
    let waits = table_rows(figure(&page.body, "wait-fine"));
    assert!(
        waits.iter().any(|(_, cells)| cells
            .iter()
            .any(|(_, v)| v.ends_with("ms") || v.ends_with(" s"))),
        "a wait quantile in {waits:?}"
    );
    figure(&page.body, "run-fine");
    figure(&page.body, "gauges-fine");

    // Chromium renders it (no script runs: the CSP has no script source) at a desktop's and
    // a phone's width; the screenshots are kept for a person to look at.
    for (width, dark) in [(1280, false), (375, false), (1280, true)] {
        let shot = chart_screenshot(width, dark);
        let _ = std::fs::remove_file(&shot);
        chromium(&[
            format!("--screenshot={}", shot.display()).as_str(),
            &format!("--window-size={width},2400"),
            // Chromium reports `prefers-color-scheme: dark` to the page.
            if dark {
                "--force-dark-mode"
            } else {
                "--no-first-run"
            },
            // Logged in by the URL `serve` printed, which redirects to the overview.
            &server.login_url(),
        ]);
        let png = std::fs::read(&shot).expect("the screenshot is written");
        assert!(png.starts_with(b"\x89PNG"), "a PNG at {}", shot.display());
    }
    let dom = crate::serve::dump_dom(&server.login_url());
    assert!(dom.contains("id=\"ended-fine\""), "{dom}");
}

/// Issue 34: after 30 jobs ran with `run --until-idle` the overview said "No chart yet": a
/// runner sampled once a minute, and a chart needs two samples. A runner now samples as it
/// starts and as it stops too, so the batch is charted, every job of it.
#[test]
fn the_overview_charts_a_short_batch_run_until_idle() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let lines = t.sibling("jobs.txt");
    std::fs::write(&lines, "true\n".repeat(30)).unwrap();
    ok(&mut cli(
        db,
        &["jobs", "add", "--from-file", lines.to_str().unwrap()],
    ));
    run_until_idle(db, &[]);
    let samples = t.store().samples().unwrap();
    assert!(samples.len() >= 2, "{samples:?}");
    let server = Server::start(db, &[]);
    let page = server.get("/");
    assert_eq!(page.status, 200, "{page:?}");
    assert!(!page.body.contains("No chart yet"), "{}", page.body);
    let rows = table_rows(figure(&page.body, "ended-fine"));
    let succeeded: u64 = rows
        .iter()
        .flat_map(|(_, cells)| cells.iter())
        .filter(|(name, _)| name == "succeeded")
        .map(|(_, n)| n.parse::<u64>().unwrap())
        .sum();
    assert_eq!(succeeded, 30, "{rows:?}");
}

/// Issue 34: `run --sample-interval 1` sampled once a sweep (5 s by default), and the page
/// said "every 5 s". The sampler keeps its own interval now, and the page says it.
#[test]
fn a_one_second_sample_interval_samples_every_second_and_the_page_says_so() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let runner = RunnerProcess::start(db, &["--sample-interval", "1"]);
    let samples = wait_for("four samples", Duration::from_secs(30), || {
        let s = t.store().samples().unwrap();
        (s.len() >= 4).then_some(s)
    });
    stop(runner);
    // After the start's sample, one at the start of each second.
    let gaps: Vec<i64> = samples[1..4]
        .windows(2)
        .map(|w| w[1].at - w[0].at)
        .collect();
    assert!(gaps.iter().all(|g| (1..3_000).contains(g)), "{gaps:?}");
    let server = Server::start(db, &[]);
    let page = server.get("/");
    assert!(
        page.body.contains("one every 1 s at the median"),
        "{}",
        page.body
    );
}

/// Times are in UTC until the viewer picks a zone (`/times?zone=…`, a cookie): then every
/// time on the pages is in that zone, with its offset. The choice comes back to the page it
/// was made on, and never sends the viewer to another site; an unknown zone is a 400.
#[test]
fn times_show_in_the_zone_the_viewer_picks() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let id = add(db, &[], &["true"]);
    let created = t.job(id).created_at;
    let server = Server::start(db, &[]);
    let utc = server.get(&format!("/jobs/{id}"));
    assert_eq!(utc.status, 200);
    let in_utc = leasehold_time_utc(created);
    assert!(utc.body.contains(&in_utc), "{in_utc} on {}", utc.body);

    let back = format!("/jobs/{id}");
    let chose = server.get(&format!("/times?zone=Asia/Kolkata&back={back}"));
    assert_eq!(chose.status, 303);
    assert_eq!(chose.header("Location"), Some(back.as_str()));
    let set = chose
        .header("Set-Cookie")
        .expect("the zone is kept in a cookie");
    assert!(set.starts_with("leasehold_times=Asia/Kolkata;"), "{set}");
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    let cookie = set.split(';').next().unwrap();
    let page = server.request("GET", &back, &format!("Cookie: {cookie}\r\n"), "");
    assert_eq!(page.status, 200);
    // Kolkata is UTC+05:30 all year.
    let in_kolkata = kolkata_time(created);
    assert!(
        page.body.contains(&in_kolkata),
        "{in_kolkata} on {}",
        page.body
    );
    assert!(
        !page.body.contains(&in_utc),
        "no time left in UTC: {}",
        page.body
    );
    assert!(
        page.body.contains("value=\"Asia/Kolkata\""),
        "the form shows the choice"
    );
    // Each time has its age beside it.
    let aged = format!("{in_kolkata} (");
    let after = &page.body[page.body.find(&aged).expect("an age beside the time") + aged.len()..];
    assert!(
        after.split(')').next().unwrap().ends_with(" ago"),
        "{after}"
    );
    let list = server.request("GET", "/jobs", &format!("Cookie: {cookie}\r\n"), "");
    assert!(
        list.body.contains(&in_kolkata) && list.body.contains(" ago<"),
        "{}",
        list.body
    );

    // Another site is never where a choice goes back to; a bad zone changes nothing.
    let elsewhere = server.get("/times?zone=UTC&back=//evil.example/");
    assert_eq!(elsewhere.header("Location"), Some("/"));
    let bad = server.get("/times?zone=Mars/Olympus");
    assert_eq!(bad.status, 400);
    assert!(bad.header("Set-Cookie").is_none());
    // Without the secret, no choice is taken either.
    assert_eq!(server.anonymous("/times?zone=UTC", "").status, 401);
}

/// `ms` as the pages print a UTC time: `2026-12-01T11:17:03.038Z`.
fn leasehold_time_utc(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap()
        .format("%Y-%m-%dT%H:%M:%S%.3fZ")
        .to_string()
}

/// `ms` as the pages print it in Asia/Kolkata: `2026-12-01 16:47:03.038 +05:30`.
fn kolkata_time(ms: i64) -> String {
    let offset = chrono::FixedOffset::east_opt(5 * 3600 + 30 * 60).unwrap();
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap()
        .with_timezone(&offset)
        .format("%Y-%m-%d %H:%M:%S%.3f %:z")
        .to_string()
}

/// A running job's page says its output comes when the attempt ends and reloads itself until
/// then; a finished job's page does not reload.
#[test]
fn a_running_jobs_page_reloads_until_its_output_is_recorded() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let done = add(db, &[], &["true"]);
    run_until_idle(db, &[]);
    let long = add(db, &[], &["sleep", "30"]);
    let mut args = FAST.to_vec();
    args.extend(["--shutdown-grace", "0.1"]);
    let runner = RunnerProcess::start(db, &args);
    crate::helper::wait_running(db, long);
    let server = Server::start(db, &[]);
    let page = server.get(&format!("/jobs/{long}"));
    assert_eq!(page.status, 200);
    assert!(
        page.body.contains("http-equiv=\"refresh\""),
        "{}",
        page.body
    );
    assert!(page.body.contains("id=\"live\""), "{}", page.body);
    let page = server.get(&format!("/jobs/{done}"));
    assert!(
        !page.body.contains("http-equiv=\"refresh\""),
        "{}",
        page.body
    );
    assert!(!page.body.contains("id=\"live\""), "{}", page.body);
    stop(runner);
}
