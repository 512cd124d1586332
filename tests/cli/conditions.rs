//! Conditions on jobs (`jobs add --when`), on real parts: a fake `/sys/class/power_supply`
//! bind-mounted over the real one in a mount namespace of the runner's own, and a private
//! D-Bus bus (Debian's `dbus-daemon`) with a stand-in for NetworkManager's and logind's
//! properties that the test flips.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

use crate::helper::{FAST, add, cli, inspect, json, ok, wait_running};
use crate::util::{RunnerProcess, exposition, leasehold_vars, wait_for};

/// How long a test waits for a runner to see a change: well past its 2 s look.
const SEEN: Duration = Duration::from_secs(20);

/// A runner in a mount namespace of its own, with `fake` bind-mounted over
/// `/sys/class/power_supply`; killed by pid when dropped.
struct PoweredRunner {
    child: Child,
    log: PathBuf,
}

impl PoweredRunner {
    fn start(db: &Path, folder: &Path, fake: &Path, extra: &[&str]) -> PoweredRunner {
        let log = folder.join("powered-runner.log");
        let bin = assert_cmd::cargo::cargo_bin("leasehold");
        let mut cmd = Command::new("unshare");
        cmd.args(["-m", "sh", "-c"])
            .arg(r#"mount --bind "$1" /sys/class/power_supply && shift && exec "$@""#)
            .arg("sh")
            .arg(fake)
            .arg(bin)
            .arg("--db")
            .arg(db)
            .arg("run")
            .args(FAST)
            .args(extra);
        for var in leasehold_vars() {
            cmd.env_remove(var);
        }
        // No system bus: online, unmetered and idle are assumed to hold.
        cmd.env(
            "DBUS_SYSTEM_BUS_ADDRESS",
            "unix:path=/nonexistent/leasehold-test-bus",
        );
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("the runner's log can be made"))
            .spawn()
            .expect("unshare starts");
        PoweredRunner { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for PoweredRunner {
    fn drop(&mut self) {
        // `unshare` and `sh` exec: the pid is the runner's.
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fake power supply folder: a mains adapter and a battery.
fn fake_power(folder: &Path, online: bool, capacity: u32) -> PathBuf {
    let fake = folder.join("power_supply");
    for (name, files) in [
        (
            "AC",
            vec![
                ("type", "Mains".to_string()),
                ("online", u8::from(online).to_string()),
            ],
        ),
        (
            "BAT0",
            vec![
                ("type", "Battery".to_string()),
                ("capacity", capacity.to_string()),
            ],
        ),
    ] {
        let dir = fake.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        for (f, v) in files {
            std::fs::write(dir.join(f), format!("{v}\n")).unwrap();
        }
    }
    fake
}

fn set(fake: &Path, file: &str, value: &str) {
    std::fs::write(fake.join(file), format!("{value}\n")).unwrap();
}

/// Waits until a runner has recorded what it sees; returns `status --json`.
fn looked(db: &Path) -> Value {
    wait_for("a runner to record the conditions", SEEN, || {
        let status = json(&mut cli(db, &["status", "--json"]));
        status["runners"]
            .as_array()?
            .iter()
            .any(|r| r["conditions_held"].is_array())
            .then_some(status)
    })
}

fn status_of(db: &Path, id: i64) -> (String, Value) {
    let job = inspect(db, id);
    (job["status"].as_str().unwrap_or_default().to_owned(), job)
}

crate::on_both! {
    /// Unplugged, a job `--when ac-power` waits and every view says why, and one `--when
    /// battery-not-low` waits while the battery is at 10 %; plugged in, the first starts within
    /// the runner's look; charged, the second runs. Unplugged again while the first runs with
    /// `--when-lost stop`, it is stopped and put back to wait, nothing spent (its one attempt
    /// allowed still lets it run once plugged in again), and its history says why.
    fn ac_power_and_battery_hold_jobs_back_and_a_lost_one_stops_its_job(t) {
        let target = t.target();
        let db = target.as_path();
        let folder = t.dir.path();
        let fake = fake_power(folder, false, 10);
        let mark = folder.join("ran");
        let id = add(
            db,
            &["--when", "ac-power", "--when-lost", "stop"],
            &["sh", "-c", &format!("echo >> {}; exec sleep 300", mark.display())],
        );
        let low = add(db, &["--when", "battery-not-low"], &["true"]);
        let runner = PoweredRunner::start(db, folder, &fake, &[]);
        let status = looked(db);
        assert_eq!(status["runners"][0]["conditions_held"], json!(["unmetered", "online", "idle"]), "{status}");
        assert_eq!(
            status["waiting_for_conditions"],
            json!({"ac-power": 1, "battery-not-low": 1}),
            "{status}"
        );
        let (state, job) = status_of(db, id);
        assert_eq!(state, "pending", "{job}");
        assert_eq!(job["waiting_for"], json!(["ac-power"]), "{job}");
        assert_eq!(job["when"], json!(["ac-power"]), "{job}");
        assert_eq!(job["when_lost"], "stop", "{job}");
        assert_eq!(inspect(db, low)["waiting_for"], json!(["battery-not-low"]));
        let text = ok(&mut cli(db, &["jobs", "inspect", &id.to_string()]));
        assert!(text.contains("waiting_for") && text.contains("ac-power"), "{text}");
        let ls = ok(&mut cli(db, &["jobs", "ls"]));
        assert!(ls.contains("waiting for ac-power"), "{ls}");
        assert!(ls.contains("waiting for battery-not-low"), "{ls}");
        let text = ok(&mut cli(db, &["status"]));
        assert!(text.contains("waiting: 1 job for ac-power"), "{text}");
        let metrics = exposition::parse(&ok(&mut cli(db, &["status", "--prometheus"])));
        assert_eq!(
            metrics.value("leasehold_jobs_waiting_for_condition", &[("condition", "ac-power")]),
            1.0
        );
        assert_eq!(
            metrics.value("leasehold_jobs_waiting_for_condition", &[("condition", "idle")]),
            0.0
        );

        // Plugged in: it starts.
        set(&fake, "AC/online", "1");
        let plugged = Instant::now();
        let job = wait_running(db, id);
        eprintln!("started {:?} after the flip", plugged.elapsed());
        assert_eq!(job["attempt"], 1, "{job}");
        assert_eq!(job["waiting_for"], json!([]), "{job}");
        // On AC the battery is not low either.
        wait_for("the battery-not-low job to succeed", SEEN, || {
            (status_of(db, low).0 == "succeeded").then_some(())
        });
        let pid = job["pid"].as_i64().expect("a pid");

        // Unplugged while it runs: stopped, requeued, nothing spent.
        set(&fake, "AC/online", "0");
        let job = wait_for("the job to be stopped and requeued", SEEN, || {
            let (state, job) = status_of(db, id);
            (state == "pending").then_some(job)
        });
        assert_eq!(job["attempt"], 1, "{job}");
        assert_eq!(job["failed_attempts"], 0, "{job}");
        assert_eq!(job["recovery_count"], 0, "{job}");
        assert_eq!(job["waiting_for"], json!(["ac-power"]), "{job}");
        assert!(
            crate::util::wait_until(Duration::from_secs(10), || kill(Pid::from_raw(pid as i32), None).is_err()),
            "the stopped attempt's process {pid} is gone"
        );
        let events = inspect(db, id)["events"].clone();
        let interrupted = events
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["kind"] == "interrupted")
            .unwrap_or_else(|| panic!("an interrupted event: {events}"));
        assert!(
            interrupted["detail"].as_str().unwrap().contains("condition lost: ac-power no longer held"),
            "{interrupted}"
        );

        // Plugged in again: it runs again, its one attempt not spent.
        set(&fake, "AC/online", "1");
        let job = wait_running(db, id);
        assert_eq!(job["attempt"], 2, "{job}");
        assert_eq!(std::fs::read_to_string(&mark).unwrap().lines().count(), 2);
        ok(&mut cli(db, &["jobs", "cancel", &id.to_string()]));
        assert!(!runner.log().contains("panicked"), "{}", runner.log());
    }
}

/// A private bus and a stand-in that owns NetworkManager's and logind's names and answers
/// `Properties.Get` for the properties the test sets.
mod bus {
    use std::collections::HashMap;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    use std::path::Path;
    use std::process::{Child, Command, Stdio};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// A property's value: `u` or `b`.
    #[derive(Clone, Copy)]
    pub enum V {
        U(u32),
        B(bool),
    }

    /// `dbus-daemon` on a socket in `folder`, killed when dropped.
    pub struct Daemon {
        child: Child,
        pub address: String,
    }

    impl Daemon {
        pub fn start(folder: &Path) -> Daemon {
            let socket = folder.join("bus");
            let address = format!("unix:path={}", socket.display());
            let child = Command::new("dbus-daemon")
                .args(["--session", "--nofork", "--nopidfile"])
                .arg(format!("--address={address}"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .expect("dbus-daemon starts (Debian's dbus-daemon)");
            assert!(
                crate::util::wait_until(Duration::from_secs(10), || socket.exists()),
                "the bus's socket appears"
            );
            Daemon { child, address }
        }
    }

    impl Drop for Daemon {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// The properties the stand-in serves, by (interface, name).
    pub type Props = Arc<Mutex<HashMap<(String, String), V>>>;

    /// Starts the stand-in on `address`, owning `names`, serving `props`, on a thread of
    /// this test (it ends with the bus).
    pub fn stand_in(address: &str, names: &[&str], props: Props) {
        let path = address.strip_prefix("unix:path=").expect("a path address");
        let mut s = UnixStream::connect(path).expect("the bus accepts");
        let uid: String = nix::unistd::geteuid()
            .as_raw()
            .to_string()
            .bytes()
            .map(|b| format!("{b:02x}"))
            .collect();
        s.write_all(format!("\0AUTH EXTERNAL {uid}\r\n").as_bytes())
            .unwrap();
        let mut line = Vec::new();
        let mut b = [0u8];
        while !line.ends_with(b"\r\n") {
            s.read_exact(&mut b).unwrap();
            line.push(b[0]);
        }
        assert!(
            line.starts_with(b"OK "),
            "{}",
            String::from_utf8_lossy(&line)
        );
        s.write_all(b"BEGIN\r\n").unwrap();
        let mut serial = 0;
        let mut call = |s: &mut UnixStream, member: &str, sig: &str, body: &[u8]| {
            serial += 1;
            let fields = [
                (1u8, 'o', "/org/freedesktop/DBus"),
                (2, 's', "org.freedesktop.DBus"),
                (3, 's', member),
                (6, 's', "org.freedesktop.DBus"),
            ];
            s.write_all(&message(1, serial, &fields, None, sig, body))
                .unwrap();
            // The reply, and any signal before it.
            loop {
                let m = read(s);
                if m.reply_serial == Some(serial) {
                    return;
                }
            }
        };
        call(&mut s, "Hello", "", &[]);
        for name in names {
            let mut body = Vec::new();
            string(&mut body, name);
            pad(&mut body, 4);
            body.extend(4u32.to_le_bytes()); // DBUS_NAME_FLAG_DO_NOT_QUEUE
            call(&mut s, "RequestName", "su", &body);
        }
        std::thread::spawn(move || {
            let mut serial = 1000;
            loop {
                let m = read(&mut s);
                if m.kind != 1 || m.member != "Get" {
                    continue;
                }
                let (iface, name) = m.two_strings();
                serial += 1;
                let value = props.lock().unwrap().get(&(iface, name)).copied();
                let mut body = Vec::new();
                let (sig, error) = match value {
                    Some(V::U(n)) => {
                        body.extend([1, b'u', 0, 0]);
                        body.extend(n.to_le_bytes());
                        ("v", None)
                    }
                    Some(V::B(v)) => {
                        body.extend([1, b'b', 0, 0]);
                        body.extend(u32::from(v).to_le_bytes());
                        ("v", None)
                    }
                    None => ("", Some("org.freedesktop.DBus.Error.UnknownProperty")),
                };
                let mut fields = vec![(6u8, 's', m.sender.as_str())];
                if let Some(e) = error {
                    fields.push((4, 's', e));
                }
                let kind = if error.is_some() { 3 } else { 2 };
                let msg = message(kind, serial, &fields, Some(m.serial), sig, &body);
                if s.write_all(&msg).is_err() {
                    return;
                }
            }
        });
    }

    struct Message {
        kind: u8,
        serial: u32,
        reply_serial: Option<u32>,
        member: String,
        sender: String,
        body: Vec<u8>,
    }

    impl Message {
        fn two_strings(&self) -> (String, String) {
            let mut pos: usize = 0;
            let mut next = || {
                pos = pos.div_ceil(4) * 4;
                let n = u32::from_le_bytes(self.body[pos..pos + 4].try_into().unwrap()) as usize;
                let s = String::from_utf8_lossy(&self.body[pos + 4..pos + 4 + n]).into_owned();
                pos += 4 + n + 1;
                s
            };
            (next(), next())
        }
    }

    fn read(s: &mut UnixStream) -> Message {
        let mut fixed = [0u8; 16];
        s.read_exact(&mut fixed).unwrap_or_else(|_| panic_or_end());
        let word = |i: usize| u32::from_le_bytes(fixed[i..i + 4].try_into().unwrap());
        let (body_len, serial, fields_len) = (word(4) as usize, word(8), word(12) as usize);
        let padded = fields_len.div_ceil(8) * 8;
        let mut rest = vec![0u8; padded + body_len];
        s.read_exact(&mut rest).unwrap_or_else(|_| panic_or_end());
        let body = rest.split_off(padded);
        let mut m = Message {
            kind: fixed[1],
            serial,
            reply_serial: None,
            member: String::new(),
            sender: String::new(),
            body,
        };
        let f = &rest[..fields_len];
        let mut pos = 0;
        while pos < f.len() {
            pos = pos.div_ceil(8) * 8;
            let code = f[pos];
            let sig_len = f[pos + 1] as usize;
            let sig = f[pos + 2];
            pos += 2 + sig_len + 1;
            match sig {
                b's' | b'o' => {
                    pos = pos.div_ceil(4) * 4;
                    let n = u32::from_le_bytes(f[pos..pos + 4].try_into().unwrap()) as usize;
                    let v = String::from_utf8_lossy(&f[pos + 4..pos + 4 + n]).into_owned();
                    pos += 4 + n + 1;
                    match code {
                        3 => m.member = v,
                        7 => m.sender = v,
                        _ => {}
                    }
                }
                b'g' => pos += f[pos] as usize + 2,
                b'u' => {
                    pos = pos.div_ceil(4) * 4;
                    let v = u32::from_le_bytes(f[pos..pos + 4].try_into().unwrap());
                    pos += 4;
                    if code == 5 {
                        m.reply_serial = Some(v);
                    }
                }
                other => panic!("a header field of type {}", other as char),
            }
        }
        m
    }

    /// The bus went away at the end of the test: the stand-in's thread ends.
    fn panic_or_end() -> ! {
        // A thread of its own: unwinding it ends only it, quietly enough for a test.
        std::panic::resume_unwind(Box::new("the bus closed"))
    }

    fn pad(buf: &mut Vec<u8>, n: usize) {
        while buf.len() % n != 0 {
            buf.push(0);
        }
    }

    fn string(buf: &mut Vec<u8>, s: &str) {
        pad(buf, 4);
        buf.extend((s.len() as u32).to_le_bytes());
        buf.extend(s.as_bytes());
        buf.push(0);
    }

    fn message(
        kind: u8,
        serial: u32,
        fields: &[(u8, char, &str)],
        reply_to: Option<u32>,
        sig: &str,
        body: &[u8],
    ) -> Vec<u8> {
        let mut f = Vec::new();
        for &(code, t, v) in fields {
            pad(&mut f, 8);
            f.extend([code, 1, t as u8, 0]);
            string(&mut f, v);
        }
        if let Some(r) = reply_to {
            pad(&mut f, 8);
            f.extend([5, 1, b'u', 0]);
            f.extend(r.to_le_bytes());
        }
        if !sig.is_empty() {
            pad(&mut f, 8);
            f.extend([8, 1, b'g', 0, sig.len() as u8]);
            f.extend(sig.as_bytes());
            f.push(0);
        }
        let mut m = vec![b'l', kind, 0, 1];
        m.extend((body.len() as u32).to_le_bytes());
        m.extend(serial.to_le_bytes());
        m.extend((f.len() as u32).to_le_bytes());
        m.extend(f);
        pad(&mut m, 8);
        m.extend(body);
        m
    }
}

/// On a private bus: with no NetworkManager or logind on it and `--unknown-conditions
/// not-held`, jobs `--when unmetered` and `--when idle` wait and `status` says what was
/// assumed; with the stand-in, a `guess-yes` metered network still holds the first back
/// (WorkManager counts a guess as metered) until it is `guess-no`, and the second waits until
/// logind's `IdleHint` is true.
#[test]
fn unmetered_and_idle_follow_network_manager_and_logind_on_the_bus() {
    let t = crate::util::TestDb::new();
    let db = t.path.as_path();
    let daemon = bus::Daemon::start(t.dir.path());
    let unmetered = add(db, &["--when", "unmetered", "--when", "online"], &["true"]);
    let idle = add(db, &["--when", "idle"], &["true"]);
    let mut args = FAST.to_vec();
    args.extend(["--unknown-conditions", "not-held"]);
    let runner = RunnerProcess::start_with_env(
        db,
        &args,
        &[("DBUS_SYSTEM_BUS_ADDRESS", daemon.address.as_str())],
    );
    let status = looked(db);
    let assumed = status["runners"][0]["conditions_assumed"]
        .as_str()
        .unwrap_or_default();
    assert!(
        assumed.contains("NetworkManager not reachable") && assumed.contains("assumed not to hold"),
        "{status}"
    );
    let text = ok(&mut cli(db, &["status"]));
    assert!(text.contains("NetworkManager not reachable"), "{text}");
    assert_eq!(
        inspect(db, unmetered)["waiting_for"],
        json!(["unmetered", "online"])
    );
    assert_eq!(inspect(db, idle)["waiting_for"], json!(["idle"]));

    let props: bus::Props = Default::default();
    let nm = "org.freedesktop.NetworkManager";
    let logind = "org.freedesktop.login1.Manager";
    let put = |iface: &str, name: &str, v: bus::V| {
        props.lock().unwrap().insert((iface.into(), name.into()), v);
    };
    put(nm, "Metered", bus::V::U(3)); // guess-yes
    put(nm, "Connectivity", bus::V::U(4)); // full
    put(logind, "IdleHint", bus::V::B(false));
    bus::stand_in(
        &daemon.address,
        &["org.freedesktop.NetworkManager", "org.freedesktop.login1"],
        props.clone(),
    );
    wait_for("the runner to see the stand-in", SEEN, || {
        let status = json(&mut cli(db, &["status", "--json"]));
        status["runners"][0]["conditions_assumed"]
            .is_null()
            .then_some(())
    });
    let job = inspect(db, unmetered);
    assert_eq!(
        job["waiting_for"],
        json!(["unmetered"]),
        "guess-yes is metered: {job}"
    );
    assert_eq!(inspect(db, idle)["waiting_for"], json!(["idle"]));

    put(nm, "Metered", bus::V::U(4)); // guess-no
    wait_for("the unmetered job to succeed", SEEN, || {
        (status_of(db, unmetered).0 == "succeeded").then_some(())
    });
    assert_eq!(status_of(db, idle).0, "pending");
    put(logind, "IdleHint", bus::V::B(true));
    wait_for("the idle job to succeed", SEEN, || {
        (status_of(db, idle).0 == "succeeded").then_some(())
    });
    crate::helper::stop(runner);
}
