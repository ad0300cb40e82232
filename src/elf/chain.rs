//! SONAME symlink chains: `libX.so -> libX.so.MAJOR -> real file`.
//!
//! The loader opens libraries by their `DT_SONAME` (`libcudnn.so.9`) and the link editor
//! (`-lcudnn`) by the development name (`libcudnn.so`). NVIDIA's redist archives ship the
//! chain as symlinks; wheels cannot hold symlinks, so the nvidia-* wheels ship one regular
//! file per library, named after its SONAME or not. [`plan_soname_links`] computes the
//! missing links from each library's SONAME; with a redist directory whose links are
//! already present it plans nothing. It is pure: [`scan_library_dir`] gathers its input and
//! the assembler decides where the links go (a layer, or a directory on disk).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{read_elf, ElfError, ElfProbe};

#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    #[error("failed to list library directory `{path}`")]
    ReadDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("library directory entry `{path}` does not have a UTF-8 file name")]
    NonUtf8Name { path: PathBuf },
    #[error(transparent)]
    Elf(#[from] ElfError),
}

/// One entry of a library directory, as the chain planner needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LibraryEntry {
    /// File name within the directory.
    pub name: String,
    pub kind: LibraryEntryKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum LibraryEntryKind {
    /// A regular file; `soname` is its `DT_SONAME` (None for non-ELF files or no SONAME).
    File { soname: Option<String> },
    /// A symlink already present (redist archives), with its target as written.
    Symlink { target: String },
}

/// A symlink to create: `link` (a file name in the directory) pointing at `target` (a
/// file name in the same directory, so the link stays valid wherever the directory goes).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct PlannedLink {
    pub link: String,
    pub target: String,
}

/// The development name of a SONAME: `libcudnn.so.9` -> `libcudnn.so`. None when the
/// SONAME has no version suffix (then it is its own development name).
pub fn development_name(soname: &str) -> Option<&str> {
    let at = soname.find(".so.")?;
    Some(&soname[..at + 3])
}

/// Compare names the way people read versions: digit runs numerically
/// (`libfoo.so.1.10` > `libfoo.so.1.9`).
pub fn compare_versioned_names(a: &str, b: &str) -> Ordering {
    fn runs(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let mut start = 0;
        let bytes = s.as_bytes();
        for i in 1..=bytes.len() {
            if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[start].is_ascii_digit() {
                out.push((bytes[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        out
    }
    let (left, right) = (runs(a), runs(b));
    for (l, r) in left.iter().zip(&right) {
        let order = match (l, r) {
            ((true, x), (true, y)) => {
                let (x, y) = (x.trim_start_matches('0'), y.trim_start_matches('0'));
                x.len().cmp(&y.len()).then_with(|| x.cmp(y))
            }
            ((_, x), (_, y)) => x.cmp(y),
        };
        if order != Ordering::Equal {
            return order;
        }
    }
    left.len().cmp(&right.len()).then_with(|| a.cmp(b))
}

/// Plan the symlinks that complete every library's chain in one directory.
///
/// For each SONAME provided by a regular file: if no entry is named after the SONAME, link
/// it to the providing file (the newest by version-aware name when several files share a
/// SONAME, as ldconfig does); if no entry has the development name, link that to the
/// SONAME (the newest SONAME wins when several majors share a development name). Existing
/// entries are never replaced. The result is sorted by link name.
pub fn plan_soname_links(entries: &[LibraryEntry]) -> Vec<PlannedLink> {
    let existing: BTreeSet<&str> = entries.iter().map(|entry| entry.name.as_str()).collect();
    let mut providers: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for entry in entries {
        if let LibraryEntryKind::File {
            soname: Some(soname),
        } = &entry.kind
        {
            // A SONAME with a path separator cannot name a file in this directory.
            if !soname.contains('/') && !soname.is_empty() {
                providers.entry(soname).or_default().push(&entry.name);
            }
        }
    }
    let mut sonames: Vec<&str> = providers.keys().copied().collect();
    sonames.sort_by(|a, b| compare_versioned_names(b, a));

    let mut planned: BTreeMap<String, String> = BTreeMap::new();
    for soname in sonames {
        if !existing.contains(soname) {
            let newest = providers[soname]
                .iter()
                .copied()
                .max_by(|a, b| compare_versioned_names(a, b))
                .expect("every SONAME has a provider");
            planned.insert(soname.to_string(), newest.to_string());
        }
        if let Some(dev) = development_name(soname) {
            if !existing.contains(dev) && !planned.contains_key(dev) {
                planned.insert(dev.to_string(), soname.to_string());
            }
        }
    }
    planned
        .into_iter()
        .map(|(link, target)| PlannedLink { link, target })
        .collect()
}

/// List a library directory (not recursive), reading the SONAME of every regular file
/// whose name contains `.so`. Symlinks are reported, not followed. Sorted by name.
pub fn scan_library_dir(dir: &Path) -> Result<Vec<LibraryEntry>, ChainError> {
    let read_dir_error = |source| ChainError::ReadDir {
        path: dir.to_path_buf(),
        source,
    };
    let mut entries = Vec::new();
    for item in std::fs::read_dir(dir).map_err(read_dir_error)? {
        let item = item.map_err(read_dir_error)?;
        let path = item.path();
        let name = item
            .file_name()
            .into_string()
            .map_err(|_| ChainError::NonUtf8Name { path: path.clone() })?;
        let file_type = item.file_type().map_err(read_dir_error)?;
        let kind = if file_type.is_symlink() {
            let target = std::fs::read_link(&path).map_err(|source| ChainError::ReadDir {
                path: path.clone(),
                source,
            })?;
            LibraryEntryKind::Symlink {
                target: target.to_string_lossy().into_owned(),
            }
        } else if file_type.is_file() {
            let soname = if name.contains(".so") {
                match read_elf(&path)? {
                    ElfProbe::Elf(info) => info.soname,
                    ElfProbe::NotElf => None,
                }
            } else {
                None
            };
            LibraryEntryKind::File { soname }
        } else {
            continue;
        };
        entries.push(LibraryEntry { name, kind });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(entries)
}

/// [`scan_library_dir`] then [`plan_soname_links`], with link paths joined onto `dir`.
pub fn plan_for_dir(dir: &Path) -> Result<Vec<(PathBuf, String)>, ChainError> {
    let entries = scan_library_dir(dir)?;
    Ok(plan_soname_links(&entries)
        .into_iter()
        .map(|planned| (dir.join(planned.link), planned.target))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, soname: Option<&str>) -> LibraryEntry {
        LibraryEntry {
            name: name.into(),
            kind: LibraryEntryKind::File {
                soname: soname.map(str::to_string),
            },
        }
    }
    fn link(name: &str, target: &str) -> LibraryEntry {
        LibraryEntry {
            name: name.into(),
            kind: LibraryEntryKind::Symlink {
                target: target.into(),
            },
        }
    }
    fn planned(link: &str, target: &str) -> PlannedLink {
        PlannedLink {
            link: link.into(),
            target: target.into(),
        }
    }

    #[test]
    fn wheel_layout_gets_development_links() {
        let entries = [
            file("libcudnn.so.9", Some("libcudnn.so.9")),
            file("libcudnn_ops.so.9", Some("libcudnn_ops.so.9")),
            file("__init__.py", None),
        ];
        assert_eq!(
            plan_soname_links(&entries),
            vec![
                planned("libcudnn.so", "libcudnn.so.9"),
                planned("libcudnn_ops.so", "libcudnn_ops.so.9"),
            ]
        );
    }

    #[test]
    fn fully_versioned_file_gets_the_whole_chain() {
        let entries = [file("libcudnn.so.9.1.0", Some("libcudnn.so.9"))];
        assert_eq!(
            plan_soname_links(&entries),
            vec![
                planned("libcudnn.so", "libcudnn.so.9"),
                planned("libcudnn.so.9", "libcudnn.so.9.1.0"),
            ]
        );
    }

    #[test]
    fn redist_layout_with_links_plans_nothing() {
        let entries = [
            link("libcudnn.so", "libcudnn.so.9"),
            link("libcudnn.so.9", "libcudnn.so.9.1.0"),
            file("libcudnn.so.9.1.0", Some("libcudnn.so.9")),
        ];
        assert!(plan_soname_links(&entries).is_empty());
    }

    #[test]
    fn newest_provider_and_newest_major_win() {
        let entries = [
            file("libfoo.so.1.9", Some("libfoo.so.1")),
            file("libfoo.so.1.10", Some("libfoo.so.1")),
            file("libfoo.so.2.0", Some("libfoo.so.2")),
        ];
        assert_eq!(
            plan_soname_links(&entries),
            vec![
                planned("libfoo.so", "libfoo.so.2"),
                planned("libfoo.so.1", "libfoo.so.1.10"),
                planned("libfoo.so.2", "libfoo.so.2.0"),
            ]
        );
    }

    #[test]
    fn versioned_comparison() {
        assert_eq!(
            compare_versioned_names("libfoo.so.1.10", "libfoo.so.1.9"),
            Ordering::Greater
        );
        assert_eq!(
            development_name("libnvrtc-builtins.so.12.1"),
            Some("libnvrtc-builtins.so")
        );
        assert_eq!(development_name("libfoo.so"), None);
    }
}
