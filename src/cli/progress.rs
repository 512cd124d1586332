//! Progress of long commands, on stderr and only when stderr is a terminal: a piped or
//! redirected run prints its result and nothing else.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How long work runs before a spinner appears: shorter work shows nothing.
const SPINNER_AFTER: Duration = Duration::from_millis(500);
/// How often a spinner or bar redraws on its own.
const TICK: Duration = Duration::from_millis(100);

/// Whether progress is shown at all.
pub fn on_terminal() -> bool {
    std::io::stderr().is_terminal()
}

/// A bar of `total` steps, or nothing off a terminal.
pub struct Bar(Option<ProgressBar>);

impl Bar {
    /// A bar counting `unit` (e.g. "lines enqueued") up to `total`.
    pub fn new(total: u64, unit: &str) -> Bar {
        if !on_terminal() {
            return Bar(None);
        }
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        // The template is a constant, so a failure here is a typo caught by the tests; fall
        // back to the default style rather than fail the command.
        if let Ok(style) = ProgressStyle::with_template(&format!(
            "{{bar:30}} {{pos}}/{{len}} {unit} ({{elapsed}}, {{eta}} left)"
        )) {
            bar.set_style(style);
        }
        bar.enable_steady_tick(TICK);
        bar.tick();
        Bar(Some(bar))
    }

    /// Sets how many steps are done.
    pub fn set(&self, done: u64) {
        if let Some(bar) = &self.0 {
            bar.set_position(done);
        }
    }

    /// Adds `n` done steps.
    pub fn inc(&self, n: u64) {
        if let Some(bar) = &self.0 {
            bar.inc(n);
        }
    }

    /// Removes the bar, leaving the terminal as it was for the result.
    pub fn finish(self) {
        if let Some(bar) = self.0 {
            bar.finish_and_clear();
        }
    }
}

/// Runs `work`, with a spinner saying `what` if it takes longer than half a second and
/// stderr is a terminal.
pub fn spin_while<T>(what: &str, work: impl FnOnce() -> T) -> T {
    if !on_terminal() {
        return work();
    }
    let (done, wait) = crossbeam_channel::bounded::<()>(1);
    let what = what.to_string();
    let spinner = std::thread::spawn(move || {
        if wait.recv_timeout(SPINNER_AFTER).is_ok() {
            return;
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
            bar.set_style(style);
        }
        bar.set_message(what);
        bar.enable_steady_tick(TICK);
        let _ = wait.recv();
        bar.finish_and_clear();
    });
    let result = work();
    let _ = done.send(());
    // The spinner only draws; if it panicked, the work's result still stands.
    let _ = spinner.join();
    result
}
