//! A native wheel installer: `.whl` -> files in an image root, without pip or Python.
//!
//! Follows the PyPA binary distribution format (PEP 427): path-safe extraction, the
//! `<name>.data/<scheme>/` mapping, `#!python` shebang rewriting, console/GUI script
//! launchers, `INSTALLER` and a rewritten `RECORD`. Every file is checked against the wheel's
//! RECORD while it is copied, so a tampered wheel fails the install.
//!
//! Installing is two steps so the layer writer can stream zip members straight into a tar
//! layer without staging them on disk: [`plan_wheel`] reads only the wheel's metadata and
//! returns an [`InstallPlan`] (a sorted list of [`InstallEntry`]); [`install_to_dir`]
//! carries a plan out onto a directory, and [`WheelReader::open_member`] is the hash-checking
//! stream either consumer reads member bytes through. Nothing here depends on the clock or on
//! the zip's member order: the same wheel and options always give the same plan and bytes.
//!
//! Not done, on purpose: bytecode compilation (like `pip install --no-compile`; the image
//! has no Python at build time, and CPython writes `__pycache__` on first import), and
//! dependency resolution (the lock file names every wheel). SONAME links for the wheel's
//! libraries need their ELF headers, which a compressed zip member cannot be seeked for:
//! run [`crate::elf::chain::plan_for_dir`] on the installed directory.
//!
//! The steps live in submodules: [`plan`] (metadata -> [`InstallPlan`]), [`reader`] (the
//! open wheel and its verifying member streams) and [`apply`] (a plan onto a directory).
//! Wheel file names and project names are the shared [`crate::names`] types; the Python
//! version is [`crate::version::PythonVersion`].

pub mod apply;
pub mod entry_points;
pub mod plan;
pub mod reader;
pub mod record;

use std::io;
use std::path::{Component, Path, PathBuf};

use serde::Serialize;

use crate::digest::Digest;
use entry_points::EntryPointError;
use record::RecordError;

pub use crate::version::PythonVersion;
pub use apply::{apply_entries, install_to_dir};
pub use plan::{plan_wheel, plan_with_reader};
pub use reader::{MemberMismatch, VerifyingReader, WheelReader};

/// Metadata files (WHEEL, RECORD, entry_points.txt) and `.data/scripts` files are read into
/// memory to be parsed or rewritten; anything larger than this is refused as hostile.
const MAX_BUFFERED_MEMBER: u64 = 64 * 1024 * 1024;

/// What the wheel's INSTALLER file says.
pub const INSTALLER: &str = "cudastack";

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("failed to open wheel `{path}`")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("`{path}` is not a readable zip archive")]
    Zip {
        path: PathBuf,
        #[source]
        source: zip::result::ZipError,
    },
    #[error(
        "wheel file name `{name}` is not <name>-<version>[-<build>]-<python>-<abi>-<platform>.whl"
    )]
    BadFileName { name: String },
    #[error("wheel `{wheel}` has an unsafe member path `{member}`: {reason}")]
    UnsafePath {
        wheel: PathBuf,
        member: String,
        reason: &'static str,
    },
    #[error("wheel `{wheel}` contains `{member}` twice")]
    DuplicateMember { wheel: PathBuf, member: String },
    #[error("wheel `{wheel}` repeats a member name in its central directory; which copy is meant is ambiguous")]
    DuplicateNames { wheel: PathBuf },
    #[error("wheel `{wheel}`: `{first}` and `{second}` would both install to `{destination}`")]
    DuplicateDestination {
        wheel: PathBuf,
        first: String,
        second: String,
        destination: PathBuf,
    },
    #[error("wheel `{wheel}` member `{member}` is a symlink; wheels cannot carry symlinks")]
    SymlinkMember { wheel: PathBuf, member: String },
    #[error("wheel `{wheel}` has {found} .dist-info directories matching `{distribution}` (expected exactly one)")]
    DistInfo {
        wheel: PathBuf,
        distribution: String,
        found: usize,
    },
    #[error("wheel `{wheel}` is missing `{member}`")]
    MissingMetadata { wheel: PathBuf, member: String },
    #[error("wheel `{wheel}`: `{member}` is malformed: {reason}")]
    BadMetadata {
        wheel: PathBuf,
        member: String,
        reason: String,
    },
    #[error("wheel `{wheel}` has Wheel-Version {version}; only 1.x is supported")]
    UnsupportedWheelVersion { wheel: PathBuf, version: String },
    #[error("wheel `{wheel}`: RECORD in `{member}` is malformed")]
    Record {
        wheel: PathBuf,
        member: String,
        #[source]
        source: RecordError,
    },
    #[error("wheel `{wheel}`: entry_points.txt is malformed")]
    EntryPoints {
        wheel: PathBuf,
        #[source]
        source: EntryPointError,
    },
    #[error("wheel `{wheel}` member `{member}` is not listed in RECORD with a sha256 hash")]
    NotInRecord { wheel: PathBuf, member: String },
    #[error("wheel `{wheel}`: RECORD lists `{member}` but the archive does not contain it")]
    RecordedButMissing { wheel: PathBuf, member: String },
    #[error("wheel `{wheel}` member `{member}` does not match RECORD\nExpected: {expected}\nFound:    {found}")]
    HashMismatch {
        wheel: PathBuf,
        member: String,
        expected: String,
        found: String,
    },
    #[error("wheel `{wheel}` member `{member}`: unknown .data scheme `{scheme}` (expected purelib, platlib, scripts, headers or data)")]
    UnknownScheme {
        wheel: PathBuf,
        member: String,
        scheme: String,
    },
    #[error(
        "wheel `{wheel}` member `{member}` is larger than {limit} bytes and cannot be buffered"
    )]
    TooLarge {
        wheel: PathBuf,
        member: String,
        limit: u64,
    },
    #[error("failed to read member `{member}` of wheel `{wheel}`")]
    ReadMember {
        wheel: PathBuf,
        member: String,
        #[source]
        source: io::Error,
    },
    #[error("failed to write `{path}`")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("refusing to write `{path}`: `{symlink}` is a symlink inside the target root")]
    SymlinkInRoot { path: PathBuf, symlink: PathBuf },
    #[error("install path `{path}` is not an absolute, normalised image path")]
    BadDestination { path: PathBuf },
    #[error("python interpreter `{python}` cannot be a shebang: it must be an absolute path of at most 127 bytes without whitespace")]
    BadInterpreter { python: String },
}

/// Where each wheel scheme goes, as absolute paths inside the image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Scheme {
    pub purelib: PathBuf,
    pub platlib: PathBuf,
    pub scripts: PathBuf,
    pub data: PathBuf,
    /// Headers go to `<headers>/<distribution name>/`.
    pub headers: PathBuf,
}

impl Scheme {
    /// CPython's `posix_prefix` scheme under `prefix`: `<prefix>/lib/pythonX.Y/site-packages`.
    /// This is the layout of python.org builds (`/usr/local`) and of virtual environments.
    pub fn posix_prefix(prefix: &Path, python: PythonVersion) -> Self {
        let site = prefix.join(format!("lib/python{python}/site-packages"));
        Scheme {
            purelib: site.clone(),
            platlib: site,
            scripts: prefix.join("bin"),
            data: prefix.to_path_buf(),
            headers: prefix.join(format!("include/python{python}")),
        }
    }

    /// A virtual environment at `prefix` (venv puts headers under `include/site`).
    pub fn venv(prefix: &Path, python: PythonVersion) -> Self {
        Scheme {
            headers: prefix.join(format!("include/site/python{python}")),
            ..Self::posix_prefix(prefix, python)
        }
    }

    /// Debian/Ubuntu's system `python3`: it does not search `site-packages` under
    /// `/usr/local`; `pip install` there writes `/usr/local/lib/python3.X/dist-packages`.
    pub fn debian_local(python: PythonVersion) -> Self {
        let prefix = Path::new("/usr/local");
        let site = prefix.join(format!("lib/python{python}/dist-packages"));
        Scheme {
            purelib: site.clone(),
            platlib: site,
            ..Self::posix_prefix(prefix, python)
        }
    }
}

/// How to install.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallOptions {
    pub scheme: Scheme,
    /// The interpreter written into launchers and `#!python` scripts.
    pub python: String,
}

impl InstallOptions {
    pub fn new(scheme: Scheme) -> Self {
        InstallOptions {
            scheme,
            python: "/usr/bin/python3".into(),
        }
    }
}

/// Where an entry's bytes come from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EntryContent {
    Directory,
    /// A member of the wheel, by zip index, with the digest and size RECORD promises; read
    /// it through [`WheelReader::open_member`], which checks both.
    ZipMember {
        index: usize,
        name: String,
        digest: Digest,
        size: u64,
    },
    /// Bytes produced by the installer (launchers, rewritten scripts, RECORD, INSTALLER).
    Generated {
        #[serde(skip)]
        bytes: Vec<u8>,
        digest: Digest,
    },
    /// A symlink to `target` (as written into the link).
    Symlink {
        target: PathBuf,
    },
}

impl EntryContent {
    pub fn generated(bytes: Vec<u8>) -> Self {
        let digest = Digest::of_bytes(&bytes);
        EntryContent::Generated { bytes, digest }
    }

    /// The size of a regular file's content (what a tar header needs before the bytes).
    pub fn size(&self) -> Option<u64> {
        match self {
            EntryContent::ZipMember { size, .. } => Some(*size),
            EntryContent::Generated { bytes, .. } => Some(bytes.len() as u64),
            EntryContent::Directory | EntryContent::Symlink { .. } => None,
        }
    }
}

/// One object the install creates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InstallEntry {
    /// Absolute, normalised path inside the image.
    pub path: PathBuf,
    /// Permission bits (0o755 or 0o644; 0o777 for symlinks).
    pub mode: u32,
    pub content: EntryContent,
}

/// The full install of one wheel, computed before any byte is written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InstallPlan {
    pub wheel: PathBuf,
    /// The distribution name as the `.dist-info` directory spells it (`torch`, `nvidia_cudnn_cu12`).
    pub distribution: String,
    /// The project name from METADATA (`nvidia-cudnn-cu12`).
    pub project_name: String,
    pub version: String,
    /// The installed `.dist-info` directory (image path).
    pub dist_info: PathBuf,
    /// Sorted by path, parents before children; directories included.
    pub entries: Vec<InstallEntry>,
}

/// Check a zip member name and return it as a relative path. Rejects absolute paths, `..`,
/// `.`, empty components, backslashes and NUL: a wheel path is always plain `a/b/c`.
fn safe_member_path(name: &str) -> Result<PathBuf, &'static str> {
    let trimmed = name.strip_suffix('/').unwrap_or(name);
    if trimmed.is_empty() {
        return Err("empty path");
    }
    if trimmed.starts_with('/') {
        return Err("absolute path");
    }
    if trimmed.contains('\\') {
        return Err("backslash in path");
    }
    if trimmed.contains('\0') {
        return Err("NUL in path");
    }
    let mut path = PathBuf::new();
    for part in trimmed.split('/') {
        match part {
            "" => return Err("empty path component"),
            "." => return Err("`.` path component"),
            ".." => return Err("`..` path component"),
            part if part.len() == 2 && part.ends_with(':') => return Err("drive letter"),
            part => path.push(part),
        }
    }
    Ok(path)
}

/// The relative path from directory `from` to `to`, both absolute and normalised.
fn relative_path(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<Component> = from.components().collect();
    let to_components: Vec<Component> = to.components().collect();
    let common = from
        .iter()
        .zip(&to_components)
        .take_while(|(a, b)| a == b)
        .count();
    let mut out = PathBuf::new();
    for _ in common..from.len() {
        out.push("..");
    }
    for component in &to_components[common..] {
        out.push(component.as_os_str());
    }
    out
}

fn is_normalised_absolute(path: &Path) -> bool {
    path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

/// Install one wheel onto `root` (plan then [`install_to_dir`]).
pub fn install_wheel(
    wheel: &Path,
    options: &InstallOptions,
    root: &Path,
) -> Result<InstallPlan, InstallError> {
    let mut reader = WheelReader::open(wheel)?;
    let plan = plan_with_reader(&mut reader, options)?;
    install_to_dir(&plan, &mut reader, root)?;
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_paths_are_checked() {
        assert_eq!(safe_member_path("a/b.py").unwrap(), PathBuf::from("a/b.py"));
        assert_eq!(safe_member_path("a/b/").unwrap(), PathBuf::from("a/b"));
        assert_eq!(safe_member_path("/etc/passwd"), Err("absolute path"));
        assert_eq!(safe_member_path("a/../../x"), Err("`..` path component"));
        assert_eq!(safe_member_path("a\\..\\x"), Err("backslash in path"));
        assert_eq!(safe_member_path("a//x"), Err("empty path component"));
        assert_eq!(safe_member_path("C:/x"), Err("drive letter"));
    }

    #[test]
    fn relative_paths_for_record() {
        assert_eq!(
            relative_path(
                Path::new("/usr/local/lib/python3.11/site-packages"),
                Path::new("/usr/local/bin/torchrun")
            ),
            PathBuf::from("../../../bin/torchrun")
        );
        assert_eq!(
            relative_path(Path::new("/a/b"), Path::new("/a/b/c/d")),
            PathBuf::from("c/d")
        );
    }

    #[test]
    fn schemes() {
        let python: PythonVersion = "3.11".parse().unwrap();
        let scheme = Scheme::posix_prefix(Path::new("/usr/local"), python);
        assert_eq!(
            scheme.purelib,
            PathBuf::from("/usr/local/lib/python3.11/site-packages")
        );
        assert_eq!(scheme.scripts, PathBuf::from("/usr/local/bin"));
        assert_eq!(
            Scheme::debian_local(python).platlib,
            PathBuf::from("/usr/local/lib/python3.11/dist-packages")
        );
        assert!("3".parse::<PythonVersion>().is_err());
    }
}
