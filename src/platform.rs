//! The one platform type: the Linux architectures cudastack builds images for, and the one
//! place that asks which machine cudastack runs on.
//!
//! Every stage spells an architecture its own way: recipes and OCI image indexes say
//! `linux/amd64` (GOARCH), mmdebstrap says `amd64` (Debian), wheel tags and PEP 508's
//! `platform_machine` say `x86_64` (`uname -m`), NVIDIA's redist archives say
//! `linux-sbsa`, ELF headers carry `EM_AARCH64`. [`Platform`] is the concept; each spelling
//! is a conversion on it, so no other module matches on architecture strings.
//!
//! Shared vocabulary: it sits at the bottom of the pipeline with `digest` and `version`,
//! depends only on [`crate::elf`] (for the ELF machine) and oci-spec, and must not reach up
//! into any stage. [`host_cpu`] is the only reader of `std::env::consts::ARCH` in the crate.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::elf::Machine;

/// A platform an image is built for, as OCI and Docker name it (`os/architecture`). Only
/// Linux: CUDA containers run nowhere else. arm64 is NVIDIA's SBSA (Grace, GH200, Jetson
/// Thor), whose redist archives are `linux-sbsa` and whose wheels are `*_aarch64`.
///
/// Serialized as [`Platform::as_str`] (`linux/amd64`: recipes' `platforms:`); a lock's
/// `target.arch` uses the wheel spelling through [`wheel_arch_serde`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Platform {
    LinuxAmd64,
    LinuxArm64,
}

impl Platform {
    pub const ALL: [Platform; 2] = [Platform::LinuxAmd64, Platform::LinuxArm64];

    /// The platform of the machine cudastack runs on, if it is one cudastack builds for.
    pub fn host() -> Option<Platform> {
        Platform::from_wheel_arch(host_cpu())
    }

    /// [`Platform::host`], or linux/amd64 on a machine cudastack builds no images for:
    /// which image of a multi-platform index the commands that run or inspect one pick.
    pub fn host_or_amd64() -> Platform {
        Platform::host().unwrap_or(Platform::LinuxAmd64)
    }

    /// `linux/amd64`, `linux/arm64`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Platform::LinuxAmd64 => "linux/amd64",
            Platform::LinuxArm64 => "linux/arm64",
        }
    }

    /// The OCI `architecture` (GOARCH spelling): `amd64`, `arm64`.
    pub fn oci_architecture(&self) -> &'static str {
        match self {
            Platform::LinuxAmd64 => "amd64",
            Platform::LinuxArm64 => "arm64",
        }
    }

    /// The OCI `architecture` as oci-spec types it.
    pub fn to_oci_arch(&self) -> oci_spec::image::Arch {
        match self {
            Platform::LinuxAmd64 => oci_spec::image::Arch::Amd64,
            Platform::LinuxArm64 => oci_spec::image::Arch::ARM64,
        }
    }

    /// The OCI platform of an image index entry: `os` linux and [`Platform::to_oci_arch`],
    /// no variant.
    pub fn to_oci(&self) -> oci_spec::image::Platform {
        let mut oci = oci_spec::image::Platform::default();
        oci.set_os(oci_spec::image::Os::Linux);
        oci.set_architecture(self.to_oci_arch());
        oci
    }

    /// The Debian/Ubuntu architecture (`mmdebstrap --architectures`): `amd64`, `arm64`.
    pub fn to_debian(&self) -> &'static str {
        self.oci_architecture()
    }

    /// The platform of a [`Platform::to_debian`] spelling (`amd64`, `arm64`).
    pub fn from_debian(architecture: &str) -> Option<Platform> {
        Platform::ALL
            .into_iter()
            .find(|p| p.to_debian() == architecture)
    }

    /// The `e_machine` of the platform's ELF objects.
    pub fn to_elf(&self) -> Machine {
        match self {
            Platform::LinuxAmd64 => Machine::X86_64,
            Platform::LinuxArm64 => Machine::Aarch64,
        }
    }

    /// The platform whose objects have `e_machine` `machine`, if cudastack builds for it.
    pub fn from_elf(machine: Machine) -> Option<Platform> {
        Platform::ALL.into_iter().find(|p| p.to_elf() == machine)
    }

    /// `x86_64`, `aarch64`: the architecture as `uname -m`, PEP 508's `platform_machine` and
    /// the suffix of wheel platform tags (`manylinux_2_28_aarch64`) spell it.
    pub fn wheel_arch(&self) -> &'static str {
        match self {
            Platform::LinuxAmd64 => "x86_64",
            Platform::LinuxArm64 => "aarch64",
        }
    }

    /// The platform of a [`Platform::wheel_arch`] spelling (`x86_64`, `aarch64`).
    pub fn from_wheel_arch(arch: &str) -> Option<Platform> {
        Platform::ALL.into_iter().find(|p| p.wheel_arch() == arch)
    }

    /// NVIDIA's redist platform key: `linux-x86_64`, `linux-sbsa`.
    pub fn redist_platform(&self) -> &'static str {
        match self {
            Platform::LinuxAmd64 => "linux-x86_64",
            Platform::LinuxArm64 => "linux-sbsa",
        }
    }

    /// What goes between the recipe name and `.lock`: nothing for amd64 (so single-platform
    /// recipes keep `NAME.lock`), `.linux-arm64` otherwise.
    pub fn lock_suffix(&self) -> &'static str {
        match self {
            Platform::LinuxAmd64 => "",
            Platform::LinuxArm64 => ".linux-arm64",
        }
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Platform {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "linux/amd64" | "linux/x86_64" => Ok(Platform::LinuxAmd64),
            "linux/arm64" | "linux/arm64/v8" | "linux/aarch64" => Ok(Platform::LinuxArm64),
            other => Err(format!(
                "`{other}` is not a supported platform; use one of: {}",
                Platform::ALL.map(|p| p.as_str()).join(", ")
            )),
        }
    }
}

impl Serialize for Platform {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Platform {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// `#[serde(with = "crate::platform::wheel_arch_serde")]`: a platform written as its
/// [`Platform::wheel_arch`] (`"x86_64"`, `"aarch64"`), the form of a lock's `target.arch`.
pub mod wheel_arch_serde {
    use serde::{Deserializer, Serializer};

    use super::Platform;

    pub fn serialize<S: Serializer>(platform: &Platform, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(platform.wheel_arch())
    }

    /// Unknown values fail as the derived enum of the earlier `lock::target::Arch` did
    /// (``unknown variant `amd64`, expected `x86_64` or `aarch64` ``), raised inside the
    /// visitor so the JSON reader adds the position.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Platform, D::Error> {
        d.deserialize_str(WheelArchVisitor)
    }

    struct WheelArchVisitor;

    impl serde::de::Visitor<'_> for WheelArchVisitor {
        type Value = Platform;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a wheel architecture (`x86_64`, `aarch64`)")
        }

        fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Platform, E> {
            Platform::from_wheel_arch(text).ok_or_else(|| E::unknown_variant(text, VARIANTS))
        }
    }

    const VARIANTS: &[&str] = &["x86_64", "aarch64"];
}

/// The build host's CPU as Rust names it (`x86_64`, `aarch64`, `powerpc64`, ...): the one
/// place cudastack asks which machine it runs on. Messages that name the host use it.
pub fn host_cpu() -> &'static str {
    std::env::consts::ARCH
}

/// The Debian name of the build host's architecture, also for hosts cudastack builds no
/// images for (`ppc64el`), so a base for any [`Platform`] is known to be foreign there.
pub fn host_debian_architecture() -> &'static str {
    match (Platform::host(), host_cpu()) {
        (Some(platform), _) => platform.to_debian(),
        (None, "powerpc64") => "ppc64el",
        (None, other) => other,
    }
}

/// `program` on the build host's PATH.
pub fn which(program: &str) -> Option<std::path::PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_of_each_platform() {
        let rows = [
            (
                Platform::LinuxAmd64,
                "linux/amd64",
                "amd64",
                "x86_64",
                "linux-x86_64",
            ),
            (
                Platform::LinuxArm64,
                "linux/arm64",
                "arm64",
                "aarch64",
                "linux-sbsa",
            ),
        ];
        for (platform, text, debian, wheel, redist) in rows {
            assert_eq!(platform.to_string(), text);
            assert_eq!(text.parse(), Ok(platform));
            assert_eq!(platform.oci_architecture(), debian);
            assert_eq!(platform.to_debian(), debian);
            assert_eq!(Platform::from_debian(debian), Some(platform));
            assert_eq!(platform.to_oci_arch().to_string(), debian);
            assert_eq!(platform.to_oci().architecture(), &platform.to_oci_arch());
            assert_eq!(platform.to_oci().os(), &oci_spec::image::Os::Linux);
            assert_eq!(platform.wheel_arch(), wheel);
            assert_eq!(Platform::from_wheel_arch(wheel), Some(platform));
            assert_eq!(Platform::from_elf(platform.to_elf()), Some(platform));
            assert_eq!(platform.redist_platform(), redist);
        }
        assert_eq!(Platform::from_elf(Machine::Ppc64), None);
        assert_eq!(Platform::from_wheel_arch("ppc64le"), None);
    }

    #[test]
    fn aliases_and_errors_parse_as_recipes_write_them() {
        assert_eq!("linux/x86_64".parse(), Ok(Platform::LinuxAmd64));
        assert_eq!(" linux/arm64/v8 ".parse(), Ok(Platform::LinuxArm64));
        assert_eq!("linux/aarch64".parse(), Ok(Platform::LinuxArm64));
        assert_eq!(
            "linux/s390x".parse::<Platform>(),
            Err(
                "`linux/s390x` is not a supported platform; use one of: linux/amd64, linux/arm64"
                    .to_string()
            )
        );
    }

    #[test]
    fn serde_forms() {
        let json = serde_json::to_string(&Platform::ALL).unwrap();
        assert_eq!(json, r#"["linux/amd64","linux/arm64"]"#);
        let back: Vec<Platform> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, Platform::ALL);

        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        struct Target {
            #[serde(with = "wheel_arch_serde")]
            arch: Platform,
        }
        let target = Target {
            arch: Platform::LinuxArm64,
        };
        let json = serde_json::to_string(&target).unwrap();
        assert_eq!(json, r#"{"arch":"aarch64"}"#);
        assert_eq!(serde_json::from_str::<Target>(&json).unwrap(), target);
        let error = serde_json::from_str::<Target>(r#"{"arch":"amd64"}"#).unwrap_err();
        assert!(
            error.to_string().contains("unknown variant `amd64`"),
            "{error}"
        );
    }

    #[test]
    fn the_host_is_the_machine_running_the_tests() {
        let expected = match std::env::consts::ARCH {
            "x86_64" => Some(Platform::LinuxAmd64),
            "aarch64" => Some(Platform::LinuxArm64),
            _ => None,
        };
        assert_eq!(Platform::host(), expected);
        assert_eq!(
            host_debian_architecture(),
            expected.map_or(host_cpu(), |p| p.to_debian())
        );
    }
}
