//! A job's manners and caps: how it yields to the machine's user (`nice`, the I/O class) and
//! what it may take (memory, CPU weight, processes). See docs/manners.md.

use crate::error::{Error, Result};

/// How many times by default a job may say "try me later" (exit 75, `EX_TEMPFAIL`) before
/// an exit 75 counts as an ordinary failure.
pub const DEFAULT_TEMPFAIL_MAX: u32 = 10;

/// The exit code that says "try me later" (`EX_TEMPFAIL` of sysexits.h).
pub const EX_TEMPFAIL: i32 = 75;

/// The I/O scheduling class of a job's processes (`ioprio_set`), as systemd's
/// `IOSchedulingClass=` and launchd's `LowPriorityIO`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IoClass {
    /// Only when no other process wants the disk.
    Idle,
    /// The default class, at a level from 0 (first) to 7 (last); 4 is the kernel's default.
    BestEffort(u8),
}

impl IoClass {
    /// The value `ioprio_set` takes: the class in bits 13 and up, the level below.
    pub(crate) fn ioprio(self) -> u32 {
        match self {
            IoClass::Idle => 3 << 13,
            IoClass::BestEffort(level) => (2 << 13) | u32::from(level.min(7)),
        }
    }

    /// The spelling of `jobs add --io-class` and the stored one: `idle`, `best-effort:N`.
    pub fn as_string(self) -> String {
        match self {
            IoClass::Idle => "idle".into(),
            IoClass::BestEffort(level) => format!("best-effort:{level}"),
        }
    }
}

impl std::str::FromStr for IoClass {
    type Err = Error;

    /// `idle`, `best-effort` (level 4) or `best-effort:LEVEL` (0 to 7).
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::invalid(
                "io_class",
                format!("{s:?} is not one of idle, best-effort, best-effort:LEVEL (0 to 7)"),
            )
        };
        match s.split_once(':') {
            None if s == "idle" => Ok(IoClass::Idle),
            None if s == "best-effort" => Ok(IoClass::BestEffort(4)),
            Some(("best-effort", level)) => match level.parse::<u8>() {
                Ok(l) if l <= 7 => Ok(IoClass::BestEffort(l)),
                _ => Err(bad()),
            },
            _ => Err(bad()),
        }
    }
}

/// A job's manners and caps, each unset unless asked for. Stored as one JSON text (the
/// `limits` column); a runner's own manners fill those a job leaves unset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Limits {
    /// The nice value (-20 to 19) the command runs at.
    pub nice: Option<i32>,
    /// The command's I/O class.
    pub io_class: Option<IoClass>,
    /// The most memory the attempt may use, in bytes.
    pub memory_max: Option<u64>,
    /// The attempt's CPU weight (1 to 10000; 100 is the kernel's default).
    pub cpu_weight: Option<u32>,
    /// The most processes (and threads) the attempt may have at once.
    pub pids_max: Option<u64>,
}

impl Limits {
    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        *self == Limits::default()
    }

    /// These, with `defaults` filling the manners left unset (the caps are a job's own).
    pub(crate) fn or_manners(self, defaults: &Limits) -> Limits {
        Limits {
            nice: self.nice.or(defaults.nice),
            io_class: self.io_class.or(defaults.io_class),
            ..self
        }
    }

    /// Checks each value's range; `Err` names the setting.
    pub(crate) fn validate(&self) -> Result<()> {
        if let Some(n) = self.nice
            && !(-20..=19).contains(&n)
        {
            return Err(Error::invalid("nice", format!("{n} is not in -20..=19")));
        }
        if let Some(IoClass::BestEffort(l)) = self.io_class
            && l > 7
        {
            return Err(Error::invalid(
                "io_class",
                format!("level {l} is not in 0..=7"),
            ));
        }
        if let Some(w) = self.cpu_weight
            && !(1..=10000).contains(&w)
        {
            return Err(Error::invalid(
                "cpu_weight",
                format!("{w} is not in 1..=10000"),
            ));
        }
        for (name, v) in [("memory_max", self.memory_max), ("pids_max", self.pids_max)] {
            if let Some(v) = v
                && (v == 0 || v > i64::MAX as u64)
            {
                return Err(Error::invalid(name, format!("{v} is not in 1..=2^63-1")));
            }
        }
        Ok(())
    }

    /// The stored text: `None` when nothing is set.
    pub(crate) fn to_json(self) -> Option<String> {
        if self.is_empty() {
            return None;
        }
        let mut v = serde_json::Map::new();
        let mut put = |k: &str, x: serde_json::Value| {
            v.insert(k.into(), x);
        };
        if let Some(n) = self.nice {
            put("nice", n.into());
        }
        if let Some(c) = self.io_class {
            put("io_class", c.as_string().into());
        }
        if let Some(m) = self.memory_max {
            put("memory_max", m.into());
        }
        if let Some(w) = self.cpu_weight {
            put("cpu_weight", w.into());
        }
        if let Some(p) = self.pids_max {
            put("pids_max", p.into());
        }
        Some(serde_json::Value::Object(v).to_string())
    }

    /// The limits a stored text holds; what it does not spell as written is left unset
    /// (a newer version's field, a file edited by hand).
    pub(crate) fn from_json(text: Option<&str>) -> Limits {
        let Some(v) = text.and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok()) else {
            return Limits::default();
        };
        Limits {
            nice: v["nice"].as_i64().and_then(|n| i32::try_from(n).ok()),
            io_class: v["io_class"].as_str().and_then(|s| s.parse().ok()),
            memory_max: v["memory_max"].as_u64(),
            cpu_weight: v["cpu_weight"].as_u64().and_then(|n| u32::try_from(n).ok()),
            pids_max: v["pids_max"].as_u64(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_round_trip_through_their_text() {
        let l = Limits {
            nice: Some(-3),
            io_class: Some(IoClass::BestEffort(6)),
            memory_max: Some(512 << 20),
            cpu_weight: Some(50),
            pids_max: Some(64),
        };
        assert_eq!(Limits::from_json(l.to_json().as_deref()), l);
        assert_eq!(Limits::default().to_json(), None);
        assert_eq!(Limits::from_json(None), Limits::default());
    }

    #[test]
    fn io_classes_parse_as_spelled() {
        assert_eq!("idle".parse::<IoClass>().ok(), Some(IoClass::Idle));
        assert_eq!(
            "best-effort".parse::<IoClass>().ok(),
            Some(IoClass::BestEffort(4))
        );
        assert_eq!(
            "best-effort:0".parse::<IoClass>().ok(),
            Some(IoClass::BestEffort(0))
        );
        assert!("best-effort:8".parse::<IoClass>().is_err());
        assert!("realtime".parse::<IoClass>().is_err());
        assert_eq!(IoClass::Idle.ioprio(), 3 << 13);
        assert_eq!(IoClass::BestEffort(7).ioprio(), (2 << 13) | 7);
    }
}
