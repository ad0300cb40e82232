//! Python distribution names, parsed once into types: the project name ([`PackageName`],
//! PEP 503 normalised, from `pep508_rs`), the wheel file name
//! (`{name}-{version}(-{build})?-{python}-{abi}-{platform}.whl`, [`WheelFilename`]) and the
//! one manylinux -> glibc mapping ([`manylinux_glibc`], [`legacy_manylinux_alias`]), and the
//! PEP 508 marker environment of a CPython on Linux ([`linux_marker_environment`]).
//!
//! The version is a PEP 440 [`Version`], and the three tag fields are kept as their
//! compressed tag sets (`py2.py3`, `manylinux_2_17_x86_64.manylinux2014_x86_64`), expanded by
//! [`WheelFilename::tags`]. Which tags a target accepts is decided in
//! [`crate::lock::target`], not here.
//!
//! This module is shared vocabulary (used by fetch, lock, matrix, install and audit): it
//! depends only on [`crate::version`].

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use pep440_rs::Version;
pub use pep508_rs::PackageName;

use crate::version::GlibcVersion;

/// A PEP 508 requirement, parsed by `pep508_rs` after the checks it would panic on:
/// pep508_rs 0.9.2 accepts a name or extra ending in `-`, `.` or `_` when another
/// character follows (`a-[`, `a[b-]`, `a- >=1`) and then panics validating it. Requirements
/// come from recipes, requirements files, locks and wheel METADATA, all of them input: none
/// may panic, so such a text is an error here.
pub fn parse_requirement<T: pep508_rs::Pep508Url>(
    text: &str,
) -> Result<pep508_rs::Requirement<T>, pep508_rs::Pep508Error<T>> {
    let is_name_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_');
    let refuse = |end: usize, what: &str| pep508_rs::Pep508Error {
        message: pep508_rs::Pep508ErrorSource::String(format!(
            "{what} must end with an alphanumeric character"
        )),
        start: end.saturating_sub(1),
        len: 1,
        input: text.to_string(),
    };
    let start = text.len() - text.trim_start().len();
    let name_end = text[start..]
        .find(|c| !is_name_char(c))
        .map_or(text.len(), |end| start + end);
    if text[start..name_end].ends_with(['-', '.', '_']) {
        return Err(refuse(name_end, "Package name"));
    }
    let after_name = &text[name_end..];
    if let Some(extras) = after_name.trim_start().strip_prefix('[') {
        // Every run of name characters among the extras: `a[t- rain]` has the run `t-`,
        // which pep508_rs validates (and panics on) before it sees the space.
        let start_of_extras = text.len() - extras.len();
        let list = extras.split(']').next().unwrap_or_default();
        let mut run_end = None;
        for (offset, c) in list.char_indices().chain([(list.len(), ' ')]) {
            if is_name_char(c) {
                run_end = Some(offset + c.len_utf8());
                continue;
            }
            if let Some(end) = run_end.take() {
                if list[..end].ends_with(['-', '.', '_']) {
                    return Err(refuse(start_of_extras + end, "Extra name"));
                }
            }
        }
    }
    pep508_rs::Requirement::<T>::from_str(text)
}

/// PEP 503 normalisation of a name read off disk (a `.dist-info` directory, a METADATA
/// `Name:`), which may not be a valid project name: [`PackageName`]'s normal form where it
/// parses, the name lowercased where it does not. Kept as a function because the audit
/// compares such names as strings and must not fail on one it cannot read.
pub fn normalize_name(name: &str) -> String {
    PackageName::from_str(name).map_or_else(|_| name.to_ascii_lowercase(), |n| n.to_string())
}

/// The legacy manylinux tags and the glibc level each stands for (PEP 513: manylinux1 =
/// 2.5, PEP 571: manylinux2010 = 2.12, PEP 599: manylinux2014 = 2.17); PEP 600 spells every
/// later level `manylinux_X_Y`.
const LEGACY_MANYLINUX: [(&str, GlibcVersion); 3] = [
    ("manylinux1", GlibcVersion::new(2, 5)),
    ("manylinux2010", GlibcVersion::new(2, 12)),
    ("manylinux2014", GlibcVersion::new(2, 17)),
];

/// The glibc level a manylinux platform tag promises to run on, and the tag's architecture:
/// `manylinux_2_28_x86_64` -> (2.28, `x86_64`), `manylinux2014_aarch64` -> (2.17,
/// `aarch64`). None for other platforms (pure `any`, musllinux, plain `linux_*`, others).
pub fn manylinux_glibc(platform_tag: &str) -> Option<(GlibcVersion, &str)> {
    for (legacy, glibc) in LEGACY_MANYLINUX {
        if let Some(arch) = platform_tag
            .strip_prefix(legacy)
            .and_then(|rest| rest.strip_prefix('_'))
        {
            return Some((glibc, arch));
        }
    }
    let mut parts = platform_tag.strip_prefix("manylinux_")?.splitn(3, '_');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((GlibcVersion::new(major, minor), parts.next().unwrap_or("")))
}

/// The legacy tag name (`manylinux2014`) that is an alias of the `manylinux_X_Y` level
/// `glibc`, if there is one.
pub fn legacy_manylinux_alias(glibc: GlibcVersion) -> Option<&'static str> {
    LEGACY_MANYLINUX
        .iter()
        .find(|(_, level)| *level == glibc)
        .map(|(legacy, _)| *legacy)
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WheelFilenameError {
    #[error("`{0}` is not a wheel file name (it must end in `.whl`)")]
    NotAWheel(String),
    #[error("`{filename}` is not a valid wheel file name: {reason}")]
    Invalid { filename: String, reason: String },
}

/// An optional build tag: a number and an optional string suffix, compared in that order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BuildTag {
    pub number: u64,
    pub suffix: String,
}

impl PartialOrd for BuildTag {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for BuildTag {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.number, &self.suffix).cmp(&(other.number, &other.suffix))
    }
}

impl FromStr for BuildTag {
    /// Why the tag is invalid, for [`WheelFilenameError::Invalid`].
    type Err = String;

    /// A build tag: digits, then an optional suffix (`2`, `2abc`).
    fn from_str(build: &str) -> Result<Self, Self::Err> {
        let digits_end = build
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(build.len());
        if digits_end == 0 {
            return Err(format!("build tag `{build}` must start with a digit"));
        }
        Ok(BuildTag {
            number: build[..digits_end]
                .parse()
                .map_err(|_| format!("build tag `{build}` is too large"))?,
            suffix: build[digits_end..].to_string(),
        })
    }
}

impl fmt::Display for BuildTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.number, self.suffix)
    }
}

/// One expanded compatibility tag: `cp311-cp311-manylinux_2_17_x86_64`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tag {
    pub python: String,
    pub abi: String,
    pub platform: String,
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}-{}", self.python, self.abi, self.platform)
    }
}

/// A parsed wheel file name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WheelFilename {
    pub name: PackageName,
    pub version: Version,
    pub build: Option<BuildTag>,
    pub python_tags: Vec<String>,
    pub abi_tags: Vec<String>,
    pub platform_tags: Vec<String>,
}

impl WheelFilename {
    /// Every (python, abi, platform) combination this wheel declares.
    pub fn tags(&self) -> impl Iterator<Item = Tag> + '_ {
        self.python_tags.iter().flat_map(move |python| {
            self.abi_tags.iter().flat_map(move |abi| {
                self.platform_tags.iter().map(move |platform| Tag {
                    python: python.clone(),
                    abi: abi.clone(),
                    platform: platform.clone(),
                })
            })
        })
    }

    /// The oldest glibc this wheel's platform tags promise to run on. With a compressed tag
    /// set (`a.b`) the most permissive tag wins. None for pure wheels, musllinux and plain
    /// `linux_*` tags.
    pub fn glibc_floor(&self) -> Option<GlibcVersion> {
        self.platform_tags
            .iter()
            .filter_map(|tag| manylinux_glibc(tag).map(|(glibc, _)| glibc))
            .min()
    }

    /// The compressed tag triple as written in the file name: `cp311-cp311-manylinux1_x86_64`.
    pub fn tag_string(&self) -> String {
        format!(
            "{}-{}-{}",
            self.python_tags.join("."),
            self.abi_tags.join("."),
            self.platform_tags.join(".")
        )
    }
}

impl FromStr for WheelFilename {
    type Err = WheelFilenameError;

    fn from_str(filename: &str) -> Result<Self, Self::Err> {
        let stem = filename
            .strip_suffix(".whl")
            .ok_or_else(|| WheelFilenameError::NotAWheel(filename.to_string()))?;
        let invalid = |reason: String| WheelFilenameError::Invalid {
            filename: filename.to_string(),
            reason,
        };
        let parts: Vec<&str> = stem.split('-').collect();
        let (name, version, build, python, abi, platform) = match parts.as_slice() {
            [name, version, python, abi, platform] => (name, version, None, python, abi, platform),
            [name, version, build, python, abi, platform] => {
                (name, version, Some(build), python, abi, platform)
            }
            _ => {
                return Err(invalid(format!(
                    "expected 5 or 6 dash-separated fields, found {}",
                    parts.len()
                )))
            }
        };
        let name = PackageName::from_str(name)
            .map_err(|e| invalid(format!("bad package name `{name}`: {e}")))?;
        let version = Version::from_str(version)
            .map_err(|e| invalid(format!("bad version `{version}`: {e}")))?;
        let build = build
            .map(|build| BuildTag::from_str(build).map_err(invalid))
            .transpose()?;
        let split = |field: &str, what: &str| -> Result<Vec<String>, WheelFilenameError> {
            let tags: Vec<String> = field.split('.').map(str::to_string).collect();
            if tags.iter().any(String::is_empty) {
                return Err(invalid(format!("empty {what} tag in `{field}`")));
            }
            Ok(tags)
        };
        Ok(WheelFilename {
            name,
            version,
            build,
            python_tags: split(python, "python")?,
            abi_tags: split(abi, "abi")?,
            platform_tags: split(platform, "platform")?,
        })
    }
}

impl fmt::Display for WheelFilename {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.name.as_dist_info_name(), self.version)?;
        if let Some(build) = &self.build {
            write!(f, "-{build}")?;
        }
        write!(f, "-{}.whl", self.tag_string())
    }
}

/// The PEP 508 marker environment of CPython `python_full_version` (`3.11.0`) on Linux
/// `machine`. The one place cudastack spells out a target's markers: the resolver, the
/// audit's pin reader and the matrix refresh all evaluate Requires-Dist with it.
pub fn linux_marker_environment(
    python_full_version: &str,
    machine: &str,
) -> pep508_rs::MarkerEnvironment {
    let short: String = python_full_version
        .split('.')
        .take(2)
        .collect::<Vec<_>>()
        .join(".");
    pep508_rs::MarkerEnvironment::try_from(pep508_rs::MarkerEnvironmentBuilder {
        implementation_name: "cpython",
        implementation_version: python_full_version,
        os_name: "posix",
        platform_machine: machine,
        platform_python_implementation: "CPython",
        platform_release: "",
        platform_system: "Linux",
        platform_version: "",
        python_full_version,
        python_version: &short,
        sys_platform: "linux",
    })
    .expect("a major.minor.patch version always parses")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// pep508_rs 0.9.2 panics on these (found by tests/recipe_properties.rs); each must be
    /// an error, and what it accepts must still parse.
    #[test]
    fn requirements_it_would_panic_on_are_errors() {
        for text in [
            "A-[",
            "dU.",
            "a- >=1",
            "a_;python_version>'3'",
            "a[b-]",
            "a[x, y_ ]",
            " a.[b]",
            "trainer[t- rain]",
            "a[x.\ty]",
        ] {
            let parsed = parse_requirement::<pep508_rs::VerbatimUrl>(text);
            let error = parsed.expect_err(text).to_string();
            assert!(
                error.contains("must end with an alphanumeric"),
                "{text}: {error}"
            );
        }
        for text in [
            "a-b[c-d]>=1",
            "torch==2.4.1; python_version < '3.13'",
            "a [x,y]",
            "a[ x , y-z ]",
        ] {
            parse_requirement::<pep508_rs::VerbatimUrl>(text).expect(text);
        }
    }

    #[test]
    fn parses_torch_wheel() {
        let wheel: WheelFilename = "torch-2.4.1-cp311-cp311-manylinux1_x86_64.whl"
            .parse()
            .unwrap();
        assert_eq!(wheel.name.as_ref(), "torch");
        assert_eq!(wheel.version, Version::from_str("2.4.1").unwrap());
        assert_eq!(wheel.build, None);
        assert_eq!(wheel.python_tags, ["cp311"]);
        assert_eq!(wheel.platform_tags, ["manylinux1_x86_64"]);
    }

    #[test]
    fn parses_compressed_tags_and_build() {
        let wheel: WheelFilename =
            "Nvidia_CuDNN_cu12-9.1.0.70-2abc-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"
                .parse()
                .unwrap();
        assert_eq!(wheel.name.as_ref(), "nvidia-cudnn-cu12");
        assert_eq!(
            wheel.build,
            Some(BuildTag {
                number: 2,
                suffix: "abc".into()
            })
        );
        let tags: Vec<String> = wheel.tags().map(|t| t.to_string()).collect();
        assert_eq!(
            tags,
            [
                "py3-none-manylinux2014_x86_64",
                "py3-none-manylinux_2_17_x86_64"
            ]
        );
    }

    #[test]
    fn local_versions_survive() {
        let wheel: WheelFilename = "torch-2.4.1+cu124-cp311-cp311-linux_x86_64.whl"
            .parse()
            .unwrap();
        assert_eq!(wheel.version.to_string(), "2.4.1+cu124");
    }

    #[test]
    fn rejects_bad_names() {
        assert!(matches!(
            "torch-2.4.1.tar.gz".parse::<WheelFilename>(),
            Err(WheelFilenameError::NotAWheel(_))
        ));
        assert!(matches!(
            "torch-2.4.1-cp311.whl".parse::<WheelFilename>(),
            Err(WheelFilenameError::Invalid { .. })
        ));
        assert!(matches!(
            "torch-2.4.1-x1-cp311-cp311-any.whl".parse::<WheelFilename>(),
            Err(WheelFilenameError::Invalid { .. })
        ));
    }

    #[test]
    fn manylinux_levels_and_aliases() {
        let level = |tag| manylinux_glibc(tag).map(|(glibc, arch)| (glibc.to_string(), arch));
        assert_eq!(level("manylinux1_x86_64"), Some(("2.5".into(), "x86_64")));
        assert_eq!(
            level("manylinux2010_x86_64"),
            Some(("2.12".into(), "x86_64"))
        );
        assert_eq!(
            level("manylinux2014_aarch64"),
            Some(("2.17".into(), "aarch64"))
        );
        assert_eq!(
            level("manylinux_2_28_x86_64"),
            Some(("2.28".into(), "x86_64"))
        );
        assert_eq!(level("musllinux_1_2_x86_64"), None);
        assert_eq!(level("linux_x86_64"), None);
        assert_eq!(level("any"), None);
        assert_eq!(
            legacy_manylinux_alias(GlibcVersion::new(2, 17)),
            Some("manylinux2014")
        );
        assert_eq!(legacy_manylinux_alias(GlibcVersion::new(2, 28)), None);
        let wheel: WheelFilename = "x-1-cp311-cp311-manylinux_2_28_x86_64.manylinux2014_x86_64.whl"
            .parse()
            .unwrap();
        assert_eq!(wheel.glibc_floor(), Some(GlibcVersion::new(2, 17)));
        let pure: WheelFilename = "x-1-py3-none-any.whl".parse().unwrap();
        assert_eq!(pure.glibc_floor(), None);
    }

    #[test]
    fn wheel_names_and_glibc_floors() {
        let name: WheelFilename =
            "nvidia_cuda_runtime_cu12-12.1.105-py3-none-manylinux1_x86_64.whl"
                .parse()
                .unwrap();
        assert_eq!(name.name.as_dist_info_name(), "nvidia_cuda_runtime_cu12");
        assert_eq!(name.platform_tags, ["manylinux1_x86_64"]);
        assert!(name.build.is_none());
        let built: WheelFilename = "a-1.0-2-py3-none-any.whl".parse().unwrap();
        assert_eq!(built.build.map(|b| b.to_string()).as_deref(), Some("2"));
        assert!("a-1.0.whl".parse::<WheelFilename>().is_err());
        assert_eq!(name.glibc_floor().unwrap().to_string(), "2.5");
        let torch: WheelFilename = "torch-2.4.1-cp311-cp311-manylinux1_x86_64.whl"
            .parse()
            .unwrap();
        assert_eq!(torch.glibc_floor().unwrap().to_string(), "2.5");
    }

    #[test]
    fn package_names_normalise() {
        let a = PackageName::from_str("Typing_Extensions").unwrap();
        let b = PackageName::from_str("typing.extensions").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.as_ref(), "typing-extensions");
        assert_eq!(normalize_name("Nvidia_CUDNN.cu12"), "nvidia-cudnn-cu12");
        assert_eq!(normalize_name("Foo__-.Bar"), "foo-bar");
    }
}
