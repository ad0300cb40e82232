//! The lock file: every artifact a recipe needs, pinned to URL + sha256 + size.
//!
//! Format: JSON, written canonically (fixed field order, artifacts sorted by kind, name and
//! version, edge lists sorted, two-space indentation, trailing newline) so the same
//! resolution always produces the same bytes and diffs stay readable. JSON rather than
//! TOML because every other machine-written file cudastack emits (OCI configs, manifests,
//! verification reports) is JSON, it needs no extra dependency, and `serde_json` without
//! `preserve_order` is deterministic.

use std::path::Path;
use std::str::FromStr;

use pep440_rs::Version;
use reqwest::Url;
use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::fetch::download::FetchItem;
use crate::fetch::file_name::FileName;
use crate::fetch::git::{Commit, GitSource};
use crate::lock::target::Target;
use crate::names::{PackageName, WheelFilename};

/// Bumped when the format changes incompatibly.
/// Format 2 locks the base's Debian or Ubuntu packages (`deb` artifacts).
pub const LOCK_FORMAT_VERSION: u32 = 2;

#[derive(Debug, thiserror::Error)]
pub enum LockfileError {
    #[error("I/O error on `{path}`")]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The serde error names the artifact and field ([`ArtifactError`]) and the line.
    #[error("`{path}` is not a valid cudastack lock file")]
    Parse {
        path: std::path::PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("`{path}` is {kind}, not a regular file; a lock file is read from a file only")]
    NotAFile {
        path: std::path::PathBuf,
        kind: &'static str,
    },
    #[error("`{path}` is larger than {limit} bytes; no cudastack lock is that big")]
    TooLarge {
        path: std::path::PathBuf,
        limit: u64,
    },
    #[error("`{path}` names the Debian package `{name}` twice; a lock has one file per package\n  hint: run `cudastack lock` again")]
    DuplicateDeb {
        path: std::path::PathBuf,
        name: String,
    },
    #[error("`{path}` is lock format {found}; this cudastack reads format {expected}: run `cudastack lock` again")]
    Format {
        path: std::path::PathBuf,
        found: u32,
        expected: u32,
    },
}

/// Locks of the largest stacks are a few hundred kB; anything past this is not a lock.
pub const MAX_LOCK_BYTES: u64 = 64 * 1024 * 1024;

/// What an artifact is, which decides how it is installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ArtifactKind {
    /// An NVIDIA redist `.tar.xz` (CUDA component or cuDNN).
    RedistArchive,
    /// A Python wheel.
    Wheel,
    /// A Debian or Ubuntu package of the base or of the recipe's `apt:` list.
    Deb,
    /// The source distribution of a package of the recipe's `build:` list, compiled by
    /// `build` into a wheel for the recipe's GPUs (src/stack/source_build.rs).
    Sdist,
    /// A wheel installed only in the builder of the `build:` packages (setuptools, ninja,
    /// nvcc, the sdists' `[build-system] requires`), never in the image.
    BuildWheel,
    /// A Debian or Ubuntu package installed only in the builder (g++, the Python headers),
    /// in its apt layer; never in the image.
    BuildDeb,
}

impl ArtifactKind {
    /// A Debian or Ubuntu package, of the image or of the builder.
    pub fn is_deb(self) -> bool {
        matches!(self, ArtifactKind::Deb | ArtifactKind::BuildDeb)
    }

    /// A Python distribution from an index: a wheel or sdist of the image, or a wheel of
    /// the builder.
    pub fn is_python(self) -> bool {
        matches!(
            self,
            ArtifactKind::Wheel | ArtifactKind::Sdist | ArtifactKind::BuildWheel
        )
    }
}

/// Which layer a `deb` artifact is installed in: the shared base (minbase, python3,
/// ca-certificates) or the layer of the recipe's own `apt:` packages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DebLayer {
    Base,
    Apt,
}

/// One pinned artifact. Every field that later becomes a path or a request is parsed when
/// the lock is read ([`Artifact::check`]), so a hostile lock is refused before anything is
/// fetched or written, with an error that names the artifact and the field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawArtifact")]
pub struct Artifact {
    pub kind: ArtifactKind,
    /// Normalised package name, or the redist component name (`cuda_cudart`, `cudnn`).
    pub name: String,
    pub version: String,
    /// The artifact's file name: one path component (it names the link under `wheels/`);
    /// for wheels, a wheel file name of `name` and `version`.
    pub filename: FileName,
    /// `http`, `https`, or `file` (a mirror directory, read only under `--mirror`); or a
    /// wheel of the recipe's `wheels:`, relative to the recipe's directory.
    pub url: Location,
    pub sha256: Digest,
    pub size: u64,
    /// The index base URL, mirror directory URL or manifest URL it was resolved from.
    pub source: String,
    /// Redist archives: `linux-x86_64`, plus the CUDA variant for cuDNN (`cuda12`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// Wheels: the requirements of this wheel that applied to the target.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requires: Vec<String>,
    /// Wheels: who required it (`<root>`, `torch`, `cuda-toolkit[cudart]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub required_by: Vec<String>,
    /// Debs: the suite and component the archive lists it in (`bookworm-security`, `main`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suite: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub component: Option<String>,
    /// Debs: the snapshot archive's copy, fetched when `url` is gone (the mirror keeps
    /// only the current point release).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_url: Option<Url>,
    /// Debs: the layer it is installed in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer: Option<DebLayer>,
}

/// Where an artifact's bytes are: a URL, or a wheel of the recipe's `wheels:` named relative
/// to the recipe's directory, so that the lock means the same in every checkout. Written
/// as a string: the URL, or `file:` and the relative path (`file:wheelhouse/x.whl`; an
/// absolute `file:///` URL is a mirror's, so the two never meet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    Url(Url),
    /// `/`-separated plain names below the recipe's directory (no `.`, `..` or empty part).
    Recipe(String),
}

impl Location {
    /// The URL, for an artifact that is not the recipe's own.
    pub fn as_url(&self) -> Option<&Url> {
        match self {
            Location::Url(url) => Some(url),
            Location::Recipe(_) => None,
        }
    }

    /// Parse what a lock writes; a `file:` reference is checked part by part.
    pub fn parse(text: &str) -> Result<Location, String> {
        if let Some(relative) = text.strip_prefix("file:").filter(|r| !r.starts_with('/')) {
            // A local project in the recipe's own directory.
            if relative == "." {
                return Ok(Location::Recipe(relative.to_string()));
            }
            for part in relative.split('/') {
                if part == "." {
                    return Err(format!(
                        "`{text}`: a recipe-relative path names no `.` part"
                    ));
                }
                FileName::new(part).map_err(|e| format!("`{text}`: {e}"))?;
            }
            return Ok(Location::Recipe(relative.to_string()));
        }
        Url::parse(text)
            .map(Location::Url)
            .map_err(|e| format!("`{text}` is not a URL: {e}"))
    }
}

impl FromStr for Location {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Location::parse(text)
    }
}

impl From<Url> for Location {
    fn from(url: Url) -> Self {
        Location::Url(url)
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Url(url) => f.write_str(url.as_str()),
            Location::Recipe(path) => write!(f, "file:{path}"),
        }
    }
}

impl Serialize for Location {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// An artifact as written in the file, before [`Artifact::check`].
#[derive(Deserialize)]
struct RawArtifact {
    kind: ArtifactKind,
    name: String,
    version: String,
    filename: String,
    url: String,
    sha256: Digest,
    size: u64,
    source: String,
    #[serde(default)]
    platform: Option<String>,
    #[serde(default)]
    variant: Option<String>,
    #[serde(default)]
    requires: Vec<String>,
    #[serde(default)]
    required_by: Vec<String>,
    #[serde(default)]
    suite: Option<String>,
    #[serde(default)]
    component: Option<String>,
    #[serde(default)]
    fallback_url: Option<String>,
    #[serde(default)]
    layer: Option<DebLayer>,
}

/// Why one artifact of a lock is refused; always names the artifact and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("artifact `{name} {version}`: field `{field}`: {reason}")]
pub struct ArtifactError {
    pub name: String,
    pub version: String,
    pub field: &'static str,
    pub reason: String,
}

/// The URL schemes a lock may name: the downloader speaks HTTP(S), and `file` is read only
/// under a mirror directory given on the command line.
const LOCK_URL_SCHEMES: [&str; 3] = ["https", "http", "file"];

impl TryFrom<RawArtifact> for Artifact {
    type Error = ArtifactError;

    fn try_from(raw: RawArtifact) -> Result<Self, ArtifactError> {
        let error = |field: &'static str, reason: String| ArtifactError {
            name: raw.name.clone(),
            version: raw.version.clone(),
            field,
            reason,
        };
        let filename =
            FileName::new(raw.filename.clone()).map_err(|e| error("filename", e.to_string()))?;
        let url = Location::parse(&raw.url).map_err(|reason| error("url", reason))?;
        let fallback_url = raw
            .fallback_url
            .as_deref()
            .map(|text| {
                Url::parse(text)
                    .map_err(|e| error("fallback_url", format!("`{text}` is not a URL: {e}")))
            })
            .transpose()?;
        let artifact = Artifact {
            kind: raw.kind,
            name: raw.name,
            version: raw.version,
            filename,
            url,
            sha256: raw.sha256,
            size: raw.size,
            source: raw.source,
            platform: raw.platform,
            variant: raw.variant,
            requires: raw.requires,
            required_by: raw.required_by,
            suite: raw.suite,
            component: raw.component,
            fallback_url,
            layer: raw.layer,
        };
        artifact.check()?;
        Ok(artifact)
    }
}

impl Artifact {
    /// The checks every artifact passes, whether read from a lock or made by the resolver:
    /// a URL scheme the downloader may use, and for wheels a file name that is a wheel of
    /// this artifact's name and version (a lock naming `torch` cannot install `evil.whl`).
    pub fn check(&self) -> Result<(), ArtifactError> {
        let error = |field: &'static str, reason: String| ArtifactError {
            name: self.name.clone(),
            version: self.version.clone(),
            field,
            reason,
        };
        if let Location::Recipe(path) = &self.url {
            // Only the recipe's own wheels live beside it, each under its file name, and
            // its local projects (an sdist is the directory's archive).
            let named = path.rsplit('/').next() == Some(&*self.filename);
            let wheel = matches!(self.kind, ArtifactKind::Wheel | ArtifactKind::BuildWheel);
            let allowed = (wheel && named) || self.is_project();
            if !allowed {
                return Err(error(
                    "url",
                    format!(
                        "`{}`: a file beside the recipe is only ever a wheel of `wheels:` named `{}`, or a local project's directory",
                        self.url, &*self.filename
                    ),
                ));
            }
        }
        for (field, url) in [
            ("url", self.url.as_url()),
            ("fallback_url", self.fallback_url.as_ref()),
        ] {
            let Some(url) = url else { continue };
            if field == "url"
                && self.kind == ArtifactKind::Sdist
                && url.scheme().starts_with("git+")
            {
                // A git requirement's source: a commit of a repository (src/fetch/git.rs).
                self.git_commit().map_err(|reason| error(field, reason))?;
                continue;
            }
            if !LOCK_URL_SCHEMES.contains(&url.scheme()) {
                return Err(error(
                    field,
                    format!(
                        "`{url}` has scheme `{}`; a lock may name only https, http or file URLs",
                        url.scheme()
                    ),
                ));
            }
        }
        if matches!(self.kind, ArtifactKind::Deb | ArtifactKind::BuildDeb) {
            return self.check_deb();
        }
        if self.kind == ArtifactKind::Sdist {
            return self.check_sdist();
        }
        if matches!(self.kind, ArtifactKind::Wheel | ArtifactKind::BuildWheel) {
            let wheel = WheelFilename::from_str(&self.filename)
                .map_err(|e| error("filename", e.to_string()))?;
            let (name, version) = self.python_name_and_version()?;
            if wheel.name != name || wheel.version != version {
                return Err(error(
                    "filename",
                    format!(
                        "`{}` is a wheel of `{} {}`, not of this artifact",
                        self.filename, wheel.name, wheel.version
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The artifact's name and version as a Python distribution's (wheels and sdists).
    fn python_name_and_version(&self) -> Result<(PackageName, Version), ArtifactError> {
        let error = |field: &'static str, reason: String| ArtifactError {
            name: self.name.clone(),
            version: self.version.clone(),
            field,
            reason,
        };
        let name = PackageName::from_str(&self.name).map_err(|e| {
            error(
                "name",
                format!("`{}` is not a package name: {e}", self.name),
            )
        })?;
        let version = Version::from_str(&self.version).map_err(|e| {
            error(
                "version",
                format!("`{}` is not a PEP 440 version: {e}", self.version),
            )
        })?;
        Ok((name, version))
    }

    /// An sdist's file name is a `.tar.gz` of this artifact's name and version (PEP 625:
    /// `{name}-{version}.tar.gz`, the name with `-`, `_` or `.` as separators).
    fn check_sdist(&self) -> Result<(), ArtifactError> {
        let error = |field: &'static str, reason: String| ArtifactError {
            name: self.name.clone(),
            version: self.version.clone(),
            field,
            reason,
        };
        let (name, version) = self.python_name_and_version()?;
        // A git requirement's or local project's tree is archived uncompressed
        // (src/fetch/source_tree.rs).
        let suffix = if self.is_git() || self.is_project() {
            ".tar"
        } else {
            ".tar.gz"
        };
        let stem = self.filename.strip_suffix(suffix);
        let matches =
            stem.and_then(|stem| stem.rsplit_once('-'))
                .is_some_and(|(file_name, file_version)| {
                    PackageName::from_str(file_name).is_ok_and(|n| n == name)
                        && Version::from_str(file_version).is_ok_and(|v| v == version)
                });
        if !matches {
            return Err(error(
                "filename",
                format!(
                    "`{}` is not the `{suffix}` sdist of `{name} {version}`",
                    &*self.filename
                ),
            ));
        }
        Ok(())
    }

    /// Whether this is the source of a git requirement.
    pub fn is_git(&self) -> bool {
        self.kind == ArtifactKind::Sdist
            && self
                .url
                .as_url()
                .is_some_and(|url| url.scheme().starts_with("git+"))
    }

    /// Whether this is a local project, built from its directory beside the recipe.
    pub fn is_project(&self) -> bool {
        self.kind == ArtifactKind::Sdist && matches!(self.url, Location::Recipe(_))
    }

    /// A git requirement's source and the commit its URL pins (a lock never names a
    /// branch or tag: `build` would take whatever it points at then).
    pub fn git_commit(&self) -> Result<(GitSource, Commit), String> {
        let url = self.url.as_url().map(Url::as_str).unwrap_or_default();
        let source = GitSource::parse(url).map_err(|e| e.to_string())?;
        let commit = source.pinned_commit().ok_or_else(|| {
            format!("`{source}` names no commit; a lock pins a git source by its full commit id")
        })?;
        Ok((source, commit))
    }

    /// A deb's name, version and architecture go to mmdebstrap's `--include` and into a
    /// Packages index: Debian's own syntax only (no `,`, space or newline can get in), a
    /// `.deb` file name, and the layer, suite and component it was locked with.
    fn check_deb(&self) -> Result<(), ArtifactError> {
        let error = |field: &'static str, reason: String| ArtifactError {
            name: self.name.clone(),
            version: self.version.clone(),
            field,
            reason,
        };
        let name_ok = self.name.len() >= 2
            && self
                .name
                .starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+-.".contains(c));
        if !name_ok {
            return Err(error(
                "name",
                format!("`{}` is not a Debian package name", self.name),
            ));
        }
        let version_ok = self.version.starts_with(|c: char| c.is_ascii_digit())
            && self
                .version
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || ".+~:-".contains(c));
        if !version_ok {
            return Err(error(
                "version",
                format!("`{}` is not a Debian version", self.version),
            ));
        }
        let architecture_ok = self.platform.as_deref().is_some_and(|a| {
            !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        });
        if !architecture_ok {
            return Err(error(
                "platform",
                "a deb names its Debian architecture (`amd64`, `all`)".into(),
            ));
        }
        if !self.filename.ends_with(".deb") {
            return Err(error(
                "filename",
                format!("`{}` is not a .deb", &*self.filename),
            ));
        }
        if self.layer.is_none() || self.suite.is_none() || self.component.is_none() {
            return Err(error(
                "layer",
                "a deb names its layer, suite and component".into(),
            ));
        }
        Ok(())
    }

    /// The download of this artifact: URL, expected sha256 and size. A wheel of the
    /// recipe's `wheels:` is a `file:` URL below `recipe_dir` (the downloader reads it only
    /// when told that directory may be read).
    pub fn fetch_item(&self, recipe_dir: &Path) -> FetchItem {
        let url = match &self.url {
            Location::Url(url) => url.clone(),
            Location::Recipe(path) => {
                let absolute = std::path::absolute(recipe_dir.join(path))
                    .unwrap_or_else(|_| recipe_dir.join(path));
                // Checked plain names below a directory: an absolute path, always a URL.
                Url::from_file_path(&absolute)
                    .unwrap_or_else(|()| Url::parse("file:///").expect("a valid URL"))
            }
        };
        FetchItem {
            name: format!("{} {}", self.name, self.version),
            url,
            sha256: self.sha256,
            size: Some(self.size),
        }
    }
}

/// A complete lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lockfile {
    pub lock_format: u32,
    /// Digest of the recipe the lock was made from; see [`Lockfile::is_stale`].
    pub recipe_digest: Digest,
    /// The moment the lock's resolution stands for: index files uploaded after
    /// it were not candidates, and `lock --as-of` with it reads the indexes and the
    /// archive's snapshot as they were then, so the same resolution can be reproduced
    /// after upstream published more. None in locks made before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub as_of: Option<jiff::Timestamp>,
    pub target: Target,
    /// The root requirements, as given.
    pub requirements: Vec<String>,
    pub artifacts: Vec<Artifact>,
}

impl Lockfile {
    /// Put everything in canonical order (done by [`Lockfile::to_json`] too).
    pub fn canonicalize(&mut self) {
        for artifact in &mut self.artifacts {
            artifact.requires.sort();
            artifact.requires.dedup();
            artifact.required_by.sort();
            artifact.required_by.dedup();
        }
        self.artifacts.sort_by(|a, b| {
            (a.kind, &a.name, &a.version, &a.variant, &a.filename).cmp(&(
                b.kind,
                &b.name,
                &b.version,
                &b.variant,
                &b.filename,
            ))
        });
    }

    /// The canonical text of the lock.
    pub fn to_json(&self) -> String {
        let mut canonical = self.clone();
        canonical.canonicalize();
        let mut text =
            serde_json::to_string_pretty(&canonical).expect("lock values always serialise");
        text.push('\n');
        text
    }

    /// Whether the recipe changed since the lock was made.
    pub fn is_stale(&self, recipe_digest: &Digest) -> bool {
        &self.recipe_digest != recipe_digest
    }

    /// What the downloader needs to fetch every artifact of the lock, in lock order
    /// (`recipe_dir`: see [`Artifact::fetch_item`]).
    pub fn fetch_items(&self, recipe_dir: &Path) -> Vec<FetchItem> {
        self.artifacts
            .iter()
            .map(|a| a.fetch_item(recipe_dir))
            .collect()
    }

    /// Find a wheel or redist archive by name.
    pub fn artifact(&self, name: &str) -> Option<&Artifact> {
        self.artifacts.iter().find(|a| a.name == name)
    }

    /// Read and check a lock. Every artifact goes through [`Artifact::check`]; a file larger
    /// than [`MAX_LOCK_BYTES`] is refused before it is read.
    pub fn read(path: &Path) -> Result<Self, LockfileError> {
        let io_error = |source| LockfileError::Io {
            path: path.to_path_buf(),
            source,
        };
        // Non-blocking and checked on the open file: a lock in a pull request can be a FIFO
        // or a link to /dev/stdin, which would block `build` and `lock` for ever.
        let file = match crate::contained_file::open_regular(path).map_err(io_error)? {
            Ok(file) => file,
            Err(kind) => {
                return Err(LockfileError::NotAFile {
                    path: path.to_path_buf(),
                    kind,
                })
            }
        };
        let mut text = String::new();
        std::io::Read::read_to_string(
            &mut std::io::Read::take(file, MAX_LOCK_BYTES + 1),
            &mut text,
        )
        .map_err(io_error)?;
        if text.len() as u64 > MAX_LOCK_BYTES {
            return Err(LockfileError::TooLarge {
                path: path.to_path_buf(),
                limit: MAX_LOCK_BYTES,
            });
        }
        Self::from_json(&text, path)
    }

    /// Parse and check the text of a lock; `path` names it in errors.
    pub fn from_json(text: &str, path: &Path) -> Result<Self, LockfileError> {
        let lock: Lockfile = serde_json::from_str(text).map_err(|source| LockfileError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
        if lock.lock_format != LOCK_FORMAT_VERSION {
            return Err(LockfileError::Format {
                path: path.to_path_buf(),
                found: lock.lock_format,
                expected: LOCK_FORMAT_VERSION,
            });
        }
        // Two debs of one name (or one file name) would meet in the build's repository.
        let mut seen = std::collections::BTreeSet::new();
        for deb in lock
            .artifacts
            .iter()
            .filter(|a| a.kind == ArtifactKind::Deb)
        {
            if !seen.insert(deb.name.as_str()) || !seen.insert(&*deb.filename) {
                return Err(LockfileError::DuplicateDeb {
                    path: path.to_path_buf(),
                    name: deb.name.clone(),
                });
            }
        }
        Ok(lock)
    }

    /// Write atomically (temp file in the same directory, then rename).
    pub fn write(&self, path: &Path) -> Result<(), LockfileError> {
        let io_error = |source| LockfileError::Io {
            path: path.to_path_buf(),
            source,
        };
        crate::atomic_file::write(path, self.to_json().as_bytes()).map_err(io_error)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::platform::Platform;
    use proptest::prelude::*;

    pub(crate) fn sample() -> Lockfile {
        Lockfile {
            as_of: None,
            lock_format: LOCK_FORMAT_VERSION,
            recipe_digest: Digest::of_bytes(b"recipe"),
            target: Target::new(
                "3.11".parse().unwrap(),
                Platform::LinuxAmd64,
                "2.28".parse().unwrap(),
            )
            .unwrap(),
            requirements: vec!["torch==2.4.1".into()],
            artifacts: vec![
                Artifact {
                    kind: ArtifactKind::Wheel,
                    name: "torch".into(),
                    version: "2.4.1".into(),
                    filename: "torch-2.4.1-cp311-cp311-manylinux1_x86_64.whl"
                        .parse()
                        .unwrap(),
                    url: "https://files.example/torch.whl".parse().unwrap(),
                    sha256: Digest::of_bytes(b"torch"),
                    size: 10,
                    source: "https://pypi.org/simple/".into(),
                    platform: None,
                    variant: None,
                    requires: vec!["sympy".into(), "filelock".into()],
                    required_by: vec!["<root>".into()],
                    suite: None,
                    component: None,
                    fallback_url: None,
                    layer: None,
                },
                Artifact {
                    kind: ArtifactKind::RedistArchive,
                    name: "cudnn".into(),
                    version: "9.1.0.70".into(),
                    filename: "cudnn.tar.xz".parse().unwrap(),
                    url: "http://127.0.0.1/cudnn.tar.xz".parse().unwrap(),
                    sha256: Digest::of_bytes(b"cudnn"),
                    size: 5,
                    source: "http://127.0.0.1/redistrib_9.1.0.json".into(),
                    platform: Some("linux-x86_64".into()),
                    variant: Some("cuda12".into()),
                    requires: vec![],
                    required_by: vec![],
                    suite: None,
                    component: None,
                    fallback_url: None,
                    layer: None,
                },
            ],
        }
    }

    #[test]
    fn round_trips_and_is_deterministic() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.lock");
        let lock = sample();
        lock.write(&path).unwrap();
        let text = fs_err::read_to_string(&path).unwrap();
        let mut reversed = lock.clone();
        reversed.artifacts.reverse();
        assert_eq!(reversed.to_json(), text);
        let read = Lockfile::read(&path).unwrap();
        assert_eq!(read.to_json(), text);
        // Redist archives sort first; edges are sorted.
        assert_eq!(read.artifacts[0].name, "cudnn");
        assert_eq!(read.artifacts[1].requires, ["filelock", "sympy"]);
        assert!(text.contains("\"kind\": \"redist-archive\""));
    }

    #[test]
    fn the_moment_is_recorded_in_seconds_and_optional() {
        let mut lock = sample();
        assert!(!lock.to_json().contains("as_of"), "older locks have none");
        lock.as_of = Some("2026-12-03T11:02:10Z".parse().unwrap());
        let text = lock.to_json();
        assert!(
            text.contains("\"as_of\": \"2026-12-03T11:02:10Z\",\n  \"target\""),
            "{text}"
        );
        let read: Lockfile = serde_json::from_str(&text).unwrap();
        assert_eq!(read.as_of, lock.as_of);
    }

    #[test]
    fn staleness_follows_the_recipe_digest() {
        let lock = sample();
        assert!(!lock.is_stale(&Digest::of_bytes(b"recipe")));
        assert!(lock.is_stale(&Digest::of_bytes(b"recipe v2")));
    }

    #[test]
    fn rejects_other_formats() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.lock");
        let mut lock = sample();
        lock.lock_format = 99;
        fs_err::write(&path, serde_json::to_string(&lock).unwrap()).unwrap();
        let error = Lockfile::read(&path).unwrap_err();
        assert!(error.to_string().contains("format 99"), "{error}");
    }

    /// The sample lock as JSON with one field of its torch artifact replaced.
    fn with_torch_field(field: &str, value: serde_json::Value) -> String {
        let mut json: serde_json::Value = serde_json::from_str(&sample().to_json()).unwrap();
        let torch = json["artifacts"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .find(|a| a["name"] == "torch")
            .unwrap();
        torch[field] = value;
        json.to_string()
    }

    fn read_text(text: &str) -> Result<Lockfile, LockfileError> {
        Lockfile::from_json(text, Path::new("hostile.lock"))
    }

    /// A lock's file name was joined onto `wheels/` and the target replaced.
    #[test]
    fn refuses_file_names_that_are_paths() {
        for bad in [
            "/tmp/x",
            "../../x",
            "..",
            "a/torch-2.4.1-py3-none-any.whl",
            "",
        ] {
            let error = read_text(&with_torch_field("filename", bad.into())).unwrap_err();
            let chain = format!("{error}: {}", std::error::Error::source(&error).unwrap());
            assert!(
                chain.contains("hostile.lock")
                    && chain.contains("artifact `torch 2.4.1`")
                    && chain.contains("field `filename`")
                    && chain.contains("not a plain file name"),
                "{chain}"
            );
        }
    }

    #[test]
    fn refuses_wheels_of_another_package_or_version() {
        for other in [
            "evil-2.4.1-cp311-cp311-manylinux1_x86_64.whl",
            "torch-2.4.0-cp311-cp311-manylinux1_x86_64.whl",
            "torch.tar.gz",
        ] {
            let error = read_text(&with_torch_field("filename", other.into())).unwrap_err();
            let cause = std::error::Error::source(&error).unwrap().to_string();
            assert!(cause.contains("field `filename`"), "{cause}");
        }
        // The same name spelled differently is the same wheel.
        let lock = read_text(&with_torch_field(
            "filename",
            "Torch-2.4.1-cp311-cp311-manylinux1_x86_64.whl".into(),
        ))
        .unwrap();
        assert_eq!(lock.artifacts.len(), 2);
    }

    /// `a.url.parse().expect("lock URLs are valid")` panicked on a bad URL.
    #[test]
    fn refuses_bad_urls_naming_the_artifact() {
        for (bad, says) in [
            ("not a url", "is not a URL"),
            ("", "is not a URL"),
            ("ftp://example.com/torch.whl", "scheme `ftp`"),
            ("data:text/plain,hello", "scheme `data`"),
        ] {
            let error = read_text(&with_torch_field("url", bad.into())).unwrap_err();
            let cause = std::error::Error::source(&error).unwrap().to_string();
            assert!(
                cause.contains("artifact `torch 2.4.1`: field `url`") && cause.contains(says),
                "{cause}"
            );
        }
    }

    /// A wheel of the recipe's `wheels:` is written `file:` and its path from the recipe's
    /// directory, read back as the same; nothing else may be a file beside the recipe.
    #[test]
    fn recipe_wheels_are_relative_file_references() {
        let filename = "torch-2.4.1-cp311-cp311-manylinux1_x86_64.whl";
        let local = format!("file:wheelhouse/{filename}");
        let lock = read_text(&with_torch_field("url", local.clone().into())).unwrap();
        let torch = lock.artifact("torch").unwrap();
        assert_eq!(
            torch.url,
            Location::Recipe(format!("wheelhouse/{filename}"))
        );
        assert!(lock.to_json().contains(&format!("\"url\": \"{local}\"")));
        let item = torch.fetch_item(Path::new("/repo/recipes"));
        assert_eq!(
            item.url.as_str(),
            format!("file:///repo/recipes/wheelhouse/{filename}")
        );
        // An absolute `file:` URL is a mirror's, as before.
        let mirror =
            read_text(&with_torch_field("url", "file:///srv/mirror/t.whl".into())).unwrap();
        assert!(mirror.artifact("torch").unwrap().url.as_url().is_some());
        for (bad, says) in [
            (format!("file:../{filename}"), "not a plain file name"),
            (
                format!("file:wheelhouse//{filename}"),
                "not a plain file name",
            ),
            (format!("file:./{filename}"), "no `.` part"),
            (
                "file:wheelhouse/other-1.0-py3-none-any.whl".to_string(),
                "only ever a wheel of `wheels:` named",
            ),
        ] {
            let error = read_text(&with_torch_field("url", bad.clone().into())).unwrap_err();
            let cause = std::error::Error::source(&error).unwrap().to_string();
            assert!(
                cause.contains("field `url`") && cause.contains(says),
                "{bad}: {cause}"
            );
        }
        let error = read_text(&with_deb(
            "url",
            "file:debs/libc6_2.36-9+deb12u14_amd64.deb".into(),
        ))
        .unwrap_err();
        let cause = std::error::Error::source(&error).unwrap().to_string();
        assert!(cause.contains("only ever a wheel"), "{cause}");
    }

    /// A lock with one deb (libc6), as `lock` writes it.
    fn with_deb(field: &str, value: serde_json::Value) -> String {
        let mut json: serde_json::Value = serde_json::from_str(&sample().to_json()).unwrap();
        let mut deb = serde_json::json!({
            "kind": "deb", "name": "libc6", "version": "2.36-9+deb12u14",
            "filename": "libc6_2.36-9+deb12u14_amd64.deb",
            "url": "http://deb.debian.org/debian/pool/main/g/glibc/libc6_2.36-9%2bdeb12u14_amd64.deb",
            "sha256": format!("sha256:{}", "ab".repeat(32)), "size": 1,
            "source": "http://deb.debian.org/debian", "platform": "amd64",
            "suite": "bookworm", "component": "main", "layer": "base",
            "fallback_url": "https://snapshot.debian.org/archive/debian/20260712T101637Z/pool/main/g/glibc/libc6_2.36-9%2bdeb12u14_amd64.deb"
        });
        if value.is_null() {
            deb.as_object_mut().unwrap().remove(field);
        } else {
            deb[field] = value;
        }
        json["artifacts"].as_array_mut().unwrap().push(deb);
        json.to_string()
    }

    /// A deb's name, version and architecture reach mmdebstrap's `--include` and
    /// a Packages index; a lock from a pull request must not smuggle anything in.
    #[test]
    fn refuses_debs_that_are_not_what_a_lock_writes() {
        assert!(read_text(&with_deb("layer", "base".into())).is_ok());
        for (field, bad, says) in [
            ("name", serde_json::json!("libc6,evil"), "field `name`"),
            ("name", serde_json::json!("-o=Dir"), "field `name`"),
            ("version", serde_json::json!("2.36 x"), "field `version`"),
            (
                "version",
                serde_json::json!("2.36\nPackage: x"),
                "field `version`",
            ),
            (
                "platform",
                serde_json::json!("amd64,arm64"),
                "field `platform`",
            ),
            ("platform", serde_json::Value::Null, "field `platform`"),
            (
                "filename",
                serde_json::json!("libc6.tar"),
                "field `filename`",
            ),
            (
                "fallback_url",
                serde_json::json!("ftp://x/y.deb"),
                "field `fallback_url`",
            ),
            (
                "fallback_url",
                serde_json::json!("not a url"),
                "field `fallback_url`",
            ),
            ("layer", serde_json::Value::Null, "field `layer`"),
            ("layer", serde_json::json!("kernel"), "unknown variant"),
        ] {
            let error = read_text(&with_deb(field, bad.clone())).unwrap_err();
            let cause = std::error::Error::source(&error).unwrap().to_string();
            assert!(cause.contains(says), "{field} = {bad}: {cause}");
        }
    }

    #[test]
    fn refuses_a_deb_named_twice() {
        let mut json: serde_json::Value =
            serde_json::from_str(&with_deb("layer", "base".into())).unwrap();
        let deb = json["artifacts"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()
            .clone();
        json["artifacts"].as_array_mut().unwrap().push(deb);
        let error = read_text(&json.to_string()).unwrap_err();
        assert!(error.to_string().contains("`libc6` twice"), "{error}");
    }

    #[test]
    fn refuses_oversized_files_before_reading_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.lock");
        let file = fs_err::File::create(&path).unwrap();
        file.set_len(MAX_LOCK_BYTES + 10).unwrap();
        let error = Lockfile::read(&path).unwrap_err();
        assert!(matches!(error, LockfileError::TooLarge { .. }), "{error}");
    }

    fn artifact_strategy() -> impl Strategy<Value = Artifact> {
        (
            "[a-z][a-z0-9]{0,8}(-[a-z0-9]{1,4})?",
            (0u32..30, 0u32..30, 0u32..30),
            any::<bool>(),
            any::<u64>(),
            any::<[u8; 4]>(),
            proptest::collection::vec("[a-z]{1,6}", 0..3),
        )
            .prop_map(|(name, (major, minor, patch), wheel, size, seed, edges)| {
                let version = format!("{major}.{minor}.{patch}");
                let (kind, filename) = if wheel {
                    let file = format!("{}-{version}-py3-none-any.whl", name.replace('-', "_"));
                    (ArtifactKind::Wheel, file)
                } else {
                    (
                        ArtifactKind::RedistArchive,
                        format!("{name}-{version}.tar.xz"),
                    )
                };
                Artifact {
                    kind,
                    url: format!("https://files.example/{filename}").parse().unwrap(),
                    filename: filename.parse().unwrap(),
                    name,
                    version,
                    sha256: Digest::of_bytes(&seed),
                    size,
                    source: "https://pypi.org/simple/".into(),
                    platform: (!wheel).then(|| "linux-x86_64".into()),
                    variant: None,
                    requires: edges.clone(),
                    required_by: edges,
                    suite: None,
                    component: None,
                    fallback_url: None,
                    layer: None,
                }
            })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Arbitrary bytes are an error, never a panic.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let text = String::from_utf8_lossy(&bytes);
            let _ = read_text(&text);
        }

        /// Arbitrary values in every field of a real lock are an error or a lock whose
        /// names are all plain file names, never a panic.
        #[test]
        fn arbitrary_fields_never_panic(
            field in proptest::sample::select(vec!["kind", "name", "version", "filename", "url", "sha256", "size", "source", "platform", "requires"]),
            value in proptest::prop_oneof![
                "\\PC{0,30}".prop_map(serde_json::Value::from),
                "(\\.\\./|/)?[a-z./]{0,12}".prop_map(serde_json::Value::from),
                proptest::prelude::any::<i64>().prop_map(serde_json::Value::from),
                proptest::prelude::any::<f64>().prop_map(serde_json::Value::from),
                proptest::prelude::Just(serde_json::Value::Null),
                proptest::prelude::Just(serde_json::json!({"a": [1, 2]})),
            ],
        ) {
            if let Ok(lock) = read_text(&with_torch_field(field, value)) {
                for artifact in &lock.artifacts {
                    prop_assert!(artifact.check().is_ok());
                    prop_assert_eq!(artifact.filename.as_path().components().count(), 1);
                }
            }
        }

        /// Any lock written is read back as the same lock, and written again byte for byte.
        #[test]
        fn round_trips(artifacts in proptest::collection::vec(artifact_strategy(), 0..6)) {
            let mut lock = sample();
            lock.artifacts = artifacts;
            let text = lock.to_json();
            let read = read_text(&text).unwrap();
            proptest::prop_assert_eq!(read.to_json(), text);
            let mut canonical = lock.clone();
            canonical.canonicalize();
            proptest::prop_assert_eq!(read, canonical);
        }
    }
}
