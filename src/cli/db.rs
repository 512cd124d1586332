//! `leasehold db migrate` and `leasehold db version`.

use std::io::Write;
use std::path::Path;

use leasehold::{SCHEMA_VERSION, Store};
use serde_json::json;

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
    // Report the file's version whatever it is: an older or newer file is what an operator
    // runs this command to find out about.
    let found = leasehold::Store::probe_version(db)?;
    let mut out = std::io::stdout().lock();
    if json {
        print_json(
            &mut out,
            &json!({"schema_version": found, "supported": SCHEMA_VERSION}),
        )?;
    } else {
        let advice = if found < SCHEMA_VERSION {
            ": run `leasehold db migrate`"
        } else if found > SCHEMA_VERSION {
            ": written by a newer leasehold, which this build cannot use"
        } else {
            ""
        };
        writeln!(
            out,
            "schema version {found} (this build supports version {SCHEMA_VERSION}){advice}"
        )?;
    }
    Ok(())
}
