//! One real file per SONAME among the copies a loader can reach.
//!
//! Reachable copies are: those some object's DT_NEEDED resolved to; those in a directory
//! searched by every process (LD_LIBRARY_PATH, ld.so.conf, the defaults) or named by some
//! object's RPATH/RUNPATH; torch's preload directories (`site-packages/nvidia/*/lib`, which
//! torch globs for the libraries it preloads); and every copy of a preloaded SONAME. A
//! package's private copy that nothing links and no search path names (triton's bundled
//! CUPTI, which its profiler opens by absolute path) cannot win a loader race, so it is not
//! a duplicate.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::image::ImageFs;
use super::loader::DEFAULT_LIBRARY_DIRS;
use super::needed::Objects;
use super::{io_error, AuditError, AuditOptions, Finding, FindingKind};
use crate::elf::ElfInfo;
use crate::rootfs::Node;

/// A finding for each SONAME that two or more reachable files provide.
pub(super) fn duplicates(
    fs: &dyn ImageFs,
    options: &AuditOptions,
    ld_so_conf: &[PathBuf],
    objects: &Objects,
    loaded_by: &HashMap<PathBuf, Vec<PathBuf>>,
) -> Result<Vec<Finding>, AuditError> {
    let search_dirs = searched_dirs(options, ld_so_conf, &objects.list);
    let searched = |dir: &Path| {
        search_dirs.contains(dir) || is_torch_preload_dir(dir) || is_toolkit_lib_dir(dir)
    };
    let reachable = |path: &PathBuf| {
        loaded_by.contains_key(path)
            || path
                .parent()
                .is_some_and(|dir| searched(dir) || hwcaps_parent(dir).is_some_and(searched))
    };
    let mut findings = Vec::new();
    for (soname, paths) in &objects.providers {
        let reached = if options.preloaded.contains(soname) {
            paths.len()
        } else {
            paths.iter().filter(|p| reachable(p)).count()
        };
        if reached < 2 {
            continue;
        }
        findings.push(duplicate_finding(fs, soname, paths)?);
    }
    Ok(findings)
}

/// Directories some search of the image looks in: LD_LIBRARY_PATH (without `$ORIGIN`
/// entries), ld.so.conf, the defaults, and every object's RPATH and RUNPATH.
fn searched_dirs(
    options: &AuditOptions,
    ld_so_conf: &[PathBuf],
    objects: &[(PathBuf, ElfInfo)],
) -> BTreeSet<PathBuf> {
    let mut search_dirs: BTreeSet<PathBuf> = options
        .ld_library_path
        .iter()
        .filter(|dir| !dir.to_string_lossy().contains("$ORIGIN"))
        .cloned()
        .chain(ld_so_conf.iter().cloned())
        .chain(DEFAULT_LIBRARY_DIRS.iter().map(PathBuf::from))
        .collect();
    for (path, info) in objects {
        let origin = path.parent().unwrap_or(Path::new("/")).to_path_buf();
        search_dirs.extend(info.expanded_rpath(&origin));
        search_dirs.extend(info.expanded_runpath(&origin));
    }
    search_dirs
}

/// `DIR` for `DIR/glibc-hwcaps/<level>`: glibc (2.33 and later) searches these
/// subdirectories of every searched directory before the directory itself, so a library
/// there wins over one of the same SONAME in DIR or further down the path.
fn hwcaps_parent(dir: &Path) -> Option<&Path> {
    let hwcaps = dir.parent()?;
    (hwcaps.file_name()? == "glibc-hwcaps").then_some(hwcaps.parent()?)
}

/// `.../site-packages/nvidia/<package>/lib` (or `dist-packages`).
fn is_torch_preload_dir(dir: &Path) -> bool {
    let parts: Vec<_> = dir.components().rev().take(4).collect();
    matches!(parts.as_slice(), [lib, _, nvidia, packages]
        if lib.as_os_str() == "lib" && nvidia.as_os_str() == "nvidia"
            && (packages.as_os_str() == "site-packages" || packages.as_os_str() == "dist-packages"))
}

/// A CUDA toolkit's library directory is the one users and images put on LD_LIBRARY_PATH
/// (`/usr/local/cuda*/lib64`, `/usr/local/cuda*/targets/*/lib`): count it as searched.
fn is_toolkit_lib_dir(dir: &Path) -> bool {
    let text = dir.to_string_lossy();
    text.strip_prefix("/usr/local/cuda").is_some_and(|rest| {
        let rest = rest.split_once('/').map_or("", |(_, tail)| tail);
        rest == "lib64"
            || rest
                .strip_prefix("targets/")
                .is_some_and(|t| t.ends_with("/lib") && t.matches('/').count() == 1)
    })
}

/// The finding for `soname`: every copy with its size and digest, and whether they differ.
fn duplicate_finding(
    fs: &dyn ImageFs,
    soname: &str,
    paths: &[PathBuf],
) -> Result<Finding, AuditError> {
    let mut evidence = format!("{} files provide `{soname}`:\n", paths.len());
    let mut digests = BTreeSet::new();
    for path in paths {
        let digest = fs.digest(path).map_err(io_error(path))?;
        digests.insert(digest);
        let size = match fs.node(path).map_err(io_error(path))? {
            Some(Node::File { size, .. }) => size,
            _ => 0,
        };
        let _ = writeln!(evidence, "{} ({size} bytes, {digest})", path.display());
    }
    let _ = write!(
        evidence,
        "{}",
        if digests.len() == 1 {
            "the copies are byte-identical"
        } else {
            "the copies differ: which one loads depends on the search order"
        }
    );
    Ok(Finding {
        kind: FindingKind::DuplicateSoname,
        paths: paths.to_vec(),
        evidence,
        hint: "keep one copy and replace the others with symlinks to it (cudastack's one-copy step), so every loader path reaches the same file".into(),
    })
}
