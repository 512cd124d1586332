//! `leasehold db migrate`, `leasehold db version`, `leasehold db vacuum`, `leasehold db prune`
//! and `leasehold db check`.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use leasehold::{OpenOptions, PruneOptions, PruneReport, Retention, SCHEMA_VERSION, Store};
use serde_json::json;

use super::progress;
use super::render::print_json;
use super::{open_existing, open_read_only};

/// Creates the schema or upgrades an older one, and says what it did. The upgrade of a
/// version-1 file is refused beside a live runner unless `force`.
pub fn migrate(db: &Path, json: bool, force: bool) -> anyhow::Result<()> {
    let started = Instant::now();
    // Creating or upgrading is quick, except the one-time VACUUM of a version-1 file.
    let options = OpenOptions::new().convert_beside_runners(force);
    let store = progress::spin_while("migrating the schema", || Store::open_with(db, &options))?;
    let m = store.migration();
    // The library logs the migration itself; this covers the whole command (opening too).
    let elapsed_ms = started.elapsed().as_millis();
    log::info!("db migrate took {elapsed_ms} ms");
    let mut out = std::io::stdout().lock();
    if json {
        print_json(
            &mut out,
            &json!({"from": m.from, "to": m.to, "migrated": m.from != m.to}),
        )?;
    } else if m.from == m.to {
        writeln!(out, "schema is up to date (version {})", m.to)?;
    } else if m.from == 0 {
        writeln!(
            out,
            "created schema version {} in {}",
            m.to,
            leasehold::redacted_db(db)
        )?;
    } else {
        writeln!(
            out,
            "migrated schema from version {} to {} in {elapsed_ms} ms",
            m.from, m.to
        )?;
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

/// Compacts the whole file with a full VACUUM and prints its size before and after; refused
/// beside a live runner unless `force`.
pub fn vacuum(db: &Path, json: bool, force: bool) -> anyhow::Result<()> {
    let store = super::open_existing(db)?;
    let report = progress::spin_while("vacuuming", || {
        if force {
            store.vacuum_forced()
        } else {
            store.vacuum()
        }
    })?;
    log::info!(
        "vacuum {}: {} bytes before, {} after",
        leasehold::redacted_db(db),
        report.bytes_before,
        report.bytes_after
    );
    let mut out = std::io::stdout().lock();
    if json {
        print_json(
            &mut out,
            &json!({"bytes_before": report.bytes_before, "bytes_after": report.bytes_after}),
        )?;
    } else {
        writeln!(
            out,
            "vacuumed {}: {} bytes before, {} bytes after",
            leasehold::redacted_db(db),
            report.bytes_before,
            report.bytes_after
        )?;
    }
    Ok(())
}

/// Prunes finished jobs past `policy` now (or counts them, for a dry run), removes the output
/// files of the jobs that are gone, and says how many and how the file's size (main file and
/// WAL) changed.
pub fn prune(db: &Path, policy: &Retention, dry_run: bool, json: bool) -> anyhow::Result<()> {
    // A dry run must not change a byte: no migration either.
    let store = if dry_run {
        open_read_only(db)?
    } else {
        open_existing(db)?
    };
    let on_disk = || store.size().map(|s| s.bytes + s.wal_bytes);
    let before = on_disk()?;
    let report = if dry_run || !progress::on_terminal() {
        store.prune_with(policy, &PruneOptions::default().dry_run(dry_run))?
    } else {
        prune_showing_progress(&store, policy)?
    };
    // The output files of every job that is gone, pruned now or before (by a runner that
    // stopped before it removed them).
    let files_removed = if dry_run {
        0
    } else {
        store.remove_orphan_files(None)?
    };
    let after = on_disk()?;
    let mut out = std::io::stdout().lock();
    if json {
        print_json(
            &mut out,
            &json!({
                "pruned": report.jobs,
                "dry_run": dry_run,
                "bytes_before": before,
                "bytes_after": after,
                "files_removed": files_removed,
            }),
        )?;
    } else if dry_run {
        writeln!(out, "would prune {} jobs", report.jobs)?;
    } else {
        writeln!(
            out,
            "pruned {} jobs ({before} bytes before, {after} after)",
            report.jobs
        )?;
    }
    Ok(())
}

/// The same prune, a batch at a time under a bar of the jobs due, then the vacuum and
/// checkpoint under a spinner. Every call uses the same `now`, so the jobs due stay the
/// same ones.
fn prune_showing_progress(store: &Store, policy: &Retention) -> anyhow::Result<PruneReport> {
    let now = store.clock().now_ms();
    let due = store
        .prune_at(policy, &PruneOptions::default().dry_run(true), now)?
        .jobs;
    let bar = progress::Bar::new(due, "jobs pruned");
    let one_batch = PruneOptions::default()
        .max_batches(Some(1))
        .max_vacuum_steps(Some(0));
    let mut total = PruneReport::default();
    loop {
        let step = store.prune_at(policy, &one_batch, now);
        let step = match step {
            Ok(r) => r,
            Err(e) => {
                bar.finish();
                return Err(e.into());
            }
        };
        bar.inc(step.jobs);
        total.jobs += step.jobs;
        total.batches += step.batches;
        total.events += step.events;
        total.outputs += step.outputs;
        if !step.more || step.jobs == 0 {
            break;
        }
    }
    bar.finish();
    // No batch more: free the pages and checkpoint, as a whole prune ends.
    let last = progress::spin_while("giving free pages back", || {
        store.prune_at(policy, &PruneOptions::default().max_batches(Some(0)), now)
    })?;
    total.bytes_freed = last.bytes_freed;
    total.wal_truncated = last.wal_truncated;
    Ok(total)
}

/// SQLite's integrity check of the file, read-only: prints what it found; a damaged file is
/// an error (exit 3) after the findings.
pub fn check(db: &Path, quick: bool, json: bool) -> anyhow::Result<()> {
    let found = Store::check(db, quick)?;
    let ok = found.len() == 1 && found[0] == "ok";
    let mut out = std::io::stdout().lock();
    if json {
        print_json(&mut out, &json!({"ok": ok, "found": found}))?;
    } else {
        for line in &found {
            writeln!(out, "{line}")?;
        }
    }
    if ok {
        return Ok(());
    }
    let what = format!(
        "SQLite's {} check found {} problem{}",
        if quick { "quick" } else { "integrity" },
        found.len(),
        if found.len() == 1 { "" } else { "s" }
    );
    Err(super::Damaged::advice(db, &what).into())
}
