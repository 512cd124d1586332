//! Compiles the keeper's C parsers (`src/process/keeper_parse.h`, behind the C ABI of
//! `keeper_parse.c`, with `KP_FUZZ` for names of its own) into the fuzz targets, so that they
//! are fed the same bytes as the Rust side's decoders.
//!
//! No clang here: gcc cannot build libFuzzer's edge coverage (`trace-pc-guard`), but it can
//! call libFuzzer's comparison hooks (`-fsanitize-coverage=trace-cmp`, whose operands feed
//! libFuzzer's table of compared values), so the C parsers' own comparisons guide the
//! mutations; the edges come from the Rust decoder of the same grammar. Under ASan (`cargo
//! fuzz`'s default) the C code is built with gcc's ASan too, reporting to the runtime rustc
//! links.

fn main() {
    for file in [
        "../src/process/keeper_parse.c",
        "../src/process/keeper_parse.h",
    ] {
        println!("cargo:rerun-if-changed={file}");
    }
    println!("cargo:rerun-if-changed=build.rs");
    let sanitizers = std::env::var("CARGO_CFG_SANITIZE").unwrap_or_default();
    let mut build = cc::Build::new();
    build
        .file("../src/process/keeper_parse.c")
        .define("KP_FUZZ", None)
        .opt_level(1)
        .flag("-fsanitize-coverage=trace-cmp");
    if sanitizers.split(',').any(|s| s == "address") {
        build
            .flag("-fsanitize=address")
            .flag("-fno-omit-frame-pointer");
    }
    build.compile("leasehold_fuzz_keeper_parse");
}
