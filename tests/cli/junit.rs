//! JUnit XML reports (`run --until-idle --junit`, `jobs report --junit`) as CI reads them,
//! parsed by a strict XML parser and checked against the schema the Jenkins plugins
//! document, and `run --until-idle --fail-on-failure`'s exit code.

use std::collections::HashMap;
use std::path::Path;

use roxmltree::{Document, Node};

use crate::helper::{FAST, add, cli, fails, inspect, ok};
use crate::util::TestDb;

/// The JUnit schema of the Jenkins plugins (`junit-10.xsd` of jenkinsci/xunit-plugin, whose
/// elements jenkinsci/junit-plugin's `SuiteResult` and `CaseResult` parse): for each element,
/// the children it may have, its attributes and which of them are required. `None` as the
/// children: text only (`xs:string`, or a mixed type with no element).
struct Rule {
    children: Option<&'static [&'static str]>,
    attributes: &'static [&'static str],
    required: &'static [&'static str],
}

const RERUN: Rule = Rule {
    // rerunType: a sequence stackTrace?, system-out?, system-err? (checked in order below).
    children: Some(&["stackTrace", "system-out", "system-err"]),
    attributes: &["message", "type"],
    required: &["type"],
};
const FAULT: Rule = Rule {
    children: None,
    attributes: &["type", "message"],
    required: &[],
};
const STRING: Rule = Rule {
    children: None,
    attributes: &[],
    required: &[],
};

fn rule(element: &str) -> Option<Rule> {
    Some(match element {
        "testsuites" => Rule {
            children: Some(&["testsuite"]),
            attributes: &["name", "time", "tests", "failures", "errors"],
            required: &[],
        },
        "testsuite" => Rule {
            children: Some(&[
                "testsuite",
                "properties",
                "testcase",
                "system-out",
                "system-err",
            ]),
            attributes: &[
                "name",
                "tests",
                "failures",
                "errors",
                "group",
                "time",
                "skipped",
                "timestamp",
                "hostname",
                "id",
                "package",
                "file",
                "log",
                "url",
                "version",
            ],
            required: &["name", "tests", "failures", "errors"],
        },
        "properties" => Rule {
            children: Some(&["property"]),
            attributes: &[],
            required: &[],
        },
        "property" => Rule {
            children: Some(&[]),
            attributes: &["name", "value"],
            required: &["name", "value"],
        },
        "testcase" => Rule {
            children: Some(&[
                "skipped",
                "error",
                "failure",
                "rerunFailure",
                "rerunError",
                "flakyFailure",
                "flakyError",
                "system-out",
                "system-err",
            ]),
            attributes: &["name", "time", "classname", "group"],
            required: &["name"],
        },
        "failure" | "error" | "skipped" => FAULT,
        "rerunFailure" | "rerunError" | "flakyFailure" | "flakyError" => RERUN,
        "system-out" | "system-err" | "stackTrace" => STRING,
        _ => return None,
    })
}

/// `SUREFIRE_TIME` of the schema, `(([0-9]{0,3},)*[0-9]{3}|[0-9]{0,3})*(\.[0-9]{0,3})?`, as
/// written here: digits, then at most three decimals.
fn is_time(s: &str) -> bool {
    let (whole, decimals) = s.split_once('.').unwrap_or((s, ""));
    whole.bytes().all(|b| b.is_ascii_digit())
        && decimals.len() <= 3
        && decimals.bytes().all(|b| b.is_ascii_digit())
        && !s.is_empty()
}

/// Checks `node` and everything under it against the schema.
fn check(node: Node) {
    let name = node.tag_name().name();
    assert!(
        node.tag_name().namespace().is_none(),
        "{name} has a namespace"
    );
    let rule = rule(name).unwrap_or_else(|| panic!("<{name}> is not in the schema"));
    for a in node.attributes() {
        assert!(
            rule.attributes.contains(&a.name()),
            "<{name}> has an attribute {} the schema does not have",
            a.name()
        );
    }
    for required in rule.required {
        assert!(
            node.attribute(*required).is_some(),
            "<{name}> lacks its required {required}"
        );
    }
    if let Some(time) = node.attribute("time") {
        assert!(is_time(time), "<{name} time={time:?}>");
    }
    for count in ["tests", "failures", "errors", "skipped"] {
        if let Some(n) = node.attribute(count) {
            assert!(n.parse::<u32>().is_ok(), "<{name} {count}={n:?}>");
        }
    }
    let elements: Vec<Node> = node.children().filter(Node::is_element).collect();
    match rule.children {
        None => assert!(elements.is_empty(), "<{name}> holds elements"),
        Some(allowed) => {
            for child in &elements {
                let child_name = child.tag_name().name();
                assert!(
                    allowed.contains(&child_name),
                    "<{name}> holds <{child_name}>"
                );
                check(*child);
            }
            // Elements hold no text of their own but whitespace, except the mixed rerunType.
            if !matches!(
                name,
                "rerunFailure" | "rerunError" | "flakyFailure" | "flakyError"
            ) {
                for t in node.children().filter(Node::is_text) {
                    assert!(
                        t.text().unwrap_or("").trim().is_empty(),
                        "<{name}> holds text"
                    );
                }
            }
        }
    }
    if name.starts_with("rerun") || name.starts_with("flaky") {
        // A sequence: each child at most once, in the schema's order.
        let order: Vec<usize> = elements
            .iter()
            .map(|c| {
                RERUN
                    .children
                    .unwrap()
                    .iter()
                    .position(|n| *n == c.tag_name().name())
                    .unwrap()
            })
            .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "<{name}>: {order:?}");
    }
}

/// What the checks below need of one `<testcase>`.
#[derive(Debug)]
struct Case {
    classname: String,
    time_ms: u64,
    /// Its child elements' names, in order.
    children: Vec<String>,
    failure_message: Option<String>,
    failure_text: Option<String>,
    system_err: Option<String>,
    system_out: Option<String>,
}

fn millis(time: &str) -> u64 {
    let (whole, decimals) = time.split_once('.').unwrap_or((time, ""));
    whole.parse::<u64>().unwrap() * 1000 + format!("{decimals:0<3}").parse::<u64>().unwrap()
}

/// Parses the report strictly, checks it against the schema and that every count agrees with
/// its cases; returns the cases by name.
fn parse(path: &Path) -> HashMap<String, Case> {
    let xml = std::fs::read_to_string(path).unwrap();
    let doc = Document::parse(&xml).unwrap_or_else(|e| panic!("{e}: {xml}"));
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "testsuites");
    check(root);
    let suites: Vec<Node> = root.children().filter(Node::is_element).collect();
    assert_eq!(suites.len(), 1);
    let mut cases = HashMap::new();
    let counted = |n: &Node, a: &str| n.attribute(a).map(|v| v.parse::<usize>().unwrap());
    let (mut all, mut failed, mut errors, mut time) = (0, 0, 0, 0);
    for suite in &suites {
        let testcases: Vec<Node> = suite
            .children()
            .filter(|n| n.has_tag_name("testcase"))
            .collect();
        let with = |child: &str| {
            testcases
                .iter()
                .filter(|c| c.children().any(|n| n.has_tag_name(child)))
                .count()
        };
        let suite_time: u64 = testcases
            .iter()
            .map(|c| millis(c.attribute("time").unwrap()))
            .sum();
        assert_eq!(counted(suite, "tests"), Some(testcases.len()));
        assert_eq!(counted(suite, "failures"), Some(with("failure")));
        assert_eq!(counted(suite, "errors"), Some(with("error")));
        assert_eq!(counted(suite, "skipped"), Some(with("skipped")));
        assert_eq!(suite.attribute("time").map(millis), Some(suite_time));
        all += testcases.len();
        failed += with("failure");
        errors += with("error");
        time += suite_time;
        for c in testcases {
            let child = |name: &str| c.children().find(|n| n.has_tag_name(name));
            let text = |name: &str| child(name).map(|n| n.text().unwrap_or("").to_string());
            let case = Case {
                classname: c.attribute("classname").unwrap().to_string(),
                time_ms: millis(c.attribute("time").unwrap()),
                children: c
                    .children()
                    .filter(Node::is_element)
                    .map(|n| n.tag_name().name().to_string())
                    .collect(),
                failure_message: child("failure")
                    .and_then(|f| f.attribute("message"))
                    .map(str::to_string),
                failure_text: text("failure"),
                system_err: text("system-err"),
                system_out: text("system-out"),
            };
            let name = c.attribute("name").unwrap().to_string();
            assert!(cases.insert(name.clone(), case).is_none(), "two {name}");
        }
    }
    assert_eq!(counted(&root, "tests"), Some(all));
    assert_eq!(counted(&root, "failures"), Some(failed));
    assert_eq!(counted(&root, "errors"), Some(errors));
    assert!(root.attribute("skipped").is_none(), "not in the schema");
    assert_eq!(root.attribute("time").map(millis), Some(time));
    cases
}

/// What a failing job prints on stderr: bytes XML 1.0 cannot hold, a CDATA end, markup,
/// a carriage return and bytes that are not UTF-8.
const NASTY: &str = r"printf 'a\000b\001c\033[31m]]> <&> \r\n\377 last line\n' >&2";

/// The 30 jobs: 23 that pass, 5 that fail (both attempts), 2 flaky (fail their first attempt,
/// pass their second, by a flag file in `folder`); every third in queue `b`. Returns (name,
/// id) of each.
fn thirty_jobs(db: &Path, folder: &Path) -> Vec<(String, i64)> {
    let mut jobs = Vec::new();
    for i in 0..30 {
        let (name, script) = match i {
            0..5 => (
                format!("fails-{i}"),
                format!("echo out-{i}; {NASTY}; exit {}", 10 + i),
            ),
            5..7 => (
                format!("flaky-{i}"),
                format!(
                    "test -e {dir}/flag{i} || {{ touch {dir}/flag{i}; echo first >&2; exit 1; }}; echo passed-{i}",
                    dir = folder.display()
                ),
            ),
            _ => (format!("passes-{i}"), format!("echo out-{i}")),
        };
        let queue = if i % 3 == 0 { "b" } else { "a" };
        let id = add(
            db,
            &["--name", &name, "--queue", queue, "--max-attempts", "2"],
            &["sh", "-c", &script],
        );
        jobs.push((name, id));
    }
    jobs
}

crate::on_both! {
    fn a_30_job_run_writes_a_report_ci_reads_with_failures_and_flaky_retries(t) {
        let target = t.target();
        let db = target.as_path();
        let jobs = thirty_jobs(db, t.dir.path());
        // A job whose name needs escaping in an attribute, and one without a name (its command).
        let quoted = "a \"quoted\" <name> & more\ttab";
        add(db, &["--name", quoted], &["true"]);
        add(db, &[], &["echo", "<unnamed>"]);
        // One that runs after a failing one: cancelled without an attempt, a skipped case.
        let after = jobs[0].1.to_string();
        add(db, &["--name", "after-fails-0", "--after", &after], &["true"]);
        let report = t.dir.path().join("report.xml");
        let mut args = vec!["run", "--until-idle", "--workers", "4"];
        args.extend_from_slice(&FAST);
        args.extend(["--junit", report.to_str().unwrap()]);
        // Without --fail-on-failure, failed jobs leave the exit code as it was: 0.
        ok(&mut cli(db, &args));

        let cases = parse(&report);
        assert_eq!(cases.len(), 33, "{:?}", cases.keys());
        assert_eq!(cases["after-fails-0"].children, ["skipped"]);
        for (name, id) in &jobs {
            let case = &cases[name];
            let job = inspect(db, *id);
            assert_eq!(case.classname, job["queue"].as_str().unwrap(), "{name}");
            let ran = job["completed_at"].as_u64().unwrap() - job["started_at"].as_u64().unwrap();
            assert_eq!(case.time_ms, ran, "{name}: its last attempt's time");
            let children: Vec<&str> = case.children.iter().map(String::as_str).collect();
            if name.starts_with("fails") {
                assert_eq!(
                    children,
                    ["failure", "rerunFailure", "system-out", "system-err"],
                    "{name}"
                );
                let code = job["exit_code"].as_i64().unwrap();
                assert_eq!(
                    case.failure_message.as_deref(),
                    Some(format!("exited with code {code}").as_str())
                );
                let body = case.failure_text.as_deref().unwrap();
                assert!(body.contains("error kind: exit\n"), "{body}");
                assert!(body.contains(&format!("exit code: {code}\n")), "{body}");
                assert!(body.contains("attempt 2 of 2"), "{body}");
                // The bytes the job printed, each as XML can hold it, parsed back.
                let stderr = "a^@b^Ac^[[31m]]> <&> \r\n\u{FFFD} last line\n";
                assert_eq!(case.system_err.as_deref(), Some(stderr));
                // The failure's last lines of it (lines end at \r\n or \n).
                assert!(body.ends_with(&stderr.replace('\r', "")), "{body:?}");
                assert_eq!(
                    case.system_out.as_deref(),
                    Some(&*format!("out-{}\n", &name[6..]))
                );
            } else if name.starts_with("flaky") {
                assert_eq!(children, ["flakyFailure", "system-out"], "{name}");
                assert_eq!(job["status"], "succeeded");
            } else {
                assert_eq!(children, ["system-out"], "{name}");
            }
        }
        assert!(cases[quoted].children.is_empty());
        assert!(cases.contains_key("echo '<unnamed>'"), "{:?}", cases.keys());

        // `jobs report` over a subset: what `jobs ls` selects, or ids.
        let subset = t.dir.path().join("subset.xml");
        let path = subset.to_str().unwrap();
        let line = ok(&mut cli(
            db,
            &["jobs", "report", "--junit", path, "--status", "failed"],
        ));
        assert_eq!(
            line,
            format!("{path}: 5 tests, 5 failed, 0 errors, 0 skipped, 0 flaky\n")
        );
        let failed = parse(&subset);
        let mut names: Vec<&String> = failed.keys().collect();
        names.sort();
        assert_eq!(
            names,
            ["fails-0", "fails-1", "fails-2", "fails-3", "fails-4"]
        );
        ok(&mut cli(
            db,
            &["jobs", "report", "--junit", path, "--queue", "b"],
        ));
        let in_b = parse(&subset);
        assert_eq!(in_b.len(), 10);
        assert!(in_b.values().all(|c| c.classname == "b"));
        let (flaky, passes) = (jobs[5].1.to_string(), jobs[9].1.to_string());
        ok(&mut cli(
            db,
            &["jobs", "report", "--junit", path, &flaky, &passes],
        ));
        let two = parse(&subset);
        let mut names: Vec<&String> = two.keys().collect();
        names.sort();
        assert_eq!(names, ["flaky-5", "passes-9"]);
    }

    fn fail_on_failure_exits_1_only_when_a_job_of_this_run_failed(t) {
        let target = t.target();
        let db = target.as_path();
        let run = |extra: &[&str]| {
            let mut args = vec!["run", "--until-idle", "--fail-on-failure"];
            args.extend_from_slice(&FAST);
            args.extend_from_slice(extra);
            let mut cmd = cli(db, &args);
            cmd.env("RUST_LOG", "warn");
            cmd
        };
        add(db, &[], &["true"]);
        ok(&mut run(&[]));
        let bad = add(db, &["--max-attempts", "1"], &["sh", "-c", "exit 4"]);
        add(db, &[], &["true"]);
        let line = fails(&mut run(&[]), 1);
        assert_eq!(line, format!("leasehold: 1 job of this run failed: {bad}"));
        // The failure is an earlier run's: this one ended nothing that failed.
        add(db, &[], &["true"]);
        ok(&mut run(&[]));
        ok(&mut run(&[]));
        // With a report too, the report is written before the exit says so.
        add(db, &["--max-attempts", "1"], &["false"]);
        let report = t.dir.path().join("r.xml");
        fails(&mut run(&["--junit", report.to_str().unwrap()]), 1);
        let cases = parse(&report);
        assert_eq!(cases.len(), 1, "only this run's job: {:?}", cases.keys());
        assert_eq!(cases["false"].children, ["failure"]);
    }
}

/// The database's bytes (its file and WAL).
fn bytes(db: &Path) -> Vec<Vec<u8>> {
    ["", "-wal"]
        .iter()
        .map(|suffix| std::fs::read(format!("{}{suffix}", db.display())).unwrap_or_default())
        .collect()
}

#[test]
fn a_report_path_that_cannot_be_written_is_refused_before_anything_runs() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let id = add(db, &[], &["true"]);
    let missing = t.dir.path().join("no-such-folder").join("r.xml");
    let folder = t.dir.path().to_str().unwrap().to_string();
    let paths = [missing.to_str().unwrap(), folder.as_str()];
    // `run` says so before it opens the database: not a byte of it changes.
    let before = bytes(db);
    for path in paths {
        let line = fails(&mut cli(db, &["run", "--until-idle", "--junit", path]), 1);
        assert!(
            line.starts_with(&format!(
                "leasehold: cannot write the JUnit report {path}: "
            )),
            "{line}"
        );
    }
    assert!(bytes(db) == before, "the database changed");
    // `jobs report` reads the jobs, read-only, before it writes (closing the file moves its
    // WAL into it, as any read-only command's close does: the jobs and their events stay).
    let seen = |db: &Path| (ok(&mut cli(db, &["jobs", "ls", "--json"])), inspect(db, id));
    let before = seen(db);
    for path in paths {
        let line = fails(&mut cli(db, &["jobs", "report", "--junit", path]), 1);
        assert!(
            line.starts_with(&format!(
                "leasehold: cannot write the JUnit report {path}: "
            )),
            "{line}"
        );
    }
    assert_eq!(seen(db), before);
    assert_eq!(before.1["status"], "pending");
    // Usage: --junit and --fail-on-failure go with --until-idle; report needs --junit, and
    // ids or a selection, not both.
    let line = fails(&mut cli(db, &["run", "--junit", "r.xml"]), 2);
    assert!(line.contains("--until-idle"), "{line}");
    fails(&mut cli(db, &["run", "--fail-on-failure"]), 2);
    // A runner that does not start leaves no report, rather than an empty file.
    let report = t.dir.path().join("r.xml");
    let args = ["run", "--until-idle", "--heartbeat", "100", "--junit"];
    fails(cli(db, &args).arg(&report), 2);
    assert!(!report.exists());
    fails(&mut cli(db, &["jobs", "report", &id.to_string()]), 2);
    fails(
        &mut cli(
            db,
            &["jobs", "report", "--junit", "r.xml", "1", "--queue", "q"],
        ),
        2,
    );
    assert_eq!(seen(db), before);
}
