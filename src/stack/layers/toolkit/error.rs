//! What stops the toolkit layers: a wheel that cannot be read, a library chain that does
//! not hold, an ELF file that does not parse. A leaf: the stack's error wraps it.

use std::io;
use std::path::PathBuf;

use crate::elf::chain::ChainError;
use crate::elf::ElfError;

#[derive(Debug, thiserror::Error)]
pub enum ToolkitError {
    #[error("I/O error on `{path}`")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("`{wheel}` is not a readable wheel")]
    Zip {
        wheel: PathBuf,
        #[source]
        source: zip::result::ZipError,
    },
    #[error("wheel member `{member}` of `{wheel}` would leave the toolkit directory")]
    UnsafeMember { wheel: PathBuf, member: String },
    #[error("wheel member `{member}` of `{wheel}` is a shared library in a subdirectory of the CUDA library directory, which is on LD_LIBRARY_PATH: glibc searches such subdirectories (`glibc-hwcaps/<level>/`, and `tls/`, `x86_64/`, `haswell/` before glibc 2.37) before the directory itself, so a library there would load into every program, the verification probe's interpreter included, in place of the one it names; NVIDIA's wheels put their libraries directly in `lib/` (only `cmake/` and `pkgconfig/` files in subdirectories)")]
    LibrarySubdirectory { wheel: PathBuf, member: String },
    #[error(transparent)]
    Chain(#[from] ChainError),
    #[error(transparent)]
    Elf(#[from] ElfError),
}
