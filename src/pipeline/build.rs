//! The build stage of `cudastack build`: a locked recipe -> an OCI image per platform of
//! layers cut by how often they change, audited, written to an OCI layout. It composes
//! the stages in the order the data flows:
//!
//! ```text
//! recipe, checked against the matrix
//!   -> inputs per platform   stack::prepare_platform (the lock, fetched wheels and .debs)
//!   -> source builds         source_build::add_built_wheels (the `build:` sdists' wheels)
//!   -> assembly              stack::assemble (layers, audit, config, labels)
//!   -> output                stack::write_output (the layout, its refs and tags)
//! ```
//! Every platform's inputs come first, so a platform that cannot work (no kernels for a
//! recipe GPU in its own wheel, a source build that fails) fails before any layer is
//! assembled. The source builds sit between the inputs and the assembly because what they
//! make is an input of the assembly (one more wheel per sdist), while they stage their
//! builder with the assembly's stagers: composing them here keeps the stack free of them.

use std::path::Path;

use super::PipelineError;
use crate::cache::{BlobStore, Staging};
use crate::layer::{BuildOptions, LayerCache};
use crate::matrix::validate::validate;
use crate::matrix::Matrix;
use crate::recipe::{Platform, Recipe};
use crate::source_build::add_built_wheels;
use crate::stack::{
    assemble, prepare_platform, render_tags, source_date_epoch, write_output, BuildEnv, BuildError,
    BuildProgress, BuildReport, BuildSettings,
};

/// Build the image of `settings.recipe`: check the recipe, gather every platform's inputs
/// (with the wheels of its source builds), assemble each platform's layers, write the
/// layout.
pub async fn build(
    settings: &BuildSettings,
    matrix: &Matrix,
    progress: &dyn BuildProgress,
) -> Result<BuildReport, PipelineError> {
    let recipe = load_valid_recipe(settings, matrix)?;
    let platforms = platforms_to_build(settings, &recipe)?;
    let options = BuildOptions::new(source_date_epoch(&recipe)?, settings.compression);
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
            settings, matrix, &recipe, platform, &store, &staging, progress,
        )
        .await?;
        // The wheels of the recipe's `build:` sdists, built or from the cache.
        add_built_wheels(settings, &mut prepared, &store, &env).await?;
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
    Ok(write_output(settings, &recipe, assembled, progress)?)
}

/// The blob store, the layer cache and the staging area of the cache directory `root`;
/// the staging area holds the builds lock for as long as the build runs.
fn open_caches(root: &Path) -> Result<(BlobStore, LayerCache, Staging), BuildError> {
    let store = BlobStore::open(root)?;
    let cache = LayerCache::open(store.clone())?;
    let staging = Staging::open(root)?;
    Ok((store, cache, staging))
}

/// The recipe, valid against the matrix, its tags rendered with this build's `--registry`
/// before anything is fetched.
fn load_valid_recipe(settings: &BuildSettings, matrix: &Matrix) -> Result<Recipe, BuildError> {
    let recipe = Recipe::load(&settings.recipe_path)?;
    let validation = validate(matrix, &recipe);
    if !validation.is_valid() {
        return Err(BuildError::Invalid {
            recipe: recipe.name.clone(),
            problems: validation.errors().cloned().collect(),
        });
    }
    render_tags(
        &settings.recipe_path,
        &recipe,
        None,
        None,
        &settings.registry,
    )?;
    Ok(recipe)
}

/// The platforms asked for (each one the recipe declares), or the recipe's.
fn platforms_to_build(
    settings: &BuildSettings,
    recipe: &Recipe,
) -> Result<Vec<Platform>, BuildError> {
    let Some(requested) = &settings.platforms else {
        return Ok(recipe.platforms());
    };
    let declared = recipe.platforms();
    if let Some(missing) = requested.iter().find(|p| !declared.contains(p)) {
        return Err(BuildError::Unsupported(format!(
            "recipe `{}` is not made for {missing} (its platforms: {}); add it to `platforms:` and run `cudastack lock` again",
            recipe.name,
            declared.iter().map(|p| p.as_str()).collect::<Vec<_>>().join(", ")
        )));
    }
    Ok(requested.clone())
}
