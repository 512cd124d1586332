//! The overview as a dashboard: every queue, the recent failures and the charts, read over
//! HTTP from a real `leasehold serve` (the `Server` helper of `serve.rs`) and in Chromium.

use crate::helper::{add, cli, ok, run_until_idle};
use crate::serve::{Server, number_after};
use crate::util::TestDb;

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
