//! `leasehold schedules ...` and `jobs add --unique-key`: the JSON shapes, the DST slots a
//! user sees, a runner firing a schedule, and bad input refused with nothing written.

use std::fs;
use std::time::Duration;

use serde_json::Value;

use crate::helper::{FAST, cli, fails, inspect, json, ok};
use crate::util::{RunnerProcess, TestDb, bare, wait_until};

fn schedules_rows(t: &TestDb) -> i64 {
    if t.is_postgres() {
        return t.scalar("SELECT count(*) FROM schedules");
    }
    if !t.path.exists() {
        return -1;
    }
    bare(&t.path)
        .query_row("SELECT count(*) FROM schedules", [], |r| r.get(0))
        .unwrap_or(-1)
}

/// Zones come from the system's tz database, found through `TZDIR` as the C library finds
/// it: with `TZDIR` naming a database of one zone, that zone is accepted and read with its
/// offsets, and a zone it lacks is refused in one line, writing nothing. (A tz database
/// compiled into the binary knows no `Test/Zone` and ignores `TZDIR`.)
#[test]
fn zones_are_read_from_the_tz_database_tzdir_names() {
    let t = TestDb::new();
    let db = &t.path;
    let tzdir = tempfile::tempdir().unwrap();
    fs::create_dir(tzdir.path().join("Test")).unwrap();
    // Kolkata: +05:30 all year, no DST (CI installs Debian's tzdata).
    fs::copy(
        "/usr/share/zoneinfo/Asia/Kolkata",
        tzdir.path().join("Test/Zone"),
    )
    .unwrap();
    let with_tzdir = |args: &[&str]| {
        let mut cmd = cli(db, args);
        cmd.env("TZDIR", tzdir.path());
        cmd
    };
    let add = |zone| {
        with_tzdir(&[
            "schedules",
            "add",
            "s",
            "--cron",
            "0 9 * * *",
            "--tz",
            zone,
            "--",
            "true",
        ])
    };
    let line = fails(&mut add("Europe/Berlin"), 2);
    assert!(line.contains("\"Europe/Berlin\" is not a known"), "{line}");
    assert!(!db.exists(), "a refused schedule created the file");
    ok(&mut add("Test/Zone"));
    let v = json(&mut with_tzdir(&[
        "schedules",
        "next",
        "s",
        "--after",
        "2027-01-01T00:00:00Z",
        "--count",
        "1",
        "--json",
    ]));
    assert_eq!(v["slots"][0]["local"], "2027-01-01T09:00:00+05:30", "{v}");
}

/// On a system without a tz database, a named zone is refused in one line that names the
/// zone and what is missing, and nothing is written; UTC needs no database. Built with the
/// `bundled-tzdb` feature, the compiled-in copy answers instead. The system's database is
/// hidden by an empty tmpfs over /usr/share/zoneinfo in a mount namespace of the command's
/// own (`unshare --mount`: root, as CI is; skipped, saying why, where that is refused).
#[test]
fn without_a_tz_database_named_zones_are_refused_and_utc_works() {
    const HIDE: &str = "mount -t tmpfs no-tzdb /usr/share/zoneinfo && exec \"$@\"";
    let hidden = |args: &[&str]| {
        let mut cmd = assert_cmd::Command::new("unshare");
        cmd.args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            HIDE,
            "sh",
        ])
        .args(args)
        .env_remove("TZDIR")
        .timeout(crate::helper::COMMAND_TIMEOUT);
        for var in crate::util::leasehold_vars() {
            cmd.env_remove(var);
        }
        cmd
    };
    let probe = hidden(&["true"]).output().expect("sh runs");
    if !probe.status.success() {
        eprintln!(
            "skipped: cannot hide /usr/share/zoneinfo in a mount namespace here ({}): {}",
            probe.status,
            String::from_utf8_lossy(&probe.stderr).trim()
        );
        return;
    }
    let t = TestDb::new();
    let bin = assert_cmd::cargo::cargo_bin("leasehold");
    let bin = bin.to_str().unwrap();
    let db = t.path.to_str().unwrap();
    let add = |zone: &[&str]| {
        let mut args = vec![
            bin,
            "--db",
            db,
            "schedules",
            "add",
            "s",
            "--cron",
            "0 9 * * *",
        ];
        args.extend_from_slice(zone);
        args.extend_from_slice(&["--", "true"]);
        hidden(&args)
    };
    if cfg!(feature = "bundled-tzdb") {
        ok(&mut add(&["--tz", "Europe/Berlin"]));
        assert_eq!(schedules_rows(&t), 1);
        return;
    }
    let line = fails(&mut add(&["--tz", "Europe/Berlin"]), 2);
    assert!(
        line.contains("\"Europe/Berlin\" cannot be looked up: no time zone database"),
        "{line}"
    );
    assert!(!t.path.exists(), "a refused schedule created the file");
    ok(&mut add(&[]));
    assert_eq!(schedules_rows(&t), 1);
}

#[test]
fn a_runner_fires_a_schedule_and_its_jobs_name_it() {
    let t = TestDb::new();
    let db = &t.path;
    ok(&mut cli(
        db,
        &[
            "schedules",
            "add",
            "tick",
            "--cron",
            "*/1 * * * * *",
            "--overlap",
            "allow",
            "--",
            "sh",
            "-c",
            "exit 0",
        ],
    ));
    let mut runner = RunnerProcess::start(db, &FAST);
    let mut jobs = Value::Null;
    let fired = wait_until(Duration::from_secs(20), || {
        jobs = json(&mut cli(
            db,
            &["jobs", "ls", "--status", "succeeded", "--json"],
        ));
        jobs.as_array().is_some_and(|a| a.len() >= 2)
    });
    assert!(fired, "no slot ran: {jobs}\n{}", runner.log());
    let job = &jobs[0];
    assert_eq!(job["schedule"], "tick");
    let slot = job["slot_at"].as_i64().unwrap();
    assert_eq!(slot % 1000, 0, "a slot is a whole second");
    let full = inspect(db, job["id"].as_i64().unwrap());
    let detail = full["events"][0]["detail"].as_str().unwrap();
    assert!(detail.contains("schedule tick"), "{detail}");
    let listed = json(&mut cli(db, &["schedules", "ls", "--json"]));
    assert!(listed[0]["last_slot_at"].as_i64().unwrap() >= slot);
    runner.signal(nix::sys::signal::Signal::SIGTERM);
    let (code, _) = runner.wait(Duration::from_secs(30));
    assert_eq!(code, Some(0));
}

crate::on_both! {
    fn add_ls_pause_resume_rm_round_trip(t) {
        let target = t.target();
        let db = target.as_path();
        let added = json(&mut cli(
            db,
            &[
                "schedules",
                "add",
                "nightly",
                "--cron",
                "30 2 * * *",
                "--tz",
                "Europe/Berlin",
                "--catch-up",
                "one",
                "--queue",
                "backups",
                "--timeout",
                "600",
                "--json",
                "--",
                "backup",
                "--all",
            ],
        ));
        assert_eq!(added["name"], "nightly");
        assert_eq!(added["paused"], false);
        assert!(added["next_slot_at"].is_i64());
        let list = json(&mut cli(db, &["schedules", "ls", "--json"]));
        let list = list.as_array().unwrap();
        assert_eq!(list.len(), 1);
        let s = &list[0];
        for (field, want) in [
            ("name", Value::from("nightly")),
            ("expression", Value::from("30 2 * * *")),
            ("tz", Value::from("Europe/Berlin")),
            ("catch_up", Value::from("one")),
            ("overlap", Value::from("skip")),
            ("paused", Value::from(false)),
            ("last_slot_at", Value::Null),
            ("command", serde_json::json!(["backup", "--all"])),
        ] {
            assert_eq!(s[field], want, "{field} in {s}");
        }
        assert!(s["next_slot_at"].is_i64());
        let human = ok(&mut cli(db, &["schedules", "ls"]));
        assert!(
            human.contains("nightly") && human.contains("backup --all"),
            "{human}"
        );

        // A name in use: exit 1 and unchanged, unless --replace.
        let line = fails(
            &mut cli(
                db,
                &["schedules", "add", "nightly", "--every", "60", "--", "true"],
            ),
            1,
        );
        assert!(line.contains("exists already"), "{line}");
        let v = json(&mut cli(
            db,
            &[
                "schedules",
                "add",
                "nightly",
                "--every",
                "60",
                "--replace",
                "--json",
                "--",
                "true",
            ],
        ));
        assert_eq!(v["every_ms"], 60_000);
        assert_eq!(v["expression"], "@every 60s");

        let paused = json(&mut cli(db, &["schedules", "pause", "nightly", "--json"]));
        assert_eq!(paused["paused"], true);
        let resumed = json(&mut cli(db, &["schedules", "resume", "nightly", "--json"]));
        assert_eq!(resumed["paused"], false);
        ok(&mut cli(db, &["schedules", "rm", "nightly"]));
        assert_eq!(schedules_rows(&t), 0);
        for cmd in ["rm", "pause", "resume"] {
            let line = fails(&mut cli(db, &["schedules", cmd, "nightly"]), 1);
            assert!(line.contains("no schedule named"), "{cmd}: {line}");
        }
        fails(&mut cli(db, &["schedules", "next", "nightly"]), 1);
    }

    fn next_shows_the_dst_slots_in_utc_and_in_the_zone(t) {
        let target = t.target();
        let db = target.as_path();
        ok(&mut cli(
            db,
            &[
                "schedules",
                "add",
                "nightly",
                "--cron",
                "30 2 * * *",
                "--tz",
                "Europe/Berlin",
                "--",
                "true",
            ],
        ));
        let v = json(&mut cli(
            db,
            &[
                "schedules",
                "next",
                "nightly",
                "--after",
                "2027-03-27T12:00:00Z",
                "--count",
                "2",
                "--json",
            ],
        ));
        assert_eq!(
            v,
            serde_json::json!({"slots": [
                {"at": 1_806_195_600_000_i64, "local": "2027-03-28T03:00:00+02:00"},
                {"at": 1_806_280_200_000_i64, "local": "2027-03-29T02:30:00+02:00"},
            ]})
        );
        let v = json(&mut cli(
            db,
            &[
                "schedules",
                "next",
                "nightly",
                "--after",
                "2027-10-30T12:00:00Z",
                "--count",
                "2",
                "--json",
            ],
        ));
        let locals: Vec<&str> = v["slots"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["local"].as_str().unwrap())
            .collect();
        assert_eq!(
            locals,
            ["2027-10-31T02:30:00+02:00", "2027-11-01T02:30:00+01:00"]
        );
        let human = ok(&mut cli(
            db,
            &[
                "schedules",
                "next",
                "nightly",
                "--after",
                "2027-03-27T12:00:00Z",
                "--count",
                "1",
            ],
        ));
        assert_eq!(
            human,
            "2027-03-28T01:00:00.000Z  2027-03-28T03:00:00+02:00\n"
        );
    }

    fn bad_input_is_refused_in_one_line_and_writes_nothing(t) {
        let target = t.target();
        let db = target.as_path();
        let cases: [(&[&str], &str); 9] = [
            (&["--cron", "61 * * * *"], "invalid cron"),
            (&["--cron", "* * *"], "invalid cron"),
            (&["--cron", "@reboot"], "invalid cron"),
            (
                &["--cron", "* * * * *", "--tz", "Mars/Olympus"],
                "invalid tz",
            ),
            (&["--every", "0"], "--every"),
            (&["--every", "0.5"], "invalid every"),
            (
                &["--cron", "* * * * *", "--every", "5"],
                "cannot be used with",
            ),
            (&["--cron", "* * * * *", "--catch-up", "some"], "--catch-up"),
            (&[], "--cron"),
        ];
        for (options, says) in cases {
            let mut args = vec!["schedules", "add", "s"];
            args.extend_from_slice(options);
            args.extend_from_slice(&["--", "true"]);
            let line = fails(&mut cli(db, &args), 2);
            assert!(line.contains(says), "{options:?}: {line}");
            assert!(!db.exists(), "{options:?} created the file");
        }
        let line = fails(
            &mut cli(db, &["schedules", "add", "", "--every", "5", "--", "true"]),
            2,
        );
        assert!(line.contains("name cannot be empty"), "{line}");
        let line = fails(&mut cli(db, &["schedules", "add", "s", "--every", "5"]), 2);
        assert!(line.contains("needs a command"), "{line}");
        let line = fails(
            &mut cli(db, &["schedules", "next", "s", "--after", "yesterday"]),
            2,
        );
        assert!(line.contains("RFC 3339"), "{line}");
        assert!(!db.exists());

        // A name used twice: the second is refused with exit 1 and the first stays as it was.
        ok(&mut cli(
            db,
            &["schedules", "add", "s", "--every", "5", "--", "true"],
        ));
        fails(
            &mut cli(
                db,
                &["schedules", "add", "s", "--every", "9", "--", "false"],
            ),
            1,
        );
        let list = json(&mut cli(db, &["schedules", "ls", "--json"]));
        assert_eq!(list[0]["every_ms"], 5000);
        assert_eq!(list[0]["command"], serde_json::json!(["true"]));
        assert_eq!(schedules_rows(&t), 1);
    }

    fn unique_key_prints_the_existing_id_and_says_duplicate(t) {
        let target = t.target();
        let db = target.as_path();
        let add = |extra: &[&str]| {
            let mut args = vec!["jobs", "add", "--unique-key", "sync", "--json"];
            args.extend_from_slice(extra);
            args.extend_from_slice(&["--", "sh", "-c", "exit 0"]);
            json(&mut cli(db, &args))
        };
        let first = add(&[]);
        assert_eq!(first["duplicate"], false);
        let id = first["id"].as_i64().unwrap();
        let again = add(&[]);
        assert_eq!(again, serde_json::json!({"id": id, "duplicate": true}));
        // Without --json: the id, exit 0.
        let plain = ok(&mut cli(
            db,
            &[
                "jobs",
                "add",
                "--unique-key",
                "sync",
                "--",
                "sh",
                "-c",
                "exit 0",
            ],
        ));
        assert_eq!(plain.trim(), id.to_string());
        assert_eq!(inspect(db, id)["unique_key"], "sync");
        let line = fails(
            &mut cli(db, &["jobs", "add", "--unique-window", "5", "--", "true"]),
            2,
        );
        assert!(line.contains("--unique-key"), "{line}");
        fails(
            &mut cli(db, &["jobs", "add", "--unique-key", "", "--", "true"]),
            2,
        );
    }
}
