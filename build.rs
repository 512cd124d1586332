//! Builds the attempt keeper (`src/process/keeper.c`): a small C program that the library
//! embeds (`include_bytes!`) and starts from memory, so an embedder installs nothing.
//!
//! It is linked statically, so it maps no shared libraries and starts in a fraction of a
//! millisecond; where the C library has no static archive (no `libc.a`), it is linked
//! dynamically instead, with a warning.

use std::path::PathBuf;
use std::process::Command;

/// The keeper's source.
const SOURCE: &str = "src/process/keeper.c";
/// The name of the built program in `OUT_DIR`.
const PROGRAM: &str = "leasehold-keeper";

fn main() {
    println!("cargo:rerun-if-changed={SOURCE}");
    println!("cargo:rerun-if-changed=build.rs");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let program = out.join(PROGRAM);
    let compiler = cc::Build::new().cargo_metadata(false).get_compiler();
    let link = |extra: &[&str]| {
        let mut cmd = Command::new(compiler.path());
        cmd.args(["-Os", "-s", "-Wall", "-Wextra", "-Werror"])
            .args(extra)
            .arg("-o")
            .arg(&program)
            .arg(SOURCE);
        match cmd.status() {
            Ok(status) => status.success(),
            Err(e) => panic!("cannot run the C compiler {:?}: {e}", compiler.path()),
        }
    };
    if !link(&["-static"]) {
        println!(
            "cargo:warning=the attempt keeper could not be linked statically (is libc.a \
             installed?); it is linked dynamically and starts slower"
        );
        assert!(link(&[]), "the attempt keeper ({SOURCE}) does not compile");
    }
}
