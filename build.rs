//! Builds the attempt keeper (`src/process/keeper.c`): a small C program that the library
//! embeds (`include_bytes!`) and starts from memory, so an embedder installs nothing.
//!
//! It is built by the `cc` crate's own command for the target (its `--target`, `-m32`, sysroot
//! and `CFLAGS`), so a cross build embeds a keeper for the target, and the built program's ELF
//! header is checked against the target before it is embedded. Warnings fail the build only
//! where `CI` is set: a library's build script must not break downstream builds on the next
//! compiler's new warnings.
//!
//! The keeper's parsers (`src/process/keeper_parse.h`) are also compiled on their own, behind
//! a C ABI (`src/process/keeper_parse.c`), into a static library that only the library's tests
//! call: they hold the C parsers to the Rust side's grammar. Nothing else references it, so
//! the linker leaves it out of every other build.
//!
//! It is linked statically, so it maps no shared libraries and starts in a fraction of a
//! millisecond; where the C library has no static archive (no `libc.a`), it is linked
//! dynamically instead, with a warning.

use std::path::{Path, PathBuf};

/// The keeper's source.
const SOURCE: &str = "src/process/keeper.c";
/// The keeper's parsers, included by [`SOURCE`].
const PARSERS: &str = "src/process/keeper_parse.h";
/// The parsers behind a C ABI, for the tests.
const PARSERS_ABI: &str = "src/process/keeper_parse.c";
/// The name of the built program in `OUT_DIR`.
const PROGRAM: &str = "leasehold-keeper";

fn main() {
    println!("cargo:rerun-if-changed={SOURCE}");
    println!("cargo:rerun-if-changed={PARSERS}");
    println!("cargo:rerun-if-changed={PARSERS_ABI}");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CI");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let program = out.join(PROGRAM);
    let compiler = cc::Build::new().cargo_metadata(false).get_compiler();
    let strict = std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false");
    let link = |extra: &[&str]| {
        let mut cmd = compiler.to_command();
        cmd.args(["-Os", "-s", "-Wall", "-Wextra"]);
        if strict {
            cmd.arg("-Werror");
        }
        cmd.args(extra).arg("-o").arg(&program).arg(SOURCE);
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
    if let Err(e) = check_machine(&program) {
        panic!("the attempt keeper built by {:?} {e}", compiler.path());
    }
    cc::Build::new()
        .file(PARSERS_ABI)
        .warnings_into_errors(strict)
        .compile("leasehold_keeper_parse");
}

/// Checks that `program` is an ELF executable for the target cargo builds for: its class
/// (32 or 64 bits), byte order and machine. A keeper built for the host in a cross build
/// could not be run, and every job would fail to start.
fn check_machine(program: &Path) -> Result<(), String> {
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let header = std::fs::read(program).map_err(|e| format!("cannot be read: {e}"))?;
    let header = header.get(..20).ok_or("is too short to be an ELF file")?;
    if &header[..4] != b"\x7fELF" {
        return Err("is not an ELF file".into());
    }
    let bits = match header[4] {
        1 => "32",
        2 => "64",
        _ => return Err("has an unknown ELF class".into()),
    };
    let little = header[5] == 1;
    let machine = if little {
        u16::from_le_bytes([header[18], header[19]])
    } else {
        u16::from_be_bytes([header[18], header[19]])
    };
    let (arch, width, endian) = (
        var("CARGO_CFG_TARGET_ARCH"),
        var("CARGO_CFG_TARGET_POINTER_WIDTH"),
        var("CARGO_CFG_TARGET_ENDIAN"),
    );
    // e_machine values from the ELF specification and its processor supplements.
    let expected: Option<u16> = match arch.as_str() {
        "x86" => Some(3),
        "x86_64" => Some(62),
        "arm" => Some(40),
        "aarch64" => Some(183),
        "riscv32" | "riscv64" => Some(243),
        "powerpc" => Some(20),
        "powerpc64" => Some(21),
        "s390x" => Some(22),
        "mips" | "mips64" => Some(8),
        "sparc64" => Some(43),
        "loongarch64" => Some(258),
        _ => None,
    };
    let endian_ok = (endian == "little") == little;
    // x32 (x86_64 with 32-bit pointers) is an ELF32 file for machine 62.
    let width_ok = bits == width;
    match expected {
        Some(m) if m != machine || !endian_ok || !width_ok => Err(format!(
            "is for ELF machine {machine} ({bits}-bit, {}), not the target's {arch} \
             (machine {m}, {width}-bit, {endian}-endian): set CC_<target> or CFLAGS for \
             the target",
            if little {
                "little-endian"
            } else {
                "big-endian"
            }
        )),
        Some(_) => Ok(()),
        None => {
            println!(
                "cargo:warning=cannot check the attempt keeper's ELF machine for the \
                 target architecture {arch}"
            );
            Ok(())
        }
    }
}
