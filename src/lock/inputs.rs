//! What a recipe needs fetched: the recipe turned into a [`LockRequest`] (root
//! requirements, target platform, package sources), and where its lock file lives.
//!
//! The lock itself is made by `lock::resolve`; this module only decides what to ask for.
//! torch brings its own CUDA runtime and cuDNN pins, so a torch recipe asks for torch and
//! lets the resolver find the exact nvidia-* wheels; a recipe without torch asks for the
//! CUDA runtime, cuBLAS and cuDNN wheels of its versions directly. The devel flavor adds
//! the nvcc wheel of the same CUDA release.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use pep440_rs::VersionSpecifiers;
use pep508_rs::{PackageName, VersionOrUrl};

use crate::apt::AptSources;
use crate::fetch::credentials::{CredentialError, IndexCredentials, IndexSpec};
use crate::fetch::http::HttpClient;
use crate::fetch::index::SimpleIndex;
use crate::fetch::mirror::MirrorDir;
use crate::fetch::source::PackageSource;
#[cfg(doc)]
use crate::lock::python_inputs::PythonInputs;
use crate::lock::python_inputs::StackPin;
use crate::lock::system::SystemRequest;
use crate::lock::target::Target;
use crate::lock::LockRequest;
use crate::matrix::{ResolvedRecipe, TorchBuild};
use crate::recipe::{Flavor, Platform, Recipe, TorchIndex};

#[derive(Debug, thiserror::Error)]
pub enum InputsError {
    #[error("cannot lock recipe `{recipe}`: {message}")]
    Unsupported { recipe: String, message: String },
    #[error(
        "invalid requirement `{}` derived from the recipe",
        crate::recipe::masked_urls(text)
    )]
    Requirement {
        text: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("index URL `{url}` is invalid")]
    Url { url: String },
    #[error(transparent)]
    Mirror(#[from] crate::fetch::mirror::MirrorError),
}

/// `recipes/NAME.yaml` -> `recipes/NAME.lock` (the linux/amd64 lock).
pub fn lock_path(recipe_path: &Path) -> PathBuf {
    recipe_path.with_extension("lock")
}

/// The lock of one platform: `NAME.lock` for linux/amd64, `NAME.linux-arm64.lock` for arm64.
pub fn platform_lock_path(recipe_path: &Path, platform: Platform) -> PathBuf {
    let stem = recipe_path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    recipe_path.with_file_name(format!("{stem}{}.lock", platform.lock_suffix()))
}

/// The first PyPI torch release with CUDA wheels for linux/aarch64 (`manylinux_2_28_aarch64`
/// next to the x86_64 ones, the nvidia-* and cuda-toolkit wheels too); older releases were
/// CPU-only on aarch64, so an arm64 lock of them would silently lose CUDA.
pub const FIRST_ARM64_CUDA_TORCH: &str = "2.11.0";

/// Why `recipe` cannot be locked for `platform`, if it cannot.
fn platform_unsupported(recipe: &Recipe, platform: Platform) -> Option<String> {
    if platform == Platform::LinuxAmd64 {
        return None;
    }
    let torch = recipe.torch.as_ref()?;
    if torch.index.variant().is_some() {
        return Some(format!(
            "{platform} is locked from PyPI only; PyTorch's {} index is not supported for it: use `index: pypi` with torch >= {FIRST_ARM64_CUDA_TORCH}",
            torch.index
        ));
    }
    let first: pep440_rs::Version = FIRST_ARM64_CUDA_TORCH.parse().expect("a valid version");
    if torch.version < first {
        return Some(format!(
            "torch {} has no CUDA wheels for {platform} on PyPI (only CPU builds); use torch >= {FIRST_ARM64_CUDA_TORCH} or drop {platform} from `platforms`",
            torch.version
        ));
    }
    None
}

/// The installer every image carries (Debian's python3 has neither pip nor ensurepip), so
/// images built `FROM` it can `pip install` within the constraints file.
pub const PIP: &str = "pip";

/// The PEP 508 root requirements of a recipe: the stack's, then `packages:`. The recipe's
/// Python input files add theirs when it is locked ([`PythonInputs`]).
pub fn root_requirements(resolved: &ResolvedRecipe) -> Result<Vec<String>, InputsError> {
    let recipe = resolved.recipe();
    let mut requirements = stack_requirements(resolved);
    requirements.extend(recipe.packages.iter().map(ToString::to_string));
    // A package of `build:` is part of the image at its exact version (from its sdist).
    requirements.extend(recipe.build.iter().map(ToString::to_string));
    Ok(requirements)
}

/// What every source build installs besides the sdist's own `[build-system] requires`:
/// setuptools and wheel (PEP 517's setuptools backend), ninja (torch's `cpp_extension`
/// compiles in parallel with it, and falls back to one file at a time without it).
pub const BUILD_TOOLCHAIN: &[&str] = &["setuptools", "wheel", "ninja"];

/// The recipe's `build:` list and the toolchain its builder needs: [`BUILD_TOOLCHAIN`] and,
/// when the image is of the runtime flavor, the nvcc wheel of the stack's exact CUDA
/// release (the devel flavor has it in the image already).
pub fn build_request(
    resolved: &ResolvedRecipe,
) -> Result<crate::lock::sdist::BuildRequest, InputsError> {
    let recipe = resolved.recipe();
    // Validation refuses it first, in the same words; kept for a recipe built by hand.
    if let Some([what, why, hint]) = crate::recipe::build::nvcc_unavailable(recipe) {
        return Err(InputsError::Unsupported {
            recipe: recipe.name.clone(),
            message: format!("{what}: {why}\n  hint: {hint}"),
        });
    }
    // The toolchain is locked only when a build needs it: a `build:` entry, or a git
    // requirement the lock finds in the requirements files.
    let mut texts: Vec<String> = BUILD_TOOLCHAIN.iter().map(|t| t.to_string()).collect();
    // A git requirement on a CUDA 12 stack is built without nvcc (PyPI has none for it):
    // a pure-Python project needs none, an extension fails in its build saying so.
    let with_nvcc = recipe.cuda.version.major >= crate::recipe::build::FIRST_CUDA_WITH_NVCC_WHEEL;
    if with_nvcc && recipe.cuda.flavor == Flavor::Runtime {
        texts.push(nvcc_requirement(recipe, resolved.torch_build()));
    }
    // nvidia-cuda-nvcc 13.0.88 requires cicc (nvidia-nvvm) and the crt headers
    // (nvidia-cuda-crt) without a version, and cuda-toolkit 13.0.2's `nvcc` extra does
    // not pin them: unpinned, the resolver takes 13.5's cicc for 13.0's nvcc. CCCL
    // (`nv/target`, which cuda_fp16.hpp includes; nvcc.profile's `include/cccl`) is a
    // wheel of its own that nothing of the runtime requires.
    let line = recipe.cuda.version.line();
    for wheel in ["nvidia-nvvm", "nvidia-cuda-crt", "nvidia-cuda-cccl"] {
        if with_nvcc {
            texts.push(format!("{wheel}=={line}.*"));
        }
    }
    let toolchain = texts
        .into_iter()
        .map(|text| {
            crate::names::parse_requirement(&text).map_err(|e| InputsError::Requirement {
                text: text.clone(),
                source: Box::new(e),
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(crate::lock::sdist::BuildRequest {
        builds: recipe.build.clone(),
        toolchain,
        git_commits: Default::default(),
        projects: Vec::new(),
        recipe_dir: resolved
            .path()
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default(),
    })
}

/// The versions the stack decides, each with the reason an error shows: the recipe's torch
/// and the wheels torch pins (data/torch-pypi.json, read from its wheel's Requires-Dist), or
/// the CUDA wheels of a recipe without torch. A requirement from the recipe's input files
/// must admit each ([`PythonInputs::check_stack`]).
pub fn stack_pins(resolved: &ResolvedRecipe) -> Vec<StackPin> {
    let recipe = resolved.recipe();
    let mut pins: Vec<StackPin> = Vec::new();
    let torch_build = resolved.torch_build();
    for text in stack_requirements(resolved) {
        let Ok(requirement) = crate::names::parse_requirement::<pep508_rs::VerbatimUrl>(&text)
        else {
            continue;
        };
        let Some(VersionOrUrl::VersionSpecifier(specifiers)) = requirement.version_or_url else {
            continue;
        };
        let why = if requirement.name.as_ref() == "torch" {
            let version = text.trim_start_matches("torch==");
            format!("the recipe's torch is {version} (torch.version in the recipe)")
        } else {
            format!(
                "the recipe's CUDA {} installs `{text}` (cuda in the recipe)",
                recipe.cuda.version
            )
        };
        pins.push(StackPin {
            name: requirement.name,
            specifiers,
            why,
        });
    }
    for (name, version) in torch_build.map(|b| &b.pins).into_iter().flatten() {
        let bare = name.split('[').next().unwrap_or(name);
        let (Ok(name), Ok(specifiers)) = (
            PackageName::from_str(bare),
            VersionSpecifiers::from_str(&format!("=={version}")),
        ) else {
            continue;
        };
        if pins.iter().any(|p| p.name == name) {
            continue;
        }
        let torch = torch_build.map(|b| b.torch.to_string()).unwrap_or_default();
        pins.push(StackPin {
            why: format!("torch {torch} pins {name}=={version} (its wheel's requirements, in data/torch-pypi.json)"),
            name,
            specifiers,
        });
    }
    pins
}

/// What the stack itself asks the resolver for: torch, or the CUDA wheels; nvcc for devel.
fn stack_requirements(resolved: &ResolvedRecipe) -> Vec<String> {
    let recipe = resolved.recipe();
    let cuda = recipe.cuda.version;
    let suffix = if cuda.major >= 13 {
        String::new()
    } else {
        format!("-cu{}", cuda.major)
    };
    let mut requirements = Vec::new();
    match &recipe.torch {
        // A PyTorch index variant publishes local versions (`2.1.2+cu118`), which `==2.1.2`
        // excludes once the specifier becomes a version range: pin the local version.
        // A series (`version: "2.4"`) is locked as the release the matrix resolves it to
        // (2.4.1), so the lock records one exact torch.
        Some(torch) => {
            let release = resolved.torch_release().unwrap_or(&torch.version).clone();
            match torch.index.variant() {
                Some(variant) if !release.to_string().contains('+') => {
                    requirements.push(format!("torch=={release}+{variant}"))
                }
                _ => requirements.push(format!("torch=={release}")),
            }
        }
        None if cuda.major >= 13 => requirements.push(format!(
            "cuda-toolkit[cudart,cublas]=={}.{}.*",
            cuda.major, cuda.minor
        )),
        None => {
            requirements.push(format!(
                "nvidia-cuda-runtime{suffix}=={}.{}.*",
                cuda.major, cuda.minor
            ));
            requirements.push(format!(
                "nvidia-cublas{suffix}=={}.{}.*",
                cuda.major, cuda.minor
            ));
        }
    }
    if recipe.torch.is_none() {
        if let Some(cudnn) = &recipe.cudnn {
            let spec = if cudnn.version.is_exact() {
                format!("=={}", cudnn.version)
            } else {
                format!("=={}.*", cudnn.version)
            };
            requirements.push(format!("nvidia-cudnn-cu{}{spec}", cuda.major));
        }
    }
    if recipe.cuda.flavor == Flavor::Devel {
        requirements.push(nvcc_requirement(recipe, resolved.torch_build()));
    }
    // pip from the lock, so `FROM image` + `RUN pip install` works.
    requirements.push(PIP.to_string());
    requirements
}

/// nvcc of the very release the runtime is: the same exact version torch pins.
fn nvcc_requirement(recipe: &Recipe, torch_build: Option<&TorchBuild>) -> String {
    let cuda = recipe.cuda.version;
    let suffix = if cuda.major >= 13 {
        String::new()
    } else {
        format!("-cu{}", cuda.major)
    };
    let runtime = torch_build.and_then(|b| b.cuda_runtime.clone());
    match (cuda.major >= 13, runtime) {
        (true, _) => match torch_build.and_then(|b| {
            b.pins
                .iter()
                .find(|(k, _)| k.starts_with("cuda-toolkit"))
                .map(|(_, v)| v.clone())
        }) {
            Some(toolkit) => format!("cuda-toolkit[nvcc]=={toolkit}"),
            None => format!("cuda-toolkit[nvcc]=={}.{}.*", cuda.major, cuda.minor),
        },
        (false, Some(runtime)) => format!("nvidia-cuda-nvcc{suffix}=={runtime}"),
        (false, None) => format!("nvidia-cuda-nvcc{suffix}=={}.{}.*", cuda.major, cuda.minor),
    }
}

/// Build the linux/amd64 lock request for `recipe` (see [`lock_request_for`]).
pub fn lock_request(
    resolved: &ResolvedRecipe,
    client: &HttpClient,
    mirror: Option<&Path>,
) -> Result<LockRequest, InputsError> {
    lock_request_for(resolved, client, mirror, Platform::LinuxAmd64)
}

/// Build the lock request of one platform of `recipe`. `mirror` (an air-gapped directory of
/// wheels) is searched first when given; a torch index variant comes before PyPI. The base
/// is the same release on every platform, so its glibc is too. `client` carries the
/// credentials of the recipe's private indexes ([`index_credentials`]); the caller resolves
/// with the same client, which also asks the indexes for file sizes.
pub fn lock_request_for(
    resolved: &ResolvedRecipe,
    client: &HttpClient,
    mirror: Option<&Path>,
    platform: Platform,
) -> Result<LockRequest, InputsError> {
    let recipe = resolved.recipe();
    if let Some(message) = platform_unsupported(recipe, platform) {
        return Err(InputsError::Unsupported {
            recipe: recipe.name.clone(),
            message,
        });
    }
    let glibc = resolved.base_glibc().ok_or_else(|| InputsError::Unsupported {
        recipe: recipe.name.clone(),
        message: format!("the glibc of base {} is unknown; cudastack locks for the bases in `cudastack matrix` (data/nvidia.yaml: bases)", recipe.base),
    })?;
    let target =
        Target::new(recipe.python, platform, glibc).map_err(|e| InputsError::Unsupported {
            recipe: recipe.name.clone(),
            message: e.to_string(),
        })?;
    let mut requirements = Vec::new();
    for text in root_requirements(resolved)? {
        let requirement =
            crate::names::parse_requirement(&text).map_err(|e| InputsError::Requirement {
                text: text.clone(),
                source: Box::new(e),
            })?;
        requirements.push(requirement);
    }
    let mut sources = package_sources(recipe, client, mirror, SimpleIndex::pypi(client.clone()))?;
    // The team's own wheels come before every index, as pip's `--find-links` does; a
    // package with a wheel there is taken from there only (as from the first index that
    // has it), so a name there is never looked up where anyone could publish it.
    if !resolved.local_wheels().is_empty() {
        sources.insert(0, PackageSource::Local(resolved.local_wheels().clone()));
    }
    Ok(LockRequest {
        target,
        requirements,
        constraints: Default::default(),
        sources,
        redist: Vec::new(),
        system: system_request(recipe, platform),
        recipe_digest: recipe.lock_digest(),
        byte_digest: None,
        as_of: None,
    })
}

/// The package sources of `recipe` in the order the resolver asks them: the mirror
/// directory, PyTorch's index variant, the recipe's `indexes:` in recipe order, then `pypi`
/// (PyPI; a test gives a fixture). The first that has a package is where it comes from
/// (uv's `first-index` strategy), except that a package pinned to a named index is asked of
/// that index only, and of the mirror (a directory the site fills itself): never of PyPI or
/// another index, where anyone could publish a package of its name.
pub fn package_sources(
    recipe: &Recipe,
    client: &HttpClient,
    mirror: Option<&Path>,
    pypi: SimpleIndex,
) -> Result<Vec<PackageSource>, InputsError> {
    let mut sources = Vec::new();
    if let Some(dir) = mirror {
        sources.push(PackageSource::Mirror(MirrorDir::open(dir)?));
    }
    let pinned: BTreeSet<_> = recipe
        .indexes
        .iter()
        .flat_map(|index| index.packages.iter().cloned())
        .collect();
    let pinned = Arc::new(pinned);
    if let Some(TorchIndex::Variant { url, .. }) = recipe.torch.as_ref().map(|t| &t.index) {
        let base = format!("{}/", url.trim_end_matches('/'))
            .parse()
            .map_err(|_| InputsError::Url { url: url.clone() })?;
        let torch = PackageSource::Index {
            index: SimpleIndex::new(client.clone(), base),
            plain_linux: true,
        };
        sources.push(torch.excluding(&pinned));
    }
    for index in &recipe.indexes {
        let elsewhere: BTreeSet<_> = pinned
            .iter()
            .filter(|name| !index.packages.contains(name))
            .cloned()
            .collect();
        let named = PackageSource::Index {
            index: SimpleIndex::new(client.clone(), index.url.as_url().clone()),
            plain_linux: false,
        };
        sources.push(named.excluding(&Arc::new(elsewhere)));
    }
    let pypi = PackageSource::Index {
        index: pypi,
        plain_linux: false,
    };
    sources.push(pypi.excluding(&pinned));
    Ok(sources)
}

/// The credentials of the recipe's named indexes, from this process's environment, netrc
/// and (opted in) keyring; what `lock` and `build` send to those indexes.
pub fn index_credentials(recipe: &Recipe) -> Result<IndexCredentials, CredentialError> {
    IndexCredentials::discover(
        recipe
            .indexes
            .iter()
            .map(|index| IndexSpec {
                name: index.name.to_string(),
                env_key: index.name.env_key(),
                base: index.url.as_url().clone(),
            })
            .collect(),
    )
}

/// The base's packages from the distribution's public archives (the caller may point
/// them at a mirror and keep a previous lock's versions); None for a base cudastack does
/// not build.
pub fn system_request(recipe: &Recipe, platform: Platform) -> Option<SystemRequest> {
    let (distro, release) = recipe.base.distro()?;
    Some(SystemRequest {
        sources: AptSources::for_release(distro, release, platform.to_debian(), None, None),
        base: recipe.base.to_string(),
        apt: recipe.apt.iter().map(|p| p.to_string()).collect(),
        keep: Default::default(),
        previous: Default::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::matrix::Matrix;

    /// The stack of `extra` as `lock` gets it: parsed and resolved (valid), on a driver
    /// floor its CUDA runs on (CUDA 13 needs R580).
    fn recipe(extra: &str) -> ResolvedRecipe {
        let path = Path::new("t.yaml");
        let floor = if extra.contains("version: \"13.") {
            "580.65.06"
        } else {
            "550.54.14"
        };
        let recipe = Recipe::parse(&format!("name: t\nbase: {{ debian: bookworm }}\npython: \"3.11\"\ndriver_floor: \"{floor}\"\n{extra}"), path).unwrap();
        ResolvedRecipe::new(Matrix::embedded(), recipe, path).unwrap()
    }

    #[test]
    fn torch_recipes_ask_for_torch_and_packages() {
        let r = recipe("cuda: { version: \"12.1\" }\ntorch: { version: \"2.4.1\" }\npackages: [\"numpy==1.26.4\"]\n");
        assert_eq!(
            root_requirements(&r).unwrap(),
            vec!["torch==2.4.1", "pip", "numpy==1.26.4"]
        );
    }

    /// `version: "2.4"` asked the resolver for `torch==2.4` (2.4.0).
    #[test]
    fn a_torch_series_asks_for_its_resolved_release() {
        let r = recipe("cuda: { version: \"12.1\" }\ntorch: { version: \"2.4\" }\n");
        assert_eq!(root_requirements(&r).unwrap(), vec!["torch==2.4.1", "pip"]);
        let r = recipe("cuda: { version: \"11.8\" }\ntorch: { version: \"2.5\", index: cu118 }\n");
        assert_eq!(
            root_requirements(&r).unwrap(),
            vec!["torch==2.5.1+cu118", "pip"]
        );
    }

    #[test]
    fn index_variants_pin_the_local_version() {
        let r =
            recipe("cuda: { version: \"11.8\" }\ntorch: { version: \"2.1.2\", index: cu118 }\n");
        assert_eq!(
            root_requirements(&r).unwrap(),
            vec!["torch==2.1.2+cu118", "pip"]
        );
    }

    #[test]
    fn devel_adds_the_matching_nvcc() {
        let r =
            recipe("cuda: { version: \"12.1\", flavor: devel }\ntorch: { version: \"2.4.1\" }\n");
        assert_eq!(
            root_requirements(&r).unwrap(),
            vec!["torch==2.4.1", "nvidia-cuda-nvcc-cu12==12.1.105", "pip"]
        );
    }

    /// A `build:` package is a root at its exact version; its builder gets the
    /// toolchain, with nvcc only when the image itself has none; CUDA 12 has no nvcc wheel.
    #[test]
    fn build_entries_are_roots_and_their_builder_gets_the_toolchain() {
        // CUDA 12 has no nvcc wheel: validation refuses it, in the words lock would use.
        let path = Path::new("t.yaml");
        let cu121 = Recipe::parse("name: t\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: { version: \"12.1\" }\ntorch: { version: \"2.4.1\" }\ngpus: [\"RTX 4090\"]\nbuild: [{package: torchsort, version: 0.1.10}]\n", path).unwrap();
        let [what, _, hint] = crate::recipe::build::nvcc_unavailable(&cu121).unwrap();
        assert!(
            what.contains("PyPI publishes nvcc for CUDA 13 and later only"),
            "{what}"
        );
        assert!(hint.starts_with("use a CUDA 13 stack"), "{hint}");
        let invalid = ResolvedRecipe::new(Matrix::embedded(), cu121, path).unwrap_err();
        let errors: Vec<_> = invalid.validation.errors().collect();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].code, "build-needs-nvcc");
        assert_eq!((&errors[0].what, &errors[0].hint), (&what, &hint));
        let r = recipe("cuda: { version: \"13.0\" }\ntorch: { version: \"2.11.0\" }\ngpus: [\"RTX 4090\"]\nbuild: [{package: torchsort, version: 0.1.10}]\n");
        let toolchain = |r: &ResolvedRecipe| -> Vec<String> {
            build_request(r)
                .unwrap()
                .toolchain
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        let nvcc = toolchain(&r);
        assert_eq!(nvcc[..3], ["setuptools", "wheel", "ninja"]);
        assert!(nvcc[3].starts_with("cuda-toolkit[nvcc]==13.0."), "{nvcc:?}");
        assert_eq!(
            nvcc[4..],
            [
                "nvidia-nvvm==13.0.*",
                "nvidia-cuda-crt==13.0.*",
                "nvidia-cuda-cccl==13.0.*"
            ]
        );
        let devel = recipe("cuda: { version: \"13.0\", flavor: devel }\ntorch: { version: \"2.11.0\" }\ngpus: [\"RTX 4090\"]\nbuild: [{package: torchsort, version: 0.1.10}]\n");
        assert_eq!(
            toolchain(&devel),
            [
                "setuptools",
                "wheel",
                "ninja",
                "nvidia-nvvm==13.0.*",
                "nvidia-cuda-crt==13.0.*",
                "nvidia-cuda-cccl==13.0.*"
            ]
        );
        let none = recipe("cuda: { version: \"12.1\" }\ntorch: { version: \"2.4.1\" }\n");
        assert!(build_request(&none).unwrap().builds.is_empty());
    }

    #[test]
    fn without_torch_the_cuda_wheels_are_named() {
        let r = recipe("cuda: { version: \"12.4\" }\ncudnn: { version: \"9.1.0.70\" }\n");
        assert_eq!(
            root_requirements(&r).unwrap(),
            vec![
                "nvidia-cuda-runtime-cu12==12.4.*",
                "nvidia-cublas-cu12==12.4.*",
                "nvidia-cudnn-cu12==9.1.0.70",
                "pip"
            ]
        );
    }

    #[test]
    fn arm64_locks_sit_beside_the_amd64_lock() {
        let path = Path::new("recipes/torch2.15.0-cu132-py3.12.yaml");
        assert_eq!(
            platform_lock_path(path, Platform::LinuxAmd64),
            lock_path(path)
        );
        assert_eq!(
            platform_lock_path(path, Platform::LinuxArm64),
            PathBuf::from("recipes/torch2.15.0-cu132-py3.12.linux-arm64.lock")
        );
    }

    #[test]
    fn arm64_needs_a_torch_with_aarch64_cuda_wheels() {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let client = runtime
            .block_on(async { HttpClient::with_defaults() })
            .unwrap();
        let old = recipe("cuda: { version: \"12.4\" }\ntorch: { version: \"2.6.0\" }\n");
        let error = lock_request_for(&old, &client, None, Platform::LinuxArm64)
            .unwrap_err()
            .to_string();
        assert!(error.contains("no CUDA wheels for linux/arm64"), "{error}");
        // The amd64 lock of the same recipe is fine.
        lock_request(&old, &client, None).unwrap();
        let new = recipe("cuda: { version: \"13.0\" }\ntorch: { version: \"2.11.0\" }\n");
        let request = lock_request_for(&new, &client, None, Platform::LinuxArm64).unwrap();
        assert_eq!(request.target.arch, Platform::LinuxArm64);
        assert_eq!(request.target.glibc.to_string(), "2.36");
    }

    #[test]
    fn lock_path_is_beside_the_recipe() {
        assert_eq!(
            lock_path(Path::new("recipes/a.yaml")),
            PathBuf::from("recipes/a.lock")
        );
    }
}
