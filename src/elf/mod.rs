//! ELF reading: the few dynamic-linking facts cudastack needs from a binary.
//!
//! Used by the cuDNN/wheel assemblers (SONAME symlink chains, see [`chain`]), by the static
//! audit (`DT_NEEDED` resolution through `DT_RPATH`/`DT_RUNPATH`) and by the verify probe
//! (which `GLIBC_*` symbol versions a binary requires from the image's glibc). [`fatbin`]
//! lists the GPU code a binary embeds, for the audit's kernel-coverage phase.
//!
//! Only the ELF header, the section headers, the dynamic section, its string table, the
//! `PT_INTERP` segment and the `SHT_GNU_VERNEED` section are read, through
//! [`object::read::ReadCache`]: a 700 MB CUDA library costs a few kilobytes of reads, and no
//! file is memory-mapped or held after [`read_elf`] returns. Files that are not ELF are a
//! normal outcome ([`ElfProbe::NotElf`]), not an error, so callers can walk whole trees.

pub mod chain;
pub mod fatbin;

/// The one glibc version type lives with the other versions; the ELF reader parses
/// `GLIBC_*` symbol version names into it.
pub use crate::version::{GlibcVersion, GlibcVersionError};

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use object::elf;
use object::read::elf::{FileHeader, ProgramHeader, SectionTable};
use object::read::ReadCache;
use object::{Endianness, ReadRef};
use serde::{Deserialize, Serialize};

/// Errors reading an ELF file. A file that is not ELF at all is not an error.
#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    #[error("failed to read `{path}`")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{path}` has an ELF magic number but is malformed: {reason}")]
    Malformed { path: PathBuf, reason: String },
}

/// The outcome of probing a file: not every file in a library directory is ELF
/// (linker scripts such as `libc.so`, headers, Python sources).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ElfProbe {
    NotElf,
    Elf(ElfInfo),
}

impl ElfProbe {
    pub fn into_elf(self) -> Option<ElfInfo> {
        match self {
            ElfProbe::Elf(info) => Some(info),
            ElfProbe::NotElf => None,
        }
    }
}

/// 32- or 64-bit ELF.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ElfClass {
    Elf32,
    Elf64,
}

/// `e_machine`, with names for the machines images are built for. Any ELF file may carry
/// any machine; [`crate::platform::Platform::to_elf`] names the machine of each platform
/// cudastack builds for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Machine {
    X86_64,
    Aarch64,
    I386,
    Ppc64,
    Other(u16),
}

impl Machine {
    fn from_raw(raw: elf::Machine) -> Self {
        match raw {
            elf::EM_X86_64 => Machine::X86_64,
            elf::EM_AARCH64 => Machine::Aarch64,
            elf::EM_386 => Machine::I386,
            elf::EM_PPC64 => Machine::Ppc64,
            other => Machine::Other(other.0),
        }
    }
}

/// `e_type`: what kind of object this is. PIE executables are `SharedObject` with an
/// interpreter; see [`ElfInfo::is_executable`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ObjectKind {
    Relocatable,
    Executable,
    SharedObject,
    Core,
    Other(u16),
}

impl ObjectKind {
    fn from_raw(raw: elf::FileType) -> Self {
        match raw {
            elf::ET_REL => ObjectKind::Relocatable,
            elf::ET_EXEC => ObjectKind::Executable,
            elf::ET_DYN => ObjectKind::SharedObject,
            elf::ET_CORE => ObjectKind::Core,
            other => ObjectKind::Other(other.0),
        }
    }
}

/// One `SHT_GNU_VERNEED` record: the versions required from one needed library.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionNeed {
    /// The library the versions are required from, e.g. `libc.so.6`.
    pub file: String,
    /// Version names, e.g. `GLIBC_2.34`, in file order.
    pub versions: Vec<String>,
}

/// The dynamic-linking facts of one ELF file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ElfInfo {
    pub class: ElfClass,
    pub machine: Machine,
    pub kind: ObjectKind,
    /// `PT_INTERP`, e.g. `/lib64/ld-linux-x86-64.so.2`.
    pub interpreter: Option<String>,
    /// `DT_SONAME`.
    pub soname: Option<String>,
    /// `DT_NEEDED`, in file order (which is the loader's search order).
    pub needed: Vec<String>,
    /// `DT_RPATH` split on `:`, unexpanded. Ignored by the loader when `DT_RUNPATH` exists.
    pub rpath: Vec<String>,
    /// `DT_RUNPATH` split on `:`, unexpanded.
    pub runpath: Vec<String>,
    /// `SHT_GNU_VERNEED`: symbol versions required per needed library.
    pub version_needs: Vec<VersionNeed>,
    /// `SHT_GNU_VERDEF`: symbol versions this object defines (e.g. libc.so.6's `GLIBC_2.34`),
    /// without the base entry that repeats the SONAME.
    pub version_definitions: Vec<String>,
}

impl ElfInfo {
    /// True for objects the loader can start: `ET_EXEC`, or `ET_DYN` with an interpreter (PIE).
    pub fn is_executable(&self) -> bool {
        self.kind == ObjectKind::Executable
            || (self.kind == ObjectKind::SharedObject && self.interpreter.is_some())
    }

    /// The `GLIBC_x.y[.z]` versions this object requires from any library, sorted and
    /// deduplicated (`GLIBC_PRIVATE` and other non-numeric names are left out).
    pub fn glibc_versions_required(&self) -> Vec<GlibcVersion> {
        let mut versions: Vec<GlibcVersion> = self
            .version_needs
            .iter()
            .flat_map(|need| need.versions.iter())
            .filter_map(|name| name.parse().ok())
            .collect();
        versions.sort();
        versions.dedup();
        versions
    }

    /// The newest glibc this object needs: the image's glibc must be at least this.
    pub fn min_glibc(&self) -> Option<GlibcVersion> {
        self.glibc_versions_required().into_iter().next_back()
    }

    /// The newest `GLIBC_*` version this object defines: for `libc.so.6`, the glibc release.
    pub fn glibc_provided(&self) -> Option<GlibcVersion> {
        self.version_definitions
            .iter()
            .filter_map(|name| name.parse().ok())
            .max()
    }

    /// The directories the loader searches from `DT_RPATH`/`DT_RUNPATH`, with `$ORIGIN`
    /// expanded against `origin_dir` (the directory holding this object, image-absolute).
    pub fn expanded_runpath(&self, origin_dir: &Path) -> Vec<PathBuf> {
        self.runpath
            .iter()
            .map(|entry| expand_origin(entry, origin_dir))
            .collect()
    }

    /// As [`Self::expanded_runpath`], for `DT_RPATH`.
    pub fn expanded_rpath(&self, origin_dir: &Path) -> Vec<PathBuf> {
        self.rpath
            .iter()
            .map(|entry| expand_origin(entry, origin_dir))
            .collect()
    }
}

/// Expand `$ORIGIN` / `${ORIGIN}` in one RPATH/RUNPATH entry (ld.so(8) "Dynamic string
/// tokens"). `$LIB` and `$PLATFORM` are left as they are: they depend on the loader build,
/// and no CUDA or PyTorch binary uses them. The result is lexically normalised (`..`
/// removed) because the audit resolves it inside an image root, not on the host.
pub fn expand_origin(entry: &str, origin_dir: &Path) -> PathBuf {
    let origin = origin_dir.to_string_lossy();
    let expanded = entry
        .replace("${ORIGIN}", &origin)
        .replace("$ORIGIN", &origin);
    normalize_lexically(Path::new(&expanded))
}

/// Remove `.` and resolve `..` without touching the filesystem. `..` at the root stays at
/// the root, as the kernel does.
pub fn normalize_lexically(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                // At the root, `..` is the root itself; a relative path keeps leading `..`.
                let ends_with_parent = out.components().next_back() == Some(Component::ParentDir);
                if (ends_with_parent || !out.pop()) && !path.is_absolute() {
                    out.push("..");
                }
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// Probe the file at `path`. Reads only headers and the dynamic-linking sections.
pub fn read_elf(path: &Path) -> Result<ElfProbe, ElfError> {
    let file = fs_err::File::open(path).map_err(|source| ElfError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    read_elf_from(file.into_parts().0, path)
}

/// Probe an already-open reader; `path` only names it in errors.
pub fn read_elf_from<R: Read + Seek>(mut reader: R, path: &Path) -> Result<ElfProbe, ElfError> {
    let io_error = |source| ElfError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut ident = [0u8; 16];
    let mut filled = 0;
    while filled < ident.len() {
        match reader.read(&mut ident[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(io_error(error)),
        }
    }
    if filled < 16 || ident[..4] != elf::ELFMAG {
        return Ok(ElfProbe::NotElf);
    }
    reader.seek(SeekFrom::Start(0)).map_err(io_error)?;
    let cache = ReadCache::new(reader);
    let malformed = |error: object::read::Error| ElfError::Malformed {
        path: path.to_path_buf(),
        reason: error.to_string(),
    };
    let info = match elf::FileClass(ident[4]) {
        elf::ELFCLASS64 => parse::<elf::FileHeader64<Endianness>>(&cache, ElfClass::Elf64),
        elf::ELFCLASS32 => parse::<elf::FileHeader32<Endianness>>(&cache, ElfClass::Elf32),
        other => {
            return Err(ElfError::Malformed {
                path: path.to_path_buf(),
                reason: format!("unknown ELF class {}", other.0),
            })
        }
    }
    .map_err(malformed)?;
    Ok(ElfProbe::Elf(info))
}

fn utf8(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn split_path_list(value: &str) -> Vec<String> {
    value
        .split(':')
        .filter(|entry| !entry.is_empty())
        .map(str::to_string)
        .collect()
}

/// The facts of one ELF file, read in file-structure order (header, program headers,
/// dynamic section, version needs, version definitions), so the first malformed part is
/// the one reported.
fn parse<Elf>(
    data: &ReadCache<impl object::read::ReadCacheOps>,
    class: ElfClass,
) -> object::read::Result<ElfInfo>
where
    Elf: FileHeader<Endian = Endianness>,
{
    let header = Elf::parse(data)?;
    let endian = header.endian()?;
    let kind = ObjectKind::from_raw(header.e_type(endian));
    let interpreter = interpreter(header, endian, data)?;
    let sections = header.sections(endian, data)?;
    let mut info = ElfInfo {
        class,
        machine: Machine::from_raw(header.e_machine(endian)),
        kind,
        interpreter,
        soname: None,
        needed: Vec::new(),
        rpath: Vec::new(),
        runpath: Vec::new(),
        version_needs: Vec::new(),
        version_definitions: Vec::new(),
    };
    read_dynamic(&sections, endian, data, &mut info)?;
    info.version_needs = version_needs(&sections, endian, data)?;
    info.version_definitions = version_definitions(&sections, endian, data)?;
    Ok(info)
}

/// `PT_INTERP` (the last one, should a file have several).
fn interpreter<'data, Elf, R>(
    header: &Elf,
    endian: Endianness,
    data: R,
) -> object::read::Result<Option<String>>
where
    Elf: FileHeader<Endian = Endianness>,
    R: ReadRef<'data>,
{
    let mut interpreter = None;
    for segment in header.program_headers(endian, data)? {
        if let Some(interp) = segment.interpreter(endian, data)? {
            interpreter = Some(utf8(interp));
        }
    }
    Ok(interpreter)
}

/// `DT_SONAME`, `DT_NEEDED`, `DT_RPATH` and `DT_RUNPATH` into `info`, in file order.
fn read_dynamic<'data, Elf, R>(
    sections: &SectionTable<'data, Elf, R>,
    endian: Endianness,
    data: R,
    info: &mut ElfInfo,
) -> object::read::Result<()>
where
    Elf: FileHeader<Endian = Endianness>,
    R: ReadRef<'data>,
{
    let dynamic = sections.dynamic_table(endian, data)?;
    for entry in dynamic.iter() {
        let value = || dynamic.string(entry).map(utf8);
        match entry.tag {
            elf::DT_SONAME => info.soname = Some(value()?),
            elf::DT_NEEDED => info.needed.push(value()?),
            elf::DT_RPATH => info.rpath.extend(split_path_list(&value()?)),
            elf::DT_RUNPATH => info.runpath.extend(split_path_list(&value()?)),
            _ => {}
        }
    }
    Ok(())
}

/// `SHT_GNU_VERNEED`: the versions required per needed library.
fn version_needs<'data, Elf, R>(
    sections: &SectionTable<'data, Elf, R>,
    endian: Endianness,
    data: R,
) -> object::read::Result<Vec<VersionNeed>>
where
    Elf: FileHeader<Endian = Endianness>,
    R: ReadRef<'data>,
{
    let mut version_needs = Vec::new();
    if let Some((needs, link)) = sections.gnu_verneed(endian, data)? {
        let strings = sections.strings(endian, data, link)?;
        for need in needs {
            let (verneed, auxiliaries) = need?;
            let mut versions = Vec::new();
            for aux in auxiliaries {
                versions.push(utf8(aux?.name(endian, strings)?));
            }
            version_needs.push(VersionNeed {
                file: utf8(verneed.file(endian, strings)?),
                versions,
            });
        }
    }
    Ok(version_needs)
}

/// `SHT_GNU_VERDEF`: the versions this object defines, without the base entry.
fn version_definitions<'data, Elf, R>(
    sections: &SectionTable<'data, Elf, R>,
    endian: Endianness,
    data: R,
) -> object::read::Result<Vec<String>>
where
    Elf: FileHeader<Endian = Endianness>,
    R: ReadRef<'data>,
{
    let mut version_definitions = Vec::new();
    if let Some((definitions, link)) = sections.gnu_verdef(endian, data)? {
        let strings = sections.strings(endian, data, link)?;
        for definition in definitions {
            let (verdef, mut auxiliaries) = definition?;
            if verdef.vd_flags.get(endian).0 & elf::VER_FLG_BASE.0 != 0 {
                continue;
            }
            // The first auxiliary names the version; later ones name its parents.
            if let Some(aux) = auxiliaries.next()? {
                version_definitions.push(utf8(aux.name(endian, strings)?));
            }
        }
    }
    Ok(version_definitions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glibc_versions_parse_and_order_numerically() {
        let a: GlibcVersion = "GLIBC_2.9".parse().unwrap();
        let b: GlibcVersion = "GLIBC_2.17".parse().unwrap();
        let c: GlibcVersion = "2.3.4".parse().unwrap();
        assert!(a < b);
        assert!(c < a);
        assert_eq!(b.to_string(), "2.17");
        assert_eq!(c.to_string(), "2.3.4");
        assert!("GLIBC_PRIVATE".parse::<GlibcVersion>().is_err());
        assert!("GLIBCXX_3.4.29".parse::<GlibcVersion>().is_err());
        assert!("GLIBC_2".parse::<GlibcVersion>().is_err());
    }

    #[test]
    fn origin_expansion_normalises() {
        let origin = Path::new("/usr/local/lib/python3.11/site-packages/torch/lib");
        assert_eq!(
            expand_origin("$ORIGIN/../../nvidia/cudnn/lib", origin),
            PathBuf::from("/usr/local/lib/python3.11/site-packages/nvidia/cudnn/lib")
        );
        assert_eq!(
            expand_origin("${ORIGIN}", origin),
            PathBuf::from("/usr/local/lib/python3.11/site-packages/torch/lib")
        );
        assert_eq!(
            expand_origin("/opt/x/./lib", origin),
            PathBuf::from("/opt/x/lib")
        );
        assert_eq!(
            normalize_lexically(Path::new("/../../etc")),
            PathBuf::from("/etc")
        );
        assert_eq!(
            normalize_lexically(Path::new("../../a/./b/../c")),
            PathBuf::from("../../a/c")
        );
    }

    #[test]
    fn non_elf_is_not_an_error() {
        let probe = read_elf_from(
            std::io::Cursor::new(b"/* GNU ld script */ GROUP ( libc.so.6 )".to_vec()),
            Path::new("libc.so"),
        )
        .unwrap();
        assert_eq!(probe, ElfProbe::NotElf);
        let empty = read_elf_from(std::io::Cursor::new(Vec::new()), Path::new("empty")).unwrap();
        assert_eq!(empty, ElfProbe::NotElf);
    }

    #[test]
    fn truncated_elf_is_malformed() {
        let mut bytes = elf::ELFMAG.to_vec();
        bytes.extend_from_slice(&[elf::ELFCLASS64.0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        let error = read_elf_from(std::io::Cursor::new(bytes), Path::new("broken.so")).unwrap_err();
        assert!(matches!(error, ElfError::Malformed { .. }), "{error}");
        assert!(error.to_string().contains("broken.so"));
    }
}
