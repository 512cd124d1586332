//! JUnit XML reports of jobs (`run --until-idle --junit`, `jobs report --junit`), for a
//! harness that runs tests as jobs and hands CI the report it reads.
//!
//! The shape is the JUnit schema the Jenkins plugins document (`junit-10.xsd` of Jenkins'
//! xUnit plugin; its JUnit plugin reads the same elements), which GitLab and GitHub's test
//! reporters read too: `<testsuites>` holding one `<testsuite name="leasehold">`, and a
//! `<testcase>` per job, classname its queue, name its name or else its command line, time
//! its last attempt's, with `<failure>` (the command failed: exit, signal, timeout, idle
//! timeout), `<error>` (it was lost, or could not start) or `<skipped>` (cancelled, or not
//! ended), and its last attempt's output in `<system-out>` and `<system-err>`.
//!
//! Retries follow Maven Surefire's convention, which Jenkins' JUnit plugin reads: a job that
//! succeeded after failed attempts (flaky) has a `<flakyFailure>` (or `<flakyError>` for a
//! lost attempt) per failed attempt and no `<failure>`, so it counts as passed; a job that
//! failed every attempt has its last in `<failure>` and each earlier one in `<rerunFailure>`
//! (or `<rerunError>`). Only the attempts since the job's last operator retry count.
//!
//! Written by hand, without CDATA: every string goes through [`text`] or [`attr`], which
//! escape what XML requires and replace what XML 1.0 cannot hold, so a job may print any
//! bytes.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use anyhow::Context;
use leasehold::{ErrorKind, EventKind, JobRecord, Output, Status, Store};

use super::render;

/// The most bytes of a stream in a test case: the newest (a runner keeps 64 KiB of each
/// stream of an attempt by default, so this is all of it unless an embedder's
/// `RunnerBuilder::output_tail` keeps more).
pub const MAX_STREAM: usize = 64 * 1024;
/// The lines of stderr a failure's body ends with.
pub const FAILURE_LINES: usize = 20;
/// The most bytes of those lines (a line may be long).
const MAX_FAILURE_TAIL: usize = 8 * 1024;

/// One job as a test case.
#[derive(Debug)]
pub struct Case {
    id: i64,
    classname: String,
    name: String,
    time_ms: i64,
    started_at: Option<i64>,
    verdict: Verdict,
    /// The attempts before the last that did not succeed, oldest first.
    earlier: Vec<Earlier>,
    /// The last attempt's output.
    output: Option<Output>,
}

/// How a job's test case reads.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Passed,
    /// The command failed: its exit, a signal, a timeout or an idle timeout.
    Failure(Fault),
    /// The job failed without a verdict of its command: lost, or it could not start.
    Error(Fault),
    /// Cancelled, or not ended: the message says which.
    Skipped(String),
}

#[derive(Debug, PartialEq, Eq)]
struct Fault {
    kind: &'static str,
    message: String,
    body: String,
}

/// An attempt before the last that failed (or was lost and requeued).
#[derive(Debug)]
struct Earlier {
    lost: bool,
    kind: &'static str,
    message: String,
    stderr: String,
}

/// The counts of a report, as its `<testsuite>` says them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    /// Test cases: jobs.
    pub tests: usize,
    /// Jobs whose command failed.
    pub failures: usize,
    /// Jobs lost, or that could not start.
    pub errors: usize,
    /// Jobs cancelled, or not ended.
    pub skipped: usize,
    /// Passed after failed attempts.
    pub flaky: usize,
}

impl std::fmt::Display for Totals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} test{}, {} failed, {} errors, {} skipped, {} flaky",
            self.tests,
            if self.tests == 1 { "" } else { "s" },
            self.failures,
            self.errors,
            self.skipped,
            self.flaky
        )
    }
}

impl Case {
    /// The test case of `job`: its verdict, its earlier attempts and their stderr (from its
    /// events and the output tails the database kept).
    ///
    /// # Errors
    ///
    /// The database's, when it cannot be read.
    pub fn of(store: &Store, job: JobRecord) -> leasehold::Result<Case> {
        let output = store.output(job.id, None)?;
        let mut earlier = Vec::new();
        for e in store.events(job.id)? {
            let detail = e.detail.unwrap_or_default();
            match e.kind {
                // An operator's retry starts the job's attempts again.
                EventKind::ManualRetry => earlier.clear(),
                EventKind::RetryScheduled | EventKind::Reclaimed => {
                    let lost = e.kind == EventKind::Reclaimed;
                    let stderr = store
                        .output(job.id, Some(e.attempt))?
                        .map(|o| last_lines(&o.stderr))
                        .unwrap_or_default();
                    earlier.push(Earlier {
                        lost,
                        kind: if lost { "lost" } else { kind_of(&detail) },
                        message: format!("attempt {}: {detail}", e.attempt),
                        stderr,
                    });
                }
                _ => {}
            }
        }
        let verdict = verdict(&job, output.as_ref());
        let time_ms = match (job.started_at, job.completed_at) {
            (Some(start), Some(end)) => (end - start).max(0),
            _ => 0,
        };
        Ok(Case {
            id: job.id,
            classname: job.queue.clone(),
            name: job
                .name
                .clone()
                .unwrap_or_else(|| render::command_line(&job.argv)),
            time_ms,
            started_at: job.started_at,
            verdict,
            earlier,
            output,
        })
    }

    /// Whether the job failed (a `<failure>` or an `<error>`).
    pub fn failed(&self) -> bool {
        matches!(self.verdict, Verdict::Failure(_) | Verdict::Error(_))
    }

    /// The job's id.
    pub fn id(&self) -> i64 {
        self.id
    }
}

/// What the last attempt of `job` makes its test case.
fn verdict(job: &JobRecord, output: Option<&Output>) -> Verdict {
    match job.status {
        Status::Succeeded => Verdict::Passed,
        Status::Failed => {
            let kind = job.error_kind;
            let message = job
                .last_error
                .clone()
                .unwrap_or_else(|| "failed".to_string());
            let mut body = format!(
                "{message}\njob {}, attempt {} of {}\nerror kind: {}\n",
                job.id,
                job.attempt,
                job.max_attempts,
                kind.map_or("unknown", ErrorKind::as_str)
            );
            if let Some(code) = job.exit_code {
                let _ = writeln!(body, "exit code: {code}");
            }
            if let Some(signal) = job.signal {
                let _ = writeln!(body, "signal: {signal}");
            }
            let stderr = output.map(|o| last_lines(&o.stderr)).unwrap_or_default();
            if stderr.is_empty() {
                body.push_str("stderr: nothing kept\n");
            } else {
                let _ = write!(body, "stderr, its last lines:\n{stderr}");
            }
            let fault = Fault {
                kind: kind.map_or("failed", ErrorKind::as_str),
                message,
                body,
            };
            match kind {
                Some(ErrorKind::Lost | ErrorKind::Spawn) => Verdict::Error(fault),
                _ => Verdict::Failure(fault),
            }
        }
        Status::Cancelled => Verdict::Skipped(match &job.last_error {
            Some(why) => format!("cancelled: {why}"),
            None => "cancelled".to_string(),
        }),
        status => Verdict::Skipped(format!("not ended: {status}")),
    }
}

/// The kind of a failed attempt's ending, from the words its runner recorded (an attempt
/// before the last has no columns of its own).
fn kind_of(detail: &str) -> &'static str {
    let kinds = [
        ("exited with code", ErrorKind::Exit),
        ("killed by signal", ErrorKind::Signal),
        ("timed out after", ErrorKind::Timeout),
        ("idle timeout", ErrorKind::IdleTimeout),
    ];
    kinds
        .iter()
        .find(|(prefix, _)| detail.starts_with(prefix))
        .map_or("failed", |(_, kind)| kind.as_str())
}

/// The last [`FAILURE_LINES`] lines of `bytes`, at most [`MAX_FAILURE_TAIL`] bytes of them,
/// each ending with a newline.
fn last_lines(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(&bytes[bytes.len().saturating_sub(MAX_FAILURE_TAIL)..]);
    let lines: Vec<&str> = text.lines().collect();
    let mut out = String::new();
    for line in &lines[lines.len().saturating_sub(FAILURE_LINES)..] {
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The counts of `cases`.
pub fn totals(cases: &[Case]) -> Totals {
    let mut t = Totals {
        tests: cases.len(),
        ..Totals::default()
    };
    for c in cases {
        match &c.verdict {
            Verdict::Passed if !c.earlier.is_empty() => t.flaky += 1,
            Verdict::Passed => {}
            Verdict::Failure(_) => t.failures += 1,
            Verdict::Error(_) => t.errors += 1,
            Verdict::Skipped(_) => t.skipped += 1,
        }
    }
    t
}

/// The report of `cases`; `timestamp` (ms since the epoch, UTC) is when they started (by
/// default, the earliest start among them).
pub fn render(cases: &[Case], timestamp: Option<i64>) -> String {
    let t = totals(cases);
    let time = seconds(cases.iter().map(|c| c.time_ms).sum());
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        out,
        "<testsuites name=\"leasehold\" tests=\"{}\" failures=\"{}\" errors=\"{}\" time=\"{time}\">",
        t.tests, t.failures, t.errors
    );
    let _ = write!(
        out,
        "  <testsuite name=\"leasehold\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\" time=\"{time}\"",
        t.tests, t.failures, t.errors, t.skipped
    );
    let timestamp = timestamp.or_else(|| cases.iter().filter_map(|c| c.started_at).min());
    if let Some(at) = timestamp.and_then(chrono::DateTime::from_timestamp_millis) {
        // ISO 8601 without a zone, as Ant's schema has it; UTC (Jenkins reads it so).
        let _ = write!(out, " timestamp=\"{}\"", at.format("%Y-%m-%dT%H:%M:%S"));
    }
    out.push_str(">\n");
    for c in cases {
        case(&mut out, c);
    }
    out.push_str("  </testsuite>\n</testsuites>\n");
    out
}

fn case(out: &mut String, c: &Case) {
    out.push_str("    <testcase classname=\"");
    attr(out, &c.classname);
    out.push_str("\" name=\"");
    attr(out, &c.name);
    let _ = writeln!(out, "\" time=\"{}\">", seconds(c.time_ms));
    let (element, fault) = match &c.verdict {
        Verdict::Passed => (None, None),
        Verdict::Failure(f) => (Some("failure"), Some(f)),
        Verdict::Error(f) => (Some("error"), Some(f)),
        Verdict::Skipped(why) => {
            out.push_str("      <skipped message=\"");
            attr(out, why);
            out.push_str("\"/>\n");
            (None, None)
        }
    };
    if let (Some(element), Some(f)) = (element, fault) {
        let _ = write!(out, "      <{element} type=\"{}\" message=\"", f.kind);
        attr(out, &f.message);
        out.push_str("\">");
        text(out, &f.body);
        let _ = writeln!(out, "</{element}>");
    }
    // Earlier attempts: flaky when the job then passed, reruns when it failed.
    let prefix = match c.verdict {
        Verdict::Passed => Some("flaky"),
        Verdict::Failure(_) | Verdict::Error(_) => Some("rerun"),
        Verdict::Skipped(_) => None,
    };
    for e in c.earlier.iter().filter(|_| prefix.is_some()) {
        let element = format!(
            "{}{}",
            prefix.unwrap_or_default(),
            if e.lost { "Error" } else { "Failure" }
        );
        let _ = write!(out, "      <{element} type=\"{}\" message=\"", e.kind);
        attr(out, &e.message);
        out.push_str("\">");
        if !e.stderr.is_empty() {
            out.push_str("<stackTrace>");
            text(out, &e.stderr);
            out.push_str("</stackTrace>");
        }
        let _ = writeln!(out, "</{element}>");
    }
    if let Some(o) = &c.output {
        for (element, bytes, truncated) in [
            ("system-out", &o.stdout, o.stdout_truncated),
            ("system-err", &o.stderr, o.stderr_truncated),
        ] {
            if bytes.is_empty() {
                continue;
            }
            let _ = write!(out, "      <{element}>");
            stream(out, bytes, truncated);
            let _ = writeln!(out, "</{element}>");
        }
    }
    out.push_str("    </testcase>\n");
}

/// A stream's newest [`MAX_STREAM`] bytes, after a line that says so when earlier bytes are
/// not shown (cut here, or not kept by the runner: `truncated`).
fn stream(out: &mut String, bytes: &[u8], truncated: bool) {
    let cut = bytes.len().saturating_sub(MAX_STREAM);
    let shown = &bytes[cut..];
    if cut > 0 || truncated {
        let _ = writeln!(
            out,
            "[leasehold: earlier output not shown; its last {} bytes follow]",
            shown.len()
        );
    }
    text(out, &String::from_utf8_lossy(shown));
}

/// Milliseconds as seconds with three decimals (`12.345`), as JUnit's `time` has them.
fn seconds(ms: i64) -> String {
    let ms = ms.max(0);
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

/// Appends `s` as character data: `&`, `<` and `>` escaped (so `]]>` cannot appear), a
/// carriage return as a reference (else a parser turns it into a line feed), and each
/// character XML 1.0 cannot hold replaced: a control character by its caret form (`^@` for
/// NUL, as Jenkins shows it; `^[` for ESC), U+FFFE and U+FFFF by U+FFFD.
pub fn text(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\r' => out.push_str("&#13;"),
            c => legal(out, c),
        }
    }
}

/// Appends `s` as an attribute's value in double quotes: as [`text`], and `"` escaped, tabs
/// and line feeds as references (else a parser turns them into spaces).
pub fn attr(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\r' => out.push_str("&#13;"),
            '\n' => out.push_str("&#10;"),
            '\t' => out.push_str("&#9;"),
            c => legal(out, c),
        }
    }
}

/// `c` if XML 1.0 can hold it, else its stand-in.
fn legal(out: &mut String, c: char) {
    match c {
        '\t' | '\n' => out.push(c),
        // The C0 controls: `^@` to `^_`.
        c if (c as u32) < 0x20 => {
            out.push('^');
            out.push(char::from(c as u8 + 0x40));
        }
        '\u{FFFE}' | '\u{FFFF}' => out.push('\u{FFFD}'),
        c => out.push(c),
    }
}

/// Creates (or empties) the report's file, to be written by [`write`]: a command given a
/// path it cannot write says so before it does anything else.
///
/// # Errors
///
/// When the file cannot be created, naming it.
pub fn create(path: &Path) -> anyhow::Result<std::fs::File> {
    std::fs::File::create(path)
        .with_context(|| format!("cannot write the JUnit report {}", path.display()))
}

/// Writes `xml` into `file`, the report's file at `path`.
///
/// # Errors
///
/// When it cannot be written, naming the file.
pub fn write(mut file: std::fs::File, path: &Path, xml: &str) -> anyhow::Result<()> {
    file.write_all(xml.as_bytes())
        .and_then(|()| file.flush())
        .with_context(|| format!("cannot write the JUnit report {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::{attr, kind_of, last_lines, seconds, text};

    #[test]
    fn text_holds_any_characters_as_xml_1_0_can() {
        let mut out = String::new();
        text(
            &mut out,
            "a\0b\x07c\x1b[31m\td\r\n]]> <&> \u{FFFE}\u{FFFF}é",
        );
        assert_eq!(
            out,
            "a^@b^Gc^[[31m\td&#13;\n]]&gt; &lt;&amp;&gt; \u{FFFD}\u{FFFD}é"
        );
        let mut out = String::new();
        attr(&mut out, "say \"hi\"\n\tto\r<all>");
        assert_eq!(out, "say &quot;hi&quot;&#10;&#9;to&#13;&lt;all&gt;");
    }

    #[test]
    fn times_are_seconds_with_three_decimals() {
        assert_eq!(seconds(0), "0.000");
        assert_eq!(seconds(1234), "1.234");
        assert_eq!(seconds(60_005), "60.005");
        assert_eq!(seconds(-5), "0.000");
    }

    #[test]
    fn an_earlier_attempts_kind_comes_from_its_runners_words() {
        assert_eq!(kind_of("exited with code 1; retry in 1.0s"), "exit");
        assert_eq!(kind_of("killed by signal SIGKILL; retry"), "signal");
        assert_eq!(kind_of("timed out after 5s; retry"), "timeout");
        assert_eq!(kind_of("idle timeout: no output for 5s"), "idle_timeout");
        assert_eq!(kind_of("something else"), "failed");
    }

    #[test]
    fn a_failure_shows_the_last_lines_of_stderr() {
        let many: String = (1..=30).map(|i| format!("line {i}\n")).collect();
        let tail = last_lines(many.as_bytes());
        assert!(tail.starts_with("line 11\n"), "{tail}");
        assert!(tail.ends_with("line 30\n"), "{tail}");
        assert_eq!(last_lines(b""), "");
    }
}
