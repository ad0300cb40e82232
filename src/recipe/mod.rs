//! Recipes: the YAML file that names one driver-floor / CUDA / cuDNN / PyTorch / Python
//! combination, parsed into types at the edge.
//!
//! Parsing is strict: unknown keys are errors that point at the line and column, and every
//! version is parsed into its type (`version.rs`), so later stages never see raw strings.
//! [`Recipe::digest`] hashes the normalised recipe (canonical JSON), so two files that mean
//! the same thing (comments, key order, `12.1` vs `"12.1"`) have the same digest; lock files
//! record it to detect a stale lock.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use pep440_rs::Version;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::digest::Digest;
use crate::version::{CudaVersion, CudnnVersion, DriverVersion, PythonVersion};

mod apt;
pub mod build;
pub mod ca;
pub mod copy;
mod image;
mod indexes;
pub mod python_inputs;
mod tag;

pub use apt::{DebName, DebVersion, SystemPackage};
pub use build::SourceBuild;
pub use copy::CopyEntry;
pub use image::{
    expand_path, ExposedPort, ImagePath, Protocol, RuntimeSpec, UserSpec, OWNED_ENV, ULIMITS,
};
pub(crate) use indexes::masked_urls;
pub use indexes::{pinned_index, IndexName, IndexUrl, PackageIndex};
pub use tag::{
    check_template, render as render_tag, TagError, TagProblem, TagValues, TAG_PLACEHOLDERS,
};

/// The platforms of `platforms:`; defined in [`crate::platform`], the one platform type.
pub use crate::platform::Platform;

/// The largest recipe read: a recipe is a page of YAML; a pull request's
/// recipe may be a link to `/dev/zero` or a file of gigabytes.
pub const MAX_RECIPE_BYTES: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum RecipeError {
    #[error("failed to read recipe `{path}`")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A FIFO would block the read; a device (`/dev/zero`) may never end.
    #[error("recipe `{path}` is {kind}, not a regular file; cudastack reads recipes from regular files only\n  hint: name the recipe file itself, not a pipe or device")]
    NotAFile { path: PathBuf, kind: &'static str },
    #[error("recipe `{path}` is larger than {MAX_RECIPE_BYTES} bytes; no recipe is that big\n  hint: check that this is the recipe you meant")]
    TooLarge { path: PathBuf },
    #[error("recipe `{path}` is not UTF-8 text: invalid UTF-8 at byte {offset} (line {line})\n  hint: a recipe is a YAML text file; check that this is the file you meant")]
    NotText {
        path: PathBuf,
        offset: usize,
        line: usize,
        #[source]
        source: std::str::Utf8Error,
    },
    #[error("{path}:{line}:{column}: {message}")]
    Syntax {
        path: PathBuf,
        line: u64,
        column: u64,
        message: String,
    },
    #[error("{path}:{line}:{column}: the key `{key}` is given twice in the same mapping\n  hint: keep one `{key}:` and delete the other; YAML gives a key one value per mapping, and cudastack will not guess which one you meant")]
    DuplicateKey {
        path: PathBuf,
        key: String,
        line: u64,
        column: u64,
    },
    #[error("{path}: {error}\n  hint: {hint}", hint = .error.hint())]
    Tag { path: PathBuf, error: TagError },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// A parsed recipe. Field docs are the recipe format's reference (README links here).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    /// Image name (`[a-z0-9][a-z0-9._-]*`), also the default OCI layout directory `images/NAME`.
    pub name: String,
    /// Where the root filesystem comes from.
    pub base: Base,
    /// CPython `3.MINOR`; must match the base's python3 and the wheels' tags.
    pub python: PythonVersion,
    /// The oldest driver the image must run on; sets NVIDIA_REQUIRE_CUDA.
    pub driver_floor: DriverVersion,
    /// Accept a driver floor below the toolkit's driver but above the CUDA major's
    /// minor-version-compatibility floor (NVIDIA_REQUIRE_CUDA then follows the floor).
    #[serde(default, skip_serializing_if = "is_false")]
    pub minor_version_compat: bool,
    pub cuda: CudaSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cudnn: Option<CudnnSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch: Option<TorchSpec>,
    /// Extra Python requirements (PEP 508), e.g. `numpy==1.26.4`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub packages: Vec<PackageRequirement>,
    /// requirements.txt files (pip's format, with `-r`/`-c` includes, `--hash` and markers),
    /// relative to the recipe's directory; read when the recipe is locked, and part of the
    /// lock's digest. docs/recipe-python.md is the reference.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requirements: Vec<python_inputs::InputPath>,
    /// A pyproject.toml whose `[project].dependencies`, chosen `extras` and PEP 735 `groups`
    /// are installed (not the project itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pyproject: Option<python_inputs::PyprojectInput>,
    /// An existing lock, PEP 751 `pylock.toml` or `uv.lock`: its packages at their versions,
    /// accepted only with the sha256 it lists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python_lock: Option<python_inputs::PythonLockInput>,
    /// Directories of the team's own wheels, relative to the recipe's directory, offered
    /// before every index (pip's `--find-links`): a requirement one of them satisfies is
    /// locked to it by sha256. docs/recipe-python.md is the reference.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub wheels: Vec<python_inputs::WheelDir>,
    /// Extra and private Python package indexes (PEP 503/691), each `{name, url,
    /// packages}`: `packages` are taken from that index only; the others are looked up
    /// index by index in this order, then on PyPI. URLs carry no credentials (they come from
    /// the environment, netrc or a keyring helper). docs/recipe-indexes.md is the reference.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "indexes::deserialize_list"
    )]
    pub indexes: Vec<PackageIndex>,
    /// Debian or Ubuntu packages added to the base, each `name` or `name=VERSION`
    /// (`git`, `git=1:2.39.5-0+deb12u2`), with their dependencies; resolved and pinned by
    /// `cudastack lock`. Kept sorted by name: apt installs a set, so the order is no part of
    /// the recipe's meaning (nor of its digest). docs/recipe-apt.md is the reference.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "apt::deserialize_list"
    )]
    pub apt: Vec<SystemPackage>,
    /// Packages published only as source distributions, compiled by cudastack for `gpus:`
    /// with the devel flavor of this stack: `{package, version, env}` each, the version
    /// exact (the sdist is locked by its sha256). Kept sorted by package.
    /// docs/source-builds.md is the reference.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "build::deserialize_list"
    )]
    pub build: Vec<SourceBuild>,
    /// Target GPUs whose sm must have kernels: names from `cudastack matrix --table gpus`
    /// (matched forgivingly: `RTX 3090`, `rtx3090`, `NVIDIA A10G`) or compute capabilities
    /// (`"8.9"`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<String>,
    #[serde(default)]
    pub verify: VerifyPolicy,
    /// Tag templates: {registry} {name} {torch} {cuda} {cuda_mm} {cudnn} {cudnn_major} {python}.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// Fixed timestamp for every file and the image's `created` (reproducibility), in
    /// seconds since 1970; at most [`MAX_SOURCE_DATE_EPOCH`] (the end of year 9999).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "deserialize_source_date_epoch"
    )]
    pub source_date_epoch: Option<u64>,
    /// The team's code: files from the recipe's directory, copied into the image's top
    /// layer, so a code change rebuilds only that layer (src/recipe/copy.rs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub copy: Vec<CopyEntry>,
    /// Platforms to build for, e.g. `[linux/amd64, linux/arm64]`; absent means
    /// `[linux/amd64]`. Each platform is locked separately ([`Platform::lock_suffix`]);
    /// several platforms are published as one OCI image index.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub platforms: Vec<Platform>,
    /// Certificate authorities the image trusts beside the distribution's (a corporate
    /// proxy's root, a private index's): PEM files relative to the recipe's directory, added
    /// to the system trust store and named to pip and requests (src/recipe/ca.rs).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "deserialize_ca_paths"
    )]
    pub ca_certificates: Vec<ca::CaPath>,
    /// Environment variables of the image, name -> value; the stack's own (LD_LIBRARY_PATH,
    /// CUDA_HOME, NVIDIA_*, PIP_CONSTRAINT, ...) are refused, and `PATH` adds entries around
    /// the stack's, written `$PATH`. docs/recipe-image.md is the reference of these keys.
    #[serde(
        default,
        skip_serializing_if = "std::collections::BTreeMap::is_empty",
        deserialize_with = "image::deserialize_env"
    )]
    pub env: std::collections::BTreeMap<String, String>,
    /// The working directory of the image's processes (absolute; created, owned by `user`,
    /// when the layers below do not have it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<ImagePath>,
    /// A non-root user the image runs as: `{name: trainer, uid: 1000, gid: 1000, home:
    /// /home/trainer}` (gid defaults to uid, home to /home/NAME), created in its own layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<UserSpec>,
    /// The exec-form entrypoint, e.g. `[python3, train.py]`.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "image::deserialize_exec_form"
    )]
    pub entrypoint: Vec<String>,
    /// The exec-form command (the entrypoint's arguments when there is one); absent means
    /// `[python3]`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "image::deserialize_cmd"
    )]
    pub cmd: Option<Vec<String>>,
    /// Ports the image listens on: `8080` (tcp), `29500/tcp`, `5353/udp`.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "image::deserialize_ports"
    )]
    pub expose: Vec<ExposedPort>,
    /// Labels of the image; `io.cudastack.*` are cudastack's claims and refused.
    #[serde(
        default,
        skip_serializing_if = "std::collections::BTreeMap::is_empty",
        deserialize_with = "image::deserialize_labels"
    )]
    pub labels: std::collections::BTreeMap<String, String>,
    /// What the run needs from the container runtime (`shm_size`, `ulimits`): carried as
    /// `io.cudastack.runtime.*` labels for the emitted cluster jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeSpec>,
}

/// Recipe keys that shape the image but not what is locked.
pub const IMAGE_ONLY_KEYS: &[&str] = &[
    "copy",
    "ca_certificates",
    "env",
    "workdir",
    "user",
    "entrypoint",
    "cmd",
    "expose",
    "labels",
    "runtime",
];

/// A recipe's `name`: it becomes an image name and a layout directory.
pub fn check_name(name: &str) -> Result<(), String> {
    let name_ok = !name.is_empty()
        && name.len() <= 128
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'));
    if name_ok {
        Ok(())
    } else {
        Err(format!("name `{}` must be lowercase letters, digits, `.`, `_` or `-` (it becomes an image name)", tag::escape(name)))
    }
}

fn deserialize_ca_paths<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<ca::CaPath>, D::Error> {
    let paths = Vec::<ca::CaPath>::deserialize(deserializer)?;
    ca::check_names(&paths).map_err(serde::de::Error::custom)?;
    Ok(paths)
}

fn is_false(value: &bool) -> bool {
    !*value
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum Base {
    /// A Debian release built hermetically with mmdebstrap (`bookworm`).
    Debian(String),
    /// An Ubuntu release built with mmdebstrap (`jammy`).
    Ubuntu(String),
    /// A registry or local Docker image, pinned by digest (`ubuntu:22.04@sha256:...`).
    /// Parsed, but not built yet: `validate` refuses it (`unsupported-base`).
    Image(String),
    /// An OCI image layout directory, optionally `PATH:REF`. Parsed, but not built yet:
    /// `validate` refuses it (`unsupported-base`).
    Oci(String),
}

impl Base {
    /// `(distro, release)` for the bases cudastack builds itself.
    pub fn distro(&self) -> Option<(&'static str, &str)> {
        match self {
            Base::Debian(release) => Some(("debian", release)),
            Base::Ubuntu(release) => Some(("ubuntu", release)),
            Base::Image(_) | Base::Oci(_) => None,
        }
    }
}

impl fmt::Display for Base {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Base::Debian(release) => write!(f, "debian:{release}"),
            Base::Ubuntu(release) => write!(f, "ubuntu:{release}"),
            Base::Image(reference) => write!(f, "image {reference}"),
            Base::Oci(path) => write!(f, "oci {path}"),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Flavor {
    /// Libraries only.
    #[default]
    Runtime,
    /// Libraries plus nvcc and headers, for building extensions.
    Devel,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CudaSpec {
    /// `12.1` (the line) or `12.1.105`-style exact runtime is not accepted here: give the
    /// toolkit version (`12.4` or `12.4.1`).
    pub version: CudaVersion,
    #[serde(default)]
    pub flavor: Flavor,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CudnnSpec {
    /// `9.1.0.70` exactly, or a prefix such as `9.1`.
    pub version: CudnnVersion,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TorchSpec {
    /// `2.4.1` exactly, or `2.4`: the 2.4 series, which resolves to its newest release whose
    /// build fits the recipe's index, CUDA line and Python (the lock records the release).
    #[serde(
        serialize_with = "serialize_display",
        deserialize_with = "deserialize_from_str"
    )]
    pub version: Version,
    /// `pypi` (default), a PyTorch variant such as `cu124`, or an index URL.
    #[serde(default)]
    pub index: TorchIndex,
}

/// Whether a version names a release series: two release parts and nothing else (`2.4`),
/// which means `==2.4.*` and resolves to the series' newest release that fits;
/// `2.4.0` and `2.4.1` stay exact.
pub fn is_series(version: &Version) -> bool {
    version.release().len() == 2
        && version.epoch() == 0
        && version.pre().is_none()
        && version.post().is_none()
        && version.dev().is_none()
        && version.local().is_empty()
}

impl TorchSpec {
    /// Whether `version: "2.4"` was written: the 2.4 series, not 2.4.0.
    pub fn is_series(&self) -> bool {
        is_series(&self.version)
    }

    /// Whether a torch release is what this spec names: the exact version, or any release
    /// of the series.
    pub fn admits(&self, release: &Version) -> bool {
        if self.is_series() {
            release.release().get(..2) == Some(self.version.release())
                && release.pre().is_none()
                && release.dev().is_none()
        } else {
            *release == self.version
        }
    }
}

/// Where torch comes from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum TorchIndex {
    /// PyPI: the release's default CUDA build.
    #[default]
    Pypi,
    /// PyTorch's per-CUDA index `https://download.pytorch.org/whl/<variant>`, or a mirror
    /// of it at `url`.
    Variant { variant: String, url: String },
}

impl TorchIndex {
    pub const PYTORCH_INDEX_ROOT: &'static str = "https://download.pytorch.org/whl/";

    pub fn variant(&self) -> Option<&str> {
        match self {
            TorchIndex::Pypi => None,
            TorchIndex::Variant { variant, .. } => Some(variant),
        }
    }
}

impl FromStr for TorchIndex {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("pypi") {
            return Ok(TorchIndex::Pypi);
        }
        let is_variant = |s: &str| {
            s.len() >= 5 && s.starts_with("cu") && s[2..].bytes().all(|b| b.is_ascii_digit())
        };
        if is_variant(text) {
            return Ok(TorchIndex::Variant {
                variant: text.to_string(),
                url: format!("{}{text}", Self::PYTORCH_INDEX_ROOT),
            });
        }
        if text.starts_with("https://") || text.starts_with("http://") {
            let authority = text.split("://").nth(1).unwrap_or("");
            let authority = authority.split(['/', '?', '#']).next().unwrap_or("");
            if authority.contains('@') {
                return Err(format!("torch index URL `{}` carries credentials, which the lock would record; cudastack reads the torch index without any\n  hint: give the index's URL without `user:password@`", indexes::masked(text)));
            }
            let last = text.trim_end_matches('/').rsplit('/').next().unwrap_or("");
            if is_variant(last) {
                return Ok(TorchIndex::Variant {
                    variant: last.to_string(),
                    url: text.trim_end_matches('/').to_string(),
                });
            }
            return Err(format!("torch index URL `{}` must end in a CUDA variant such as /cu124, so cudastack knows which build it serves", indexes::masked(text)));
        }
        Err(format!(
            "torch index `{}` is not `pypi`, a variant like `cu124`, or an index URL",
            indexes::masked(text)
        ))
    }
}

impl fmt::Display for TorchIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TorchIndex::Pypi => f.write_str("pypi"),
            TorchIndex::Variant { variant, url }
                if *url == format!("{}{variant}", Self::PYTORCH_INDEX_ROOT) =>
            {
                f.write_str(variant)
            }
            TorchIndex::Variant { url, .. } => f.write_str(url),
        }
    }
}

impl Serialize for TorchIndex {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}
impl<'de> Deserialize<'de> for TorchIndex {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserialize_from_str(deserializer)
    }
}

/// A PEP 508 requirement, parsed at the edge and printed back in normal form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageRequirement(pub pep508_rs::Requirement);

impl PackageRequirement {
    pub fn name(&self) -> &str {
        self.0.name.as_ref()
    }
}

impl FromStr for PackageRequirement {
    type Err = String;
    /// A requirement on a package of an index. Its text is shown with any URL in it
    /// masked (`acme @ https://user:token@host/...` would print the token).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let requirement = crate::names::parse_requirement(text).map_err(|e| {
            indexes::masked_urls(&format!("`{text}` is not a valid PEP 508 requirement: {e}"))
        })?;
        if let Some(pep508_rs::VersionOrUrl::Url(_)) = requirement.version_or_url {
            return Err(format!(
                "`{}` names a URL, not a package on an index: cudastack locks packages it can list on an index and pin by sha256\n  hint: publish the package to an index named in `indexes:` and require it by name",
                indexes::masked_urls(text)
            ));
        }
        Ok(PackageRequirement(requirement))
    }
}

impl fmt::Display for PackageRequirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl Serialize for PackageRequirement {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}
impl<'de> Deserialize<'de> for PackageRequirement {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserialize_from_str(deserializer)
    }
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum GpuPolicy {
    /// Verify on a GPU when one is visible; otherwise run the static checks only.
    #[default]
    Auto,
    /// Fail the verification when no GPU is visible.
    Required,
    /// Run no verification stage.
    Skip,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct VerifyPolicy {
    #[serde(default)]
    pub gpu: GpuPolicy,
}

fn serialize_display<T: fmt::Display, S: Serializer>(
    value: &T,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_str(value)
}

fn deserialize_from_str<'de, T, D>(deserializer: D) -> Result<T, D::Error>
where
    T: FromStr,
    T::Err: fmt::Display,
    D: Deserializer<'de>,
{
    // Accept YAML numbers too (`version: 2.4` parses as a float before it reaches us).
    let value = serde_json::Value::deserialize(deserializer)?;
    let text = match value {
        serde_json::Value::String(text) => text,
        serde_json::Value::Number(number) => number.to_string(),
        other => {
            return Err(serde::de::Error::custom(format!(
                "expected a string, found {other}"
            )))
        }
    };
    T::from_str(&text).map_err(serde::de::Error::custom)
}

/// The last second of year 9999 (`9999-12-31T23:59:59Z`). Image timestamps are RFC 3339,
/// whose years have four digits: Docker, containerd and Go's `time.Parse` refuse the
/// `created` of a later epoch, so such an image would build and then fail to load.
pub const MAX_SOURCE_DATE_EPOCH: u64 = 253_402_300_799;

/// A SOURCE_DATE_EPOCH an image timestamp can carry, or why not.
pub fn check_source_date_epoch(epoch: u64) -> Result<u64, String> {
    if epoch > MAX_SOURCE_DATE_EPOCH {
        return Err(format!(
            "source_date_epoch {epoch} is after the year 9999 (the largest is {MAX_SOURCE_DATE_EPOCH}, 9999-12-31T23:59:59Z): image timestamps are RFC 3339 with four-digit years, and Docker refuses to load an image whose `created` has more; use the seconds since 1970 of the release you build (`date -d 2024-06-01 +%s`)"
        ));
    }
    Ok(epoch)
}

fn deserialize_source_date_epoch<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let epoch = u64::deserialize(d)?;
    check_source_date_epoch(epoch)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

/// serde-saphyr's messages for users (`UserMessageFormatter`), except where it addresses the
/// programmer: a duplicate key becomes [`RecipeError::DuplicateKey`] before this is used,
/// and anything left that names serde-saphyr's `Options` is reworded here.
struct RecipeMessages;

impl serde_saphyr::MessageFormatter for RecipeMessages {
    fn format_message<'a>(&self, error: &'a serde_saphyr::Error) -> std::borrow::Cow<'a, str> {
        match error {
            serde_saphyr::Error::DuplicateMappingKey { key: Some(key), .. } => {
                format!("the key `{key}` is given twice in the same mapping; keep one").into()
            }
            serde_saphyr::Error::DuplicateMappingKey { key: None, .. } => {
                "a key is given twice in the same mapping; keep one".into()
            }
            _ => serde_saphyr::UserMessageFormatter.format_message(error),
        }
    }
}

/// `message` escaped for a terminal. The messages of this crate's own field checks
/// (serde's `custom`, which serde-saphyr keeps as `Message`) escape the recipe's text
/// themselves and end with their hint on a line of its own: that one line break is kept.
/// Every other newline stays `\n`, as in messages that quote the recipe as written, so a
/// recipe cannot print lines of its own.
fn escape_message(message: &str, error: &serde_saphyr::Error) -> String {
    const HINT: &str = "\n  hint: ";
    match (error, message.rsplit_once(HINT)) {
        (serde_saphyr::Error::Message { .. }, Some((what, hint))) => {
            format!("{}{HINT}{}", tag::escape(what), tag::escape(hint))
        }
        _ => tag::escape(message),
    }
}

/// The error serde-saphyr wraps (snippet and alias wrappers removed).
fn original_error(mut error: &serde_saphyr::Error) -> &serde_saphyr::Error {
    loop {
        match error {
            serde_saphyr::Error::WithSnippet { error: inner, .. }
            | serde_saphyr::Error::AliasError { error: inner, .. } => error = inner,
            other => return other,
        }
    }
}

/// Where `bytes` stop being UTF-8, as a recipe error.
fn not_text(path: &Path, bytes: &[u8], source: std::str::Utf8Error) -> RecipeError {
    let offset = source.valid_up_to();
    RecipeError::NotText {
        path: path.to_path_buf(),
        offset,
        line: 1 + bytes[..offset].iter().filter(|&&b| b == b'\n').count(),
        source,
    }
}

/// The bytes of the recipe at `path`, refusing a FIFO or device and reading at most
/// [`MAX_RECIPE_BYTES`] (a pull request's recipe may be a link to `/dev/zero`,
/// which `std::fs::read` would read until memory ran out). std::fs, not fs_err: the error
/// names the path already, and the OS's reason ("Permission denied", "Is a directory") is
/// the cause shown under it.
fn read_recipe(path: &Path) -> Result<Vec<u8>, RecipeError> {
    use std::io::Read;
    let read_error = |source| RecipeError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = match crate::contained_file::open_regular(path).map_err(read_error)? {
        Ok(file) => file,
        // A directory reads as before: its read fails with "Is a directory".
        Err("a directory") => std::fs::File::open(path).map_err(read_error)?,
        Err(kind) => {
            return Err(RecipeError::NotAFile {
                path: path.to_path_buf(),
                kind,
            })
        }
    };
    let mut bytes = Vec::new();
    file.take(MAX_RECIPE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    if bytes.len() as u64 > MAX_RECIPE_BYTES {
        return Err(RecipeError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    Ok(bytes)
}

impl Recipe {
    /// Read and parse a recipe file.
    pub fn load(path: &Path) -> Result<Recipe, RecipeError> {
        Recipe::parse_bytes(&read_recipe(path)?, path)
    }

    /// Parse recipe bytes: UTF-8 text, else [`RecipeError::NotText`] with the offset.
    pub fn parse_bytes(bytes: &[u8], path: &Path) -> Result<Recipe, RecipeError> {
        let text = std::str::from_utf8(bytes).map_err(|e| not_text(path, bytes, e))?;
        Recipe::parse(text, path)
    }

    /// Parse recipe text; `path` is only used in messages.
    pub fn parse(text: &str, path: &Path) -> Result<Recipe, RecipeError> {
        let recipe: Recipe = serde_saphyr::from_str(text).map_err(|error| {
            let (line, column) = error
                .location()
                .map(|l| (l.line(), l.column()))
                .unwrap_or((0, 0));
            if let serde_saphyr::Error::DuplicateMappingKey { key, location } =
                original_error(&error)
            {
                return RecipeError::DuplicateKey {
                    path: path.to_path_buf(),
                    key: key.clone().unwrap_or_else(|| "?".into()),
                    line: location.line(),
                    column: location.column(),
                };
            }
            // The message alone (our `path:line:column:` goes in front), control
            // characters escaped as serde-saphyr's own renderer does.
            use serde_saphyr::MessageFormatter;
            let original = original_error(&error);
            let message = RecipeMessages.format_message(original);
            RecipeError::Syntax {
                path: path.to_path_buf(),
                line,
                column,
                message: escape_message(&message, original),
            }
        })?;
        recipe.check_shape(path)?;
        Ok(recipe)
    }

    /// Checks that need no compatibility knowledge (names, templates).
    fn check_shape(&self, path: &Path) -> Result<(), RecipeError> {
        let invalid = |message: String| RecipeError::Invalid {
            path: path.to_path_buf(),
            message,
        };
        check_name(&self.name).map_err(invalid)?;
        for (i, platform) in self.platforms.iter().enumerate() {
            if self.platforms[..i].contains(platform) {
                return Err(invalid(format!("platform `{platform}` is listed twice")));
            }
        }
        if let Base::Image(reference) = &self.base {
            if !reference.contains("@sha256:") {
                return Err(invalid(format!("base image `{}` must be pinned by digest (`REF@sha256:...`) so the build is reproducible", tag::escape(reference))));
            }
        }
        if !self.build.is_empty() && self.gpus.is_empty() {
            let first = &self.build[0];
            return Err(invalid(format!("`build:` compiles `{first}` for the recipe's GPUs, and the recipe lists none: TORCH_CUDA_ARCH_LIST is derived from `gpus:`, and a guessed list is how extensions end up without kernels for the GPU they run on\n  hint: add the GPUs the image runs on, e.g. `gpus: [\"RTX 4090\", \"H100\"]`")));
        }
        if self.runtime.as_ref().is_some_and(|r| r.guard)
            && self.entrypoint.is_empty()
            && self.cmd.as_ref().is_some_and(Vec::is_empty)
        {
            return Err(invalid("`runtime: { guard: true }` guards the image's entrypoint or command, and this recipe has neither (`cmd: []` and no `entrypoint:`): the guard would have nothing to start\n  hint: set `entrypoint:` or `cmd:`, or drop `guard:`".to_string()));
        }
        // Every tag as `build` will render it: the recipe's own values, and stand-ins of the
        // right shape for what only the lock knows.
        let values = self.tag_values("localhost", None, None);
        self.render_tags(&values)
            .map_err(|error| RecipeError::Tag {
                path: path.to_path_buf(),
                error,
            })?;
        Ok(())
    }

    /// The placeholder values of this recipe. `torch` and `cudnn` are the locked versions
    /// (`2.1.2+cu118`, `9.1.0.70`); without them, what the recipe implies: its torch version
    /// (with `+VARIANT` for a PyTorch index, as that index's wheels are versioned) and its
    /// cuDNN version, else `none`.
    pub fn tag_values(
        &self,
        registry: &str,
        torch: Option<&str>,
        cudnn: Option<&str>,
    ) -> TagValues {
        let torch = torch.map(str::to_string).or_else(|| {
            self.torch.as_ref().map(|spec| {
                let version = spec.version.to_string();
                match spec.index.variant() {
                    Some(variant) if !version.contains('+') => format!("{version}+{variant}"),
                    _ => version,
                }
            })
        });
        let cudnn = cudnn
            .map(str::to_string)
            .or_else(|| self.cudnn.as_ref().map(|spec| spec.version.to_string()));
        let cudnn_major = cudnn
            .as_deref()
            .and_then(|c| c.split('.').next())
            .unwrap_or("none")
            .to_string();
        TagValues {
            registry: registry.to_string(),
            name: self.name.clone(),
            torch: torch.unwrap_or_else(|| "none".into()),
            cuda: self.cuda.version.to_string(),
            cuda_mm: self.cuda.version.line().to_string(),
            cudnn: cudnn.unwrap_or_else(|| "none".into()),
            cudnn_major,
            python: self.python.to_string(),
        }
    }

    /// The recipe's tags rendered with `values`, each checked as an image reference.
    pub fn render_tags(&self, values: &TagValues) -> Result<Vec<String>, TagError> {
        self.tags
            .iter()
            .map(|template| tag::render(template, values))
            .collect()
    }

    /// The recipe in canonical JSON: sorted keys, defaults made explicit, no comments.
    pub fn canonical_json(&self) -> String {
        let value = serde_json::to_value(self).expect("a recipe always serialises");
        serde_json::to_string(&value).expect("a JSON value always serialises")
    }

    /// Digest of the normalised recipe; image labels carry it.
    pub fn digest(&self) -> Digest {
        Digest::of_bytes(self.canonical_json().as_bytes())
    }

    /// Digest of what the lock is made from: the recipe without the keys that only shape
    /// the image ([`IMAGE_ONLY_KEYS`]), so changing the code copied or the entrypoint does
    /// not make the lock stale (and a relock cannot move a version because of
    /// it). A recipe without those keys has `lock_digest() == digest()`.
    pub fn lock_digest(&self) -> Digest {
        let mut value = serde_json::to_value(self).expect("a recipe always serialises");
        if let Some(object) = value.as_object_mut() {
            for key in IMAGE_ONLY_KEYS {
                object.remove(*key);
            }
        }
        let json = serde_json::to_string(&value).expect("a JSON value always serialises");
        Digest::of_bytes(json.as_bytes())
    }

    /// The platforms to build for, in the recipe's order (`[linux/amd64]` when not given).
    pub fn platforms(&self) -> Vec<Platform> {
        if self.platforms.is_empty() {
            vec![Platform::LinuxAmd64]
        } else {
            self.platforms.clone()
        }
    }

    /// `major.minor` of the CUDA version.
    pub fn cuda_mm(&self) -> CudaVersion {
        self.cuda.version.line()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
name: torch2.4.1-cu121
base: { debian: bookworm }
python: "3.11"
driver_floor: "530.30.02"
cuda: { version: "12.1", flavor: runtime }
cudnn: { version: "9.1.0.70" }
torch: { version: "2.4.1" }
packages: ["numpy==1.26.4"]
gpus: ["A100", "RTX 4090"]
verify: { gpu: auto }
tags: ["{registry}/torch:{torch}-cuda{cuda_mm}-cudnn{cudnn_major}-py{python}"]
"#;

    fn parse(text: &str) -> Result<Recipe, RecipeError> {
        Recipe::parse(text, Path::new("r.yaml"))
    }

    #[test]
    fn parses_the_design_example() {
        let recipe = parse(GOOD).unwrap();
        assert_eq!(recipe.python, PythonVersion::new(3, 11));
        assert_eq!(recipe.cuda.version.to_string(), "12.1");
        assert_eq!(recipe.torch.as_ref().unwrap().index, TorchIndex::Pypi);
        assert_eq!(recipe.packages[0].name(), "numpy");
        assert_eq!(recipe.base, Base::Debian("bookworm".into()));
    }

    #[test]
    fn unknown_keys_report_line_and_column() {
        let text = GOOD.replace("python: \"3.11\"", "python: \"3.11\"\npyhton: \"3.12\"");
        let error = parse(&text).unwrap_err().to_string();
        assert!(
            error.starts_with("r.yaml:5:1: unknown field `pyhton`"),
            "{error}"
        );
    }

    #[test]
    fn bad_versions_are_typed_errors() {
        let error = parse(&GOOD.replace("530.30.02", "twelve"))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("`twelve` is not a valid NVIDIA driver version"),
            "{error}"
        );
        assert!(error.starts_with("r.yaml:5:"), "{error}");
        let error = parse(&GOOD.replace("numpy==1.26.4", "numpy==="))
            .unwrap_err()
            .to_string();
        assert!(error.contains("PEP 508"), "{error}");
    }

    #[test]
    fn a_torch_index_url_never_shows_its_password() {
        for text in [
            "https://bob:s3cret@mirror.example/whl/cu121",
            "https://bob:s3cret@mirror.example/whl/nightly",
            "bob:s3cret@mirror.example",
        ] {
            let error = TorchIndex::from_str(text).unwrap_err();
            assert!(!error.contains("s3cret"), "{error}");
        }
    }

    #[test]
    fn the_lock_digest_ignores_what_only_shapes_the_image() {
        let base = parse(GOOD).unwrap();
        let with_copy = parse(&format!(
            "{GOOD}copy: [{{src: train, dst: /workspace/train, exclude: [data]}}]\n"
        ))
        .unwrap();
        assert_eq!(base.lock_digest(), base.digest());
        assert_ne!(with_copy.digest(), base.digest());
        assert_eq!(with_copy.lock_digest(), base.lock_digest());
        let error = parse(&format!("{GOOD}copy: [{{src: ../secrets, dst: /x}}]\n")).unwrap_err();
        assert!(
            error.to_string().contains("leaves the recipe's directory"),
            "{error}"
        );
    }

    #[test]
    fn digest_ignores_formatting_but_not_meaning() {
        let a = parse(GOOD).unwrap();
        let reformatted = format!(
            "# a comment\n{}",
            GOOD.replace("cuda: {", "# the toolkit\ncuda: {")
                .replace("\"12.1\"", "12.1")
        );
        let b = parse(&reformatted).unwrap();
        assert_eq!(a.digest(), b.digest());
        let c = parse(&GOOD.replace("2.4.1\" }", "2.4.0\" }")).unwrap();
        assert_ne!(a.digest(), c.digest());
    }

    #[test]
    fn platforms_default_to_amd64_and_leave_the_digest_alone() {
        let plain = parse(GOOD).unwrap();
        assert_eq!(plain.platforms(), vec![Platform::LinuxAmd64]);
        assert!(!plain.canonical_json().contains("platforms"));
        let amd64 = parse(&format!("{GOOD}platforms: [linux/amd64]\n")).unwrap();
        assert_ne!(
            plain.digest(),
            amd64.digest(),
            "an explicit list is a different recipe"
        );
        let both = parse(&format!("{GOOD}platforms: [linux/amd64, linux/arm64]\n")).unwrap();
        assert_eq!(
            both.platforms(),
            vec![Platform::LinuxAmd64, Platform::LinuxArm64]
        );
        assert!(both
            .canonical_json()
            .contains(r#""platforms":["linux/amd64","linux/arm64"]"#));
        assert_eq!(Platform::LinuxArm64.lock_suffix(), ".linux-arm64");
        assert_eq!(Platform::LinuxArm64.oci_architecture(), "arm64");
        assert_eq!("linux/aarch64".parse(), Ok(Platform::LinuxArm64));
    }

    #[test]
    fn platform_errors() {
        let error = parse(&format!("{GOOD}platforms: [linux/s390x]\n"))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("`linux/s390x` is not a supported platform"),
            "{error}"
        );
        let error = parse(&format!("{GOOD}platforms: [linux/arm64, linux/arm64]\n"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("listed twice"), "{error}");
    }

    #[test]
    fn torch_index_forms() {
        assert_eq!("pypi".parse::<TorchIndex>().unwrap(), TorchIndex::Pypi);
        let cu = "cu118".parse::<TorchIndex>().unwrap();
        assert_eq!(cu.variant(), Some("cu118"));
        assert_eq!(cu.to_string(), "cu118");
        let mirror = "http://127.0.0.1:8080/whl/cu124/"
            .parse::<TorchIndex>()
            .unwrap();
        assert_eq!(mirror.variant(), Some("cu124"));
        assert!("http://mirror/simple".parse::<TorchIndex>().is_err());
    }

    #[test]
    fn shape_errors() {
        assert!(parse(&GOOD.replace("torch2.4.1-cu121", "Torch"))
            .unwrap_err()
            .to_string()
            .contains("lowercase"));
        assert!(
            parse(&GOOD.replace("{ debian: bookworm }", "{ image: \"ubuntu:22.04\" }"))
                .unwrap_err()
                .to_string()
                .contains("pinned by digest")
        );
        assert!(parse(&GOOD.replace("{python}\"", "{pyton}\""))
            .unwrap_err()
            .to_string()
            .contains("unknown placeholder `{pyton}`"));
    }

    /// Tags that Docker refuses passed `validate` and `build` and failed in `load`.
    #[test]
    fn tags_are_image_references_once_rendered() {
        let with_tag = |tag: &str| {
            parse(&GOOD.replace(
                "\"{registry}/torch:{torch}-cuda{cuda_mm}-cudnn{cudnn_major}-py{python}\"",
                tag,
            ))
        };
        for (tag, expected) in [
            (
                r#""{registry}/torch:{torch}\nlatest""#,
                "the tag `2.4.1\\nlatest`",
            ),
            (r#""{registry}/Torch:{torch}""#, "must be lowercase"),
            (r#""""#, "it is empty"),
            (r#""../torch:{torch}""#, "the registry `..`"),
            (r#""{registry}/../torch""#, "the repository `../torch`"),
            (
                r#""{registry}/torch:{torch}@sha256:0000000000000000000000000000000000000000000000000000000000000000""#,
                "names a digest",
            ),
        ] {
            let error = with_tag(tag).unwrap_err();
            let text = error.to_string();
            assert!(matches!(error, RecipeError::Tag { .. }), "{tag}: {text}");
            assert!(
                text.contains(expected),
                "{tag}: expected `{expected}` in {text}"
            );
            assert!(text.contains("\n  hint: "), "{tag}: {text}");
            // One line for the what, one for the hint: a newline in the tag is escaped.
            assert_eq!(text.lines().count(), 2, "{text}");
        }
        // A PyTorch index build's version has `+cu118`, which a tag cannot carry.
        let error = parse(&GOOD.replace(
            "torch: { version: \"2.4.1\" }",
            "torch: { version: \"2.4.1\", index: cu121 }",
        ))
        .unwrap_err()
        .to_string();
        assert!(error.contains("2.4.1+cu121"), "{error}");
        assert!(error.contains("spell the version out"), "{error}");
        // The design example renders as before.
        let recipe = parse(GOOD).unwrap();
        assert_eq!(
            recipe
                .render_tags(&recipe.tag_values("127.0.0.1:5000", Some("2.4.1"), Some("9.1.0.70")))
                .unwrap(),
            vec!["127.0.0.1:5000/torch:2.4.1-cuda12.1-cudnn9-py3.11"]
        );
        // A bad registry is refused when the tags are rendered for a build.
        let error = recipe
            .render_tags(&recipe.tag_values("Bad Registry", None, None))
            .unwrap_err();
        assert!(error.to_string().contains("Bad Registry"), "{error}");
    }

    /// An epoch past year 9999 built an image Docker cannot load.
    #[test]
    fn source_date_epoch_ends_with_year_9999() {
        let last = parse(&format!(
            "{GOOD}source_date_epoch: {MAX_SOURCE_DATE_EPOCH}\n"
        ))
        .unwrap();
        assert_eq!(last.source_date_epoch, Some(MAX_SOURCE_DATE_EPOCH));
        assert_eq!(
            crate::oci::rfc3339(MAX_SOURCE_DATE_EPOCH),
            "9999-12-31T23:59:59Z"
        );
        let error = parse(&format!(
            "{GOOD}source_date_epoch: {}\n",
            MAX_SOURCE_DATE_EPOCH + 1
        ))
        .unwrap_err()
        .to_string();
        assert!(error.starts_with("r.yaml:13:"), "{error}");
        assert!(error.contains("after the year 9999"), "{error}");
        let error = parse(&format!("{GOOD}source_date_epoch: {}\n", u64::MAX)).unwrap_err();
        assert!(error.to_string().contains("after the year 9999"), "{error}");
        assert!(parse(&format!("{GOOD}source_date_epoch: -1\n")).is_err());
    }

    /// Serde-saphyr's advice to programmers reached users.
    #[test]
    fn duplicate_keys_name_the_key_the_line_and_what_to_do() {
        let error = parse(&GOOD.replace("python: \"3.11\"", "python: \"3.11\"\npython: \"3.12\""))
            .unwrap_err();
        let text = error.to_string();
        assert!(
            matches!(error, RecipeError::DuplicateKey { ref key, line: 5, .. } if key == "python"),
            "{text}"
        );
        assert!(
            text.starts_with("r.yaml:5:1: the key `python` is given twice"),
            "{text}"
        );
        assert!(text.contains("hint: keep one `python:`"), "{text}");
        assert!(
            !text.contains("DuplicateKeyPolicy") && !text.contains("Options"),
            "{text}"
        );
        // Nested mappings too.
        let text = parse(&GOOD.replace("flavor: runtime }", "flavor: runtime, flavor: devel }"))
            .unwrap_err()
            .to_string();
        assert!(text.contains("the key `flavor` is given twice"), "{text}");
        assert!(text.starts_with("r.yaml:6:"), "{text}");
    }

    /// `apt:` packages, parsed into types, pinned or not, as a set.
    #[test]
    fn apt_packages_are_typed_sorted_and_part_of_the_digest() {
        let plain = parse(GOOD).unwrap();
        assert!(plain.apt.is_empty());
        assert!(!plain.canonical_json().contains("apt"));
        let empty = parse(&format!("{GOOD}apt: []\n")).unwrap();
        assert_eq!(empty.digest(), plain.digest(), "an empty list is no list");
        let with = parse(&format!(
            "{GOOD}apt: [openssh-client, git=1:2.39.5-0+deb12u2, libgl1]\n"
        ))
        .unwrap();
        let entries: Vec<String> = with.apt.iter().map(ToString::to_string).collect();
        assert_eq!(
            entries,
            ["git=1:2.39.5-0+deb12u2", "libgl1", "openssh-client"]
        );
        assert_eq!(with.apt[0].name.as_str(), "git");
        assert_ne!(with.digest(), plain.digest());
        assert!(with
            .canonical_json()
            .contains(r#""apt":["git=1:2.39.5-0+deb12u2","libgl1","openssh-client"]"#));
        // Block style and another order: the same recipe.
        let block = parse(&format!(
            "{GOOD}apt:\n  - libgl1\n  - \"git=1:2.39.5-0+deb12u2\"\n  - openssh-client\n"
        ))
        .unwrap();
        assert_eq!(block.digest(), with.digest());
        // Another pin is another recipe.
        let other = parse(&format!(
            "{GOOD}apt: [openssh-client, git=1:2.39.5-0+deb12u3, libgl1]\n"
        ))
        .unwrap();
        assert_ne!(other.digest(), with.digest());
        let again: Recipe = serde_json::from_str(&with.canonical_json()).unwrap();
        assert_eq!(again, with);
    }

    #[test]
    fn apt_errors_name_the_entry_and_the_line() {
        for (list, line, expected) in [
            ("[git, Git]", 13, "the package name `Git` has capital letters"),
            ("[libc6:amd64]", 13, "the architecture qualifier `:amd64` is not accepted"),
            ("[\"git=v2\"]", 13, "must start with a digit"),
            ("[git, git=1:2.39.5-0+deb12u2]", 13, "apt package `git` is listed as `git` and as `git=1:2.39.5-0+deb12u2`; keep one entry"),
            ("[git, git]", 13, "apt package `git` is listed `git` twice"),
            ("git", 13, "expected a list of Debian packages, such as `apt: [git, openssh-client]`"),
            ("{ git: 1 }", 13, "expected a list of Debian packages"),
        ] {
            let error = parse(&format!("{GOOD}apt: {list}\n")).unwrap_err().to_string();
            assert!(error.contains(expected), "{list}: expected `{expected}` in {error}");
            assert!(error.starts_with(&format!("r.yaml:{line}:")), "{list}: {error}");
        }
    }

    /// `validate` of a binary file said nothing of where or why.
    #[test]
    fn binary_input_names_the_byte() {
        let mut bytes = GOOD.as_bytes().to_vec();
        bytes.splice(20..20, [0xff, 0xfe]);
        let error = Recipe::parse_bytes(&bytes, Path::new("r.yaml")).unwrap_err();
        let text = error.to_string();
        assert!(text.contains("invalid UTF-8 at byte 20 (line 2)"), "{text}");
        let cause = std::error::Error::source(&error)
            .expect("the cause is kept")
            .to_string();
        assert!(cause.contains("index 20"), "{cause}");
    }
}
