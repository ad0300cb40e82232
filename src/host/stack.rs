//! The CUDA stack installed on a host, as the dynamic loader and a shell see it: toolkits
//! under `/usr/local`, what `/usr/local/cuda` points to, `nvcc` on `PATH`, the loader's
//! search path (`LD_LIBRARY_PATH` left to right, then `/etc/ld.so.cache`, then the default
//! directories: ld.so(8)), every copy of the CUDA libraries on it with its version, and
//! conda environments that carry their own runtime.
//!
//! Versions come from file names (`libcudnn.so.8.9.2`, the name a SONAME chain ends in),
//! from `version.json` / `version.txt` of a toolkit, and from the directory name
//! (`cuda-12.1`), in that order; nothing here runs the libraries or `nvcc`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{list_dir, HostRoot};
use crate::version::CudaVersion;

/// Where a loader search directory came from, in the loader's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SearchSource {
    LdLibraryPath,
    LdSoCache,
    /// `/etc/ld.so.conf` (used when there is no readable ld.so.cache).
    LdSoConf,
    Default,
}

/// One directory the loader searches, in order.
#[derive(Debug, Clone, Serialize)]
pub struct SearchDir {
    pub dir: PathBuf,
    pub source: SearchSource,
}

/// The default directories glibc's loader searches last on x86_64 Debian/Ubuntu/RHEL.
pub const DEFAULT_LIB_DIRS: [&str; 6] = [
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
];

/// The loader's search path on this host: `LD_LIBRARY_PATH`, the directories of the
/// ld.so.cache entries (or ld.so.conf when the cache is unreadable), the defaults. A
/// directory appears once, at its first position.
pub fn loader_search_path(host: &HostRoot) -> Vec<SearchDir> {
    let mut dirs: Vec<SearchDir> = Vec::new();
    let push = |dir: PathBuf, source: SearchSource, dirs: &mut Vec<SearchDir>| {
        if !dirs.iter().any(|d| d.dir == dir) {
            dirs.push(SearchDir { dir, source });
        }
    };
    for dir in host.path_list("LD_LIBRARY_PATH") {
        push(dir, SearchSource::LdLibraryPath, &mut dirs);
    }
    match std::fs::read(host.path("/etc/ld.so.cache"))
        .ok()
        .and_then(|bytes| parse_ld_so_cache(&bytes))
    {
        Some(entries) => {
            for entry in entries {
                if let Some(parent) = Path::new(&entry.path).parent() {
                    push(parent.to_path_buf(), SearchSource::LdSoCache, &mut dirs);
                }
            }
        }
        None => {
            for dir in ld_so_conf_dirs(host, Path::new("/etc/ld.so.conf"), 0) {
                push(dir, SearchSource::LdSoConf, &mut dirs);
            }
        }
    }
    for dir in DEFAULT_LIB_DIRS {
        push(PathBuf::from(dir), SearchSource::Default, &mut dirs);
    }
    dirs
}

/// One entry of `/etc/ld.so.cache`: a library name and the file the loader maps for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CacheEntry {
    pub name: String,
    pub path: String,
}

/// Parse glibc's ld.so.cache (the `glibc-ld.so.cache1.1` format, alone or after the old
/// `ld.so-1.7.0` section, as glibc's `elf/cache.c` writes it). `None` if it is not one.
pub fn parse_ld_so_cache(bytes: &[u8]) -> Option<Vec<CacheEntry>> {
    const OLD_MAGIC: &[u8] = b"ld.so-1.7.0";
    const NEW_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
    let u32_at = |offset: usize| -> Option<u32> {
        bytes
            .get(offset..offset + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let start = if bytes.starts_with(NEW_MAGIC) {
        0
    } else if bytes.starts_with(OLD_MAGIC) {
        // Old header: magic (11, padded to 12) + nlibs; entries of 3 x i32.
        let nlibs = u32_at(12)? as usize;
        let end = 16usize.checked_add(nlibs.checked_mul(12)?)?;
        let aligned = (end + 7) & !7;
        if bytes.get(aligned..)?.starts_with(NEW_MAGIC) {
            aligned
        } else {
            return None;
        }
    } else {
        return None;
    };
    let nlibs = u32_at(start + 20)? as usize;
    let string_at = |offset: u32| -> Option<String> {
        let from = start.checked_add(offset as usize)?;
        let tail = bytes.get(from..)?;
        let end = tail.iter().position(|&b| b == 0)?;
        Some(String::from_utf8_lossy(&tail[..end]).into_owned())
    };
    let mut entries = Vec::with_capacity(nlibs.min(1 << 16));
    for index in 0..nlibs {
        let entry = start.checked_add(48)?.checked_add(index.checked_mul(24)?)?;
        let key = u32_at(entry + 4)?;
        let value = u32_at(entry + 8)?;
        entries.push(CacheEntry {
            name: string_at(key)?,
            path: string_at(value)?,
        });
    }
    Some(entries)
}

/// Directories listed by an ld.so.conf file and its `include` globs (only `dir/*.conf`
/// style globs, which is what distributions use).
fn ld_so_conf_dirs(host: &HostRoot, conf: &Path, depth: usize) -> Vec<PathBuf> {
    let Some(text) = host.read_text(conf) else {
        return Vec::new();
    };
    let mut dirs = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        if let Some(pattern) = line.strip_prefix("include") {
            if depth > 4 {
                continue;
            }
            let pattern = Path::new(pattern.trim());
            let pattern = if pattern.is_absolute() {
                pattern.to_path_buf()
            } else {
                conf.parent().unwrap_or(Path::new("/")).join(pattern)
            };
            let (Some(parent), Some(name)) = (pattern.parent(), pattern.file_name()) else {
                continue;
            };
            let name = name.to_string_lossy();
            let (prefix, suffix) = name.split_once('*').unwrap_or((&name, ""));
            let (prefix, suffix) = (prefix.to_string(), suffix.to_string());
            for file in list_dir(host, parent, |n| {
                let n = n.to_string_lossy();
                n.starts_with(&prefix) && n.ends_with(&suffix)
            }) {
                dirs.extend(ld_so_conf_dirs(host, &file, depth + 1));
            }
        } else {
            dirs.push(PathBuf::from(line));
        }
    }
    dirs
}

/// A CUDA toolkit installed under `/usr/local`.
#[derive(Debug, Clone, Serialize)]
pub struct Toolkit {
    pub dir: PathBuf,
    pub version: Option<CudaVersion>,
    pub has_nvcc: bool,
}

/// What `/usr/local/cuda` is.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CudaLink {
    Absent,
    /// A symlink whose target exists.
    Link {
        target: PathBuf,
        resolved: PathBuf,
    },
    /// A symlink whose target does not exist.
    Dangling {
        target: PathBuf,
    },
    /// A real directory (a toolkit installed there directly).
    Directory,
}

/// Every toolkit `/usr/local/cuda-*` (and `/usr/local/cuda` when it is a directory).
pub fn toolkits(host: &HostRoot) -> Vec<Toolkit> {
    let mut dirs = list_dir(host, Path::new("/usr/local"), |name| {
        name.to_string_lossy().starts_with("cuda-")
    });
    if matches!(cuda_link(host), CudaLink::Directory) {
        dirs.insert(0, PathBuf::from("/usr/local/cuda"));
    }
    dirs.into_iter()
        .filter(|dir| host.path(dir).is_dir())
        .map(|dir| Toolkit {
            version: toolkit_version(host, &dir),
            has_nvcc: host.path(dir.join("bin/nvcc")).is_file(),
            dir,
        })
        .collect()
}

pub fn cuda_link(host: &HostRoot) -> CudaLink {
    let link = Path::new("/usr/local/cuda");
    let real = host.path(link);
    match std::fs::symlink_metadata(&real) {
        Err(_) => CudaLink::Absent,
        Ok(meta) if meta.file_type().is_symlink() => {
            let target = std::fs::read_link(&real).unwrap_or_default();
            match host.resolve(link) {
                Some(resolved) => CudaLink::Link { target, resolved },
                None => CudaLink::Dangling { target },
            }
        }
        Ok(_) => CudaLink::Directory,
    }
}

/// The version of the toolkit at `dir`: `version.json` (CUDA >= 11.1), `version.txt`
/// (older), else the directory name.
pub fn toolkit_version(host: &HostRoot, dir: &Path) -> Option<CudaVersion> {
    if let Some(text) = host.read_text(dir.join("version.json")) {
        if let Ok(value) = serde_json::from_str::<serde_json::Value>(&text) {
            if let Some(version) = value
                .pointer("/cuda/version")
                .and_then(|v| v.as_str())
                .and_then(|v| v.parse().ok())
            {
                return Some(version);
            }
        }
    }
    if let Some(text) = host.read_text(dir.join("version.txt")) {
        if let Some(version) = text
            .split_whitespace()
            .find_map(|word| word.parse::<CudaVersion>().ok())
        {
            return Some(version);
        }
    }
    cuda_version_in_path(dir)
}

/// A CUDA version named by a path component such as `cuda-12.1` or `cuda12.4`.
pub fn cuda_version_in_path(path: &Path) -> Option<CudaVersion> {
    path.components().rev().find_map(|component| {
        let name = component.as_os_str().to_string_lossy();
        let rest = name.strip_prefix("cuda")?;
        rest.trim_start_matches(['-', '_']).parse().ok()
    })
}

/// The CUDA version a library directory belongs to: the toolkit it sits in (after
/// resolving links such as `/usr/local/cuda`), or the `libcudart.so.X.Y.Z` it holds.
pub fn cuda_version_of_dir(host: &HostRoot, dir: &Path) -> Option<CudaVersion> {
    let resolved = host.resolve(dir).unwrap_or_else(|| dir.to_path_buf());
    if let Some(toolkit) = resolved.ancestors().find(|a| {
        a.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("cuda"))
    }) {
        if let Some(version) = toolkit_version(host, toolkit) {
            return Some(version);
        }
    }
    list_dir(host, &resolved, |n| {
        n.to_string_lossy().starts_with("libcudart.so.")
    })
    .iter()
    .filter_map(|p| p.file_name())
    .filter_map(|n| {
        n.to_string_lossy()
            .strip_prefix("libcudart.so.")?
            .parse()
            .ok()
    })
    .max()
}

/// The library families whose copies are counted (SONAME prefixes).
pub const TRACKED_LIBRARIES: [&str; 3] = ["libcudnn", "libcudart", "libcublas"];

/// One copy of a tracked library on the loader path.
#[derive(Debug, Clone, Serialize)]
pub struct LibraryCopy {
    /// The SONAME-style name found in the directory, e.g. `libcudnn.so.8`.
    pub soname: String,
    /// The directory it was found in (as searched).
    pub dir: PathBuf,
    pub source: SearchSource,
    /// The file the name resolves to, e.g. `/usr/lib/x86_64-linux-gnu/libcudnn.so.8.2.4`.
    pub file: PathBuf,
    /// The version from the resolved file name (`8.2.4`), when it carries one beyond the
    /// SONAME's.
    pub version: Option<String>,
}

/// Every copy of the tracked libraries in the loader's search path, in search order.
/// Names are SONAME-style (`libX.so.N`); development links (`libX.so`) are not counted,
/// the loader never asks for them.
pub fn library_copies(host: &HostRoot, search: &[SearchDir]) -> Vec<LibraryCopy> {
    let mut copies = Vec::new();
    for dir in search {
        for name in list_dir(host, &dir.dir, |n| is_tracked_soname(&n.to_string_lossy())) {
            let file = host.resolve(&name);
            let Some(file) = file.filter(|f| host.path(f).is_file()) else {
                continue;
            };
            let soname = name
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            copies.push(LibraryCopy {
                version: version_from_file_name(&soname, &file)
                    .or_else(|| version_from_surroundings(host, &soname, &file)),
                soname,
                dir: dir.dir.clone(),
                source: dir.source,
                file,
            });
        }
    }
    copies
}

/// `libcudnn.so.8` or `libcudnn_ops_train.so.8`: a tracked family, `.so.` and one number.
fn is_tracked_soname(name: &str) -> bool {
    let Some((stem, version)) = name.split_once(".so.") else {
        return false;
    };
    let family = stem.split('_').next().unwrap_or(stem);
    TRACKED_LIBRARIES.contains(&family)
        && !version.is_empty()
        && version.bytes().all(|b| b.is_ascii_digit())
}

/// `libcudnn.so.8` resolving to `libcudnn.so.8.9.2` -> `8.9.2`; to itself -> `None`.
fn version_from_file_name(soname: &str, file: &Path) -> Option<String> {
    let (stem, _) = soname.split_once(".so.")?;
    let name = file.file_name()?.to_string_lossy();
    let version = name.strip_prefix(stem)?.strip_prefix(".so.")?;
    let soname_version = soname.split_once(".so.")?.1;
    (version != soname_version && version.starts_with(soname_version)).then(|| version.to_string())
}

/// When the file name carries only the SONAME's major (pip wheels ship `libcudnn.so.9`
/// alone), read the version next to it: cuDNN's `../include/cudnn_version.h` (tarballs,
/// toolkit installs, and the nvidia-cudnn wheels), else the `*.dist-info` of the nvidia wheel
/// that installed it (`site-packages/nvidia/cudnn/lib` -> `nvidia_cudnn_cu12-9.1.0.70.dist-info`).
fn version_from_surroundings(host: &HostRoot, soname: &str, file: &Path) -> Option<String> {
    let lib_dir = file.parent()?;
    let package_dir = lib_dir.parent()?;
    if soname.starts_with("libcudnn") {
        if let Some(text) = host.read_text(package_dir.join("include/cudnn_version.h")) {
            let define = |name: &str| -> Option<u32> {
                text.lines().find_map(|line| {
                    let rest = line.trim().strip_prefix("#define")?.trim();
                    let value = rest.strip_prefix(name)?;
                    value.trim().parse().ok()
                })
            };
            if let (Some(major), Some(minor), Some(patch)) = (
                define("CUDNN_MAJOR"),
                define("CUDNN_MINOR"),
                define("CUDNN_PATCHLEVEL"),
            ) {
                return Some(format!("{major}.{minor}.{patch}"));
            }
        }
    }
    // site-packages/nvidia/<component>/lib/<file>
    let component = package_dir.file_name()?.to_string_lossy().into_owned();
    let nvidia = package_dir.parent()?;
    if nvidia.file_name()? != "nvidia" {
        return None;
    }
    let site_packages = nvidia.parent()?;
    let prefix = format!("nvidia_{}_cu", component.replace('-', "_"));
    list_dir(host, site_packages, |name| {
        let name = name.to_string_lossy();
        name.starts_with(&prefix) && name.ends_with(".dist-info")
    })
    .iter()
    .filter_map(|dist| {
        let name = dist.file_name()?.to_string_lossy().into_owned();
        let stem = name.strip_suffix(".dist-info")?;
        Some(stem.rsplit_once('-')?.1.to_string())
    })
    .max_by(|a, b| crate::elf::chain::compare_versioned_names(a, b))
}

/// Copies grouped by SONAME, in search order (the first one is what the loader maps when
/// no RPATH/RUNPATH of the program says otherwise).
pub fn copies_by_soname(copies: &[LibraryCopy]) -> BTreeMap<String, Vec<&LibraryCopy>> {
    let mut groups: BTreeMap<String, Vec<&LibraryCopy>> = BTreeMap::new();
    for copy in copies {
        let group = groups.entry(copy.soname.clone()).or_default();
        if !group.iter().any(|c| c.file == copy.file) {
            group.push(copy);
        }
    }
    groups
}

/// A conda environment that carries its own CUDA runtime or cuDNN.
#[derive(Debug, Clone, Serialize)]
pub struct CondaEnv {
    pub prefix: PathBuf,
    pub active: bool,
    pub cuda_runtime: Option<String>,
    pub cudnn: Option<String>,
}

/// Conda environments found from `CONDA_PREFIX`, `~/.conda/environments.txt` and the
/// usual install locations, with the CUDA runtime / cuDNN their `lib/` holds.
pub fn conda_envs(host: &HostRoot) -> Vec<CondaEnv> {
    let mut prefixes: Vec<PathBuf> = Vec::new();
    let active = host.env("CONDA_PREFIX").map(PathBuf::from);
    prefixes.extend(active.clone());
    let home = host
        .env("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"));
    if let Some(text) = host.read_text(home.join(".conda/environments.txt")) {
        prefixes.extend(
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(PathBuf::from),
        );
    }
    for base in ["/opt/conda", "/opt/miniconda3", "/opt/anaconda3"]
        .iter()
        .map(PathBuf::from)
        .chain(
            ["miniconda3", "anaconda3", "miniforge3", "mambaforge"]
                .iter()
                .map(|d| home.join(d)),
        )
    {
        if host.path(&base).is_dir() {
            prefixes.push(base.clone());
            prefixes.extend(list_dir(host, &base.join("envs"), |_| true));
        }
    }
    let mut seen = Vec::new();
    let mut envs = Vec::new();
    for prefix in prefixes {
        if seen.contains(&prefix) {
            continue;
        }
        seen.push(prefix.clone());
        let lib = prefix.join("lib");
        let newest = |stem: &str| {
            list_dir(host, &lib, |n| {
                n.to_string_lossy().starts_with(&format!("{stem}.so."))
            })
            .iter()
            .filter_map(|p| {
                Some(
                    p.file_name()?
                        .to_string_lossy()
                        .strip_prefix(&format!("{stem}.so."))?
                        .to_string(),
                )
            })
            .max_by(|a, b| crate::elf::chain::compare_versioned_names(a, b))
        };
        let cuda_runtime = newest("libcudart");
        let cudnn = newest("libcudnn");
        if cuda_runtime.is_some() || cudnn.is_some() {
            envs.push(CondaEnv {
                active: active.as_ref() == Some(&prefix),
                prefix,
                cuda_runtime,
                cudnn,
            });
        }
    }
    envs
}

/// Find the file the loader would map for `soname`, searching like ld.so (minus RPATH).
pub fn find_library(host: &HostRoot, search: &[SearchDir], soname: &str) -> Option<PathBuf> {
    search.iter().find_map(|dir| {
        let candidate = dir.dir.join(soname);
        host.resolve(&candidate)
            .filter(|resolved| host.path(resolved).is_file())
            .map(|_| candidate)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracked_sonames() {
        assert!(is_tracked_soname("libcudnn.so.8"));
        assert!(is_tracked_soname("libcudnn_ops_train.so.8"));
        assert!(is_tracked_soname("libcudart.so.12"));
        assert!(!is_tracked_soname("libcudnn.so"));
        assert!(!is_tracked_soname("libcudnn.so.8.9.2"));
        assert!(!is_tracked_soname("libcurl.so.4"));
    }

    #[test]
    fn version_from_resolved_name() {
        assert_eq!(
            version_from_file_name("libcudnn.so.8", Path::new("/x/libcudnn.so.8.9.2")),
            Some("8.9.2".into())
        );
        assert_eq!(
            version_from_file_name("libcudnn.so.8", Path::new("/x/libcudnn.so.8")),
            None
        );
    }

    #[test]
    fn versions_of_wheel_and_tarball_copies() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let site = root.join("venv/lib/python3.11/site-packages");
        std::fs::create_dir_all(site.join("nvidia/cudnn/lib")).unwrap();
        std::fs::create_dir_all(site.join("nvidia_cudnn_cu12-9.1.0.70.dist-info")).unwrap();
        std::fs::write(site.join("nvidia/cudnn/lib/libcudnn.so.9"), b"").unwrap();
        std::fs::create_dir_all(root.join("opt/cudnn/include")).unwrap();
        std::fs::create_dir_all(root.join("opt/cudnn/lib")).unwrap();
        std::fs::write(
            root.join("opt/cudnn/include/cudnn_version.h"),
            "#define CUDNN_MAJOR 8\n#define CUDNN_MINOR 9\n#define CUDNN_PATCHLEVEL 7\n#define CUDNN_VERSION (CUDNN_MAJOR * 1000 + CUDNN_MINOR * 100 + CUDNN_PATCHLEVEL)\n",
        )
        .unwrap();
        let host = HostRoot::planted(root, BTreeMap::new());
        assert_eq!(
            version_from_surroundings(
                &host,
                "libcudnn.so.9",
                Path::new("/venv/lib/python3.11/site-packages/nvidia/cudnn/lib/libcudnn.so.9")
            ),
            Some("9.1.0.70".into())
        );
        assert_eq!(
            version_from_surroundings(
                &host,
                "libcudnn.so.8",
                Path::new("/opt/cudnn/lib/libcudnn.so.8")
            ),
            Some("8.9.7".into())
        );
        assert_eq!(
            version_from_surroundings(
                &host,
                "libcudart.so.12",
                Path::new("/usr/lib/libcudart.so.12")
            ),
            None
        );
    }

    #[test]
    fn cuda_versions_in_paths() {
        assert_eq!(
            cuda_version_in_path(Path::new("/usr/local/cuda-12.1/lib64")),
            Some(CudaVersion::new(12, 1, None))
        );
        assert_eq!(
            cuda_version_in_path(Path::new("/usr/local/cuda/lib64")),
            None
        );
    }

    #[test]
    fn parses_this_machines_ld_so_cache() {
        let Ok(bytes) = std::fs::read("/etc/ld.so.cache") else {
            eprintln!("skip: no /etc/ld.so.cache on this machine");
            return;
        };
        let entries = parse_ld_so_cache(&bytes).expect("a glibc ld.so.cache");
        assert!(
            entries
                .iter()
                .any(|e| e.name == "libc.so.6" && e.path.ends_with("/libc.so.6")),
            "{entries:?}"
        );
    }

    #[test]
    fn rejects_garbage_cache() {
        assert_eq!(parse_ld_so_cache(b"not a cache"), None);
        let mut truncated = b"glibc-ld.so.cache1.1".to_vec();
        truncated.extend_from_slice(&[0xff; 8]);
        assert_eq!(parse_ld_so_cache(&truncated), None);
    }
}
