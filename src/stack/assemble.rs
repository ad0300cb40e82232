//! One platform's image from its inputs: plan the layers, produce them (cached, or staged
//! and written), audit the merged tree, and make the image value with its config and
//! labels. The layout is written by [`super::output`] once every platform is assembled.
//!
//! Each layer has a cache key over exactly the inputs that decide its contents (the
//! assembler version, the digests of the artifacts it reads, the options), so a changed
//! torch version rebuilds only the Python and config layers, and a no-op rebuild does no
//! tar or compression work at all. Staged trees are kept per key under the cache so the
//! static audit can look at the whole filesystem without unpacking blobs again; when every
//! layer and the audit verdict are cached, nothing is staged.

use crate::base_root::RootfsFacts;
use crate::labels;
use crate::layer::Layer;
use crate::oci::{self, Image};
use crate::recipe::Platform;
use crate::stack::error::BuildError;
use crate::stack::image_config::{stack_config, StackConfig, StackFacts};
use crate::stack::layers::{BuildEnv, StackLayers};
use crate::stack::output::Assembled;
use crate::stack::prepare::PlatformInputs;
use crate::stack::produce::{audit_stack, produce_layers, KernelTargets};
use crate::stack::report::{BuiltFrom, LayerReport};
use crate::stack::settings::image_created;

/// One platform's image: its layers (cached or staged), the config, the audit.
pub(crate) fn assemble(inputs: &PlatformInputs, env: &BuildEnv) -> Result<Assembled, BuildError> {
    let planned = StackLayers::plan(inputs, env)?;
    let layers = produce_layers(&planned.all(), planned.base.facts_record(), env)?;
    let created = image_created(
        inputs.recipe,
        std::env::var_os("SOURCE_DATE_EPOCH").as_deref(),
        inputs.lock.as_of,
        env.options.mtime,
    );
    let facts = stack_facts(inputs, &planned.base.facts(), created);
    let torch_build = inputs.torch_build.as_ref();
    let config = stack_config(inputs.resolved, torch_build, &facts, inputs.arch());
    let targets = KernelTargets {
        gpus: inputs.resolved.target_gpus().to_vec(),
        jit_ptx_isa: inputs.resolved.jit_ptx_isa(),
    };
    let (audit, audit_cached) =
        audit_stack(&planned, &layers, &config, torch_build, &targets, env)?;
    let groups = audit.kernels.as_deref().unwrap_or_default();
    let config = config
        .with_kernel_labels(groups, targets.jit_ptx_isa)
        .with_start_guard(inputs.resolved, torch_build, groups);
    let image = with_built_labels(image_of(inputs.platform, &layers, &config, created), inputs);
    Ok(Assembled {
        platform: inputs.platform,
        image: image.clone(),
        layers: layers.into_iter().map(|(report, _)| report).collect(),
        audit,
        audit_cached,
        facts,
        built_from: BuiltFrom {
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

/// What the labels record about the assembled stack, `created` at that time.
fn stack_facts(inputs: &PlatformInputs, base: &RootfsFacts, created: u64) -> StackFacts {
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
        created: oci::rfc3339(created),
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

/// The image of `layers` with the stack's config, `created` at that time.
fn image_of(
    platform: Platform,
    layers: &[(LayerReport, Layer)],
    config: &StackConfig,
    created: u64,
) -> Image {
    let mut image =
        Image::new(created).with_platform(platform.to_oci_arch(), oci_spec::image::Os::Linux);
    for (report, layer) in layers {
        image = image.with_layer(layer.clone(), &labels::layer_created_by(&report.name));
    }
    for (name, value) in &config.env {
        image = image.with_env(name, value);
    }
    for (name, value) in &config.labels {
        image = image.with_label(name, value);
    }
    let diff_ids: Vec<_> = layers.iter().map(|(_, layer)| layer.diff_id).collect();
    if let Some(top) = oci::chain_ids(&diff_ids).last() {
        image = image.with_label(labels::LAYERS, &top.to_string());
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
