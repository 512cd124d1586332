//! Flow control from the command line: `queues limit|pause|resume|ls`, `jobs add --after`,
//! and `run --queue Q=N`.

use serde_json::{Value, json as j};

use crate::helper::{add, cli, fails, inspect, json, ok, run_until_idle};
use crate::util::TestDb;

fn queues(db: &std::path::Path) -> Value {
    json(&mut cli(db, &["queues", "ls", "--json"]))
}

#[test]
fn queues_commands_refuse_bad_arguments_and_a_missing_file() {
    let t = TestDb::new();
    let db = t.path.as_path();
    ok(&mut cli(db, &["db", "migrate"]));
    for args in [
        &["queues", "limit", "media", "-1"][..],
        &["queues", "limit", "media", "two"],
        &["queues", "limit", "media"],
        &["queues", "pause", ""],
        &["queues", "limit", "", "3"],
    ] {
        let line = fails(&mut cli(db, args), 2);
        assert!(!line.is_empty(), "{args:?}");
    }
    let missing = t.sibling("missing.db");
    fails(&mut cli(&missing, &["queues", "pause", "media"]), 1);
    fails(&mut cli(&missing, &["queues", "ls"]), 1);
    assert!(!missing.exists());
}

#[test]
fn a_paused_queue_is_left_by_a_runner_until_resumed() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let held = add(db, &["--queue", "sync"], &["true"]);
    let free = add(db, &[], &["true"]);
    ok(&mut cli(db, &["queues", "pause", "sync"]));
    // `--until-idle` would wait for the held job forever: serve the other queue only.
    run_until_idle(db, &["--queue", "default"]);
    assert_eq!(inspect(db, free)["status"], "succeeded");
    assert_eq!(inspect(db, held)["status"], "pending");
    ok(&mut cli(db, &["queues", "resume", "sync"]));
    run_until_idle(db, &[]);
    assert_eq!(inspect(db, held)["status"], "succeeded");
}

#[test]
fn jobs_add_after_an_unknown_failed_or_cancelled_job_or_itself_is_refused() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let failed = add(db, &[], &["false"]);
    run_until_idle(db, &[]);
    let cancelled = add(db, &[], &["true"]);
    ok(&mut cli(db, &["jobs", "cancel", &cancelled.to_string()]));
    let list = || ok(&mut cli(db, &["jobs", "ls", "--json"]));
    let before = list();
    let itself = cancelled + 1;
    for (dep, says) in [
        (9_999, "no such job"),
        (failed, "is failed"),
        (cancelled, "is cancelled"),
        (itself, "cannot run after itself"),
    ] {
        let after = dep.to_string();
        let line = fails(
            &mut cli(db, &["jobs", "add", "--after", &after, "--", "true"]),
            1,
        );
        assert!(
            line.contains(&format!("job {dep}")) && line.contains(says),
            "{line}"
        );
        // With --from-file too: the whole file is refused.
        let file = t.sibling("jobs.txt");
        std::fs::write(&file, "true\ntrue\n").unwrap();
        let path = file.to_str().unwrap();
        fails(
            &mut cli(db, &["jobs", "add", "--after", &after, "--from-file", path]),
            1,
        );
        assert_eq!(list(), before, "nothing written after naming {dep}");
    }
    fails(
        &mut cli(db, &["jobs", "add", "--after", "x", "--", "true"]),
        2,
    );
}

crate::on_both! {
    fn queues_limit_pause_resume_and_ls_are_stored_in_the_file(t) {
        let target = t.target();
        let db = target.as_path();
        add(db, &["--queue", "media"], &["true"]);
        assert_eq!(
            json(&mut cli(db, &["queues", "limit", "media", "2", "--json"])),
            j!({"queue": "media", "limit": 2})
        );
        ok(&mut cli(db, &["queues", "pause", "upload"]));
        let all = queues(db);
        assert_eq!(all.as_array().unwrap().len(), 2, "{all}");
        let media = &all[0];
        assert_eq!(media["name"], "media");
        assert_eq!(
            (&media["pending"], &media["waiting"], &media["running"]),
            (&j!(1), &j!(0), &j!(0))
        );
        assert_eq!((&media["limit"], &media["paused"]), (&j!(2), &j!(false)));
        assert!(media["oldest_ready_ms"].as_i64().unwrap() >= 0, "{media}");
        assert_eq!(all[1]["name"], "upload");
        assert_eq!(
            (&all[1]["paused"], &all[1]["limit"]),
            (&j!(true), &Value::Null)
        );
        assert_eq!(all[1]["oldest_ready_ms"], Value::Null);
        let table = ok(&mut cli(db, &["queues", "ls"]));
        assert!(table.starts_with("QUEUE"), "{table}");
        assert!(
            table
                .lines()
                .any(|l| l.starts_with("upload") && l.contains("yes")),
            "{table}"
        );

        ok(&mut cli(db, &["queues", "resume", "upload"]));
        ok(&mut cli(db, &["queues", "limit", "media", "none"]));
        assert_eq!(queues(db)[0]["limit"], Value::Null);
        assert_eq!(queues(db).as_array().unwrap().len(), 1);
    }

    fn jobs_add_after_waits_for_its_dependencies_and_inspect_shows_them(t) {
        let target = t.target();
        let db = target.as_path();
        let a = add(db, &[], &["true"]);
        let b = add(db, &[], &["true"]);
        let c = add(db, &["--after", &format!("{a},{b}")], &["true"]);
        let d = add(
            db,
            &["--after", &a.to_string(), "--after", &c.to_string()],
            &["true"],
        );
        let job = inspect(db, c);
        assert_eq!(job["after"], j!([a, b]));
        assert_eq!(job["waiting_for"], j!([a, b]));
        assert_eq!(inspect(db, d)["after"], j!([a, c]));
        let text = ok(&mut cli(db, &["jobs", "inspect", &c.to_string()]));
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with("waiting_for") && l.contains(&format!("{a},{b}"))),
            "{text}"
        );
        run_until_idle(db, &[]);
        for id in [a, b, c, d] {
            assert_eq!(inspect(db, id)["status"], "succeeded");
        }
        let job = inspect(db, d);
        assert_eq!((&job["after"], &job["waiting_for"]), (&j!([a, c]), &j!([])));
        let (ca, cc, sd) = (
            inspect(db, a)["completed_at"].as_i64().unwrap(),
            inspect(db, c)["completed_at"].as_i64().unwrap(),
            inspect(db, d)["started_at"].as_i64().unwrap(),
        );
        assert!(ca <= sd && cc <= sd, "{ca} {cc} {sd}");
    }

    fn a_failed_dependency_cancels_the_job_after_it(t) {
        let target = t.target();
        let db = target.as_path();
        let a = add(db, &[], &["false"]);
        let b = add(db, &["--after", &a.to_string()], &["true"]);
        run_until_idle(db, &[]);
        let job = inspect(db, b);
        assert_eq!(job["status"], "cancelled");
        assert_eq!(job["last_error"], format!("dependency job {a} failed"));
        assert_eq!(job["waiting_for"], j!([a]));
    }

    fn run_queue_with_a_limit_runs_every_served_queue_and_refuses_a_zero_limit(t) {
        let target = t.target();
        let db = target.as_path();
        let media = add(db, &["--queue", "media"], &["true"]);
        let other = add(db, &[], &["true"]);
        run_until_idle(db, &["--queue", "media=1", "--queue", "default"]);
        assert_eq!(inspect(db, media)["status"], "succeeded");
        assert_eq!(inspect(db, other)["status"], "succeeded");
        for bad in ["media=0", "media=x", "=2", "media="] {
            fails(&mut cli(db, &["run", "--until-idle", "--queue", bad]), 2);
        }
    }
}
