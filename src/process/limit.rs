//! The runner's own resource limits.

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// Raises the soft limit on open descriptors to the hard limit, so that a runner with many
/// workers (two pipes, a pidfd and an eventfd per attempt) is not held to the default soft
/// 1024 when the system allows more. Nothing here uses `select`, which breaks past 1024.
/// Returns the soft limit now in force, or `None` when it cannot be read; a refusal is
/// logged and the runner goes on with the limit it has.
pub(crate) fn raise_nofile_limit() -> Option<u64> {
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(e) => {
            log::warn!("cannot read the open-descriptor limit: {e}");
            return None;
        }
    };
    if soft >= hard {
        return Some(soft);
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => {
            log::debug!("open-descriptor limit raised from {soft} to {hard}");
            Some(hard)
        }
        Err(e) => {
            log::warn!("cannot raise the open-descriptor limit from {soft} to {hard}: {e}");
            Some(soft)
        }
    }
}
