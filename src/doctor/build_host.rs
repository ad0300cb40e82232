//! Can this host run `cudastack build`? A build host needs no GPU: mmdebstrap, a way to
//! build the Debian base (as root, or without root in a user namespace or under
//! fakechroot: docs/rootless.md), a writable cache with room for an image, and Docker
//! only to `--load` or verify.
//!
//! The facts are gathered once ([`BuildHostFacts::gather`]) and judged by a pure function
//! ([`findings`]), so tests judge planted facts. Nothing here changes the host, except a
//! probe file created and removed in the cache directory to prove it is writable.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Serialize;

use super::{Finding, LayerStatus, Severity};
use crate::base_root::rootless::{hint_for, which, BuildHost, BuildMode};
use crate::host::HostRoot;

/// Versioned identifier of `doctor --build-host --json`.
pub const BUILD_HOST_SCHEMA: &str = "cudastack.doctor.build-host/v1";

/// The free space a build of one torch image needs in the cache: its blobs (wheels,
/// compressed layers) and the staged trees together were about 12 GB for the
/// torch 2.4.1 + CUDA 12.1 recipe.
pub const TORCH_IMAGE_CACHE_BYTES: u64 = 12 * 1_000_000_000;

/// What was read about this host.
#[derive(Debug, Clone)]
pub struct BuildHostFacts {
    pub build: BuildHost,
    /// `mmdebstrap --version`'s answer and where it is, or why there is none.
    pub mmdebstrap: Result<(PathBuf, String), String>,
    pub cache_dir: PathBuf,
    /// Whether a file can be created in the cache directory (or, when it does not exist
    /// yet, in the nearest directory above it that does).
    pub cache_writable: Result<(), String>,
    /// Bytes available to this user on the cache's filesystem.
    pub cache_free: Option<u64>,
    /// The Docker finding of the runtime layer, as it stands.
    pub docker: Finding,
}

impl BuildHostFacts {
    pub fn gather(host: &HostRoot, cache_dir: &Path) -> Self {
        let existing = nearest_existing(cache_dir);
        BuildHostFacts {
            build: BuildHost::detect(),
            mmdebstrap: mmdebstrap_version(),
            cache_dir: cache_dir.to_path_buf(),
            cache_writable: writable(&existing),
            cache_free: free_bytes(&existing),
            docker: match super::runtime::docker_reachable(host) {
                Ok((finding, _)) => finding,
                Err(finding) => finding,
            },
        }
    }
}

/// The build host section of `doctor`.
#[derive(Debug, Clone, Serialize)]
pub struct BuildHostReport {
    pub schema: &'static str,
    pub title: &'static str,
    pub status: LayerStatus,
    pub uid: u32,
    pub user: Option<String>,
    /// The modes that work here, in the order `--build-mode auto` prefers them.
    pub modes: Vec<BuildMode>,
    /// What `--build-mode auto` uses; none when no mode works.
    pub auto: Option<BuildMode>,
    pub findings: Vec<Finding>,
}

/// Gather and judge this host.
pub fn check(host: &HostRoot, cache_dir: &Path) -> BuildHostReport {
    report(&BuildHostFacts::gather(host, cache_dir))
}

pub fn report(facts: &BuildHostFacts) -> BuildHostReport {
    let findings = findings(facts);
    let status = match findings.iter().map(|f| f.severity).max() {
        Some(Severity::Error) => LayerStatus::Broken,
        Some(Severity::Warning) => LayerStatus::Warning,
        _ => LayerStatus::Ok,
    };
    let modes = facts.build.available();
    BuildHostReport {
        schema: BUILD_HOST_SCHEMA,
        title: "build host (cudastack build)",
        status,
        uid: facts.build.uid,
        user: facts.build.user.clone(),
        auto: modes.first().copied(),
        modes,
        findings,
    }
}

/// Every finding about the build host, in the order a build meets them.
pub fn findings(facts: &BuildHostFacts) -> Vec<Finding> {
    let mut found = vec![mmdebstrap_finding(facts)];
    found.extend(mode_findings(&facts.build));
    found.push(cache_writable_finding(facts));
    found.push(disk_finding(facts));
    found.push(docker_finding(&facts.docker));
    found
}

fn mmdebstrap_finding(facts: &BuildHostFacts) -> Finding {
    match &facts.mmdebstrap {
        Ok((path, version)) => Finding::new(
            "build.mmdebstrap",
            Severity::Ok,
            format!("{version} at {}", path.display()),
        ),
        Err(why) => Finding::new(
            "build.mmdebstrap",
            Severity::Error,
            "mmdebstrap is missing: `cudastack build` makes the Debian base with it",
        )
        .evidence(why.clone())
        .fix("install it: `sudo apt-get install mmdebstrap` (Debian 11+, Ubuntu 22.04+)"),
    }
}

/// One finding per mode (available or why not), then the one `auto` picks.
fn mode_findings(build: &BuildHost) -> Vec<Finding> {
    let mut found: Vec<Finding> = BuildMode::ALL
        .into_iter()
        .map(|mode| {
            let id = format!("build.mode.{mode}");
            match build.missing(mode) {
                None => Finding::new(&id, Severity::Ok, format!("{mode} mode works here")),
                Some(why) => Finding::new(
                    &id,
                    Severity::Info,
                    format!("{mode} mode does not work here"),
                )
                .evidence(why)
                .fix(hint_for(mode)),
            }
        })
        .collect();
    found.push(match build.choose(None) {
        Ok(mode) => Finding::new(
            "build.mode",
            Severity::Ok,
            format!("`cudastack build` (--build-mode auto) builds the base in {mode} mode"),
        ),
        Err(_) => Finding::new(
            "build.mode",
            Severity::Error,
            "no build mode works here: not root, and neither rootless mode of mmdebstrap works",
        )
        .evidence(format!(
            "unshare: {}",
            build.unshare_missing().unwrap_or_default()
        ))
        .evidence(format!(
            "fakechroot: {}",
            build.fakechroot_missing().unwrap_or_default()
        ))
        .fix(format!(
            "{}; or {}",
            hint_for(BuildMode::Fakechroot),
            hint_for(BuildMode::Unshare)
        )),
    });
    found
}

fn cache_writable_finding(facts: &BuildHostFacts) -> Finding {
    let dir = facts.cache_dir.display();
    match &facts.cache_writable {
        Ok(()) => Finding::new(
            "build.cache_writable",
            Severity::Ok,
            format!("the cache directory {dir} is writable"),
        ),
        Err(why) => Finding::new(
            "build.cache_writable",
            Severity::Error,
            format!("the cache directory {dir} is not writable by this user"),
        )
        .evidence(why.clone())
        .fix("give --cache-dir (or CUDASTACK_CACHE_DIR) a directory you own, or fix its owner (`sudo chown -R \"$(id -u):$(id -g)\" DIR`)"),
    }
}

fn disk_finding(facts: &BuildHostFacts) -> Finding {
    let need = TORCH_IMAGE_CACHE_BYTES;
    let Some(free) = facts.cache_free else {
        return Finding::new(
            "build.disk",
            Severity::Info,
            format!("free space under {} unknown", facts.cache_dir.display()),
        );
    };
    let summary = format!(
        "{} free for the cache {}; a torch image needs about {}",
        gigabytes(free),
        facts.cache_dir.display(),
        gigabytes(need)
    );
    if free >= need {
        return Finding::new("build.disk", Severity::Ok, summary);
    }
    Finding::new("build.disk", Severity::Warning, summary)
        .evidence("wheels, compressed layers and the staged trees of one torch image: about 12 GB")
        .fix("free space there, or point --cache-dir (CUDASTACK_CACHE_DIR) at a larger disk")
}

fn docker_finding(docker: &Finding) -> Finding {
    let mut finding = Finding::new(
        "build.docker",
        if docker.severity == Severity::Ok {
            Severity::Ok
        } else {
            Severity::Info
        },
        if docker.severity == Severity::Ok {
            format!("{} (for --load and verification)", docker.summary)
        } else {
            format!(
                "{}; a build needs Docker only for --load and verification (or pass --no-verify)",
                docker.summary
            )
        },
    )
    .evidences(docker.evidence.clone());
    finding.fix = docker.fix.clone();
    finding
}

fn gigabytes(bytes: u64) -> String {
    format!("{:.1} GB", bytes as f64 / 1e9)
}

fn mmdebstrap_version() -> Result<(PathBuf, String), String> {
    let path = which("mmdebstrap").ok_or("`mmdebstrap` is not on PATH")?;
    let output = Command::new(&path)
        .arg("--version")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", path.display()))?;
    let version = String::from_utf8_lossy(&output.stdout).trim().to_string();
    if !output.status.success() || version.is_empty() {
        return Err(format!(
            "`{} --version` failed: {}",
            path.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok((path, version))
}

/// `dir`, or the nearest directory above it that exists (where the build would create it).
fn nearest_existing(dir: &Path) -> PathBuf {
    dir.ancestors()
        .find(|a| a.is_dir())
        .unwrap_or(Path::new("/"))
        .to_path_buf()
}

/// Create and remove a file in `dir`: the only sure test (ACLs, read-only mounts).
fn writable(dir: &Path) -> Result<(), String> {
    tempfile::Builder::new()
        .prefix(".cudastack-doctor-")
        .tempfile_in(dir)
        .map(drop)
        .map_err(|e| format!("cannot create a file in {}: {e}", dir.display()))
}

/// Bytes an unprivileged user may still write on `dir`'s filesystem (`statvfs`).
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string and `stat` a valid statvfs to fill.
    let result = unsafe { libc::statvfs(path.as_ptr(), &mut stat) };
    (result == 0).then(|| stat.f_bavail as u64 * stat.f_frsize as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base_root::rootless::IdRange;

    fn facts() -> BuildHostFacts {
        let range = Some(IdRange {
            start: 100_000,
            count: 65_536,
        });
        BuildHostFacts {
            build: BuildHost {
                uid: 1000,
                user: Some("ci".into()),
                user_namespaces: Err("Operation not permitted".into()),
                subuid: range,
                subgid: range,
                newuidmap: Some("/usr/bin/newuidmap".into()),
                newgidmap: Some("/usr/bin/newgidmap".into()),
                fakechroot: Some("/usr/bin/fakechroot".into()),
                fakeroot: Some("/usr/bin/fakeroot".into()),
            },
            mmdebstrap: Ok(("/usr/bin/mmdebstrap".into(), "mmdebstrap 1.3.5".into())),
            cache_dir: "/home/ci/.cache/cudastack".into(),
            cache_writable: Ok(()),
            cache_free: Some(50_000_000_000),
            docker: Finding::new(
                "docker.unreachable",
                Severity::Error,
                "Docker is not reachable: no daemon socket",
            ),
        }
    }

    fn find<'a>(report: &'a BuildHostReport, id: &str) -> &'a Finding {
        report.findings.iter().find(|f| f.id == id).unwrap()
    }

    #[test]
    fn a_ci_container_without_user_namespaces_builds_under_fakechroot() {
        let report = report(&facts());
        assert_eq!(report.status, LayerStatus::Ok);
        assert_eq!(report.modes, vec![BuildMode::Fakechroot]);
        assert_eq!(report.auto, Some(BuildMode::Fakechroot));
        let unshare = find(&report, "build.mode.unshare");
        assert_eq!(unshare.severity, Severity::Info);
        assert!(unshare.evidence[0].contains("Operation not permitted"));
        assert_eq!(find(&report, "build.docker").severity, Severity::Info);
    }

    #[test]
    fn no_mode_no_mmdebstrap_and_a_small_disk_say_what_to_do() {
        let mut facts = facts();
        facts.build.fakechroot = None;
        facts.mmdebstrap = Err("`mmdebstrap` is not on PATH".into());
        facts.cache_free = Some(3_000_000_000);
        let report = report(&facts);
        assert_eq!(report.status, LayerStatus::Broken);
        assert_eq!(report.auto, None);
        let mode = find(&report, "build.mode");
        assert_eq!(mode.severity, Severity::Error);
        assert!(mode
            .fix
            .as_deref()
            .unwrap()
            .contains("apt-get install fakechroot fakeroot"));
        let mmdebstrap = find(&report, "build.mmdebstrap");
        assert!(mmdebstrap
            .fix
            .as_deref()
            .unwrap()
            .contains("apt-get install mmdebstrap"));
        let disk = find(&report, "build.disk");
        assert_eq!(disk.severity, Severity::Warning);
        assert!(disk.summary.contains("3.0 GB free"), "{}", disk.summary);
    }

    #[test]
    fn free_space_and_writability_of_a_real_directory() {
        let dir = tempfile::tempdir().unwrap();
        assert!(free_bytes(dir.path()).unwrap() > 0);
        assert!(writable(dir.path()).is_ok());
        assert_eq!(nearest_existing(&dir.path().join("a/b")), dir.path());
        assert!(free_bytes(Path::new("/nonexistent/x")).is_none());
    }
}
