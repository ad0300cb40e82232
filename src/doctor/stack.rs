//! Layer 3 of the funnel: the CUDA stack on the host itself. Which toolkits exist and what
//! `/usr/local/cuda` points to; which `nvcc` a shell finds; whether `LD_LIBRARY_PATH` mixes
//! CUDA versions (left to right, first match wins per library); every copy of libcudnn /
//! libcudart / libcublas the loader can reach (LD_LIBRARY_PATH, ld.so.cache, default
//! directories) with its version, stale copies in the system directories, partial cuDNN 8
//! sets; conda environments with their own runtime. Two copies of cuDNN in one process's
//! reach is how version skew and `CUDNN_STATUS_EXECUTION_FAILED` happen (DESIGN.md).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::{Finding, Severity};
use crate::elf::chain::compare_versioned_names;
use crate::host::stack::{
    conda_envs, copies_by_soname, cuda_link, cuda_version_of_dir, library_copies,
    loader_search_path, toolkit_version, toolkits, CudaLink, LibraryCopy, SearchSource, Toolkit,
    DEFAULT_LIB_DIRS,
};
use crate::host::{list_dir, HostRoot};
use crate::matrix::Matrix;

/// The stack checks in report order: toolkits and `/usr/local/cuda`, nvcc, LD_LIBRARY_PATH,
/// the library copies on the loader path, conda environments.
pub fn check(host: &HostRoot, matrix: &Matrix) -> Vec<Finding> {
    let kits = toolkits(host);
    let link = cuda_link(host);
    let mut findings = vec![toolkits_finding(&kits)];
    findings.extend(cuda_link_finding(host, &kits, &link));
    findings.push(nvcc_finding(host, &link));
    findings.extend(ld_library_path_findings(host));
    findings.extend(library_findings(host, matrix));
    findings.extend(conda_findings(host));
    findings
}

/// The toolkits under /usr/local.
fn toolkits_finding(kits: &[Toolkit]) -> Finding {
    let kit_lines: Vec<String> = kits
        .iter()
        .map(|k| {
            format!(
                "{} (CUDA {}{})",
                k.dir.display(),
                k.version
                    .map(|v| v.to_string())
                    .unwrap_or_else(|| "?".into()),
                if k.has_nvcc { ", nvcc" } else { ", no nvcc" }
            )
        })
        .collect();
    Finding::new(
        "stack.toolkits",
        Severity::Info,
        if kits.is_empty() {
            "no CUDA toolkit under /usr/local (fine for pip/conda PyTorch, which brings its own runtime)".to_string()
        } else {
            format!("{} CUDA toolkit(s) under /usr/local", kits.len())
        },
    )
    .evidences(kit_lines)
}

/// Where `/usr/local/cuda` points, when it is a link.
fn cuda_link_finding(host: &HostRoot, kits: &[Toolkit], link: &CudaLink) -> Option<Finding> {
    match link {
        CudaLink::Dangling { target } => Some(
            Finding::new(
                "stack.cuda_link_dangling",
                Severity::Error,
                format!("/usr/local/cuda points to {}, which does not exist", target.display()),
            )
            .evidence(format!("/usr/local/cuda -> {}", target.display()))
            .evidences(if kits.is_empty() {
                vec!["no toolkit under /usr/local to point to".to_string()]
            } else {
                vec![format!("toolkits present: {}", kits.iter().map(|k| k.dir.display().to_string()).collect::<Vec<_>>().join(", "))]
            })
            .fix(match kits.last() {
                Some(kit) => format!("repoint it: `sudo ln -sfn {} /usr/local/cuda` (or remove it and every PATH/LD_LIBRARY_PATH entry that uses it)", kit.dir.display()),
                None => "remove the link and the PATH/LD_LIBRARY_PATH entries that go through it".to_string(),
            }),
        ),
        CudaLink::Link { target, resolved } => Some(
            Finding::new(
                "stack.cuda_link",
                Severity::Ok,
                format!(
                    "/usr/local/cuda -> {} (CUDA {})",
                    target.display(),
                    toolkit_version(host, resolved).map(|v| v.to_string()).unwrap_or_else(|| "?".into())
                ),
            ),
        ),
        CudaLink::Directory | CudaLink::Absent => None,
    }
}

/// The nvcc a shell finds, and whether it is the toolkit behind /usr/local/cuda.
fn nvcc_finding(host: &HostRoot, link: &CudaLink) -> Finding {
    let Some(nvcc) = host.which("nvcc") else {
        return Finding::new(
            "stack.no_nvcc",
            Severity::Info,
            "no nvcc on PATH (only needed to compile CUDA extensions; PyTorch wheels do not need it)",
        );
    };
    let kit_dir = nvcc.parent().and_then(Path::parent).map(Path::to_path_buf);
    let version = kit_dir.as_ref().and_then(|d| {
        let resolved = host.resolve(d).unwrap_or_else(|| d.clone());
        toolkit_version(host, &resolved)
    });
    let mut finding = Finding::new(
        "stack.nvcc",
        Severity::Ok,
        format!(
            "nvcc on PATH: {} (CUDA {})",
            nvcc.display(),
            version.map(|v| v.to_string()).unwrap_or_else(|| "?".into())
        ),
    );
    if let (Some(version), CudaLink::Link { resolved, .. }) = (version, link) {
        if let Some(linked) = toolkit_version(host, resolved) {
            if linked.line() != version.line() {
                finding.severity = Severity::Warning;
                finding = finding
                    .evidence(format!("/usr/local/cuda is CUDA {linked}"))
                    .fix("extensions compile with this nvcc but build systems that use /usr/local/cuda get another toolkit: put the same toolkit first on PATH and behind /usr/local/cuda");
            }
        }
    }
    finding
}

/// LD_LIBRARY_PATH: missing entries, and whether it mixes CUDA versions.
fn ld_library_path_findings(host: &HostRoot) -> Vec<Finding> {
    let mut findings = Vec::new();
    let entries = host.path_list("LD_LIBRARY_PATH");
    let mut lines = Vec::new();
    let mut versions = BTreeSet::new();
    for (position, entry) in entries.iter().enumerate() {
        let exists = host.resolve(entry).is_some_and(|p| host.path(p).is_dir());
        let version = if exists {
            cuda_version_of_dir(host, entry)
        } else {
            None
        };
        if let Some(version) = version {
            versions.insert(version.line());
        }
        lines.push(format!(
            "{}. {}{}",
            position + 1,
            entry.display(),
            match (exists, version) {
                (false, _) => " (missing)".to_string(),
                (true, Some(v)) => format!(" (CUDA {v})"),
                (true, None) => String::new(),
            }
        ));
        if !exists {
            findings.push(
                Finding::new(
                    "stack.ld_library_path_missing_dir",
                    Severity::Info,
                    format!(
                        "LD_LIBRARY_PATH entry {} does not exist (or goes through a dangling link)",
                        entry.display()
                    ),
                )
                .fix("remove it from LD_LIBRARY_PATH"),
            );
        }
    }
    if versions.len() > 1 {
        let listed: Vec<String> = versions.iter().map(|v| v.to_string()).collect();
        findings.push(
            Finding::new(
                "stack.ld_library_path_mixed",
                Severity::Warning,
                format!(
                    "LD_LIBRARY_PATH points at {} CUDA versions ({}); for each library the leftmost directory wins, so one process can mix them",
                    versions.len(),
                    listed.join(", ")
                ),
            )
            .evidences(lines)
            .fix("keep one CUDA version on LD_LIBRARY_PATH (PyTorch wheels need none at all); set it per project, not in ~/.bashrc"),
        );
    } else if !entries.is_empty() {
        findings.push(
            Finding::new(
                "stack.ld_library_path",
                Severity::Ok,
                "LD_LIBRARY_PATH names at most one CUDA version",
            )
            .evidences(lines),
        );
    }
    findings
}

/// Copies of the tracked libraries on the loader path: duplicates per SONAME, two cuDNN
/// majors, partial cuDNN sets, and a summary when all is well.
fn library_findings(host: &HostRoot, matrix: &Matrix) -> Vec<Finding> {
    let search = loader_search_path(host);
    let copies = library_copies(host, &search);
    let groups = copies_by_soname(&copies);
    let mut findings = Vec::new();
    for (soname, group) in &groups {
        // Sub-libraries of cuDNN 8 follow libcudnn.so.8; judge the main library only.
        if soname.starts_with("libcudnn_") {
            continue;
        }
        if group.len() < 2 {
            continue;
        }
        findings.push(copies_finding(host, soname, group));
    }
    findings.extend(cudnn_majors_finding(&groups));
    findings.extend(partial_cudnn_findings(&copies, matrix));
    findings.extend(libraries_summary(&groups, &findings));
    findings
}

fn describe_copy(copy: &LibraryCopy) -> String {
    format!(
        "{} -> {} ({}) [{}]",
        copy.dir.join(&copy.soname).display(),
        copy.file.display(),
        copy.version
            .clone()
            .unwrap_or_else(|| "version not in file name".into()),
        match copy.source {
            SearchSource::LdLibraryPath => "LD_LIBRARY_PATH",
            SearchSource::LdSoCache => "ld.so.cache",
            SearchSource::LdSoConf => "ld.so.conf",
            SearchSource::Default => "default dir",
        }
    )
}

/// Two or more copies of one SONAME: a stale one in a system directory, copies of different
/// versions, or identical duplicates.
fn copies_finding(host: &HostRoot, soname: &str, group: &[&LibraryCopy]) -> Finding {
    let distinct: BTreeSet<Option<&String>> = group.iter().map(|c| c.version.as_ref()).collect();
    let newest = group
        .iter()
        .filter_map(|c| c.version.as_deref())
        .max_by(|a, b| compare_versioned_names(a, b));
    let stale: Vec<&&LibraryCopy> = group
        .iter()
        .filter(|c| is_system_dir(&c.dir))
        .filter(|c| match (c.version.as_deref(), newest) {
            (Some(v), Some(n)) => compare_versioned_names(v, n).is_lt(),
            _ => false,
        })
        .collect();
    let evidence: Vec<String> = group
        .iter()
        .enumerate()
        .map(|(i, c)| format!("{}. {}", i + 1, describe_copy(c)))
        .collect();
    let family = soname.split(".so").next().unwrap_or(soname);
    // Two cuDNN builds in reach is the EXECUTION_FAILED recipe; two CUDA runtimes or
    // cuBLAS builds (several toolkits registered in ld.so.conf.d) are a risk, not a break.
    let severity = if family == "libcudnn" {
        Severity::Error
    } else {
        Severity::Warning
    };
    if !stale.is_empty() {
        stale_copy_finding(host, soname, family, severity, &stale, newest, evidence)
    } else if distinct.len() > 1 {
        Finding::new(
            "stack.library_versions",
            severity,
            format!(
                "{} copies of {soname} with different versions on the loader path; which one a process maps depends on LD_LIBRARY_PATH and the program's RUNPATH",
                group.len()
            ),
        )
        .evidences(evidence)
        .fix(format!("keep one {family} per environment: remove the extra copies (or their directories from LD_LIBRARY_PATH / ld.so.conf.d) and run `sudo ldconfig`"))
    } else {
        Finding::new(
            "stack.library_duplicates",
            Severity::Warning,
            if group.iter().any(|c| c.version.is_none()) {
                format!(
                    "{} copies of {soname} on the loader path (their versions could not be read)",
                    group.len()
                )
            } else {
                format!(
                    "{} copies of {soname} (same version) on the loader path",
                    group.len()
                )
            },
        )
        .evidences(evidence)
        .fix("harmless today, skew tomorrow: keep one copy")
    }
}

/// An older copy in a system directory, with the dpkg package that owns it (if any).
fn stale_copy_finding(
    host: &HostRoot,
    soname: &str,
    family: &str,
    severity: Severity,
    stale: &[&&LibraryCopy],
    newest: Option<&str>,
    evidence: Vec<String>,
) -> Finding {
    let owners: Vec<String> = stale
        .iter()
        .map(|c| {
            let path = c.dir.join(&c.soname);
            match dpkg_owner(host, &c.file).or_else(|| dpkg_owner(host, &path)) {
                Some(package) => {
                    format!("{} is installed by the package {package}", c.file.display())
                }
                None => format!(
                    "{} belongs to no dpkg package (copied by hand)",
                    c.file.display()
                ),
            }
        })
        .collect();
    Finding::new(
        "stack.stale_system_copy",
        severity,
        format!(
            "stale {soname} in a system directory: {} is older than the {} also on the loader path",
            stale.iter().map(|c| c.version.clone().unwrap_or_default()).collect::<Vec<_>>().join(", "),
            newest.unwrap_or("?")
        ),
    )
    .evidences(evidence)
    .evidences(owners)
    .fix(format!(
        "remove the old {family}* files from {} (if a package owns them, remove the package instead) and run `sudo ldconfig`",
        stale.iter().map(|c| c.dir.display().to_string()).collect::<BTreeSet<_>>().into_iter().collect::<Vec<_>>().join(", ")
    ))
}

/// Two cuDNN majors on the loader path.
fn cudnn_majors_finding(groups: &BTreeMap<String, Vec<&LibraryCopy>>) -> Option<Finding> {
    let cudnn_majors: BTreeSet<&str> = groups
        .keys()
        .filter_map(|s| s.strip_prefix("libcudnn.so."))
        .collect();
    if cudnn_majors.len() < 2 {
        return None;
    }
    Some(
        Finding::new(
            "stack.cudnn_majors",
            Severity::Warning,
            format!(
                "cuDNN {} are all on the loader path; each program gets the major it asks for, and headers of one with the library of the other break builds",
                cudnn_majors.iter().copied().collect::<Vec<_>>().join(" and ")
            ),
        )
        .evidences(groups.iter().filter(|(s, _)| s.starts_with("libcudnn.so.")).flat_map(|(_, g)| g.iter().map(|c| describe_copy(c))))
        .fix("remove the cuDNN major nothing uses"),
    )
}

/// Partial cuDNN sets: every directory holding libcudnn.so.N must hold the whole set.
fn partial_cudnn_findings(copies: &[LibraryCopy], matrix: &Matrix) -> Vec<Finding> {
    let mut findings = Vec::new();
    for copy in copies
        .iter()
        .filter(|c| c.soname.starts_with("libcudnn.so."))
    {
        let Some(major) = copy
            .soname
            .trim_start_matches("libcudnn.so.")
            .parse::<u32>()
            .ok()
        else {
            continue;
        };
        let Some(set) = matrix.cudnn_library_set(major) else {
            continue;
        };
        let missing: Vec<&String> = set
            .libs
            .iter()
            .filter(|lib| {
                !copies
                    .iter()
                    .any(|c| &c.soname == *lib && c.dir == copy.dir)
            })
            .collect();
        if !missing.is_empty() {
            findings.push(
                Finding::new(
                    "stack.cudnn_partial",
                    Severity::Error,
                    format!(
                        "{} has libcudnn.so.{major} but not the rest of cuDNN {major} ({} missing): programs fail with '<lib>: cannot open shared object file' at the first convolution",
                        copy.dir.display(),
                        missing.len()
                    ),
                )
                .evidence(format!("missing: {}", missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")))
                .fix("copy the complete set with `cp -P` (keeps the symlink chain) or remove the partial copy"),
            );
        }
    }
    findings
}

/// `stack.libraries`: no tracked library at all, or one copy of each (when no copy finding
/// was raised above).
fn libraries_summary(
    groups: &BTreeMap<String, Vec<&LibraryCopy>>,
    findings: &[Finding],
) -> Option<Finding> {
    if groups.is_empty() {
        return Some(Finding::new(
            "stack.libraries",
            Severity::Ok,
            "no system copy of libcudnn/libcudart/libcublas on the loader path (frameworks use their own)",
        ));
    }
    let copies_flagged = findings.iter().any(|f| {
        matches!(
            f.id.as_str(),
            "stack.stale_system_copy" | "stack.library_versions" | "stack.library_duplicates"
        )
    });
    (!copies_flagged).then(|| {
        Finding::new(
            "stack.libraries",
            Severity::Ok,
            "one copy of each CUDA library on the loader path",
        )
        .evidences(
            groups
                .values()
                .flat_map(|g| g.iter().map(|c| describe_copy(c))),
        )
    })
}

/// Conda environments with their own runtime.
fn conda_findings(host: &HostRoot) -> Vec<Finding> {
    conda_envs(host)
        .into_iter()
        .map(|env| {
            Finding::new(
                "stack.conda_env",
                Severity::Info,
                format!(
                    "conda environment {}{} carries its own CUDA libraries",
                    env.prefix.display(),
                    if env.active { " (active)" } else { "" }
                ),
            )
            .evidence(format!(
                "libcudart {}, libcudnn {}",
                env.cuda_runtime.clone().unwrap_or_else(|| "-".into()),
                env.cudnn.clone().unwrap_or_else(|| "-".into())
            ))
            .fix("inside that environment use its libraries only: do not add system CUDA directories to LD_LIBRARY_PATH while it is active")
        })
        .collect()
}

/// The dpkg package that installed a host file (`/var/lib/dpkg/info/*.list`), if any.
fn dpkg_owner(host: &HostRoot, file: &Path) -> Option<String> {
    let wanted = file.to_string_lossy();
    list_dir(host, Path::new("/var/lib/dpkg/info"), |name| {
        name.to_string_lossy().ends_with(".list")
    })
    .into_iter()
    .find_map(|list| {
        let text = host.read_text(&list)?;
        text.lines().any(|line| line == wanted).then(|| {
            let name = list.file_name()?.to_string_lossy().into_owned();
            Some(name.trim_end_matches(".list").to_string())
        })?
    })
}

fn is_system_dir(dir: &Path) -> bool {
    DEFAULT_LIB_DIRS.iter().any(|d| Path::new(d) == dir)
}
