//! The static level's helpers: library families, /proc/self/maps, the library directory,
//! LD_LIBRARY_PATH, versions. Pure functions where possible, so they are unit-tested here.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Value};

/// The family of a shared object's file name (probe.py's LIBRARY_FAMILIES: libcudart,
/// libcudnn*, libcublas / libcublasLt, libnccl), whose copies must be unique in a process.
pub fn family_of(name: &str) -> Option<&'static str> {
    if name.starts_with("libcudart.so") {
        return Some("libcudart");
    }
    if name.starts_with("libnccl.so") {
        return Some("libnccl");
    }
    if let Some(rest) = name.strip_prefix("libcublas") {
        let rest = rest.strip_prefix("Lt").unwrap_or(rest);
        if rest.starts_with(".so") {
            return Some("libcublas");
        }
    }
    if let Some(rest) = name.strip_prefix("libcudnn") {
        // ^libcudnn(_[a-z_]+)?\.so
        let rest = match rest.strip_prefix('_') {
            Some(sub) => {
                let tail = sub.trim_start_matches(|c: char| c.is_ascii_lowercase() || c == '_');
                if tail.len() == sub.len() {
                    return None;
                }
                tail
            }
            None => rest,
        };
        if rest.starts_with(".so") {
            return Some("libcudnn");
        }
    }
    None
}

/// All the integers in a version string: `9.1.0.70` -> [9, 1, 0, 70], `530.30.02` -> [530, 30, 2].
pub fn version_tuple(text: &str) -> Vec<u64> {
    text.split(|c: char| !c.is_ascii_digit())
        .filter(|p| !p.is_empty())
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// 9.1.0.70 -> 90100 (cuDNN 9: M*10000+m*100+p), 8.9.2.26 -> 8902 (cuDNN 8: M*1000+m*100+p).
pub fn cudnn_version_number(text: &str) -> u64 {
    let mut parts = version_tuple(text);
    parts.resize(3.max(parts.len()), 0);
    let (major, minor, patch) = (parts[0], parts[1], parts[2]);
    if major >= 9 {
        major * 10000 + minor * 100 + patch
    } else {
        major * 1000 + minor * 100 + patch
    }
}

/// The first three parts of a release, `9.1.0.70` -> `9.1.0`.
pub fn release3(text: &str) -> String {
    version_tuple(text)
        .iter()
        .take(3)
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join(".")
}

/// `libcudart.so.12.1.105` -> Some("12.1.105"): a file name ending in `.so.X.Y.Z[...]`.
pub fn full_version(name: &str) -> Option<&str> {
    let (_, version) = name.split_once(".so.")?;
    let parts: Vec<&str> = version.split('.').collect();
    if parts.len() >= 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    {
        Some(version)
    } else {
        None
    }
}

/// `libcublas.so.12` -> Some(("libcublas", 12)): a SONAME-style name `lib<x>.so.<major>`.
pub fn soname_major(name: &str) -> Option<(&str, u64)> {
    let (base, major) = name.split_once(".so.")?;
    if major.is_empty() || !major.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((base, major.parse().ok()?))
}

/// Real paths of the shared objects mapped into this process (/proc/self/maps text).
pub fn mapped_libraries(maps: &str) -> Vec<String> {
    let mut paths: Vec<String> = maps
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.splitn(6, char::is_whitespace).collect();
            if fields.len() != 6 {
                return None;
            }
            let path = fields[5].trim();
            if !path.starts_with('/') {
                return None;
            }
            let base = path.rsplit('/').next().unwrap_or("");
            base.contains(".so").then(|| path.to_string())
        })
        .collect();
    paths.sort();
    paths.dedup();
    paths
}

/// {family: {directory: [file names]}} for the families that must be unique.
pub type Copies = BTreeMap<String, BTreeMap<String, Vec<String>>>;

pub fn library_copies(paths: &[String]) -> Copies {
    let mut families: Copies = BTreeMap::new();
    for path in paths {
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        let dir = if dir.is_empty() { "/" } else { dir };
        if let Some(family) = family_of(name) {
            let names = families
                .entry(family.to_string())
                .or_default()
                .entry(dir.to_string())
                .or_default();
            names.push(name.to_string());
            names.sort();
        }
    }
    families
}

fn same_dir(a: &str, b: &str) -> bool {
    let canon = |p: &str| std::fs::canonicalize(p).unwrap_or_else(|_| Path::new(p).to_path_buf());
    canon(a) == canon(b)
}

/// probe.py's check_loaded_libraries: exactly one directory and one version per family, and
/// libcudart / libcudnn from the image's CUDA directory. Ok((summary, data)) or Err(problems).
pub fn check_loaded_libraries(copies: &Copies, expect: &Value) -> Result<(String, Value), String> {
    let mut problems = Vec::new();
    let wanted = expect.get("cuda_lib_dir").and_then(Value::as_str);
    for (family, directories) in copies {
        if directories.len() > 1 {
            let list: Vec<String> = directories
                .iter()
                .map(|(d, n)| format!("{d} ({})", n.join(", ")))
                .collect();
            problems.push(format!(
                "{family} is loaded from {} directories: {}",
                directories.len(),
                list.join("; ")
            ));
        }
        if let Some(wanted) = wanted {
            if family == "libcudart" || family == "libcudnn" {
                for directory in directories.keys() {
                    if !same_dir(directory, wanted) {
                        problems.push(format!(
                            "{family} loaded from {directory}, not the image's CUDA library directory {wanted}"
                        ));
                    }
                }
            }
        }
    }
    if let Some(runtime) = expect.get("cuda_runtime").and_then(Value::as_str) {
        for names in copies.get("libcudart").into_iter().flat_map(|d| d.values()) {
            for name in names {
                if full_version(name).is_some() && !name.ends_with(&format!(".so.{runtime}")) {
                    problems.push(format!(
                        "libcudart loaded is {name}, the lock says {runtime}"
                    ));
                }
            }
        }
    }
    if let Some(cudnn) = expect.get("cudnn").and_then(Value::as_str) {
        let release = release3(cudnn);
        for (directory, names) in copies.get("libcudnn").into_iter().flatten() {
            for name in names {
                if let Some(found) = full_version(name) {
                    if release3(found) != release || found.split('.').count() != 3 {
                        problems.push(format!(
                            "{directory}/{name} is cuDNN {found}, the lock says {release}"
                        ));
                    }
                }
            }
        }
    }
    let data = serde_json::to_value(copies).expect("maps serialise");
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    if !copies.contains_key("libcudart") {
        return Err("libcudart is not loaded after loading the stack's libraries".to_string());
    }
    let summary: Vec<String> = copies
        .iter()
        .map(|(family, dirs)| {
            let mut names: Vec<&str> = dirs.values().flatten().map(String::as_str).collect();
            names.sort();
            format!("{family}: {}", names.join(", "))
        })
        .collect();
    Ok((summary.join(", "), data))
}

/// What a library directory holds: per library (libcudart, libcublas, libcublasLt, libcudnn,
/// libnccl ...), the full versions from file names and the SONAME-style names.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct LibraryDir {
    /// `libcudart` -> ["12.1.105"]
    pub versions: BTreeMap<String, Vec<String>>,
    /// `libcudart` -> ["libcudart.so.12"]
    pub sonames: BTreeMap<String, Vec<String>>,
}

/// The libraries this probe loads and reports, by base name.
pub const STACK_LIBRARIES: [&str; 5] = [
    "libcudart",
    "libcublasLt",
    "libcublas",
    "libcudnn",
    "libnccl",
];

pub fn scan_library_dir(names: &[String]) -> LibraryDir {
    let mut dir = LibraryDir::default();
    for name in names {
        let Some((base, _)) = name.split_once(".so") else {
            continue;
        };
        if !STACK_LIBRARIES.contains(&base) {
            continue;
        }
        if let Some(version) = full_version(name) {
            dir.versions
                .entry(base.to_string())
                .or_default()
                .push(version.to_string());
        }
        if soname_major(name).is_some() {
            dir.sonames
                .entry(base.to_string())
                .or_default()
                .push(name.clone());
        }
    }
    for list in dir.versions.values_mut().chain(dir.sonames.values_mut()) {
        list.sort();
        list.dedup();
    }
    dir
}

/// Judges a scanned library directory against expect.json. Ok(summary, data) or Err(problems).
pub fn check_library_dir(
    dir_path: &str,
    dir: &LibraryDir,
    expect: &Value,
) -> Result<(String, Value), String> {
    let mut problems = Vec::new();
    for (base, versions) in &dir.versions {
        let releases: std::collections::BTreeSet<String> =
            versions.iter().map(|v| release3(v)).collect();
        if releases.len() > 1 {
            problems.push(format!(
                "{dir_path} holds {} versions of {base}: {}",
                releases.len(),
                versions.join(", ")
            ));
        }
    }
    if !dir.sonames.contains_key("libcudart") && !dir.versions.contains_key("libcudart") {
        problems.push(format!("no libcudart.so.* in {dir_path}"));
    }
    let cudart = dir.versions.get("libcudart").cloned().unwrap_or_default();
    if let Some(runtime) = expect.get("cuda_runtime").and_then(Value::as_str) {
        if !cudart.is_empty() && !cudart.iter().any(|v| v == runtime) {
            problems.push(format!(
                "{dir_path} has libcudart {}, the lock says {runtime}",
                cudart.join(", ")
            ));
        }
    } else if let Some(line) = expect.get("cuda").and_then(Value::as_str) {
        let line = version_tuple(line);
        for version in &cudart {
            if version_tuple(version).get(..2) != line.get(..2) {
                problems.push(format!(
                    "{dir_path} has libcudart {version}, the image's CUDA is {}",
                    line.iter()
                        .map(|p| p.to_string())
                        .collect::<Vec<_>>()
                        .join(".")
                ));
            }
        }
    }
    if let Some(cudnn) = expect.get("cudnn").and_then(Value::as_str) {
        let release = release3(cudnn);
        let major = version_tuple(cudnn).first().copied().unwrap_or(0);
        match dir.versions.get("libcudnn") {
            Some(found) if !found.iter().any(|v| release3(v) == release) => problems.push(format!(
                "{dir_path} has libcudnn {}, the lock says {release}",
                found.join(", ")
            )),
            Some(_) => {}
            None => {
                let sonames = dir.sonames.get("libcudnn").cloned().unwrap_or_default();
                if !sonames.contains(&format!("libcudnn.so.{major}")) {
                    problems.push(format!(
                        "no libcudnn.so.{major} in {dir_path} (the lock says cuDNN {cudnn})"
                    ));
                }
            }
        }
    }
    let data = json!({"dir": dir_path, "versions": dir.versions, "sonames": dir.sonames});
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    let summary: Vec<String> = STACK_LIBRARIES
        .iter()
        .filter_map(|base| {
            let versions = dir.versions.get(*base).map(|v| v.join("/"));
            let sonames = dir.sonames.get(*base).map(|v| v.join("/"));
            versions.or(sonames).map(|v| format!("{base} {v}"))
        })
        .collect();
    Ok((format!("{dir_path}: {}", summary.join(", ")), data))
}

/// The SONAMEs to dlopen, in dependency order (cudart, cublasLt, cublas, cudnn).
pub fn sonames_to_load(dir: &LibraryDir) -> Vec<String> {
    ["libcudart", "libcublasLt", "libcublas", "libcudnn"]
        .iter()
        .filter_map(|base| {
            // The newest major if several (the scan already flags several versions).
            dir.sonames.get(*base).and_then(|names| {
                names
                    .iter()
                    .max_by_key(|n| soname_major(n).map(|(_, m)| m))
                    .cloned()
            })
        })
        .collect()
}

/// `#define CUDNN_MAJOR 9` ... -> "9.1.0".
pub fn cudnn_header_version(text: &str) -> Option<String> {
    let find = |key: &str| {
        text.lines().find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some("#define") && words.next() == Some(key))
                .then(|| words.next())
                .flatten()
                .filter(|v| v.bytes().all(|b| b.is_ascii_digit()))
                .map(str::to_string)
        })
    };
    Some(format!(
        "{}.{}.{}",
        find("CUDNN_MAJOR")?,
        find("CUDNN_MINOR")?,
        find("CUDNN_PATCHLEVEL")?
    ))
}

/// LD_LIBRARY_PATH entries that hold the same family (libcudart, libcudnn) in different
/// directories. `listing` lists a directory's file names (None when it is not a directory).
pub fn ld_library_path_doubles(
    entries: &[String],
    listing: &dyn Fn(&str) -> Option<Vec<String>>,
    canonical: &dyn Fn(&str) -> String,
) -> BTreeMap<String, Vec<String>> {
    let mut holders: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for entry in entries {
        let Some(names) = listing(entry) else {
            continue;
        };
        for family in ["libcudart", "libcudnn"] {
            if names.iter().any(|n| family_of(n) == Some(family)) {
                holders
                    .entry(family.to_string())
                    .or_default()
                    .push(entry.clone());
            }
        }
    }
    holders
        .into_iter()
        .filter(|(_, dirs)| {
            let unique: std::collections::BTreeSet<String> =
                dirs.iter().map(|d| canonical(d)).collect();
            unique.len() > 1
        })
        .collect()
}

/// probe.py's has_kernels, the same-major rule: a cubin for sm_Xy runs on X.z with z >= y
/// (arch-specific `a`/`f` cubins only on exactly X.y); PTX (compute_XY) JITs forward.
pub fn has_kernels(
    arch_flags: &[String],
    major: u32,
    minor: u32,
) -> Option<(&'static str, String)> {
    let mut sass: Vec<(u32, u32, &String)> = Vec::new();
    let mut ptx: Vec<(u32, u32, &String)> = Vec::new();
    for flag in arch_flags {
        let (kind, rest) = if let Some(rest) = flag.strip_prefix("sm_") {
            ("sm", rest)
        } else if let Some(rest) = flag.strip_prefix("compute_") {
            ("compute", rest)
        } else {
            continue;
        };
        let (digits, suffix) = match rest.strip_suffix(['a', 'f']) {
            Some(d) => (d, true),
            None => (rest, false),
        };
        if digits.len() < 2 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let (arch_major, arch_minor) = (
            digits[..digits.len() - 1].parse::<u32>().unwrap_or(0),
            digits[digits.len() - 1..].parse::<u32>().unwrap_or(0),
        );
        if kind == "sm"
            && arch_major == major
            && arch_minor <= minor
            && (!suffix || (arch_major, arch_minor) == (major, minor))
        {
            sass.push((arch_major, arch_minor, flag));
        }
        if kind == "compute" && !suffix && (arch_major, arch_minor) <= (major, minor) {
            ptx.push((arch_major, arch_minor, flag));
        }
    }
    if let Some(best) = sass.iter().max() {
        return Some(("sass", best.2.clone()));
    }
    ptx.iter().max().map(|best| ("ptx", best.2.clone()))
}

/// The oldest compute capability the CUDA libraries of a CUDA major ship kernels for
/// (CUDA 11: Kepler sm_35; CUDA 12: Maxwell sm_50; CUDA 13 dropped Maxwell, Pascal, Volta).
pub fn oldest_cc_for_cuda(cuda_major: u64) -> Option<(u32, u32)> {
    match cuda_major {
        11 => Some((3, 5)),
        12 => Some((5, 0)),
        13 => Some((7, 5)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn families_match_probe_py() {
        assert_eq!(family_of("libcudart.so.12"), Some("libcudart"));
        assert_eq!(family_of("libcublasLt.so.12.1.3.1"), Some("libcublas"));
        assert_eq!(family_of("libcublas.so.12"), Some("libcublas"));
        assert_eq!(family_of("libcudnn.so.9.1.0"), Some("libcudnn"));
        assert_eq!(
            family_of("libcudnn_engines_precompiled.so.9"),
            Some("libcudnn")
        );
        assert_eq!(family_of("libcudnn_.so"), None);
        assert_eq!(family_of("libcudnn_X.so"), None);
        assert_eq!(family_of("libnccl.so.2"), Some("libnccl"));
        assert_eq!(family_of("libcufft.so.11"), None);
        assert_eq!(family_of("libcublasfoo.so"), None);
    }

    #[test]
    fn versions() {
        assert_eq!(version_tuple("530.30.02"), vec![530, 30, 2]);
        assert_eq!(cudnn_version_number("9.1.0.70"), 90100);
        assert_eq!(cudnn_version_number("8.9.2.26"), 8902);
        assert_eq!(cudnn_version_number("9"), 90000);
        assert_eq!(release3("9.1.0.70"), "9.1.0");
        assert_eq!(full_version("libcudart.so.12.1.105"), Some("12.1.105"));
        assert_eq!(full_version("libcudart.so.12"), None);
        assert_eq!(full_version("libcublas.so.12.1.3.1"), Some("12.1.3.1"));
        assert_eq!(soname_major("libcudnn.so.9"), Some(("libcudnn", 9)));
        assert_eq!(soname_major("libcudnn.so.9.1.0"), None);
    }

    const MAPS: &str = "\
7f00-7f01 r-xp 00000000 08:01 1 /usr/local/cuda-12.1/targets/x86_64-linux/lib/libcudart.so.12.1.105
7f01-7f02 r--p 00001000 08:01 1 /usr/local/cuda-12.1/targets/x86_64-linux/lib/libcudart.so.12.1.105
7f02-7f03 r-xp 00000000 08:01 2 /usr/local/cuda-12.1/targets/x86_64-linux/lib/libcudnn.so.9.1.0
7f03-7f04 r-xp 00000000 08:01 3 /opt/other/lib/libcudnn_graph.so.9.1.0
7f04-7f05 rw-p 00000000 00:00 0 [heap]
7f05-7f06 r-xp 00000000 08:01 4 /usr/lib/x86_64-linux-gnu/libc.so.6
7f06-7f07 rw-p 00000000 00:00 0
";

    #[test]
    fn maps_parse_and_two_cudnn_directories_fail() {
        let paths = mapped_libraries(MAPS);
        assert_eq!(paths.len(), 4);
        let copies = library_copies(&paths);
        assert_eq!(copies["libcudnn"].len(), 2);
        let expect = json!({"cuda_lib_dir": "/usr/local/cuda-12.1/targets/x86_64-linux/lib",
                            "cuda_runtime": "12.1.105", "cudnn": "9.1.0.70"});
        let err = check_loaded_libraries(&copies, &expect).unwrap_err();
        assert!(
            err.contains("libcudnn is loaded from 2 directories"),
            "{err}"
        );
        assert!(
            err.contains("not the image's CUDA library directory"),
            "{err}"
        );
    }

    #[test]
    fn one_copy_from_the_right_place_passes_and_a_wrong_version_fails() {
        let dir = "/usr/local/cuda-12.1/targets/x86_64-linux/lib";
        let paths = s(&[
            &format!("{dir}/libcudart.so.12.1.105"),
            &format!("{dir}/libcudnn.so.9.1.0"),
            &format!("{dir}/libcublas.so.12.1.3.1"),
        ]);
        let copies = library_copies(&paths);
        let expect = json!({"cuda_lib_dir": dir, "cuda_runtime": "12.1.105", "cudnn": "9.1.0.70"});
        let (summary, data) = check_loaded_libraries(&copies, &expect).unwrap();
        assert!(
            summary.contains("libcudart: libcudart.so.12.1.105"),
            "{summary}"
        );
        assert_eq!(data["libcudnn"][dir][0], "libcudnn.so.9.1.0");
        let expect = json!({"cuda_lib_dir": dir, "cuda_runtime": "12.1.66", "cudnn": "9.2.0.1"});
        let err = check_loaded_libraries(&copies, &expect).unwrap_err();
        assert!(
            err.contains("the lock says 12.1.66") && err.contains("the lock says 9.2.0"),
            "{err}"
        );
        let err = check_loaded_libraries(&Copies::new(), &json!({})).unwrap_err();
        assert!(err.contains("libcudart is not loaded"), "{err}");
    }

    #[test]
    fn the_library_dir_scan_reads_versions_and_sonames() {
        let names = s(&[
            "libcudart.so",
            "libcudart.so.12",
            "libcudart.so.12.1.105",
            "libcublas.so.12",
            "libcublas.so.12.1.3.1",
            "libcublasLt.so.12",
            "libcudnn.so.9",
            "libcudnn.so.9.1.0",
            "libcudnn_graph.so.9",
            "libcufft.so.11",
            "libcudart_static.a",
        ]);
        let dir = scan_library_dir(&names);
        assert_eq!(dir.versions["libcudart"], s(&["12.1.105"]));
        assert_eq!(dir.versions["libcublas"], s(&["12.1.3.1"]));
        assert_eq!(dir.sonames["libcudnn"], s(&["libcudnn.so.9"]));
        assert!(!dir.versions.contains_key("libcufft"));
        assert_eq!(
            sonames_to_load(&dir),
            s(&[
                "libcudart.so.12",
                "libcublasLt.so.12",
                "libcublas.so.12",
                "libcudnn.so.9"
            ])
        );
        let expect = json!({"cuda": "12.1", "cuda_runtime": "12.1.105", "cudnn": "9.1.0.70"});
        let (summary, _) = check_library_dir("/d", &dir, &expect).unwrap();
        assert!(
            summary.contains("libcudart 12.1.105") && summary.contains("libcudnn 9.1.0"),
            "{summary}"
        );
        let err = check_library_dir(
            "/d",
            &dir,
            &json!({"cuda_runtime": "12.4.99", "cudnn": "8.9.2.26"}),
        )
        .unwrap_err();
        assert!(
            err.contains("the lock says 12.4.99") && err.contains("the lock says 8.9.2"),
            "{err}"
        );
        // Wheel-style directories carry only SONAMEs: the cuDNN major must match.
        let wheel = scan_library_dir(&s(&["libcudart.so.12", "libcudnn.so.9"]));
        assert!(check_library_dir("/w", &wheel, &json!({"cudnn": "9.1.0.70"})).is_ok());
        assert!(check_library_dir("/w", &wheel, &json!({"cudnn": "8.9.2.26"})).is_err());
        // Two releases side by side, and no cudart at all.
        let doubled = scan_library_dir(&s(&["libcudart.so.12.1.105", "libcudart.so.12.4.99"]));
        assert!(check_library_dir("/x", &doubled, &json!({}))
            .unwrap_err()
            .contains("2 versions of libcudart"));
        assert!(check_library_dir("/x", &LibraryDir::default(), &json!({}))
            .unwrap_err()
            .contains("no libcudart"));
    }

    #[test]
    fn header_and_ld_library_path() {
        let header = "#define CUDNN_MAJOR 9\n#define CUDNN_MINOR 1\n#define CUDNN_PATCHLEVEL 0\n#define CUDNN_VERSION (CUDNN_MAJOR * 10000)\n";
        assert_eq!(cudnn_header_version(header).as_deref(), Some("9.1.0"));
        assert_eq!(cudnn_header_version("#define CUDNN_MAJOR 9\n"), None);
        let listing = |d: &str| -> Option<Vec<String>> {
            match d {
                "/a" | "/a2" => Some(s(&["libcudnn.so.9"])),
                "/b" => Some(s(&["libcudnn.so.9", "libcudart.so.12"])),
                _ => None,
            }
        };
        let canonical = |d: &str| {
            if d == "/a2" {
                "/a".to_string()
            } else {
                d.to_string()
            }
        };
        assert!(
            ld_library_path_doubles(&s(&["/a", "/a2", "/missing"]), &listing, &canonical)
                .is_empty()
        );
        let doubled = ld_library_path_doubles(&s(&["/a", "/b"]), &listing, &canonical);
        assert_eq!(doubled["libcudnn"], s(&["/a", "/b"]));
        assert!(!doubled.contains_key("libcudart"));
    }

    #[test]
    fn kernels_by_the_same_major_rule() {
        let flags = s(&[
            "sm_50",
            "sm_60",
            "sm_70",
            "sm_80",
            "sm_86",
            "sm_90",
            "compute_90",
        ]);
        assert_eq!(
            has_kernels(&flags, 8, 9),
            Some(("sass", "sm_86".to_string()))
        );
        assert_eq!(
            has_kernels(&flags, 9, 0),
            Some(("sass", "sm_90".to_string()))
        );
        assert_eq!(
            has_kernels(&flags, 10, 0),
            Some(("ptx", "compute_90".to_string()))
        );
        assert_eq!(
            has_kernels(&s(&["sm_80", "sm_90a"]), 9, 0),
            Some(("sass", "sm_90a".to_string()))
        );
        assert_eq!(has_kernels(&s(&["sm_90a"]), 9, 1), None);
        assert_eq!(has_kernels(&s(&["sm_80"]), 7, 5), None);
        assert_eq!(oldest_cc_for_cuda(13), Some((7, 5)));
    }
}
