//! Planned layers -> layers, doing as little as the caches allow. A layer whose cache key
//! the layer cache knows is reused without tar or compression work; when every layer, the
//! base's facts and the audit verdict of that set of layers are cached, nothing is staged
//! at all. Otherwise each tree is staged once per key ([`Staging::ensure`]) and walked into
//! a layer. The static audit of the merged tree is cached per set of layer diff_ids.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::audit::{audit, AuditOptions};
use crate::digest::Digest;
use crate::layer::{Layer, LayerContents};
use crate::matrix::TorchBuild;
use crate::stack::config::StackConfig;
use crate::stack::error::BuildError;
use crate::stack::layers::{BuildEnv, LayerStager, StackLayers};
use crate::stack::report::{human_bytes, AuditSummary, LayerReport};
use crate::stack::staging::{merge_trees, write_record, Staging};

/// Every layer of `stagers`, from the cache or staged and built. `facts_record` is the
/// base's record, which must exist for a build to skip staging.
pub(crate) fn produce_layers(
    stagers: &[&dyn LayerStager],
    facts_record: &Path,
    env: &BuildEnv,
) -> Result<Vec<(LayerReport, Layer)>, BuildError> {
    let mut cached_layers = Vec::new();
    for stager in stagers {
        cached_layers.push(env.cache.get(stager.key(), env.options)?);
    }
    // When every layer and the audit verdict are cached there is nothing to stage.
    let fully_cached = cached_layers.iter().all(Option::is_some)
        && audit_record(
            env.staging,
            &cached_layers
                .iter()
                .flatten()
                .map(|l| l.diff_id)
                .collect::<Vec<_>>(),
        )
        .exists()
        && facts_record.exists();
    let mut layers = Vec::new();
    for (stager, cached) in stagers.iter().zip(cached_layers) {
        let (layer, was_cached) = match cached {
            Some(layer) if fully_cached => (layer, true),
            cached => stage_and_build(*stager, cached, env)?,
        };
        env.progress.stage(
            stager.name(),
            &format!(
                "{} ({}){}",
                layer.digest,
                human_bytes(layer.size),
                if was_cached { ", cached" } else { "" }
            ),
        );
        env.progress.layer_ready(stager.name(), &layer);
        let report = LayerReport {
            name: stager.name(),
            digest: layer.digest,
            diff_id: layer.diff_id,
            size: layer.size,
            cached: was_cached,
        };
        layers.push((report, layer));
    }
    Ok(layers)
}

/// Open (staging if needed) the layer's tree, and build the layer from it unless `cached`.
fn stage_and_build(
    stager: &dyn LayerStager,
    cached: Option<Layer>,
    env: &BuildEnv,
) -> Result<(Layer, bool), BuildError> {
    if !env.staging.is_complete(stager.key()) {
        env.progress.stage(stager.name(), "staging");
    }
    let dir = env.staging.ensure(stager.key(), |dir| stager.stage(dir))?;
    stager.staged(&dir)?;
    match cached {
        Some(layer) => Ok((layer, true)),
        None => {
            env.progress.stage(stager.name(), "writing layer");
            let contents = LayerContents::from_dir(&dir, &stager.walk())?;
            let layer = env
                .cache
                .get_or_build(stager.key(), env.options, || Ok(contents))?;
            Ok((layer, false))
        }
    }
}

/// The audit verdict of one set of layers: `<digest of their diff_ids>.audit.json`.
fn audit_record(staging: &Staging, diff_ids: &[Digest]) -> PathBuf {
    staging.record_path(&format!(
        "{}.audit.json",
        Digest::of_bytes(
            serde_json::to_string(diff_ids)
                .unwrap_or_default()
                .as_bytes()
        )
        .hex()
    ))
}

/// The static audit of the assembled filesystem (every ELF's NEEDED, one copy per SONAME,
/// symlinks, the cuDNN header, the torch build's pins), from its record when this set of
/// layers was audited before. Returns the summary and whether it was cached.
pub(crate) fn audit_stack(
    planned: &StackLayers,
    layers: &[(LayerReport, Layer)],
    config: &StackConfig,
    torch_build: Option<&TorchBuild>,
    env: &BuildEnv,
) -> Result<(AuditSummary, bool), BuildError> {
    // Code that cannot change the verdict is not re-audited: the record of the layers below
    // stands (a code-only rebuild then takes the time of the copy layer alone).
    let mut trees = planned.dirs(env.staging);
    let mut audited = layers.len();
    if let Some(copy) = &planned.copy {
        if copy.cannot_change_the_audit(&trees[..trees.len() - 1])? {
            audited -= 1;
            trees.pop();
        }
    }
    let diff_ids: Vec<Digest> = layers[..audited]
        .iter()
        .map(|(report, _)| report.diff_id)
        .collect();
    let record = audit_record(env.staging, &diff_ids);
    // The verdict also stands for the whole set, so a no-op rebuild finds it and stages
    // nothing (produce_layers looks for the record of every layer).
    let whole_set = |summary: &AuditSummary| -> Result<(), BuildError> {
        let all: Vec<Digest> = layers.iter().map(|(report, _)| report.diff_id).collect();
        write_record(
            &audit_record(env.staging, &all),
            &serde_json::to_vec(summary).expect("summary serialises"),
        )
    };
    if let Some(summary) = fs_err::read(&record)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<AuditSummary>(&bytes).ok())
    {
        if audited < layers.len() {
            whole_set(&summary)?;
        }
        return Ok((summary, true));
    }
    env.progress.stage(
        "audit",
        "every ELF's NEEDED, one copy per SONAME, symlinks, cuDNN header, pins",
    );
    let scratch = env.staging.scratch(planned.config.key(), "audit")?;
    let merged = scratch.path();
    merge_trees(
        &trees.iter().map(PathBuf::as_path).collect::<Vec<_>>(),
        merged,
    )?;
    let ld_library_path = config
        .env
        .iter()
        .find(|(k, _)| k == "LD_LIBRARY_PATH")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    let options = AuditOptions {
        pins: nvidia_pins(torch_build),
        ..Default::default()
    }
    .with_ld_library_path(&ld_library_path);
    let report = audit(merged, &options);
    drop(scratch);
    let report = report?;
    if !report.is_clean() {
        return Err(BuildError::AuditFailed(report.render()));
    }
    let summary = AuditSummary {
        elf_files: report.elf_files,
        needed_checked: report.needed_checked,
        symlinks: report.symlinks,
        distributions: report.distributions,
    };
    write_record(
        &record,
        &serde_json::to_vec(&summary).expect("summary serialises"),
    )?;
    if audited < layers.len() {
        whole_set(&summary)?;
    }
    Ok((summary, false))
}

/// The nvidia-* pins of the torch build, as exact versions (`12.1.105`, not `12.1.105.*`).
fn nvidia_pins(torch_build: Option<&TorchBuild>) -> BTreeMap<String, String> {
    torch_build
        .map(|b| {
            b.pins
                .iter()
                .filter(|(k, _)| k.starts_with("nvidia-"))
                .map(|(k, v)| (k.clone(), v.trim_end_matches(".*").to_string()))
                .collect()
        })
        .unwrap_or_default()
}
