//! The base root: a Debian or Ubuntu root filesystem built hermetically with mmdebstrap,
//! or an existing image (OCI layout) whose layers become the first layers of the stack.
//! The stack's `base` and `apt` layers stage it; [`foreign`] finishes a root of another
//! architecture without running its code, [`rootless`] builds without root (user
//! namespaces, recorded owners), and [`ldcache`] writes a root's loader cache.
//!
//! mmdebstrap honours SOURCE_DATE_EPOCH, and the layer writer fixes every mtime and the
//! entry order, so the same package set gives the same layer. What mmdebstrap cannot pin
//! is the archive itself: a security update changes the package set. The layer cache key
//! therefore names the inputs cudastack controls, and [`inspect_rootfs`] records the
//! Python and glibc the base really has so the build checks them against the wheels.

pub mod foreign;
pub mod ldcache;
pub mod rootless;

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::apt::{write_repo, AptSources, DebFile};
use crate::base_root::rootless::{unpack_recording_owners, which, BuildMode, RootlessError};
use crate::layer::RecordedOwners;
use crate::version::PythonVersion;

#[derive(Debug, thiserror::Error)]
pub enum BaseError {
    #[error("`mmdebstrap` is not on PATH; `cudastack build` makes the Debian base with it\n  hint: install it (`sudo apt-get install mmdebstrap`); `cudastack doctor --build-host` checks everything a build needs")]
    MmdebstrapMissing,
    #[error("mmdebstrap left {mounts} mounted in the base it made, and it could not be unmounted: {detail}\n  hint: something held it when mmdebstrap unmounted it (a `du`, an indexer or a shell whose directory is in the build cache); unmount it (`umount -R PATH`) and build again")]
    LeftMounted { mounts: String, detail: String },
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
    Foreign(#[from] crate::base_root::foreign::ForeignBaseError),
    #[error(transparent)]
    Rootless(#[from] RootlessError),
    #[error(transparent)]
    Repo(#[from] crate::apt::RepoError),
    #[error("the base has no {what} in `{path}`; cudastack needs {why}")]
    Missing {
        what: &'static str,
        path: PathBuf,
        why: &'static str,
    },
}

/// A root filesystem cudastack builds itself, from locked .debs only.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DebootstrapSpec {
    pub distro: String,
    pub release: String,
    /// Every package installed: exactly the locked set, in name order (mmdebstrap's
    /// `custom` variant installs these and nothing else).
    pub packages: Vec<String>,
    pub source_date_epoch: u64,
    /// The Debian architecture when it is not the build host's (`arm64` on x86_64): the
    /// packages are unpacked, not configured, and [`foreign_base`] finishes the root.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub foreign_architecture: Option<String>,
    /// The base's Debian architecture when it is not amd64 (native arm64 on an aarch64
    /// builder): in the cache key, so a cache shared between machines never mixes them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    /// The image's `/etc/apt/sources.list`: the archive the packages were locked from, so
    /// `apt-get install` in a derived image reads the real archive.
    pub sources_list: String,
    /// The locked files; their digests are the cache key's inputs.
    #[serde(skip)]
    pub debs: Vec<DebFile>,
}

impl DebootstrapSpec {
    /// The root of `debs` for the Debian architecture `architecture` (`amd64`, `arm64`):
    /// foreign when it is not the build host's.
    pub fn from_debs(
        distro: &str,
        release: &str,
        architecture: &str,
        source_date_epoch: u64,
        debs: Vec<DebFile>,
    ) -> Self {
        let mut packages: Vec<String> = debs.iter().map(|d| d.name.clone()).collect();
        packages.sort();
        packages.dedup();
        let sources = AptSources::for_release(distro, release, architecture, None, None);
        DebootstrapSpec {
            distro: distro.to_string(),
            release: release.to_string(),
            packages,
            source_date_epoch,
            foreign_architecture: (architecture != host_debian_architecture())
                .then(|| architecture.to_string()),
            architecture: (architecture != "amd64").then(|| architecture.to_string()),
            sources_list: sources.image_sources_list(),
            debs,
        }
    }

    /// The digests of the locked files, in name order.
    pub fn deb_digests(&self) -> Vec<crate::digest::Digest> {
        let mut debs: Vec<&DebFile> = self.debs.iter().collect();
        debs.sort_by(|a, b| a.name.cmp(&b.name));
        debs.iter().map(|d| d.sha256).collect()
    }
}

pub use crate::platform::host_debian_architecture;

/// The ELF machine of a Debian architecture's objects.
fn machine_of(architecture: &str) -> crate::elf::Machine {
    crate::platform::Platform::from_debian(architecture)
        .unwrap_or(crate::platform::Platform::LinuxAmd64)
        .to_elf()
}

/// Run mmdebstrap into `dest` (which must not exist or be empty) in `mode`. Device nodes
/// are left out: container runtimes provide /dev, and a layer should not carry them.
///
/// As root, mmdebstrap writes `dest` itself and the files carry their owners. In a rootless
/// mode it writes a tar to a pipe, which is unpacked into `dest` as this user; the owners
/// and modes the tar recorded are returned, for the layer walk (docs/rootless.md).
pub fn debootstrap(
    spec: &DebootstrapSpec,
    dest: &Path,
    mode: BuildMode,
) -> Result<Option<RecordedOwners>, BaseError> {
    if which("mmdebstrap").is_none() {
        return Err(BaseError::MmdebstrapMissing);
    }
    // The repository of locked .debs, beside `dest` (the same filesystem as the blob
    // links, and readable in mmdebstrap's user namespace); removed when done.
    let parent = dest.parent().unwrap_or(Path::new("."));
    let repo = tempfile::Builder::new()
        .prefix(".repo-")
        .tempdir_in(parent)
        .map_err(|source| BaseError::Io {
            path: parent.to_path_buf(),
            source,
        })?;
    write_repo(repo.path(), &spec.debs)?;
    let sources_list = repo.path().join("image-sources.list");
    fs_err::write(&sources_list, &spec.sources_list).map_err(|source| BaseError::Io {
        path: sources_list.clone(),
        source,
    })?;
    let mut owners = match mode {
        BuildMode::Root => {
            let ran = run_mmdebstrap(spec, mmdebstrap_command(spec, dest, mode, repo.path()));
            // Whatever mmdebstrap's outcome, no mount of it may stay in the tree: a layer
            // would take /sys's or /proc's files as the base's. mmdebstrap's own failure is
            // the error to report first.
            let unmounted = unmount_left(dest);
            ran?;
            unmounted?;
            None
        }
        BuildMode::Unshare | BuildMode::Fakechroot => {
            Some(mmdebstrap_to_tar(spec, dest, mode, repo.path())?)
        }
    };
    if let Some(architecture) = &spec.foreign_architecture {
        crate::base_root::foreign::finish_unpacked_root(
            dest,
            machine_of(architecture),
            spec.source_date_epoch,
            owners.as_mut(),
        )?;
    }
    remove_device_nodes(dest)?;
    Ok(owners)
}

/// mmdebstrap in a rootless `mode`, its tar streamed into [`unpack_recording_owners`];
/// its stderr goes to a file (a full pipe would stall it) and is shown on failure.
fn mmdebstrap_to_tar(
    spec: &DebootstrapSpec,
    dest: &Path,
    mode: BuildMode,
    repo: &Path,
) -> Result<RecordedOwners, BaseError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| BaseError::Io { path, source }
    };
    let mut command = mmdebstrap_command(spec, Path::new("-"), mode, repo);
    let shown = format!("{command:?}");
    let stderr = tempfile::tempfile().map_err(io(Path::new("stderr of mmdebstrap")))?;
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .stderr(
            stderr
                .try_clone()
                .map_err(io(Path::new("stderr of mmdebstrap")))?,
        )
        .spawn()
        .map_err(io(Path::new("mmdebstrap")))?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let unpacked = unpack_recording_owners(stdout, dest);
    let status = child.wait().map_err(io(Path::new("mmdebstrap")))?;
    // An unpack that failed (a full disk) closed the pipe, so mmdebstrap failed too: the
    // unpack's error is the cause.
    let owners = unpacked?;
    if !status.success() {
        return Err(mmdebstrap_failed(spec, shown, status, stderr));
    }
    Ok(owners)
}

fn mmdebstrap_failed(
    spec: &DebootstrapSpec,
    command: String,
    status: std::process::ExitStatus,
    mut stderr: std::fs::File,
) -> BaseError {
    use std::io::{Read, Seek};
    let mut text = String::new();
    let _ = stderr.rewind();
    let _ = stderr.read_to_string(&mut text);
    BaseError::Mmdebstrap {
        distro: spec.distro.clone(),
        release: spec.release.clone(),
        status: status.to_string(),
        command,
        output: last_lines(&text, 15),
    }
}

/// A customize hook for the rootless modes, which makes their base equal to a root build's
/// (docs/rootless.md). Under unshare and fakechroot, the bytecode of py3compile's own
/// modules (`debpython`) is left as written when py3compile imported them (timestamp-based
/// .pyc), where a root build ends with py_compile's, which are hash-based under
/// SOURCE_DATE_EPOCH; compiling them again, SOURCE_DATE_EPOCH set, gives the root build's
/// bytes. Only for rootless modes, so a root build's digest does not change.
const ROOTLESS_PYC: &str = "[ ! -d \"$1\"/usr/share/python3/debpython ] || chroot \"$1\" sh -c 'python3 -m py_compile /usr/share/python3/debpython/*.py'";

/// The mmdebstrap command for `spec`: exactly the locked packages from the local
/// repository `repo` (installed natively, unpacked for another architecture); `dest` is
/// `-` (a tar on stdout) in a rootless mode.
fn mmdebstrap_command(
    spec: &DebootstrapSpec,
    dest: &Path,
    mode: BuildMode,
    repo: &Path,
) -> Command {
    // Caches, logs and the package lists change with every run and are no use in an image.
    // mmdebstrap copies the build host's /etc/resolv.conf and /etc/hostname in (for apt's
    // network): emptied with fixed modes, so the image neither depends on nor reveals the
    // host (its DNS server, its name); container runtimes mount their own over them.
    const CLEAN: &str = "rm -rf \"$1\"/var/cache/apt/* \"$1\"/var/lib/apt/lists/* \"$1\"/var/log/* \"$1\"/var/cache/ldconfig/aux-cache && for f in resolv.conf hostname; do if [ -e \"$1/etc/$f\" ] || [ -L \"$1/etc/$f\" ]; then rm -f \"$1/etc/$f\" && : > \"$1/etc/$f\" && chmod 0644 \"$1/etc/$f\"; fi; done";
    let mut command = Command::new("mmdebstrap");
    command.arg(format!("--mode={mode}")).arg("--quiet");
    // apt downloads as `_apt` only when that user can read the repository, and then leaves
    // var/lib/apt/lists/partial owned by `_apt`; whether it can depends on the build host's
    // umask and cache directory modes. Always as root: the same base on every host.
    command.arg("--aptopt=APT::Sandbox::User \"root\"");
    if mode != BuildMode::Root {
        command.arg("--format=tar");
    }
    // mmdebstrap writes the repository it installed from into the image's sources.list;
    // the image gets the archive the packages were locked from.
    const SOURCES: &str = "cat \"$CUDASTACK_IMAGE_SOURCES\" > \"$1/etc/apt/sources.list\"";
    command.env("CUDASTACK_IMAGE_SOURCES", repo.join("image-sources.list"));
    let include = format!("--include={}", spec.packages.join(","));
    match &spec.foreign_architecture {
        None => {
            command.arg("--variant=custom").arg(&include);
            command.arg(format!("--customize-hook={SOURCES}"));
            if mode != BuildMode::Root {
                command.arg(format!("--customize-hook={ROOTLESS_PYC}"));
            }
            command.arg(format!("--customize-hook={CLEAN}"));
        }
        Some(architecture) => {
            // No emulation: unpack what minbase installs (the Essential set and apt, whose
            // libstdc++ every C++ wheel links) and ours, and finish the root below. The
            // extract variant runs only extract hooks, and the .debs are still in the apt
            // cache then (for the dpkg database hook) until the clean hook.
            command
                .arg("--variant=extract")
                .arg(format!("--architectures={architecture}"))
                .arg(&include)
                .arg(format!("--extract-hook={SOURCES}"))
                .arg(format!(
                    "--extract-hook={}",
                    crate::base_root::foreign::DPKG_STATUS_HOOK
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
        .arg(format!("deb [trusted=yes] {} ./", copy_url(repo)))
        .env("SOURCE_DATE_EPOCH", spec.source_date_epoch.to_string());
    command
}

/// The `copy://` URL of the local repository, percent-encoded (a space in the cache path
/// would split the sources line).
fn copy_url(repo: &Path) -> String {
    match reqwest::Url::from_directory_path(repo) {
        Ok(url) => format!("copy://{}", url.path()),
        Err(()) => format!("copy://{}", repo.display()),
    }
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
    Err(BaseError::Mmdebstrap {
        distro: spec.distro.clone(),
        release: spec.release.clone(),
        status: output.status.to_string(),
        command: shown,
        output: last_lines(&String::from_utf8_lossy(&output.stderr), 15),
    })
}

/// Unmount what mmdebstrap (root mode) mounted in `dest` and could not unmount: its /sys,
/// /proc or /dev stay mounted when another process holds them at that moment (its working
/// directory inside, a `du` walking the cache). Deepest first; an error if any remains.
fn unmount_left(dest: &Path) -> Result<(), BaseError> {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Ok(()); // not Linux: mmdebstrap does not run here
    };
    let dest = std::fs::canonicalize(dest).unwrap_or_else(|_| dest.to_path_buf());
    let mut left = mounts_below(&mountinfo, &dest);
    if left.is_empty() {
        return Ok(());
    }
    left.sort_by_key(|mount| std::cmp::Reverse(mount.components().count()));
    let mut failures = Vec::new();
    for mount in &left {
        // Lazily: the holder may still be inside; the mount leaves the tree at once.
        match Command::new("umount").arg("--lazy").arg(mount).output() {
            Ok(output) if output.status.success() => {}
            Ok(output) => failures.push(String::from_utf8_lossy(&output.stderr).trim().to_string()),
            Err(error) => failures.push(format!("umount: {error}")),
        }
    }
    let still = std::fs::read_to_string("/proc/self/mountinfo")
        .map(|mountinfo| mounts_below(&mountinfo, &dest))
        .unwrap_or_default();
    if still.is_empty() {
        tracing::warn!(
            "mmdebstrap left {} mounted in {}; unmounted",
            left.len(),
            dest.display()
        );
        return Ok(());
    }
    Err(BaseError::LeftMounted {
        mounts: still
            .iter()
            .map(|mount| mount.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        detail: failures.join("; "),
    })
}

/// The mount points of `mountinfo` (/proc/self/mountinfo's format) at or below `dir`.
fn mounts_below(mountinfo: &str, dir: &Path) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|point| {
            use std::os::unix::ffi::OsStringExt;
            PathBuf::from(std::ffi::OsString::from_vec(unescape_mountinfo(point)))
        })
        // Below it: the directory itself may be a mount of the build host's own making.
        .filter(|point| point.starts_with(dir) && point != dir)
        .collect()
}

/// A mountinfo path with its octal escapes (`\040` for a space, `\011`, `\012`, `\134`)
/// decoded.
fn unescape_mountinfo(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|digits| {
            std::str::from_utf8(digits)
                .ok()
                .and_then(|digits| u8::from_str_radix(digits, 8).ok())
        });
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    out
}

/// The last `count` lines of `text`.
fn last_lines(text: &str, count: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(count)..].join("\n")
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
            .and_then(|v| crate::apt::major_minor(&v))
            .map(|(a, b)| PythonVersion::new(a, b)),
        glibc: dpkg_version(&status, "libc6").and_then(|v| crate::apt::major_minor(&v)),
        os,
    })
}

/// The version of `package` in a dpkg status file, when its files are on disk: installed,
/// or unpacked (a foreign-architecture base, see [`crate::base_root::foreign`]).
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A mount held busy when mmdebstrap unmounts it stays in the tree; the build takes it
    /// out before a layer reads it. Mounting needs root, as a root-mode base does.
    #[test]
    fn a_mount_left_in_a_base_is_unmounted_even_while_held() {
        use std::os::unix::fs::MetadataExt;
        if std::fs::metadata("/proc/self")
            .map(|m| m.uid())
            .unwrap_or(1)
            != 0
        {
            assert!(
                std::env::var_os("CUDASTACK_REQUIRE").is_none(),
                "mounting needs root (CUDASTACK_REQUIRE is set)"
            );
            eprintln!("skipping: mounting needs root");
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let sys = root.path().join("sys");
        std::fs::create_dir(&sys).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "tmpfs"])
            .arg(&sys)
            .status()
            .unwrap();
        assert!(mounted.success());
        std::fs::create_dir(sys.join("held")).unwrap();
        // A process whose working directory is inside: what kept mmdebstrap's umount busy.
        let mut holder = Command::new("sleep")
            .arg("30")
            .current_dir(sys.join("held"))
            .spawn()
            .unwrap();
        let unmounted = unmount_left(root.path());
        holder.kill().unwrap();
        holder.wait().unwrap();
        unmounted.unwrap();
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let root = std::fs::canonicalize(root.path()).unwrap();
        assert!(mounts_below(&mountinfo, &root).is_empty(), "{mountinfo}");
        assert!(!sys.join("held").exists(), "the tmpfs is still there");
    }

    #[test]
    fn the_mounts_left_below_a_root_are_found_with_their_escapes() {
        let mountinfo = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
98 22 0:21 / /work/cache/staging/abc/sys ro,nosuid shared:7 - sysfs sys ro
99 98 0:30 / /work/cache/staging/abc/sys/fs/cgroup rw shared:8 - cgroup2 cgroup rw
100 22 0:5 / /work/cache/staging/a\\040b/proc rw - proc proc rw
101 22 0:5 / /work/cache/staging/abcd/proc rw - proc proc rw
";
        let below = |dir: &str| mounts_below(mountinfo, Path::new(dir));
        assert_eq!(
            below("/work/cache/staging/abc"),
            [
                PathBuf::from("/work/cache/staging/abc/sys"),
                PathBuf::from("/work/cache/staging/abc/sys/fs/cgroup")
            ]
        );
        assert_eq!(
            below("/work/cache/staging/a b"),
            [PathBuf::from("/work/cache/staging/a b/proc")]
        );
        assert!(below("/work/cache/staging/ab").is_empty());
        assert_eq!(unescape_mountinfo("a\\011b\\134c\\9"), b"a\tb\\c\\9");
        assert!(below("/work/cache/staging/abc/sys")
            .ends_with(&[PathBuf::from("/work/cache/staging/abc/sys/fs/cgroup")]));
        assert_eq!(below("/work/cache/staging/abc/sys").len(), 1);
    }

    #[test]
    fn reads_versions_from_dpkg_status() {
        let status = "Package: libc6\nStatus: install ok installed\nVersion: 2.36-9+deb12u14\n\nPackage: python3\nStatus: install ok installed\nVersion: 3.11.2-1+b1\n\nPackage: python3.12\nStatus: deinstall ok config-files\nVersion: 3.12.1-1\n";
        assert_eq!(
            dpkg_version(status, "python3").as_deref(),
            Some("3.11.2-1+b1")
        );
        assert_eq!(dpkg_version(status, "python3.12"), None);
        assert_eq!(crate::apt::major_minor("3.11.2-1+b1"), Some((3, 11)));
        assert_eq!(crate::apt::major_minor("2.36-9+deb12u14"), Some((2, 36)));
        assert_eq!(crate::apt::major_minor("1:2.39-0ubuntu8"), Some((2, 39)));
    }
}
