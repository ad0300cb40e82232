//! The base layer: a Debian or Ubuntu root filesystem built hermetically with mmdebstrap,
//! or an existing image (OCI layout) whose layers become the first layers of the stack.
//!
//! mmdebstrap honours SOURCE_DATE_EPOCH, and the layer writer fixes every mtime and the
//! entry order, so the same package set gives the same layer. What mmdebstrap cannot pin
//! is the archive itself: a security update changes the package set. The layer cache key
//! therefore names the inputs cudastack controls, and [`inspect_rootfs`] records the
//! Python and glibc the base really has so the build checks them against the wheels.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::version::PythonVersion;

#[derive(Debug, thiserror::Error)]
pub enum BaseError {
    #[error("`mmdebstrap` is not installed; install it (`apt-get install mmdebstrap`) or give an existing base with `base: {{ oci: PATH }}`")]
    MmdebstrapMissing,
    #[error("mmdebstrap failed for {distro} {release} (exit status {status})\n  command: {command}\n  output (last lines):\n{output}")]
    Mmdebstrap {
        distro: String,
        release: String,
        status: String,
        command: String,
        output: String,
    },
    #[error("I/O error on `{path}`")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Foreign(#[from] crate::stack::foreign_base::ForeignBaseError),
    #[error("the base has no {what} in `{path}`; cudastack needs {why}")]
    Missing {
        what: &'static str,
        path: PathBuf,
        why: &'static str,
    },
}

/// A rootfs cudastack builds itself.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DebootstrapSpec {
    pub distro: String,
    pub release: String,
    /// Packages on top of the minbase variant.
    pub packages: Vec<String>,
    pub mirror: Option<String>,
    pub source_date_epoch: u64,
    /// The Debian architecture when it is not the build host's (`arm64` on x86_64): the
    /// packages are unpacked, not configured, and [`foreign_base`] finishes the root.
    /// Absent from the cache key of native bases, so their keys did not change.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub foreign_architecture: Option<String>,
    /// The base's Debian architecture when it is not amd64 (native arm64 on an aarch64
    /// builder): in the cache key, so a cache shared between machines never mixes them.
    /// Absent for amd64, so the keys of amd64 bases did not change.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
}

impl DebootstrapSpec {
    /// What a Python CUDA stack needs on top of minbase: the interpreter and CA certificates
    /// for anything that talks TLS. Not libgomp: torch vendors its own, and a second OpenMP
    /// runtime with the same SONAME is exactly what the audit refuses.
    pub fn for_python_stack(distro: &str, release: &str, source_date_epoch: u64) -> Self {
        Self {
            distro: distro.to_string(),
            release: release.to_string(),
            packages: ["python3", "ca-certificates"].map(String::from).to_vec(),
            mirror: None,
            source_date_epoch,
            foreign_architecture: None,
            architecture: (host_debian_architecture() != "amd64")
                .then(|| host_debian_architecture().to_string()),
        }
    }

    /// The same base for the Debian architecture `architecture` (`amd64`, `arm64`):
    /// foreign when it is not the build host's.
    pub fn for_architecture(mut self, architecture: &str) -> Self {
        self.foreign_architecture =
            (architecture != host_debian_architecture()).then(|| architecture.to_string());
        self.architecture = (architecture != "amd64").then(|| architecture.to_string());
        self
    }

    fn mirror(&self) -> String {
        let architecture = self
            .foreign_architecture
            .as_deref()
            .unwrap_or(host_debian_architecture());
        let ports = !matches!(architecture, "amd64" | "i386");
        self.mirror
            .clone()
            .unwrap_or_else(|| match self.distro.as_str() {
                // Ubuntu serves architectures other than amd64/i386 from a separate archive.
                "ubuntu" if ports => "http://ports.ubuntu.com/ubuntu-ports".to_string(),
                "ubuntu" => "http://archive.ubuntu.com/ubuntu".to_string(),
                _ => "http://deb.debian.org/debian".to_string(),
            })
    }
}

pub use crate::platform::host_debian_architecture;

/// The ELF machine of a Debian architecture's objects.
fn machine_of(architecture: &str) -> crate::elf::Machine {
    crate::platform::Platform::from_debian(architecture)
        .unwrap_or(crate::platform::Platform::LinuxAmd64)
        .to_elf()
}

/// Run mmdebstrap into `dest` (which must not exist or be empty). Device nodes are left out:
/// container runtimes provide /dev, and a layer should not carry them.
pub fn debootstrap(spec: &DebootstrapSpec, dest: &Path) -> Result<(), BaseError> {
    if which("mmdebstrap").is_none() {
        return Err(BaseError::MmdebstrapMissing);
    }
    run_mmdebstrap(spec, mmdebstrap_command(spec, dest))?;
    if let Some(architecture) = &spec.foreign_architecture {
        crate::stack::foreign_base::finish_unpacked_root(
            dest,
            machine_of(architecture),
            spec.source_date_epoch,
        )?;
    }
    remove_device_nodes(dest)
}

/// The mmdebstrap command for `spec`: minbase natively, unpack-only for another
/// architecture.
fn mmdebstrap_command(spec: &DebootstrapSpec, dest: &Path) -> Command {
    // Caches, logs and the package lists change with every run and are no use in an image.
    const CLEAN: &str = "rm -rf \"$1\"/var/cache/apt/* \"$1\"/var/lib/apt/lists/* \"$1\"/var/log/* \"$1\"/var/cache/ldconfig/aux-cache";
    let mut command = Command::new("mmdebstrap");
    command.arg("--mode=root").arg("--quiet");
    match &spec.foreign_architecture {
        None => {
            command
                .arg("--variant=minbase")
                .arg(format!("--include={}", spec.packages.join(",")))
                .arg(format!("--customize-hook={CLEAN}"));
        }
        Some(architecture) => {
            // No emulation: unpack what minbase installs (the Essential set and apt, whose
            // libstdc++ every C++ wheel links) and ours, and finish the root below. The
            // extract variant runs only extract hooks, and the .debs are still in the apt
            // cache then (for the dpkg database hook) until the clean hook.
            command
                .arg("--variant=extract")
                .arg(format!("--architectures={architecture}"))
                .arg("--include=?essential")
                .arg("--include=?priority(required)")
                .arg(format!("--include=apt,{}", spec.packages.join(",")))
                .arg(format!(
                    "--extract-hook={}",
                    crate::stack::foreign_base::DPKG_STATUS_HOOK
                ))
                .arg(format!("--extract-hook={CLEAN}"));
            let merged_usr = Path::new("/usr/share/mmdebstrap/hooks/merged-usr");
            if merged_usr.is_dir() {
                command.arg(format!("--hook-dir={}", merged_usr.display()));
            }
        }
    }
    command
        .arg(&spec.release)
        .arg(dest)
        .arg(spec.mirror())
        .env("SOURCE_DATE_EPOCH", spec.source_date_epoch.to_string());
    command
}

/// Run `command`; on failure the error shows it and the last lines of its output.
fn run_mmdebstrap(spec: &DebootstrapSpec, mut command: Command) -> Result<(), BaseError> {
    let shown = format!("{command:?}");
    let output = command.output().map_err(|source| BaseError::Io {
        path: PathBuf::from("mmdebstrap"),
        source,
    })?;
    if output.status.success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&output.stderr);
    let tail: Vec<&str> = text
        .lines()
        .rev()
        .take(15)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    Err(BaseError::Mmdebstrap {
        distro: spec.distro.clone(),
        release: spec.release.clone(),
        status: output.status.to_string(),
        command: shown,
        output: tail.join("\n"),
    })
}

/// Device nodes are the runtime's business (it mounts /dev); keep /dev itself, empty.
fn remove_device_nodes(dest: &Path) -> Result<(), BaseError> {
    let dev = dest.join("dev");
    if !dev.is_dir() {
        return Ok(());
    }
    let io_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| BaseError::Io { path, source }
    };
    for entry in fs_err::read_dir(&dev).map_err(io_error(&dev))? {
        let path = entry.map_err(io_error(&dev))?.path();
        let removed = if path.is_dir() && !path.is_symlink() {
            fs_err::remove_dir_all(&path)
        } else {
            fs_err::remove_file(&path)
        };
        removed.map_err(io_error(&path))?;
    }
    Ok(())
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| Path::new(dir).join(program))
        .find(|path| path.is_file())
}

/// What a base root filesystem provides, read from its dpkg database.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RootfsFacts {
    pub python: Option<PythonVersion>,
    /// `major.minor` of libc6.
    pub glibc: Option<(u32, u32)>,
    /// `/etc/os-release` PRETTY_NAME.
    pub os: Option<String>,
}

/// Read the Python and glibc versions from `var/lib/dpkg/status` under `root`.
pub fn inspect_rootfs(root: &Path) -> Result<RootfsFacts, BaseError> {
    let status_path = root.join("var/lib/dpkg/status");
    let status = fs_err::read_to_string(&status_path).map_err(|source| BaseError::Io {
        path: status_path.clone(),
        source,
    })?;
    let os = fs_err::read_to_string(root.join("etc/os-release"))
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|line| line.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_string())
        });
    Ok(RootfsFacts {
        python: dpkg_version(&status, "python3")
            .and_then(|v| parse_major_minor(&v))
            .map(|(a, b)| PythonVersion::new(a, b)),
        glibc: dpkg_version(&status, "libc6").and_then(|v| parse_major_minor(&v)),
        os,
    })
}

/// The version of `package` in a dpkg status file, when its files are on disk: installed,
/// or unpacked (a foreign-architecture base, see [`crate::stack::foreign_base`]).
pub fn dpkg_version(status: &str, package: &str) -> Option<String> {
    status.split("\n\n").find_map(|stanza| {
        let mut name = None;
        let mut version = None;
        let mut installed = false;
        for line in stanza.lines() {
            if let Some(value) = line.strip_prefix("Package: ") {
                name = Some(value.trim());
            } else if let Some(value) = line.strip_prefix("Version: ") {
                version = Some(value.trim());
            } else if let Some(value) = line.strip_prefix("Status: ") {
                let value = value.trim();
                installed = value.ends_with(" installed") || value.ends_with(" unpacked");
            }
        }
        (name == Some(package) && installed)
            .then(|| version.map(str::to_string))
            .flatten()
    })
}

/// `3.11.2-1+b1` -> (3, 11); `2.36-9+deb12u14` -> (2, 36); an epoch (`1:`) is skipped.
fn parse_major_minor(version: &str) -> Option<(u32, u32)> {
    let without_epoch = version
        .split_once(':')
        .map(|(_, rest)| rest)
        .unwrap_or(version);
    let mut parts = without_epoch.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_versions_from_dpkg_status() {
        let status = "Package: libc6\nStatus: install ok installed\nVersion: 2.36-9+deb12u14\n\nPackage: python3\nStatus: install ok installed\nVersion: 3.11.2-1+b1\n\nPackage: python3.12\nStatus: deinstall ok config-files\nVersion: 3.12.1-1\n";
        assert_eq!(
            dpkg_version(status, "python3").as_deref(),
            Some("3.11.2-1+b1")
        );
        assert_eq!(dpkg_version(status, "python3.12"), None);
        assert_eq!(parse_major_minor("3.11.2-1+b1"), Some((3, 11)));
        assert_eq!(parse_major_minor("2.36-9+deb12u14"), Some((2, 36)));
        assert_eq!(parse_major_minor("1:2.39-0ubuntu8"), Some((2, 39)));
    }
}
