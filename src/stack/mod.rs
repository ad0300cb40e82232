//! The assembly: a validated, locked recipe's inputs -> the layers of a CUDA stack, in the
//! order that lets images share prefixes (base -> CUDA toolkit -> cuDNN -> Python wheels ->
//! config), audited, written to an OCI layout.
//!
//! The stage's steps, which `crate::pipeline::build` calls in order: [`prepare`] each
//! platform's inputs (lock, fetched wheels and .debs, the torch wheel's arch list), then
//! (after the source builds added their wheels) [`assemble`] each platform's image: plan
//! the [`layers`] (one module per layer kind, each holding its stager and its mechanics:
//! `layers::toolkit::layout` lays wheels out as NVIDIA's installers do,
//! `layers::copy::dockerignore` reads the build context's ignore file), [`produce`] them
//! through the layer cache and the cache's staging area (what the stagers write there is
//! [`files`]), audit, and make the image with its [`image_config`] (environment, labels,
//! command; the start-time [`guard`] in front of the entrypoint when asked); finally write the [`output`]. The base root itself (mmdebstrap, foreign
//! architectures, rootless builds, the loader cache writer) is `crate::base_root`'s job,
//! how the cache directory keeps things is `crate::cache`'s, and compiling the recipe's
//! `build:` sdists is `crate::source_build`'s, which stages its builder with this
//! module's stagers and so sits above it.
mod assemble;
mod error;
mod files;
pub mod guard;
pub mod image_config;
pub mod layers;
mod output;
mod prepare;
mod produce;
mod report;
mod settings;
mod tree_diff;

pub use error::BuildError;
pub use output::{image_tags, platform_ref, render_tags, DEFAULT_TAG};
pub use prepare::host_platform;
pub use report::{human_bytes, AuditSummary, BuildReport, BuiltFrom, LayerReport, PlatformReport};
pub use settings::{BuildProgress, BuildSettings, DEFAULT_SOURCE_DATE_EPOCH};

// The steps the pipeline composes, and what the source builds reuse of the inputs.
pub(crate) use assemble::assemble;
pub(crate) use layers::{BuildEnv, StackLayers};
pub(crate) use output::write_output;
pub(crate) use prepare::{
    fetch_deb_files, link_wheel, prepare_platform, FetchedWheel, PlatformInputs,
};
pub(crate) use settings::source_date_epoch;
