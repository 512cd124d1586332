//! In which zone the pages show times: UTC unless the viewer chose a zone (a cookie set by
//! `GET /times?zone=NAME`). The server cannot know the browser's zone without a script, and
//! the pages run none, so the viewer names it once, or picks this machine's.

use jiff::Timestamp;
use jiff::tz::TimeZone;

use super::http::{Request, Response};

/// The cookie that keeps the viewer's zone.
pub const COOKIE: &str = "leasehold_times";
/// The longest zone name taken (the tz database's longest is about 30 characters).
const MAX_ZONE_LEN: usize = 64;

/// The zone times are shown in.
pub struct Times {
    /// `None` for UTC; else the IANA name and its zone.
    zone: Option<(String, TimeZone)>,
}

impl Times {
    /// Times in UTC.
    pub fn utc() -> Times {
        Times { zone: None }
    }

    /// The zone the request's cookie names; UTC without one, or when the zone is no longer
    /// known (the cookie outlives a change of the tz database).
    pub fn of(req: &Request) -> Times {
        req.cookies_named(COOKIE)
            .next()
            .and_then(zone)
            .map_or_else(Times::utc, |zone| Times { zone })
    }

    /// The zone's name: `UTC` or the IANA name.
    pub fn name(&self) -> &str {
        self.zone.as_ref().map_or("UTC", |(name, _)| name)
    }

    /// A time with milliseconds: `2026-12-01T11:17:03.038Z` in UTC, else
    /// `2026-12-01 16:47:03.038 +05:30` in the chosen zone.
    pub fn at(&self, ms: i64) -> String {
        match (&self.zone, Timestamp::from_millisecond(ms)) {
            (Some((_, tz)), Ok(t)) => t
                .to_zoned_datetime(tz.clone())
                .strftime("%Y-%m-%d %H:%M:%S%.3f %:z")
                .to_string(),
            _ => crate::cli::render::time(ms),
        }
    }

    /// A chart's clock: `HH:MM` (with `MM-DD ` before it when `with_date`), and seconds when
    /// they are not 0.
    pub fn clock(&self, ms: i64, with_date: bool) -> String {
        let Ok(t) = Timestamp::from_millisecond(ms) else {
            return ms.to_string();
        };
        let tz = self
            .zone
            .as_ref()
            .map_or(TimeZone::UTC, |(_, tz)| tz.clone());
        let mut format = String::new();
        if with_date {
            format.push_str("%m-%d ");
        }
        format.push_str(if ms % 60_000 == 0 {
            "%H:%M"
        } else {
            "%H:%M:%S"
        });
        t.to_zoned_datetime(tz).strftime(&format).to_string()
    }
}

/// The zone named `name` in the system's tz database, spelled as the database spells it;
/// `Some(None)` for UTC, `None` for a name it does not know.
fn zone(name: &str) -> Option<Option<(String, TimeZone)>> {
    if name == "UTC" {
        return Some(None);
    }
    if name.is_empty() || name.len() > MAX_ZONE_LEN {
        return None;
    }
    let tz = jiff::tz::db().get(name).ok()?;
    (tz.iana_name() == Some(name)).then(|| Some((name.to_string(), tz)))
}

/// This machine's zone, when it has an IANA name and is not UTC: offered beside UTC on every
/// page. As the C library finds it: `TZ` (`Europe/Berlin` or `:Europe/Berlin`), else the
/// zone file `/etc/localtime` links to (`…/zoneinfo/Europe/Berlin`).
pub fn system_zone() -> Option<String> {
    let from_env = std::env::var("TZ")
        .ok()
        .map(|tz| tz.trim_start_matches(':').to_string());
    let name = from_env.or_else(|| {
        let target = std::fs::read_link("/etc/localtime").ok()?;
        let target = target.to_str()?;
        let (_, name) = target.split_once("zoneinfo/")?;
        Some(name.to_string())
    })?;
    // UTC under another name is UTC, which every page offers already.
    const UTC_ALIASES: [&str; 7] = [
        "Etc/UTC",
        "Etc/UCT",
        "Etc/Universal",
        "Etc/Zulu",
        "UCT",
        "Universal",
        "Zulu",
    ];
    if UTC_ALIASES.contains(&name.as_str()) {
        return None;
    }
    zone(&name).flatten().map(|(name, _)| name)
}

/// `GET /times?zone=NAME&back=PATH`: keeps the zone in a cookie and goes back to `PATH` (a
/// path of this server; the overview otherwise). An unknown zone is a 400 that names it.
pub fn choose(req: &Request) -> Response {
    let param = |key: &str| {
        req.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.trim())
    };
    let name = param("zone").unwrap_or("");
    if zone(name).is_none() {
        return super::error_page(
            400,
            &format!(
                "{name:?} is not a time zone this machine knows: give an IANA name as the tz \
                 database spells it (Europe/Berlin, America/New_York) or UTC"
            ),
        );
    }
    // Only a path of this server: `//host` or a full URL would send the viewer elsewhere.
    let back = param("back")
        .filter(|b| b.starts_with('/') && !b.starts_with("//") && !b.contains('\\'))
        .unwrap_or("/");
    Response::see_other(back.to_string()).header(
        "Set-Cookie",
        format!("{COOKIE}={name}; HttpOnly; SameSite=Strict; Path=/; Max-Age=31536000"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_show_in_utc_unless_a_known_zone_is_chosen() {
        assert_eq!(Times::utc().at(0), "1970-01-01T00:00:00.000Z");
        let kolkata = Times {
            zone: zone("Asia/Kolkata").expect("known"),
        };
        assert_eq!(kolkata.name(), "Asia/Kolkata");
        assert_eq!(kolkata.at(1_500), "1970-01-01 05:30:01.500 +05:30");
        assert_eq!(kolkata.clock(0, false), "05:30");
        assert_eq!(kolkata.clock(1_000, true), "01-01 05:30:01");
        assert_eq!(Times::utc().clock(3_600_000, false), "01:00");
        assert!(zone("Mars/Olympus").is_none());
        assert!(
            zone("asia/kolkata").is_none(),
            "spelled as the database spells it"
        );
        assert!(zone("").is_none());
        assert_eq!(zone("UTC").map(|z| z.is_none()), Some(true));
    }
}
