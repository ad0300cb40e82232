//! The error of the assembly ([`BuildError`]), shared by its steps (inputs, the layer
//! stagers, produce, the output), so each step can use `?` without converting, and the
//! messages stay in one voice. It wraps the errors of the modules the stack calls (the
//! lock, fetch, the cache, install, layer, oci, the audit); a stage above the stack keeps
//! its own (`source_build::SourceBuildError`, which wraps this one when its builder fails
//! to stage), and the pipeline holds both.

use std::path::{Path, PathBuf};

use crate::digest::Digest;
use crate::matrix::validate::Problem;

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Recipe(#[from] crate::recipe::RecipeError),
    #[error("recipe `{recipe}` is not valid:\n{}", render_problems(problems))]
    Invalid {
        recipe: String,
        problems: Vec<Problem>,
    },
    #[error("recipe `{recipe}` has no lock file `{lock}`; run `cudastack lock {recipe}` first")]
    NoLock { recipe: PathBuf, lock: PathBuf },
    #[error("lock file `{lock}` is stale: it was made from another version of the recipe or of a file it reads (`requirements:`, `pyproject:`, `python_lock:`, `wheels:`)\n  Expected: {expected}\n  Found:    {found}\nrun `cudastack lock {recipe}` again")]
    StaleLock {
        recipe: PathBuf,
        lock: PathBuf,
        expected: Digest,
        found: Digest,
    },
    #[error("`{path}` (wheels:) is not the wheel lock file `{}` was made with: it changed or was replaced since\n  Expected: {expected}\n  Found:    {found}\n  hint: if the new wheel is meant, run `cudastack lock` again; else put the locked wheel back", .lock.display())]
    LocalWheelChanged {
        path: String,
        lock: PathBuf,
        expected: Digest,
        found: String,
    },
    #[error("wheel `{}` installs `{path}` (a `.data/data/` member), over `{protected}`, which the verification probe or the dynamic loader reads before the probe's first line: code there would run before the probe and could forge its report\n  hint: a wheel's files belong in site-packages; if the package needs this file, install it in an image built `FROM` this one, outside the verified stack", .wheel.display())]
    WheelWritesVerificationBase {
        wheel: PathBuf,
        path: String,
        protected: &'static str,
    },
    #[error(transparent)]
    Lockfile(#[from] crate::lock::lockfile::LockfileError),
    #[error(transparent)]
    PythonInputs(#[from] Box<crate::lock::python_inputs::PythonInputsError>),
    #[error(transparent)]
    Download(#[from] crate::fetch::download::DownloadError),
    #[error(transparent)]
    Http(#[from] crate::fetch::http::HttpError),
    #[error(transparent)]
    Credentials(#[from] crate::fetch::credentials::CredentialError),
    #[error(transparent)]
    Cache(#[from] crate::cache::CacheError),
    #[error(transparent)]
    Base(#[from] crate::base_root::BaseError),
    #[error(transparent)]
    Toolkit(#[from] crate::stack::layers::toolkit::error::ToolkitError),
    #[error(transparent)]
    Install(#[from] crate::install::InstallError),
    #[error(transparent)]
    Layer(#[from] crate::layer::LayerError),
    #[error(transparent)]
    Oci(#[from] crate::oci::OciError),
    #[error(transparent)]
    Audit(#[from] crate::audit::AuditError),
    #[error(transparent)]
    Copy(#[from] crate::stack::layers::copy::error::CopyError),
    #[error("cannot read the metadata of wheel `{wheel}`: {message}\n  hint: the wheel in the cache matched its locked sha256, so the locked file itself is malformed; run `cudastack lock --upgrade-package` for it")]
    Wheel { wheel: String, message: String },
    #[error("the static audit of the assembled image failed:\n{0}")]
    AuditFailed(String),
    #[error(
        "the base {base} provides {what} {found}, but the wheels need {expected}\n  hint: {hint}"
    )]
    BaseMismatch {
        base: String,
        what: &'static str,
        found: String,
        expected: String,
        hint: String,
    },
    #[error("{} locked .deb{} could not be fetched from any of their URLs:\n{}\n  hint: if the archive has moved on and the snapshot archive is not reachable from here, point `--apt-mirror URL` at a mirror that keeps these versions, or run `cudastack lock --upgrade` to lock the archive's current versions (and review the diff it prints)", missing.len(), if missing.len() == 1 { "" } else { "s" }, missing.iter().map(|m| format!("  {m}")).collect::<Vec<_>>().join("\n"))]
    DebsUnavailable { missing: Vec<String> },
    #[error(transparent)]
    Repo(#[from] crate::apt::RepoError),
    #[error(transparent)]
    DebTrust(#[from] crate::apt::trust::TrustError),
    #[error("{0}")]
    Unsupported(String),
    #[error("I/O error on `{path}`")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed ({status}):\n{output}")]
    Command {
        command: String,
        status: String,
        output: String,
    },
}

fn render_problems(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| format!("  error[{}]: {}\n    hint: {}", p.code, p.what, p.hint))
        .collect::<Vec<_>>()
        .join("\n")
}

pub(crate) fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> BuildError + '_ {
    move |source| BuildError::Io {
        path: path.to_path_buf(),
        source,
    }
}
