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
//! Headers are read by offset (`pread`): a 900 MB libtorch_cuda.so costs a few thousand
//! 64-byte reads. The header's target and PTX ISA version are what cuobjdump prints and
//! what the PTX text says (checked on 1,073 PTX entries), so no large payload is read or
//! decompressed. Only modules of at most 8 KiB are opened (LZ4 or Zstandard as the flags
//! say), to tell nvcc's placeholder modules, which define no kernel, from code (see
//! [`SectionCode::empty_sass`]). Nothing is memory-mapped and every size read from the
//! file is checked against the section before it is used, so a truncated or lying header
//! is a [`FatbinError::Malformed`] naming the file and the offset, and no read or
//! allocation depends on a size the file claims beyond that 8 KiB bound.

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
/// Entries whose code is at most this size are opened to see whether they define a kernel
/// ([`defines_kernels`]); larger ones are taken to.
const SMALL_MODULE: u64 = 8 * 1024;

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
    /// One of the errors above, as an audit recorded it (its text kept, `path` the image's).
    #[error("{message}")]
    Recorded { path: PathBuf, message: String },
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
    /// Cubin targets of modules that define no kernel (see [`defines_kernels`]): listed by
    /// cuobjdump, but no code a launch can need. Not in `sass`.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub empty_sass: BTreeSet<GpuArch>,
    /// PTX of modules that define no kernel. Not in `ptx`.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub empty_ptx: BTreeSet<PtxTarget>,
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
            empty_sass: a.empty_sass.union(&b.empty_sass).copied().collect(),
            empty_ptx: a.empty_ptx.union(&b.empty_ptx).copied().collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.fatbin.is_empty() && self.relocatable.is_empty()
    }
}

/// Positioned reads, so headers are read where they lie without a shared cursor.
pub trait ReadAt {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()>;
    /// The size of the whole file, which every section must lie within.
    fn size(&self) -> std::io::Result<u64>;
}

impl ReadAt for std::fs::File {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self, buf, offset)
    }
    fn size(&self) -> std::io::Result<u64> {
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
    fn size(&self) -> std::io::Result<u64> {
        Ok(self.len() as u64)
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
    for place in sections {
        let section = Section {
            path,
            name: place.name,
            start: place.offset,
            size: place.size,
        };
        let target = if place.name == FATBIN_SECTION {
            &mut code.fatbin
        } else {
            &mut code.relocatable
        };
        read_section(&file, &section, target)?;
    }
    Ok((!code.is_empty()).then_some(code))
}

/// Where a fatbin section lies in its file.
struct SectionPlace {
    name: &'static str,
    offset: u64,
    size: u64,
}

/// The fatbin sections of an ELF file; None when it is not ELF or has none.
fn fatbin_sections(
    file: &std::fs::File,
    path: &Path,
) -> Result<Option<Vec<SectionPlace>>, FatbinError> {
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
) -> object::read::Result<Vec<SectionPlace>>
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
                found.push(SectionPlace {
                    name,
                    offset: section.sh_offset(endian).into(),
                    size: section.sh_size(endian).into(),
                });
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
    let file_len = file.size().map_err(|source| FatbinError::Io {
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

/// The fields of an entry header cudastack uses (layout in the module documentation).
struct EntryHeader {
    kind: u16,
    header_size: u64,
    /// Bytes the payload takes in the container (padded to 8).
    payload_size: u64,
    /// Bytes of the payload actually stored (compressed size); 0 for a stored entry.
    stored_size: u64,
    isa: (u16, u16),
    arch: u32,
    flags: u64,
    uncompressed_size: u64,
}

impl EntryHeader {
    fn parse(header: &[u8; ENTRY_HEADER as usize]) -> Self {
        let u16_at = |i: usize| u16::from_le_bytes([header[i], header[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes(header[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(header[i..i + 8].try_into().expect("8 bytes"));
        Self {
            kind: u16_at(0),
            header_size: u64::from(u32_at(4)),
            payload_size: u64_at(8),
            stored_size: u64::from(u32_at(16)),
            isa: (u16_at(26), u16_at(24)),
            arch: u32_at(28),
            flags: u64_at(40),
            uncompressed_size: u64_at(56),
        }
    }

    fn target(&self) -> Option<GpuArch> {
        let variant = if self.flags & FLAG_ARCH_SPECIFIC != 0 {
            ArchVariant::Specific
        } else if self.flags & FLAG_FAMILY != 0 && self.kind == KIND_PTX {
            // cuobjdump names a family cubin by its arch alone: a cubin's reach is its
            // family anyway ([`GpuArch::sass_runs_on`]).
            ArchVariant::Family
        } else {
            ArchVariant::Portable
        };
        Some(GpuArch::new(arch_capability(self.arch)?, variant))
    }
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
    let mut bytes = [0u8; ENTRY_HEADER as usize];
    section.read(file, at, &mut bytes, "fatbin entry header")?;
    let header = EntryHeader::parse(&bytes);
    let (header_size, payload_size) = (header.header_size, header.payload_size);
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
    if header.flags & (FLAG_LZ4 | FLAG_ZSTD) != 0 {
        out.compressed_entries += 1;
    }
    if header.kind != KIND_ELF && header.kind != KIND_PTX {
        // Another kind (LTO IR, an index): no code a launch runs, and its arch field
        // need not be an sm number.
        out.other_entries += 1;
        return Ok(next);
    }
    let target = header.target().ok_or_else(|| {
        section.malformed(
            at,
            format!("entry arch {} is not an sm number", header.arch),
        )
    })?;
    let kernels = defines_kernels(file, section, at + header_size, &header)?;
    match header.kind {
        KIND_ELF => {
            out.sass_entries += 1;
            let set = if kernels {
                &mut out.sass
            } else {
                &mut out.empty_sass
            };
            set.insert(target);
        }
        KIND_PTX => {
            out.ptx_entries += 1;
            let (major, minor) = header.isa;
            let ptx = PtxTarget {
                arch: target,
                isa: ((major, minor) != (0, 0)).then(|| PtxIsa::new(major.into(), minor.into())),
            };
            let set = if kernels {
                &mut out.ptx
            } else {
                &mut out.empty_ptx
            };
            set.insert(ptx);
        }
        _ => out.other_entries += 1,
    }
    Ok(next)
}

/// Whether a cubin or PTX entry defines a kernel. nvcc embeds a module for its default
/// arch in every `.cu` file, kernels or not: libcufftw 11's only cubin (sm_52, 760 bytes)
/// has no `.text` section, and torch's libcusparseLt carries a 131-byte compute_52 PTX
/// with no `.entry`. Such a module cannot fail a launch, and its arch must not count as
/// code the library has. Only entries of at most [`SMALL_MODULE`] bytes, stored and
/// inflated, are opened (so nothing read or allocated depends on a larger claimed size);
/// any other entry, and one whose bytes are not what its header says, counts as code.
fn defines_kernels<R: ReadAt + ?Sized>(
    file: &R,
    section: &Section<'_>,
    payload_at: u64,
    header: &EntryHeader,
) -> Result<bool, FatbinError> {
    let compressed = header.flags & (FLAG_LZ4 | FLAG_ZSTD) != 0;
    let stored = match header.stored_size {
        0 => header.payload_size,
        size => size.min(header.payload_size),
    };
    let inflated = if compressed {
        header.uncompressed_size
    } else {
        stored
    };
    if !matches!(header.kind, KIND_ELF | KIND_PTX)
        || stored > SMALL_MODULE
        || inflated > SMALL_MODULE
    {
        return Ok(true);
    }
    let mut raw = vec![0u8; stored as usize];
    section.read(file, payload_at, &mut raw, "fatbin entry payload")?;
    let code = if header.flags & FLAG_LZ4 != 0 {
        let mut out = vec![0u8; inflated as usize];
        match lz4_flex::block::decompress_into(&raw, &mut out) {
            Ok(len) => out[..len].to_vec(),
            Err(_) => return Ok(true),
        }
    } else if header.flags & FLAG_ZSTD != 0 {
        match zstd::bulk::decompress(&raw, inflated as usize) {
            Ok(out) => out,
            Err(_) => return Ok(true),
        }
    } else {
        raw
    };
    Ok(match header.kind {
        KIND_ELF => cubin_defines_kernels(&code),
        _ => code.windows(b".entry".len()).any(|w| w == b".entry"),
    })
}

/// A cubin defines a kernel when it has a `.text.<name>` section; one that is not a
/// readable ELF file counts as defining one.
fn cubin_defines_kernels(bytes: &[u8]) -> bool {
    use object::{Object, ObjectSection};
    match object::read::elf::ElfFile64::<Endianness>::parse(bytes) {
        Ok(cubin) => cubin
            .sections()
            .any(|section| section.name().is_ok_and(|name| name.starts_with(".text."))),
        Err(_) => true,
    }
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

    /// One synthetic entry: kind, arch, flags, (major, minor), the stored payload and
    /// the header's stored (compressed) and inflated sizes.
    struct Entry {
        kind: u16,
        arch: u32,
        flags: u64,
        version: (u16, u16),
        payload: Vec<u8>,
        stored: u32,
        inflated: u64,
    }

    /// An entry whose 24-byte payload names a kernel (and, marked compressed, does not
    /// inflate: it counts as code either way).
    fn entry(kind: u16, arch: u32, flags: u64, version: (u16, u16)) -> Entry {
        Entry {
            kind,
            arch,
            flags,
            version,
            payload: b"// .visible .entry k(){}".to_vec(),
            stored: 0,
            inflated: 0,
        }
    }

    fn entry_bytes(e: &Entry) -> Vec<u8> {
        let padded = e.payload.len().next_multiple_of(8);
        let mut out = Vec::new();
        out.extend_from_slice(&e.kind.to_le_bytes());
        out.extend_from_slice(&0x0101u16.to_le_bytes());
        out.extend_from_slice(&64u32.to_le_bytes());
        out.extend_from_slice(&(padded as u64).to_le_bytes());
        out.extend_from_slice(&e.stored.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&e.version.1.to_le_bytes());
        out.extend_from_slice(&e.version.0.to_le_bytes());
        out.extend_from_slice(&e.arch.to_le_bytes());
        out.extend_from_slice(&[0u8; 8]);
        out.extend_from_slice(&e.flags.to_le_bytes());
        out.extend_from_slice(&[0u8; 8]);
        out.extend_from_slice(&e.inflated.to_le_bytes());
        out.extend_from_slice(&e.payload);
        out.resize(64 + padded, 0);
        out
    }

    /// A minimal ELF64 file with sections of these names (a cubin's shape, no contents).
    fn tiny_cubin(names: &[&str]) -> Vec<u8> {
        let mut strings = vec![0u8];
        let mut name_offsets = Vec::new();
        for name in names.iter().chain(&[".shstrtab"]) {
            name_offsets.push(strings.len() as u32);
            strings.extend_from_slice(name.as_bytes());
            strings.push(0);
        }
        let section_headers = (64 + strings.len()).next_multiple_of(8);
        let count = names.len() + 2;
        let mut out = vec![
            0x7f, b'E', b'L', b'F', 2, 1, 1, 0x33, 7, 0, 0, 0, 0, 0, 0, 0,
        ];
        out.extend_from_slice(&2u16.to_le_bytes());
        out.extend_from_slice(&190u16.to_le_bytes());
        out.extend_from_slice(&1u32.to_le_bytes());
        out.extend_from_slice(&[0u8; 16]);
        out.extend_from_slice(&(section_headers as u64).to_le_bytes());
        out.extend_from_slice(&0x0056_0556u32.to_le_bytes());
        for half in [64u16, 0, 0, 64, count as u16, count as u16 - 1] {
            out.extend_from_slice(&half.to_le_bytes());
        }
        out.extend_from_slice(&strings);
        out.resize(section_headers, 0);
        out.extend_from_slice(&[0u8; 64]);
        for (index, name) in name_offsets.iter().enumerate() {
            let strtab = index == names.len();
            let mut header = [0u8; 64];
            header[0..4].copy_from_slice(&name.to_le_bytes());
            header[4..8].copy_from_slice(&(if strtab { 3u32 } else { 1 }).to_le_bytes());
            if strtab {
                header[24..32].copy_from_slice(&64u64.to_le_bytes());
                header[32..40].copy_from_slice(&(strings.len() as u64).to_le_bytes());
            }
            out.extend_from_slice(&header);
        }
        out
    }

    /// An entry holding `code` as nvcc stores it: as is, LZ4 (0x2000) or Zstandard (0x8000).
    fn module(kind: u16, arch: u32, flags: u64, version: (u16, u16), code: &[u8]) -> Entry {
        let payload = if flags & FLAG_LZ4 != 0 {
            let mut out = vec![0u8; code.len() * 2 + 64];
            let len = lz4_flex::block::compress_into(code, &mut out).unwrap();
            out.truncate(len);
            out
        } else if flags & FLAG_ZSTD != 0 {
            zstd::bulk::compress(code, 3).unwrap()
        } else {
            code.to_vec()
        };
        let compressed = flags & (FLAG_LZ4 | FLAG_ZSTD) != 0;
        Entry {
            kind,
            arch,
            flags,
            version,
            stored: if compressed { payload.len() as u32 } else { 0 },
            inflated: if compressed { code.len() as u64 } else { 0 },
            payload,
        }
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

    fn sass_names(set: &BTreeSet<GpuArch>) -> Vec<String> {
        set.iter().map(ToString::to_string).collect()
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

    /// nvcc's placeholder modules (no kernel) do not count as code for their arch.
    #[test]
    fn modules_without_kernels_are_set_apart() {
        let empty_ptx = b".version 8.0\n.target sm_52\n.address_size 64\n\0";
        let kernel_ptx =
            b".version 8.1\n.target sm_90\n.address_size 64\n.visible .entry k()\n{\nret;\n}\n\0";
        let bytes = container(&[
            module(
                KIND_ELF,
                52,
                0x11,
                (1, 7),
                &tiny_cubin(&[".strtab", ".symtab", ".nv.callgraph"]),
            ),
            module(
                KIND_ELF,
                80,
                0x2011,
                (1, 7),
                &tiny_cubin(&[".symtab", ".text._Z1kv", ".nv.info._Z1kv"]),
            ),
            module(KIND_ELF, 86, 0x11, (1, 7), &[0x7f, b'E', b'L', b'F', 0, 0]),
            module(KIND_PTX, 52, 0x2011, (8, 0), empty_ptx),
            module(KIND_PTX, 90, 0x8011, (8, 1), kernel_ptx),
            module(KIND_PTX, 89, 0x8011, (8, 1), empty_ptx),
        ]);
        let code = parse(&bytes).unwrap();
        assert_eq!(
            sass_names(&code.sass),
            ["sm_80", "sm_86"],
            "a cubin that is not ELF counts"
        );
        assert_eq!(sass_names(&code.empty_sass), ["sm_52"]);
        let ptx: Vec<String> = code.ptx.iter().map(ToString::to_string).collect();
        assert_eq!(ptx, ["compute_90 (PTX ISA 8.1)"]);
        let empty: Vec<String> = code.empty_ptx.iter().map(|p| p.arch.to_string()).collect();
        assert_eq!(empty, ["sm_52", "sm_89"]);
        assert_eq!(
            (code.sass_entries, code.ptx_entries, code.compressed_entries),
            (3, 3, 4)
        );
        // A large claimed size is not opened: it counts as code.
        let mut large = module(KIND_PTX, 75, 0x2011, (8, 0), empty_ptx);
        large.inflated = SMALL_MODULE + 1;
        let code = parse(&container(&[large])).unwrap();
        assert_eq!(code.ptx.len(), 1);
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
        // An entry of another kind is counted, whatever its arch field holds.
        let other = parse(&container(&[entry(16, 0, 0, (0, 0))])).unwrap();
        assert_eq!(other.other_entries, 1);
        assert!(other.sass.is_empty() && other.ptx.is_empty());
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
