//! The build stage of `cudastack build`: a locked recipe -> an OCI image per platform of
//! layers cut by how often they change, audited, written to an OCI layout. It composes
//! the stages in the order the data flows:
//!
//! ```text
//! recipe, resolved once     matrix::ResolvedRecipe (validated: platforms, GPUs, torch build)
//!   -> inputs per platform   stack::prepare_platform (the lock, fetched wheels and .debs)
//!   -> source builds         source_build::add_built_wheels (the `build:` sdists' wheels,
//!                            fetched from and shared through `--wheel-cache`: shared_wheels)
//!   -> assembly              stack::assemble (layers, audit, config, labels)
//!   -> output                stack::write_output (the layout, its refs and tags)
//! ```
//! Every platform's inputs come first, so a platform that cannot work (no kernels for a
//! recipe GPU in its own wheel, a source build that fails) fails before any layer is
//! assembled. The source builds sit between the inputs and the assembly because what they
//! make is an input of the assembly (one more wheel per sdist), while they stage their
//! builder with the assembly's stagers: composing them here keeps the stack free of them.

use std::path::Path;

use super::shared_wheels::SharedWheels;
use super::PipelineError;
use crate::cache::{BlobStore, Staging};
use crate::layer::{BuildOptions, LayerCache};
use crate::matrix::{Matrix, ResolveError, ResolvedRecipe};
use crate::recipe::Platform;
use crate::source_build::{add_built_wheels, plan_builds};
use crate::stack::{
    assemble, image_tags, prepare_platform, source_date_epoch, write_output, BuildEnv, BuildError,
    BuildProgress, BuildReport, BuildSettings,
};

/// The recipe of a build, read and checked once: an invalid recipe stops here with every
/// problem validation found, before anything is fetched.
pub fn resolve_for_build(path: &Path, matrix: &Matrix) -> Result<ResolvedRecipe, BuildError> {
    ResolvedRecipe::load(path, matrix).map_err(|error| match error {
        ResolveError::Recipe(error) => BuildError::Recipe(error),
        ResolveError::Invalid(invalid) => BuildError::Invalid {
            recipe: invalid.recipe.name.clone(),
            problems: invalid.errors().cloned().collect(),
        },
    })
}

/// Build the image of `resolved` (the recipe at `settings.recipe_path`): gather every
/// platform's inputs (with the wheels of its source builds, fetched from and shared
/// through `wheel_cache` when there is one), assemble each platform's layers, write the
/// layout.
pub async fn build(
    settings: &BuildSettings,
    resolved: &ResolvedRecipe,
    matrix: &Matrix,
    wheel_cache: Option<&SharedWheels>,
    progress: &dyn BuildProgress,
) -> Result<BuildReport, PipelineError> {
    let recipe = resolved.recipe();
    check_tags(settings, resolved)?;
    let platforms = platforms_to_build(settings, resolved)?;
    let options = BuildOptions::new(source_date_epoch(recipe)?, settings.compression);
    let (store, cache, staging) = open_caches(&settings.cache_root)?;
    let env = BuildEnv {
        cache: &cache,
        staging: &staging,
        options: &options,
        progress,
        build_mode: settings.build_mode,
    };
    let several = platforms.len() > 1;
    let mut inputs = Vec::new();
    for &platform in &platforms {
        if several {
            progress.stage("platform", platform.as_str());
        }
        let mut prepared = prepare_platform(
            settings, matrix, resolved, platform, &store, &staging, progress,
        )
        .await?;
        // The wheels of the recipe's `build:` sdists, built or from a cache.
        let planned = plan_builds(&prepared)?;
        if let (Some(shared), false) = (wheel_cache, planned.is_empty()) {
            shared
                .fetch_missing(&settings.cache_root, &planned, &store, progress)
                .await;
        }
        add_built_wheels(settings, &mut prepared, planned.clone(), &store, &env).await?;
        if let (Some(shared), false) = (wheel_cache, planned.is_empty()) {
            shared.share(&settings.cache_root, &planned, progress).await;
        }
        inputs.push(prepared);
    }
    let mut assembled = Vec::new();
    for platform_inputs in &inputs {
        if several {
            progress.stage("platform", &format!("{}: layers", platform_inputs.platform));
        }
        // Heavy work runs on blocking threads.
        assembled.push(tokio::task::block_in_place(|| {
            assemble(platform_inputs, &env)
        })?);
    }
    Ok(write_output(settings, recipe, assembled, progress)?)
}

/// The blob store, the layer cache and the staging area of the cache directory `root`;
/// the staging area holds the builds lock for as long as the build runs.
fn open_caches(root: &Path) -> Result<(BlobStore, LayerCache, Staging), BuildError> {
    let store = BlobStore::open(root)?;
    let cache = LayerCache::open(store.clone())?;
    let staging = Staging::open(root)?;
    Ok((store, cache, staging))
}

/// The image's tags (the recipe's with this build's `--registry`, and `--tag`'s) render:
/// checked before anything is fetched.
fn check_tags(settings: &BuildSettings, resolved: &ResolvedRecipe) -> Result<(), BuildError> {
    image_tags(settings, resolved.recipe(), None, None)?;
    Ok(())
}

/// The platforms asked for (each one the recipe declares), or the recipe's.
fn platforms_to_build(
    settings: &BuildSettings,
    resolved: &ResolvedRecipe,
) -> Result<Vec<Platform>, BuildError> {
    let declared = resolved.platforms();
    let Some(requested) = &settings.platforms else {
        return Ok(declared.to_vec());
    };
    if let Some(missing) = requested.iter().find(|p| !declared.contains(p)) {
        return Err(BuildError::Unsupported(format!(
            "recipe `{}` is not made for {missing} (its platforms: {}); add it to `platforms:` and run `cudastack lock` again",
            resolved.recipe().name,
            declared.iter().map(|p| p.as_str()).collect::<Vec<_>>().join(", ")
        )));
    }
    Ok(requested.clone())
}
