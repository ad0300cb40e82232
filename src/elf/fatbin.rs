//! The GPU code embedded in an ELF file: the fatbin containers of its `.nv_fatbin` and
//! `__nv_relfatbin` sections, listed as the SASS targets and PTX versions they carry.
//!
//! Used by the kernel-coverage phase of the static audit (`audit::kernels`), which checks
//! that every library with device code can run on every target GPU of the recipe.
//!
//! The container format is undocumented but stable since CUDA 9; cudastack reads the fields
//! that NVIDIA's own `cuobjdump --list-elf --list-ptx` reports, and its tests compare the
//! two on real libraries (tests/kernel_audit.rs). Layout (little-endian, all offsets from the
//! start of the structure; `fatbinary_section.h` names the sections):
//! - container header, 16 bytes: magic `0xBA55ED50` (u32), version (u16, 1), header size
//!   (u16, 16), size of the entries that follow (u64). Containers follow each other in the
//!   section, 8-byte aligned, possibly with zero padding between them.
//! - entry header, at least 64 bytes: kind (u16: 1 PTX, 2 ELF cubin), version (u16), header
//!   size (u32), payload size (u64, padded), compressed size (u32), options offset (u32),
//!   minor (u16), major (u16: the PTX ISA of a PTX entry, the cubin ABI of an ELF entry),
//!   arch (u32: `90` for sm_90), name offset and length (u32 each), flags (u64: 0x2000 LZ4
//!   and 0x8000 Zstandard compression, 0x100000 an `a` target, 0x200000 an `f` target),
//!   reserved (u64), decompressed size (u64); the payload follows the header.
//!
//! Only headers are read, by offset (`pread`), never a payload: a 900 MB libtorch_cuda.so
//! costs a few thousand 64-byte reads. Nothing is memory-mapped and every size read from
//! the file is checked against the section before it is used, so a truncated or lying
//! header is a [`FatbinError::Malformed`] naming the file and the offset, and no read or
//! allocation depends on a size the file claims.

use std::collections::BTreeSet;
use std::fmt;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use object::elf;
use object::read::elf::{FileHeader, SectionHeader};
use object::read::ReadCache;
use object::Endianness;
use serde::{Deserialize, Serialize};

use crate::version::{ArchVariant, ComputeCapability, GpuArch, PtxIsa};

/// The first four bytes of a fatbin container (`fatbinary.h`: `FATBIN_MAGIC`).
pub const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// The section the runtime registers device code from (`FATBIN_DATA_SECTION_NAME`).
pub const FATBIN_SECTION: &str = ".nv_fatbin";
/// Pre-linked relocatable device code (`FATBIN_PRELINK_DATA_SECTION_NAME`): the inputs of
/// a device link (`-rdc`), kept for linking against the library later.
pub const RELFATBIN_SECTION: &str = "__nv_relfatbin";

const CONTAINER_HEADER: u64 = 16;
/// The fixed fields of an entry header that cudastack reads.
const ENTRY_HEADER: u64 = 64;
const KIND_PTX: u16 = 1;
const KIND_ELF: u16 = 2;
const FLAG_LZ4: u64 = 0x2000;
const FLAG_ZSTD: u64 = 0x8000;
const FLAG_ARCH_SPECIFIC: u64 = 0x10_0000;
const FLAG_FAMILY: u64 = 0x20_0000;
/// Zero padding between containers is skipped in reads of this size.
const PADDING_SCAN: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum FatbinError {
    #[error("failed to read `{path}`")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{path}` has a malformed fatbin at file offset {offset:#x} (section `{section}`): {reason}")]
    Malformed {
        path: PathBuf,
        section: String,
        offset: u64,
        reason: String,
    },
    #[error("`{path}` is a malformed ELF file: {reason}")]
    MalformedElf { path: PathBuf, reason: String },
}

/// A PTX entry: the virtual architecture it targets and the ISA version it is written in
/// (None when the header does not say).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PtxTarget {
    pub arch: GpuArch,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isa: Option<PtxIsa>,
}

impl fmt::Display for PtxTarget {
    /// `compute_90 (PTX ISA 8.1)`: nvcc's name for a virtual architecture.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.arch.to_string().replacen("sm_", "compute_", 1);
        match self.isa {
            Some(isa) => write!(f, "{name} (PTX ISA {isa})"),
            None => write!(f, "{name} (PTX ISA unknown)"),
        }
    }
}

/// What one section of one file holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SectionCode {
    /// Cubin targets, sorted.
    pub sass: BTreeSet<GpuArch>,
    /// PTX targets with their ISA, sorted.
    pub ptx: BTreeSet<PtxTarget>,
    pub containers: usize,
    pub sass_entries: usize,
    pub ptx_entries: usize,
    /// Entries of other kinds (e.g. LTO IR), not code a GPU runs.
    pub other_entries: usize,
    pub compressed_entries: usize,
}

impl SectionCode {
    pub fn is_empty(&self) -> bool {
        self.sass.is_empty() && self.ptx.is_empty() && self.other_entries == 0
    }
}

/// The device code of one ELF file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceCode {
    /// `.nv_fatbin`: what the CUDA runtime registers and loads.
    pub fatbin: SectionCode,
    /// `__nv_relfatbin`: relocatable inputs of the device link.
    pub relocatable: SectionCode,
}

impl DeviceCode {
    /// The code a GPU can be given, from both sections. `__nv_relfatbin` counts: the
    /// runtime registers its containers too (the `.nvFatBinSegment` wrappers of a
    /// device-linked library list them), and NCCL keeps all its PTX there; its relocatable
    /// PTX is what lets an NCCL without SASS for a newer GPU JIT-link at first use.
    pub fn runnable(&self) -> SectionCode {
        let (a, b) = (&self.fatbin, &self.relocatable);
        SectionCode {
            sass: a.sass.union(&b.sass).copied().collect(),
            ptx: a.ptx.union(&b.ptx).copied().collect(),
            containers: a.containers + b.containers,
            sass_entries: a.sass_entries + b.sass_entries,
            ptx_entries: a.ptx_entries + b.ptx_entries,
            other_entries: a.other_entries + b.other_entries,
            compressed_entries: a.compressed_entries + b.compressed_entries,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.fatbin.is_empty() && self.relocatable.is_empty()
    }
}

/// Positioned reads, so headers are read where they lie without a shared cursor.
pub trait ReadAt {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()>;
    fn len(&self) -> std::io::Result<u64>;
}

impl ReadAt for std::fs::File {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self, buf, offset)
    }
    fn len(&self) -> std::io::Result<u64> {
        Ok(self.metadata()?.len())
    }
}

impl ReadAt for [u8] {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        match start
            .checked_add(buf.len())
            .and_then(|end| self.get(start..end))
        {
            Some(bytes) => {
                buf.copy_from_slice(bytes);
                Ok(())
            }
            None => Err(std::io::ErrorKind::UnexpectedEof.into()),
        }
    }
    fn len(&self) -> std::io::Result<u64> {
        Ok(<[u8]>::len(self) as u64)
    }
}

/// The device code of the ELF file at `path`; None for a file that is not ELF or has no
/// fatbin section.
pub fn read_device_code(path: &Path) -> Result<Option<DeviceCode>, FatbinError> {
    let io_error = |source| FatbinError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = fs_err::File::open(path).map_err(io_error)?.into_parts().0;
    let Some(sections) = fatbin_sections(&file, path)? else {
        return Ok(None);
    };
    let mut code = DeviceCode::default();
    for (name, offset, size) in sections {
        let section = Section {
            path,
            name,
            start: offset,
            size,
        };
        let target = if name == FATBIN_SECTION {
            &mut code.fatbin
        } else {
            &mut code.relocatable
        };
        read_section(&file, &section, target)?;
    }
    Ok((!code.is_empty()).then_some(code))
}

/// `(name, file offset, size)` of the fatbin sections of an ELF file; None when it is not
/// ELF or has none.
fn fatbin_sections(
    file: &std::fs::File,
    path: &Path,
) -> Result<Option<Vec<(&'static str, u64, u64)>>, FatbinError> {
    let mut reader = file;
    let mut ident = [0u8; 16];
    let read = read_up_to(&mut reader, &mut ident).map_err(|source| FatbinError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if read < ident.len() || ident[..4] != elf::ELFMAG {
        return Ok(None);
    }
    reader
        .seek(SeekFrom::Start(0))
        .map_err(|source| FatbinError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    let cache = ReadCache::new(reader);
    let found = match elf::FileClass(ident[4]) {
        elf::ELFCLASS64 => section_offsets::<elf::FileHeader64<Endianness>>(&cache),
        elf::ELFCLASS32 => section_offsets::<elf::FileHeader32<Endianness>>(&cache),
        other => {
            return Err(FatbinError::MalformedElf {
                path: path.to_path_buf(),
                reason: format!("unknown ELF class {}", other.0),
            })
        }
    }
    .map_err(|error| FatbinError::MalformedElf {
        path: path.to_path_buf(),
        reason: error.to_string(),
    })?;
    Ok((!found.is_empty()).then_some(found))
}

fn read_up_to(reader: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(filled)
}

/// The section headers named [`FATBIN_SECTION`] and [`RELFATBIN_SECTION`] that hold bytes
/// in the file (`SHT_NOBITS` holds none).
fn section_offsets<Elf>(
    data: &ReadCache<impl object::read::ReadCacheOps>,
) -> object::read::Result<Vec<(&'static str, u64, u64)>>
where
    Elf: FileHeader<Endian = Endianness>,
{
    let header = Elf::parse(data)?;
    let endian = header.endian()?;
    let sections = header.sections(endian, data)?;
    let mut found = Vec::new();
    for name in [FATBIN_SECTION, RELFATBIN_SECTION] {
        if let Some((_, section)) = sections.section_by_name(endian, name.as_bytes()) {
            if section.sh_type(endian) != elf::SHT_NOBITS {
                found.push((
                    name,
                    section.sh_offset(endian).into(),
                    section.sh_size(endian).into(),
                ));
            }
        }
    }
    Ok(found)
}

/// One fatbin section of one file, for reading and for naming in errors.
pub struct Section<'a> {
    pub path: &'a Path,
    pub name: &'a str,
    /// File offset of the section's first byte.
    pub start: u64,
    pub size: u64,
}

impl Section<'_> {
    fn malformed(&self, at: u64, reason: impl Into<String>) -> FatbinError {
        FatbinError::Malformed {
            path: self.path.to_path_buf(),
            section: self.name.to_string(),
            offset: self.start.saturating_add(at),
            reason: reason.into(),
        }
    }

    /// Read `buf.len()` bytes at `at` (relative to the section), which must lie inside it.
    fn read<R: ReadAt + ?Sized>(
        &self,
        file: &R,
        at: u64,
        buf: &mut [u8],
        what: &str,
    ) -> Result<(), FatbinError> {
        let fits = at
            .checked_add(buf.len() as u64)
            .is_some_and(|end| end <= self.size);
        if !fits {
            return Err(self.malformed(
                at,
                format!(
                    "the {what} ({} bytes) runs past the end of the section ({} bytes)",
                    buf.len(),
                    self.size
                ),
            ));
        }
        file.read_exact_at(buf, self.start + at)
            .map_err(|source| FatbinError::Io {
                path: self.path.to_path_buf(),
                source,
            })
    }
}

/// Walk every container of `section` into `out`.
pub fn read_section<R: ReadAt + ?Sized>(
    file: &R,
    section: &Section<'_>,
    out: &mut SectionCode,
) -> Result<(), FatbinError> {
    let file_len = file.len().map_err(|source| FatbinError::Io {
        path: section.path.to_path_buf(),
        source,
    })?;
    if section
        .start
        .checked_add(section.size)
        .is_none_or(|end| end > file_len)
    {
        return Err(section.malformed(
            0,
            format!(
                "the section header says {} bytes, past the end of the file ({file_len} bytes): the file is truncated",
                section.size
            ),
        ));
    }
    let mut at = 0;
    while let Some(start) = next_container(file, section, at)? {
        at = read_container(file, section, start, out)?;
        out.containers += 1;
    }
    Ok(())
}

/// The offset of the next container at or after `at`, skipping zero padding; None at the
/// end of the section.
fn next_container<R: ReadAt + ?Sized>(
    file: &R,
    section: &Section<'_>,
    mut at: u64,
) -> Result<Option<u64>, FatbinError> {
    let mut chunk = vec![0u8; PADDING_SCAN];
    while at < section.size {
        let len = (section.size - at).min(PADDING_SCAN as u64) as usize;
        section.read(file, at, &mut chunk[..len], "fatbin container")?;
        match chunk[..len].iter().position(|&b| b != 0) {
            None => at += len as u64,
            // The magic's first byte (0x50) is not zero: the container starts there.
            Some(nonzero) => return Ok(Some(at + nonzero as u64)),
        }
    }
    Ok(None)
}

/// Read the container at `start` into `out`; returns the offset just past it.
fn read_container<R: ReadAt + ?Sized>(
    file: &R,
    section: &Section<'_>,
    start: u64,
    out: &mut SectionCode,
) -> Result<u64, FatbinError> {
    let mut header = [0u8; CONTAINER_HEADER as usize];
    section.read(file, start, &mut header, "fatbin container header")?;
    let magic = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes"));
    if magic != FATBIN_MAGIC {
        return Err(section.malformed(
            start,
            format!("expected the fatbin magic {FATBIN_MAGIC:#010x}, found {magic:#010x}"),
        ));
    }
    let header_size = u64::from(u16::from_le_bytes([header[6], header[7]]));
    let entries_size = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
    if header_size < CONTAINER_HEADER {
        return Err(section.malformed(
            start,
            format!("container header size {header_size} is below the {CONTAINER_HEADER} bytes of its fields"),
        ));
    }
    let end = start
        .checked_add(header_size)
        .and_then(|at| at.checked_add(entries_size))
        .filter(|end| *end <= section.size)
        .ok_or_else(|| {
            section.malformed(
                start,
                format!(
                    "the container claims {entries_size} bytes of entries, past the end of the section ({} bytes)",
                    section.size
                ),
            )
        })?;
    let mut at = start + header_size;
    while at < end {
        at = read_entry(file, section, at, end, out)?;
    }
    Ok(end)
}

/// Read the entry header at `at` (its container ends at `end`) into `out`; returns the
/// offset of the next entry.
fn read_entry<R: ReadAt + ?Sized>(
    file: &R,
    section: &Section<'_>,
    at: u64,
    end: u64,
    out: &mut SectionCode,
) -> Result<u64, FatbinError> {
    if end - at < ENTRY_HEADER {
        return Err(section.malformed(
            at,
            format!(
                "{} bytes left in the container, too few for an entry header ({ENTRY_HEADER} bytes)",
                end - at
            ),
        ));
    }
    let mut header = [0u8; ENTRY_HEADER as usize];
    section.read(file, at, &mut header, "fatbin entry header")?;
    let u16_at = |i: usize| u16::from_le_bytes([header[i], header[i + 1]]);
    let u32_at = |i: usize| u32::from_le_bytes(header[i..i + 4].try_into().expect("4 bytes"));
    let u64_at = |i: usize| u64::from_le_bytes(header[i..i + 8].try_into().expect("8 bytes"));
    let (kind, header_size, payload_size) = (u16_at(0), u64::from(u32_at(4)), u64_at(8));
    let (minor, major, arch, flags) = (u16_at(24), u16_at(26), u32_at(28), u64_at(40));
    if header_size < ENTRY_HEADER {
        return Err(section.malformed(
            at,
            format!(
                "entry header size {header_size} is below the {ENTRY_HEADER} bytes of its fields"
            ),
        ));
    }
    let next = at
        .checked_add(header_size)
        .and_then(|n| n.checked_add(payload_size))
        .filter(|next| *next <= end)
        .ok_or_else(|| {
            section.malformed(
                at,
                format!("the entry claims a {header_size}-byte header and a {payload_size}-byte payload, past the end of its container"),
            )
        })?;
    if flags & (FLAG_LZ4 | FLAG_ZSTD) != 0 {
        out.compressed_entries += 1;
    }
    let cc = arch_capability(arch)
        .ok_or_else(|| section.malformed(at, format!("entry arch {arch} is not an sm number")))?;
    let variant = if flags & FLAG_ARCH_SPECIFIC != 0 {
        ArchVariant::Specific
    } else if flags & FLAG_FAMILY != 0 && kind == KIND_PTX {
        // cuobjdump names a family cubin by its arch alone: a cubin's reach is its
        // family anyway ([`GpuArch::sass_runs_on`]).
        ArchVariant::Family
    } else {
        ArchVariant::Portable
    };
    let target = GpuArch::new(cc, variant);
    match kind {
        KIND_ELF => {
            out.sass_entries += 1;
            out.sass.insert(target);
        }
        KIND_PTX => {
            out.ptx_entries += 1;
            let isa = (major, minor) != (0, 0);
            out.ptx.insert(PtxTarget {
                arch: target,
                isa: isa.then(|| PtxIsa::new(major.into(), minor.into())),
            });
        }
        _ => out.other_entries += 1,
    }
    Ok(next)
}

/// `90` -> 9.0, `120` -> 12.0: the last digit is the minor (as in `sm_120`).
fn arch_capability(arch: u32) -> Option<ComputeCapability> {
    (10..10_000)
        .contains(&arch)
        .then(|| ComputeCapability::new(arch / 10, arch % 10))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One synthetic entry: kind, arch, flags, (major, minor), payload length.
    struct Entry {
        kind: u16,
        arch: u32,
        flags: u64,
        version: (u16, u16),
        payload: usize,
    }

    fn entry(kind: u16, arch: u32, flags: u64, version: (u16, u16)) -> Entry {
        Entry {
            kind,
            arch,
            flags,
            version,
            payload: 24,
        }
    }

    fn entry_bytes(e: &Entry) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&e.kind.to_le_bytes());
        out.extend_from_slice(&0x0101u16.to_le_bytes());
        out.extend_from_slice(&64u32.to_le_bytes());
        out.extend_from_slice(&(e.payload as u64).to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&e.version.1.to_le_bytes());
        out.extend_from_slice(&e.version.0.to_le_bytes());
        out.extend_from_slice(&e.arch.to_le_bytes());
        out.extend_from_slice(&[0u8; 8]);
        out.extend_from_slice(&e.flags.to_le_bytes());
        out.extend_from_slice(&[0u8; 16]);
        out.extend(std::iter::repeat_n(0xAB, e.payload));
        out
    }

    fn container(entries: &[Entry]) -> Vec<u8> {
        let body: Vec<u8> = entries.iter().flat_map(entry_bytes).collect();
        let mut out = Vec::new();
        out.extend_from_slice(&FATBIN_MAGIC.to_le_bytes());
        out.extend_from_slice(&1u16.to_le_bytes());
        out.extend_from_slice(&16u16.to_le_bytes());
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend(body);
        out
    }

    /// The section `bytes`, placed after 100 bytes of something else in a "file".
    fn parse(bytes: &[u8]) -> Result<SectionCode, FatbinError> {
        let mut file = vec![0x11u8; 100];
        file.extend_from_slice(bytes);
        let section = Section {
            path: Path::new("libx.so"),
            name: FATBIN_SECTION,
            start: 100,
            size: bytes.len() as u64,
        };
        let mut code = SectionCode::default();
        read_section(file.as_slice(), &section, &mut code)?;
        Ok(code)
    }

    fn malformed(bytes: &[u8]) -> (u64, String) {
        match parse(bytes) {
            Err(FatbinError::Malformed { offset, reason, .. }) => (offset, reason),
            other => panic!("expected a malformed fatbin, got {other:?}"),
        }
    }

    #[test]
    fn lists_sass_ptx_and_suffixes() {
        let mut bytes = container(&[
            entry(KIND_ELF, 80, 0x2011, (1, 7)),
            entry(KIND_ELF, 90, 0x10_2011, (1, 7)),
            entry(KIND_PTX, 90, 0x2011, (8, 1)),
        ]);
        bytes.extend_from_slice(&[0u8; 8]);
        bytes.extend(container(&[
            entry(KIND_ELF, 120, 0x120_2011, (1, 8)),
            entry(KIND_PTX, 120, 0x20_2011, (8, 8)),
            entry(KIND_PTX, 52, 0x11, (0, 0)),
            entry(8, 90, 0x11, (0, 0)),
        ]));
        let code = parse(&bytes).unwrap();
        let names: Vec<String> = code.sass.iter().map(ToString::to_string).collect();
        assert_eq!(names, ["sm_80", "sm_90a", "sm_120"]);
        let ptx: Vec<String> = code.ptx.iter().map(ToString::to_string).collect();
        assert_eq!(
            ptx,
            [
                "compute_52 (PTX ISA unknown)",
                "compute_90 (PTX ISA 8.1)",
                "compute_120f (PTX ISA 8.8)"
            ]
        );
        assert_eq!(code.containers, 2);
        assert_eq!((code.sass_entries, code.ptx_entries), (3, 3));
        assert_eq!((code.other_entries, code.compressed_entries), (1, 5));
    }

    #[test]
    fn an_empty_or_zero_section_holds_nothing() {
        assert_eq!(parse(&[]).unwrap(), SectionCode::default());
        assert_eq!(parse(&[0u8; 5000]).unwrap().containers, 0);
    }

    #[test]
    fn a_wrong_magic_names_the_offset() {
        let mut bytes = container(&[entry(KIND_ELF, 80, 0, (1, 7))]);
        let second = bytes.len() as u64;
        bytes.extend_from_slice(b"NOTAFATBINHEADER");
        let (offset, reason) = malformed(&bytes);
        assert_eq!(offset, 100 + second);
        assert!(
            reason.contains("expected the fatbin magic 0xba55ed50"),
            "{reason}"
        );
    }

    #[test]
    fn a_truncated_container_header_is_malformed() {
        let bytes = container(&[entry(KIND_ELF, 80, 0, (1, 7))]);
        let (offset, reason) = malformed(&bytes[..10]);
        assert_eq!(offset, 100);
        assert!(reason.contains("container header"), "{reason}");
    }

    #[test]
    fn a_container_larger_than_its_section_is_malformed() {
        let mut bytes = container(&[entry(KIND_ELF, 80, 0, (1, 7))]);
        bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        let (offset, reason) = malformed(&bytes);
        assert_eq!(offset, 100);
        assert!(reason.contains("past the end of the section"), "{reason}");
    }

    #[test]
    fn an_entry_larger_than_its_container_is_malformed() {
        let mut bytes = container(&[entry(KIND_ELF, 80, 0, (1, 7))]);
        bytes[16 + 8..16 + 16].copy_from_slice(&(u64::MAX - 10).to_le_bytes());
        let (offset, reason) = malformed(&bytes);
        assert_eq!(offset, 116);
        assert!(reason.contains("past the end of its container"), "{reason}");
    }

    #[test]
    fn a_short_entry_header_is_malformed() {
        let mut bytes = container(&[entry(KIND_ELF, 80, 0, (1, 7))]);
        bytes[16 + 4..16 + 8].copy_from_slice(&8u32.to_le_bytes());
        let (_, reason) = malformed(&bytes);
        assert!(reason.contains("entry header size 8"), "{reason}");
        let mut short = container(&[]);
        short[8..16].copy_from_slice(&10u64.to_le_bytes());
        short.extend_from_slice(&[1u8; 10]);
        let (offset, reason) = malformed(&short);
        assert_eq!(offset, 116);
        assert!(reason.contains("too few for an entry header"), "{reason}");
    }

    #[test]
    fn a_container_header_size_below_its_fields_is_malformed() {
        let mut bytes = container(&[entry(KIND_ELF, 80, 0, (1, 7))]);
        bytes[6..8].copy_from_slice(&4u16.to_le_bytes());
        let (_, reason) = malformed(&bytes);
        assert!(reason.contains("container header size 4"), "{reason}");
    }

    #[test]
    fn an_arch_that_is_no_sm_number_is_malformed() {
        let bytes = container(&[entry(KIND_ELF, 3, 0, (1, 7))]);
        let (_, reason) = malformed(&bytes);
        assert!(reason.contains("entry arch 3"), "{reason}");
    }

    #[test]
    fn a_section_past_the_end_of_the_file_is_malformed() {
        let file = vec![0u8; 64];
        let section = Section {
            path: Path::new("libcut.so"),
            name: RELFATBIN_SECTION,
            start: 32,
            size: u64::MAX,
        };
        let error = read_section(file.as_slice(), &section, &mut SectionCode::default())
            .unwrap_err()
            .to_string();
        assert!(error.contains("libcut.so"), "{error}");
        assert!(error.contains("__nv_relfatbin"), "{error}");
        assert!(error.contains("truncated"), "{error}");
    }

    #[test]
    fn the_runnable_code_is_both_sections() {
        let mut code = DeviceCode::default();
        code.relocatable.ptx.insert(PtxTarget {
            arch: "sm_90".parse().unwrap(),
            isa: Some(PtxIsa::new(8, 4)),
        });
        code.fatbin.sass.insert("sm_90".parse().unwrap());
        let runnable = code.runnable();
        assert_eq!(runnable.sass.len(), 1);
        assert_eq!(runnable.ptx.len(), 1);
    }

    #[test]
    fn a_file_that_is_not_elf_has_no_device_code() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("libc.so");
        std::fs::write(&path, "/* GNU ld script */").unwrap();
        assert_eq!(read_device_code(&path).unwrap(), None);
        let error = read_device_code(&dir.path().join("missing.so")).unwrap_err();
        assert!(error.to_string().contains("missing.so"), "{error}");
    }
}
