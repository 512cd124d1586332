//! A per-test bound: a test that hangs ends the test process, naming itself.

use std::io::Write;
use std::sync::mpsc;
use std::time::Duration;

/// How long a test may run before its watchdog ends the test process.
pub const WATCHDOG_DEFAULT_SECS: u64 = 120;
/// Overrides [`WATCHDOG_DEFAULT_SECS`].
pub const WATCHDOG_ENV: &str = "LEASEHOLD_TEST_WATCHDOG_SECS";

/// A guard that ends the whole test process, naming the test, when it is not dropped in
/// time: a test that hangs (a claim that never returns, a wait without a deadline) then fails
/// within a bound instead of wedging the test binary for minutes.
///
/// Create it first in a test ([`TestDb`](super::TestDb) holds one), so it is dropped last.
pub struct Watchdog {
    // Dropping the sender wakes the watchdog thread, which then exits quietly.
    _disarm: mpsc::Sender<()>,
}

impl Watchdog {
    /// Arms a watchdog for the current test: 120 s, or `LEASEHOLD_TEST_WATCHDOG_SECS`.
    pub fn new() -> Watchdog {
        let secs = std::env::var(WATCHDOG_ENV)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(WATCHDOG_DEFAULT_SECS);
        Watchdog::with_timeout(Duration::from_secs(secs))
    }

    /// Arms a watchdog that fires after `timeout`.
    pub fn with_timeout(timeout: Duration) -> Watchdog {
        // libtest runs each test on a thread named after it.
        let test = std::thread::current()
            .name()
            .unwrap_or("<unnamed test thread>")
            .to_string();
        let (disarm, armed) = mpsc::channel::<()>();
        std::thread::Builder::new()
            .name(format!("watchdog {test}"))
            .spawn(move || {
                if let Err(mpsc::RecvTimeoutError::Timeout) = armed.recv_timeout(timeout) {
                    // Straight to the stderr file: eprintln! would go to the test's captured
                    // output, which is never shown when the process exits.
                    let _ = writeln!(
                        std::io::stderr(),
                        "watchdog: test {test} did not finish within {timeout:?} \
                         (set {WATCHDOG_ENV} to change the bound); ending the test process"
                    );
                    std::process::exit(97);
                }
            })
            .expect("the watchdog thread starts");
        Watchdog { _disarm: disarm }
    }
}
