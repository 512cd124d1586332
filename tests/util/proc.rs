//! What /proc says about processes: which are alive, which belong to a group, which carry a
//! run token.

/// One live (non-zombie) process: its pid and its process group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proc {
    pub pid: i32,
    pub pgid: i32,
}

/// Every live process, read from /proc (zombies are dead: they only wait to be reaped).
pub fn live_processes() -> Vec<Proc> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc")
        .expect("/proc is readable")
        .flatten()
    {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the command name, which may itself hold spaces and parentheses.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() > 2 && fields[0] != "Z" && fields[0] != "X" {
            let pgid = fields[2].parse().unwrap_or(0);
            out.push(Proc { pid, pgid });
        }
    }
    out
}

/// Whether `pid` is a live (non-zombie) process. Takes the database's `i64`, as
/// [`group_members`] does.
pub fn alive(pid: i64) -> bool {
    live_processes().iter().any(|p| i64::from(p.pid) == pid)
}

/// The live members of process group `pgid`.
pub fn group_members(pgid: i64) -> Vec<i32> {
    live_processes()
        .into_iter()
        .filter(|p| i64::from(p.pgid) == pgid)
        .map(|p| p.pid)
        .collect()
}

/// Whether process group `pgid` has a live member.
pub fn group_alive(pgid: i64) -> bool {
    !group_members(pgid).is_empty()
}

/// Live processes other than this one whose environment holds `entry` (`NAME=value`) exactly.
pub fn processes_with_env(entry: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    live_processes()
        .into_iter()
        .filter(|p| p.pid != me)
        .filter(|p| {
            std::fs::read(format!("/proc/{}/environ", p.pid))
                .map(|env| env.split(|b| *b == 0).any(|v| v == entry.as_bytes()))
                .unwrap_or(false)
        })
        .map(|p| p.pid)
        .collect()
}

/// Every live process whose environment carries `LEASEHOLD_RUN_TOKEN=token`: the attempt's
/// processes, wherever they moved (another group, another session).
pub fn token_holders(token: &str) -> Vec<i32> {
    processes_with_env(&format!("LEASEHOLD_RUN_TOKEN={token}"))
}

/// Whether a live process carries the run token `token`.
pub fn token_alive(token: &str) -> bool {
    !token_holders(token).is_empty()
}

/// Ends with SIGKILL, when dropped, every live process whose environment holds `entry`
/// (`NAME=value`, a test's marker): what a test's runners left behind, whatever happened.
pub struct EndMarked(pub String);

impl Drop for EndMarked {
    fn drop(&mut self) {
        for pid in processes_with_env(&self.0) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}
