//! Which glibc a binary needs, so a native probe (probe/rust, `cudastack-probe`) is baked
//! only into images whose glibc can run it.
//!
//! A dynamically linked ELF names the symbol versions it needs from each shared library in
//! its `.gnu.version_r` (SHT_GNU_VERNEED) section: `libc.so.6: GLIBC_2.2.5, GLIBC_2.34`,
//! `libm.so.6: GLIBC_2.29`, ... The highest `GLIBC_x.y` over libc, libm, libpthread, libdl,
//! librt, ld-linux and the rest of glibc is the oldest glibc the binary starts on. A Rust
//! binary built on Debian 12 (glibc 2.36) needs GLIBC_2.34 (`__libc_start_main@GLIBC_2.34`),
//! too new for Ubuntu 20.04 (2.31) and UBI 8 (2.28).

use crate::elf::{read_elf_from, ElfProbe};

#[derive(Debug, thiserror::Error)]
pub enum GlibcError {
    #[error("not an ELF file")]
    NotElf,
    #[error(transparent)]
    Elf(#[from] crate::elf::ElfError),
}

/// The highest `GLIBC_x.y` the ELF's `.gnu.version_r` requires (from any glibc library:
/// libc, libm, libpthread, ld-linux, ...); `None` when it needs no glibc symbol versions
/// (a static binary, or a musl one). The ELF reading is [`crate::elf`]'s.
pub fn required_glibc(elf_bytes: &[u8]) -> Result<Option<(u32, u32)>, GlibcError> {
    let probe = read_elf_from(
        std::io::Cursor::new(elf_bytes),
        std::path::Path::new("<probe>"),
    )?;
    let ElfProbe::Elf(info) = probe else {
        return Err(GlibcError::NotElf);
    };
    Ok(info
        .glibc_versions_required()
        .into_iter()
        .max()
        .map(|v| (v.major, v.minor)))
}

/// Whether a binary needing `required` starts on an image with glibc `image_glibc`.
pub fn can_run_on(required: Option<(u32, u32)>, image_glibc: (u32, u32)) -> Result<(), String> {
    match required {
        Some(need) if need > image_glibc => Err(format!(
            "the Rust probe needs GLIBC_{}.{} but the image has glibc {}.{}; build the probe against glibc {}.{} or older \
             (e.g. `cargo zigbuild --release --target x86_64-unknown-linux-gnu.{}.{}`) or use the Python probe for this image",
            need.0, need.1, image_glibc.0, image_glibc.1, image_glibc.0, image_glibc.1, image_glibc.0, image_glibc.1
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::process::Command;

    /// This machine's glibc, from `ldd --version` (`ldd (Debian GLIBC 2.36-9+deb12u14) 2.36`).
    fn host_glibc() -> (u32, u32) {
        let out = Command::new("ldd")
            .arg("--version")
            .output()
            .expect("ldd runs");
        let text = String::from_utf8_lossy(&out.stdout);
        let first = text.lines().next().unwrap_or_default();
        let version = first.split_whitespace().last().expect("a version");
        let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap());
        (parts.next().unwrap(), parts.next().unwrap())
    }

    fn compile(name: &str, source: &str, extra: &[&str]) -> Option<Vec<u8>> {
        let dir =
            std::env::temp_dir().join(format!("cudastack-glibc-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let c = dir.join("main.c");
        std::fs::write(&c, source).unwrap();
        let exe = dir.join("main");
        let status = Command::new("gcc")
            .arg(&c)
            .arg("-o")
            .arg(&exe)
            .args(extra)
            .status()
            .ok()?;
        let bytes = status.success().then(|| std::fs::read(&exe).unwrap());
        let _ = std::fs::remove_dir_all(&dir);
        bytes
    }

    #[test]
    fn a_gcc_built_program_needs_the_hosts_glibc_at_most() {
        let source = "#include <stdio.h>\n#include <math.h>\nint main(int c, char **v) { printf(\"%f\\n\", exp((double)c)); return 0; }\n";
        let bytes = compile("dyn", source, &["-lm"]).expect("gcc is installed");
        let required = required_glibc(&bytes)
            .unwrap()
            .expect("a dynamic program needs glibc versions");
        let host = host_glibc();
        assert!(required <= host, "{required:?} > host {host:?}");
        assert!(required >= (2, 2), "{required:?}");
        if host >= (2, 34) {
            // __libc_start_main@GLIBC_2.34 since glibc 2.34.
            assert!(required >= (2, 34), "{required:?}");
        }
        assert!(can_run_on(Some(required), host).is_ok());
        let err = can_run_on(Some((2, 34)), (2, 31)).unwrap_err();
        assert!(
            err.starts_with("the Rust probe needs GLIBC_2.34 but the image has glibc 2.31; "),
            "{err}"
        );
        assert!(can_run_on(Some((2, 28)), (2, 31)).is_ok());
        assert!(can_run_on(None, (2, 17)).is_ok());
    }

    #[test]
    fn a_static_program_needs_no_glibc_version() {
        let Some(bytes) = compile("static", "int main(void) { return 0; }\n", &["-static"]) else {
            eprintln!("no static libc here: skipping the static case");
            return;
        };
        assert_eq!(required_glibc(&bytes).unwrap(), None);
    }

    #[test]
    fn not_an_elf_is_an_error() {
        assert!(matches!(
            required_glibc(b"#!/bin/sh\necho hi\n"),
            Err(GlibcError::NotElf)
        ));
        assert!(required_glibc(b"\x7fELF\x02\x01\x01").is_err());
    }

    #[test]
    fn the_built_rust_probes_if_present() {
        // Where scripts/build-probe.sh installs them: both machines need at most glibc 2.17
        // (linked by zig against that glibc), so they run on every supported base.
        for machine in ["x86_64", "aarch64"] {
            let path = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(format!("target/probe/cudastack-probe-cuda12-{machine}"));
            let Ok(bytes) = std::fs::read(&path) else {
                eprintln!("{} is not built: skipping", path.display());
                continue;
            };
            let required = required_glibc(&bytes)
                .unwrap()
                .expect("the probe links glibc dynamically");
            eprintln!(
                "{} needs GLIBC_{}.{}",
                path.display(),
                required.0,
                required.1
            );
            assert!(required <= host_glibc());
            assert!(required >= (2, 17));
        }
    }
}
