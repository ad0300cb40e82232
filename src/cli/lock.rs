//! `cudastack lock RECIPE...`: resolve every artifact to a URL and sha256, written to
//! RECIPE's `.lock` beside it: the arguments, turned into `pipeline::lock`'s settings, and
//! what it returns, printed.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use cudastack::fetch::http::HttpClient;
use cudastack::pipeline::lock::{lock_recipe, resolve_recipe, LockMode, LockSettings, Upgrade};

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

impl LockArgs {
    /// The typed settings of the lock stage, at the moment `now` of this run.
    fn settings(&self, now: jiff::Timestamp) -> LockSettings {
        LockSettings {
            mirror: self.mirror.clone(),
            upgrade: if self.upgrade {
                Upgrade::Everything
            } else if self.upgrade_package.is_empty() {
                Upgrade::Nothing
            } else {
                Upgrade::Packages(self.upgrade_package.clone())
            },
            apt_mirror: self.apt_mirror.clone(),
            apt_keyring: self.apt_keyring.clone(),
            as_of: self.as_of,
            apt_snapshot: self.apt_snapshot.clone(),
            now,
            mode: if self.check {
                LockMode::Check
            } else {
                LockMode::Write
            },
        }
    }
}

pub fn run(args: LockArgs, runtime: &Async, printer: &Printer) -> CommandResult {
    let loaded = super::matrix::load(printer)?;
    let matrix = loaded.matrix();
    let client = runtime.block_on(async { HttpClient::with_defaults() })?;
    // One moment for every lock of this run; seconds, as the lock records it.
    let now = jiff::Timestamp::from_second(jiff::Timestamp::now().as_second())
        .map_err(|e| e.to_string())?;
    let settings = args.settings(now);
    let mut locked = Vec::new();
    for path in &args.recipes {
        let recipe = resolve_recipe(matrix, path, printer)?;
        locked.extend(runtime.block_on(lock_recipe(&client, &recipe, &settings, printer))?);
    }
    if printer.json {
        printer.json(&locked);
    } else {
        for item in &locked {
            printer.line(item.lock.display());
        }
    }
    let drifted = locked.iter().filter(|item| item.drifted).count();
    if drifted > 0 {
        printer.status(format!(
            "{drifted} lock(s) out of date; run `cudastack lock{}` without `--check` and review the diff",
            if args.upgrade { " --upgrade" } else { "" }
        ));
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
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
