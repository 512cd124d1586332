//! Values the command line takes that clap does not parse by itself.

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use leasehold::{Condition, IoClass, OnLost, Status, WhenLost};

/// A number of seconds greater than 0, decimals allowed (`0.2`).
///
/// Parsed with checked conversions only: NaN, infinities, negatives, an empty value, less
/// than a millisecond (the database keeps milliseconds: it would be stored as 0), and more
/// milliseconds than an i64 holds (the database's integers) are all refused.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Secs(pub Duration);

impl FromStr for Secs {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("{s:?} is not a number of seconds greater than 0 (e.g. 5 or 0.2)");
        let value: f64 = s.trim().parse().map_err(|_| bad())?;
        if !value.is_finite() || value <= 0.0 {
            return Err(bad());
        }
        let too_long = || {
            format!(
                "{s} seconds is too long (at most {}.{:03}: the database keeps milliseconds \
                 in a 64-bit integer)",
                i64::MAX / 1000,
                i64::MAX % 1000
            )
        };
        let d = Duration::try_from_secs_f64(value).map_err(|_| too_long())?;
        if d > MAX_SECS {
            return Err(too_long());
        }
        if d < Duration::from_millis(1) {
            return Err(format!("{s:?} seconds is less than a millisecond"));
        }
        Ok(Secs(d))
    }
}

/// The longest duration a flag takes: whole milliseconds that fit an i64, as the database
/// stores them (about 292 million years; the library may refuse less for some settings).
const MAX_SECS: Duration = Duration::from_millis(i64::MAX as u64);

impl fmt::Display for Secs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.as_secs_f64())
    }
}

/// A keep rule of `--keep-*`: a number of seconds (0 and decimals allowed, parsed as checked as
/// [`Secs`]), or `forever`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Keep(pub Option<Duration>);

impl FromStr for Keep {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "forever" => Ok(Keep(None)),
            "0" => Ok(Keep(Some(Duration::ZERO))),
            _ => match s.parse::<Secs>() {
                Ok(Secs(d)) => Ok(Keep(Some(d))),
                Err(e) if e.contains("too long") => Err(e),
                Err(_) => Err(format!(
                    "{s:?} is not a number of seconds (0 or more, e.g. 86400) or forever"
                )),
            },
        }
    }
}

impl fmt::Display for Keep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(d) => write!(f, "{}", d.as_secs_f64()),
            None => write!(f, "forever"),
        }
    }
}

/// One `NAME=VALUE` of `--env`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvPair(pub String, pub String);

impl FromStr for EnvPair {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('=') {
            Some((name, value)) if !name.is_empty() => {
                Ok(EnvPair(name.to_string(), value.to_string()))
            }
            _ => Err(format!("{s:?} is not NAME=VALUE with a non-empty NAME")),
        }
    }
}

/// `--env NAME=VALUE`, taken as bytes so that a value that is not UTF-8 is refused with a
/// reason instead of being changed.
pub fn env_pair(s: OsString) -> Result<EnvPair, String> {
    utf8(s)?.parse()
}

/// A word of the command (or any text that is stored), taken as bytes for the same reason
/// as [`env_pair`].
pub fn text(s: OsString) -> Result<String, String> {
    utf8(s)
}

/// A queue name: text, not empty.
pub fn queue(s: OsString) -> Result<String, String> {
    match utf8(s)? {
        q if q.is_empty() => Err("a queue name cannot be empty".into()),
        q => Ok(q),
    }
}

/// A unique key: text, not empty.
pub fn unique_key(s: OsString) -> Result<String, String> {
    match utf8(s)? {
        k if k.is_empty() => Err("a unique key cannot be empty".into()),
        k => Ok(k),
    }
}

/// A job's name: text, not empty.
pub fn job_name(s: OsString) -> Result<String, String> {
    match utf8(s)? {
        n if n.is_empty() => Err("a job's name cannot be empty".into()),
        n => Ok(n),
    }
}

/// A schedule's name: text, not empty, no control characters.
pub fn schedule_name(s: OsString) -> Result<String, String> {
    match utf8(s)? {
        n if n.trim().is_empty() => Err("a schedule name cannot be empty".into()),
        n if n.chars().any(char::is_control) => Err(format!("{n:?} contains a control character")),
        n => Ok(n),
    }
}

/// `run --queue Q[=N]`: a queue to serve, and this runner's limit for it.
pub fn served_queue(s: OsString) -> Result<(String, Option<usize>), String> {
    let text = utf8(s)?;
    match text.rsplit_once('=') {
        None => queue(text.into()).map(|q| (q, None)),
        Some((name, n)) => {
            let q = queue(name.into())?;
            match n.trim().parse::<usize>() {
                Ok(n) if n >= 1 => Ok((q, Some(n))),
                _ => Err(format!(
                    "{n:?} is not a whole number of at least 1 (the most jobs of queue {q} at once)"
                )),
            }
        }
    }
}

/// `queues limit`'s N, or `none`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLimit(pub Option<u32>);

/// A whole number of at least 0, or `none`.
pub fn queue_limit(s: &str) -> Result<QueueLimit, String> {
    if s == "none" {
        return Ok(QueueLimit(None));
    }
    s.trim()
        .parse::<u32>()
        .map(|n| QueueLimit(Some(n)))
        .map_err(|_| {
            format!(
                "{s:?} is not a whole number from 0 to {} or `none`",
                u32::MAX
            )
        })
}

/// A path that the job will use (`--cwd`): stored as text, so it must be UTF-8; a lossy
/// conversion would make the job run somewhere else than asked.
pub fn utf8_path(s: OsString) -> Result<PathBuf, String> {
    utf8(s).map(PathBuf::from)
}

/// The text of an argument, or why it cannot be stored as text.
fn utf8(s: OsString) -> Result<String, String> {
    s.into_string()
        .map_err(|s| format!("{s:?} is not valid UTF-8 (jobs are stored as text)"))
}

/// A number of workers: 1 to `max`.
pub fn workers(s: &str, max: usize) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("{s:?} is not a whole number from 1 to {max}")),
    }
}

/// A job status, spelled as in the database.
pub fn status(s: &str) -> Result<Status, String> {
    s.parse::<Status>()
        .map_err(|_| format!("{s:?} is not one of pending, running, succeeded, failed, cancelled"))
}

/// `requeue` or `fail`.
pub fn on_lost(s: &str) -> Result<OnLost, String> {
    s.parse::<OnLost>()
        .map_err(|_| format!("{s:?} is not one of requeue, fail"))
}

/// A condition on a job: `ac-power`, `battery-not-low`, `unmetered`, `online` or `idle`.
pub fn condition(s: &str) -> Result<Condition, String> {
    s.parse::<Condition>().map_err(|_| {
        format!("{s:?} is not one of ac-power, battery-not-low, unmetered, online, idle")
    })
}

/// `run` or `stop`.
pub fn when_lost(s: &str) -> Result<WhenLost, String> {
    s.parse::<WhenLost>()
        .map_err(|_| format!("{s:?} is not one of run, stop"))
}

/// An I/O class: `idle`, `best-effort` or `best-effort:LEVEL`.
pub fn io_class(s: &str) -> Result<IoClass, String> {
    s.parse::<IoClass>().map_err(|_| {
        format!("{s:?} is not one of idle, best-effort, best-effort:LEVEL (LEVEL 0 to 7)")
    })
}

/// A size in bytes: a whole number, with K, M, G or T (powers of 1024) after it or not.
pub fn bytes(s: &str) -> Result<u64, String> {
    let bad = || format!("{s:?} is not a size from 1 byte: a whole number, then K, M, G or T");
    let t = s.trim();
    let (digits, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(bad()),
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    let n: u64 = digits.parse().map_err(|_| bad())?;
    n.checked_mul(1 << shift)
        .filter(|&b| b >= 1 && b <= i64::MAX as u64)
        .ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_decimals_greater_than_zero() {
        assert_eq!("0.2".parse::<Secs>(), Ok(Secs(Duration::from_millis(200))));
        assert_eq!("30".parse::<Secs>(), Ok(Secs(Duration::from_secs(30))));
        assert_eq!("0.001".parse::<Secs>(), Ok(Secs(Duration::from_millis(1))));
        for bad in [
            "0", "-1", "abc", "inf", "-inf", "nan", "NaN", "", " ", "0.0", "-0", "1e400", "0.0004",
            "1e-9",
        ] {
            assert!(bad.parse::<Secs>().is_err(), "{bad}");
        }
    }

    #[test]
    fn seconds_whose_milliseconds_do_not_fit_an_i64_are_refused() {
        // About 292 million years, just below the limit (and exact as an f64) is taken.
        assert_eq!(
            "9223372036854774".parse::<Secs>(),
            Ok(Secs(Duration::from_secs(9_223_372_036_854_774)))
        );
        for bad in [
            "1e19",
            "9223372036854775807",
            "18446744073709551616",
            "9223372036854776",
            "1e300",
        ] {
            let e = bad.parse::<Secs>().unwrap_err();
            assert!(e.contains("too long"), "{bad}: {e}");
        }
    }

    #[test]
    fn keep_rules_are_seconds_from_zero_or_forever() {
        assert_eq!("forever".parse::<Keep>(), Ok(Keep(None)));
        assert_eq!("0".parse::<Keep>(), Ok(Keep(Some(Duration::ZERO))));
        assert_eq!(
            "86400".parse::<Keep>(),
            Ok(Keep(Some(Duration::from_secs(86_400))))
        );
        for bad in ["-1", "NaN", "inf", "", "1e-9", "Forever", "0x10"] {
            assert!(bad.parse::<Keep>().is_err(), "{bad}");
        }
        assert!("1e19".parse::<Keep>().unwrap_err().contains("too long"));
    }

    #[test]
    fn workers_are_bounded_both_ways() {
        assert_eq!(workers("1", 1024), Ok(1));
        assert_eq!(workers("1024", 1024), Ok(1024));
        for bad in ["0", "-1", "1025", "9223372036854775808", "", "1e3", "NaN"] {
            let e = workers(bad, 1024).unwrap_err();
            assert!(e.contains("1 to 1024"), "{bad}: {e}");
        }
    }

    #[test]
    fn bytes_that_are_not_utf8_are_refused_not_changed() {
        use std::os::unix::ffi::OsStringExt;
        let bad = || OsString::from_vec(b"caf\xe9".to_vec());
        assert!(text(bad()).unwrap_err().contains("not valid UTF-8"));
        assert!(queue(bad()).unwrap_err().contains("not valid UTF-8"));
        assert!(queue("".into()).is_err());
        assert!(utf8_path(bad()).unwrap_err().contains("not valid UTF-8"));
        let pair = OsString::from_vec(b"A=\xff".to_vec());
        assert!(env_pair(pair).unwrap_err().contains("not valid UTF-8"));
        assert_eq!(text("caf\u{e9}".into()), Ok("caf\u{e9}".to_string()));
        assert_eq!(env_pair("A=b".into()), Ok(EnvPair("A".into(), "b".into())));
    }

    #[test]
    fn env_pairs_need_a_name_and_an_equals_sign() {
        assert_eq!(
            "A=b=c".parse::<EnvPair>(),
            Ok(EnvPair("A".into(), "b=c".into()))
        );
        assert_eq!("A=".parse::<EnvPair>(), Ok(EnvPair("A".into(), "".into())));
        assert!("A".parse::<EnvPair>().is_err());
        assert!("=b".parse::<EnvPair>().is_err());
    }
}
