//! What holds on this machine, for the conditions on jobs ([`crate::Condition`]): power from
//! `/sys/class/power_supply` as systemd's `ConditionACPower=` reads it, the network from
//! NetworkManager and idleness from logind over the system bus. See docs/conditions.md.

use std::path::Path;

use crate::condition::{BATTERY_LOW_PERCENT, Condition};

use super::dbus::{Bus, Value};

/// Where the kernel lists power supplies.
const POWER_SUPPLY: &str = "/sys/class/power_supply";

/// NetworkManager's `NMMetered` values that count as unmetered: `no` (2) and `guess-no` (4).
/// `unknown` (0), `yes` (1) and `guess-yes` (3) count as metered.
const UNMETERED: [u32; 2] = [2, 4];

/// NetworkManager's `NMConnectivityState` for full connectivity.
const CONNECTIVITY_FULL: u32 = 4;

/// What a look saw: the conditions that hold, and what it assumed where it could not tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Seen {
    /// The bits of the conditions that hold.
    pub held: u32,
    /// What was assumed, in words; empty when nothing was.
    pub note: String,
}

/// Looks at the machine's conditions, keeping a connection to the system bus between looks.
pub(crate) struct Probe {
    bus: Option<Bus>,
    /// Whether a condition that cannot be told (no NetworkManager, no logind) holds.
    assume_unknown: bool,
}

impl Probe {
    pub(crate) fn new(assume_unknown: bool) -> Probe {
        Probe {
            bus: None,
            assume_unknown,
        }
    }

    /// What holds now. Power is read from sysfs; the rest from the bus, connected again when
    /// the last look lost it. Never fails: what cannot be told is assumed, and said.
    pub(crate) fn look(&mut self) -> Seen {
        let power = power(Path::new(POWER_SUPPLY));
        let mut held = 0;
        if power.ac {
            held |= Condition::AcPower.bit();
        }
        if power.ac || !power.low {
            held |= Condition::BatteryNotLow.bit();
        }
        let mut notes = Vec::new();
        let assumed = if self.assume_unknown {
            "assumed to hold"
        } else {
            "assumed not to hold"
        };
        let nm = |bus: &mut Bus, name| {
            bus.get(
                "org.freedesktop.NetworkManager",
                "/org/freedesktop/NetworkManager",
                "org.freedesktop.NetworkManager",
                name,
            )
        };
        let network = self
            .bus()
            .and_then(|bus| Ok((nm(bus, "Metered")?, nm(bus, "Connectivity")?)));
        match network {
            Ok((metered, connectivity)) => {
                if matches!(metered, Value::U32(m) if UNMETERED.contains(&m)) {
                    held |= Condition::Unmetered.bit();
                }
                if connectivity == Value::U32(CONNECTIVITY_FULL) {
                    held |= Condition::Online.bit();
                }
            }
            Err(e) => {
                self.forget_on(&e);
                if self.assume_unknown {
                    held |= Condition::Unmetered.bit() | Condition::Online.bit();
                }
                notes.push(format!(
                    "NetworkManager not reachable ({e}): online and unmetered {assumed}"
                ));
            }
        }
        let idle = self.bus().and_then(|bus| {
            bus.get(
                "org.freedesktop.login1",
                "/org/freedesktop/login1",
                "org.freedesktop.login1.Manager",
                "IdleHint",
            )
        });
        match idle {
            Ok(v) => {
                if v == Value::Bool(true) {
                    held |= Condition::Idle.bit();
                }
            }
            Err(e) => {
                self.forget_on(&e);
                if self.assume_unknown {
                    held |= Condition::Idle.bit();
                }
                notes.push(format!("logind not reachable ({e}): idle {assumed}"));
            }
        }
        Seen {
            held,
            note: notes.join("; "),
        }
    }

    fn bus(&mut self) -> std::io::Result<&mut Bus> {
        if self.bus.is_none() {
            self.bus = Some(Bus::system()?);
        }
        self.bus
            .as_mut()
            .ok_or_else(|| std::io::Error::other("no bus"))
    }

    /// Drops the connection unless the bus itself answered the failed call.
    fn forget_on(&mut self, e: &std::io::Error) {
        if e.kind() != std::io::ErrorKind::NotFound {
            self.bus = None;
        }
    }
}

/// What the power supplies say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Power {
    /// On external power: some supply that is not a battery is online, or there is no
    /// system battery (systemd's `on_ac_power()`).
    pub ac: bool,
    /// Some system battery is below [`BATTERY_LOW_PERCENT`].
    pub low: bool,
}

/// Reads the power supplies under `root` as systemd's `on_ac_power()` does: a supply whose
/// `scope` is `Device` (a mouse's battery) is not the system's; a `Battery` counts as a
/// battery; any other type (`Mains`, `USB`, `Wireless`) whose `online` is 1 is external power.
pub(crate) fn power(root: &Path) -> Power {
    let read = |dir: &Path, name: &str| {
        std::fs::read_to_string(dir.join(name))
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    };
    let (mut online, mut battery, mut low) = (false, false, false);
    let Ok(entries) = std::fs::read_dir(root) else {
        return Power {
            ac: true,
            low: false,
        };
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        if read(&dir, "scope") == "Device" {
            continue;
        }
        if read(&dir, "type") == "Battery" {
            battery = true;
            if read(&dir, "capacity")
                .parse::<u32>()
                .is_ok_and(|c| c < BATTERY_LOW_PERCENT)
            {
                low = true;
            }
        } else if read(&dir, "online") == "1" {
            online = true;
        }
    }
    Power {
        ac: online || !battery,
        low,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn supply(root: &Path, name: &str, files: &[(&str, &str)]) {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        for (f, v) in files {
            std::fs::write(dir.join(f), format!("{v}\n")).unwrap();
        }
    }

    #[test]
    fn power_is_read_as_systemd_reads_it() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        // No supply at all: a desktop, on AC.
        assert_eq!(
            power(r),
            Power {
                ac: true,
                low: false
            }
        );
        supply(r, "BAT0", &[("type", "Battery"), ("capacity", "15")]);
        assert_eq!(
            power(r),
            Power {
                ac: false,
                low: true
            }
        );
        supply(r, "AC", &[("type", "Mains"), ("online", "1")]);
        assert_eq!(
            power(r),
            Power {
                ac: true,
                low: true
            }
        );
        supply(r, "AC", &[("type", "Mains"), ("online", "0")]);
        supply(r, "BAT0", &[("type", "Battery"), ("capacity", "20")]);
        assert_eq!(
            power(r),
            Power {
                ac: false,
                low: false
            }
        );
        // A mouse's battery is not the system's.
        supply(
            r,
            "hid-mouse",
            &[("type", "Battery"), ("scope", "Device"), ("capacity", "3")],
        );
        assert_eq!(
            power(r),
            Power {
                ac: false,
                low: false
            }
        );
    }
}
