//! A hand-off request datagram, from any local process of the same user, answered by a
//! runner on a real SQLite store.
#![no_main]
use leasehold::Store;
use libfuzzer_sys::fuzz_target;

thread_local! {
    /// One store for the whole run (a connection is not shared between threads).
    static STORE: Store = {
        let dir = std::env::temp_dir().join(format!("leasehold-fuzz-handoff-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary folder");
        Store::open(dir.join("jobs.db")).expect("a store")
    };
}

fuzz_target!(|request: &[u8]| {
    STORE.with(|store| leasehold::fuzzing::handoff(store, request, 1_700_000_000_000));
});
