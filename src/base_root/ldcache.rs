//! `/etc/ld.so.cache` written by cudastack, for images whose architecture the build host's
//! `ldconfig` cannot read (an x86_64 `ldconfig -r` skips every aarch64 object as "for
//! unknown machine 183" and searches the x86_64 multiarch directories).
//!
//! What it writes is what glibc's `ldconfig` writes (`elf/cache.c`, format
//! `glibc-ld.so.cache1.1`, no old-format section, no extensions): one entry per SONAME
//! and directory, for every directory of `/etc/ld.so.conf` (with its includes) and the
//! loader's system directories, in that order; entries sorted in *descending*
//! `_dl_cache_libcmp` order because the loader binary-searches them and takes the first
//! match of a name, so for a SONAME present in two directories the earlier directory wins.
//! The entry flags carry the ABI the loader of that architecture accepts
//! (`_DL_CACHE_DEFAULT_ID`); entries with other flags are ignored by it.

use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::audit::{ld_so_conf_dirs, AuditError, ImageFs};
use crate::elf::{ElfClass, ElfError, ElfProbe, Machine, ObjectKind};
use crate::rootfs::{Node, Resolution};

const MAGIC: &[u8; 20] = b"glibc-ld.so.cache1.1";
const HEADER_SIZE: usize = 48;
const ENTRY_SIZE: usize = 24;
/// `cache_file_new_flags_endian_little`.
const FLAGS_LITTLE_ENDIAN: u8 = 2;
/// `FLAG_ELF_LIBC6`.
const FLAG_ELF_LIBC6: i32 = 0x0003;
/// `FLAG_X8664_LIB64`.
const FLAG_X8664_LIB64: i32 = 0x0300;
/// `FLAG_AARCH64_LIB64`.
const FLAG_AARCH64_LIB64: i32 = 0x0a00;

#[derive(Debug, thiserror::Error)]
pub enum LdCacheError {
    #[error("cudastack cannot write a loader cache for {0:?} objects")]
    UnsupportedMachine(Machine),
    #[error(transparent)]
    Audit(#[from] AuditError),
    #[error("failed to read `{path}` while writing the loader cache")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One cache entry: a SONAME and the image path the loader maps for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheEntry {
    pub soname: String,
    pub path: String,
    flags: i32,
}

/// The loader's system directories of a Debian/Ubuntu (multiarch) glibc, searched after
/// the ld.so.conf ones.
fn system_dirs(machine: Machine) -> Result<&'static [&'static str], LdCacheError> {
    match machine {
        // What Debian's ldconfig scans after ld.so.conf (its SYSTEM_DIRS; not /lib64).
        Machine::X86_64 => Ok(&[
            "/lib/x86_64-linux-gnu",
            "/usr/lib/x86_64-linux-gnu",
            "/lib",
            "/usr/lib",
        ]),
        Machine::Aarch64 => Ok(&[
            "/lib/aarch64-linux-gnu",
            "/usr/lib/aarch64-linux-gnu",
            "/lib",
            "/usr/lib",
        ]),
        other => Err(LdCacheError::UnsupportedMachine(other)),
    }
}

fn entry_flags(machine: Machine) -> Result<i32, LdCacheError> {
    match machine {
        Machine::X86_64 => Ok(FLAG_ELF_LIBC6 | FLAG_X8664_LIB64),
        Machine::Aarch64 => Ok(FLAG_ELF_LIBC6 | FLAG_AARCH64_LIB64),
        other => Err(LdCacheError::UnsupportedMachine(other)),
    }
}

/// glibc's `_dl_cache_libcmp`: byte order, except that runs of digits compare as numbers
/// (`libfoo.so.10` > `libfoo.so.9`) and a digit sorts after any non-digit.
pub fn libcmp(a: &str, b: &str) -> Ordering {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let (mut i, mut j) = (0, 0);
    while i < a.len() {
        if a[i].is_ascii_digit() {
            if j < b.len() && b[j].is_ascii_digit() {
                let (mut x, mut y) = (0u64, 0u64);
                while i < a.len() && a[i].is_ascii_digit() {
                    x = x.saturating_mul(10).saturating_add(u64::from(a[i] - b'0'));
                    i += 1;
                }
                while j < b.len() && b[j].is_ascii_digit() {
                    y = y.saturating_mul(10).saturating_add(u64::from(b[j] - b'0'));
                    j += 1;
                }
                if x != y {
                    return x.cmp(&y);
                }
            } else {
                return Ordering::Greater;
            }
        } else if j < b.len() && b[j].is_ascii_digit() {
            return Ordering::Less;
        } else if j >= b.len() || a[i] != b[j] {
            return a[i].cmp(b.get(j).unwrap_or(&0));
        } else {
            i += 1;
            j += 1;
        }
    }
    0u8.cmp(b.get(j).unwrap_or(&0))
}

/// The entries `ldconfig` would cache for the image `fs`, in cache order.
pub fn cache_entries(fs: &dyn ImageFs, machine: Machine) -> Result<Vec<CacheEntry>, LdCacheError> {
    let flags = entry_flags(machine)?;
    let mut dirs = ld_so_conf_dirs(fs)?;
    dirs.extend(system_dirs(machine)?.iter().map(PathBuf::from));
    let mut scanned = BTreeSet::new();
    let mut entries = Vec::new();
    for dir in dirs {
        // A directory reached twice (merged /usr: /lib/x86_64-linux-gnu is
        // /usr/lib/x86_64-linux-gnu) is scanned once, under the first name it was given.
        let Resolution::Found(resolved) = fs.resolve(&dir).map_err(io(&dir))? else {
            continue;
        };
        let is_dir = fs
            .node(&resolved)
            .map_err(io(&resolved))?
            .is_some_and(|node| node.is_dir());
        if !is_dir || !scanned.insert(resolved.clone()) {
            continue;
        }
        let mut sonames = BTreeSet::new();
        for name in library_names(fs, &resolved)? {
            let Some(soname) = cached_name(fs, &dir, &resolved, &name, machine)? else {
                continue;
            };
            if !sonames.insert(soname.clone()) {
                continue;
            }
            // Like ldconfig, the entry names DIR/SONAME: the link the SONAME chain provides.
            entries.push(CacheEntry {
                path: dir.join(&soname).to_string_lossy().into_owned(),
                soname,
                flags,
            });
        }
    }
    // Stable: among equal names the earlier directory stays first, and wins.
    entries.sort_by(|a, b| libcmp(&b.soname, &a.soname));
    Ok(entries)
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> LdCacheError {
    let path = path.to_path_buf();
    move |source| LdCacheError::Io { path, source }
}

/// The names in the image directory `dir` ldconfig looks at (`lib*.so*`, `ld-*.so*`),
/// sorted.
fn library_names(fs: &dyn ImageFs, dir: &Path) -> Result<Vec<String>, LdCacheError> {
    let mut names: Vec<String> = fs
        .list(dir)
        .map_err(io(dir))?
        .into_iter()
        .filter(|name| (name.starts_with("lib") || name.starts_with("ld-")) && name.contains(".so"))
        .collect();
    names.sort();
    Ok(names)
}

/// The name `dir/name` is cached under, if it is a 64-bit shared object of `machine`.
/// `resolved_dir` is `dir` with its links resolved.
fn cached_name(
    fs: &dyn ImageFs,
    dir: &Path,
    resolved_dir: &Path,
    name: &str,
    machine: Machine,
) -> Result<Option<String>, LdCacheError> {
    let image_path = dir.join(name);
    let Resolution::Found(target) = fs.resolve(&image_path).map_err(io(&image_path))? else {
        return Ok(None);
    };
    if !matches!(
        fs.node(&target).map_err(io(&target))?,
        Some(Node::File { .. })
    ) {
        return Ok(None);
    }
    let info = match fs.elf(&target) {
        Ok(ElfProbe::Elf(info)) => info,
        Ok(ElfProbe::NotElf) | Err(ElfError::Malformed { .. }) => return Ok(None),
        Err(e) => {
            return Err(LdCacheError::Io {
                path: target,
                source: std::io::Error::other(e.to_string()),
            })
        }
    };
    if info.kind != ObjectKind::SharedObject
        || info.machine != machine
        || info.class != ElfClass::Elf64
    {
        return Ok(None);
    }
    let soname = info.soname.unwrap_or_else(|| name.to_string());
    // ldconfig's rule for links (elf/ldconfig.c, search_dir): a link named like the
    // SONAME, or a `.so` development link whose name the SONAME starts with
    // (`libz.so -> libz.so.1.2.13`), is cached under its own name; any other link
    // (`libalias.so.7 -> libfoo.so.1`) counts as the file it points to, under its SONAME.
    let is_link = matches!(
        fs.node(&resolved_dir.join(name))
            .map_err(io(resolved_dir))?,
        Some(Node::Symlink(_))
    );
    if is_link && (name == soname || (name.ends_with(".so") && soname.starts_with(name))) {
        return Ok(Some(name.to_string()));
    }
    Ok(Some(soname))
}

/// `cache_extension_magic` (elf/dl-cache.h).
const EXTENSION_MAGIC: u32 = 0xeaa4_2174;
/// `cache_extension_tag_generator`: the name and version of the ldconfig that wrote it.
const EXTENSION_TAG_GENERATOR: u32 = 0;

/// The bytes of `/etc/ld.so.cache` for `entries` (in the order given), as glibc's
/// `ldconfig` (elf/cache.c, save_cache) writes them: header, entries, the string table of
/// elf/stringtable.c, and, when `generator` is known, the extension naming it.
pub fn serialize(entries: &[CacheEntry], generator: Option<&[u8]>) -> Vec<u8> {
    let strings_start = HEADER_SIZE + ENTRY_SIZE * entries.len();
    let (strings, offsets) = string_table(
        entries
            .iter()
            .flat_map(|e| [e.soname.as_str(), e.path.as_str()]),
    );
    let extension_offset = generator.map(|_| (strings_start + strings.len()).next_multiple_of(4));
    let mut out = Vec::with_capacity(strings_start + strings.len() + 128);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    out.extend_from_slice(&(strings.len() as u32).to_le_bytes());
    out.push(FLAGS_LITTLE_ENDIAN);
    out.extend_from_slice(&[0; 3]);
    out.extend_from_slice(&(extension_offset.unwrap_or(0) as u32).to_le_bytes());
    // Three unused words.
    out.extend_from_slice(&[0; 12]);
    debug_assert_eq!(out.len(), HEADER_SIZE);
    let offset_of = |text: &str| (strings_start as u32) + offsets[text];
    for entry in entries {
        out.extend_from_slice(&entry.flags.to_le_bytes());
        out.extend_from_slice(&offset_of(&entry.soname).to_le_bytes());
        out.extend_from_slice(&offset_of(&entry.path).to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes()); // osversion (unused)
        out.extend_from_slice(&0u64.to_le_bytes()); // hwcap
    }
    out.extend_from_slice(&strings);
    if let (Some(generator), Some(extension_offset)) = (generator, extension_offset) {
        out.resize(extension_offset, 0);
        // One section: the generator string (its bytes, without a NUL) after the
        // directory (magic, count, then tag / flags / offset / size per section).
        let data_offset = extension_offset + 8 + 16;
        for word in [
            EXTENSION_MAGIC,
            1,
            EXTENSION_TAG_GENERATOR,
            0,
            data_offset as u32,
            generator.len() as u32,
        ] {
            out.extend_from_slice(&word.to_le_bytes());
        }
        out.extend_from_slice(generator);
    }
    out
}

/// glibc's string table (elf/stringtable.c, stringtable_finalize): every distinct string
/// once, ordered by its bytes from the end, descending (of two strings one of which ends
/// the other, the longer first), and a string that ends the one before it shares that
/// one's bytes. Checked byte for byte against ldconfig (tests/stack_ldcache.rs).
/// Returns the table and each string's offset in it.
fn string_table<'a>(
    strings: impl Iterator<Item = &'a str>,
) -> (Vec<u8>, std::collections::HashMap<&'a str, u32>) {
    let mut distinct: Vec<&str> = strings.collect::<BTreeSet<_>>().into_iter().collect();
    distinct.sort_by(|left, right| {
        let (l, r) = (left.as_bytes(), right.as_bytes());
        l.iter()
            .rev()
            .zip(r.iter().rev())
            .map(|(a, b)| b.cmp(a))
            .find(|order| order.is_ne())
            // All shared bytes equal: the longer string first.
            .unwrap_or_else(|| r.len().cmp(&l.len()))
    });
    let mut offsets = std::collections::HashMap::new();
    let mut table: Vec<u8> = Vec::new();
    let mut previous: Option<(&str, u32)> = None;
    for text in distinct {
        let offset = match previous {
            Some((before, at)) if before.ends_with(text) => at + (before.len() - text.len()) as u32,
            Some((before, at)) => at + before.len() as u32 + 1,
            None => 0,
        };
        let end = offset as usize + text.len() + 1;
        if table.len() < end {
            table.resize(end, 0);
        }
        table[offset as usize..end - 1].copy_from_slice(text.as_bytes());
        offsets.insert(text, offset);
        previous = Some((text, offset));
    }
    (table, offsets)
}

/// The generator string the image's own `ldconfig` writes into its caches
/// (`ldconfig (Debian GLIBC 2.36-9+deb12u13) stable release version 2.36`), read from
/// that binary, so the cache is what the image would write itself whatever the build
/// host runs. None when the image has no ldconfig or the string is not found.
pub fn image_generator(fs: &dyn ImageFs) -> Option<Vec<u8>> {
    let binary = ["/usr/sbin/ldconfig", "/sbin/ldconfig"]
        .iter()
        .find_map(|path| match fs.resolve(Path::new(path)) {
            Ok(Resolution::Found(found)) => fs.read(&found).ok(),
            _ => None,
        })?;
    const START: &[u8] = b"ldconfig (";
    const MARK: &[u8] = b" release version ";
    let mut from = 0;
    while let Some(at) = find(&binary[from..], START) {
        let start = from + at;
        let end = start + binary[start..].iter().position(|&b| b == 0)?;
        let text = &binary[start..end];
        if find(text, MARK).is_some() {
            return Some(text.to_vec());
        }
        from = start + START.len();
    }
    None
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// `/etc/ld.so.cache` for the image `fs` of `machine`: what its own `ldconfig` would
/// write there (`ldconfig -r root` with the image's glibc).
pub fn ld_so_cache(fs: &dyn ImageFs, machine: Machine) -> Result<Vec<u8>, LdCacheError> {
    let generator = image_generator(fs);
    Ok(serialize(
        &cache_entries(fs, machine)?,
        generator.as_deref(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libcmp_orders_like_glibc() {
        assert_eq!(libcmp("libfoo.so.10", "libfoo.so.9"), Ordering::Greater);
        assert_eq!(libcmp("libfoo.so.1", "libfoo.so.1"), Ordering::Equal);
        assert_eq!(libcmp("libfoo.so", "libfoo.so.1"), Ordering::Less);
        assert_eq!(libcmp("libc.so.6", "libcap.so.2"), Ordering::Less);
        // A digit sorts after a non-digit, whatever their bytes.
        assert_eq!(libcmp("lib1", "libz"), Ordering::Greater);
        assert_eq!(libcmp("libz", "lib1"), Ordering::Less);
    }

    #[test]
    fn serialised_cache_parses_back() {
        let entries = vec![
            CacheEntry {
                soname: "libz.so.1".into(),
                path: "/usr/lib/aarch64-linux-gnu/libz.so.1".into(),
                flags: FLAG_ELF_LIBC6 | FLAG_AARCH64_LIB64,
            },
            CacheEntry {
                soname: "libc.so.6".into(),
                path: "/usr/lib/aarch64-linux-gnu/libc.so.6".into(),
                flags: FLAG_ELF_LIBC6 | FLAG_AARCH64_LIB64,
            },
        ];
        let bytes = serialize(&entries, None);
        let parsed = crate::host::stack::parse_ld_so_cache(&bytes).expect("a cache");
        let pairs: Vec<_> = parsed
            .iter()
            .map(|e| (e.name.as_str(), e.path.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("libz.so.1", "/usr/lib/aarch64-linux-gnu/libz.so.1"),
                ("libc.so.6", "/usr/lib/aarch64-linux-gnu/libc.so.6")
            ]
        );
        assert_eq!(
            i32::from_le_bytes(bytes[48..52].try_into().unwrap()),
            0x0a03
        );
    }
}
