//! The native probe (probe/rust, `cudastack-probe`): the verification probe of images
//! without torch. It reaches the GPU through the driver API, cuBLAS and cuDNN (cudarc,
//! dynamically loaded), so the driver, device and ops levels run in a CUDA-only image.
//!
//! It is built per CUDA major (cudarc fixes the library SONAMEs at compile time) by
//! `scripts/setup.sh` into `target/probe/cudastack-probe-cudaNN`, and baked beside
//! probe.py, which hands over to it when the expectations name no torch, so every runner
//! keeps starting `python3 probe.py`. It is an x86_64 glibc binary: it is baked only into
//! images of the build host's architecture whose glibc is at least the one it needs.

use std::path::{Path, PathBuf};

use crate::digest::Digest;

/// Where the native probe lives in an image (beside [`super::PROBE_PATH`]).
pub const NATIVE_PROBE_PATH: &str = "/opt/cudastack/probe/cudastack-probe";

/// A built native probe for one CUDA major.
#[derive(Debug, Clone)]
pub struct NativeProbe {
    pub path: PathBuf,
    pub bytes: Vec<u8>,
    pub digest: Digest,
    /// The newest `GLIBC_x.y` it needs.
    pub required_glibc: Option<(u32, u32)>,
    /// The machine its code is for: it is baked only into images of that architecture.
    pub machine: crate::elf::Machine,
}

/// The file name of the probe built for CUDA `major`.
pub fn file_name(cuda_major: u32) -> String {
    format!("cudastack-probe-cuda{cuda_major}")
}

/// Directories searched, in order: `$CUDASTACK_PROBE_DIR`, then `target/probe` beside the
/// running cudastack (`target/release/../probe`).
fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(dir) = std::env::var_os("CUDASTACK_PROBE_DIR") {
        dirs.push(PathBuf::from(dir));
    }
    if let Some(exe_dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        dirs.push(exe_dir.join("../probe"));
        dirs.push(exe_dir);
    }
    dirs
}

/// Find and read the native probe for CUDA `cuda_major`; the error says where it looked.
pub fn locate(cuda_major: u32) -> Result<NativeProbe, String> {
    let name = file_name(cuda_major);
    let dirs = search_dirs();
    for dir in &dirs {
        let path = dir.join(&name);
        if let Ok(bytes) = std::fs::read(&path) {
            let unusable = |e: String| format!("`{}` is not a usable probe: {e}", path.display());
            let required_glibc =
                super::glibc::required_glibc(&bytes).map_err(|e| unusable(e.to_string()))?;
            let machine = match crate::elf::read_elf_from(std::io::Cursor::new(&bytes), &path) {
                Ok(crate::elf::ElfProbe::Elf(info)) => info.machine,
                Ok(crate::elf::ElfProbe::NotElf) => return Err(unusable("not an ELF file".into())),
                Err(e) => return Err(unusable(e.to_string())),
            };
            return Ok(NativeProbe {
                digest: Digest::of_bytes(&bytes),
                path,
                bytes,
                required_glibc,
                machine,
            });
        }
    }
    Err(format!(
        "no `{name}` in {} (scripts/setup.sh builds it; or set CUDASTACK_PROBE_DIR)",
        dirs.iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_py_hands_over_to_the_baked_native_probe() {
        let name = Path::new(NATIVE_PROBE_PATH)
            .file_name()
            .unwrap()
            .to_str()
            .unwrap();
        assert!(super::super::PROBE_SOURCE.contains(&format!("NATIVE_PROBE = \"{name}\"")));
        assert_eq!(
            Path::new(NATIVE_PROBE_PATH).parent(),
            Path::new(super::super::PROBE_PATH).parent()
        );
    }

    #[test]
    fn a_missing_probe_says_where_it_looked() {
        let error = locate(99).unwrap_err();
        assert!(error.contains("cudastack-probe-cuda99"), "{error}");
        assert!(error.contains("scripts/setup.sh"), "{error}");
    }
}
