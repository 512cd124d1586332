//! Headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`):
//! JSON messages ended by a NUL byte, the browser reading fd 3 and writing fd 4. One browser
//! keeps its cookies across pages, which a `--dump-dom` run per page cannot.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::{Value, json};

use crate::serve::CHROMIUM_FLAGS;

/// How long one protocol call or one page load may take.
const STEP: Duration = Duration::from_secs(60);

/// A headless Chromium with one page attached; its process group is killed when dropped.
pub struct Browser {
    child: Child,
    to: File,
    from: Receiver<Value>,
    /// Events read while waiting for an answer, in order.
    events: Vec<Value>,
    next_id: u64,
    session: String,
    _profile: tempfile::TempDir,
}

/// `fd` moved to a descriptor numbered 10 or more, close-on-exec, so that the child's
/// `dup2` onto 3 and 4 cannot clobber it.
fn high(fd: OwnedFd) -> OwnedFd {
    let n = fcntl(&fd, FcntlArg::F_DUPFD_CLOEXEC(10)).expect("fcntl F_DUPFD_CLOEXEC");
    // SAFETY: `n` was just returned by fcntl as a new descriptor that nothing else owns.
    unsafe { OwnedFd::from_raw_fd(n) }
}

impl Browser {
    pub fn start() -> Browser {
        crate::serve::need_chromium();
        let profile = tempfile::tempdir().unwrap();
        let (to_child, to_parent) = {
            let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).unwrap();
            (high(r), w)
        };
        let (from_parent, from_child) = {
            let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).unwrap();
            (r, high(w))
        };
        let (in_fd, out_fd) = (to_child.as_raw_fd(), from_child.as_raw_fd());
        let mut cmd = Command::new("chromium");
        cmd.args(CHROMIUM_FLAGS)
            .arg("--remote-debugging-pipe")
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own group, so that it and its helpers are ended together.
            .process_group(0);
        // SAFETY: between fork and exec the closure only calls dup2 (async-signal-safe) on
        // descriptors open in the parent; the OwnedFd for 3 and 4 are never dropped, so
        // nothing closes them.
        unsafe {
            cmd.pre_exec(move || {
                for (from, to) in [(in_fd, 3), (out_fd, 4)] {
                    let mut target = std::mem::ManuallyDrop::new(OwnedFd::from_raw_fd(to));
                    nix::unistd::dup2(BorrowedFd::borrow_raw(from), &mut target)?;
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("chromium starts");
        // Only the browser holds its ends now: its exit closes the pipe.
        drop((to_child, from_child));
        let (tx, from) = crossbeam_channel::unbounded();
        let reader = File::from(from_parent);
        std::thread::spawn(move || {
            let mut reader = BufReader::new(reader);
            loop {
                let mut message = Vec::new();
                match reader.read_until(0, &mut message) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                if message.last() == Some(&0) {
                    message.pop();
                }
                let Ok(value) = serde_json::from_slice::<Value>(&message) else {
                    continue;
                };
                if tx.send(value).is_err() {
                    break;
                }
            }
        });
        let mut browser = Browser {
            child,
            to: File::from(to_parent),
            from,
            events: Vec::new(),
            next_id: 0,
            session: String::new(),
            _profile: profile,
        };
        let target = browser.call("Target.createTarget", json!({"url": "about:blank"}));
        let target = target["targetId"].as_str().unwrap().to_string();
        let attached = browser.call(
            "Target.attachToTarget",
            json!({"targetId": target, "flatten": true}),
        );
        browser.session = attached["sessionId"].as_str().unwrap().to_string();
        browser.call("Page.enable", json!({}));
        browser
    }

    /// Sends a command (to the page once attached) and returns its result.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({"id": id, "method": method, "params": params});
        if !self.session.is_empty() {
            message["sessionId"] = json!(self.session);
        }
        let mut bytes = serde_json::to_vec(&message).unwrap();
        bytes.push(0);
        self.to.write_all(&bytes).expect("chromium reads its pipe");
        let deadline = Instant::now() + STEP;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let reply = self
                .from
                .recv_timeout(left)
                .unwrap_or_else(|e| panic!("no answer to {method} from chromium: {e}"));
            if reply["id"] == json!(id) {
                assert!(reply.get("error").is_none(), "{method}: {reply}");
                return reply["result"].clone();
            }
            if reply.get("method").is_some() {
                self.events.push(reply);
            }
        }
    }

    /// Waits for the page's next `Page.loadEventFired` after the events already seen.
    fn wait_load(&mut self, seen: usize) {
        let deadline = Instant::now() + STEP;
        loop {
            if self.events[seen..]
                .iter()
                .any(|e| e["method"] == "Page.loadEventFired")
            {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let event = self
                .from
                .recv_timeout(left)
                .unwrap_or_else(|e| panic!("no page load in chromium: {e}"));
            if event.get("method").is_some() {
                self.events.push(event);
            }
        }
    }

    /// Opens `url` and waits until the page (after any redirect) has loaded.
    pub fn navigate(&mut self, url: &str) {
        let seen = self.events.len();
        let result = self.call("Page.navigate", json!({"url": url}));
        assert!(result.get("errorText").is_none(), "{url}: {result}");
        self.wait_load(seen);
    }

    /// Evaluates `expression` in the page and returns its value.
    pub fn evaluate(&mut self, expression: &str) -> Value {
        let result = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true}),
        );
        assert!(
            result.get("exceptionDetails").is_none(),
            "{expression}: {result}"
        );
        result["result"]["value"].clone()
    }

    /// Evaluates `expression` (which submits a form or follows a link) and waits for the page
    /// it leads to.
    pub fn evaluate_and_wait(&mut self, expression: &str) {
        let seen = self.events.len();
        self.evaluate(expression);
        self.wait_load(seen);
    }

    /// The page's address now.
    pub fn location(&mut self) -> String {
        self.evaluate("location.href").as_str().unwrap().to_string()
    }

    /// The serialized DOM, as `--dump-dom` prints it.
    pub fn html(&mut self) -> String {
        self.evaluate("document.documentElement.outerHTML")
            .as_str()
            .unwrap()
            .to_string()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = killpg(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
        let _ = self.child.wait();
    }
}
