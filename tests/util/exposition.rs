//! A strict parser of the Prometheus text exposition format, version 0.0.4, for checking
//! what `Metrics::to_prometheus` and `leasehold status --prometheus` print: every line is a
//! `# HELP`, a `# TYPE` or a sample; names and label names are valid; label values are quoted
//! with only the three escapes; values are floats; each family's HELP and TYPE come before its
//! samples and only once; a family's samples are not split by another family's; a histogram's
//! buckets rise with `le`, end at `+Inf`, and that bucket equals `_count`.

use std::collections::{BTreeMap, HashMap, HashSet};

/// One sample: its full name (with `_bucket`, `_sum`... for a histogram), labels, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed exposition.
#[derive(Debug, Default)]
pub struct Exposition {
    /// Family name -> its TYPE.
    pub types: HashMap<String, String>,
    pub samples: Vec<Sample>,
}

impl Exposition {
    /// The value of the one sample `name` with exactly these labels; None when absent.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let want: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let found: Vec<f64> = self
            .samples
            .iter()
            .filter(|s| s.name == name && s.labels == want)
            .map(|s| s.value)
            .collect();
        assert!(found.len() <= 1, "{name} {labels:?} appears twice");
        found.first().copied()
    }

    /// The value of `name` with these labels, 0 when absent (a counter not yet counted).
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels).unwrap_or(0.0)
    }

    /// Each counter and histogram sample (the durable ones, which must never go down) with
    /// the same sample's value in `after`, None when `after` lacks it.
    pub fn durable_in<'a>(&'a self, after: &Exposition) -> Vec<(&'a Sample, Option<f64>)> {
        let durable = |name: &str| {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .fold(name, |n, suffix| n.strip_suffix(suffix).unwrap_or(n));
            let kind = self.types.get(name).or_else(|| self.types.get(family));
            matches!(kind.map(String::as_str), Some("counter" | "histogram"))
        };
        self.samples
            .iter()
            .filter(|s| durable(&s.name))
            .map(|s| {
                let pairs: Vec<(&str, &str)> = s
                    .labels
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                (s, after.get(&s.name, &pairs))
            })
            .collect()
    }

    /// The sum of every sample of `name` whatever its labels.
    pub fn sum(&self, name: &str) -> f64 {
        self.samples
            .iter()
            .filter(|s| s.name == name)
            .map(|s| s.value)
            .sum()
    }
}

fn valid_metric_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn valid_label_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !s.starts_with("__")
}

fn parse_value(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => {
            let ok = !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E'));
            if !ok {
                return Err(format!("bad value {s:?}"));
            }
            s.parse::<f64>()
                .map_err(|e| format!("bad value {s:?}: {e}"))
        }
    }
}

/// The family a sample name belongs to, given the TYPEs declared so far.
fn family_of(name: &str, types: &HashMap<String, String>) -> Option<String> {
    if types.contains_key(name) {
        return Some(name.to_string());
    }
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix)
            && matches!(
                types.get(base).map(String::as_str),
                Some("histogram" | "summary")
            )
        {
            return Some(base.to_string());
        }
    }
    None
}

/// `{a="x",b="y"}` at the start of `s`: the labels and the rest of the line.
fn parse_labels(s: &str) -> Result<(BTreeMap<String, String>, &str), String> {
    let mut labels = BTreeMap::new();
    let mut rest = s.strip_prefix('{').ok_or("labels must start with {")?;
    loop {
        if let Some(r) = rest.strip_prefix('}') {
            return Ok((labels, r));
        }
        let eq = rest.find('=').ok_or("label without =")?;
        let name = &rest[..eq];
        if !valid_label_name(name) {
            return Err(format!("bad label name {name:?}"));
        }
        rest = rest[eq + 1..]
            .strip_prefix('"')
            .ok_or("label value must be quoted")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                None => return Err("unterminated label value".into()),
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, 'n')) => value.push('\n'),
                    other => return Err(format!("bad escape {other:?}")),
                },
                Some((_, '\n')) => return Err("raw newline in a label value".into()),
                Some((_, c)) => value.push(c),
            }
        };
        if labels.insert(name.to_string(), value).is_some() {
            return Err(format!("label {name} twice"));
        }
        rest = &rest[end + 1..];
        if let Some(r) = rest.strip_prefix(',') {
            rest = r;
        } else if !rest.starts_with('}') {
            return Err("labels must be separated by ,".into());
        }
    }
}

/// Parses `text`, panicking with the line and the reason at the first violation.
pub fn parse(text: &str) -> Exposition {
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "the last line must end with \\n"
    );
    let mut exp = Exposition::default();
    let mut helps: HashSet<String> = HashSet::new();
    // Families whose samples are over: one whose samples were followed by another's.
    let mut closed: HashSet<String> = HashSet::new();
    let mut current: Option<String> = None;
    // Families that have samples already: their HELP and TYPE must come first.
    let mut sampled: HashSet<String> = HashSet::new();
    for (n, line) in text.lines().enumerate() {
        let fail = |why: String| -> ! { panic!("line {}: {why}: {line:?}", n + 1) };
        if line.is_empty() {
            fail("empty line".into());
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut words = comment.trim_start().splitn(3, ' ');
            let keyword = words.next().unwrap_or("");
            let name = words.next().unwrap_or("");
            let rest = words.next().unwrap_or("");
            match keyword {
                "HELP" | "TYPE" => {
                    if !valid_metric_name(name) {
                        fail(format!("bad metric name {name:?}"));
                    }
                    if sampled.contains(name) {
                        fail(format!("{keyword} of {name} after its samples"));
                    }
                    if keyword == "HELP" {
                        if !helps.insert(name.to_string()) {
                            fail(format!("second HELP for {name}"));
                        }
                        if rest.contains('\n') {
                            fail("raw newline in HELP".into());
                        }
                    } else {
                        if !matches!(
                            rest,
                            "counter" | "gauge" | "histogram" | "summary" | "untyped"
                        ) {
                            fail(format!("bad type {rest:?}"));
                        }
                        if exp
                            .types
                            .insert(name.to_string(), rest.to_string())
                            .is_some()
                        {
                            fail(format!("second TYPE for {name}"));
                        }
                    }
                    if let Some(prev) = current.replace(name.to_string())
                        && prev != name
                    {
                        closed.insert(prev);
                    }
                }
                // Other comments are allowed by the format; we write none.
                _ => fail("a comment that is neither HELP nor TYPE".into()),
            }
            continue;
        }
        let name_end = line
            .find(['{', ' '])
            .unwrap_or_else(|| fail("a sample without a value".into()));
        let name = &line[..name_end];
        if !valid_metric_name(name) {
            fail(format!("bad metric name {name:?}"));
        }
        let (labels, rest) = if line[name_end..].starts_with('{') {
            parse_labels(&line[name_end..]).unwrap_or_else(|e| fail(e))
        } else {
            (BTreeMap::new(), &line[name_end..])
        };
        let rest = rest
            .strip_prefix(' ')
            .unwrap_or_else(|| fail("one space before the value".into()));
        let mut parts = rest.split(' ');
        let value = parse_value(parts.next().unwrap_or("")).unwrap_or_else(|e| fail(e));
        if let Some(ts) = parts.next() {
            ts.parse::<i64>()
                .unwrap_or_else(|_| fail(format!("bad timestamp {ts:?}")));
        }
        if parts.next().is_some() {
            fail("trailing fields".into());
        }
        let family = family_of(name, &exp.types)
            .unwrap_or_else(|| fail(format!("sample of {name} before its family's TYPE")));
        if closed.contains(&family) {
            fail(format!("{family}'s samples are split by another family"));
        }
        if current.as_deref() != Some(family.as_str()) {
            fail(format!("sample of {family} under another family's header"));
        }
        if exp.types[&family] == "histogram"
            && name.ends_with("_bucket")
            && !labels.contains_key("le")
        {
            fail("a bucket without le".into());
        }
        if exp.types[&family] == "counter" && (value.is_nan() || value < 0.0) {
            fail("a negative counter".into());
        }
        sampled.insert(family);
        exp.samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    check_histograms(&exp);
    exp
}

/// Each histogram series: buckets rising with `le`, ending at +Inf, equal to `_count`.
fn check_histograms(exp: &Exposition) {
    for (family, kind) in &exp.types {
        if kind != "histogram" {
            continue;
        }
        let mut series: BTreeMap<BTreeMap<String, String>, Vec<(f64, f64)>> = BTreeMap::new();
        for s in exp
            .samples
            .iter()
            .filter(|s| s.name == format!("{family}_bucket"))
        {
            let mut key = s.labels.clone();
            let le = parse_value(&key.remove("le").expect("le")).expect("le is a float");
            series.entry(key).or_default().push((le, s.value));
        }
        for (labels, buckets) in &series {
            for w in buckets.windows(2) {
                assert!(
                    w[0].0 < w[1].0,
                    "{family} {labels:?}: le not increasing: {buckets:?}"
                );
                assert!(
                    w[0].1 <= w[1].1,
                    "{family} {labels:?}: buckets not monotonic: {buckets:?}"
                );
            }
            let last = buckets.last().expect("a bucket");
            assert_eq!(last.0, f64::INFINITY, "{family} {labels:?}: no +Inf bucket");
            let pairs: Vec<(&str, &str)> = labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let count = exp
                .get(&format!("{family}_count"), &pairs)
                .unwrap_or_else(|| panic!("{family} {labels:?}: no _count"));
            assert_eq!(last.1, count, "{family} {labels:?}: +Inf bucket != _count");
            assert!(
                exp.get(&format!("{family}_sum"), &pairs).is_some(),
                "{family} {labels:?}: no _sum"
            );
        }
    }
}
