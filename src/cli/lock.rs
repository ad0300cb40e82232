//! `cudastack lock RECIPE...`: resolve every artifact to a URL and sha256, written to
//! RECIPE's `.lock` beside it.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use cudastack::apt::AptSources;
use cudastack::fetch::http::HttpClient;
use cudastack::lock::inputs::{
    build_request, index_credentials, lock_request_for, platform_lock_path,
};
use cudastack::lock::lockfile::{ArtifactKind, Lockfile};
use cudastack::lock::pylock::{pylock_path, to_pylock};
use cudastack::lock::python_inputs::add_to_request;
use cudastack::lock::resolve_with_builds;
use cudastack::lock::system::{deb_changes, DebChange, SystemRequest};
use cudastack::matrix::validate::validate;
use cudastack::recipe::Recipe;
use serde::Serialize;

use super::{CommandResult, Printer};

#[derive(Debug, Args)]
pub struct LockArgs {
    /// Recipe files (YAML); each gets NAME.lock beside it, and its wheels as a PEP 751
    /// `pylock.NAME.toml` that pip and uv install from.
    #[arg(required = true)]
    recipes: Vec<PathBuf>,
    /// A local directory of wheels searched before any index (air-gapped sites). Its
    /// files are locked as `file://` URLs; `cudastack build --mirror DIR` reads them, and no
    /// other local file (an index cannot point `lock` at one).
    #[arg(long)]
    mirror: Option<PathBuf>,
    /// Re-resolve every Debian/Ubuntu package to the archive's current version and print
    /// what changed (without it, the previous lock's versions are kept).
    #[arg(long, conflicts_with = "upgrade_package")]
    upgrade: bool,
    /// Re-resolve this Debian/Ubuntu package only (repeatable); the others keep their
    /// locked versions.
    #[arg(long, value_name = "NAME")]
    upgrade_package: Vec<String>,
    /// An internal mirror of the base's archive that serves every suite of the release
    /// (`RELEASE`, `-updates`, `-security`) from one root. Default: $CUDASTACK_APT_MIRROR,
    /// else the distribution's public archives.
    #[arg(long, value_name = "URL", env = "CUDASTACK_APT_MIRROR")]
    apt_mirror: Option<reqwest::Url>,
    /// The keyring that signs `--apt-mirror` (default: the distribution's archive keyring).
    #[arg(long, value_name = "FILE", env = "CUDASTACK_APT_KEYRING")]
    apt_keyring: Option<PathBuf>,
}

/// One lock file written: an item of `lock --json` (keys in alphabetical order, as they
/// have always been printed).
#[derive(Serialize)]
struct Written<'a> {
    artifacts: usize,
    lock: PathBuf,
    platform: &'static str,
    /// The PEP 751 lock of the same wheels; None when the lock has no wheel.
    #[serde(skip_serializing_if = "Option::is_none")]
    pylock: Option<PathBuf>,
    recipe: &'a PathBuf,
    recipe_digest: cudastack::digest::Digest,
    /// Debian/Ubuntu packages added, removed or moved to another version.
    deb_changes: Vec<DebChange>,
}

pub fn run(args: LockArgs, printer: &Printer) -> CommandResult {
    let loaded = super::matrix::load(printer)?;
    let matrix = loaded.matrix();
    let runtime = tokio::runtime::Runtime::new()?;
    let client = runtime.block_on(async { HttpClient::with_defaults() })?;
    let mut written = Vec::new();
    for path in &args.recipes {
        let recipe = Recipe::load(path)?;
        let validation = validate(matrix, &recipe);
        if !validation.is_valid() {
            let first = validation
                .errors()
                .next()
                .map(|p| format!("{}: {}", p.code, p.what))
                .unwrap_or_default();
            return Err(format!(
                "{} is not valid ({first}); run `cudastack validate {}`",
                path.display(),
                path.display()
            )
            .into());
        }
        // What a two-part torch version was taken to mean (issue 24), before the lock
        // records the exact release.
        for note in validation
            .problems
            .iter()
            .filter(|p| p.code == "torch-series")
        {
            printer.status(format!("note: {}", note.what));
        }
        // The recipe's private indexes get their credentials (environment, netrc, keyring);
        // sent only to each index's origin, never written anywhere.
        let client = client.with_credentials(index_credentials(&recipe)?);
        // One lock per platform: NAME.lock (linux/amd64), NAME.linux-arm64.lock, ...
        for platform in recipe.platforms() {
            printer.status(format!("locking {} for {platform} ...", path.display()));
            let mut request =
                lock_request_for(matrix, &recipe, &client, args.mirror.as_deref(), platform)?;
            // requirements:, pyproject:, python_lock: (their files join the lock's digest).
            add_to_request(matrix, &recipe, path, &mut request)?;
            let out = platform_lock_path(path, platform);
            // A previous lock of another format or unreadable: nothing to keep.
            let previous = Lockfile::read(&out).ok();
            if let Some(system) = request.system.as_mut() {
                configure_system(system, &args, &recipe, platform, previous.as_ref())?;
            }
            // `build:` packages are locked from their sdists, with what their builds need.
            let builds = build_request(matrix, &recipe)?;
            for build in &builds.builds {
                printer.status(format!(
                    "  reading the sdist of {build} (`build:`): its sha256, run and build requirements"
                ));
            }
            let lockfile = runtime.block_on(resolve_with_builds(&client, &request, &builds))?;
            lockfile.write(&out)?;
            printer.status(format!(
                "wrote {} ({} artifacts)",
                out.display(),
                lockfile.artifacts.len()
            ));
            let pylock = write_pylock(&out, &recipe, platform, &lockfile)?;
            if let Some(pylock) = &pylock {
                printer.status(format!("wrote {}", pylock.display()));
            }
            let changes = deb_changes(previous.as_ref(), &lockfile);
            if previous.is_some() {
                for change in &changes {
                    printer.status(format!("  {change}"));
                }
            }
            written.push(Written {
                artifacts: lockfile.artifacts.len(),
                lock: out,
                platform: platform.as_str(),
                pylock,
                recipe: path,
                recipe_digest: lockfile.recipe_digest,
                deb_changes: changes,
            });
        }
    }
    if printer.json {
        printer.json(&written);
    } else {
        for item in &written {
            printer.line(item.lock.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Write the lock's wheels as PEP 751 beside it, for pip and uv; None without wheels.
fn write_pylock(
    lock_path: &std::path::Path,
    recipe: &Recipe,
    platform: cudastack::recipe::Platform,
    lockfile: &Lockfile,
) -> Result<Option<PathBuf>, String> {
    if !lockfile
        .artifacts
        .iter()
        .any(|a| a.kind == ArtifactKind::Wheel)
    {
        return Ok(None);
    }
    let path = pylock_path(lock_path, &recipe.name, platform);
    cudastack::atomic_file::write(&path, to_pylock(lockfile).as_bytes())
        .map_err(|e| format!("failed to write `{}`: {e}", path.display()))?;
    Ok(Some(path))
}

/// The archive (public or `--apt-mirror`), and the versions of the previous lock to keep
/// (none with `--upgrade`, all but the named with `--upgrade-package`).
fn configure_system(
    system: &mut SystemRequest,
    args: &LockArgs,
    recipe: &Recipe,
    platform: cudastack::recipe::Platform,
    previous: Option<&Lockfile>,
) -> Result<(), String> {
    if let Some((distro, release)) = recipe.base.distro() {
        system.sources = AptSources::for_release(
            distro,
            release,
            platform.to_debian(),
            args.apt_mirror.as_ref(),
            args.apt_keyring.clone(),
        );
    }
    let upgrade = if args.upgrade {
        Some(&[][..])
    } else if args.upgrade_package.is_empty() {
        None
    } else {
        Some(args.upgrade_package.as_slice())
    };
    for name in &args.upgrade_package {
        let locked = previous.is_some_and(|lock| {
            lock.artifacts
                .iter()
                .any(|a| a.kind == ArtifactKind::Deb && &a.name == name)
        });
        if !locked {
            return Err(format!(
                "`--upgrade-package {name}`: the lock has no Debian package `{name}` to upgrade (a new package comes from the recipe's `apt:` list)"
            ));
        }
    }
    system.keep_from(previous, upgrade);
    Ok(())
}
