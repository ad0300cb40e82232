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
//! [`dedup`] plans "one copy of every library" between the nvidia-* wheels and the toolkit.

pub mod dedup;
pub mod entry_points;
pub mod record;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::{self, Read};
use std::path::{Component, Path, PathBuf};
use std::str::FromStr;

use serde::Serialize;

use crate::digest::{Digest, Hasher};
use entry_points::{launcher, parse_scripts, EntryPointError};
use record::{parse_record, write_record, RecordError, RecordRow};

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

/// A Python `major.minor` version, e.g. `3.11`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PythonVersion {
    pub major: u8,
    pub minor: u8,
}

impl fmt::Display for PythonVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("`{0}` is not a Python version of the form 3.11")]
pub struct PythonVersionError(String);

impl FromStr for PythonVersion {
    type Err = PythonVersionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let error = || PythonVersionError(s.to_string());
        let (major, minor) = s.split_once('.').ok_or_else(error)?;
        Ok(PythonVersion {
            major: major.parse().map_err(|_| error())?,
            minor: minor.parse().map_err(|_| error())?,
        })
    }
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

/// The parts of a wheel file name (PEP 427 "File name convention").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WheelName {
    pub distribution: String,
    pub version: String,
    pub build: Option<String>,
    pub python_tag: String,
    pub abi_tag: String,
    pub platform_tag: String,
}

impl FromStr for WheelName {
    type Err = InstallError;
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        let error = || InstallError::BadFileName {
            name: name.to_string(),
        };
        let stem = name.strip_suffix(".whl").ok_or_else(error)?;
        let parts: Vec<&str> = stem.split('-').collect();
        if parts.iter().any(|part| part.is_empty()) {
            return Err(error());
        }
        let (build, tags) = match parts.len() {
            5 => (None, &parts[2..]),
            6 => (Some(parts[2].to_string()), &parts[3..]),
            _ => return Err(error()),
        };
        Ok(WheelName {
            distribution: parts[0].to_string(),
            version: parts[1].to_string(),
            build,
            python_tag: tags[0].to_string(),
            abi_tag: tags[1].to_string(),
            platform_tag: tags[2].to_string(),
        })
    }
}

impl WheelName {
    /// The oldest glibc this wheel's platform tag promises to run on (PEP 513/571/599/600:
    /// manylinux1 = 2.5, manylinux2010 = 2.12, manylinux2014 = 2.17, manylinux_X_Y = X.Y).
    /// With a compressed tag set (`a.b`) the most permissive tag wins. None for pure wheels,
    /// musllinux and plain `linux_*` tags.
    pub fn glibc_floor(&self) -> Option<crate::elf::GlibcVersion> {
        use crate::elf::GlibcVersion;
        let version = |major, minor| GlibcVersion {
            major,
            minor,
            patch: 0,
        };
        self.platform_tag
            .split('.')
            .filter_map(|tag| {
                if tag.starts_with("manylinux1_") {
                    Some(version(2, 5))
                } else if tag.starts_with("manylinux2010_") {
                    Some(version(2, 12))
                } else if tag.starts_with("manylinux2014_") {
                    Some(version(2, 17))
                } else {
                    let mut parts = tag.strip_prefix("manylinux_")?.splitn(3, '_');
                    let major = parts.next()?.parse().ok()?;
                    let minor = parts.next()?.parse().ok()?;
                    Some(version(major, minor))
                }
            })
            .min()
    }
}

/// PEP 503 normalisation: lowercase, runs of `-_.` become `-`.
pub fn normalize_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut in_separator = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !in_separator {
                out.push('-');
            }
            in_separator = true;
        } else {
            out.push(c.to_ascii_lowercase());
            in_separator = false;
        }
    }
    out
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

/// An open wheel whose members can be streamed with their RECORD digest checked.
pub struct WheelReader {
    path: PathBuf,
    archive: zip::ZipArchive<std::fs::File>,
}

impl WheelReader {
    pub fn open(path: &Path) -> Result<Self, InstallError> {
        let file = std::fs::File::open(path).map_err(|source| InstallError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        let archive = zip::ZipArchive::new(file).map_err(|source| InstallError::Zip {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(WheelReader {
            path: path.to_path_buf(),
            archive,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stream member `index`. Reading it to the end fails with `InvalidData` if its bytes do
    /// not have `digest` and `size` (so a consumer that reads to EOF has verified it).
    pub fn open_member(
        &mut self,
        index: usize,
        name: &str,
        digest: Digest,
        size: u64,
    ) -> Result<VerifyingReader<zip::read::ZipFile<'_, std::fs::File>>, InstallError> {
        let member = self
            .archive
            .by_index(index)
            .map_err(|source| InstallError::Zip {
                path: self.path.clone(),
                source,
            })?;
        Ok(VerifyingReader {
            inner: member,
            hasher: Hasher::new(),
            expected: digest,
            expected_size: size,
            label: format!("{}!{}", self.path.display(), name),
            done: false,
        })
    }

    /// The bytes of any non-directory entry's content: generated bytes from memory, zip
    /// members through [`Self::open_member`]'s check. None for directories and symlinks.
    /// This is what a layer writer streams into a tar entry of the entry's size.
    pub fn open_content<'a>(
        &'a mut self,
        content: &'a EntryContent,
    ) -> Result<Option<Box<dyn Read + 'a>>, InstallError> {
        match content {
            EntryContent::Generated { bytes, .. } => Ok(Some(Box::new(bytes.as_slice()))),
            EntryContent::ZipMember {
                index,
                name,
                digest,
                size,
            } => Ok(Some(Box::new(
                self.open_member(*index, name, *digest, *size)?,
            ))),
            EntryContent::Directory | EntryContent::Symlink { .. } => Ok(None),
        }
    }

    fn read_small(&mut self, name: &str) -> Result<Option<Vec<u8>>, InstallError> {
        let Some(index) = self.archive.index_for_name(name) else {
            return Ok(None);
        };
        self.read_small_index(index, name).map(Some)
    }

    fn read_small_index(&mut self, index: usize, name: &str) -> Result<Vec<u8>, InstallError> {
        let wheel = self.path.clone();
        let member = self
            .archive
            .by_index(index)
            .map_err(|source| InstallError::Zip {
                path: wheel.clone(),
                source,
            })?;
        if member.size() > MAX_BUFFERED_MEMBER {
            return Err(InstallError::TooLarge {
                wheel,
                member: name.to_string(),
                limit: MAX_BUFFERED_MEMBER,
            });
        }
        let mut bytes = Vec::with_capacity(member.size() as usize);
        member
            .take(MAX_BUFFERED_MEMBER + 1)
            .read_to_end(&mut bytes)
            .map_err(|source| InstallError::ReadMember {
                wheel,
                member: name.to_string(),
                source,
            })?;
        Ok(bytes)
    }
}

/// The error inside the `InvalidData` [`io::Error`] a [`VerifyingReader`] returns.
#[derive(Debug, thiserror::Error)]
#[error("`{label}` does not match RECORD\nExpected: {expected}\nFound:    {found}")]
pub struct MemberMismatch {
    /// `wheel!member`.
    pub label: String,
    /// Digest and size RECORD promises.
    pub expected: String,
    /// What the stream held.
    pub found: String,
}

/// A reader that hashes what passes through and fails at EOF on a digest or size mismatch.
pub struct VerifyingReader<R> {
    inner: R,
    hasher: Hasher,
    expected: Digest,
    expected_size: u64,
    label: String,
    done: bool,
}

impl<R: Read> Read for VerifyingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let read = self.inner.read(buf)?;
        self.hasher.update(&buf[..read]);
        let mismatch = |found: String| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                MemberMismatch {
                    label: self.label.clone(),
                    expected: format!("{} ({} bytes)", self.expected, self.expected_size),
                    found,
                },
            )
        };
        if self.hasher.bytes() > self.expected_size {
            return Err(mismatch(format!("more than {} bytes", self.expected_size)));
        }
        if read == 0 && !buf.is_empty() && !self.done {
            self.done = true;
            let (digest, size) = std::mem::take(&mut self.hasher).finish();
            if digest != self.expected || size != self.expected_size {
                return Err(mismatch(format!("{digest} ({size} bytes)")));
            }
        }
        Ok(read)
    }
}

struct Member {
    index: usize,
    name: String,
    relative: PathBuf,
    executable: bool,
    size: u64,
}

/// Read a wheel's metadata and plan its install. Only WHEEL, RECORD, entry_points.txt and
/// `.data/scripts/` members are read; everything else is planned as a [`EntryContent::ZipMember`].
pub fn plan_wheel(wheel: &Path, options: &InstallOptions) -> Result<InstallPlan, InstallError> {
    let mut reader = WheelReader::open(wheel)?;
    plan_with_reader(&mut reader, options)
}

/// [`plan_wheel`] on an already-open wheel (keep it open to stream members afterwards).
pub fn plan_with_reader(
    reader: &mut WheelReader,
    options: &InstallOptions,
) -> Result<InstallPlan, InstallError> {
    let wheel = reader.path.clone();
    let file_name = wheel
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    let wheel_name: WheelName = file_name.parse()?;
    // Linux reads at most 127 bytes of a shebang and splits it at whitespace.
    if !options.python.starts_with('/')
        || options.python.len() > 127
        || options.python.chars().any(char::is_whitespace)
    {
        return Err(InstallError::BadInterpreter {
            python: options.python.clone(),
        });
    }
    for dir in [
        &options.scheme.purelib,
        &options.scheme.platlib,
        &options.scheme.scripts,
        &options.scheme.data,
        &options.scheme.headers,
    ] {
        if !is_normalised_absolute(dir) {
            return Err(InstallError::BadDestination { path: dir.clone() });
        }
    }

    // 1. Every member: safe name, no duplicates, no symlinks. The zip reader indexes members
    // by name, so a repeated name is only visible as this flag.
    if reader.archive.has_duplicate_names() {
        return Err(InstallError::DuplicateNames { wheel });
    }
    let mut members: Vec<Member> = Vec::new();
    let mut seen = BTreeSet::new();
    for index in 0..reader.archive.len() {
        let member = reader
            .archive
            .by_index_raw(index)
            .map_err(|source| InstallError::Zip {
                path: wheel.clone(),
                source,
            })?;
        let name = String::from_utf8_lossy(member.name_raw()).into_owned();
        let relative = safe_member_path(&name).map_err(|reason| InstallError::UnsafePath {
            wheel: wheel.clone(),
            member: name.clone(),
            reason,
        })?;
        let key = name.trim_end_matches('/').to_string();
        if !seen.insert(key.clone()) {
            return Err(InstallError::DuplicateMember {
                wheel: wheel.clone(),
                member: key,
            });
        }
        if member.is_symlink() {
            return Err(InstallError::SymlinkMember {
                wheel: wheel.clone(),
                member: name,
            });
        }
        if member.is_dir() {
            continue;
        }
        let executable = member.unix_mode().is_some_and(|mode| mode & 0o111 != 0);
        members.push(Member {
            index,
            name: key,
            relative,
            executable,
            size: member.size(),
        });
    }

    // 2. The .dist-info directory of this distribution.
    let wanted = normalize_name(&wheel_name.distribution);
    let dist_info_dirs: BTreeSet<String> = members
        .iter()
        .filter_map(|m| m.name.split('/').next())
        .filter(|top| top.ends_with(".dist-info"))
        .filter(|top| {
            top.trim_end_matches(".dist-info")
                .split_once('-')
                .is_some_and(|(name, _)| normalize_name(name) == wanted)
        })
        .map(str::to_string)
        .collect();
    if dist_info_dirs.len() != 1 {
        return Err(InstallError::DistInfo {
            wheel,
            distribution: wheel_name.distribution,
            found: dist_info_dirs.len(),
        });
    }
    let dist_info_name = dist_info_dirs.into_iter().next().expect("one");
    let data_dir_name = format!("{}.data", dist_info_name.trim_end_matches(".dist-info"));
    let (distribution, version) = dist_info_name
        .trim_end_matches(".dist-info")
        .split_once('-')
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .expect("checked above");

    // 3. WHEEL.
    let wheel_member = format!("{dist_info_name}/WHEEL");
    let wheel_text =
        reader
            .read_small(&wheel_member)?
            .ok_or_else(|| InstallError::MissingMetadata {
                wheel: wheel.clone(),
                member: wheel_member.clone(),
            })?;
    let wheel_text = String::from_utf8_lossy(&wheel_text);
    let header = |key: &str| {
        wheel_text.lines().find_map(|line| {
            let (k, v) = line.split_once(':')?;
            (k.trim().eq_ignore_ascii_case(key)).then(|| v.trim().to_string())
        })
    };
    let wheel_version = header("Wheel-Version").ok_or_else(|| InstallError::BadMetadata {
        wheel: wheel.clone(),
        member: wheel_member.clone(),
        reason: "no Wheel-Version".into(),
    })?;
    if wheel_version.split('.').next() != Some("1") {
        return Err(InstallError::UnsupportedWheelVersion {
            wheel,
            version: wheel_version,
        });
    }
    let root_is_purelib = header("Root-Is-Purelib")
        .map(|v| v.eq_ignore_ascii_case("true"))
        .unwrap_or(false);
    let root_dir = if root_is_purelib {
        options.scheme.purelib.clone()
    } else {
        options.scheme.platlib.clone()
    };

    // 4. RECORD.
    let record_member = format!("{dist_info_name}/RECORD");
    let record_bytes =
        reader
            .read_small(&record_member)?
            .ok_or_else(|| InstallError::MissingMetadata {
                wheel: wheel.clone(),
                member: record_member.clone(),
            })?;
    let record_rows = parse_record(&String::from_utf8_lossy(&record_bytes)).map_err(|source| {
        InstallError::Record {
            wheel: wheel.clone(),
            member: record_member.clone(),
            source,
        }
    })?;
    let mut recorded: BTreeMap<String, RecordRow> = BTreeMap::new();
    for row in record_rows {
        recorded.insert(row.path.clone(), row);
    }

    // The project name as METADATA spells it names the headers directory (as pip does).
    let metadata_member = format!("{dist_info_name}/METADATA");
    let project_name = reader
        .read_small(&metadata_member)?
        .and_then(|bytes| {
            String::from_utf8_lossy(&bytes)
                .lines()
                .take_while(|line| !line.is_empty())
                .find_map(|line| line.strip_prefix("Name:").map(|v| v.trim().to_string()))
        })
        .filter(|name| safe_member_path(name).is_ok() && !name.contains('/'))
        .unwrap_or_else(|| distribution.clone());

    // 5. Entry points.
    let entry_points_member = format!("{dist_info_name}/entry_points.txt");
    let scripts = match reader.read_small(&entry_points_member)? {
        Some(bytes) => parse_scripts(&String::from_utf8_lossy(&bytes)).map_err(|source| {
            InstallError::EntryPoints {
                wheel: wheel.clone(),
                source,
            }
        })?,
        None => Vec::new(),
    };

    // 6. Map members to destinations.
    let skipped: BTreeSet<String> = ["RECORD", "RECORD.jws", "RECORD.p7s", "INSTALLER"]
        .iter()
        .map(|file| format!("{dist_info_name}/{file}"))
        .collect();
    let mut files: BTreeMap<PathBuf, (String, InstallEntry)> = BTreeMap::new();
    let mut insert = |source: String, entry: InstallEntry| -> Result<(), InstallError> {
        if let Some((first, _)) = files.get(&entry.path) {
            return Err(InstallError::DuplicateDestination {
                wheel: wheel.clone(),
                first: first.clone(),
                second: source,
                destination: entry.path.clone(),
            });
        }
        files.insert(entry.path.clone(), (source, entry));
        Ok(())
    };
    let mut record_out: Vec<(PathBuf, Option<Digest>, Option<u64>)> = Vec::new();
    for member in &members {
        if skipped.contains(&member.name) {
            continue;
        }
        let row = recorded
            .remove(&member.name)
            .filter(|row| row.hash.is_some())
            .ok_or_else(|| InstallError::NotInRecord {
                wheel: wheel.clone(),
                member: member.name.clone(),
            })?;
        let digest = row.hash.expect("filtered");
        if let Some(size) = row.size.filter(|&size| size != member.size) {
            return Err(InstallError::HashMismatch {
                wheel: wheel.clone(),
                member: member.name.clone(),
                expected: format!("{size} bytes"),
                found: format!("{} bytes", member.size),
            });
        }
        let mut mode = if member.executable { 0o755 } else { 0o644 };
        let mut is_script = false;
        let destination = match member.relative.strip_prefix(&data_dir_name) {
            Ok(inside) => {
                let mut parts = inside.components();
                let scheme = parts
                    .next()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .unwrap_or_default();
                let rest = parts.as_path();
                if rest.as_os_str().is_empty() {
                    return Err(InstallError::UnsafePath {
                        wheel: wheel.clone(),
                        member: member.name.clone(),
                        reason: "a .data member must be inside a scheme directory",
                    });
                }
                match scheme.as_str() {
                    "purelib" => options.scheme.purelib.join(rest),
                    "platlib" => options.scheme.platlib.join(rest),
                    "data" => options.scheme.data.join(rest),
                    "headers" => options.scheme.headers.join(&project_name).join(rest),
                    "scripts" => {
                        is_script = true;
                        mode = 0o755;
                        options.scheme.scripts.join(rest)
                    }
                    _ => {
                        return Err(InstallError::UnknownScheme {
                            wheel: wheel.clone(),
                            member: member.name.clone(),
                            scheme,
                        })
                    }
                }
            }
            Err(_) => root_dir.join(&member.relative),
        };
        let content = if is_script {
            let bytes = reader.read_small_index(member.index, &member.name)?;
            let found = Digest::of_bytes(&bytes);
            if found != digest {
                return Err(InstallError::HashMismatch {
                    wheel: wheel.clone(),
                    member: member.name.clone(),
                    expected: digest.to_string(),
                    found: found.to_string(),
                });
            }
            match rewrite_shebang(&bytes, &options.python) {
                Some(rewritten) => EntryContent::generated(rewritten),
                None => EntryContent::generated(bytes),
            }
        } else {
            EntryContent::ZipMember {
                index: member.index,
                name: member.name.clone(),
                digest,
                size: member.size,
            }
        };
        let (record_digest, record_size) = match &content {
            EntryContent::Generated { bytes, digest } => (*digest, bytes.len() as u64),
            _ => (digest, member.size),
        };
        record_out.push((destination.clone(), Some(record_digest), Some(record_size)));
        insert(
            member.name.clone(),
            InstallEntry {
                path: destination,
                mode,
                content,
            },
        )?;
    }
    recorded.retain(|path, _| !skipped.contains(path));
    if let Some(path) = recorded.keys().next() {
        return Err(InstallError::RecordedButMissing {
            wheel,
            member: path.clone(),
        });
    }

    // 7. Generated files: launchers, INSTALLER, RECORD.
    for script in &scripts {
        let bytes = launcher(script, &options.python);
        let content = EntryContent::generated(bytes);
        let path = options.scheme.scripts.join(&script.name);
        if let EntryContent::Generated { bytes, digest } = &content {
            record_out.push((path.clone(), Some(*digest), Some(bytes.len() as u64)));
        }
        insert(
            format!("entry point {}", script.name),
            InstallEntry {
                path,
                mode: 0o755,
                content,
            },
        )?;
    }
    let dist_info = root_dir.join(&dist_info_name);
    let installer = format!("{INSTALLER}\n").into_bytes();
    let installer_path = dist_info.join("INSTALLER");
    record_out.push((
        installer_path.clone(),
        Some(Digest::of_bytes(&installer)),
        Some(installer.len() as u64),
    ));
    insert(
        "INSTALLER".into(),
        InstallEntry {
            path: installer_path,
            mode: 0o644,
            content: EntryContent::generated(installer),
        },
    )?;
    let record_path = dist_info.join("RECORD");
    record_out.push((record_path.clone(), None, None));
    let mut rows: Vec<RecordRow> = record_out
        .into_iter()
        .map(|(path, hash, size)| RecordRow {
            path: relative_path(&root_dir, &path)
                .to_string_lossy()
                .into_owned(),
            hash,
            size,
        })
        .collect();
    rows.sort_by(|a, b| a.path.cmp(&b.path));
    insert(
        "RECORD".into(),
        InstallEntry {
            path: record_path,
            mode: 0o644,
            content: EntryContent::generated(write_record(&rows).into_bytes()),
        },
    )?;

    // 8. Parent directories, then one sorted list.
    let mut directories = BTreeSet::new();
    for path in files.keys() {
        for ancestor in path.ancestors().skip(1) {
            if ancestor != Path::new("/") && !ancestor.as_os_str().is_empty() {
                directories.insert(ancestor.to_path_buf());
            }
        }
    }
    directories.retain(|dir| !files.contains_key(dir));
    let mut entries: Vec<InstallEntry> = directories
        .into_iter()
        .map(|path| InstallEntry {
            path,
            mode: 0o755,
            content: EntryContent::Directory,
        })
        .chain(files.into_values().map(|(_, entry)| entry))
        .collect();
    entries.sort_by(|a, b| a.path.cmp(&b.path));

    Ok(InstallPlan {
        wheel,
        distribution,
        project_name,
        version,
        dist_info,
        entries,
    })
}

/// PEP 427: a script whose first line is `#!python` (or `#!pythonw`) gets the target
/// interpreter. Returns None when the script has another shebang.
fn rewrite_shebang(bytes: &[u8], python: &str) -> Option<Vec<u8>> {
    let rest = bytes.strip_prefix(b"#!python")?;
    let rest = rest.strip_prefix(b"w").unwrap_or(rest);
    let line_end = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
    let arguments = &rest[..line_end];
    // `#!python3` or `#!python-foo` is not the placeholder.
    if !(arguments.is_empty() || arguments[0] == b' ' || arguments[0] == b'\r') {
        return None;
    }
    let mut out = format!("#!{python}").into_bytes();
    out.extend_from_slice(arguments.strip_suffix(b"\r").unwrap_or(arguments));
    out.extend_from_slice(&rest[line_end..]);
    Some(out)
}

/// Carry out `plan` onto the directory `root` (the image's `/`), streaming every wheel
/// member through its RECORD check. Existing files at a planned path are replaced. Refuses to
/// write through a symlinked directory inside `root`, so a hostile root cannot redirect
/// writes onto the host.
pub fn install_to_dir(
    plan: &InstallPlan,
    reader: &mut WheelReader,
    root: &Path,
) -> Result<(), InstallError> {
    apply_entries(&plan.entries, Some(reader), root)
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

/// Write entries (directories, generated files, symlinks, and zip members when `reader` is
/// given) under `root`. Shared with [`dedup`], whose plans hold only symlinks.
pub fn apply_entries(
    entries: &[InstallEntry],
    mut reader: Option<&mut WheelReader>,
    root: &Path,
) -> Result<(), InstallError> {
    use std::os::unix::fs::PermissionsExt;
    for entry in entries {
        if !is_normalised_absolute(&entry.path) || entry.path == Path::new("/") {
            return Err(InstallError::BadDestination {
                path: entry.path.clone(),
            });
        }
        let host = crate::audit::rootfs::host_path(root, &entry.path);
        check_no_symlinked_parent(root, &entry.path)?;
        let write_error = |source| InstallError::Write {
            path: host.clone(),
            source,
        };
        let existing = std::fs::symlink_metadata(&host).ok();
        if let Some(parent) = host.parent() {
            std::fs::create_dir_all(parent).map_err(write_error)?;
        }
        // A symlink where the plan wants a directory belongs to the base (e.g. a merged-usr
        // `/lib`): never replace it. A directory where the plan wants a file is replaced only
        // when empty.
        match (&entry.content, &existing) {
            (EntryContent::Directory, Some(metadata)) if metadata.file_type().is_symlink() => {
                return Err(InstallError::SymlinkInRoot {
                    path: entry.path.clone(),
                    symlink: entry.path.clone(),
                });
            }
            (EntryContent::Directory, _) => {
                if existing.as_ref().is_some_and(|m| !m.is_dir()) {
                    std::fs::remove_file(&host).map_err(write_error)?;
                }
                std::fs::create_dir_all(&host).map_err(write_error)?;
                std::fs::set_permissions(&host, std::fs::Permissions::from_mode(entry.mode))
                    .map_err(write_error)?;
                continue;
            }
            (_, Some(metadata)) if metadata.is_dir() => {
                std::fs::remove_dir(&host).map_err(write_error)?;
            }
            (_, Some(_)) => std::fs::remove_file(&host).map_err(write_error)?,
            (_, None) => {}
        }
        match &entry.content {
            EntryContent::Directory => unreachable!("handled above"),
            EntryContent::Symlink { target } => {
                std::os::unix::fs::symlink(target, &host).map_err(write_error)?;
            }
            EntryContent::Generated { bytes, .. } => {
                std::fs::write(&host, bytes).map_err(write_error)?;
                std::fs::set_permissions(&host, std::fs::Permissions::from_mode(entry.mode))
                    .map_err(write_error)?;
            }
            EntryContent::ZipMember {
                index,
                name,
                digest,
                size,
            } => {
                let reader = reader.as_deref_mut().ok_or_else(|| InstallError::Write {
                    path: host.clone(),
                    source: io::Error::other("a zip member was planned but no wheel is open"),
                })?;
                let wheel = reader.path.clone();
                let mut source = reader.open_member(*index, name, *digest, *size)?;
                let mut file = std::fs::File::create(&host).map_err(write_error)?;
                if let Err(error) = io::copy(&mut source, &mut file) {
                    drop(file);
                    let _ = std::fs::remove_file(&host);
                    let mismatch = error
                        .get_ref()
                        .and_then(|inner| inner.downcast_ref::<MemberMismatch>());
                    return Err(if let Some(mismatch) = mismatch {
                        InstallError::HashMismatch {
                            wheel,
                            member: name.clone(),
                            expected: mismatch.expected.clone(),
                            found: mismatch.found.clone(),
                        }
                    } else {
                        InstallError::ReadMember {
                            wheel,
                            member: name.clone(),
                            source: error,
                        }
                    });
                }
                std::fs::set_permissions(&host, std::fs::Permissions::from_mode(entry.mode))
                    .map_err(write_error)?;
            }
        }
    }
    Ok(())
}

fn check_no_symlinked_parent(root: &Path, path: &Path) -> Result<(), InstallError> {
    for ancestor in path.ancestors().skip(1) {
        if ancestor == Path::new("/") {
            break;
        }
        let host = crate::audit::rootfs::host_path(root, ancestor);
        if let Ok(metadata) = std::fs::symlink_metadata(&host) {
            if metadata.file_type().is_symlink() {
                return Err(InstallError::SymlinkInRoot {
                    path: path.to_path_buf(),
                    symlink: ancestor.to_path_buf(),
                });
            }
        }
    }
    Ok(())
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
    fn wheel_names_and_normalisation() {
        let name: WheelName = "nvidia_cuda_runtime_cu12-12.1.105-py3-none-manylinux1_x86_64.whl"
            .parse()
            .unwrap();
        assert_eq!(name.distribution, "nvidia_cuda_runtime_cu12");
        assert_eq!(name.platform_tag, "manylinux1_x86_64");
        assert!(name.build.is_none());
        let built: WheelName = "a-1.0-2-py3-none-any.whl".parse().unwrap();
        assert_eq!(built.build.as_deref(), Some("2"));
        assert!("a-1.0.whl".parse::<WheelName>().is_err());
        assert_eq!(name.glibc_floor().unwrap().to_string(), "2.5");
        let torch: WheelName = "torch-2.4.1-cp311-cp311-manylinux1_x86_64.whl"
            .parse()
            .unwrap();
        assert_eq!(torch.glibc_floor().unwrap().to_string(), "2.5");
        let tagged: WheelName = "x-1-cp311-cp311-manylinux_2_28_x86_64.manylinux2014_x86_64.whl"
            .parse()
            .unwrap();
        assert_eq!(tagged.glibc_floor().unwrap().to_string(), "2.17");
        let pure: WheelName = "x-1-py3-none-any.whl".parse().unwrap();
        assert!(pure.glibc_floor().is_none());
        assert_eq!(normalize_name("Nvidia_CUDNN.cu12"), "nvidia-cudnn-cu12");
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
    fn shebang_rewriting() {
        assert_eq!(
            rewrite_shebang(b"#!python\nprint(1)\n", "/usr/bin/python3").unwrap(),
            b"#!/usr/bin/python3\nprint(1)\n"
        );
        assert_eq!(
            rewrite_shebang(b"#!pythonw -u\r\nx", "/p").unwrap(),
            b"#!/p -u\nx"
        );
        assert!(rewrite_shebang(b"#!python3\n", "/p").is_none());
        assert!(rewrite_shebang(b"#!/bin/sh\n", "/p").is_none());
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
