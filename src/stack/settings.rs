//! What a build is asked to do ([`BuildSettings`]) and how it reports progress
//! ([`BuildProgress`]): the inputs every step of the assembly (and the source builds above
//! it) reads, below all of them.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::fetch::progress::Reporter;
use crate::layer::Compression;
use crate::recipe::{Platform, Recipe};
use crate::stack::error::BuildError;

/// What to build and where.
#[derive(Debug, Clone)]
pub struct BuildSettings {
    pub recipe_path: PathBuf,
    /// Blob store, layer cache and staging root (`~/.cache/cudastack`).
    pub cache_root: PathBuf,
    /// The OCI layout to write; `images/NAME` when None.
    pub layout_dir: Option<PathBuf>,
    pub compression: Compression,
    /// Use only the blob cache; fail listing what is missing.
    pub offline: bool,
    /// Directories a lock's `file://` URLs may point into (`--mirror`); none by default.
    pub mirrors: Vec<PathBuf>,
    /// Substituted for `{registry}` in tag templates.
    pub registry: String,
    /// Tags given on the command line (`build --tag`, and the name `--push REF` gives the
    /// image), beside the recipe's; each written as a ref of the layout like theirs.
    pub tags: Vec<String>,
    /// The platforms to build; the recipe's `platforms` when None.
    pub platforms: Option<Vec<Platform>>,
    /// How mmdebstrap builds the base (docs/rootless.md); None: root as uid 0, else
    /// unshare when user namespaces work, else fakechroot.
    pub build_mode: Option<crate::base_root::rootless::BuildMode>,
    /// A mirror of the base's archive tried before the lock's URLs (`--apt-mirror`).
    pub apt_mirror: Option<reqwest::Url>,
    /// The keyring that signs `apt_mirror` (`--apt-keyring`; default: the distribution's).
    pub apt_keyring: Option<PathBuf>,
    /// A snapshot service in place of the public ones, or `apt_mirror`'s snapshot root
    /// (`--apt-snapshot`): where the lock's .debs are checked when the archive dropped them.
    pub apt_snapshot: Option<reqwest::Url>,
    /// How long one source build may run before it is killed (`--source-build-timeout`);
    /// `crate::source_build::DEFAULT_SOURCE_BUILD_TIMEOUT` when None. A setting of whoever
    /// runs the build, not of the recipe, which a pull request can change. Read by the
    /// source builds only; here because one `cudastack build` is asked for it with the rest.
    pub source_build_timeout: Option<Duration>,
}

/// Progress lines, one per stage; downloads get their own reporter (bars). Called from
/// the layer writer threads too, hence `Sync`.
pub trait BuildProgress: Send + Sync {
    fn stage(&self, stage: &str, detail: &str);
    fn downloads(&self) -> Arc<dyn Reporter>;
    /// Layer `name`'s blob is in the blob store (built now or cached), while the build may
    /// still be staging and writing the layers above it: an output can start on it (an
    /// upload). Called once per layer, from any thread, in no fixed order.
    #[allow(unused_variables)]
    fn layer_ready(&self, name: &str, layer: &crate::layer::Layer) {}
    /// The layers of one platform's image, by name in their order, and which of them are
    /// cached, before any is produced: an output that takes layers in order (a load) can
    /// start on the lower ones while the upper ones build.
    #[allow(unused_variables)]
    fn layers_planned(&self, names: &[&str], cached: &[bool]) {}
}

/// The timestamp used when neither the recipe nor the environment gives one:
/// 2024-01-01T00:00:00Z. Fixed, so builds stay reproducible; recipes should set their own.
pub const DEFAULT_SOURCE_DATE_EPOCH: u64 = 1_704_067_200;

/// The image's `created` time. With a SOURCE_DATE_EPOCH (the recipe's, or `env_epoch`, the
/// environment's), `epoch`, the time every entry of the team's layers carries. Without one,
/// when the lock was made (`as_of`): the last moment anything in the image was chosen, and
/// an input like the rest, so the image stays reproducible; the fixed default would make
/// `docker images` say "2 years ago" of an image built today. The default when the lock
/// predates `as_of`.
pub(crate) fn image_created(
    recipe: &Recipe,
    env_epoch: Option<&std::ffi::OsStr>,
    as_of: Option<jiff::Timestamp>,
    epoch: u64,
) -> u64 {
    if recipe.source_date_epoch.is_some() || env_epoch.is_some() {
        return epoch;
    }
    as_of
        .and_then(|at| u64::try_from(at.as_second()).ok())
        .unwrap_or(epoch)
}

/// The recipe's `source_date_epoch`, else `$SOURCE_DATE_EPOCH`, else the default. The
/// environment value is checked as the recipe's is: a value that is not a number, or is past
/// year 9999, is an error rather than silently another timestamp.
pub(crate) fn source_date_epoch(recipe: &Recipe) -> Result<u64, BuildError> {
    if let Some(epoch) = recipe.source_date_epoch {
        return Ok(epoch);
    }
    let Some(value) = std::env::var_os("SOURCE_DATE_EPOCH") else {
        return Ok(DEFAULT_SOURCE_DATE_EPOCH);
    };
    let text = value.to_string_lossy();
    let epoch: u64 = text.trim().parse().map_err(|_| {
        BuildError::Unsupported(format!(
            "SOURCE_DATE_EPOCH is `{}`, not a number of seconds since 1970\n  hint: unset it, or set it to e.g. `date -d 2024-06-01 +%s`",
            text.escape_debug()
        ))
    })?;
    crate::recipe::check_source_date_epoch(epoch)
        .map_err(|why| BuildError::Unsupported(format!("SOURCE_DATE_EPOCH: {why}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn recipe(epoch: &str) -> Recipe {
        Recipe::parse(
            &format!("name: t\nbase: {{ debian: bookworm }}\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: {{ version: \"12.4\" }}\n{epoch}"),
            Path::new("t.yaml"),
        )
        .unwrap()
    }

    /// An image built today without a SOURCE_DATE_EPOCH is dated by its lock, not by the
    /// fixed default; an epoch someone set is kept.
    #[test]
    fn an_image_without_an_epoch_is_as_new_as_its_lock() {
        let as_of: jiff::Timestamp = "2026-12-03T11:02:10Z".parse().unwrap();
        let locked = as_of.as_second() as u64;
        let default = DEFAULT_SOURCE_DATE_EPOCH;
        assert_eq!(
            image_created(&recipe(""), None, Some(as_of), default),
            locked
        );
        assert_eq!(image_created(&recipe(""), None, None, default), default);
        let set = recipe("source_date_epoch: 1727740800\n");
        assert_eq!(
            image_created(&set, None, Some(as_of), 1_727_740_800),
            1_727_740_800
        );
        let from_env = std::ffi::OsStr::new("1800000000");
        assert_eq!(
            image_created(&recipe(""), Some(from_env), Some(as_of), 1_800_000_000),
            1_800_000_000
        );
    }
}
