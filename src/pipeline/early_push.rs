//! `build --push` uploads each layer's blob as soon as the build has it, while the other
//! layers are still building: the build says so through
//! [`BuildProgress::layer_ready`], [`EarlyUploads::progress`] passes each ready layer to a
//! task that pushes blobs as `push` does (HEAD first, mounts, the same parallelism and
//! chunking), and the push stage then finds them present and sends only the config, the
//! manifest and the referrers.
//!
//! Only blobs go up early. A blob that no manifest names is harmless (a registry collects
//! it as garbage), while a manifest must never be pushed before the image is verified: that
//! stays the push stage's, after verification. An upload that fails stops the early
//! uploads; the failure, naming the layer, is the push stage's error, so no manifest goes up.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures_util::{StreamExt, TryStreamExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::fetch::progress::Reporter;
use crate::layer::Layer;
use crate::registry::{push_blob_file, BlobReport, PushOptions, RegistryClient};
use crate::stack::BuildProgress;

use super::{PipelineError, PushTarget};

/// A layer the build has finished, by the name of its kind (`base`, `python`, ...).
struct ReadyLayer {
    name: String,
    layer: Layer,
}

/// What the early uploads did: one report per distinct blob, and the bytes put on the wire.
#[derive(Debug, Default)]
pub struct SentWhileBuilding {
    pub blobs: Vec<BlobReport>,
    pub bytes: u64,
}

/// The early-upload task of one `build --push`: started before the build, fed through
/// [`Self::progress`], waited for by [`Self::finish`] at the push stage.
pub struct EarlyUploads {
    sender: mpsc::UnboundedSender<ReadyLayer>,
    /// Taken by [`Self::finish`]; aborted on drop (a failed build or verification leaves
    /// nothing uploading behind it).
    task: Option<JoinHandle<Result<Vec<BlobReport>, PipelineError>>>,
    sent: Arc<AtomicU64>,
}

impl Drop for EarlyUploads {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl EarlyUploads {
    /// Start the task that uploads ready layers to `target`'s repository. Must be called
    /// within the tokio runtime. Dropped without [`Self::finish`] (a failed build), the
    /// task is aborted.
    pub fn start(target: &PushTarget) -> Result<Self, PipelineError> {
        let client = RegistryClient::new(&target.reference, target.client.clone())?;
        let options = super::push::push_options(&target.settings, &target.reference);
        let repository = target.reference.repository().to_string();
        let (sender, receiver) = mpsc::unbounded_channel();
        let sent = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(upload_ready_layers(
            client,
            repository,
            options,
            receiver,
            sent.clone(),
        ));
        Ok(EarlyUploads {
            sender,
            task: Some(task),
            sent,
        })
    }

    /// `inner`, plus every ready layer handed to the upload task.
    pub fn progress<'a>(&'a self, inner: &'a dyn BuildProgress) -> impl BuildProgress + 'a {
        WithEarlyUploads {
            inner,
            sender: &self.sender,
        }
    }

    /// Whether the task has already stopped. While layers may still come it only stops on
    /// a failed upload: the pipeline then fails at once instead of after verification.
    pub fn failed(&self) -> bool {
        self.task.as_ref().is_some_and(JoinHandle::is_finished)
    }

    /// No more layers will come: wait for the uploads in flight; the first failure, naming
    /// its layer, is the error.
    pub async fn finish(mut self) -> Result<SentWhileBuilding, PipelineError> {
        let Some(task) = self.task.take() else {
            return Err(PipelineError::EarlyUploadTask {
                detail: "the upload task was already taken".to_string(),
            });
        };
        let sent = self.sent.clone();
        // Closing the channel (dropping self and its sender) lets the task end.
        drop(self);
        let blobs = task
            .await
            .map_err(|error| PipelineError::EarlyUploadTask {
                detail: error.to_string(),
            })??;
        Ok(SentWhileBuilding {
            blobs,
            bytes: sent.load(Ordering::Relaxed),
        })
    }
}

/// The build's progress with `layer_ready` also sending the layer to the upload task.
struct WithEarlyUploads<'a> {
    inner: &'a dyn BuildProgress,
    sender: &'a mpsc::UnboundedSender<ReadyLayer>,
}

impl BuildProgress for WithEarlyUploads<'_> {
    fn stage(&self, stage: &str, detail: &str) {
        self.inner.stage(stage, detail);
    }

    fn downloads(&self) -> Arc<dyn Reporter> {
        self.inner.downloads()
    }

    fn layers_planned(&self, names: &[&str], cached: &[bool]) {
        self.inner.layers_planned(names, cached);
    }

    fn layer_ready(&self, name: &str, layer: &Layer) {
        self.inner.layer_ready(name, layer);
        // A closed channel means an upload failed: that error is reported at the push stage.
        let _ = self.sender.send(ReadyLayer {
            name: name.to_string(),
            layer: layer.clone(),
        });
    }
}

/// Push each distinct ready layer's blob, `options.parallel` at a time, until the channel
/// closes or an upload fails.
async fn upload_ready_layers(
    client: RegistryClient,
    repository: String,
    options: PushOptions,
    receiver: mpsc::UnboundedReceiver<ReadyLayer>,
    sent: Arc<AtomicU64>,
) -> Result<Vec<BlobReport>, PipelineError> {
    let (client, repository, options, sent) = (&client, &repository, &options, &sent);
    let mut seen = HashSet::new();
    futures_util::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|ready| (ready, receiver))
    })
    // The same blob twice (a layer shared by two platforms) goes up once.
    .filter(move |ready| std::future::ready(seen.insert(ready.layer.digest)))
    .map(|ready| async move {
        let layer = &ready.layer;
        push_blob_file(
            client,
            repository,
            layer.digest,
            layer.size,
            &layer.blob,
            options,
            sent,
        )
        .await
        .map_err(|source| PipelineError::EarlyUpload {
            layer: ready.name,
            source: Box::new(source),
        })
    })
    .buffer_unordered(options.parallel.max(1))
    .try_collect()
    .await
}
