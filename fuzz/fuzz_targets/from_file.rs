//! `leasehold jobs add --from-file`: a file's non-empty lines, each a shell command, enqueued
//! in one transaction on a real SQLite store, and read back as written.
#![no_main]
use leasehold::{Job, Store};
use libfuzzer_sys::fuzz_target;

thread_local! {
    /// One store for the whole run (a connection is not shared between threads).
    static STORE: Store = {
        let dir = std::env::temp_dir().join(format!("leasehold-fuzz-from-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary folder");
        Store::open(dir.join("jobs.db")).expect("a store")
    };
}

fuzz_target!(|bytes: &[u8]| STORE.with(|store| {
    // As the command reads the file (src/cli/jobs.rs, `read_lines`).
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let jobs: Vec<Job> = lines.iter().map(|l| Job::shell(*l)).collect();
    let Ok(ids) = store.enqueue_many(&jobs) else {
        // Refused whole: a line with a NUL byte.
        assert!(lines.iter().any(|l| l.contains('\0')), "{lines:?} refused");
        return;
    };
    for (id, line) in ids.iter().zip(&lines) {
        let job = store.job(*id).expect("an enqueued job reads back");
        assert_eq!(job.argv, ["sh", "-c", line], "job {id}");
    }
}));
