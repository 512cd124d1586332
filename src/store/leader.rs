//! Leadership of a kind of maintenance: one runner at a time prunes a PostgreSQL database.

use crate::error::Result;
use std::time::Duration;

use super::Store;
use crate::store::db::{Connection, OptionalExtension, Sql, params};

/// Takes or renews the lead of `role` for `holder` until `expires_at`, when nobody else holds
/// it unexpired at `now`; returns whether `holder` holds it. One statement: two runners
/// asking at once are ordered by the row's lock, and the second finds the first's lead.
/// Parameters: role, holder, expiry, now.
const LEAD_SQL: Sql = Sql::postgres_only(
    "INSERT INTO leaders (role, holder, expires_at) VALUES (?1, ?2, ?3)
     ON CONFLICT (role) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
     WHERE leaders.holder = excluded.holder OR leaders.expires_at <= ?4
     RETURNING holder",
);

/// See [`Store::lead`](super::Store::lead). Always `true` on SQLite, whose single writer
/// already runs one runner's maintenance at a time.
pub(super) fn lead(
    conn: &Connection,
    role: &str,
    holder: &str,
    ttl_ms: i64,
    now: i64,
) -> Result<bool> {
    if conn.sqlite().is_some() {
        return Ok(true);
    }
    let now = conn.now(now)?;
    let held: Option<String> = conn
        .prepare_cached(&LEAD_SQL)?
        .query_row(
            params![role, holder, now.saturating_add(ttl_ms), now],
            |r| r.get(0),
        )
        .optional()?;
    Ok(held.is_some())
}

/// The statements of this file that are `const` items or built at run time (with
/// representative inputs), for the test that prepares every statement (`store/statements.rs`).
#[cfg(test)]
pub(super) fn statements() -> Vec<(&'static str, Sql)> {
    vec![("LEAD_SQL", LEAD_SQL)]
}

impl Store {
    /// Takes or renews the lead of the maintenance `role` (`"prune"`) for the runner
    /// `holder` for `ttl`, unless another holds it unexpired; returns whether `holder` leads.
    /// On PostgreSQL, runners on many hosts share one database: the one that leads does the
    /// role's work, and another takes over once a lead is not renewed in time (its runner
    /// died or was cut off). The work stays safe if two do it (a lead taken over while its
    /// holder still runs). On SQLite always `true`.
    ///
    /// # Errors
    ///
    /// A database error.
    pub fn lead(&self, role: &str, holder: &str, ttl: Duration, now: i64) -> Result<bool> {
        let ttl = crate::job::duration_ms(ttl);
        self.write(|c| lead(c, role, holder, ttl, now))
    }
}
