//! Loading an image into the daemon: a docker-archive written on the fly into the
//! request body, skipped entirely when the daemon already has the image.
//!
//! The image is loaded as it is stored ([`StoredImage`]): the daemon gets the manifest and
//! config bytes of the layout, so its image ID is the layout's config digest whoever wrote
//! the layout. The archive is produced by [`oci::docker_archive::write_stored`] on a thread
//! that fills a
//! bounded channel of 1 MiB chunks; the request body reads that channel. Nothing but a few
//! chunks is ever in memory, and no temp file is written. The daemon's image ID is the
//! config digest, so `GET /images/sha256:<config>/json` answering 200 means the image is
//! there and only the tags need setting (a sub-second path, whatever the image's size).
//! Docker 20.10 answers a load only after reading the whole upload, so the load request
//! runs without bollard's 120 s timeout (CRATES.md pitfall 3).
//!
//! A load is all or nothing. The tags are checked against the daemon's own
//! grammar before anything is sent ([`super::split_tag`]): Docker creates the image before
//! it parses the archive's RepoTags, so a tag it refuses used to leave the image untagged.
//! Any failure after the upload began removes the image if it was not there before (the
//! daemon names it only by ID then). SIGINT, SIGTERM or SIGHUP during a load end the
//! upload early (the daemon rejects a truncated tar before creating anything), wait for
//! the daemon's answer (it may have had the whole upload already and created the image)
//! and remove what it created: the load returns [`EngineError::Interrupted`]. Only
//! SIGKILL after the whole upload was sent can leave the image, and then with its tags
//! (the archive's RepoTags make the daemon create and tag it in one step).

use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bollard::query_parameters::{ImportImageOptions, RemoveImageOptions, TagImageOptions};
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::run::{Liveness, RunOwner};
use super::{message_of, split_tag, status_of, Engine, EngineError};
use crate::digest::Digest;
use crate::layer::Layer;
use crate::oci::layout::LayoutImage;
use crate::oci::{self, Image, OciError, StoredImage};
use oci_spec::image::{Arch, Os};

/// The load request may take as long as the upload does (hours for a slow disk).
const LOAD_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);
const CHUNK: usize = 1 << 20;
/// Chunks in flight between the archive writer and the request body.
const CHUNKS_IN_FLIGHT: usize = 8;

/// What a load did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LoadReport {
    /// The daemon's image ID: the config digest.
    pub image_id: Digest,
    /// True when the daemon already had the image and only the tags were set.
    pub skipped: bool,
    /// Bytes of docker-archive streamed to the daemon (0 when skipped).
    pub bytes: u64,
    /// Wall time of the whole call.
    pub seconds: f64,
    /// Leading layers the daemon already had, sent as empty placeholders.
    pub layers_present: usize,
    pub layers: usize,
    /// Load requests sent: one per step (0 when skipped).
    pub requests: usize,
    /// The tags the image has now (those asked for).
    pub tags: Vec<String>,
}

/// What [`Engine::load_layers`] sent: nothing when the daemon had every layer.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StepsSent {
    /// Load requests, one per step image.
    pub requests: usize,
    /// Layers sent in full (not as placeholders of layers the daemon had).
    pub layers: usize,
    /// Bytes of docker-archive streamed to the daemon.
    pub bytes: u64,
}

/// Whether layers the daemon already has may be sent as empty placeholders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placeholders {
    Allowed,
    /// Every layer in full: the retry after the daemon lost a layer mid-load. Still in
    /// steps: a step's placeholders stand only for the layers of the step before, which
    /// this load's own step image holds.
    None,
}

impl LoadReport {
    /// Bytes per second of the upload (0 when skipped).
    pub fn throughput(&self) -> f64 {
        if self.skipped || self.seconds <= 0.0 {
            0.0
        } else {
            self.bytes as f64 / self.seconds
        }
    }
}

impl Engine {
    /// Load the image named `ref_name` in the OCI layout `dir` and tag it with every tag
    /// in `tags` (`name[:tag]`). Skips the upload when the daemon already has the image.
    pub async fn load_layout(
        &self,
        dir: &Path,
        ref_name: &str,
        tags: &[String],
    ) -> Result<LoadReport, EngineError> {
        let image = LayoutImage::open(dir, ref_name)?;
        self.load_stored(&image.image, tags, &dir.display().to_string())
            .await
    }

    /// Load `image` (its layer blobs are read where they are stored) and tag it.
    /// `origin` names the image in error messages (e.g. the layout path).
    pub async fn load_image(
        &self,
        image: &Image,
        tags: &[String],
        origin: &str,
    ) -> Result<LoadReport, EngineError> {
        check_tags(tags)?;
        self.load_checked(&StoredImage::of(image)?, tags, origin)
            .await
    }

    /// [`Self::load_image`] for an image as stored (a layout's, or a value's serialised).
    pub async fn load_stored(
        &self,
        image: &StoredImage,
        tags: &[String],
        origin: &str,
    ) -> Result<LoadReport, EngineError> {
        check_tags(tags)?;
        self.load_checked(image, tags, origin).await
    }

    /// [`Self::load_stored`] once the tags are checked (a test feeds it tags the daemon
    /// refuses, to prove that a load failing inside the daemon leaves nothing).
    async fn load_checked(
        &self,
        image: &StoredImage,
        tags: &[String],
        origin: &str,
    ) -> Result<LoadReport, EngineError> {
        let started = Instant::now();
        let image_id = image.config_digest();
        let manifest_digest = image.manifest_digest();
        let layers = image.layers.len();
        let report = |skipped: bool, sent: Sent| LoadReport {
            image_id,
            skipped,
            bytes: sent.bytes,
            seconds: started.elapsed().as_secs_f64(),
            layers_present: sent.layers_present,
            layers,
            requests: sent.requests,
            tags: tags.to_vec(),
        };
        self.reap_load_steps().await;
        if let Some(present) = self.present_as(&image_id, &manifest_digest).await? {
            for tag in tags {
                self.tag(&present, tag).await?;
            }
            let sent = Sent {
                bytes: 0,
                layers_present: layers,
                requests: 0,
            };
            return Ok(report(true, sent));
        }
        let mut result = self
            .upload(image, tags, origin, Placeholders::Allowed)
            .await;
        if matches!(&result, Err(EngineError::LoadFailed { message, .. }) if message.contains("invalid diffID"))
        {
            // A layer the daemon had when we looked was gone when it read the archive (a
            // `docker rmi` in between): its empty placeholder no longer stands for it.
            tracing::warn!(
                "the daemon removed a layer during the load of {origin}; loading again with every layer"
            );
            self.remove_loaded(&image_id, &manifest_digest).await;
            result = self.upload(image, tags, origin, Placeholders::None).await;
        }
        match result {
            Ok(sent) => Ok(report(false, sent)),
            Err(error) => {
                // The image was not in the daemon before: whatever of it is now is ours.
                self.remove_loaded(&image_id, &manifest_digest).await;
                Err(error)
            }
        }
    }

    /// Remove what a failed load left: the image by ID (with any tag it got), under
    /// either name the daemon may know it by. Best effort: the load's error is the one
    /// to report.
    async fn remove_loaded(&self, config: &Digest, manifest: &Digest) {
        for reference in [config.to_string(), manifest.to_string()] {
            if let Err(error) = self.remove_image(&reference).await {
                tracing::warn!("a failed load left {reference} in the daemon: {error}");
            }
        }
    }

    /// Stream `image` to the daemon and tag it. Tags must have been checked.
    async fn upload(
        &self,
        image: &StoredImage,
        tags: &[String],
        origin: &str,
        placeholders: Placeholders,
    ) -> Result<Sent, EngineError> {
        let layers_present = match placeholders {
            Placeholders::Allowed => self.present_layer_prefix(image).await?,
            Placeholders::None => 0,
        };
        // containerd's importer needs every blob of every load: one request there.
        let steps = if self.info().await?.containerd_image_store {
            Vec::new()
        } else {
            step_ends(&image.layers, layers_present, self.load_step_bytes)
        };
        let mut step_images = Vec::new();
        let result = self
            .send_in_steps(
                image,
                tags,
                origin,
                layers_present,
                &steps,
                &mut step_images,
            )
            .await;
        // A step's image only held its layers for the next step; the image holds them now
        // (or, after a failure, nothing should).
        for step in step_images {
            if let Err(error) = self.remove_image(&step.to_string()).await {
                tracing::warn!("a step of the load of {origin} left {step} in the daemon: {error}");
            }
        }
        let (bytes, said) = result?;
        let (image_id, manifest_digest) = (image.config_digest(), image.manifest_digest());
        let Some(present) = self.present_as(&image_id, &manifest_digest).await? else {
            return Err(EngineError::LoadMismatch {
                layout: origin.to_string(),
                expected: image_id,
                said: said.join("; "),
            });
        };
        // manifest.json already names the tags; tagging again also moves a tag that a
        // daemon kept on an older image.
        for tag in tags {
            self.tag(&present, tag).await?;
        }
        Ok(Sent {
            bytes,
            layers_present,
            requests: steps.len() + 1,
        })
    }

    /// Send `image` in one load request per step (`steps`: each step's end; see
    /// [`step_ends`]), then the image itself, its first `present` layers being in the
    /// daemon: the bytes sent and what the daemon said to the last request. Each step's
    /// image ID goes into `step_images` before its request is sent.
    async fn send_in_steps(
        &self,
        image: &StoredImage,
        tags: &[String],
        origin: &str,
        present: usize,
        steps: &[usize],
        step_images: &mut Vec<Digest>,
    ) -> Result<(u64, Vec<String>), EngineError> {
        let (mut sent, mut below) = (0, present);
        let nonce = load_nonce();
        for &end in steps {
            let configuration = &image.configuration;
            let step = step_image(
                &image.layers[..end],
                configuration.architecture(),
                configuration.os(),
                &nonce,
            )?;
            step_images.push(step.config_digest());
            sent += self.send_upload(&step, &[], origin, below).await?.0;
            below = end;
        }
        let (bytes, said) = self.send_upload(image, tags, origin, below).await?;
        Ok((sent + bytes, said))
    }

    /// Load `layers` as images of their own (steps: see [`step_image`], each at most the
    /// engine's step size) ahead of the image they are the lower layers of, which a later
    /// load then finds present. Each step's ID goes to `loaded` before its request is
    /// sent, so that the caller can remove it whatever happens; the daemon may already
    /// have all of them (nothing is sent) or keep images in containerd's store (whose
    /// importer needs every blob of every load: nothing is done). `nonce` is the caller's
    /// [`load_nonce`], the same for every call of one image's loads. Without the signal
    /// handling of [`Self::load_stored`]: a signal ends the process as it would have, the
    /// daemon creates nothing from the truncated upload, and a later load removes the
    /// steps ([`Self::reap_load_steps`]). Returns what was sent.
    pub async fn load_layers(
        &self,
        layers: &[Layer],
        platform: (&Arch, &Os),
        nonce: &str,
        origin: &str,
        loaded: &std::sync::Mutex<Vec<Digest>>,
    ) -> Result<StepsSent, EngineError> {
        let mut sent = StepsSent::default();
        if self.info().await?.containerd_image_store {
            return Ok(sent);
        }
        let (architecture, os) = platform;
        let whole = step_image(layers, architecture, os, nonce)?;
        let mut below = self.present_layer_prefix(&whole).await?;
        let mut ends = step_ends(layers, below, self.load_step_bytes);
        ends.push(layers.len());
        let present = below;
        for end in ends.into_iter().filter(|end| *end > present) {
            let step = step_image(&layers[..end], architecture, os, nonce)?;
            let id = step.config_digest();
            loaded.lock().expect("no panic holds it").push(id);
            let archive = ArchiveStream::start(&step, &[], below);
            let answer = self.send_archive(archive.body, None).await;
            let written = archive
                .writer
                .join()
                .expect("the archive writer does not panic");
            sent.bytes += outcome(written, answer.failure, origin)?;
            if !self.image_exists(&id.to_string()).await? {
                return Err(EngineError::LoadMismatch {
                    layout: origin.to_string(),
                    expected: id,
                    said: answer.messages.join("; "),
                });
            }
            sent.requests += 1;
            sent.layers += end - below;
            below = end;
        }
        Ok(sent)
    }

    /// Remove the step images a dead process left (see [`step_image`]); best effort, as
    /// housekeeping before a load.
    pub async fn reap_load_steps(&self) {
        let Some(observer) = RunOwner::current() else {
            return;
        };
        let options = bollard::query_parameters::ListImagesOptions {
            all: true,
            filters: Some(
                [(
                    "label".to_string(),
                    vec![crate::labels::LOAD_STEP_OWNER.to_string()],
                )]
                .into(),
            ),
            ..Default::default()
        };
        let Ok(images) = self.docker.list_images(Some(options)).await else {
            return;
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |now| now.as_secs());
        for image in images {
            // A step someone tagged (or built on) is theirs now.
            let tagged = image.repo_tags.iter().any(|tag| tag != "<none>:<none>");
            let owner = image.labels.get(crate::labels::LOAD_STEP_OWNER);
            let dead = owner
                .and_then(|owner| RunOwner::parse(owner))
                .is_some_and(|owner| owner.liveness(&observer) == Liveness::Dead);
            let expired = image
                .labels
                .get(crate::labels::LOAD_STEP_UNTIL)
                .and_then(|until| until.parse::<u64>().ok())
                .is_some_and(|until| until < now);
            if !tagged && image.containers <= 0 && (dead || expired) {
                if let Err(error) = self.remove_image(&image.id).await {
                    tracing::warn!("a step a dead load left, {}, stays: {error}", image.id);
                }
            }
        }
    }

    /// Stream `image` to the daemon as a docker-archive whose first `present` layers are
    /// placeholders: the bytes sent, and what the daemon said.
    async fn send_upload(
        &self,
        image: &StoredImage,
        tags: &[String],
        origin: &str,
        present: usize,
    ) -> Result<(u64, Vec<String>), EngineError> {
        let archive = ArchiveStream::start(image, tags, present);
        // A signal no longer ends the process mid-load (see `send_archive`); the load stays
        // in flight until its outcome is known and the tags are set.
        let mut signals = super::run::Signals::listen();
        let _active = super::run::ActiveRun::enter();
        let answer = self.send_archive(archive.body, Some(&mut signals)).await;
        let written = archive
            .writer
            .join()
            .expect("the archive writer does not panic");
        if let Some(signal) = answer.interrupted {
            return Err(EngineError::Interrupted { signal });
        }
        let bytes = outcome(written, answer.failure, origin)?;
        Ok((bytes, answer.messages))
    }

    /// Send the archive `body` as a load request and collect the daemon's answer. A signal
    /// no longer ends the process mid-load: the load ends the upload and waits for the
    /// daemon's answer (which comes after it created the image, if the whole upload was
    /// already sent), so that the caller removes whatever it created.
    async fn send_archive(
        &self,
        body: ArchiveBody,
        mut signals: Option<&mut super::run::Signals>,
    ) -> DaemonAnswer {
        let docker = self.with_timeout(LOAD_TIMEOUT);
        let options = ImportImageOptions {
            quiet: true,
            ..Default::default()
        };
        let abort = body.abort.clone();
        let mut responses = Box::pin(docker.import_image_stream(options, body.stream, None));
        let mut answer = DaemonAnswer::default();
        loop {
            let item = tokio::select! {
                item = responses.next() => item,
                signal = next_signal(&mut signals), if answer.interrupted.is_none() => {
                    answer.interrupted = Some(signal);
                    abort.store(true, Ordering::SeqCst);
                    continue;
                }
            };
            let Some(item) = item else { break };
            match item {
                Ok(info) => {
                    if let Some(error) = info.error_detail.and_then(|d| d.message) {
                        answer.failure = Some(error);
                    }
                    if let Some(line) = info.stream {
                        answer.messages.push(line.trim().to_string());
                    }
                }
                Err(error) => {
                    answer.failure = Some(message_of(&error));
                    break;
                }
            }
        }
        answer
    }

    /// How the daemon names the image, if it has it: the classic image store's ID is the
    /// config digest; the containerd image store (Docker 25+ option, default in 29)
    /// identifies images by manifest (or index) digest.
    /// How many leading layers of `image` the daemon already has: the longest prefix of
    /// its diff_ids that some image in the daemon starts with (equal prefixes mean equal
    /// chain IDs). Zero on the containerd image store, whose importer needs every blob.
    async fn present_layer_prefix(&self, image: &StoredImage) -> Result<usize, EngineError> {
        if self.info().await?.containerd_image_store {
            return Ok(0);
        }
        let wanted: Vec<String> = image.layers.iter().map(|l| l.diff_id.to_string()).collect();
        let api = |what: &'static str| {
            move |source| EngineError::Api {
                what: what.to_string(),
                source,
            }
        };
        let options = bollard::query_parameters::ListImagesOptions {
            all: true,
            ..Default::default()
        };
        let summaries = self
            .docker
            .list_images(Some(options))
            .await
            .map_err(api("listing images"))?;
        let mut best = 0;
        for summary in summaries {
            let Ok(inspect) = self.docker.inspect_image(&summary.id).await else {
                continue; // removed meanwhile
            };
            let layers = inspect.root_fs.and_then(|r| r.layers).unwrap_or_default();
            let common = layers
                .iter()
                .zip(&wanted)
                .take_while(|(have, want)| have == want)
                .count();
            best = best.max(common);
            if best == wanted.len() {
                break;
            }
        }
        Ok(best)
    }

    /// Whether the daemon has the image with config `config` and manifest `manifest`,
    /// under either name (see [`Self::present_as`]).
    pub async fn has_image(&self, config: &Digest, manifest: &Digest) -> Result<bool, EngineError> {
        Ok(self.present_as(config, manifest).await?.is_some())
    }

    async fn present_as(
        &self,
        config: &Digest,
        manifest: &Digest,
    ) -> Result<Option<String>, EngineError> {
        for reference in [config.to_string(), manifest.to_string()] {
            if self.image_exists(&reference).await? {
                return Ok(Some(reference));
            }
        }
        Ok(None)
    }

    /// Whether the daemon has `reference` (an image ID `sha256:...` or `name:tag`).
    pub async fn image_exists(&self, reference: &str) -> Result<bool, EngineError> {
        match self.docker.inspect_image(reference).await {
            Ok(_) => Ok(true),
            Err(error) if status_of(&error) == Some(404) => Ok(false),
            Err(source) => Err(EngineError::Api {
                what: format!("inspecting image `{reference}`"),
                source,
            }),
        }
    }

    /// The image ID (config digest) of `reference`, or `None` if the daemon lacks it.
    pub async fn image_id(&self, reference: &str) -> Result<Option<Digest>, EngineError> {
        match self.docker.inspect_image(reference).await {
            Ok(inspect) => Ok(inspect.id.and_then(|id| id.parse().ok())),
            Err(error) if status_of(&error) == Some(404) => Ok(None),
            Err(source) => Err(EngineError::Api {
                what: format!("inspecting image `{reference}`"),
                source,
            }),
        }
    }

    /// Tag `image` (an ID or reference the daemon has) as `tag` (`name[:tag]`).
    pub async fn tag(&self, image: &str, tag: &str) -> Result<(), EngineError> {
        let (repository, tag_part) = split_tag(tag)?;
        let options = TagImageOptions {
            repo: Some(repository.to_string()),
            tag: Some(tag_part.to_string()),
        };
        self.docker
            .tag_image(image, Some(options))
            .await
            .map_err(|source| match status_of(&source) {
                Some(404) => EngineError::NoSuchImage {
                    image: image.to_string(),
                },
                _ => EngineError::Api {
                    what: format!("tagging `{image}` as `{tag}`"),
                    source,
                },
            })
    }

    /// Remove `reference` (a tag, or an ID with all its tags). Returns false when the
    /// daemon did not have it. Images used by containers are not removed.
    pub async fn remove_image(&self, reference: &str) -> Result<bool, EngineError> {
        let options = RemoveImageOptions {
            force: reference.starts_with("sha256:"),
            ..Default::default()
        };
        match self
            .docker
            .remove_image(reference, Some(options), None)
            .await
        {
            Ok(_) => Ok(true),
            Err(error) if status_of(&error) == Some(404) => Ok(false),
            Err(source) => Err(EngineError::Api {
                what: format!("removing image `{reference}`"),
                source,
            }),
        }
    }
}

/// The most compressed bytes one load request sends when an image is loaded in steps.
/// Docker's classic loader spools a whole upload to its own temporary directory before it
/// registers a layer, so a load in one request needs the image's compressed size free on
/// top of its unpacked size: 2.9 GB more for the torch stack. In steps, each a prefix image
/// whose lower layers are placeholders, the spool holds one step.
pub(super) const LOAD_STEP_BYTES: u64 = 512 << 20;

/// Where the load steps of `layers` end, the first `present` being in the daemon already:
/// each step's exclusive end, before the last (the image itself). A step sends whole
/// layers, at least one, and no more than `bound` bytes of blobs unless one layer is larger.
fn step_ends(layers: &[Layer], present: usize, bound: u64) -> Vec<usize> {
    let mut ends = Vec::new();
    let mut step_bytes = 0;
    for (index, layer) in layers.iter().enumerate().skip(present) {
        if step_bytes > 0 && step_bytes + layer.size > bound {
            ends.push(index);
            step_bytes = 0;
        }
        step_bytes += layer.size;
    }
    ends
}

/// The image of `layers`, for one step of a load: `architecture`/`os`, no tags, and the
/// label that names its owner (this process), so that a step a killed load left behind is
/// found and removed ([`Engine::reap_load_steps`]).
fn step_image(
    layers: &[Layer],
    architecture: &Arch,
    os: &Os,
    nonce: &str,
) -> Result<StoredImage, OciError> {
    let owner = RunOwner::current().map_or_else(String::new, |owner| owner.to_label());
    let until = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |now| now.as_secs())
        + STEP_LIFETIME.as_secs();
    let step = layers.iter().fold(
        Image::new(0).with_platform(architecture.clone(), os.clone()),
        |step, layer| step.with_layer(layer.clone(), "cudastack load step"),
    );
    StoredImage::of(
        &step
            .with_label(crate::labels::LOAD_STEP_OWNER, &owner)
            .with_label(crate::labels::LOAD_STEP_UNTIL, &until.to_string())
            .with_label(crate::labels::LOAD_STEP_NONCE, nonce),
    )
}

/// How long a step image may outlive its load before any load removes it: longer than any
/// build (a source build takes hours), short enough that a killed one's GBs go.
const STEP_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// A label value unique to one load: this process, a counter and the time.
pub fn load_nonce() -> String {
    static LOADS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let count = LOADS.fetch_add(1, Ordering::Relaxed);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |now| now.as_nanos());
    format!("{}-{count}-{now}", std::process::id())
}

/// The next signal, or never without `signals` (a load that leaves them to their default).
async fn next_signal(signals: &mut Option<&mut super::run::Signals>) -> &'static str {
    match signals {
        Some(signals) => signals.recv().await,
        None => std::future::pending().await,
    }
}

/// Docker tags among the layout's names of the image (cudastack writes each recipe tag as
/// a ref name beside `latest`), sorted.
pub fn layout_tags(image: &LayoutImage) -> Vec<String> {
    image
        .other_names
        .iter()
        .filter(|name| name.contains(':') && split_tag(name).is_ok())
        .cloned()
        .collect()
}

fn check_tags(tags: &[String]) -> Result<(), EngineError> {
    for tag in tags {
        split_tag(tag)?;
    }
    Ok(())
}

/// What a load sent.
struct Sent {
    /// Bytes of docker-archive, all requests together.
    bytes: u64,
    /// Leading layers the daemon had before, sent as placeholders.
    layers_present: usize,
    requests: usize,
}

/// What the daemon answered a load request.
#[derive(Default)]
struct DaemonAnswer {
    /// Its progress lines.
    messages: Vec<String>,
    /// The error it reported, if any.
    failure: Option<String>,
    /// The signal that ended the upload early, if one came.
    interrupted: Option<&'static str>,
}

/// The load's result from what the archive writer and the daemon said: the archive's size,
/// or the error that explains the failure best.
fn outcome(
    written: Result<u64, OciError>,
    failure: Option<String>,
    origin: &str,
) -> Result<u64, EngineError> {
    let load_failed = |message| EngineError::LoadFailed {
        layout: origin.to_string(),
        message,
    };
    match (written, failure) {
        (Ok(bytes), None) => Ok(bytes),
        // The daemon gave up first: its message is the cause, the broken pipe the effect.
        (Err(OciError::WriteArchive(e)), Some(message))
            if e.kind() == io::ErrorKind::BrokenPipe =>
        {
            Err(load_failed(message))
        }
        // The writer's own error (a missing or corrupt blob) says more than the
        // daemon's "unexpected EOF".
        (Err(error), _) => Err(error.into()),
        (Ok(_), Some(message)) => Err(load_failed(message)),
    }
}

/// The request body of a load: the chunks the archive writer sends, ended early in an
/// error once `abort` is set (on SIGINT/SIGTERM/SIGHUP), so the daemon gets a truncated
/// upload and creates nothing.
struct ArchiveBody {
    stream: futures_util::stream::BoxStream<'static, io::Result<Bytes>>,
    abort: Arc<AtomicBool>,
}

/// The docker-archive of an image being written on its own thread into a load body.
struct ArchiveStream {
    writer: std::thread::JoinHandle<Result<u64, OciError>>,
    body: ArchiveBody,
}

impl ArchiveStream {
    fn start(image: &StoredImage, tags: &[String], layers_present: usize) -> Self {
        let (sender, receiver) = mpsc::channel::<io::Result<Bytes>>(CHUNKS_IN_FLIGHT);
        let image = image.clone();
        let tags = tags.to_vec();
        let writer = std::thread::spawn(move || -> Result<u64, OciError> {
            let out = ChannelWriter {
                sender: sender.clone(),
                buffer: BytesMut::with_capacity(CHUNK),
                written: 0,
            };
            let result = oci::docker_archive::write_stored(&image, &tags, layers_present, out)
                .and_then(|mut out| out.finish().map_err(OciError::WriteArchive));
            if let Err(error) = &result {
                // Abort the request body, so the daemon does not load a truncated tar.
                let _ = sender.blocking_send(Err(io::Error::other(error.to_string())));
            }
            result
        });
        let abort = Arc::new(AtomicBool::new(false));
        let body_abort = abort.clone();
        let stream = futures_util::stream::unfold(receiver, move |mut receiver| {
            let abort = body_abort.clone();
            async move {
                let item = receiver.recv().await?;
                if abort.load(Ordering::SeqCst) {
                    let error =
                        io::Error::new(io::ErrorKind::Interrupted, "the load was interrupted");
                    return Some((Err(error), receiver));
                }
                Some((item, receiver))
            }
        });
        Self {
            writer,
            body: ArchiveBody {
                stream: stream.boxed(),
                abort,
            },
        }
    }
}

/// A `Write` that hands 1 MiB chunks to the request body; a closed body (the request
/// failed) is a broken pipe.
struct ChannelWriter {
    sender: mpsc::Sender<io::Result<Bytes>>,
    buffer: BytesMut,
    written: u64,
}

impl ChannelWriter {
    fn send_buffer(&mut self) -> io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let chunk = self.buffer.split().freeze();
        self.buffer.reserve(CHUNK);
        self.sender.blocking_send(Ok(chunk)).map_err(|_| {
            io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the Docker daemon stopped reading the load request",
            )
        })
    }

    /// Send what is buffered; returns the archive's size.
    fn finish(&mut self) -> io::Result<u64> {
        self.send_buffer()?;
        Ok(self.written)
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let room = CHUNK - self.buffer.len();
        let n = data.len().min(room);
        self.buffer.extend_from_slice(&data[..n]);
        self.written += n as u64;
        if self.buffer.len() >= CHUNK {
            self.send_buffer()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        // Chunks go out when full or at the end; a flush mid-archive need not send.
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_channel_writer_sends_full_chunks_and_breaks_when_the_reader_is_gone() {
        let (sender, mut receiver) = mpsc::channel(64);
        let mut writer = ChannelWriter {
            sender,
            buffer: BytesMut::new(),
            written: 0,
        };
        let data = vec![7u8; CHUNK * 2 + 10];
        writer.write_all(&data).unwrap();
        assert_eq!(writer.finish().unwrap(), data.len() as u64);
        let mut sizes = Vec::new();
        while let Ok(chunk) = receiver.try_recv() {
            sizes.push(chunk.unwrap().len());
        }
        assert_eq!(sizes, [CHUNK, CHUNK, 10]);
        drop(receiver);
        let error = writer.write_all(&data).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::BrokenPipe);
    }

    #[test]
    fn a_load_is_cut_into_steps_of_whole_layers_below_the_bound() {
        let mib = |size: u64| Layer {
            digest: Digest::of_bytes(&size.to_le_bytes()),
            diff_id: Digest::of_bytes(&size.to_le_bytes()),
            size: size << 20,
            uncompressed_size: None,
            media_type: oci_spec::image::MediaType::ImageLayerGzip,
            blob: std::path::PathBuf::new(),
        };
        // The torch stack's compressed sizes (MiB): base, cuda, cuda-math, cudnn, triton,
        // torch, python, then a team's small layers.
        let layers: Vec<Layer> = [40, 634, 475, 634, 200, 756, 60, 3, 1, 2]
            .into_iter()
            .map(mib)
            .collect();
        assert_eq!(step_ends(&layers, 0, LOAD_STEP_BYTES), [1, 2, 3, 4, 5, 6]);
        // What the daemon has is not sent again, and does not count.
        assert_eq!(step_ends(&layers, 5, LOAD_STEP_BYTES), [6]);
        assert_eq!(step_ends(&layers, 6, LOAD_STEP_BYTES), Vec::<usize>::new());
        let small: Vec<Layer> = [100, 100, 100, 300, 1].into_iter().map(mib).collect();
        assert_eq!(step_ends(&small, 0, LOAD_STEP_BYTES), [3]);
        assert!(step_ends(&[], 0, LOAD_STEP_BYTES).is_empty());
    }

    /// Docker creates the image, then parses the archive's RepoTags; a tag it
    /// refuses failed the load and left the image untagged in the daemon. Past the tag
    /// check (which refuses such tags up front), a load that fails inside the daemon must
    /// still leave nothing. Needs a Docker daemon; says why it skips otherwise.
    #[tokio::test]
    async fn a_load_the_daemon_fails_after_creating_the_image_leaves_nothing() {
        use crate::layer::{self, BuildOptions, Compression, Entry, LayerContents, LayerPath};
        let Ok(engine) = Engine::connect().await else {
            eprintln!("skipping: no Docker daemon");
            return;
        };
        let work = tempfile::tempdir().unwrap();
        let store = crate::cache::BlobStore::open(work.path().join("store")).unwrap();
        let marker = format!(
            "load-rollback {} {:?}\n",
            std::process::id(),
            Instant::now()
        );
        let contents = LayerContents::from_entries([Entry::file_bytes(
            LayerPath::parse("etc/marker").unwrap(),
            0o644,
            marker.into_bytes(),
        )])
        .unwrap();
        let layer = layer::build(
            &store,
            &contents,
            &BuildOptions::new(1_700_000_000, Compression::None),
        )
        .unwrap();
        let image = Image::new(1_700_000_000).with_layer(layer, "marker");
        let id = image.documents().unwrap().config.digest;
        let pid = std::process::id();
        let tags = vec![
            format!("cudastack-test/rollback:{pid}-ok"),
            format!("cudastack-test/Rollback:{pid}"),
        ];
        // The public path refuses the tag before sending anything.
        let error = engine.load_image(&image, &tags, "test").await.unwrap_err();
        assert!(matches!(error, EngineError::InvalidTag { .. }), "{error}");
        assert!(!engine.image_exists(&id.to_string()).await.unwrap());

        let error = engine
            .load_checked(&StoredImage::of(&image).unwrap(), &tags, "test")
            .await
            .unwrap_err();
        let text = error.to_string();
        eprintln!("{text}");
        assert!(matches!(error, EngineError::LoadFailed { .. }), "{text}");
        let left = engine.image_exists(&id.to_string()).await.unwrap();
        let tagged = engine.image_exists(&tags[0]).await.unwrap();
        let _ = engine.remove_image(&id.to_string()).await;
        assert!(!left, "the failed load left {id} in the daemon");
        assert!(!tagged, "the failed load left the tag {}", tags[0]);
    }
}
