//! The recipe's `build:` list: Python packages published only as source distributions,
//! compiled by cudastack for the recipe's GPUs, e.g.
//! `build: [{package: torchsort, version: 0.1.10, env: {FORCE_CUDA: "1"}}]`.
//!
//! Parsed strictly at load time: a package name (PEP 508), one exact version (the sdist is
//! locked by its sha256, so a range would make the lock guess), and the extra environment
//! the package's `setup.py` reads. The variables cudastack itself sets for the compiler
//! (the arch list from `gpus:`, the job count, the timestamp, the toolkit's paths) are
//! refused: the wheel's cache key and its reproducibility depend on them. Whether the sdist
//! exists is `cudastack lock`'s business (src/lock/sdist.rs); the build is
//! src/stack/source_build.rs. docs/source-builds.md is the reference.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use pep440_rs::Version;
use serde::{Deserialize, Deserializer, Serialize};

use super::PackageRequirement;
use crate::names::PackageName;
use crate::reference::escape;

/// The first CUDA major whose nvcc is on PyPI as a wheel with the compiler itself
/// (`nvidia-cuda-nvcc` 13.x: nvcc, fatbinary, nvlink; cicc in `nvidia-nvvm`, via
/// `cuda-toolkit[nvcc]`). The CUDA 12 wheels (`nvidia-cuda-nvcc-cu12` 12.1.105 to 12.9.86)
/// carry `bin/ptxas` only: checked on the wheels themselves.
pub const FIRST_CUDA_WITH_NVCC_WHEEL: u32 = 13;

/// Why a recipe's `build:` cannot compile on its stack, as (what, why, hint), when it
/// cannot: `validate` and `lock` refuse it with these words.
pub fn nvcc_unavailable(recipe: &super::Recipe) -> Option<[String; 3]> {
    let first = recipe.build.first()?;
    let cuda = recipe.cuda.version;
    (cuda.major < FIRST_CUDA_WITH_NVCC_WHEEL).then(|| {
        [
            format!("`build:` compiles `{first}` with nvcc, and PyPI publishes nvcc for CUDA {FIRST_CUDA_WITH_NVCC_WHEEL} and later only"),
            format!("the nvidia-cuda-nvcc-cu12 wheels (12.1 to 12.9) hold ptxas alone, without nvcc, cicc, fatbinary or nvlink, so CUDA {cuda} cannot compile from the wheels the lock names"),
            format!("use a CUDA {FIRST_CUDA_WITH_NVCC_WHEEL} stack for the image (torch >= 2.11.0 on PyPI is built for CUDA 13.0), or build the wheel elsewhere and serve it from an index in `indexes:`"),
        ]
    })
}

/// One entry of `build:`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SourceBuild {
    /// The distribution, in normal form (`flash_attn` is `flash-attn`).
    #[serde(serialize_with = "super::serialize_display")]
    pub package: PackageName,
    /// The exact release whose sdist is built.
    #[serde(serialize_with = "super::serialize_display")]
    pub version: Version,
    /// Extra environment of the build (`FORCE_CUDA: "1"`), never one cudastack sets.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The package's run requirements when its sdist's PKG-INFO does not declare them
    /// statically (Metadata-Version before 2.2, or `Dynamic: Requires-Dist`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requires: Option<Vec<PackageRequirement>>,
}

/// The variables cudastack sets in every source build, with why a recipe may not.
pub const BUILD_OWNED_ENV: &[(&str, &str)] = &[
    ("TORCH_CUDA_ARCH_LIST", "it is derived from the recipe's `gpus:` (SASS for each, PTX for the newest); change `gpus:` instead"),
    ("MAX_JOBS", "it follows the build machine's cores"),
    ("SOURCE_DATE_EPOCH", "it is the recipe's `source_date_epoch` (or 0), so the wheel's timestamps are fixed"),
    ("CUDA_HOME", "it names the toolkit of the recipe's `cuda:`"),
    ("CUDA_PATH", "it names the toolkit of the recipe's `cuda:`"),
    ("CUDA_ROOT", "it names the toolkit of the recipe's `cuda:`"),
    ("CUDACXX", "nvcc is the one of the recipe's `cuda:`"),
    ("CC", "the host compiler is the locked g++ of the base"),
    ("CXX", "the host compiler is the locked g++ of the base"),
    ("PATH", "it puts the toolkit and the locked Python first"),
    ("LD_LIBRARY_PATH", "the libraries found are the locked ones"),
    ("LD_PRELOAD", "the libraries loaded are the locked ones"),
    ("PYTHONPATH", "the modules imported are the locked ones"),
    ("PYTHONHASHSEED", "it is fixed so the build is reproducible"),
    ("HOME", "the build runs in a fixed, empty home"),
    ("TMPDIR", "temporary files go to a fixed place"),
    ("PIP_", "pip runs offline with the locked build dependencies (`--no-index --no-build-isolation`)"),
    ("NVIDIA_", "the NVIDIA runtime's switches are the stack's"),
];

/// Distributions the stack locks itself: building them from source would replace what
/// the image was proved with.
const STACK_PACKAGES: &[&str] = &["torch", "pip", "triton", "cuda-toolkit"];

/// Why `name` may not be set in a source build's `env:`, if it may not.
pub fn owned_reason(name: &str) -> Option<&'static str> {
    BUILD_OWNED_ENV.iter().find_map(|(owned, why)| {
        let hit = if owned.ends_with('_') {
            name.starts_with(owned)
        } else {
            name == *owned
        };
        hit.then_some(*why)
    })
}

/// An entry as written, before its fields are checked.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBuild {
    package: serde_json::Value,
    version: serde_json::Value,
    #[serde(default)]
    env: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    requires: Option<Vec<String>>,
}

fn scalar(value: &serde_json::Value) -> Option<String> {
    match value {
        serde_json::Value::String(text) => Some(text.clone()),
        serde_json::Value::Number(number) => Some(number.to_string()),
        serde_json::Value::Bool(flag) => Some(flag.to_string()),
        _ => None,
    }
}

/// A package name for `build:`, or why not.
pub fn parse_package(text: &str) -> Result<PackageName, String> {
    let shown = escape(text);
    if let Some(at) = text.find(['=', '<', '>', '~', '!', '[', ';', '@', ' ']) {
        let bare = text[..at].trim();
        return Err(format!("`build` package `{shown}` is not a bare distribution name: give the name in `package:` (`{}`) and one exact version in `version:`; extras, markers and URLs are not taken", escape(bare)));
    }
    let name = PackageName::from_str(text).map_err(|e| {
        format!("`build` package `{shown}` is not a Python distribution name ({e}): letters, digits, `-`, `_` and `.`, as on its PyPI page")
    })?;
    let normal = name.to_string();
    if STACK_PACKAGES.contains(&normal.as_str()) || normal.starts_with("nvidia-") {
        return Err(format!("`build` package `{normal}` is part of the stack (the recipe's torch and CUDA wheels, pip); cudastack installs it from its published wheels and proves the image with them\n  hint: remove it from `build:`; `build:` is for extensions compiled against the stack"));
    }
    Ok(name)
}

/// An exact version for `build:`, or why not.
pub fn parse_version(package: &PackageName, text: &str) -> Result<Version, String> {
    let shown = escape(text);
    let exact = |why: &str| {
        Err(format!("`build` package `{package}`: version `{shown}` {why}; the sdist is locked by its sha256, so `version:` names one release, e.g. `version: \"2.6.3\"`"))
    };
    if text.starts_with(['=', '<', '>', '~', '!']) {
        let bare = text.trim_start_matches(['=', '<', '>', '~', '!', ' ']);
        return exact(&format!(
            "is a specifier, not a version (write `{}`)",
            escape(bare)
        ));
    }
    if text.contains(['*', ',']) {
        return exact("is a range, not one version");
    }
    let version = Version::from_str(text).or_else(|_| exact("is not a PEP 440 version"))?;
    if version.is_local() {
        return exact("has a local label (`+...`), which no sdist on an index carries");
    }
    Ok(version)
}

impl TryFrom<RawBuild> for SourceBuild {
    type Error = String;

    fn try_from(raw: RawBuild) -> Result<Self, String> {
        let package = scalar(&raw.package)
            .ok_or("`build` entry: `package:` must be a distribution name such as `flash-attn`")?;
        let package = parse_package(&package)?;
        let version = scalar(&raw.version).ok_or_else(|| {
            format!("`build` package `{package}`: `version:` must be one exact version such as `\"2.6.3\"`")
        })?;
        let version = parse_version(&package, &version)?;
        let mut env = BTreeMap::new();
        for (name, value) in raw.env {
            let value = scalar(&value).ok_or_else(|| {
                format!("`build` package `{package}`: env `{}` must be a string, a number or a boolean; quote it", escape(&name))
            })?;
            check_env(&package, &name, &value)?;
            env.insert(name, value);
        }
        let requires = raw
            .requires
            .map(|list| {
                list.iter()
                    .map(|text| {
                        text.parse::<PackageRequirement>()
                            .map_err(|e| format!("`build` package `{package}`: requires: {e}"))
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?;
        Ok(SourceBuild {
            package,
            version,
            env,
            requires,
        })
    }
}

/// One `env:` entry of a source build, or why not.
fn check_env(package: &PackageName, name: &str, value: &str) -> Result<(), String> {
    let valid = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(format!("`build` package `{package}`: env `{}` is not a variable name: letters, digits and `_`, not starting with a digit", escape(name)));
    }
    if let Some(why) = owned_reason(name) {
        return Err(format!("`build` package `{package}`: env `{name}` is set by cudastack in every source build: {why}\n  hint: remove `{name}` from this entry's `env:`"));
    }
    if value.contains('\0') {
        return Err(format!(
            "`build` package `{package}`: env `{name}` has a NUL byte, which no environment variable can carry"
        ));
    }
    Ok(())
}

impl<'de> Deserialize<'de> for SourceBuild {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = RawBuild::deserialize(deserializer)?;
        SourceBuild::try_from(raw).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for SourceBuild {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}=={}", self.package, self.version)
    }
}

/// The `build:` list: no package twice, sorted by name (the builds are independent, so
/// the order means nothing and must not change the recipe's digest).
pub(super) fn deserialize_list<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<SourceBuild>, D::Error> {
    let mut builds = deserializer.deserialize_any(ListVisitor)?;
    builds.sort_by(|a, b| a.package.cmp(&b.package));
    if let Some(pair) = builds
        .windows(2)
        .find(|pair| pair[0].package == pair[1].package)
    {
        return Err(serde::de::Error::custom(format!(
            "`build` package `{}` is listed twice (as {} and {}); keep one entry",
            pair[0].package, pair[0], pair[1]
        )));
    }
    Ok(builds)
}

struct ListVisitor;

impl<'de> serde::de::Visitor<'de> for ListVisitor {
    type Value = Vec<SourceBuild>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(
            "a list of source builds, such as `build: [{package: torchsort, version: \"0.1.10\"}]`",
        )
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut builds = Vec::new();
        while let Some(build) = seq.next_element()? {
            builds.push(build);
        }
        Ok(builds)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::recipe::{Recipe, RecipeError};

    const BASE: &str = "name: t\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: { version: \"12.1\" }\ntorch: { version: \"2.4.1\" }\ngpus: [\"RTX 4090\"]\n";

    fn parse(build: &str) -> Result<Recipe, RecipeError> {
        Recipe::parse(&format!("{BASE}build: {build}\n"), Path::new("r.yaml"))
    }

    #[test]
    fn entries_are_typed_sorted_and_part_of_the_digest() {
        let recipe = parse(
            "[{package: Flash_Attn, version: 2.6.3, env: {FLASH_ATTENTION_FORCE_BUILD: \"TRUE\", NVCC_THREADS: 2}}, {package: torchsort, version: \"0.1.10\"}]",
        )
        .unwrap();
        let names: Vec<String> = recipe.build.iter().map(ToString::to_string).collect();
        assert_eq!(names, ["flash-attn==2.6.3", "torchsort==0.1.10"]);
        assert_eq!(recipe.build[0].env["NVCC_THREADS"], "2");
        let plain = Recipe::parse(BASE, Path::new("r.yaml")).unwrap();
        assert_ne!(recipe.digest(), plain.digest());
        assert_ne!(recipe.lock_digest(), plain.lock_digest());
        assert!(!plain.canonical_json().contains("build"));
        let reordered = parse(
            "[{package: torchsort, version: \"0.1.10\"}, {package: flash-attn, version: 2.6.3, env: {NVCC_THREADS: \"2\", FLASH_ATTENTION_FORCE_BUILD: \"TRUE\"}}]",
        )
        .unwrap();
        assert_eq!(reordered.digest(), recipe.digest());
        let again: Recipe = serde_json::from_str(&recipe.canonical_json()).unwrap();
        assert_eq!(again, recipe);
        let with_requires =
            parse("[{package: torchsort, version: \"0.1.10\", requires: [\"torch>=1.7\"]}]")
                .unwrap();
        assert_eq!(
            with_requires.build[0].requires.as_ref().unwrap()[0].to_string(),
            "torch>=1.7"
        );
    }

    #[test]
    fn errors_name_the_entry_the_line_and_what_to_do() {
        for (build, expected) in [
            ("[{package: \"torchsort==0.1.10\", version: 0.1.10}]", "give the name in `package:` (`torchsort`)"),
            ("[{package: \"flash attn\", version: 2.6.3}]", "is not a bare distribution name"),
            ("[{package: \"-x\", version: 1}]", "is not a Python distribution name"),
            ("[{package: torch, version: 2.4.1}]", "`build` package `torch` is part of the stack"),
            ("[{package: nvidia-cudnn-cu12, version: 9.1.0.70}]", "is part of the stack"),
            ("[{package: torchsort, version: \">=0.1\"}]", "is a specifier, not a version (write `0.1`)"),
            ("[{package: torchsort, version: \"0.1.*\"}]", "is a range, not one version"),
            ("[{package: torchsort, version: latest}]", "is not a PEP 440 version"),
            ("[{package: torchsort, version: \"0.1.10+cu121\"}]", "has a local label"),
            ("[{package: torchsort, version: 0.1.10, env: {TORCH_CUDA_ARCH_LIST: \"8.0\"}}]", "env `TORCH_CUDA_ARCH_LIST` is set by cudastack in every source build: it is derived from the recipe's `gpus:`"),
            ("[{package: torchsort, version: 0.1.10, env: {MAX_JOBS: 4}}]", "env `MAX_JOBS` is set by cudastack"),
            ("[{package: torchsort, version: 0.1.10, env: {SOURCE_DATE_EPOCH: 0}}]", "env `SOURCE_DATE_EPOCH` is set by cudastack"),
            ("[{package: torchsort, version: 0.1.10, env: {CUDA_HOME: /usr}}]", "env `CUDA_HOME` is set by cudastack"),
            ("[{package: torchsort, version: 0.1.10, env: {PIP_INDEX_URL: x}}]", "env `PIP_INDEX_URL` is set by cudastack"),
            ("[{package: torchsort, version: 0.1.10, env: {\"1X\": x}}]", "env `1X` is not a variable name"),
            ("[{package: torchsort, version: 0.1.10, env: {X: [1]}}]", "must be a string, a number or a boolean"),
            ("[{package: torchsort, version: 0.1.10, requires: [\"torch>=\"]}]", "requires: `torch>=` is not a valid PEP 508 requirement"),
            ("[{package: torchsort, version: 0.1.10, flags: x}]", "unknown field `flags`"),
            ("[{package: torchsort}]", "missing field `version`"),
            ("[{package: torchsort, version: 0.1.10}, {package: TorchSort, version: 0.1.9}]", "`build` package `torchsort` is listed twice"),
            ("torchsort", "expected a list of source builds"),
        ] {
            let error = parse(build).unwrap_err().to_string();
            assert!(error.contains(expected), "{build}: expected `{expected}` in {error}");
            assert!(error.starts_with("r.yaml:8:"), "{build}: {error}");
        }
        let error = Recipe::parse(
            &format!(
                "{}build: [{{package: torchsort, version: 0.1.10}}]\n",
                BASE.replace("gpus: [\"RTX 4090\"]\n", "")
            ),
            Path::new("r.yaml"),
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("the recipe lists none"), "{error}");
        assert!(error.contains("hint: add the GPUs"), "{error}");
    }
}
