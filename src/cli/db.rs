//! `leasehold db migrate` and `leasehold db version`.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use leasehold::{SCHEMA_VERSION, Store};
use serde_json::json;

use super::open_read_only;
use super::render::print_json;

/// Creates the schema or upgrades an older one, and says what it did.
pub fn migrate(db: &Path, json: bool) -> anyhow::Result<()> {
    let store = Store::open(db)?;
    let m = store.migration();
    let mut out = std::io::stdout().lock();
    if json {
        print_json(
            &mut out,
            &json!({"from": m.from, "to": m.to, "migrated": m.from != m.to}),
        )?;
    } else if m.from == m.to {
        writeln!(out, "schema is up to date (version {})", m.to)?;
    } else if m.from == 0 {
        writeln!(out, "created schema version {} in {}", m.to, db.display())?;
    } else {
        writeln!(out, "migrated schema from version {} to {}", m.from, m.to)?;
    }
    Ok(())
}

/// The file's schema version and the newest this build supports.
pub fn version(db: &Path, json: bool) -> anyhow::Result<()> {
    let store = open_read_only(db)?;
    let found = store
        .schema_version()
        .context("cannot read the schema version")?;
    let mut out = std::io::stdout().lock();
    if json {
        print_json(
            &mut out,
            &json!({"schema_version": found, "supported": SCHEMA_VERSION}),
        )?;
    } else {
        writeln!(
            out,
            "schema version {found} (this build supports version {SCHEMA_VERSION})"
        )?;
    }
    Ok(())
}
