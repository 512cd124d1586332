//! The dashboard's pages: server-rendered HTML with a little CSS and no script. maud escapes
//! every value it interpolates, so whatever a job contributes (argv, env, output, errors) is
//! shown as text.

use leasehold::{Event, EventKind, JobRecord, Output, ScheduleRecord, Status, operator};
use maud::{DOCTYPE, Markup, html};

use super::chart::{self, Chart, Scale};
use super::times::Times;
use super::{ListQuery, Overview};
use crate::cli::render;

/// The stylesheet every page links, served at `/style.css` (the CSP allows styles from the
/// dashboard itself only, no inline ones).
pub const CSS: &str = "
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#243447;color:#fff;padding:.5em 1em;display:flex;gap:1.5em;align-items:baseline}
header a{color:#fff;text-decoration:none}header b{font-size:1.1em}
.mode{margin-left:auto;font-size:.85em;opacity:.8}
header form.times{font-size:.85em}header form.times input{width:10em}header form.times a{text-decoration:underline}
header{flex-wrap:wrap}
main{padding:0 1em 2em;max-width:80em}
h2{font-size:1.05em;margin:1.4em 0 .4em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;background:#fff}
th,td{border:1px solid #ddd;padding:.2em .6em;text-align:left;vertical-align:top}
th{background:#f0f0f0}td.n{text-align:right;font-variant-numeric:tabular-nums}td.t{white-space:nowrap}
code,pre{font-family:ui-monospace,monospace;font-size:.92em}
pre{background:#fff;border:1px solid #ddd;padding:.5em;overflow:auto;max-height:30em;white-space:pre-wrap}
.pending{color:#8a6d00}.running{color:#0b5cad}.succeeded{color:#1b7a1b}
.failed{color:#b00020}.cancelled{color:#666}
.later{color:#777;font-style:italic}.bad{color:#b00020;font-weight:bold}
form.inline{display:inline}nav.pages{margin:.6em 0}nav.pages a{margin-right:1em}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(100%,34em),1fr));gap:1em}
figure.chart{margin:0;background:#fff;border:1px solid #ddd;padding:.4em;min-width:0}
figure.chart figcaption{font-size:.85em;color:#555}
svg.chart{width:100%;height:auto;display:block;color:#222}
svg.chart text{font-size:13px;fill:currentColor}svg.chart .axis{stroke:#888}
svg.chart text.axis{stroke:none;fill:#555}svg.chart .grid{stroke:#e4e4e4}
svg.chart polyline{fill:none;stroke-width:2}
.s-succeeded{fill:#2e7d32}.s-failed{fill:#c62828}.s-retried{fill:#ef8f00}.s-lost{fill:#6a1b9a}
.s-cancelled{fill:#9e9e9e}.s-p50,.s-running{fill:#1565c0;stroke:#1565c0}
.s-p95,.s-ready{fill:#ef8f00;stroke:#ef8f00}
details table{margin-top:.3em}summary{cursor:pointer;font-size:.9em}
table{display:block;max-width:100%;width:max-content;overflow-x:auto}
@media (max-width:40em){svg.chart text{font-size:16px}svg.chart text.odd{display:none}}
@media (prefers-color-scheme:dark){
body{color:#ddd;background:#15191e}a{color:#8ab4f8}header{background:#0d2136}
table,pre,figure.chart{background:#1e242b}th{background:#262d35}
th,td,pre,figure.chart,h2{border-color:#3a434d}
figure.chart figcaption,.later,svg.chart text.axis{color:#aaa;fill:#aaa}
svg.chart{color:#ddd}svg.chart .grid{stroke:#333b44}
.pending{color:#e0b84a}.running{color:#6cb0ff}.succeeded{color:#6fcf6f}
.failed,.bad{color:#ff7b7b}.cancelled{color:#aaa}
}
";

/// What every page needs of the request besides its data.
pub struct View<'a> {
    /// The zone the viewer chose for times.
    pub times: Times,
    /// This machine's zone, offered beside UTC.
    pub system_zone: Option<&'a str>,
    /// The request's target, where choosing a zone comes back to.
    pub back: &'a str,
    /// When the page is made, in milliseconds since the epoch: relative ages count from it.
    pub now: i64,
}

impl View<'_> {
    /// A time in the viewer's zone with its age beside it: `… (3.2 s ago)`, `… (in 4.0 s)`.
    fn stamp(&self, ms: i64) -> String {
        format!("{} ({})", self.times.at(ms), relative(self.now - ms))
    }

    /// An optional time as [`View::stamp`] writes it, or `-`.
    fn opt_stamp(&self, ms: Option<i64>) -> String {
        ms.map_or_else(|| "-".to_string(), |ms| self.stamp(ms))
    }
}

/// An age, `3.2 s ago`, or for a time still to come, `in 3.2 s`.
fn relative(ago_ms: i64) -> String {
    if ago_ms >= 0 {
        format!("{} ago", age(ago_ms))
    } else {
        format!("in {}", age(-ago_ms))
    }
}

/// The page around `body`. `refresh` reloads it every few seconds (a meta tag: no script).
/// With a `view`, the header offers the zone times are shown in: UTC, this machine's, or one
/// the viewer types (a GET form, no script).
fn layout(title: &str, refresh: bool, actions: bool, view: Option<&View>, body: Markup) -> String {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                @if refresh { meta http-equiv="refresh" content="5"; }
                title { (title) " · leasehold" }
                link rel="stylesheet" href="/style.css";
            }
            body {
                header {
                    b { "leasehold" }
                    a href="/" { "Overview" }
                    a href="/jobs" { "Jobs" }
                    span.mode { @if actions { "actions allowed" } @else { "read-only" } }
                    @if let Some(v) = view {
                        form.times action="/times" method="get" {
                            "Times in "
                            input type="hidden" name="back" value=(v.back);
                            input type="text" name="zone" value=(v.times.name()) size="16" aria-label="time zone";
                            button type="submit" { "Show" }
                            " "
                            a href={ "/times?zone=UTC&back=" (super::http::percent_encode(v.back)) } { "UTC" }
                            @if let Some(z) = v.system_zone {
                                " · "
                                a href={ "/times?zone=" (super::http::percent_encode(z)) "&back=" (super::http::percent_encode(v.back)) } { "this machine's (" (z) ")" }
                            }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
    .into_string()
}

pub fn error(status: u16, reason: &str, message: &str) -> String {
    layout(
        &format!("{status} {reason}"),
        false,
        false,
        None,
        html! {
            h1 { (status) " " (reason) }
            p #message { (message) }
            p { a href="/" { "Back to the overview" } }
        },
    )
}

fn status_link(status: Status, n: u64) -> Markup {
    html! { a class=(status.as_str()) href={ "/jobs?status=" (status.as_str()) } { (n) } }
}

pub fn overview(o: &Overview, actions: bool, view: &View) -> String {
    let t = &view.times;
    let c = &o.counts;
    let statuses = [
        (Status::Pending, c.pending),
        (Status::Running, c.running),
        (Status::Succeeded, c.succeeded),
        (Status::Failed, c.failed),
        (Status::Cancelled, c.cancelled),
    ];
    let total: u64 = statuses.iter().map(|(_, n)| n).sum();
    let l = &o.leases;
    let body = html! {
        h1 { "Overview" }
        p.later { "Refreshes every 5 seconds. " (o.size.path.display()) }

        h2 #jobs { "Jobs by status" }
        table #status-counts {
            tr { @for (s, _) in &statuses { th { (s.as_str()) } } th { "total" } }
            tr {
                @for (s, n) in &statuses { td.n data-status=(s.as_str()) { (status_link(*s, *n)) } }
                td.n #total { a href="/jobs" { (total) } }
            }
        }

        @if !o.waiting_for_conditions.is_empty() || !o.condition_notes.is_empty() {
            h2 #conditions { "Conditions" }
            @for (c, n) in &o.waiting_for_conditions {
                p.bad data-condition=(c.as_str()) {
                    (n) " pending job" @if *n != 1 { "s" } " waiting for " (c.as_str())
                    ": no running runner sees it hold."
                }
            }
            @for note in &o.condition_notes { p.later { (note) } }
        }

        h2 #activity { "Activity" }
        (charts(o, t))

        h2 #queues { "Queues" }
        @if o.queues.is_empty() {
            p { "No queue has a job, a limit or a pause." }
        } @else {
            table #queue-counts {
                tr {
                    th { "queue" } th { "pending" } th { "waiting" } th { "running" }
                    th { "succeeded" } th { "failed" } th { "cancelled" }
                    th { "limit" } th { "paused" } th { "oldest ready" } th { "all its jobs" }
                }
                @for q in &o.queues {
                    @let queue = super::http::percent_encode(&q.name);
                    @let link = |s: Status, n: u64| html! {
                        td.n data-queue=(q.name) data-queue-status=(s.as_str()) {
                            a class=(s.as_str()) href={ "/jobs?queue=" (queue) "&status=" (s.as_str()) } { (n) }
                        }
                    };
                    tr {
                        td { (q.name) }
                        (link(Status::Pending, q.pending))
                        td.n data-queue=(q.name) data-queue-status="waiting" { (q.waiting) }
                        (link(Status::Running, q.running))
                        (link(Status::Succeeded, q.succeeded))
                        (link(Status::Failed, q.failed))
                        (link(Status::Cancelled, q.cancelled))
                        td.n data-queue=(q.name) data-queue-field="limit" { (q.limit.map_or_else(|| "-".to_string(), |l| l.to_string())) }
                        td data-queue=(q.name) data-queue-field="paused" class=[q.paused.then_some("bad")] { (if q.paused { "yes" } else { "no" }) }
                        td.n data-queue=(q.name) data-queue-field="oldest-ready" { (q.oldest_ready_ms.map_or_else(|| "-".to_string(), age)) }
                        td { a href={ "/jobs?queue=" (queue) } { "list" } }
                    }
                }
            }
            p.later {
                "Every queue with a job in the file, a limit or a pause; the counts are the counters the transitions keep. "
                "Waiting: pending jobs whose dependencies have not all succeeded (counted in pending). "
                "Limit: at most this many of its jobs run at once over every runner. "
                "Oldest ready: how long its oldest due, unblocked job has waited. "
                "Finished jobs leave the counts when they are pruned."
            }
        }

        h2 #failures { "Recent failures" }
        @if o.failures.is_empty() {
            p #no-failures { "No failed or lost attempt is in the file." }
        } @else {
            table #failure-list {
                tr {
                    th { "job" } th { "attempt" } th { "queue" } th { "what" } th { "error_kind" }
                    th { "when" } th { "stderr (last line)" } th { "command" }
                }
                @for f in &o.failures {
                    tr.failure data-job=(f.job_id) {
                        td.n { a href={ "/jobs/" (f.job_id) } { (f.job_id) } }
                        td.n { (f.attempt) }
                        td { a href={ "/jobs?queue=" (super::http::percent_encode(&f.queue)) } { (f.queue) } }
                        td class=(if matches!(f.kind, EventKind::Failed | EventKind::Lost) { "failed" } else { "pending" }) title=[f.detail.as_deref()] { (f.kind.to_string()) }
                        td.kind { (f.error_kind.map_or("-", |k| k.as_str())) }
                        td.t { (t.at(f.at)) br; span.later { (age(o.now - f.at)) " ago" } }
                        td { @if let Some(l) = &f.stderr_last_line { code { (render::cut(l, 120)) } } @else { "-" } }
                        td { code { (render::cut(&render::command_line(&f.argv), 80)) } }
                    }
                }
            }
            p.later {
                "The newest " (o.failures.len()) " failed or lost attempts, newest first. "
                "failed and lost ended the job; retry_scheduled and reclaimed sent it back to pending. "
                "error_kind is the job's, so it is shown only for the job's latest attempt."
            }
        }

        h2 #job-leases { "Lease counters (job_leases)" }
        table #lease-counters {
            tr { th { "running" } td.n { (l.running) } }
            tr { th { "stale_running" } td.n class=[(l.stale_running > 0).then_some("bad")] { (l.stale_running) } }
            tr { th { "running_without_lease" } td.n class=[(l.running_without_lease > 0).then_some("bad")] { (l.running_without_lease) } }
            tr { th { "recovery_exhausted_failed" } td.n class=[(l.recovery_exhausted_failed > 0).then_some("bad")] { (l.recovery_exhausted_failed) } }
            tr { th { "lease_ttl_seconds" } td.n { (o.settings.lease_ttl.as_secs_f64()) } }
            tr { th { "heartbeat_interval_seconds" } td.n { (o.settings.heartbeat_interval.as_secs_f64()) } }
            tr { th { "max_recovery_attempts" } td.n { (o.settings.max_recovery_attempts) } }
        }
        p.later {
            @if o.settings.from_runner { "Settings of the runner that started last." }
            @else { "No runner has run on this file: the settings are the defaults." }
            " Normal: stale_running = 0 and running_without_lease = 0."
        }

        h2 #runners { "Runners by host" }
        @if o.hosts.is_empty() {
            p { "No runner is registered (none has run, or all stopped)." }
        } @else {
            table #runner-list {
                tr {
                    th { "host" } th { "worker id" } th { "pid" } th { "PID namespace" } th { "alive" }
                    th { "running jobs" } th { "started" } th { "heartbeat" }
                }
                @for h in &o.hosts {
                    tr.host data-host=(h.name) {
                        th colspan="5" {
                            (h.name) @if h.this_host { " (this host)" }
                            @if !h.lost.is_empty() {
                                span.bad { " · " (h.lost.len()) " lost attempt" (if h.lost.len() == 1 { "" } else { "s" }) " waiting for a teardown there" }
                            }
                        }
                        td.n data-host-field="running" { (h.leases.len()) }
                        td {}
                        td.t data-host-field="heartbeat" {
                            @if let Some(at) = h.heartbeat_at() { (t.at(at)) br; span.later { (age(o.now - at)) " ago" } } @else { "-" }
                        }
                    }
                    @for r in &h.runners {
                        @let rec = &r.record;
                        tr.runner data-host=(h.name) data-worker=(rec.worker_id) {
                            td {}
                            td { code { (rec.worker_id) } }
                            td.n { (rec.pid) }
                            td.n { (rec.pid_ns.map_or_else(|| "-".to_string(), |n| n.to_string())) }
                            @match &r.liveness {
                                operator::Liveness::Alive => td.succeeded { "yes" },
                                operator::Liveness::Dead(why) => td.failed title=(why) { "no: " (why) },
                                other => td.pending { (other.to_string()) },
                            }
                            td.n { (r.running) }
                            td.t { (t.at(rec.started_at)) br; span.later { (age(o.now - rec.started_at)) " ago" } }
                            td.t { (t.at(rec.heartbeat_at)) br; span.later { (age(o.now - rec.heartbeat_at)) " ago" } }
                        }
                    }
                }
            }
            p.later {
                "Alive as judged from this process: a runner's pid is checked only in this host's boot and PID namespace; "
                "on another host nothing can be checked from here, and only its leases' expiry counts. "
                "A host gone for good: " code { "leasehold hosts gone HOST --yes" } "."
            }
        }

        h2 #database { "Database" }
        table #database-size {
            tr { th { "path" } td { code { (o.size.path.display()) } } }
            tr { th { "schema_version" } td.n { (o.size.schema_version) } }
            tr { th { "bytes" } td.n { (o.size.bytes) " (" (human(o.size.bytes)) ")" } }
            tr { th { "free_bytes" } td.n { (o.size.free_bytes) " (" (human(o.size.free_bytes)) ")" } }
            tr { th { "wal_bytes" } td.n { (o.size.wal_bytes) " (" (human(o.size.wal_bytes)) ")" } }
        }

        h2 #schedules { "Schedules" }
        @if o.schedules.is_empty() {
            p { "No schedule is stored (" code { "leasehold schedules add" } " adds one)." }
        } @else {
            table #schedule-list {
                tr {
                    th { "name" } th { "expression" } th { "zone" } th { "paused" }
                    th { "last slot" } th { "next slot" } th { "command" }
                }
                @for r in &o.schedules {
                    tr data-schedule=(r.name) {
                        td.name { (r.name) }
                        td.expression { code { (r.expression()) } }
                        td.zone { (r.schedule.zone_name()) }
                        td.paused class=[r.paused.then_some("bad")] { (if r.paused { "yes" } else { "no" }) }
                        td.t.last { (slot(t, r, r.last_slot_at)) }
                        td.t.next { (slot(t, r, r.next_slot_at)) }
                        td { code { (render::cut(&render::command_line(r.schedule.job_template().argv()), 80)) } }
                    }
                }
            }
            p.later { "Slots in " (t.name()) ", and below in the schedule's zone where it differs." }
        }

        h2 #dependencies { "Dependencies" }
        @let waiting: u64 = o.queues.iter().map(|q| q.waiting).sum();
        p {
            "Pending jobs waiting for a dependency: "
            b #waiting-total { (waiting) }
            @if waiting > 0 { " (by queue in the Queues table; a job's page lists what it waits for)" }
        }
    };
    layout("Overview", true, actions, Some(view), body)
}

/// The charts of the runners' samples: jobs ended per interval over the newest 60 and per
/// 60 intervals over the newest 24 spans, wait and run quantiles, running and ready jobs.
fn charts(o: &Overview, times: &Times) -> Markup {
    let (fine, coarse) = chart::split(&o.samples);
    if fine.len() < 2 {
        return html! {
            p #no-samples {
                "No chart yet: a runner samples the counters as it starts and stops, and once "
                "a sample interval while it runs (a minute by default, "
                code { "leasehold run --sample-interval SECS" } "), and a chart needs two samples."
            }
        };
    }
    let f = chart::intervals(fine);
    let step = chart::interval_text(&f.spans);
    let c = chart::intervals(&coarse);
    let span = chart::interval_text(&c.spans);
    let newest = fine.last().map_or(o.now, |s| s.at);
    let oldest = fine.first().map_or(newest, |s| s.at);
    let ended = |id, title: &str, iv: &chart::Intervals, unit: &str| {
        chart::figure(
            &Chart {
                id,
                title,
                y_label: &format!("jobs per {unit}"),
                scale: Scale::Linear,
                stacked: true,
                spans: &iv.spans,
                series: &iv.ended,
                times,
            },
            "Jobs that reached an end in each interval, by outcome; retried: failed attempts sent back to pending.",
        )
    };
    let buckets = "Quantiles of the attempts that ended in each interval, read from the \
                   histograms' buckets (5, 10, 25, 50, 100, 250, 500 ms, 1, 2.5, 5, 10, 30 s, \
                   1, 5, 15 min, 1, 6 h, 1 d): each point is the upper bound of its bucket.";
    html! {
        p.later {
            "From " (fine.len()) " samples over " (age(newest - oldest)) ", one every " (step)
            " at the median (runners sample once an interval, and as they start and stop); the newest is "
            (age(o.now - newest)) " old. "
            "Times in " (times.name()) "."
        }
        div.charts {
            (ended("ended-fine", &format!("Jobs ended per {step}, by outcome"), &f, &step))
            @if c.spans.is_empty() {
                p #no-coarse { "The chart of jobs ended per 60 intervals (an hour at the default minute) needs two samples that far apart." }
            } @else {
                (ended("ended-coarse", &format!("Jobs ended per {span}, by outcome"), &c, &span))
            }
            (chart::figure(&Chart {
                id: "wait-fine", title: &format!("Wait (scheduled to started), median and p95 per {step}"),
                y_label: "wait (log scale)", scale: Scale::LogMs, stacked: false,
                spans: &f.spans, series: &f.wait, times,
            }, buckets))
            (chart::figure(&Chart {
                id: "run-fine", title: &format!("Run time, median and p95 per {step}"),
                y_label: "run time (log scale)", scale: Scale::LogMs, stacked: false,
                spans: &f.spans, series: &f.run, times,
            }, buckets))
            (chart::figure(&Chart {
                id: "gauges-fine", title: "Running and ready jobs",
                y_label: "jobs", scale: Scale::Linear, stacked: false,
                spans: &f.spans, series: &f.gauges, times,
            }, "At each sample: jobs running, and pending jobs ready to claim (due, not waiting for a dependency)."))
        }
    }
}

pub fn jobs(q: &ListQuery, rows: &[JobRecord], more: bool, actions: bool, view: &View) -> String {
    let t = &view.times;
    let body = html! {
        h1 { "Jobs" }
        form method="get" action="/jobs" {
            label { "status " select name="status" {
                option value="" selected[q.status.is_none()] { "any" }
                @for s in [Status::Pending, Status::Running, Status::Succeeded, Status::Failed, Status::Cancelled] {
                    option value=(s.as_str()) selected[q.status == Some(s)] { (s.as_str()) }
                }
            } }
            " "
            label { "queue " input type="text" name="queue" value=[q.queue.as_deref()] size="16"; }
            " "
            button type="submit" { "Filter" }
        }
        p.later {
            "Newest first, " (super::PAGE_SIZE) " a page."
            @if let Some(id) = q.before { " Jobs below id " (id) "." }
        }
        @if rows.is_empty() {
            p #empty { "No jobs match." }
        } @else {
            table #job-list {
                tr { th { "id" } th { "status" } th { "queue" } th { "pri" } th { "attempt" } th { "recovery" } th { "result" } th { "created" } th { "command" } }
                @for j in rows {
                    tr {
                        td.n { a href={ "/jobs/" (j.id) } { (j.id) } }
                        td class=(j.status.as_str()) { (j.status.as_str()) }
                        td { (j.queue) }
                        td.n { (j.priority) }
                        td.n { (j.attempt) "/" (j.max_attempts) }
                        td.n { (j.recovery_count) }
                        td { (render::result(j)) }
                        td.t { (t.at(j.created_at)) br; span.later { (relative(view.now - j.created_at)) } }
                        td {
                            @if let Some(name) = &j.name { span.name { (name) } " " }
                            code { (render::cut(&render::command_line(&j.argv), 80)) }
                        }
                    }
                }
            }
        }
        nav.pages {
            @if q.before.is_some() { a rel="first" href=(q.link(None)) { "← newest" } }
            @if let (true, Some(last)) = (more, rows.last()) {
                a rel="next" href=(q.link(Some(last.id))) { "older →" }
            }
        }
    };
    layout("Jobs", false, actions, Some(view), body)
}

/// The newest bytes of a running attempt's output files.
pub struct Live {
    /// The attempt.
    pub attempt: i64,
    /// The end of its stdout file, and whether bytes before it are not shown.
    pub stdout: (Vec<u8>, bool),
    /// The end of its stderr file, likewise.
    pub stderr: (Vec<u8>, bool),
}

#[expect(
    clippy::too_many_arguments,
    reason = "one page's parts, each from its own read"
)]
pub fn job(
    j: &JobRecord,
    events: &[Event],
    output: Option<&Output>,
    live: Option<&Live>,
    teardown_waits: Option<&str>,
    kept: Option<&str>,
    conditions: &[leasehold::Condition],
    token: Option<&str>,
    show_env: bool,
    view: &View,
) -> String {
    let t = &view.times;
    let running = j.status == Status::Running;
    let opt = |v: Option<i64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
    let secs =
        |v: Option<i64>| v.map_or_else(|| "-".to_string(), |ms| format!("{}s", ms as f64 / 1000.0));
    let fields: Vec<(&str, String)> = vec![
        ("queue", j.queue.clone()),
        ("cwd", j.cwd.clone().unwrap_or_else(|| "-".into())),
        ("priority", j.priority.to_string()),
        ("attempt", format!("{} of {}", j.attempt, j.max_attempts)),
        ("failed_attempts", j.failed_attempts.to_string()),
        ("recovery_count", j.recovery_count.to_string()),
        ("on_lost", j.on_lost.as_str().into()),
        ("when", render::condition_names(&j.conditions)),
        ("when_lost", j.when_lost.as_str().into()),
        ("timeout", secs(j.timeout_ms)),
        ("idle_timeout", secs(j.idle_timeout_ms)),
        ("result", render::result(j)),
        ("exit_code", opt(j.exit_code)),
        ("signal", opt(j.signal)),
        (
            "error_kind",
            j.error_kind.map_or("-".into(), |k| k.as_str().into()),
        ),
        ("last_error", j.last_error.clone().unwrap_or("-".into())),
        ("run_token", j.run_token.clone().unwrap_or("-".into())),
        ("worker_id", j.worker_id.clone().unwrap_or("-".into())),
        ("pid", opt(j.pid)),
        ("pgid", opt(j.pgid)),
        ("created_at", view.stamp(j.created_at)),
        ("scheduled_at", view.stamp(j.scheduled_at)),
        ("started_at", view.opt_stamp(j.started_at)),
        ("heartbeat_at", view.opt_stamp(j.heartbeat_at)),
        ("lease_expires_at", view.opt_stamp(j.lease_expires_at)),
        ("completed_at", view.opt_stamp(j.completed_at)),
        ("name", j.name.clone().unwrap_or("-".into())),
        ("unique_key", j.unique_key.clone().unwrap_or("-".into())),
        ("schedule", j.schedule.clone().unwrap_or("-".into())),
        ("slot_at", view.opt_stamp(j.slot_at)),
    ];
    let retryable = matches!(
        j.status,
        Status::Failed | Status::Cancelled | Status::Running
    );
    let cancellable = matches!(j.status, Status::Pending | Status::Running);
    let body = html! {
        h1 { "Job " (j.id) " " span class=(j.status.as_str()) #status { (j.status.as_str()) } }
        @if let Some(token) = token {
            p #actions {
                @if retryable {
                    form.inline method="post" action={ "/jobs/" (j.id) "/retry" } {
                        input type="hidden" name="csrf" value=(token);
                        button type="submit" { "Retry" }
                    }
                    " "
                }
                @if cancellable {
                    form.inline method="post" action={ "/jobs/" (j.id) "/cancel" } {
                        input type="hidden" name="csrf" value=(token);
                        button type="submit" { "Cancel" }
                    }
                }
            }
        }
        @if let Some(kept) = kept {
            p #kept { "Running, " (kept) "." }
        }
        @if !conditions.is_empty() {
            p.bad #waiting-for-conditions {
                "Waiting for " (render::condition_names(conditions))
                ": no running runner sees it hold, so no runner takes this job."
            }
        }
        @if j.teardown_pending {
            p.bad #teardown {
                "A lost attempt's processes are still to be torn down."
                @if let Some(why) = teardown_waits { " " (why) "." }
            }
        }
        h2 { "Command" }
        ol #argv { @for a in &j.argv { li { code { (a) } } } }
        p { code #command-line { (render::command_line(&j.argv)) } }
        @if !j.env.is_empty() {
            h2 { "Environment" }
            table #env {
                @for (k, v) in &j.env {
                    tr { th { code { (k) } } td { code { (render::env_value(v, show_env)) } } }
                }
            }
            @if !show_env { p.later { "Values hidden: " code { "leasehold serve --show-env" } " shows them." } }
        }
        h2 { "Fields" }
        table #fields { @for (k, v) in &fields { tr { th { (k) } td { (v) } } } }
        h2 #dependencies { "Dependencies" }
        @if j.after.is_empty() {
            p { "None: it runs without waiting for another job." }
        } @else {
            table #deps {
                tr { th { "after" } td #after { (job_links(&j.after)) } }
                tr {
                    th { "waiting_for" }
                    td #waiting-for {
                        @if j.waiting_for.is_empty() { "-" } @else { (job_links(&j.waiting_for)) }
                    }
                }
            }
            p.later { "It runs only after every job in after succeeded; waiting_for: those that have not (yet)." }
        }
        h2 { "Events" }
        table #events {
            tr { th { "at" } th { "attempt" } th { "kind" } th { "detail" } }
            @for e in events {
                tr.event {
                    td { (t.at(e.at)) br; span.later { (relative(view.now - e.at)) } }
                    td.n { (e.attempt) }
                    td.kind { (e.kind.to_string()) }
                    td { (e.detail.as_deref().unwrap_or("")) }
                }
            }
        }
        h2 { "Output" }
        @if running {
            @match live {
                Some(l) => {
                    p #live.later {
                        "Attempt " (l.attempt) " is running: the last 64 KiB of its output "
                        "files, live, reloads every 5 s."
                    }
                    h3 { "stdout (attempt " (l.attempt) ", live" @if l.stdout.1 { ", tail" } ")" }
                    pre #live-stdout { (String::from_utf8_lossy(&l.stdout.0)) }
                    h3 { "stderr (attempt " (l.attempt) ", live" @if l.stderr.1 { ", tail" } ")" }
                    pre #live-stderr { (String::from_utf8_lossy(&l.stderr.0)) }
                    @if output.is_some() { p.later { "Recorded when an earlier attempt ended:" } }
                },
                None => p #live.later {
                    "Attempt " (j.attempt) " is running: its output is recorded when it ends, and "
                    "this page reloads every 5 seconds until then."
                },
            }
        }
        @match output {
            None => p { "None recorded yet." },
            Some(o) => {
                h3 { "stdout (attempt " (o.attempt) @if o.stdout_truncated { ", tail" } ")" }
                pre #stdout { (String::from_utf8_lossy(&o.stdout)) }
                h3 { "stderr (attempt " (o.attempt) @if o.stderr_truncated { ", tail" } ")" }
                pre #stderr { (String::from_utf8_lossy(&o.stderr)) }
            }
        }
    };
    layout(
        &format!("Job {}", j.id),
        running,
        token.is_some(),
        Some(view),
        body,
    )
}

/// A slot in the viewer's zone and, when the schedule's zone is another, in that one too;
/// `-` when none.
fn slot(times: &Times, r: &ScheduleRecord, at: Option<i64>) -> Markup {
    match at {
        None => html! { "-" },
        Some(at) => html! {
            (times.at(at))
            @if r.schedule.zone_name() != times.name() { br; span.later { (r.schedule.local_time(at)) } }
        },
    }
}

/// Links to jobs, comma-separated.
fn job_links(ids: &[i64]) -> Markup {
    html! {
        @for (i, id) in ids.iter().enumerate() {
            @if i > 0 { ", " }
            a href={ "/jobs/" (id) } { (id) }
        }
    }
}

/// A duration in milliseconds, in the largest unit that keeps it readable.
fn age(ms: i64) -> String {
    let s = ms.max(0) as f64 / 1000.0;
    if s < 120.0 {
        format!("{s:.1} s")
    } else if s < 7200.0 {
        format!("{:.1} min", s / 60.0)
    } else if s < 172_800.0 {
        format!("{:.1} h", s / 3600.0)
    } else {
        format!("{:.1} d", s / 86_400.0)
    }
}

/// Bytes in binary units, one decimal.
fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}
