//! A recipe that passed validation, with what validation decided about it: the platforms it
//! builds, its `gpus:` as [`TargetGpu`]s, the torch build it selects, NVIDIA_REQUIRE_CUDA,
//! the PTX its driver floor can JIT, the base's glibc and the verify policy.
//!
//! The only way to make one is [`ResolvedRecipe::new`] (or [`ResolvedRecipe::load`]), which
//! runs [`validate`](super::validate::validate) and refuses a recipe with an error, so
//! holding one proves the recipe was validated against this matrix. Lock, build and the
//! outputs take these facts as values instead of loading the recipe again and deriving them
//! anew, so they cannot drift from what `validate` printed.
//!
//! What it must not hold: anything that needs the lock or the fetched wheels (the torch
//! build a lock records, a wheel's own arch list); those are the build's.

use std::path::{Path, PathBuf};

use pep440_rs::Version;

use super::validate::{check, nvidia_require_cuda, torch_release, Problem, Severity, Validation};
use super::{Matrix, TorchBuild};
use crate::digest::Digest;
use crate::fetch::local_wheels::LocalWheels;
use crate::recipe::ca::{self, CaFile};
use crate::recipe::{GpuPolicy, Platform, Recipe, RecipeError};
use crate::target_gpu::TargetGpu;
use crate::version::{CudaVersion, GlibcVersion, PtxIsa};

/// A validated recipe and the facts its validation decided.
#[derive(Debug, Clone)]
pub struct ResolvedRecipe {
    recipe: Recipe,
    path: PathBuf,
    digest: Digest,
    platforms: Vec<Platform>,
    target_gpus: Vec<TargetGpu>,
    torch_release: Option<Version>,
    torch_build: Option<TorchBuild>,
    nvidia_require_cuda: Option<CudaVersion>,
    jit_ptx_isa: Option<PtxIsa>,
    base_glibc: Option<GlibcVersion>,
    /// The `ca_certificates:` files, read and checked.
    ca_files: Vec<CaFile>,
    /// The `wheels:` directories' wheels, read and checked.
    local_wheels: LocalWheels,
    validation: Validation,
}

/// A recipe validation refused: the recipe, where it was read from, and the report with
/// every problem (errors first). Its message names the first error, as `lock` always did.
#[derive(Debug)]
pub struct InvalidRecipe {
    pub recipe: Recipe,
    pub path: PathBuf,
    pub validation: Validation,
}

impl InvalidRecipe {
    /// The problems that made the recipe invalid.
    pub fn errors(&self) -> impl Iterator<Item = &Problem> {
        self.validation.errors()
    }
}

impl std::fmt::Display for InvalidRecipe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let path = self.path.display();
        write!(f, "{path} is not valid (")?;
        if let Some(first) = self.errors().next() {
            write!(f, "{}: {}", first.code, first.what)?;
        }
        write!(f, "); run `cudastack validate {path}`")
    }
}

impl std::error::Error for InvalidRecipe {}

/// Why a recipe file did not become a [`ResolvedRecipe`].
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The file could not be read or parsed.
    #[error(transparent)]
    Recipe(#[from] RecipeError),
    /// It parsed, and validation found errors. Boxed: the recipe and its report are large.
    #[error(transparent)]
    Invalid(Box<InvalidRecipe>),
}

impl ResolvedRecipe {
    /// Read the recipe at `path` and resolve it against `matrix`: the one call `lock` and
    /// `build` start from.
    pub fn load(path: &Path, matrix: &Matrix) -> Result<ResolvedRecipe, ResolveError> {
        let recipe = Recipe::load(path)?;
        ResolvedRecipe::new(matrix, recipe, path).map_err(ResolveError::Invalid)
    }

    /// Validate `recipe` (read from `path`) against `matrix` and keep what the checks
    /// decided; a recipe with an error comes back in [`InvalidRecipe`] with the whole report.
    pub fn new(
        matrix: &Matrix,
        recipe: Recipe,
        path: &Path,
    ) -> Result<ResolvedRecipe, Box<InvalidRecipe>> {
        let (mut validation, torch_build) = check(matrix, &recipe);
        let ca_files = read_ca_files(&recipe, path, &mut validation);
        let local_wheels = read_local_wheels(&recipe, path, &mut validation);
        if !validation.is_valid() {
            return Err(Box::new(InvalidRecipe {
                recipe,
                path: path.to_path_buf(),
                validation,
            }));
        }
        // Validation refuses a name the matrix cannot resolve (`unknown-gpu`), so every
        // entry of `gpus:` is here, in the recipe's order.
        let target_gpus = recipe
            .gpus
            .iter()
            .filter_map(|name| matrix.target_gpu(name))
            .collect();
        let base_glibc = recipe
            .base
            .distro()
            .and_then(|(distro, release)| matrix.base(distro, release))
            .and_then(|base| base.glibc.parse().ok());
        Ok(ResolvedRecipe {
            digest: recipe.digest(),
            platforms: recipe.platforms(),
            target_gpus,
            torch_release: torch_release(matrix, &recipe),
            torch_build: torch_build.cloned(),
            nvidia_require_cuda: nvidia_require_cuda(matrix, &recipe),
            jit_ptx_isa: matrix
                .cuda_ceiling(&recipe.driver_floor)
                .and_then(PtxIsa::newest_for),
            base_glibc,
            ca_files,
            local_wheels,
            path: path.to_path_buf(),
            recipe,
            validation,
        })
    }

    /// The parsed recipe.
    pub fn recipe(&self) -> &Recipe {
        &self.recipe
    }

    /// Where the recipe was read from (the files it names are relative to its directory).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The recipe's digest ([`Recipe::digest`]).
    pub fn digest(&self) -> &Digest {
        &self.digest
    }

    /// The platforms the recipe builds (`platforms:`, linux/amd64 when it names none).
    pub fn platforms(&self) -> &[Platform] {
        &self.platforms
    }

    /// The recipe's `gpus:`, each resolved by [`Matrix::target_gpu`], in the recipe's order:
    /// what the kernel audit checks against and the SBOM names.
    pub fn target_gpus(&self) -> &[TargetGpu] {
        &self.target_gpus
    }

    /// The torch release the recipe names, a series (`"2.4"`) resolved to the release
    /// validation picked; None without torch.
    pub fn torch_release(&self) -> Option<&Version> {
        self.torch_release.as_ref()
    }

    /// The torch build the recipe selects: the matrix row of [`Self::torch_release`] on the
    /// recipe's index, with the x86_64 wheel's arch list; None without torch.
    pub fn torch_build(&self) -> Option<&TorchBuild> {
        self.torch_build.as_ref()
    }

    /// The torch build of the release a lock records (`locked`, the wheel's version): a
    /// series (`version: "2.4"`) was resolved when it was locked, and a refreshed matrix may
    /// pick a newer release now. [`Self::torch_build`] when `locked` does not parse.
    pub fn locked_torch_build<'m>(
        &'m self,
        matrix: &'m Matrix,
        locked: &str,
    ) -> Option<&'m TorchBuild> {
        super::validate::locked_torch_build(matrix, &self.recipe, locked)
    }

    /// The CUDA version NVIDIA_REQUIRE_CUDA asks for (`cuda>=X.Y`): what the driver floor
    /// supports, capped at the recipe's CUDA.
    pub fn nvidia_require_cuda(&self) -> Option<CudaVersion> {
        self.nvidia_require_cuda
    }

    /// The newest PTX ISA the driver floor can JIT-compile; None for a floor older than
    /// every CUDA release the matrix knows.
    pub fn jit_ptx_isa(&self) -> Option<PtxIsa> {
        self.jit_ptx_isa
    }

    /// The certificate authorities the image trusts beside the distribution's
    /// (`ca_certificates:`), read and checked when the recipe was resolved.
    pub fn ca_files(&self) -> &[CaFile] {
        &self.ca_files
    }

    /// The wheels of the recipe's `wheels:` directories, read and checked when the recipe
    /// was resolved (empty without any).
    pub fn local_wheels(&self) -> &LocalWheels {
        &self.local_wheels
    }

    /// The glibc of the base release, which caps the manylinux level of the wheels; None
    /// when the matrix's row does not give one that parses.
    pub fn base_glibc(&self) -> Option<GlibcVersion> {
        self.base_glibc
    }

    /// What the verify stage does about a GPU (`verify.gpu`).
    pub fn verify_policy(&self) -> GpuPolicy {
        self.recipe.verify.gpu
    }

    /// The validation report: no error, but its warnings and notes (a torch series says
    /// which release it picked), and the facts as `validate` prints them.
    pub fn validation(&self) -> &Validation {
        &self.validation
    }
}

/// The recipe's `ca_certificates:` files, read from its directory and checked now, so
/// `validate` refuses a file `build` would; a file that fails is the validation's error.
fn read_ca_files(recipe: &Recipe, path: &Path, validation: &mut Validation) -> Vec<CaFile> {
    let context = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    match ca::read_all(
        context,
        &recipe.ca_certificates,
        std::time::SystemTime::now(),
    ) {
        Ok(files) => files,
        Err(error) => {
            validation.problems.push(Problem {
                severity: Severity::Error,
                code: "ca-certificates",
                what: error.to_string(),
                why: "the image's trust store takes certificate authorities only, as the build would add them".into(),
                hint: "fix the file, or take it out of `ca_certificates`".into(),
            });
            Vec::new()
        }
    }
}

/// The wheels of the recipe's `wheels:` directories, read now, so `validate` refuses what
/// `lock` and `build` would, in their words; a directory that fails is the validation's error.
fn read_local_wheels(recipe: &Recipe, path: &Path, validation: &mut Validation) -> LocalWheels {
    if recipe.wheels.is_empty() {
        return LocalWheels::default();
    }
    let context = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let dirs: Vec<&Path> = recipe.wheels.iter().map(|d| d.as_path()).collect();
    match LocalWheels::read(context, &dirs) {
        Ok(wheels) => wheels,
        Err(error) => {
            validation.problems.push(Problem {
                severity: Severity::Error,
                code: "wheels",
                what: error.to_string(),
                why: "`lock` offers every wheel of `wheels:` to the resolver, and `build` installs the locked ones from there".into(),
                hint: "fix or remove the file, or take the directory out of `wheels:`".into(),
            });
            LocalWheels::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Recipe {
        Recipe::parse(text, Path::new("r.yaml")).unwrap()
    }

    const STACK: &str = "name: r\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: { version: \"12.1\" }\n";

    #[test]
    fn a_valid_recipe_keeps_what_validation_decided() {
        let matrix = Matrix::embedded();
        let recipe = parse(&format!(
            "{STACK}torch: {{ version: \"2.4\" }}\ngpus: [\"RTX 4090\", \"8.0\"]\nverify: {{ gpu: skip }}\n"
        ));
        let resolved = ResolvedRecipe::new(matrix, recipe.clone(), Path::new("r.yaml")).unwrap();
        let validation = super::super::validate::validate(matrix, &recipe);
        // The facts are the ones validation reported, as values.
        assert_eq!(
            resolved.torch_build().map(TorchBuild::label),
            validation.torch_build
        );
        assert_eq!(
            resolved
                .nvidia_require_cuda()
                .map(|cuda| format!("cuda>={cuda}")),
            validation.nvidia_require_cuda
        );
        assert_eq!(resolved.torch_release().unwrap().to_string(), "2.4.1");
        assert_eq!(
            resolved.torch_release(),
            resolved.torch_build().map(|build| &build.torch)
        );
        assert_eq!(
            resolved.target_gpus(),
            [
                matrix.target_gpu("RTX 4090").unwrap(),
                TargetGpu::from_cc("8.0".parse().unwrap())
            ]
        );
        assert_eq!(resolved.platforms(), [Platform::LinuxAmd64]);
        assert_eq!(resolved.verify_policy(), GpuPolicy::Skip);
        assert_eq!(resolved.digest(), &recipe.digest());
        assert_eq!(resolved.base_glibc().unwrap().to_string(), "2.36");
        assert_eq!(
            resolved.jit_ptx_isa(),
            matrix
                .cuda_ceiling(&recipe.driver_floor)
                .and_then(PtxIsa::newest_for)
        );
        assert!(resolved.jit_ptx_isa().is_some());
        // The series note stays with it: `lock` prints it.
        assert!(resolved
            .validation()
            .problems
            .iter()
            .any(|p| p.code == "torch-series"));
        assert_eq!(resolved.recipe(), &recipe);
        assert_eq!(resolved.path(), Path::new("r.yaml"));
    }

    #[test]
    fn a_recipe_without_torch_has_no_torch_build() {
        let resolved =
            ResolvedRecipe::new(Matrix::embedded(), parse(STACK), Path::new("r.yaml")).unwrap();
        assert!(resolved.torch_build().is_none() && resolved.torch_release().is_none());
        assert!(resolved.target_gpus().is_empty());
        assert_eq!(resolved.verify_policy(), GpuPolicy::Auto);
    }

    #[test]
    fn an_invalid_recipe_comes_back_with_every_problem() {
        let matrix = Matrix::embedded();
        let recipe = parse(&format!(
            "{STACK}torch: {{ version: \"2.4.1\" }}\ngpus: [\"RTX 9999 Imaginary\"]\n"
        ));
        let invalid =
            ResolvedRecipe::new(matrix, recipe.clone(), Path::new("dir/r.yaml")).unwrap_err();
        assert_eq!(invalid.recipe, recipe);
        let codes: Vec<&str> = invalid.errors().map(|p| p.code).collect();
        assert_eq!(codes, ["unknown-gpu"]);
        assert_eq!(
            invalid.validation.problems.len(),
            super::super::validate::validate(matrix, &recipe)
                .problems
                .len()
        );
        let message = invalid.to_string();
        assert!(
            message.starts_with("dir/r.yaml is not valid (unknown-gpu: GPU `RTX 9999 Imaginary` is not in the matrix")
                && message.ends_with("); run `cudastack validate dir/r.yaml`"),
            "{message}"
        );
    }

    #[test]
    fn load_reads_parses_and_resolves() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.yaml");
        std::fs::write(&good, STACK).unwrap();
        let resolved = ResolvedRecipe::load(&good, Matrix::embedded()).unwrap();
        assert_eq!(resolved.path(), good);
        assert_eq!(resolved.recipe().name, "r");

        let bad = dir.path().join("bad.yaml");
        std::fs::write(&bad, STACK.replace("12.1", "12.99")).unwrap();
        let Err(ResolveError::Invalid(invalid)) = ResolvedRecipe::load(&bad, Matrix::embedded())
        else {
            panic!("CUDA 12.99 is not a release");
        };
        assert_eq!(invalid.errors().next().unwrap().code, "unknown-cuda");

        let missing = ResolvedRecipe::load(&dir.path().join("none.yaml"), Matrix::embedded());
        assert!(matches!(missing, Err(ResolveError::Recipe(_))));
    }
}
