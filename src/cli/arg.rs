//! Values the command line takes that clap does not parse by itself.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use leasehold::{OnLost, Status};

/// A number of seconds greater than 0, decimals allowed (`0.2`).
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
        let d =
            Duration::try_from_secs_f64(value).map_err(|_| format!("{s} seconds is too long"))?;
        // The database keeps milliseconds: less than one would be stored as 0.
        if d < Duration::from_millis(1) {
            return Err(format!("{s:?} seconds is less than a millisecond"));
        }
        Ok(Secs(d))
    }
}

impl fmt::Display for Secs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.as_secs_f64())
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

/// A count of at least 1 (`--workers`).
pub fn at_least_one(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{s:?} is not a whole number of at least 1")),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_decimals_greater_than_zero() {
        assert_eq!("0.2".parse::<Secs>(), Ok(Secs(Duration::from_millis(200))));
        assert_eq!("30".parse::<Secs>(), Ok(Secs(Duration::from_secs(30))));
        assert_eq!("0.001".parse::<Secs>(), Ok(Secs(Duration::from_millis(1))));
        for bad in [
            "0", "-1", "abc", "inf", "nan", "", "0.0", "-0", "1e400", "0.0004",
        ] {
            assert!(bad.parse::<Secs>().is_err(), "{bad}");
        }
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
