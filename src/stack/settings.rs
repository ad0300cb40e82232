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
}

/// The timestamp used when neither the recipe nor the environment gives one:
/// 2024-01-01T00:00:00Z. Fixed, so builds stay reproducible; recipes should set their own.
pub const DEFAULT_SOURCE_DATE_EPOCH: u64 = 1_704_067_200;

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
