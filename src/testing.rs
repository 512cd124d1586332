//! Helpers for testing an application that enqueues jobs (feature `testing`, for
//! `[dev-dependencies]`). For now the test databases' clocks: a store opened on a test
//! database's path reads its clock.

use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use crate::store::Clock;

/// The clocks of the live test databases, by the canonical path of each database's folder and
/// its file name.
static CLOCKS: Mutex<Vec<(PathBuf, Clock)>> = Mutex::new(Vec::new());

/// The clock of the test database at `path`, if it is one.
pub(crate) fn registered_clock(path: &Path) -> Option<Clock> {
    let clocks = CLOCKS.lock();
    if clocks.is_empty() {
        return None;
    }
    let key = canonical(path)?;
    clocks
        .iter()
        .find(|(p, _)| *p == key)
        .map(|(_, c)| c.clone())
}

/// `path` with its folder made canonical, or `None` when the folder does not exist.
fn canonical(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?;
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    Some(std::fs::canonicalize(folder).ok()?.join(name))
}
