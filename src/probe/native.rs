//! The native probe (probe/rust, `cudastack-probe`): the verification probe of images
//! without torch. It reaches the GPU through the driver API, cuBLAS and cuDNN (cudarc,
//! dynamically loaded), so the driver, device and ops levels run in a CUDA-only image.
//!
//! It is built per CUDA major (cudarc fixes the library SONAMEs at compile time) and per
//! machine by `scripts/build-probe.sh` into `target/probe/cudastack-probe-cudaNN-MACHINE`
//! (x86_64 natively, aarch64 in a Debian chroot with that architecture's Rust std), and
//! baked beside probe.py, which hands over to it when the expectations name no torch, so
//! every runner keeps starting `python3 probe.py`. It is a glibc binary: it is baked only
//! into images of its machine whose glibc is at least the one it needs.

use std::path::{Path, PathBuf};

use crate::digest::Digest;
use crate::elf::Machine;

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
}

/// The file name of the probe built for CUDA `major` and `machine` (named as `uname -m`
/// names it); `None` for a machine no probe is built for.
pub fn file_name(cuda_major: u32, machine: Machine) -> Option<String> {
    let machine = crate::platform::Platform::from_elf(machine)?.wheel_arch();
    Some(format!("cudastack-probe-cuda{cuda_major}-{machine}"))
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

/// Find and read the native probe for CUDA `cuda_major` on `machine`; the error says where
/// it looked, or that the file found is not a probe for that machine.
pub fn locate(cuda_major: u32, machine: Machine) -> Result<NativeProbe, String> {
    locate_in(&search_dirs(), cuda_major, machine)
}

fn locate_in(dirs: &[PathBuf], cuda_major: u32, machine: Machine) -> Result<NativeProbe, String> {
    let name = file_name(cuda_major, machine)
        .ok_or_else(|| format!("no native probe is built for {machine:?}"))?;
    for dir in dirs {
        let path = dir.join(&name);
        if let Ok(bytes) = std::fs::read(&path) {
            let unusable = |e: String| format!("`{}` is not a usable probe: {e}", path.display());
            let required_glibc =
                super::glibc::required_glibc(&bytes).map_err(|e| unusable(e.to_string()))?;
            let found = match crate::elf::read_elf_from(std::io::Cursor::new(&bytes), &path) {
                Ok(crate::elf::ElfProbe::Elf(info)) => info.machine,
                Ok(crate::elf::ElfProbe::NotElf) => return Err(unusable("not an ELF file".into())),
                Err(e) => return Err(unusable(e.to_string())),
            };
            if found != machine {
                return Err(unusable(format!(
                    "its code is for {found:?}, not {machine:?}"
                )));
            }
            return Ok(NativeProbe {
                digest: Digest::of_bytes(&bytes),
                path,
                bytes,
                required_glibc,
            });
        }
    }
    Err(format!(
        "no `{name}` in {} (a release archive has it in probe/ beside bin/; in a checkout scripts/build-probe.sh, run by scripts/setup.sh, builds it; or set CUDASTACK_PROBE_DIR)",
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
        let error = locate(99, Machine::Aarch64).unwrap_err();
        assert!(error.contains("cudastack-probe-cuda99-aarch64"), "{error}");
        assert!(error.contains("scripts/setup.sh"), "{error}");
        let error = locate(12, Machine::Ppc64).unwrap_err();
        assert!(
            error.contains("no native probe is built for Ppc64"),
            "{error}"
        );
    }

    #[test]
    fn a_probe_for_another_machine_under_this_machines_name_is_refused() {
        // This test binary is an ELF file for this machine, planted under the other's name.
        let (this, other) = if cfg!(target_arch = "aarch64") {
            (Machine::Aarch64, Machine::X86_64)
        } else {
            (Machine::X86_64, Machine::Aarch64)
        };
        let dir = tempfile::tempdir().unwrap();
        let name = file_name(77, other).unwrap();
        std::fs::copy(std::env::current_exe().unwrap(), dir.path().join(&name)).unwrap();
        let error = locate_in(&[dir.path().to_path_buf()], 77, other).unwrap_err();
        assert!(
            error.contains(&format!("its code is for {this:?}, not {other:?}")),
            "{error}"
        );
        assert!(locate_in(&[dir.path().to_path_buf()], 77, this).is_err());
    }
}
