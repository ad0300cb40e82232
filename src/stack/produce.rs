//! Planned layers -> layers, doing as little as the caches allow. A layer whose cache key
//! the layer cache knows is reused without tar or compression work; when every layer, the
//! base's facts and the audit verdict of that set of layers are cached, nothing is staged
//! at all. Otherwise each tree is staged once per key ([`Staging::ensure`]) and walked into
//! a layer. The static audit of the merged tree is cached per set of layer diff_ids.
//!
//! Staging and writing overlap: trees are staged in plan order on the calling
//! thread (an upper stager may read the trees below it), and each staged tree is tarred,
//! compressed and stored on a worker thread while the next one stages. Staging is mostly
//! unzip and disk, writing mostly deflate, so the two share the machine better than they
//! take turns on it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Condvar, Mutex};
use std::thread::{Scope, ScopedJoinHandle};

use crate::audit::kernels::{missing, KernelTable, LibraryKernels};
use crate::audit::{audit_image, AuditOptions, AuditReport, DirFs, FactsFs, ImageFs, LayeredFs};
use crate::cache::Staging;
use crate::digest::Digest;
use crate::elf::fatbin::{DeviceCode, SectionCode};
use crate::layer::{BuildOptions, CacheKey, Layer, LayerContents, LayerError};
use crate::matrix::TorchBuild;
use crate::stack::error::BuildError;
use crate::stack::files::write_record;
use crate::stack::image_config::StackConfig;
use crate::stack::layers::view::{facts_record, has_facts, record_facts, LayerBelow};
use crate::stack::layers::{BuildEnv, LayerStager, Part, StackLayers, WheelMembers};
use crate::stack::report::{human_bytes, AuditSummary, LayerReport};
use crate::target_gpu::TargetGpu;
use crate::version::PtxIsa;

/// Layers tarred and compressed at once. Two keep a writer busy while the next tree stages
/// and bound memory (each writer holds a few MiB of chunks and compressor blocks).
///
/// Each writer keeps the build's full compression thread count rather than half of it: a
/// compressor cannot change its thread count mid-stream, and layers differ a thousandfold
/// in size, so a halved writer (python's 2 GiB tar started beside cudnn's) would run alone
/// on half the cores once its partner is done. Two full writers at most double the
/// threads for a while, which the scheduler shares out; the bytes never depend on it.
const WRITERS: usize = 2;

/// Every layer of `stagers`, from the cache or staged and built, in plan order.
/// `facts_record` is the base's record, which must exist for a build to skip staging.
/// [`crate::stack::BuildProgress::layer_ready`] is called for each layer as soon as its
/// blob is in the store: at once for cached layers, from the writer for built ones. On an
/// error the first one is returned after every writer already started has finished (the
/// layer cache and staging commit whole or not at all, so nothing is left half-written).
pub(crate) fn produce_layers(
    stagers: &[&dyn LayerStager],
    facts_record: &Path,
    env: &BuildEnv,
) -> Result<Vec<(LayerReport, Layer)>, BuildError> {
    let mut cached_layers = Vec::new();
    for stager in stagers {
        cached_layers.push(
            env.cache
                .get(stager.key(), &env.options_for(stager.part()))?,
        );
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
    let names: Vec<&str> = stagers.iter().map(|stager| stager.name()).collect();
    let cached: Vec<bool> = cached_layers.iter().map(Option::is_some).collect();
    env.progress.layers_planned(&names, &cached);
    // Cached blobs are ready before anything stages: a push can start with them.
    for (stager, cached) in stagers.iter().zip(&cached_layers) {
        if let Some(layer) = cached {
            layer_done(stager.name(), layer, true, env);
        }
    }
    if fully_cached {
        // The trees were not opened, but they are still what a rebuild of an upper layer
        // reads: keep their last-use stamps fresh for `cudastack cache prune`.
        for stager in stagers {
            env.staging.touch(stager.key());
        }
        return Ok(stagers
            .iter()
            .zip(cached_layers)
            .filter_map(|(stager, layer)| layer.map(|layer| (report(*stager, &layer, true), layer)))
            .collect());
    }
    let built = std::thread::scope(|scope| stage_and_write(stagers, &cached_layers, env, scope))?;
    Ok(stagers
        .iter()
        .zip(cached_layers)
        .zip(built)
        .filter_map(|((stager, cached), built)| {
            let (layer, was_cached) = match (cached, built) {
                (Some(layer), _) => (layer, true),
                (None, Some(layer)) => (layer, false),
                (None, None) => return None,
            };
            Some((report(*stager, &layer, was_cached), layer))
        })
        .collect())
}

/// Stage every tree and write each uncached layer on a worker of `scope` (at most
/// [`WRITERS`] at once). Two staging lanes (this thread and one more) take the trees in
/// plan order, so the base's mmdebstrap and the wheels' unzip overlap; a tree that reads
/// the trees below it ([`LayerStager::reads_trees_below`]) stages once all of them are
/// staged, and a lane starts a layer's writer as soon as its tree is staged. Returns the
/// built layers by plan index (None for the cached ones), or the first error once every
/// started writer has finished.
fn stage_and_write<'scope, 'env>(
    stagers: &[&dyn LayerStager],
    cached_layers: &[Option<Layer>],
    env: &'env BuildEnv<'env>,
    scope: &'scope Scope<'scope, 'env>,
) -> Result<Vec<Option<Layer>>, BuildError> {
    let lanes = Lanes {
        claimed: stagers.iter().map(|_| AtomicBool::new(false)).collect(),
        staged: Mutex::new(vec![false; stagers.len()]),
        staged_changed: Condvar::new(),
        writers: Mutex::new(Writers::new(stagers.len())),
        panicked: AtomicBool::new(false),
    };
    // A lane that panics must not leave the other waiting for its tree (the scope would
    // then never end): either lane raises the flag as it unwinds, and the scope passes the
    // panic on once the other has returned.
    std::thread::scope(|lane| {
        lane.spawn(|| {
            let _guard = PanicFlag(&lanes.panicked);
            lanes.run(stagers, cached_layers, env, scope)
        });
        let _guard = PanicFlag(&lanes.panicked);
        lanes.run(stagers, cached_layers, env, scope);
    });
    let mut writers = lanes
        .writers
        .into_inner()
        .unwrap_or_else(|e| e.into_inner());
    while !writers.running.is_empty() {
        writers.join_next();
    }
    match writers.first_error {
        Some(error) => Err(error),
        None => Ok(writers.built),
    }
}

/// What the staging lanes share: which trees are claimed and staged, and the writers.
struct Lanes<'scope> {
    claimed: Vec<AtomicBool>,
    staged: Mutex<Vec<bool>>,
    staged_changed: Condvar,
    writers: Mutex<Writers<'scope>>,
    /// A lane panicked.
    panicked: AtomicBool,
}

/// Raises its flag when dropped by a panicking thread.
struct PanicFlag<'a>(&'a AtomicBool);

impl Drop for PanicFlag<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::Release);
        }
    }
}

impl<'scope> Lanes<'scope> {
    /// One lane: claim the next unclaimed tree in plan order, stage it, start its writer.
    fn run<'env>(
        &self,
        stagers: &[&dyn LayerStager],
        cached_layers: &[Option<Layer>],
        env: &'env BuildEnv<'env>,
        scope: &'scope Scope<'scope, 'env>,
    ) {
        for (index, stager) in stagers.iter().enumerate() {
            // A writer that already failed stops the build now, not minutes of staging later.
            if self.failed() {
                return;
            }
            if self.claimed[index].swap(true, Ordering::AcqRel) {
                continue;
            }
            if stager.reads_trees_below() && !self.wait_for_trees_below(index) {
                return;
            }
            match self.open(*stager, cached_layers[index].is_some(), env) {
                Ok(Some(dir)) => {
                    let mut writers = self.lock_writers();
                    spawn_writer(*stager, index, dir, &mut writers, env, scope);
                    drop(writers);
                    self.staged.lock().unwrap_or_else(|e| e.into_inner())[index] = true;
                }
                Ok(None) => self.staged.lock().unwrap_or_else(|e| e.into_inner())[index] = true,
                Err(error) => {
                    self.lock_writers().first_error.get_or_insert(error);
                }
            }
            self.staged_changed.notify_all();
        }
    }

    /// Make the layer readable by the layers above, and its tree ready for its writer when
    /// it is not `cached`: returns the tree to write, if any. A transient tree's facts are
    /// recorded (they are what the layers above read of it) and the tree removed once
    /// nothing needs it: at once when the layer is cached, after its writer otherwise; a
    /// transient layer already written and recorded is not staged at all.
    fn open(
        &self,
        stager: &dyn LayerStager,
        cached: bool,
        env: &BuildEnv,
    ) -> Result<Option<PathBuf>, BuildError> {
        let tree = env.staging.dir(stager.key());
        if stager.transient() && cached && has_facts(&tree) {
            // Its facts are its last use (`cudastack cache prune`), as a tree's marker is.
            crate::cache::touch_last_use(&facts_record(&tree));
            return Ok(None);
        }
        let dir = open_tree(stager, env)?;
        if stager.transient() {
            record_facts(&dir)?;
            if cached {
                env.staging.evict(stager.key())?;
            }
        }
        Ok((!cached).then_some(dir))
    }

    fn lock_writers(&self) -> std::sync::MutexGuard<'_, Writers<'scope>> {
        self.writers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a lane's staging or a writer failed (writers that finished are joined).
    fn failed(&self) -> bool {
        if self.panicked.load(Ordering::Acquire) {
            return true;
        }
        let mut writers = self.lock_writers();
        writers.join_finished();
        writers.first_error.is_some()
    }

    /// Wait until every tree below `index` is staged; false when the build failed meanwhile.
    fn wait_for_trees_below(&self, index: usize) -> bool {
        let mut staged = self.staged.lock().unwrap_or_else(|e| e.into_inner());
        while !staged[..index].iter().all(|done| *done) {
            if self.failed() {
                return false;
            }
            // A writer's failure does not notify: look again now and then.
            staged = self
                .staged_changed
                .wait_timeout(staged, std::time::Duration::from_millis(200))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }
}

/// Write the layer of the staged tree `dir` on a worker of `scope`, once fewer than
/// [`WRITERS`] are running.
fn spawn_writer<'scope, 'env>(
    stager: &dyn LayerStager,
    index: usize,
    dir: PathBuf,
    writers: &mut Writers<'scope>,
    env: &'env BuildEnv<'env>,
    scope: &'scope Scope<'scope, 'env>,
) {
    while writers.running.len() >= WRITERS {
        writers.join_next();
    }
    if writers.first_error.is_some() {
        return;
    }
    env.progress.stage(stager.name(), "writing layer");
    let (name, key, walk) = (stager.name().to_string(), *stager.key(), stager.walk());
    let options = env.options_for(stager.part());
    let wheel_members = stager.records_wheel_members();
    let transient = stager.transient();
    writers.spawn(scope, index, move || {
        let contents = || {
            let mut contents = LayerContents::from_dir(&dir, &walk)?;
            if wheel_members {
                contents.take_from_zip_members(WheelMembers::read(&dir)?.locate()?)?;
            }
            Ok(contents)
        };
        let layer = write_layer(&name, &key, contents, &options, env)?;
        if transient {
            env.staging.evict(&key)?;
        }
        Ok(layer)
    });
}

/// The layer writers running on a scope's threads. Each says when it is done, so the first
/// to finish frees its place: a small layer never waits behind a big one.
struct Writers<'scope> {
    running: Vec<(usize, ScopedJoinHandle<'scope, Result<Layer, BuildError>>)>,
    done_sender: mpsc::Sender<usize>,
    done: mpsc::Receiver<usize>,
    /// The built layers by plan index.
    built: Vec<Option<Layer>>,
    first_error: Option<BuildError>,
}

/// Sends the writer's plan index when dropped: when it returns, and when it panics.
struct DoneSignal {
    index: usize,
    done: mpsc::Sender<usize>,
}

impl Drop for DoneSignal {
    fn drop(&mut self) {
        let _ = self.done.send(self.index);
    }
}

impl<'scope> Writers<'scope> {
    fn new(layers: usize) -> Self {
        let (done_sender, done) = mpsc::channel();
        Self {
            running: Vec::new(),
            done_sender,
            done,
            built: vec![None; layers],
            first_error: None,
        }
    }

    fn spawn<'env>(
        &mut self,
        scope: &'scope Scope<'scope, 'env>,
        index: usize,
        write: impl FnOnce() -> Result<Layer, BuildError> + Send + 'scope,
    ) {
        let signal = DoneSignal {
            index,
            done: self.done_sender.clone(),
        };
        let writer = scope.spawn(move || {
            let _signal = signal;
            write()
        });
        self.running.push((index, writer));
    }

    /// Join every writer that has already finished, without waiting.
    fn join_finished(&mut self) {
        while let Ok(index) = self.done.try_recv() {
            self.join(index);
        }
    }

    /// Wait for the next writer to finish; keep its layer, or its error if none came before.
    fn join_next(&mut self) {
        if self.running.is_empty() {
            return;
        }
        // Never disconnected: `self` keeps a sender.
        let Ok(index) = self.done.recv() else { return };
        self.join(index);
    }

    fn join(&mut self, index: usize) {
        let Some(position) = self.running.iter().position(|(i, _)| *i == index) else {
            return;
        };
        let (_, writer) = self.running.swap_remove(position);
        match writer.join() {
            Ok(Ok(layer)) => self.built[index] = Some(layer),
            Ok(Err(error)) => {
                self.first_error.get_or_insert(error);
            }
            // A panic is a bug: let it through (the scope still waits for the other writer).
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

/// Open the layer's tree, staging it first if no build has.
fn open_tree(stager: &dyn LayerStager, env: &BuildEnv) -> Result<PathBuf, BuildError> {
    if !env.staging.is_complete(stager.key()) {
        env.progress.stage(stager.name(), "staging");
    }
    let dir = env.staging.ensure(stager.key(), |dir| stager.stage(dir))?;
    stager.staged(&dir)?;
    Ok(dir)
}

/// On a writer thread: walk the staged tree into a layer through the layer cache.
fn write_layer(
    name: &str,
    key: &CacheKey,
    contents: impl FnOnce() -> Result<LayerContents, LayerError>,
    options: &BuildOptions,
    env: &BuildEnv,
) -> Result<Layer, BuildError> {
    let layer = env.cache.get_or_build(key, options, contents)?;
    layer_done(name, &layer, false, env);
    Ok(layer)
}

/// The layer's progress line, and the news that its blob is in the store.
fn layer_done(name: &str, layer: &Layer, cached: bool, env: &BuildEnv) {
    env.progress.stage(
        name,
        &format!(
            "{} ({}){}",
            layer.digest,
            human_bytes(layer.size),
            if cached { ", cached" } else { "" }
        ),
    );
    env.progress.layer_ready(name, layer);
}

fn report(stager: &dyn LayerStager, layer: &Layer, cached: bool) -> LayerReport {
    LayerReport {
        name: stager.name().to_string(),
        digest: layer.digest,
        diff_id: layer.diff_id,
        size: layer.size,
        cached,
    }
}

/// What the audit reads and how it judges, as part of its record's name: a record made by
/// another reader (a fatbin entry read differently, a placeholder module counted or not)
/// is not looked at, so a fix in the reader reaches images whose layers did not change.
/// Bump it with any change to what `audit()` finds on the same tree, so a verdict of the
/// old rules is not reused (v4: library copies in `glibc-hwcaps/`, and files answering for
/// a library by their name).
pub(crate) const AUDIT_READER: &str = "v4-hwcaps-names";

/// The audit verdict of one set of layers: `<digest of their diff_ids>.audit.AUDIT_READER.json`.
/// Records since v2 keep the kernel coverage groups; an older record is not
/// looked at, so a build that finds none stages its trees and audits them again.
fn audit_record(staging: &Staging, diff_ids: &[Digest]) -> PathBuf {
    staging.record_path(&format!(
        "{}.audit.{AUDIT_READER}.json",
        Digest::of_bytes(
            serde_json::to_string(diff_ids)
                .unwrap_or_default()
                .as_bytes()
        )
        .hex()
    ))
}

/// The GPUs a build's kernels are checked against (the recipe's `gpus`, as validation
/// resolved them: `ResolvedRecipe::target_gpus`) and the newest PTX ISA its driver floor
/// can JIT-compile.
#[derive(Debug, Clone, Default)]
pub(crate) struct KernelTargets {
    pub gpus: Vec<TargetGpu>,
    pub jit_ptx_isa: Option<PtxIsa>,
}

/// The static audit of the assembled filesystem (every ELF's NEEDED, one copy per SONAME,
/// symlinks, the cuDNN header, the torch build's pins, the GPU code of every library), from
/// its record when this set of layers was audited before. The record keeps the kernel
/// coverage groups, so a cached verdict is still checked against this build's `targets`.
/// Returns the summary and whether it was cached.
pub(crate) fn audit_stack(
    planned: &StackLayers,
    layers: &[(LayerReport, Layer)],
    config: &StackConfig,
    torch_build: Option<&TorchBuild>,
    targets: &KernelTargets,
    env: &BuildEnv,
) -> Result<(AuditSummary, bool), BuildError> {
    // Code that cannot change the verdict is not re-audited: the record of the layers below
    // stands (a code-only rebuild then takes the time of the copy layer alone).
    let mut trees = planned.dirs(env.staging);
    let mut audited = layers.len();
    if let Some(copy) = &planned.copy {
        let all = planned.all();
        let below: Vec<LayerBelow> = all[..all.len() - 1]
            .iter()
            .map(|layer| LayerBelow::of(*layer, env.staging))
            .collect();
        if copy.cannot_change_the_audit(&below)? {
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
    // Every v2 record has the groups; one without is not trusted: audit again.
    if let Some(summary) = fs_err::read(&record)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<AuditSummary>(&bytes).ok())
        .filter(|summary| summary.kernels.is_some())
    {
        check_cached_kernels(&summary, targets)?;
        if audited < layers.len() {
            whole_set(&summary)?;
        }
        return Ok((summary, true));
    }
    env.progress.stage(
        "audit",
        "every ELF's NEEDED, one copy per SONAME, symlinks, cuDNN header, pins, GPU code",
    );
    if let Some(apt) = &planned.apt {
        // The stack's layers above the base, which the apt tree (on top of the base) may
        // add to but not replace.
        let stack: Vec<(&str, Box<dyn ImageFs>)> = planned.stack()[1..]
            .iter()
            .map(|layer| Ok((layer.name(), LayerBelow::of(*layer, env.staging).view()?)))
            .collect::<Result<_, BuildError>>()?;
        let stack: Vec<(&str, &dyn ImageFs)> = stack
            .iter()
            .map(|(name, view)| (*name, view.as_ref()))
            .collect();
        crate::stack::layers::apt::refuse_replacing(&env.staging.dir(apt.key()), &stack)?;
    }
    let views = planned
        .all()
        .into_iter()
        .zip(&trees)
        .map(|(stager, tree)| layer_view(stager, tree))
        .collect::<Result<Vec<_>, _>>()?;
    let merged = LayeredFs::new(views.iter().map(|view| view.as_ref()).collect());
    let ld_library_path = config
        .env
        .iter()
        .find(|(k, _)| k == "LD_LIBRARY_PATH")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    let options = AuditOptions {
        pins: nvidia_pins(torch_build),
        target_gpus: targets.gpus.clone(),
        jit_ptx_isa: targets.jit_ptx_isa,
        ..Default::default()
    }
    .with_ld_library_path(&ld_library_path);
    let report = audit_image(&merged, &options)?;
    if !report.is_clean() {
        return Err(BuildError::AuditFailed(report.render()));
    }
    let summary = AuditSummary {
        elf_files: report.elf_files,
        needed_checked: report.needed_checked,
        symlinks: report.symlinks,
        distributions: report.distributions,
        kernels: Some(report.kernels.groups()),
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

/// How the audit reads one layer. A layer of the stack, or a transient one, through its
/// facts ([`crate::audit::LayerFacts`]), recorded beside its tree the first time: a rebuild
/// that changes the team's layers then reads none of the stack's files again. Any other
/// layer through its staged tree.
fn layer_view(stager: &dyn LayerStager, tree: &Path) -> Result<Box<dyn ImageFs>, BuildError> {
    if stager.part() == Part::Stack || stager.transient() {
        return Ok(Box::new(FactsFs::new(record_facts(tree)?)));
    }
    Ok(Box::new(DirFs::new(tree)))
}

/// A cached verdict against this build's targets: the record keeps the coverage groups,
/// so a change of `gpus:` or `driver_floor:` alone is checked without auditing again.
fn check_cached_kernels(summary: &AuditSummary, targets: &KernelTargets) -> Result<(), BuildError> {
    let groups = summary.kernels.as_deref().unwrap_or_default();
    let findings = missing(groups, &targets.gpus, targets.jit_ptx_isa);
    if findings.is_empty() {
        return Ok(());
    }
    let libraries = groups
        .iter()
        .flat_map(|group| {
            group.libraries.iter().map(|path| LibraryKernels {
                path: path.clone(),
                code: DeviceCode {
                    fatbin: SectionCode {
                        sass: group.sass.clone(),
                        ptx: group.ptx.clone(),
                        ..Default::default()
                    },
                    ..Default::default()
                },
            })
        })
        .collect();
    let report = AuditReport {
        elf_files: summary.elf_files,
        needed_checked: summary.needed_checked,
        symlinks: summary.symlinks,
        distributions: summary.distributions,
        kernels: KernelTable { libraries },
        findings,
    };
    Err(BuildError::AuditFailed(report.render()))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::BlobStore;
    use crate::fetch::progress::{NoReporter, Reporter};
    use crate::layer::{Compression, LayerCache};
    use crate::stack::files::write_file;
    use crate::stack::layers::Part;
    use crate::stack::settings::BuildProgress;
    use std::sync::{Arc, Condvar, Mutex};
    use std::time::Duration;

    /// A layer of one file; `fail` makes its staging fail.
    struct FileLayer {
        name: &'static str,
        key: CacheKey,
        fail: bool,
    }

    impl FileLayer {
        fn new(name: &'static str) -> Self {
            let key = CacheKey::new("produce-test", &[], &name);
            Self {
                name,
                key,
                fail: false,
            }
        }
    }

    impl LayerStager for FileLayer {
        fn name(&self) -> &'static str {
            self.name
        }
        fn part(&self) -> Part {
            Part::Team
        }
        fn key(&self) -> &CacheKey {
            &self.key
        }
        fn stage(&self, dir: &Path) -> Result<(), BuildError> {
            if self.fail {
                return Err(BuildError::Unsupported(format!(
                    "{} cannot stage",
                    self.name
                )));
            }
            // Enough bytes that writing takes a moment.
            let bytes: Vec<u8> = (0..4u32 << 20)
                .map(|i| (i.wrapping_mul(7919) >> 5) as u8)
                .collect();
            write_file(&dir.join(self.name), &bytes)
        }
    }

    /// Records the events, and holds the writer of `hold.0` in `layer_ready` until the line
    /// `hold.1` comes (a test of what proceeds while a layer is written).
    #[derive(Default)]
    struct Events {
        lines: Mutex<Vec<String>>,
        changed: Condvar,
        hold: Option<(&'static str, &'static str)>,
    }

    impl BuildProgress for Events {
        fn stage(&self, stage: &str, detail: &str) {
            self.lines.lock().unwrap().push(format!("{stage} {detail}"));
            self.changed.notify_all();
        }
        fn downloads(&self) -> Arc<dyn Reporter> {
            Arc::new(NoReporter)
        }
        fn layer_ready(&self, name: &str, layer: &Layer) {
            assert!(
                layer.blob.is_file(),
                "{name}: ready before its blob is stored"
            );
            let lines = self.lines.lock().unwrap();
            let mut lines = if let Some((_, until)) = self.hold.filter(|(held, _)| *held == name) {
                let (lines, waited) = self
                    .changed
                    .wait_timeout_while(lines, Duration::from_secs(20), |lines| {
                        !lines.iter().any(|line| line == until)
                    })
                    .unwrap();
                assert!(
                    !waited.timed_out(),
                    "the next layer did not stage while {name} was written"
                );
                lines
            } else {
                lines
            };
            lines.push(format!("ready {name}"));
            self.changed.notify_all();
        }
    }

    fn produce(
        cache_root: &Path,
        stagers: &[&dyn LayerStager],
        progress: &Events,
    ) -> Result<Vec<(LayerReport, Layer)>, BuildError> {
        let store = BlobStore::open(cache_root).unwrap();
        let cache = LayerCache::open(store).unwrap();
        let staging = Staging::open(cache_root).unwrap();
        let env = BuildEnv {
            cache: &cache,
            staging: &staging,
            options: &BuildOptions::new(0, Compression::Gzip { level: 1 }),
            progress,
            build_mode: None,
        };
        produce_layers(stagers, &cache_root.join("no-facts"), &env)
    }

    /// A transient layer (a wheel layer) in the staging lanes: staged, its facts recorded,
    /// written, its tree removed; the layers above still see it through its facts, and a
    /// rebuild with the layer cached does not stage it again. The audit reads a stack
    /// layer from its facts even with its tree gone.
    #[test]
    fn a_transient_tree_is_removed_once_written_and_recorded() {
        use std::sync::atomic::AtomicUsize;
        struct TransientLayer {
            file: FileLayer,
            staged: AtomicUsize,
        }
        impl LayerStager for TransientLayer {
            fn name(&self) -> &str {
                self.file.name
            }
            fn part(&self) -> Part {
                Part::Stack
            }
            fn key(&self) -> &CacheKey {
                &self.file.key
            }
            fn transient(&self) -> bool {
                true
            }
            fn stage(&self, dir: &Path) -> Result<(), BuildError> {
                self.staged.fetch_add(1, Ordering::SeqCst);
                self.file.stage(dir)
            }
        }
        let cache_root = tempfile::tempdir().unwrap();
        let torch = TransientLayer {
            file: FileLayer::new("torch"),
            staged: AtomicUsize::new(0),
        };
        let config = FileLayer::new("config");
        let first = produce(cache_root.path(), &[&torch, &config], &Events::default()).unwrap();
        let staging = Staging::open(cache_root.path()).unwrap();
        let tree = staging.dir(torch.key());
        assert!(!tree.exists(), "the transient tree is still there");
        assert!(crate::stack::layers::view::has_facts(&tree));
        let seen = LayerBelow::of(&torch, &staging).view().unwrap();
        assert!(seen.node(Path::new("/torch")).unwrap().is_some());
        let audited = layer_view(&torch, &tree).unwrap();
        assert!(audited.node(Path::new("/torch")).unwrap().is_some());

        let again = produce(cache_root.path(), &[&torch, &config], &Events::default()).unwrap();
        assert_eq!(torch.staged.load(Ordering::SeqCst), 1, "staged again");
        assert!(again.iter().all(|(report, _)| report.cached));
        let digests =
            |l: &[(LayerReport, Layer)]| l.iter().map(|(r, _)| r.digest).collect::<Vec<_>>();
        assert_eq!(digests(&again), digests(&first));

        // A hand-edited facts record, its tree gone: the layers above get an error, never
        // an empty layer; the next build stages the tree again and records it anew.
        let record = crate::stack::layers::view::facts_record(&tree);
        fs_err::write(&record, b"{ not facts").unwrap();
        let error = LayerBelow::of(&torch, &staging).view().err().unwrap();
        assert!(
            error
                .to_string()
                .contains("neither its tree nor readable facts"),
            "{error}"
        );
        let healed = produce(cache_root.path(), &[&torch, &config], &Events::default()).unwrap();
        assert_eq!(torch.staged.load(Ordering::SeqCst), 2);
        assert_eq!(digests(&healed), digests(&first));
        assert!(crate::stack::layers::view::has_facts(&tree) && !tree.exists());
    }

    /// The recipe's `gpus` by name or capability, as validation resolves them, and the PTX
    /// ISA its driver floor's JIT reads (535 supports CUDA 12.2: ISA 8.2).
    /// A cached audit is checked against this build's GPUs: adding H100 to `gpus:` fails a
    /// build whose layers were audited clean for an RTX 4090.
    #[test]
    fn a_cached_audit_is_checked_against_the_builds_gpus() {
        let group = crate::audit::CoverageGroup {
            sass: ["sm_80".parse().unwrap()].into(),
            ptx: Default::default(),
            libraries: vec!["/usr/lib/libext.so".into()],
        };
        let summary = AuditSummary {
            elf_files: 3,
            needed_checked: 5,
            symlinks: 0,
            distributions: 1,
            kernels: Some(vec![group]),
        };
        let target = |name: &str, cc: &str| TargetGpu {
            name: name.into(),
            cc: cc.parse().unwrap(),
        };
        let rtx_4090 = KernelTargets {
            gpus: vec![target("RTX 4090", "8.9")],
            jit_ptx_isa: Some(PtxIsa::new(8, 2)),
        };
        assert!(check_cached_kernels(&summary, &rtx_4090).is_ok());
        let with_h100 = KernelTargets {
            gpus: vec![target("RTX 4090", "8.9"), target("H100", "9.0")],
            ..rtx_4090
        };
        let error = check_cached_kernels(&summary, &with_h100)
            .unwrap_err()
            .to_string();
        assert!(error.contains("error[missing-kernels]"), "{error}");
        assert!(
            error.contains("libext.so has no kernels for H100 (sm_90)"),
            "{error}"
        );
        assert!(error.contains("1 libraries with GPU code"), "{error}");
    }

    #[test]
    fn the_next_layer_stages_while_one_is_written_and_results_keep_plan_order() {
        let cache = tempfile::tempdir().unwrap();
        let (one, two, three) = (
            FileLayer::new("one"),
            FileLayer::new("two"),
            FileLayer::new("three"),
        );
        let progress = Events {
            hold: Some(("one", "two staging")),
            ..Default::default()
        };
        let layers = produce(cache.path(), &[&one, &two, &three], &progress).unwrap();
        let names: Vec<&str> = layers.iter().map(|(r, _)| r.name.as_str()).collect();
        assert_eq!(names, ["one", "two", "three"]);
        assert!(layers
            .iter()
            .all(|(r, l)| !r.cached && r.digest == l.digest));
        let lines = progress.lines.lock().unwrap().clone();
        for name in ["one", "two", "three"] {
            let ready = format!("ready {name}");
            assert_eq!(
                lines.iter().filter(|l| **l == ready).count(),
                1,
                "{lines:?}"
            );
        }
        // Again: every layer cached, announced once, in the same order.
        let progress = Events::default();
        let again = produce(cache.path(), &[&one, &two, &three], &progress).unwrap();
        assert!(again.iter().all(|(r, _)| r.cached));
        let digests =
            |l: &[(LayerReport, Layer)]| l.iter().map(|(r, _)| r.digest).collect::<Vec<_>>();
        assert_eq!(digests(&again), digests(&layers));
        let ready = progress.lines.lock().unwrap();
        assert_eq!(ready.iter().filter(|l| l.starts_with("ready ")).count(), 3);
    }

    /// Staging events in order: `start NAME`, `end NAME`.
    #[derive(Default)]
    struct StagingLog {
        events: Mutex<Vec<String>>,
        changed: Condvar,
    }

    /// A layer whose staging is logged: it waits for `beside` to start staging (so it can
    /// stage only on a second lane), and when it reads the trees below it checks they are
    /// all staged.
    struct LaneLayer<'a> {
        file: FileLayer,
        reads_below: Option<&'a [&'static str]>,
        beside: Option<&'static str>,
        log: &'a StagingLog,
    }

    impl LayerStager for LaneLayer<'_> {
        fn name(&self) -> &str {
            self.file.name
        }
        fn part(&self) -> Part {
            Part::Team
        }
        fn key(&self) -> &CacheKey {
            &self.file.key
        }
        fn reads_trees_below(&self) -> bool {
            self.reads_below.is_some()
        }
        fn stage(&self, dir: &Path) -> Result<(), BuildError> {
            let name = self.file.name;
            let mut events = self.log.events.lock().unwrap();
            events.push(format!("start {name}"));
            self.log.changed.notify_all();
            if let Some(other) = self.beside {
                let started = format!("start {other}");
                let (waited, timeout) = self
                    .log
                    .changed
                    .wait_timeout_while(events, Duration::from_secs(20), |events| {
                        !events.contains(&started)
                    })
                    .unwrap();
                assert!(!timeout.timed_out(), "{other} did not stage beside {name}");
                events = waited;
            }
            for below in self.reads_below.unwrap_or_default() {
                assert!(
                    events.contains(&format!("end {below}")),
                    "{name} staged before {below}: {events:?}"
                );
            }
            drop(events);
            let staged = self.file.stage(dir);
            self.log.events.lock().unwrap().push(format!("end {name}"));
            self.log.changed.notify_all();
            staged
        }
    }

    /// Trees that read none below stage two at a time (each of the first two waits for
    /// the other to start); one that reads the trees below waits for all of them; a tree
    /// that fails stops the build with its error while the other lane waits.
    #[test]
    fn independent_trees_stage_beside_each_other_and_dependent_ones_wait() {
        let log = StagingLog::default();
        let layer = |name, reads_below, beside| LaneLayer {
            file: FileLayer::new(name),
            reads_below,
            beside,
            log: &log,
        };
        let (base, cuda) = (
            layer("base", None, Some("cuda")),
            layer("cuda", None, Some("base")),
        );
        let torch = layer("torch", None, None);
        let python = layer("python", Some(&["base", "cuda", "torch"][..]), None);
        let config = layer(
            "config",
            Some(&["base", "cuda", "torch", "python"][..]),
            None,
        );
        let cache = tempfile::tempdir().unwrap();
        let stagers: [&dyn LayerStager; 5] = [&base, &cuda, &torch, &python, &config];
        let layers = produce(cache.path(), &stagers, &Events::default()).unwrap();
        let names: Vec<&str> = layers.iter().map(|(r, _)| r.name.as_str()).collect();
        assert_eq!(names, ["base", "cuda", "torch", "python", "config"]);

        // A failed tree below: the dependent tree never stages, the build ends with the error.
        let log = StagingLog::default();
        let layer = |name, reads_below| LaneLayer {
            file: FileLayer::new(name),
            reads_below,
            beside: None,
            log: &log,
        };
        let mut broken = layer("broken-torch", None);
        broken.file.fail = true;
        let (base, cuda) = (layer("base", None), layer("cuda", None));
        let python = layer("python", Some(&["base", "cuda", "broken-torch"][..]));
        let cache = tempfile::tempdir().unwrap();
        let stagers: [&dyn LayerStager; 4] = [&base, &cuda, &broken, &python];
        let error = produce(cache.path(), &stagers, &Events::default())
            .unwrap_err()
            .to_string();
        assert!(error.contains("broken-torch cannot stage"), "{error}");
        let events = log.events.lock().unwrap();
        assert!(!events.contains(&"start python".to_string()), "{events:?}");
    }

    /// A big layer still being written does not keep the next layer waiting for a writer
    /// when the small one written beside it is done.
    #[test]
    fn a_finished_writer_frees_its_place_while_an_older_one_still_writes() {
        let cache = tempfile::tempdir().unwrap();
        let (big, small, third) = (
            FileLayer::new("big"),
            FileLayer::new("small"),
            FileLayer::new("third"),
        );
        let progress = Events {
            hold: Some(("big", "ready third")),
            ..Default::default()
        };
        let layers = produce(cache.path(), &[&big, &small, &third], &progress).unwrap();
        assert_eq!(layers.len(), 3);
    }

    #[test]
    fn a_failed_staging_waits_for_the_writer_and_leaves_no_half_written_layer() {
        let cache = tempfile::tempdir().unwrap();
        let one = FileLayer::new("one");
        let two = FileLayer {
            fail: true,
            ..FileLayer::new("two")
        };
        let progress = Events::default();
        let error = produce(cache.path(), &[&one, &two], &progress).unwrap_err();
        assert!(error.to_string().contains("two cannot stage"), "{error}");
        // The writer of `one` finished before the error came back: its layer is whole in
        // the cache, and no temp file or tree of `two` is left.
        let lines = progress.lines.lock().unwrap().clone();
        assert!(lines.contains(&"ready one".to_string()), "{lines:?}");
        let store = BlobStore::open(cache.path()).unwrap();
        let cache_index = LayerCache::open(store.clone()).unwrap();
        let options = BuildOptions::new(0, Compression::Gzip { level: 1 });
        assert!(cache_index.get(one.key(), &options).unwrap().is_some());
        assert_eq!(fs_err::read_dir(store.tmp_dir()).unwrap().count(), 0);
        let staging = Staging::open(cache.path()).unwrap();
        assert!(!staging.dir(two.key()).exists() && !staging.is_complete(two.key()));
    }
}
