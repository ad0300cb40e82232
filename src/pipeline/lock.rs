//! The lock stage: each platform of a recipe resolved to a lock file (`NAME.lock`,
//! `NAME.linux-arm64.lock`, ...) and its wheels to a PEP 751 `pylock.NAME.toml` beside it,
//! or, in [`LockMode::Check`], compared with the lock on disk without writing anything.
//! The binary turns `cudastack lock`'s arguments into [`LockSettings`], each recipe into a
//! [`ResolvedRecipe`] through [`resolve_recipe`], and prints the [`LockedPlatform`]s
//! [`lock_recipe`] returns.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::Progress;
use crate::apt::AptSources;
use crate::digest::Digest;
use crate::fetch::http::HttpClient;
use crate::lock::changes::{changes, PackageChange};
use crate::lock::inputs::{build_request, index_credentials, lock_request_for, platform_lock_path};
use crate::lock::lockfile::{ArtifactKind, Lockfile};
use crate::lock::pylock::{pylock_path, to_pylock};
use crate::lock::python_inputs::add_to_request;
use crate::lock::resolve_with_builds;
use crate::lock::system::SystemRequest;
use crate::matrix::{Matrix, ResolveError, ResolvedRecipe};
use crate::recipe::{Platform, Recipe};

/// What `lock` was asked for, beyond the recipe.
#[derive(Debug, Clone)]
pub struct LockSettings {
    /// A local directory of wheels searched before any index (locked as `file://` URLs).
    pub mirror: Option<PathBuf>,
    /// Which Debian/Ubuntu packages of the previous lock move to the archive's current version.
    pub upgrade: Upgrade,
    /// A mirror of the base's archive serving every suite of the release from one root.
    pub apt_mirror: Option<reqwest::Url>,
    /// The keyring that signs `apt_mirror` (default: the distribution's archive keyring).
    pub apt_keyring: Option<PathBuf>,
    /// Resolve as upstream was at this moment (`--as-of`); None: as it is `now`.
    pub as_of: Option<jiff::Timestamp>,
    /// A snapshot service in place of the public ones for `as_of`.
    pub apt_snapshot: Option<reqwest::Url>,
    /// The moment of this run, recorded in every lock it writes without `as_of`.
    pub now: jiff::Timestamp,
    pub mode: LockMode,
}

/// Which locked Debian/Ubuntu versions a relock keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upgrade {
    /// Every version of the previous lock is kept.
    Nothing,
    /// Every package is resolved again (`--upgrade`).
    Everything,
    /// These packages are resolved again, the others kept (`--upgrade-package`).
    Packages(Vec<String>),
}

/// Whether the locks are written or only compared with the files on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMode {
    Write,
    /// Write nothing; report the locks that would change (`lock --check`).
    Check,
}

/// One platform's lock: an item of `lock --json` (keys in alphabetical order, as they have
/// always been printed).
#[derive(Debug, Serialize)]
pub struct LockedPlatform {
    pub artifacts: usize,
    pub lock: PathBuf,
    pub platform: &'static str,
    /// The PEP 751 lock of the same wheels; None when the lock has no wheel, or in
    /// [`LockMode::Check`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pylock: Option<PathBuf>,
    pub recipe: PathBuf,
    pub recipe_digest: Digest,
    /// Debian/Ubuntu packages added, removed or moved to another version.
    pub deb_changes: Vec<PackageChange>,
    /// Wheels (and sdists) added, removed, or moved to another version or file.
    pub wheel_changes: Vec<PackageChange>,
    /// [`LockMode::Check`]: the lock on disk differs from this resolution.
    #[serde(skip)]
    pub drifted: bool,
}

/// Everything that stops a lock. The stages' own errors pass through unchanged.
#[derive(Debug, thiserror::Error)]
pub enum LockStageError {
    #[error(transparent)]
    Recipe(#[from] crate::recipe::RecipeError),
    /// Validation found errors; the message names the first.
    #[error(transparent)]
    Invalid(Box<crate::matrix::InvalidRecipe>),
    #[error(transparent)]
    Credentials(#[from] crate::fetch::credentials::CredentialError),
    #[error(transparent)]
    Inputs(#[from] crate::lock::inputs::InputsError),
    #[error(transparent)]
    PythonInputs(Box<crate::lock::python_inputs::PythonInputsError>),
    #[error(transparent)]
    Snapshot(#[from] crate::apt::AptError),
    /// Boxed, like `PythonInputs`: the large errors would make every `Result` here large.
    #[error(transparent)]
    Resolve(Box<crate::lock::LockError>),
    #[error(transparent)]
    Lockfile(#[from] crate::lock::lockfile::LockfileError),
    #[error("failed to write `{}`", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`--upgrade-package {0}`: the lock has no Debian package or git requirement `{0}` to upgrade (a new package comes from the recipe's `apt:` list)")]
    NotLocked(String),
}

impl From<ResolveError> for LockStageError {
    fn from(error: ResolveError) -> Self {
        match error {
            ResolveError::Recipe(error) => LockStageError::Recipe(error),
            ResolveError::Invalid(invalid) => LockStageError::Invalid(invalid),
        }
    }
}

impl From<crate::lock::LockError> for LockStageError {
    fn from(error: crate::lock::LockError) -> Self {
        LockStageError::Resolve(Box::new(error))
    }
}

impl From<crate::lock::python_inputs::PythonInputsError> for LockStageError {
    fn from(error: crate::lock::python_inputs::PythonInputsError) -> Self {
        LockStageError::PythonInputs(Box::new(error))
    }
}

/// The recipe at `path`, resolved against `matrix`: an invalid one is refused, naming its
/// first error. Prints what a two-part torch version was taken to mean, before the lock
/// records the exact release.
pub fn resolve_recipe(
    matrix: &Matrix,
    path: &Path,
    progress: &dyn Progress,
) -> Result<ResolvedRecipe, LockStageError> {
    let resolved = ResolvedRecipe::load(path, matrix)?;
    for note in resolved
        .validation()
        .problems
        .iter()
        .filter(|p| p.code == "torch-series")
    {
        progress.status(&format!("note: {}", note.what));
    }
    Ok(resolved)
}

/// Lock every platform of a resolved recipe.
pub async fn lock_recipe(
    client: &HttpClient,
    resolved: &ResolvedRecipe,
    settings: &LockSettings,
    progress: &dyn Progress,
) -> Result<Vec<LockedPlatform>, LockStageError> {
    // The recipe's private indexes get their credentials (environment, netrc, keyring);
    // sent only to each index's origin, never written anywhere.
    let client = client.with_credentials(index_credentials(resolved.recipe())?);
    let mut locked = Vec::new();
    for &platform in resolved.platforms() {
        progress.status(&format!(
            "locking {} for {platform} ...",
            resolved.path().display()
        ));
        locked.push(lock_platform(&client, resolved, platform, settings, progress).await?);
    }
    Ok(locked)
}

async fn lock_platform(
    client: &HttpClient,
    resolved: &ResolvedRecipe,
    platform: Platform,
    settings: &LockSettings,
    progress: &dyn Progress,
) -> Result<LockedPlatform, LockStageError> {
    let (recipe, path) = (resolved.recipe(), resolved.path());
    let mut request = lock_request_for(resolved, client, settings.mirror.as_deref(), platform)?;
    // requirements:, pyproject:, python_lock: (their files join the lock's digest).
    let projects = add_to_request(resolved, &mut request)?;
    let out = platform_lock_path(path, platform);
    // A previous lock of another format or unreadable: nothing to keep.
    let previous = Lockfile::read(&out).ok();
    if let Some(system) = request.system.as_mut() {
        configure_system(system, settings, recipe, platform, previous.as_ref())?;
    }
    match settings.as_of {
        Some(at) => request.as_of(at, settings.apt_snapshot.as_ref())?,
        // Today's upstream: recorded as the lock's moment, nothing filtered.
        None => request.as_of = Some(settings.now),
    }
    // `build:` packages are locked from their sdists, with what their builds need.
    let mut builds = build_request(resolved)?;
    builds.git_commits = git_commits_to_keep(previous.as_ref(), &settings.upgrade);
    builds.projects = projects;
    for build in &builds.builds {
        progress.status(&format!(
            "  reading the sdist of {build} (`build:`): its sha256, run and build requirements"
        ));
    }
    let mut lockfile = resolve_with_builds(client, &request, &builds).await?;
    keep_the_digest(
        &mut lockfile,
        previous.as_ref(),
        request.byte_digest.as_ref(),
    );
    keep_the_moment(&mut lockfile, previous.as_ref(), settings.as_of.is_some());
    let deb_changes = changes(previous.as_ref(), &lockfile, ArtifactKind::is_deb);
    let wheel_changes = changes(previous.as_ref(), &lockfile, ArtifactKind::is_python);
    let mut locked = LockedPlatform {
        artifacts: lockfile.artifacts.len(),
        lock: out,
        platform: platform.as_str(),
        pylock: None,
        recipe: path.to_path_buf(),
        recipe_digest: lockfile.recipe_digest,
        deb_changes,
        wheel_changes,
        drifted: false,
    };
    let changed: Vec<&PackageChange> = locked
        .deb_changes
        .iter()
        .chain(&locked.wheel_changes)
        .collect();
    match settings.mode {
        LockMode::Check => {
            let current = std::fs::read_to_string(&locked.lock).unwrap_or_default();
            locked.drifted = current != lockfile.to_json();
            if locked.drifted {
                progress.status(&format!("{} would change:", locked.lock.display()));
                for change in changed {
                    progress.status(&format!("  {change}"));
                }
            }
        }
        LockMode::Write => {
            lockfile.write(&locked.lock)?;
            progress.status(&format!(
                "wrote {} ({} artifacts)",
                locked.lock.display(),
                lockfile.artifacts.len()
            ));
            locked.pylock = write_pylock(&locked.lock, recipe, platform, &lockfile)?;
            if let Some(pylock) = &locked.pylock {
                progress.status(&format!("wrote {}", pylock.display()));
            }
            if previous.is_some() {
                for change in changed {
                    progress.status(&format!("  {change}"));
                }
            }
        }
    }
    Ok(locked)
}

/// A relock that moved nothing keeps the previous lock's moment, so it leaves the file
/// byte for byte as it was (the relock workflow opens no pull request for a date); an
/// explicit `--as-of` is always recorded.
/// A lock made before its digest followed what the Python input files mean recorded their
/// bytes: while they are the same, it keeps that digest, so relocking (and `lock --check`)
/// does not call it changed for a new way of writing the same inputs.
fn keep_the_digest(lockfile: &mut Lockfile, previous: Option<&Lockfile>, bytes: Option<&Digest>) {
    if let (Some(previous), Some(bytes)) = (previous, bytes) {
        if previous.recipe_digest == *bytes {
            lockfile.recipe_digest = previous.recipe_digest;
        }
    }
}

fn keep_the_moment(lockfile: &mut Lockfile, previous: Option<&Lockfile>, explicit: bool) {
    let Some(previous) = previous else { return };
    if explicit || previous.as_of.is_none() {
        return;
    }
    let unchanged = Lockfile {
        as_of: previous.as_of,
        ..lockfile.clone()
    };
    if unchanged.to_json() == previous.to_json() {
        *lockfile = unchanged;
    }
}

/// Write the lock's wheels as PEP 751 beside it, for pip and uv; None without wheels.
fn write_pylock(
    lock_path: &Path,
    recipe: &Recipe,
    platform: Platform,
    lockfile: &Lockfile,
) -> Result<Option<PathBuf>, LockStageError> {
    if !lockfile
        .artifacts
        .iter()
        .any(|a| a.kind == ArtifactKind::Wheel)
    {
        return Ok(None);
    }
    let path = pylock_path(lock_path, &recipe.name, platform);
    crate::atomic_file::write(&path, to_pylock(lockfile).as_bytes()).map_err(|source| {
        LockStageError::Write {
            path: path.clone(),
            source,
        }
    })?;
    Ok(Some(path))
}

/// The archive (public or the mirror), and the versions of the previous lock to keep.
fn configure_system(
    system: &mut SystemRequest,
    settings: &LockSettings,
    recipe: &Recipe,
    platform: Platform,
    previous: Option<&Lockfile>,
) -> Result<(), LockStageError> {
    if let Some((distro, release)) = recipe.base.distro() {
        system.sources = AptSources::for_release(
            distro,
            release,
            platform.to_debian(),
            settings.apt_mirror.as_ref(),
            settings.apt_keyring.clone(),
        );
    }
    let upgrade = match &settings.upgrade {
        Upgrade::Nothing => None,
        Upgrade::Everything => Some(&[][..]),
        Upgrade::Packages(names) => {
            if let Some(name) = names.iter().find(|name| !locks_deb(previous, name)) {
                return Err(LockStageError::NotLocked(name.clone()));
            }
            Some(names.as_slice())
        }
    };
    system.keep_from(previous, upgrade);
    Ok(())
}

/// Whether `--upgrade-package NAME` names something the lock keeps: a Debian package or
/// a git requirement's commit.
fn locks_deb(lock: Option<&Lockfile>, name: &str) -> bool {
    lock.is_some_and(|lock| {
        lock.artifacts
            .iter()
            .any(|a| (a.kind == ArtifactKind::Deb || a.is_git()) && a.name == name)
    })
}

/// The commit of each git requirement of `previous`, by its URL as written, less those
/// `upgrade` moves: a branch or tag that moved upstream changes the lock only then.
fn git_commits_to_keep(
    previous: Option<&Lockfile>,
    upgrade: &Upgrade,
) -> BTreeMap<String, crate::fetch::git::Commit> {
    let Some(previous) = previous else {
        return BTreeMap::new();
    };
    previous
        .artifacts
        .iter()
        .filter(|a| a.is_git())
        .filter(|a| match upgrade {
            Upgrade::Nothing => true,
            Upgrade::Everything => false,
            Upgrade::Packages(names) => !names.contains(&a.name),
        })
        .filter_map(|a| Some((a.source.clone(), a.git_commit().ok()?.1)))
        .collect()
}
