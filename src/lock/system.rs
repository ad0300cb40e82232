//! The base's Debian or Ubuntu packages and the recipe's `apt:` packages, locked as `deb`
//! artifacts.
//!
//! apt decides both sets ([`crate::apt::Resolution`]): the base is mmdebstrap's minbase
//! (`?essential`, `?priority(required)`, apt) plus what a Python CUDA stack needs; the
//! `apt:` layer is what the recipe's packages add to that. They are two layers, so every
//! recipe on the same base and stack shares the base layer, whatever its `apt:` list.
//!
//! Locked versions are kept: a package whose version changed in the archive is pinned
//! back to the locked one unless `lock --upgrade` (or `--upgrade-package NAME`) says
//! otherwise, so security updates arrive as reviewed diffs of the lock.

use std::collections::BTreeMap;
use std::str::FromStr;

use crate::apt::{AptError, AptSources, DebPackage, Resolution};
use crate::fetch::file_name::FileName;
use crate::lock::lockfile::{Artifact, ArtifactKind, DebLayer, Lockfile};
use crate::lock::target::Target;
use crate::matrix::validate::system_packages::library_family;
use crate::recipe::DebName;

/// What the base installs on top of minbase for a Python CUDA stack: the interpreter and
/// CA certificates for anything that talks TLS. Not libgomp: torch vendors its own, and a
/// second OpenMP runtime with the same SONAME is exactly what the audit refuses.
pub const STACK_PACKAGES: [&str; 2] = ["python3", "ca-certificates"];

/// cuFile's RDMA plugin (GPUDirect Storage, nvidia-cufile wheels from torch 2.7 on) links
/// the rdma-core user-space libraries; the distribution provides them, so every
/// DT_NEEDED in the image resolves.
pub const CUFILE_PACKAGES: [&str; 3] = ["libibverbs1", "librdmacm1", "ibverbs-providers"];

/// mmdebstrap's minbase variant: the Essential set, priority required, and apt.
const MINBASE: [&str; 3] = ["?essential", "?priority(required)", "apt"];

#[derive(Debug, thiserror::Error)]
pub enum SystemError {
    #[error(transparent)]
    Apt(#[from] AptError),
    #[error("the locked {} of {} left the archive: {}\n  hint: run `cudastack lock --upgrade` to move to the archive's current versions (and review the diff it prints), or `--upgrade-package NAME` for one package", if packages.len() == 1 { "version" } else { "versions" }, suite, packages.join(", "))]
    LockedVersionGone {
        packages: Vec<String>,
        suite: String,
    },
    #[error(
        "the base {base} has {what} {found}, but the recipe asks for {expected}\n  hint: {hint}"
    )]
    BaseMismatch {
        base: String,
        what: &'static str,
        found: String,
        expected: String,
        hint: &'static str,
    },
    #[error("`apt:` {roots} pulls in `{package}`, which would install {installs}: {why}\n  hint: leave out the `apt:` package that depends on it (`apt-cache rdepends {package}` on a {base} machine says which)")]
    SecondCopy {
        roots: String,
        package: String,
        installs: &'static str,
        why: &'static str,
        base: String,
    },
    #[error("apt named the file `{0}`, which cannot be a file name")]
    BadFileName(String),
    #[error("`apt:` package `{package}` needs {base_package} {apt_version}, but the base has {base_version}; the apt layer cannot replace a base package\n  hint: pin `{package}` to a version that works with the base's {base_package} (`apt-cache policy {package}`)")]
    ChangesTheBase {
        package: String,
        base_package: String,
        base_version: String,
        apt_version: String,
    },
}

/// What to lock of a Debian or Ubuntu base.
#[derive(Debug, Clone)]
pub struct SystemRequest {
    pub sources: AptSources,
    /// `debian:bookworm`, for errors.
    pub base: String,
    /// The recipe's `apt:` entries as apt-get takes them (`git`, `git=1:2.39.5-0+deb12u2`).
    pub apt: Vec<String>,
    /// Name -> version of the previous lock's debs to keep where apt would now pick
    /// another; empty for `lock --upgrade`.
    pub keep: BTreeMap<String, String>,
    /// The previous lock's debs by name: where apt picks the same file, its recorded
    /// fallback URL is kept, so relocking an unchanged archive state gives the same lock
    /// even after the archive re-signed its InRelease (a new Date).
    pub previous: BTreeMap<String, Artifact>,
}

impl SystemRequest {
    /// Keep `previous`'s debs, less the packages to upgrade (`Some(&[])`: all of them).
    pub fn keep_from(&mut self, previous: Option<&Lockfile>, upgrade: Option<&[String]>) {
        let debs = previous
            .iter()
            .flat_map(|lock| &lock.artifacts)
            .filter(|a| a.kind == ArtifactKind::Deb);
        self.previous = debs.clone().map(|a| (a.name.clone(), a.clone())).collect();
        self.keep = match upgrade {
            Some([]) => BTreeMap::new(),
            _ => debs
                .filter(|a| !upgrade.is_some_and(|names| names.contains(&a.name)))
                .map(|a| (a.name.clone(), a.version.clone()))
                .collect(),
        };
    }
}

/// Resolve the base and the `apt:` layer with apt; `cufile` adds [`CUFILE_PACKAGES`].
/// Blocking: runs apt.
pub fn resolve_system(
    request: &SystemRequest,
    target: &Target,
    cufile: bool,
) -> Result<Vec<Artifact>, SystemError> {
    let release = request.base.split(':').nth(1).unwrap_or(&request.base);
    let apt = Resolution::update(&request.sources, release)?;
    let mut roots: Vec<String> = MINBASE
        .iter()
        .chain(&STACK_PACKAGES)
        .map(|s| s.to_string())
        .collect();
    if cufile {
        roots.extend(CUFILE_PACKAGES.map(String::from));
    }
    let base = resolve_keeping(&apt, &roots, request)?;
    check_base(request, target, &base)?;
    let mut artifacts = base
        .iter()
        .map(|p| artifact(p, DebLayer::Base))
        .collect::<Result<Vec<_>, _>>()?;
    if !request.apt.is_empty() {
        roots.extend(request.apt.iter().cloned());
        let full = resolve_keeping(&apt, &roots, request)?;
        let base_versions: BTreeMap<&str, &str> = base
            .iter()
            .map(|p| (p.name.as_str(), p.version.as_str()))
            .collect();
        for package in &full {
            match base_versions.get(package.name.as_str()) {
                Some(version) if *version == package.version => {}
                Some(version) => {
                    return Err(SystemError::ChangesTheBase {
                        package: request.apt.join(" "),
                        base_package: package.name.clone(),
                        base_version: version.to_string(),
                        apt_version: package.version.clone(),
                    })
                }
                None => {
                    refuse_second_copy(request, &package.name)?;
                    artifacts.push(artifact(package, DebLayer::Apt)?)
                }
            }
        }
    }
    for artifact in &mut artifacts {
        if let Some(before) = request.previous.get(&artifact.name) {
            if before.sha256 == artifact.sha256
                && before.url == artifact.url
                && before.fallback_url.is_some()
            {
                artifact.fallback_url = before.fallback_url.clone();
            }
        }
    }
    Ok(artifacts)
}

/// `validate` refuses an `apt:` entry that is a CUDA, cuDNN, NCCL or driver package; a
/// dependency apt pulls in can be one too, and only the lock sees it.
fn refuse_second_copy(request: &SystemRequest, name: &str) -> Result<(), SystemError> {
    let Ok(deb_name) = DebName::from_str(name) else {
        return Ok(());
    };
    match library_family(&deb_name) {
        Some(family) => Err(SystemError::SecondCopy {
            roots: request.apt.join(" "),
            package: name.to_string(),
            installs: family.installs,
            why: family.why,
            base: request.base.clone(),
        }),
        None => Ok(()),
    }
}

/// apt's set for `roots`, with every package the previous lock had pinned back to its
/// locked version (when apt would now pick another). Pinning can bring in a package the
/// first answer did not have (an old version's own dependency), so it is repeated until
/// every package apt picks is at its locked version, or has none.
fn resolve_keeping(
    apt: &Resolution,
    roots: &[String],
    request: &SystemRequest,
) -> Result<Vec<DebPackage>, SystemError> {
    let mut pins: Vec<String> = Vec::new();
    for _ in 0..8 {
        let asked: Vec<String> = roots.iter().chain(&pins).cloned().collect();
        let chosen = match apt.resolve(&asked) {
            Err(AptError::NotFound {
                packages, searched, ..
            }) if !pins.is_empty() => {
                return Err(SystemError::LockedVersionGone {
                    packages,
                    suite: searched,
                })
            }
            other => other?,
        };
        let more: Vec<String> = chosen
            .iter()
            .filter_map(|p| {
                let kept = request.keep.get(&p.name)?;
                (kept != &p.version).then(|| format!("{}={kept}", p.name))
            })
            .collect();
        if more.is_empty() {
            return Ok(chosen);
        }
        pins.extend(more);
    }
    Err(SystemError::Apt(AptError::Unsatisfiable {
        roots: roots.join(" "),
        output: "    the locked versions did not settle after 8 rounds of pinning".into(),
    }))
}

/// The base's python3 must be the recipe's Python, and its glibc at least the wheels'
/// manylinux level: checked here, before anything is built.
fn check_base(
    request: &SystemRequest,
    target: &Target,
    base: &[DebPackage],
) -> Result<(), SystemError> {
    let version_of = |name: &str| {
        base.iter()
            .find(|p| p.name == name)
            .map(|p| p.version.clone())
    };
    let python = version_of("python3");
    let python_mm = python.as_deref().and_then(crate::apt::major_minor);
    let wanted = (target.python.major, target.python.minor);
    if python_mm != Some(wanted) {
        return Err(SystemError::BaseMismatch {
            base: request.base.clone(),
            what: "python3",
            found: python.unwrap_or_else(|| "none".into()),
            expected: format!("Python {}.{}", wanted.0, wanted.1),
            hint: "set `python:` to the base's version, or pick a base release that ships it",
        });
    }
    let libc = version_of("libc6");
    let glibc = (target.glibc.major, target.glibc.minor);
    if libc
        .as_deref()
        .and_then(crate::apt::major_minor)
        .is_some_and(|found| found < glibc)
    {
        return Err(SystemError::BaseMismatch {
            base: request.base.clone(),
            what: "glibc",
            found: libc.unwrap_or_default(),
            expected: format!(">= {}.{} (the wheels' manylinux level)", glibc.0, glibc.1),
            hint: "use a newer base release",
        });
    }
    Ok(())
}

fn artifact(package: &DebPackage, layer: DebLayer) -> Result<Artifact, SystemError> {
    Ok(Artifact {
        kind: ArtifactKind::Deb,
        name: package.name.clone(),
        version: package.version.clone(),
        filename: FileName::new(package.filename.clone())
            .map_err(|_| SystemError::BadFileName(package.filename.clone()))?,
        url: package.url.clone().into(),
        sha256: package.sha256,
        size: package.size,
        source: package.archive_root.clone(),
        platform: Some(package.architecture.clone()),
        variant: None,
        requires: Vec::new(),
        required_by: Vec::new(),
        suite: Some(package.suite.clone()),
        component: Some(package.component.clone()),
        fallback_url: package.snapshot_url.clone(),
        layer: Some(layer),
    })
}

/// One difference between two locks' debs, as `lock` prints it.
pub type DebChange = crate::lock::changes::PackageChange;

/// What changed in the debs from `old` to `new`, in name order.
pub fn deb_changes(old: Option<&Lockfile>, new: &Lockfile) -> Vec<DebChange> {
    crate::lock::changes::changes(old, new, ArtifactKind::is_deb)
}
