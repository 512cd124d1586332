//! Links the `leasehold` command as a position-dependent executable on Linux.
//!
//! A shell that feeds a runner one `leasehold jobs add` per job pays the command's start
//! every time, and a position-independent (PIE) binary of this size starts by applying
//! tens of thousands of relocations to a megabyte of tables, which copies and writes every
//! page of them. Linked with `-no-pie`, the linker resolves those addresses once, at build
//! time: `leasehold --version` makes about 155 page faults instead of 425 and costs about
//! what `/bin/true` does (README, Performance). What this gives up is the randomized load
//! address of the command's own code; its libraries, stack and heap are still randomized.
//! The library an application links is not affected: this applies to the `leasehold` binary
//! alone.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let linux = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux");
    let cli = std::env::var_os("CARGO_FEATURE_CLI").is_some();
    if linux && cli {
        println!("cargo:rustc-link-arg-bin=leasehold=-no-pie");
    }
}
