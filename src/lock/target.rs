//! The environment a lock is made for: a CPython version on linux with a glibc level.
//!
//! From it come the two things wheel selection needs: the PEP 508 marker environment
//! ([`Target::marker_environment`]) and the ordered list of compatible wheel tags
//! ([`Target::tag_priorities`]), built the way `packaging.tags.sys_tags()` orders them for
//! CPython on manylinux, so the wheel chosen per version is the one pip would choose.

use std::collections::HashMap;

use pep508_rs::MarkerEnvironment;
use serde::{Deserialize, Serialize};

use crate::names::{legacy_manylinux_alias, linux_marker_environment, Tag, WheelFilename};
use crate::platform::Platform;
/// The target's versions are the crate's one Python and glibc types (kept reachable as
/// `lock::target::PythonVersion` / `GlibcVersion`).
pub use crate::version::{GlibcVersion, PythonVersion};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TargetError {
    #[error("Python {0} is not supported: cudastack locks for CPython 3.7 or newer")]
    UnsupportedPython(PythonVersion),
}

/// What a lock is for: CPython `python` on linux/`arch` with glibc `glibc`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    pub python: PythonVersion,
    /// Written as the wheel architecture (`"x86_64"`, `"aarch64"`).
    #[serde(with = "crate::platform::wheel_arch_serde")]
    pub arch: Platform,
    pub glibc: GlibcVersion,
}

/// Tags in priority order (lower index = preferred), plus a lookup table.
#[derive(Debug, Clone)]
pub struct TagPriorities {
    ordered: Vec<Tag>,
    rank: HashMap<Tag, usize>,
}

impl TagPriorities {
    /// The rank of the best tag a wheel declares, or `None` if it cannot be installed.
    pub fn best(&self, wheel: &WheelFilename) -> Option<usize> {
        wheel
            .tags()
            .filter_map(|tag| self.rank.get(&tag).copied())
            .min()
    }

    pub fn ordered(&self) -> &[Tag] {
        &self.ordered
    }
}

impl Target {
    pub fn new(
        python: PythonVersion,
        arch: Platform,
        glibc: GlibcVersion,
    ) -> Result<Self, TargetError> {
        if python.major != 3 || python.minor < 7 {
            return Err(TargetError::UnsupportedPython(python));
        }
        Ok(Target {
            python,
            arch,
            glibc,
        })
    }

    /// A short description for messages: `CPython 3.11 on manylinux_2_28_x86_64`.
    pub fn describe(&self) -> String {
        format!(
            "CPython {} on manylinux_{}_{}_{}",
            self.python,
            self.glibc.major,
            self.glibc.minor,
            self.arch.wheel_arch()
        )
    }

    /// The PEP 508 marker environment of the target.
    pub fn marker_environment(&self) -> MarkerEnvironment {
        linux_marker_environment(&self.python.full().to_string(), self.arch.wheel_arch())
    }

    /// Platform tags, most specific first: `manylinux_2_X` down to the oldest level for the
    /// arch, each followed by its legacy alias (`manylinux2014` = 2.17, `manylinux2010` =
    /// 2.12, `manylinux1` = 2.5), then `linux_<arch>` only when `plain_linux` is true
    /// (PyTorch's own indexes publish `linux_x86_64` wheels; PyPI rejects that tag).
    pub fn platform_tags(&self, plain_linux: bool) -> Vec<String> {
        let arch = self.arch.wheel_arch();
        // The oldest glibc with manylinux wheels per arch (PEP 600 / packaging).
        let oldest_minor = match self.arch {
            Platform::LinuxAmd64 => 5,
            Platform::LinuxArm64 => 17,
        };
        let mut tags = Vec::new();
        if self.glibc.major == 2 {
            for minor in (oldest_minor..=self.glibc.minor).rev() {
                tags.push(format!("manylinux_2_{minor}_{arch}"));
                // manylinux2010 and manylinux1 exist only for x86_64, whose levels are the
                // only ones below the aarch64 floor of 2.17.
                if let Some(legacy) = legacy_manylinux_alias(GlibcVersion::new(2, minor)) {
                    tags.push(format!("{legacy}_{arch}"));
                }
            }
        }
        if plain_linux {
            tags.push(format!("linux_{arch}"));
        }
        tags
    }

    /// Every tag the target accepts, in the order of `packaging.tags.sys_tags()` for CPython:
    /// `cpXY-cpXY-*`, `cpXY-abi3-*`, `cpXY-none-*`, older `cp3N-abi3-*`, then `pyXY`/`py3`
    /// pure-Python tags per platform, then the `-any` tags.
    pub fn tag_priorities(&self, plain_linux: bool) -> TagPriorities {
        let platforms = self.platform_tags(plain_linux);
        let minor = self.python.minor;
        let cp = format!("cp3{minor}");
        let mut ordered = Vec::new();
        let mut push = |python: &str, abi: &str, platform: &str| {
            ordered.push(Tag {
                python: python.to_string(),
                abi: abi.to_string(),
                platform: platform.to_string(),
            })
        };
        for abi in [cp.as_str(), "abi3", "none"] {
            for platform in &platforms {
                push(&cp, abi, platform);
            }
        }
        // abi3 wheels built for older CPython 3 minors (abi3 exists from 3.2).
        for older in (2..minor).rev() {
            for platform in &platforms {
                push(&format!("cp3{older}"), "abi3", platform);
            }
        }
        let py_versions: Vec<String> = std::iter::once(format!("py3{minor}"))
            .chain(std::iter::once("py3".to_string()))
            .chain((0..minor).rev().map(|m| format!("py3{m}")))
            .collect();
        for python in &py_versions {
            for platform in &platforms {
                push(python, "none", platform);
            }
        }
        push(&cp, "none", "any");
        for python in &py_versions {
            push(python, "none", "any");
        }
        let mut rank = HashMap::with_capacity(ordered.len());
        for (index, tag) in ordered.iter().enumerate() {
            rank.entry(tag.clone()).or_insert(index);
        }
        TagPriorities { ordered, rank }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Target {
        Target::new(
            "3.11".parse().unwrap(),
            Platform::LinuxAmd64,
            "2.28".parse().unwrap(),
        )
        .unwrap()
    }

    fn wheel(name: &str) -> WheelFilename {
        name.parse().unwrap()
    }

    #[test]
    fn manylinux_aliases_up_to_glibc() {
        let tags = target().platform_tags(false);
        assert_eq!(tags[0], "manylinux_2_28_x86_64");
        assert!(tags.contains(&"manylinux2014_x86_64".to_string()));
        assert!(tags.contains(&"manylinux1_x86_64".to_string()));
        assert!(!tags.iter().any(|t| t.contains("2_31")));
        assert!(!tags.iter().any(|t| t.starts_with("linux_")));
        assert_eq!(target().platform_tags(true).last().unwrap(), "linux_x86_64");
    }

    #[test]
    fn ranks_like_pip() {
        let priorities = target().tag_priorities(false);
        let rank = |name: &str| priorities.best(&wheel(name));
        let cp_2_17 = rank("x-1-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl");
        let cp_2_28 = rank("x-1-cp311-cp311-manylinux_2_28_x86_64.whl");
        let abi3 = rank("x-1-cp38-abi3-manylinux1_x86_64.whl");
        let pure = rank("x-1-py3-none-any.whl");
        assert!(cp_2_28 < cp_2_17);
        assert!(cp_2_17 < abi3);
        assert!(abi3 < pure);
        assert!(pure.is_some());
        assert_eq!(rank("x-1-cp311-cp311-manylinux_2_31_x86_64.whl"), None);
        assert_eq!(rank("x-1-cp312-cp312-manylinux1_x86_64.whl"), None);
        assert_eq!(rank("x-1-cp311-cp311-linux_x86_64.whl"), None);
        assert_eq!(rank("x-1-cp311-cp311-win_amd64.whl"), None);
        assert_eq!(rank("x-1-cp311-cp311-manylinux_2_17_aarch64.whl"), None);
        assert!(rank("x-1-py2.py3-none-any.whl").is_some());
    }

    #[test]
    fn marker_environment_for_linux_cpython() {
        let env = target().marker_environment();
        assert_eq!(env.platform_machine(), "x86_64");
        assert_eq!(env.sys_platform(), "linux");
        assert_eq!(env.python_version().to_string(), "3.11");
        let requirement: pep508_rs::Requirement =
            "triton==3.0.0; platform_system == 'Linux' and python_version < '3.13'"
                .parse()
                .unwrap();
        assert!(requirement.evaluate_markers(&env, &[]));
    }

    #[test]
    fn rejects_python2() {
        // `"2.7".parse()` already fails (version::PythonVersion takes CPython 3 only), so
        // the value is built directly to check Target's own guard.
        assert!(Target::new(
            PythonVersion::new(2, 7),
            Platform::LinuxAmd64,
            "2.28".parse().unwrap()
        )
        .is_err());
        assert!("3".parse::<PythonVersion>().is_err());
        assert!("2_28".parse::<GlibcVersion>().is_err());
    }
}
