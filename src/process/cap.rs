//! Manners and caps, the runner's side: which spawn applies them, what is in force where, and
//! whether an attempt was killed for its memory cap (see docs/manners.md). The child's side
//! (setpriority, ioprio_set, the cgroup files, the rlimits) is the keeper's (`keeper.c`).

use std::path::Path;

use super::cgroup::Containment;
use crate::manners::Limits;

/// Whether the runner's own spawn (`--no-keepers`) goes through the keeper's `exec` mode for
/// `l`: for anything but a CPU weight, which only a cgroup holds (and that spawn has none).
pub(super) fn needs_wrapper(l: &Limits) -> bool {
    l.nice.is_some() || l.io_class.is_some() || l.memory_max.is_some() || l.pids_max.is_some()
}

/// What a failed command that ran out of memory under `RLIMIT_DATA` says on stderr: glibc's
/// `strerror(ENOMEM)`, Python's `MemoryError`, C++'s `std::bad_alloc`, Rust's alloc error,
/// bash's `xmalloc`, and the "out of memory" of most others.
const ALLOCATION_FAILED: [&str; 6] = [
    "cannot allocate memory",
    "memoryerror",
    "bad_alloc",
    "memory allocation of",
    "xmalloc",
    "out of memory",
];

/// Whether an attempt with a memory cap that failed was killed for it: in its cgroup,
/// `memory.events` counts an `oom_kill` (the kernel says so); under `RLIMIT_DATA` nothing
/// kills, an allocation fails, and only the command's own stderr can say so (`stderr` is its
/// tail). A command that dies of its failed allocation without a word (a segfault on a NULL
/// from malloc) is a crash to leasehold.
pub(super) fn memory_exceeded(cgroup: Option<&Path>, stderr: &[u8]) -> bool {
    if cgroup.is_some_and(oom_killed) {
        return true;
    }
    let text = String::from_utf8_lossy(stderr).to_lowercase();
    ALLOCATION_FAILED.iter().any(|m| text.contains(m))
}

/// Whether the cgroup's OOM killer killed a process in it (`oom_kill` of `memory.events`).
fn oom_killed(cgroup: &Path) -> bool {
    std::fs::read_to_string(cgroup.join("memory.events")).is_ok_and(|text| {
        text.lines().any(|l| {
            l.strip_prefix("oom_kill ")
                .and_then(|n| n.trim().parse::<u64>().ok())
                .is_some_and(|n| n > 0)
        })
    })
}

/// Which way each cap is in force for a runner's attempts, for `status`: a cgroup file where
/// the keeper's node has the controller, else the rlimit, or nothing; with what was refused.
pub(crate) fn caps_in_force(containment: &Containment) -> String {
    let (enabled, refused) = match containment {
        Containment::Cgroup(node) => {
            let enabled =
                std::fs::read_to_string(node.join("cgroup.subtree_control")).unwrap_or_default();
            let offered = node
                .parent()
                .and_then(|p| std::fs::read_to_string(p.join("cgroup.controllers")).ok())
                .unwrap_or_default();
            let has = |c: &str| enabled.split_whitespace().any(|w| w == c);
            let missing: Vec<&str> = ["memory", "pids", "cpu"]
                .into_iter()
                .filter(|c| !has(c))
                .collect();
            let refused = (!missing.is_empty()).then(|| {
                format!(
                    "cgroup controllers {} refused: the node's parent offers {:?}",
                    missing.join(", "),
                    offered.trim()
                )
            });
            ((has("memory"), has("pids"), has("cpu")), refused)
        }
        Containment::Groups(_) => ((false, false, false), None),
    };
    let mut parts = [
        if enabled.0 {
            "memory by memory.max"
        } else {
            "memory by RLIMIT_DATA"
        },
        if enabled.1 {
            "pids by pids.max"
        } else {
            "pids by RLIMIT_NPROC"
        },
        if enabled.2 {
            "cpu weight by cpu.weight"
        } else {
            "cpu weight not in force"
        },
    ]
    .join(", ");
    if let Some(r) = refused {
        parts.push_str(&format!(" ({r})"));
    }
    format!("caps: {parts}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allocation_failure_on_stderr_is_a_memory_cap() {
        assert!(memory_exceeded(None, b"Traceback ...\nMemoryError\n"));
        assert!(memory_exceeded(None, b"head: Cannot allocate memory"));
        assert!(!memory_exceeded(None, b"segmentation fault"));
        assert!(!memory_exceeded(Some(Path::new("/no/such/cgroup")), b""));
    }

    #[test]
    fn an_oom_kill_in_memory_events_is_a_memory_cap() {
        // The kernel's file, as a cgroup with the memory controller has it (this machine may
        // have none to make a real one in: the runner tests say which).
        let dir = tempfile::tempdir().expect("a folder");
        let events = |text: &str| std::fs::write(dir.path().join("memory.events"), text);
        events("low 0\nhigh 0\nmax 3\noom 1\noom_kill 0\noom_group_kill 0\n").expect("write");
        assert!(!memory_exceeded(Some(dir.path()), b""));
        events("low 0\nhigh 0\nmax 9\noom 1\noom_kill 1\noom_group_kill 1\n").expect("write");
        assert!(memory_exceeded(Some(dir.path()), b"Killed"));
    }

    #[test]
    fn process_groups_take_every_cap_by_rlimit() {
        assert_eq!(
            caps_in_force(&Containment::Groups("no keepers".into())),
            "caps: memory by RLIMIT_DATA, pids by RLIMIT_NPROC, cpu weight not in force"
        );
    }
}
