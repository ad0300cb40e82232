//! `cudastack build`: a validated, locked recipe -> an OCI image of layers cut by how often
//! they change (base, apt, the CUDA toolkit, cuDNN, torch and other large wheels, the rest of
//! the stack, user, the recipe's packages, config with the verification probe, code),
//! audited, written to an OCI layout.
//!
//! Each layer has a cache key over exactly the inputs that decide its contents (the
//! assembler version, the digests of the artifacts it reads, the options), so a changed
//! torch version rebuilds only the Python and config layers, and a no-op rebuild does no
//! tar or compression work at all. Staged trees are kept per key under the cache so the
//! static audit can look at the whole filesystem without unpacking blobs again; when every
//! layer and the audit verdict are cached, nothing is staged.

use crate::base_root::RootfsFacts;
use crate::cache::BlobStore;
use crate::cache::Staging;
use crate::labels;
use crate::layer::{BuildOptions, Layer, LayerCache};
use crate::matrix::validate::validate;
use crate::matrix::Matrix;
use crate::oci::{self, Image};
use crate::recipe::{Platform, Recipe};
use crate::stack::image_config::{stack_config, StackConfig, StackFacts};
use crate::stack::layers::{BuildEnv, StackLayers};
use crate::stack::output::{write_output, Assembled};
use crate::stack::prepare::{prepare_platform, PlatformInputs};
use crate::stack::produce::{audit_stack, produce_layers, KernelTargets};
use crate::stack::source_build::add_built_wheels;

pub use crate::stack::error::BuildError;
pub use crate::stack::output::{platform_ref, render_tags};
pub use crate::stack::prepare::host_platform;
pub use crate::stack::report::{
    human_bytes, AuditSummary, BuildReport, BuiltFrom, LayerReport, PlatformReport,
};
use crate::stack::settings::source_date_epoch;
pub use crate::stack::settings::{BuildProgress, BuildSettings, DEFAULT_SOURCE_DATE_EPOCH};

/// Build the image of `settings.recipe`: check the recipe, gather every platform's inputs,
/// assemble each platform's layers, write the layout.
pub async fn build(
    settings: &BuildSettings,
    matrix: &Matrix,
    progress: &dyn BuildProgress,
) -> Result<BuildReport, BuildError> {
    let recipe = load_valid_recipe(settings, matrix)?;
    let platforms = platforms_to_build(settings, &recipe)?;
    let options = BuildOptions::new(source_date_epoch(&recipe)?, settings.compression);
    let store = BlobStore::open(&settings.cache_root)?;
    let cache = LayerCache::open(store.clone())?;
    let staging = Staging::open(&settings.cache_root)?;
    let several = platforms.len() > 1;
    let env = BuildEnv {
        cache: &cache,
        staging: &staging,
        options: &options,
        progress,
        build_mode: settings.build_mode,
    };
    // Every platform's lock and artifacts first, so a platform that cannot work (no kernels
    // for a recipe GPU in its own wheel) fails before any layer is assembled.
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
    write_output(settings, &recipe, assembled, progress)
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

/// One platform's image: its layers (cached or staged), the config, the audit.
fn assemble(inputs: &PlatformInputs, env: &BuildEnv) -> Result<Assembled, BuildError> {
    let planned = StackLayers::plan(inputs, env)?;
    let layers = produce_layers(&planned.all(), planned.base.facts_record(), env)?;
    let facts = stack_facts(inputs, &planned.base.facts(), env.options.mtime);
    let torch_build = inputs.torch_build.as_ref();
    let config = stack_config(
        inputs.matrix,
        inputs.recipe,
        torch_build,
        &facts,
        inputs.arch(),
    );
    let targets = KernelTargets::of(inputs.matrix, inputs.recipe)?;
    let (audit, audit_cached) =
        audit_stack(&planned, &layers, &config, torch_build, &targets, env)?;
    let config = config.with_kernel_labels(
        audit.kernels.as_deref().unwrap_or_default(),
        targets.jit_ptx_isa,
    );
    let image = with_built_labels(
        image_of(inputs.platform, &layers, &config, env.options.mtime),
        inputs,
    );
    Ok(Assembled {
        platform: inputs.platform,
        image: image.clone(),
        layers: layers.into_iter().map(|(report, _)| report).collect(),
        audit,
        audit_cached,
        facts,
        built_from: crate::stack::report::BuiltFrom {
            lock: Some(inputs.lock.clone()),
            wheel_files: inputs
                .wheels
                .iter()
                .map(|(name, wheel)| (name.clone(), wheel.path.clone()))
                .collect(),
            targets: targets.gpus.clone(),
            image: Some(image),
        },
    })
}

/// What the labels record about the assembled stack.
fn stack_facts(inputs: &PlatformInputs, base: &RootfsFacts, mtime: u64) -> StackFacts {
    let version_of = |pick: &dyn Fn(&str) -> bool| {
        inputs
            .lock
            .artifacts
            .iter()
            .find(|a| pick(&a.name))
            .map(|a| a.version.clone())
    };
    StackFacts {
        cuda_runtime: inputs
            .torch_build
            .as_ref()
            .and_then(|b| b.cuda_runtime.clone())
            .or_else(|| version_of(&|name| name.starts_with("nvidia-cuda-runtime"))),
        cudnn: version_of(&|name| name.starts_with("nvidia-cudnn")),
        torch: version_of(&|name| name == "torch"),
        os: base.os.clone(),
        created: oci::rfc3339(mtime),
    }
}

/// The wheels compiled from the recipe's `build:` sdists, recorded on the image:
/// `io.cudastack.built.<name>` = `<version> <wheel file> <sha256>`, as the lock records the
/// sdist and the image holds what was built from it.
fn with_built_labels(mut image: Image, inputs: &PlatformInputs) -> Image {
    let sdists = inputs
        .lock
        .artifacts
        .iter()
        .filter(|a| a.kind == crate::lock::ArtifactKind::Sdist);
    for sdist in sdists {
        if let Some(wheel) = inputs.wheels.get(&sdist.name) {
            let file = wheel
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            image = image.with_label(
                &format!("{}{}", labels::BUILT_PREFIX, sdist.name),
                &format!("{} {file} {}", sdist.version, wheel.sha256),
            );
        }
    }
    image
}

/// The image of `layers` with the stack's config.
fn image_of(
    platform: Platform,
    layers: &[(LayerReport, Layer)],
    config: &StackConfig,
    mtime: u64,
) -> Image {
    let mut image =
        Image::new(mtime).with_platform(platform.to_oci_arch(), oci_spec::image::Os::Linux);
    for (report, layer) in layers {
        image = image.with_layer(layer.clone(), &format!("cudastack {} layer", report.name));
    }
    for (name, value) in &config.env {
        image = image.with_env(name, value);
    }
    for (name, value) in &config.labels {
        image = image.with_label(name, value);
    }
    if !config.entrypoint.is_empty() {
        image = image.with_entrypoint(config.entrypoint.clone());
    }
    if let Some(dir) = &config.working_dir {
        image = image.with_working_dir(dir);
    }
    if let Some(cmd) = &config.cmd {
        image = image.with_cmd(cmd.clone());
    }
    let (user, ports) = (config.user.clone(), config.exposed_ports.clone());
    image.with_config(|oci| {
        if user.is_some() {
            oci.set_user(user);
        }
        if !ports.is_empty() {
            oci.set_exposed_ports(Some(ports));
        }
    })
}
