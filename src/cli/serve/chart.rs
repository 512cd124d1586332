//! The overview's charts, drawn on the server as inline SVG (the CSP allows no script):
//! jobs ended per interval stacked by outcome, wait and run time quantiles, and the running
//! and ready jobs, each with axes, units, a legend, a `<title>` and its numbers in a table
//! behind a `<details>`. Pure functions of the samples a runner's sweeper takes
//! ([`leasehold::Sample`]); colours come from the stylesheet's classes.

use leasehold::{FINE_SAMPLES, HISTOGRAM_BOUNDS_MS, Sample};
use maud::{Markup, html};

use super::times::Times;

/// The drawing's size in SVG units; the stylesheet scales it to the page's width.
const WIDTH: f64 = 540.0;
const HEIGHT: f64 = 250.0;
/// The plot area's margins: room for the y labels, the x labels and the legend.
const LEFT: f64 = 86.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 14.0;
const BOTTOM: f64 = 56.0;

/// One named series of a chart: a value per interval (or per instant), `None` where there is
/// nothing to draw.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: &'static str,
    /// The stylesheet class that colours it (`s-NAME`).
    pub class: &'static str,
    pub values: Vec<Option<f64>>,
}

/// How the y axis maps values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scale {
    /// From 0 to a round number above the largest value; `unit` follows each tick's value.
    Linear,
    /// Milliseconds on a log scale, from 1 ms to the first round duration above the largest.
    LogMs,
}

/// What a chart shows, for its title, its y axis and its table.
pub struct Chart<'a> {
    /// The element id of its figure.
    pub id: &'a str,
    pub title: &'a str,
    /// The y axis's label (the unit).
    pub y_label: &'a str,
    pub scale: Scale,
    /// Bars stacked over intervals, or lines through points.
    pub stacked: bool,
    /// The intervals `(from, to)` in milliseconds since the epoch; for lines, `to` is the
    /// instant drawn.
    pub spans: &'a [(i64, i64)],
    pub series: &'a [Series],
    /// The zone the viewer reads times in.
    pub times: &'a Times,
}

/// The figure: the SVG, a caption and the numbers behind a `<details>`.
pub fn figure(c: &Chart<'_>, caption: &str) -> Markup {
    html! {
        figure.chart id=(c.id) {
            (svg(c))
            figcaption { (caption) }
            details {
                summary { "The numbers" }
                table.chart-data {
                    tr {
                        th { "from (" (c.times.name()) ")" } th { "to (" (c.times.name()) ")" }
                        @for s in c.series { th { (s.name) } }
                    }
                    @for (i, (from, to)) in c.spans.iter().enumerate() {
                        tr data-from=(from) data-to=(to) {
                            td.t { (c.times.clock(*from, true)) }
                            td.t { (c.times.clock(*to, true)) }
                            @for s in c.series {
                                td.n data-series=(s.name) {
                                    @match s.values.get(i).copied().flatten() {
                                        Some(v) => (value_text(v, c.scale)),
                                        None => "-",
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The chart as an `<svg>` element, well-formed XML (every element closed), with a `<title>`.
pub fn svg(c: &Chart<'_>) -> Markup {
    let (x0, x1) = match (c.spans.first(), c.spans.last()) {
        (Some(f), Some(l)) if l.1 > f.0 => (if c.stacked { f.0 } else { f.1 }, l.1.max(f.1 + 1)),
        _ => (0, 1),
    };
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |t: i64| LEFT + plot_w * (t - x0) as f64 / (x1 - x0).max(1) as f64;
    let top = match c.scale {
        Scale::Linear => nice_ceiling(max_value(c)),
        Scale::LogMs => log_ceiling(max_value(c)),
    };
    let y = |v: f64| -> f64 {
        let f = match c.scale {
            Scale::Linear => v / top,
            Scale::LogMs => v.max(1.0).log10() / top.log10(),
        };
        TOP + plot_h * (1.0 - f.clamp(0.0, 1.0))
    };
    let ticks = match c.scale {
        Scale::Linear => linear_ticks(top),
        Scale::LogMs => log_ticks(top),
    };
    // A label centred on a tick near an edge would leave the drawing or meet the y axis's.
    let x_ticks: Vec<i64> = time_ticks(x0, x1)
        .into_iter()
        .filter(|t| (LEFT + 28.0..=WIDTH - RIGHT - 28.0).contains(&x(*t)))
        .collect();
    let with_date = x1 - x0 > 20 * 3_600_000;
    // A stack's bars, bottom up.
    let mut bars = Vec::new();
    if c.stacked {
        for (i, (from, to)) in c.spans.iter().enumerate() {
            let mut base = 0.0;
            for s in c.series {
                let Some(v) = s.values.get(i).copied().flatten().filter(|v| *v > 0.0) else {
                    continue;
                };
                let (lo, hi) = (y(base), y(base + v));
                bars.push(Bar {
                    class: s.class,
                    x: x(*from) + 0.5,
                    y: hi,
                    w: (x(*to) - x(*from) - 1.0).max(0.5),
                    h: (lo - hi).max(0.5),
                    title: format!(
                        "{}: {} from {} to {} {}",
                        s.name,
                        value_text(v, c.scale),
                        c.times.clock(*from, true),
                        c.times.clock(*to, true),
                        c.times.name()
                    ),
                });
                base += v;
            }
        }
    }
    html! {
        svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox={ "0 0 " (WIDTH) " " (HEIGHT) }
            role="img" aria-labelledby={ (c.id) "-title" } {
            title id={ (c.id) "-title" } { (c.title) }
            // The grid and the y axis's labels.
            @for t in &ticks {
                line.grid x1=(LEFT) x2=(WIDTH - RIGHT) y1=(r(y(*t))) y2=(r(y(*t))) {}
                text.tick x=(LEFT - 6.0) y=(r(y(*t) + 4.5)) text-anchor="end" { (value_text(*t, c.scale)) }
            }
            text.axis transform={ "translate(14 " (r(TOP + plot_h / 2.0)) ") rotate(-90)" } text-anchor="middle" { (c.y_label) }
            // The x axis: times in UTC.
            line.axis x1=(LEFT) x2=(WIDTH - RIGHT) y1=(r(TOP + plot_h)) y2=(r(TOP + plot_h)) {}
            // Every other label is `odd`: a narrow screen, with larger text, shows half of them.
            @for (i, t) in x_ticks.iter().enumerate() {
                line.axis x1=(r(x(*t))) x2=(r(x(*t))) y1=(r(TOP + plot_h)) y2=(r(TOP + plot_h + 4.0)) {}
                text class=(if i % 2 == 1 { "tick odd" } else { "tick" }) x=(r(x(*t))) y=(r(TOP + plot_h + 17.0)) text-anchor="middle" { (c.times.clock(*t, with_date)) }
            }
            text.axis x=(WIDTH - RIGHT) y=(r(TOP + plot_h + 33.0)) text-anchor="end" { "time (" (c.times.name()) ")" }
            // The data.
            @if c.stacked {
                @for b in &bars {
                    rect class=(b.class) x=(r(b.x)) y=(r(b.y)) width=(r(b.w)) height=(r(b.h)) {
                        title { (b.title) }
                    }
                }
            } @else {
                @for s in c.series {
                    @for run in runs(&s.values) {
                        polyline class=(s.class) fill="none" points=(points(&run, |i| x(c.spans[i].1), y)) {}
                    }
                    @for (i, v) in s.values.iter().enumerate() {
                        @if let Some(v) = v {
                            circle class=(s.class) cx=(r(x(c.spans[i].1))) cy=(r(y(*v))) r="2" {
                                title { (s.name) ": " (value_text(*v, c.scale)) " at " (c.times.clock(c.spans[i].1, true)) " " (c.times.name()) }
                            }
                        }
                    }
                }
            }
            // The legend.
            @for (i, s) in c.series.iter().enumerate() {
                @let lx = 8.0 + 106.0 * i as f64;
                rect class=(s.class) x=(r(lx)) y=(r(HEIGHT - 14.0)) width="10" height="10" {}
                text.legend x=(r(lx + 14.0)) y=(r(HEIGHT - 5.0)) { (s.name) }
            }
        }
    }
}

/// One bar of a stack, in SVG units.
struct Bar {
    class: &'static str,
    x: f64,
    y: f64,
    w: f64,
    h: f64,
    title: String,
}

/// The largest value drawn: of a stack's total for bars.
fn max_value(c: &Chart<'_>) -> f64 {
    let n = c.spans.len();
    (0..n)
        .map(|i| {
            let vals = c
                .series
                .iter()
                .filter_map(|s| s.values.get(i).copied().flatten());
            if c.stacked {
                vals.sum::<f64>()
            } else {
                vals.fold(0.0, f64::max)
            }
        })
        .fold(0.0, f64::max)
}

/// 1, 2 or 5 times a power of ten, at least `v` (and at least 1).
fn nice_ceiling(v: f64) -> f64 {
    if !v.is_finite() || v <= 1.0 {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|c| *c >= v)
        .unwrap_or(10.0 * p)
}

/// Five steps from 0 to `top` (whole numbers when `top` is small).
fn linear_ticks(top: f64) -> Vec<f64> {
    let steps = if top <= 2.0 { top as usize } else { 5 };
    (0..=steps.max(1))
        .map(|i| top * i as f64 / steps.max(1) as f64)
        .collect()
}

/// The round durations a log axis is marked at, in milliseconds.
const LOG_TICKS_MS: [f64; 9] = [
    1.0,
    10.0,
    100.0,
    1_000.0,
    10_000.0,
    60_000.0,
    600_000.0,
    3_600_000.0,
    86_400_000.0,
];

/// The first round duration at or above `v` (at least 1 s, at most two days).
fn log_ceiling(v: f64) -> f64 {
    LOG_TICKS_MS
        .iter()
        .copied()
        .find(|t| *t >= v && *t >= 1_000.0)
        .unwrap_or(2.0 * 86_400_000.0)
}

fn log_ticks(top: f64) -> Vec<f64> {
    LOG_TICKS_MS.iter().copied().filter(|t| *t <= top).collect()
}

/// At most seven round instants between `x0` and `x1`.
fn time_ticks(x0: i64, x1: i64) -> Vec<i64> {
    const STEPS: [i64; 12] = [
        1_000, 5_000, 10_000, 30_000, 60_000, 300_000, 600_000, 900_000, 1_800_000, 3_600_000,
        10_800_000, 21_600_000,
    ];
    let span = (x1 - x0).max(1);
    let step = STEPS
        .iter()
        .copied()
        .find(|s| span / s <= 6)
        .unwrap_or(43_200_000);
    let first = x0.div_euclid(step) * step + if x0.rem_euclid(step) == 0 { 0 } else { step };
    (0..)
        .map(|i| first + i * step)
        .take_while(|t| *t <= x1)
        .collect()
}

/// The maximal runs of consecutive values that are present, as (index, value).
fn runs(values: &[Option<f64>]) -> Vec<Vec<(usize, f64)>> {
    let mut out: Vec<Vec<(usize, f64)>> = Vec::new();
    let mut cur = Vec::new();
    for (i, v) in values.iter().enumerate() {
        match v {
            Some(v) => cur.push((i, *v)),
            None if !cur.is_empty() => out.push(std::mem::take(&mut cur)),
            None => {}
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn points(run: &[(usize, f64)], x: impl Fn(usize) -> f64, y: impl Fn(f64) -> f64) -> String {
    run.iter()
        .map(|(i, v)| format!("{},{}", r(x(*i)), r(y(*v))))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A coordinate to one decimal.
fn r(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

/// A value as its axis and table show it: a count, or a duration.
fn value_text(v: f64, scale: Scale) -> String {
    match scale {
        Scale::Linear if v.fract() == 0.0 => format!("{v}"),
        Scale::Linear => format!("{v:.1}"),
        Scale::LogMs => duration_text(v),
    }
}

/// Milliseconds in the largest unit that keeps them whole-ish.
fn duration_text(ms: f64) -> String {
    let top = HISTOGRAM_BOUNDS_MS[HISTOGRAM_BOUNDS_MS.len() - 1] as f64;
    if ms > top {
        return "> 1 d".to_string();
    }
    match ms {
        m if m < 1_000.0 => format!("{m} ms"),
        m if m < 60_000.0 => format!("{} s", m / 1_000.0),
        m if m < 3_600_000.0 => format!("{} min", m / 60_000.0),
        m if m < 86_400_000.0 => format!("{} h", m / 3_600_000.0),
        m => format!("{} d", m / 86_400_000.0),
    }
}

// --- From samples to charts -----------------------------------------------------------------

/// A sample's counter.
type Counter = fn(&Sample) -> u64;

/// The outcomes a jobs-ended chart stacks, in order, with the sample's counter of each.
const OUTCOMES: [(&str, Counter); 5] = [
    ("succeeded", |s| s.succeeded),
    ("failed", |s| s.failed),
    ("retried", |s| s.retried),
    ("lost", |s| s.lost),
    ("cancelled", |s| s.cancelled),
];

/// What the overview draws from a run of consecutive samples.
pub struct Intervals {
    pub spans: Vec<(i64, i64)>,
    /// Jobs ended in each interval, by outcome (as [`OUTCOMES`]).
    pub ended: Vec<Series>,
    /// Median and p95 of the wait and of the run of the attempts that ended in it.
    pub wait: Vec<Series>,
    pub run: Vec<Series>,
    /// Running and ready jobs at the end of each interval.
    pub gauges: Vec<Series>,
}

/// The intervals between consecutive `samples` (oldest first). A counter that went down (a
/// file replaced by an older copy) counts as 0.
pub fn intervals(samples: &[Sample]) -> Intervals {
    let pairs: Vec<(&Sample, &Sample)> = samples.windows(2).map(|w| (&w[0], &w[1])).collect();
    let ended = OUTCOMES
        .iter()
        .map(|(name, get)| Series {
            name,
            class: class_of(name),
            values: pairs
                .iter()
                .map(|(a, b)| Some(get(b).saturating_sub(get(a)) as f64))
                .collect(),
        })
        .collect();
    let quantiles = |hist: fn(&Sample) -> &[u64], p50: &'static str, p95: &'static str| {
        let deltas: Vec<Vec<u64>> = pairs
            .iter()
            .map(|(a, b)| {
                hist(b)
                    .iter()
                    .zip(hist(a).iter().chain(std::iter::repeat(&0)))
                    .map(|(b, a)| b.saturating_sub(*a))
                    .collect()
            })
            .collect();
        vec![
            Series {
                name: p50,
                class: "s-p50",
                values: deltas.iter().map(|d| quantile_ms(d, 0.5)).collect(),
            },
            Series {
                name: p95,
                class: "s-p95",
                values: deltas.iter().map(|d| quantile_ms(d, 0.95)).collect(),
            },
        ]
    };
    Intervals {
        spans: pairs.iter().map(|(a, b)| (a.at, b.at)).collect(),
        ended,
        wait: quantiles(|s| &s.wait, "wait p50", "wait p95"),
        run: quantiles(|s| &s.run, "run p50", "run p95"),
        gauges: vec![
            Series {
                name: "running",
                class: "s-running",
                values: pairs.iter().map(|(_, b)| Some(b.running as f64)).collect(),
            },
            Series {
                name: "ready",
                class: "s-ready",
                values: pairs.iter().map(|(_, b)| Some(b.ready as f64)).collect(),
            },
        ],
    }
}

fn class_of(outcome: &str) -> &'static str {
    match outcome {
        "succeeded" => "s-succeeded",
        "failed" => "s-failed",
        "retried" => "s-retried",
        "lost" => "s-lost",
        _ => "s-cancelled",
    }
}

/// The `q` quantile of a histogram's bucket counts, as the upper bound of the bucket it falls
/// in (the +Inf bucket: twice the largest bound); `None` for an empty histogram.
pub fn quantile_ms(counts: &[u64], q: f64) -> Option<f64> {
    let n: u64 = counts.iter().sum();
    if n == 0 {
        return None;
    }
    let rank = ((q * n as f64).ceil() as u64).max(1);
    let mut seen = 0;
    for (i, c) in counts.iter().enumerate() {
        seen += c;
        if seen >= rank {
            return Some(match HISTOGRAM_BOUNDS_MS.get(i) {
                Some(b) => *b as f64,
                None => 2.0 * HISTOGRAM_BOUNDS_MS[HISTOGRAM_BOUNDS_MS.len() - 1] as f64,
            });
        }
    }
    None
}

/// The fine samples (the newest [`FINE_SAMPLES`]) and the coarse ones, oldest first.
pub fn split(samples: &[Sample]) -> (&[Sample], Vec<Sample>) {
    let fine = &samples[samples.len().saturating_sub(FINE_SAMPLES)..];
    let coarse = samples.iter().filter(|s| s.coarse).cloned().collect();
    (fine, coarse)
}

/// "1 min", "10 s", "1 h": an interval's length for a unit.
pub fn interval_text(spans: &[(i64, i64)]) -> String {
    let mut lengths: Vec<i64> = spans.iter().map(|(a, b)| b - a).collect();
    lengths.sort_unstable();
    let Some(median) = lengths.get(lengths.len() / 2) else {
        return "interval".to_string();
    };
    // Samples are taken a few milliseconds into an interval: round to whole seconds, or to
    // 10 ms below a second (a runner's start and stop samples may be closer than an interval).
    let ms = *median as f64;
    if ms < 1_000.0 {
        return duration_text(((ms / 10.0).round() * 10.0).max(10.0));
    }
    duration_text((ms / 1000.0).round() * 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at: i64, succeeded: u64, failed: u64, wait_bucket: usize) -> Sample {
        let mut s = Sample::default();
        s.at = at;
        s.succeeded = succeeded;
        s.failed = failed;
        s.wait = vec![0; HISTOGRAM_BOUNDS_MS.len() + 1];
        s.run = vec![0; HISTOGRAM_BOUNDS_MS.len() + 1];
        s.wait[wait_bucket] = succeeded + failed;
        s.running = 2;
        s.ready = 7;
        s
    }

    fn parse(svg: &str) -> roxmltree::Document<'_> {
        roxmltree::Document::parse(svg).unwrap_or_else(|e| panic!("{e}: {svg}"))
    }

    #[test]
    fn stacked_bars_are_well_formed_svg_with_a_title_and_a_legend() {
        let samples: Vec<Sample> = (0..5)
            .map(|i| sample(1_700_000_040_000 + i * 60_000, i as u64 * 3, i as u64, 4))
            .collect();
        let iv = intervals(&samples);
        let utc = Times::utc();
        let c = Chart {
            id: "ended-fine",
            title: "Jobs ended per minute <by outcome> & more",
            y_label: "jobs per 1 min",
            scale: Scale::Linear,
            stacked: true,
            spans: &iv.spans,
            series: &iv.ended,
            times: &utc,
        };
        let text = svg(&c).into_string();
        let doc = parse(&text);
        let root = doc.root_element();
        assert_eq!(root.tag_name().name(), "svg");
        assert_eq!(
            root.tag_name().namespace(),
            Some("http://www.w3.org/2000/svg")
        );
        let title = root
            .children()
            .find(|n| n.has_tag_name("title"))
            .expect("a title");
        assert_eq!(
            title.text(),
            Some("Jobs ended per minute <by outcome> & more")
        );
        // Four intervals, each with a succeeded and a failed bar.
        let bars = |class: &str| {
            root.descendants()
                .filter(|n| n.has_tag_name("rect") && n.attribute("class") == Some(class))
                .count()
        };
        assert_eq!(bars("s-succeeded"), 4 + 1, "bars and the legend's swatch");
        assert_eq!(bars("s-failed"), 4 + 1);
        let legend: Vec<&str> = root
            .descendants()
            .filter(|n| n.attribute("class") == Some("legend"))
            .filter_map(|n| n.text())
            .collect();
        assert_eq!(
            legend,
            ["succeeded", "failed", "retried", "lost", "cancelled"]
        );
        assert!(text.contains("jobs per 1 min"));
    }

    #[test]
    fn lines_break_where_there_is_no_value_and_stay_well_formed() {
        let spans = [
            (0, 60_000),
            (60_000, 120_000),
            (120_000, 180_000),
            (180_000, 240_000),
        ];
        let series = [Series {
            name: "wait p50",
            class: "s-p50",
            values: vec![Some(100.0), None, Some(5_000.0), Some(86_400_000.0 * 2.0)],
        }];
        let utc = Times::utc();
        let c = Chart {
            id: "wait",
            title: "Wait",
            y_label: "ms (log)",
            scale: Scale::LogMs,
            stacked: false,
            spans: &spans,
            series: &series,
            times: &utc,
        };
        let text = svg(&c).into_string();
        let doc = parse(&text);
        let lines = doc
            .descendants()
            .filter(|n| n.has_tag_name("polyline"))
            .count();
        assert_eq!(lines, 2, "{text}");
        assert!(text.contains("&gt; 1 d"), "{text}");
        let fig = figure(&c, "caption").into_string();
        assert!(fig.contains("<details>"), "{fig}");
        // The figure's SVG is the same element.
        assert!(fig.contains(&text));
    }

    #[test]
    fn an_empty_chart_is_still_well_formed() {
        let utc = Times::utc();
        let c = Chart {
            id: "none",
            title: "Nothing yet",
            y_label: "jobs",
            scale: Scale::Linear,
            stacked: true,
            spans: &[],
            series: &[],
            times: &utc,
        };
        parse(&svg(&c).into_string());
    }

    #[test]
    fn intervals_are_the_differences_of_consecutive_samples() {
        let samples = [
            sample(0, 1, 0, 2),
            sample(60_000, 4, 1, 2),
            sample(120_000, 4, 1, 2),
        ];
        let iv = intervals(&samples);
        assert_eq!(iv.spans, [(0, 60_000), (60_000, 120_000)]);
        assert_eq!(iv.ended[0].values, [Some(3.0), Some(0.0)]);
        assert_eq!(iv.ended[1].values, [Some(1.0), Some(0.0)]);
        // Wait bucket 2 is "at most 25 ms"; an interval without attempts has no quantile.
        assert_eq!(iv.wait[0].values, [Some(25.0), None]);
        assert_eq!(iv.gauges[1].values, [Some(7.0), Some(7.0)]);
    }

    #[test]
    fn quantiles_are_the_upper_bounds_of_their_buckets() {
        let mut c = vec![0u64; HISTOGRAM_BOUNDS_MS.len() + 1];
        c[0] = 50; // <= 5 ms
        c[7] = 45; // <= 1 s
        c[18] = 5; // +Inf
        assert_eq!(quantile_ms(&c, 0.5), Some(5.0));
        assert_eq!(quantile_ms(&c, 0.95), Some(1_000.0));
        assert_eq!(quantile_ms(&c, 0.96), Some(2.0 * 86_400_000.0));
        assert_eq!(quantile_ms(&[0, 0], 0.5), None);
    }

    #[test]
    fn ticks_are_round() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(7.0), 10.0);
        assert_eq!(nice_ceiling(130.0), 200.0);
        assert_eq!(
            time_ticks(30_000, 3_630_000),
            [
                600_000, 1_200_000, 1_800_000, 2_400_000, 3_000_000, 3_600_000
            ]
        );
        assert_eq!(duration_text(60_000.0), "1 min");
    }
}
