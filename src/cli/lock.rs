//! `cudastack lock RECIPE...`: resolve every artifact to a URL and sha256, written to
//! RECIPE's `.lock` beside it.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use cudastack::apt::AptSources;
use cudastack::fetch::http::HttpClient;
use cudastack::lock::changes::{changes, PackageChange};
use cudastack::lock::inputs::{
    build_request, index_credentials, lock_request_for, platform_lock_path,
};
use cudastack::lock::lockfile::{ArtifactKind, Lockfile};
use cudastack::lock::pylock::{pylock_path, to_pylock};
use cudastack::lock::python_inputs::add_to_request;
use cudastack::lock::resolve_with_builds;
use cudastack::lock::system::SystemRequest;
use cudastack::matrix::validate::validate;
use cudastack::recipe::Recipe;
use serde::Serialize;

use super::{Async, CommandResult, Printer};

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
    /// Resolve as upstream was at this moment (RFC 3339, or a date: its 00:00 UTC), as
    /// uv's `--exclude-newer` does: index files uploaded later are not candidates, nor
    /// files whose index gives no upload time, and the Debian/Ubuntu archive is read from
    /// its snapshot (snapshot.debian.org, snapshot.ubuntu.com). `--as-of` with a lock's
    /// own `as_of` reproduces its resolution after upstream moved on.
    #[arg(long, value_name = "TIME", value_parser = parse_as_of)]
    as_of: Option<jiff::Timestamp>,
    /// A snapshot service in place of the public ones for `--as-of` (the same layout
    /// under another origin), or the snapshot root of `--apt-mirror`
    /// (URL/YYYYMMDDTHHMMSSZ/ is the mirror at that moment).
    #[arg(
        long,
        value_name = "URL",
        env = "CUDASTACK_APT_SNAPSHOT",
        requires = "as_of"
    )]
    apt_snapshot: Option<reqwest::Url>,
    /// Write nothing; exit 1 when the lock would change, printing what moved (a drift
    /// check for CI: with `--upgrade`, "did upstream publish anything we would take?").
    #[arg(long)]
    check: bool,
}

/// `--as-of`: an RFC 3339 time, or a date taken as its first second in UTC (a date is the
/// same moment on every machine).
fn parse_as_of(text: &str) -> Result<jiff::Timestamp, String> {
    if let Ok(at) = text.parse::<jiff::Timestamp>() {
        return Ok(at);
    }
    let date: jiff::civil::Date = text.parse().map_err(|_| {
        format!(
            "`{text}` is neither an RFC 3339 time (2026-11-30T03:21:46Z) nor a date (2026-11-30)"
        )
    })?;
    date.to_zoned(jiff::tz::TimeZone::UTC)
        .map(|zoned| zoned.timestamp())
        .map_err(|e| format!("`{text}`: {e}"))
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
    deb_changes: Vec<PackageChange>,
    /// Wheels (and sdists) added, removed, or moved to another version or file.
    wheel_changes: Vec<PackageChange>,
}

pub fn run(args: LockArgs, runtime: &Async, printer: &Printer) -> CommandResult {
    let loaded = super::matrix::load(printer)?;
    let matrix = loaded.matrix();
    let client = runtime.block_on(async { HttpClient::with_defaults() })?;
    let mut written = Vec::new();
    let mut drifted = Vec::new();
    // One moment for every lock of this run; seconds, as the lock records it.
    let now = jiff::Timestamp::from_second(jiff::Timestamp::now().as_second())
        .map_err(|e| e.to_string())?;
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
        // What a two-part torch version was taken to mean, before the lock
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
            match args.as_of {
                Some(at) => request
                    .as_of(at, args.apt_snapshot.as_ref())
                    .map_err(|e| e.to_string())?,
                // Today's upstream: recorded as the lock's moment, nothing filtered.
                None => request.as_of = Some(now),
            }
            // `build:` packages are locked from their sdists, with what their builds need.
            let builds = build_request(matrix, &recipe)?;
            for build in &builds.builds {
                printer.status(format!(
                    "  reading the sdist of {build} (`build:`): its sha256, run and build requirements"
                ));
            }
            let mut lockfile = runtime.block_on(resolve_with_builds(&client, &request, &builds))?;
            keep_the_moment(&mut lockfile, previous.as_ref(), args.as_of.is_some());
            let deb_changes = changes(previous.as_ref(), &lockfile, ArtifactKind::is_deb);
            let wheel_changes = changes(previous.as_ref(), &lockfile, ArtifactKind::is_python);
            if args.check {
                let current = std::fs::read_to_string(&out).unwrap_or_default();
                if current != lockfile.to_json() {
                    printer.status(format!("{} would change:", out.display()));
                    for change in deb_changes.iter().chain(&wheel_changes) {
                        printer.status(format!("  {change}"));
                    }
                    drifted.push(out.clone());
                }
                written.push(Written {
                    artifacts: lockfile.artifacts.len(),
                    lock: out,
                    platform: platform.as_str(),
                    pylock: None,
                    recipe: path,
                    recipe_digest: lockfile.recipe_digest,
                    deb_changes,
                    wheel_changes,
                });
                continue;
            }
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
            if previous.is_some() {
                for change in deb_changes.iter().chain(&wheel_changes) {
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
                deb_changes,
                wheel_changes,
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
    if !drifted.is_empty() {
        printer.status(format!(
            "{} lock(s) out of date; run `cudastack lock{}` without `--check` and review the diff",
            drifted.len(),
            if args.upgrade { " --upgrade" } else { "" }
        ));
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// A relock that moved nothing keeps the previous lock's moment, so it leaves the file
/// byte for byte as it was (the relock workflow opens no pull request for a date); an
/// explicit `--as-of` is always recorded.
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

#[cfg(test)]
mod tests {
    use super::parse_as_of;

    #[test]
    fn as_of_takes_a_time_or_a_date_at_midnight_utc() {
        assert_eq!(
            parse_as_of("2026-11-30T03:21:46Z").unwrap().to_string(),
            "2026-11-30T03:21:46Z"
        );
        assert_eq!(
            parse_as_of("2026-11-30").unwrap().to_string(),
            "2026-11-30T00:00:00Z"
        );
        let error = parse_as_of("last tuesday").unwrap_err();
        assert!(error.contains("RFC 3339"), "{error}");
    }
}
