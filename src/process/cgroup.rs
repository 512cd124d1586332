//! The cgroup mode: each attempt in a cgroup v2 of its own, where the system gives one.
//!
//! Where the runner's own cgroup v2 folder is writable (root, or a systemd unit or scope
//! with `Delegate=yes`), its keeper makes a node beside it, moves itself into the node's
//! `keeper` leaf, and starts every command in the node's `a-<TOKEN>` cgroup:
//!
//! ```text
//! <runner's cgroup>/leasehold-keeper-<keeper pid>/keeper      the keeper
//! <runner's cgroup>/leasehold-keeper-<keeper pid>/a-<TOKEN>   an attempt's processes
//! ```
//!
//! An attempt's processes are then exactly its cgroup's `cgroup.procs`, whatever they did to
//! their group, session or environment; its teardown is a write to `cgroup.kill`. The node
//! itself holds no process, so that a later issue can enable controllers in it (caps per
//! attempt). Elsewhere (no cgroup v2, a folder not delegated, `LEASEHOLD_CGROUPS=off`),
//! attempts are contained by process groups, pidfds and the run token, as before.

use std::io;
use std::path::{Path, PathBuf};

use nix::sys::signal::Signal;

/// The environment variable that turns the cgroup mode off (`off`).
pub(crate) const SWITCH: &str = "LEASEHOLD_CGROUPS";

/// The prefix of a keeper's node.
const NODE_PREFIX: &str = "leasehold-keeper-";

/// The leaf of a keeper's node that holds the keeper itself.
const KEEPER_LEAF: &str = "keeper";

/// How a runner's attempts are contained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Containment {
    /// Each attempt in a cgroup of its own under this node (the keeper's).
    Cgroup(PathBuf),
    /// Process groups, pidfds and the run token; and why not cgroups.
    Groups(String),
}

impl Containment {
    /// One line for `status` and the log: `cgroup /sys/fs/cgroup/…` or `process groups
    /// (why)`.
    pub(crate) fn describe(&self) -> String {
        match self {
            Containment::Cgroup(node) => format!("cgroup {}", node.display()),
            Containment::Groups(why) => format!("process groups ({why})"),
        }
    }

    /// The cgroup of the attempt with `token`, in the cgroup mode.
    pub(crate) fn attempt(&self, token: &str) -> Option<PathBuf> {
        match self {
            Containment::Cgroup(node) => Some(attempt_in(node, token)),
            Containment::Groups(_) => None,
        }
    }
}

/// The name of an attempt's cgroup in its keeper's node.
fn attempt_in(node: &Path, token: &str) -> PathBuf {
    node.join(format!("a-{token}"))
}

/// The cgroup v2 folder this process is in, where its keeper makes its node; or why there
/// is none. Whether it is writable is the keeper's to find out (it makes the node).
pub(crate) fn base() -> Result<PathBuf, String> {
    if std::env::var_os(SWITCH).is_some_and(|v| v == "off") {
        return Err(format!("turned off by {SWITCH}=off"));
    }
    let mount = v2_mount_here()?;
    let own = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("/proc/self/cgroup: {e}"))?;
    let path = v2_path(&own).ok_or("this process is in no cgroup v2")?;
    let base = mount.join(path.trim_start_matches('/'));
    if !base.is_dir() {
        return Err(format!("{} is not a folder here", base.display()));
    }
    Ok(base)
}

/// The mount point of this process's cgroup v2 hierarchy, read once: every teardown asks.
fn v2_mount_here() -> Result<&'static Path, String> {
    static MOUNT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    MOUNT
        .get_or_init(|| {
            let mounts = std::fs::read_to_string("/proc/self/mountinfo")
                .map_err(|e| format!("/proc/self/mountinfo: {e}"))?;
            v2_mount(&mounts).ok_or_else(|| "no cgroup v2 hierarchy is mounted".to_owned())
        })
        .as_deref()
        .map_err(Clone::clone)
}

/// The mount point of the cgroup v2 hierarchy in a `/proc/PID/mountinfo` text.
fn v2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        // ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
        let (left, right) = line.split_once(" - ")?;
        if right.split(' ').next()? != "cgroup2" {
            return None;
        }
        let point = left.split(' ').nth(4)?;
        Some(PathBuf::from(unescape_octal(point)))
    })
}

/// A mountinfo field with its `\040`-style escapes undone.
fn unescape_octal(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 4 <= bytes.len()
            && field.is_char_boundary(i + 4)
            && let Ok(code) = u8::from_str_radix(&field[i + 1..i + 4], 8)
        {
            out.push(code);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A process's cgroup v2 path (the `0::PATH` line of `/proc/PID/cgroup`).
fn v2_path(cgroup: &str) -> Option<&str> {
    cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .filter(|p| p.starts_with('/') && !p.ends_with(" (deleted)"))
}

/// The pids in a cgroup (`cgroup.procs`); none when it is gone.
pub(crate) fn members(cgroup: &Path) -> Vec<i32> {
    std::fs::read_to_string(cgroup.join("cgroup.procs"))
        .map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// Whether a live process is in the cgroup or below it (`populated 1` of `cgroup.events`).
/// A cgroup that is gone is not.
pub(crate) fn populated(cgroup: &Path) -> bool {
    std::fs::read_to_string(cgroup.join("cgroup.events"))
        .is_ok_and(|text| text.lines().any(|l| l.trim() == "populated 1"))
}

/// Kills every process in the cgroup and below it at once (`cgroup.kill`, Linux 5.14);
/// where the file is missing, SIGKILL to each member in turn until none is left (a fork
/// racing the loop is caught by the next turn). A cgroup that is gone is not an error.
pub(crate) fn kill(cgroup: &Path) -> io::Result<()> {
    match std::fs::write(cgroup.join("cgroup.kill"), b"1") {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound && !cgroup.exists() => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            for _ in 0..100 {
                let pids = members(cgroup);
                if pids.is_empty() {
                    break;
                }
                for pid in pids {
                    // Still in the cgroup as it is read: the attempt's, whatever its pid.
                    let _ =
                        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Removes a cgroup and the cgroups below it (a runner run as a job leaves its keeper's
/// node in the attempt's); one that is gone already is no error, one with a process still in
/// it (EBUSY) is.
pub(crate) fn remove(cgroup: &Path) -> io::Result<()> {
    remove_tree(cgroup, 0)
}

fn remove_tree(cgroup: &Path, depth: usize) -> io::Result<()> {
    match std::fs::remove_dir(cgroup) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(_) if depth < 32 => {}
        other => return other,
    }
    if let Ok(entries) = std::fs::read_dir(cgroup) {
        for e in entries.filter_map(|e| e.ok()) {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = remove_tree(&e.path(), depth + 1);
            }
        }
    }
    match std::fs::remove_dir(cgroup) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// The cgroups of the attempt with `token` that this process can find: in the nodes of the
/// keepers under its own cgroup v2 folder, and the cgroups `pids` are in, when that is the
/// attempt's (named `a-<TOKEN>`).
pub(crate) fn of_attempt(token: &str, pids: &[i32]) -> Vec<PathBuf> {
    let name = format!("a-{token}");
    let mut found: Vec<PathBuf> = Vec::new();
    if let Ok(base) = base() {
        for node in nodes(&base) {
            let dir = node.join(&name);
            if dir.is_dir() {
                found.push(dir);
            }
        }
    }
    if let Ok(mount) = v2_mount_here() {
        for pid in pids {
            let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
                continue;
            };
            let Some(path) = v2_path(&text) else {
                continue;
            };
            let dir = mount.join(path.trim_start_matches('/'));
            if dir.file_name().is_some_and(|n| *n == *name) && !found.contains(&dir) {
                found.push(dir);
            }
        }
    }
    found
}

/// The keepers' nodes in `base`.
fn nodes(base: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(base) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(NODE_PREFIX))
        })
        .map(|e| e.path())
        .collect()
}

/// Removes the empty cgroups that keepers no longer running left in `base`: a keeper that
/// was killed removes nothing. A node is a live keeper's while its `keeper` leaf holds a
/// process, which holds in any PID namespace: the pid in a node's name is the keeper's in
/// its own namespace, and may be another process's here. A node younger than `settle` is
/// left alone too, whatever its leaf holds: its keeper may not have moved into it yet.
/// An attempt's cgroup with processes in it stays (the attempt is torn down by whoever
/// reclaims it, which removes it then), and so does its node.
pub(crate) fn sweep(base: &Path, settle: std::time::Duration) {
    for node in nodes(base) {
        if populated(&node.join(KEEPER_LEAF)) {
            continue;
        }
        let young = std::fs::metadata(&node)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_none_or(|age| age < settle);
        if young {
            continue;
        }
        remove_node(&node);
    }
}

/// Removes a keeper's node, once its keeper is gone: the cgroups in it with no process left,
/// then itself if that left it empty.
pub(crate) fn remove_node(node: &Path) {
    let _ = remove(node);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_v2_mount_in_a_hybrid_layout() {
        let text = "30 24 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n\
                    31 30 0:27 / /sys/fs/cgroup/unified rw,relatime shared:8 - cgroup2 cgroup2 rw\n\
                    32 30 0:28 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n";
        assert_eq!(
            v2_mount(text),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            v2_mount("32 30 0:28 / /x rw - cgroup cgroup rw,cpu\n"),
            None
        );
        assert_eq!(
            v2_mount("1 2 0:1 / /with\\040space rw - cgroup2 none rw\n"),
            Some(PathBuf::from("/with space"))
        );
    }

    #[test]
    fn reads_the_v2_path_and_ignores_v1_lines() {
        assert_eq!(v2_path("4:memory:/x\n0::/a/b\n"), Some("/a/b"));
        assert_eq!(v2_path("4:memory:/x\n"), None);
        assert_eq!(v2_path("0::/gone (deleted)\n"), None);
    }
}
