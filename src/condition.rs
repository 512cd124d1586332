//! Conditions on a job: what must hold on the runner's machine for it to start (on AC power,
//! on an unmetered network, the user idle), and what happens when one stops holding while it
//! runs. A job's conditions are stored as a bit mask (`jobs.conditions`), so that a claim
//! leaves out, in one integer test, every job that needs one that does not hold now.

use crate::error::{Error, Result};

/// Something that must hold for a job to start, as the runner sees it (see
/// `docs/conditions.md` for what each reads and the platform it mirrors).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Condition {
    /// On external power: some `Mains`, `USB` or `Wireless` supply under
    /// `/sys/class/power_supply` is online, or the machine has no battery at all
    /// (systemd's `ConditionACPower=true`).
    AcPower,
    /// On external power, or every system battery at [`BATTERY_LOW_PERCENT`] or more.
    BatteryNotLow,
    /// NetworkManager's `Metered` is `no` or `guess-no` (`yes`, `guess-yes` and `unknown`
    /// count as metered).
    Unmetered,
    /// NetworkManager's `Connectivity` is `full` (4).
    Online,
    /// logind's `IdleHint` is true: every session has been idle for its idle time.
    Idle,
}

/// A battery below this charge (in percent) is low, unless the machine is on external power:
/// Android's "battery low" broadcast, which WorkManager's `requiresBatteryNotLow` follows,
/// fires at 15 %; GNOME and UPower warn at 20 % (`PercentageLow`). We take the latter.
pub const BATTERY_LOW_PERCENT: u32 = 20;

impl Condition {
    /// Every condition, in the order they are listed.
    pub const ALL: [Condition; 5] = [
        Condition::AcPower,
        Condition::BatteryNotLow,
        Condition::Unmetered,
        Condition::Online,
        Condition::Idle,
    ];

    /// The condition's name, as `jobs add --when` takes it and `waiting_for` shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Condition::AcPower => "ac-power",
            Condition::BatteryNotLow => "battery-not-low",
            Condition::Unmetered => "unmetered",
            Condition::Online => "online",
            Condition::Idle => "idle",
        }
    }

    /// Its bit in the `conditions` column.
    pub(crate) fn bit(self) -> u32 {
        match self {
            Condition::AcPower => 1,
            Condition::BatteryNotLow => 2,
            Condition::Unmetered => 4,
            Condition::Online => 8,
            Condition::Idle => 16,
        }
    }
}

/// Every condition's bit.
pub(crate) const ALL_CONDITIONS: u32 = 31;

/// The conditions of a mask, in [`Condition::ALL`] order.
pub(crate) fn from_mask(mask: u32) -> Vec<Condition> {
    Condition::ALL
        .into_iter()
        .filter(|c| mask & c.bit() != 0)
        .collect()
}

impl std::fmt::Display for Condition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Condition {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Condition::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| {
                Error::invalid(
                    "when",
                    format!(
                        "{s:?} is not one of ac-power, battery-not-low, unmetered, online, idle"
                    ),
                )
            })
    }
}

/// What happens to a running job when one of its conditions stops holding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WhenLost {
    /// It runs on. The default: a started job is not wasted.
    #[default]
    Run,
    /// It is stopped as a shutdown stops it (SIGTERM, the kill grace, SIGKILL) and put back
    /// to wait for its conditions, without spending an attempt or its recovery budget
    /// (WorkManager's behaviour).
    Stop,
}

impl WhenLost {
    /// The policy as stored in the `when_lost` column.
    pub fn as_str(self) -> &'static str {
        match self {
            WhenLost::Run => "run",
            WhenLost::Stop => "stop",
        }
    }
}

impl std::str::FromStr for WhenLost {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "run" => Ok(WhenLost::Run),
            "stop" => Ok(WhenLost::Stop),
            _ => Err(Error::invalid(
                "when_lost",
                format!("{s:?} is not one of run, stop"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_bits_round_trip() {
        for c in Condition::ALL {
            assert_eq!(c.as_str().parse::<Condition>().unwrap(), c);
            assert_eq!(from_mask(c.bit()), [c]);
        }
        assert_eq!(
            Condition::ALL.iter().fold(0, |m, c| m | c.bit()),
            ALL_CONDITIONS
        );
        assert!("charging".parse::<Condition>().is_err());
    }
}
