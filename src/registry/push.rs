//! Push: blobs first (skipping what the registry has, mounting what another repository
//! has, uploading the rest in parallel and resumably), then the manifest as raw bytes.
//!
//! Uploads follow pitfall 4 of CRATES.md: a blob up to `chunk_size` goes as one streaming
//! PUT with a known Content-Length (every registry accepts it; no chunk-size limits to
//! meet); a bigger one goes as PATCH chunks of `chunk_size`, so an interrupted upload
//! loses at most one chunk. After a failure the client asks the upload session how much it
//! holds (`GET` on the upload URL -> `Range: 0-N`) and continues from there with PATCH;
//! when the session is gone (registry restarted without it, or it refuses the resume) the
//! blob starts over. A failed cross-repository mount is "upload instead".

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use oci_spec::image::{Descriptor, ImageManifest, MediaType};
use reqwest::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use reqwest::{Method, StatusCode, Url};
use serde::{Deserialize, Serialize};

use super::authorized::{status_error, Body};
use super::client::{scope, RegistryClient};
use super::RegistryError;
use crate::digest::Digest;
use crate::net::error_chain;
use crate::oci::layout::Layout;
use crate::oci::{Image, StoredImage};
use crate::reference::Reference;

/// How to push.
#[derive(Debug, Clone)]
pub struct PushOptions {
    /// Blobs uploaded at the same time.
    pub parallel: usize,
    /// Blobs up to this size go in one PUT; bigger ones in PATCH chunks of this size.
    pub chunk_size: u64,
    /// Repositories of the same registry to try cross-repository mounts from.
    pub mount_from: Vec<String>,
}

impl Default for PushOptions {
    fn default() -> Self {
        Self {
            parallel: 3,
            chunk_size: 64 << 20,
            mount_from: Vec::new(),
        }
    }
}

/// What happened to one blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BlobOutcome {
    /// Sent in full.
    Uploaded,
    /// The repository already had it.
    Present,
    /// Linked from another repository of the registry, nothing sent.
    Mounted,
    /// An interrupted upload was continued from where the registry's session stood.
    Resumed,
}

#[derive(Debug, Clone, Serialize)]
pub struct BlobReport {
    pub digest: Digest,
    pub size: u64,
    pub outcome: BlobOutcome,
    /// The repository a mounted blob came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mounted_from: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PushReport {
    /// Where the image went, without a digest (`registry/repo:tag`); with
    /// `@manifest_digest` appended it pins what was pushed.
    pub reference: String,
    pub manifest_digest: Digest,
    pub media_type: String,
    pub blobs: Vec<BlobReport>,
    /// Blob bytes put on the wire (re-sent bytes of retried uploads included).
    pub bytes_uploaded: u64,
    pub seconds: f64,
    /// Blobs of `blobs` that were sent (or mounted) while the image was still building
    /// (`build --push`); their bytes are in `bytes_uploaded`.
    #[serde(skip_serializing_if = "is_zero")]
    pub uploaded_while_building: usize,
}

fn is_zero(count: &usize) -> bool {
    *count == 0
}

/// A blob to push: its identity and where its bytes are.
#[derive(Debug, Clone)]
pub(crate) struct BlobSource {
    pub digest: Digest,
    pub size: u64,
    pub data: BlobData,
}

#[derive(Debug, Clone)]
pub(crate) enum BlobData {
    File(PathBuf),
    Bytes(Bytes),
}

impl BlobSource {
    fn body(&self, offset: u64, len: u64, counter: &Arc<AtomicU64>) -> Body {
        match &self.data {
            BlobData::File(path) => Body::File {
                path: path.clone(),
                offset,
                len,
                counter: Some(counter.clone()),
            },
            BlobData::Bytes(bytes) => {
                counter.fetch_add(len, Ordering::Relaxed);
                Body::Bytes(bytes.slice(offset as usize..(offset + len) as usize))
            }
        }
    }
}

/// Push an image value (its layers are read from their blob files) as `reference`.
pub async fn push_image(
    client: &RegistryClient,
    image: &Image,
    reference: &Reference,
    options: &PushOptions,
) -> Result<PushReport, RegistryError> {
    push_stored(client, &StoredImage::of(image)?, reference, options).await
}

/// Push an image as it is stored (its manifest bytes as they are: the pushed manifest
/// digest is the stored one) as `reference`.
pub async fn push_stored(
    client: &RegistryClient,
    image: &StoredImage,
    reference: &Reference,
    options: &PushOptions,
) -> Result<PushReport, RegistryError> {
    check_pinned(reference, &image.manifest_digest())?;
    push_manifest_with_blobs(
        client,
        reference,
        Bytes::from(image.manifest.bytes.clone()),
        image.media_type().as_ref(),
        stored_blobs(image)?,
        options,
    )
    .await
}

/// Push the image named `ref_name` in the OCI layout `dir` as `reference`, byte for byte
/// (the pushed manifest digest is the layout's). An index entry is pushed with each of
/// its manifests.
pub async fn push_layout(
    client: &RegistryClient,
    dir: &Path,
    ref_name: &str,
    reference: &Reference,
    options: &PushOptions,
) -> Result<PushReport, RegistryError> {
    let layout = Layout::open(dir)?;
    let entry = layout.entry(ref_name)?;
    // Before a single blob goes out: a pinned digest the image does not have is refused.
    check_pinned(reference, &descriptor_digest(entry, dir)?)?;
    if entry.media_type() != &MediaType::ImageIndex
        && entry.media_type().as_ref() != super::DOCKER_MANIFEST_LIST
    {
        let manifest: ImageManifest = layout.read_json_blob(entry, "an OCI image manifest")?;
        if manifest.artifact_type().is_some() {
            return push_artifact(client, &layout, entry, &manifest, reference, options).await;
        }
        let image = layout.image_at(entry, Some(ref_name))?;
        return push_stored(client, &image, reference, options).await;
    }
    let started = Instant::now();
    let index_bytes = layout.read_blob(entry)?;
    let mut blobs = Vec::new();
    let mut uploaded = 0;
    for child in layout.child_index(entry)?.manifests() {
        let image = layout.image_at(child, None)?;
        let child_reference = reference.with_digest(image.manifest_digest());
        let report = push_stored(client, &image, &child_reference, options).await?;
        blobs.extend(report.blobs);
        uploaded += report.bytes_uploaded;
    }
    let media_type = entry.media_type().to_string();
    let manifest_digest = client
        .put_manifest(reference, &media_type, Bytes::from(index_bytes))
        .await?;
    Ok(PushReport {
        reference: reference.without_digest().to_string(),
        manifest_digest,
        media_type,
        blobs,
        bytes_uploaded: uploaded,
        seconds: started.elapsed().as_secs_f64(),
        uploaded_while_building: 0,
    })
}

/// Push the artifact (a verification report, say) whose `manifest` `entry` names: its
/// manifest bytes as stored, with its config and blobs as files of the layout. Not an
/// image, so not a [`StoredImage`].
async fn push_artifact(
    client: &RegistryClient,
    layout: &Layout,
    entry: &Descriptor,
    manifest: &ImageManifest,
    reference: &Reference,
    options: &PushOptions,
) -> Result<PushReport, RegistryError> {
    let bytes = layout.read_blob(entry)?;
    let mut blobs = Vec::new();
    for descriptor in manifest.layers().iter().chain([manifest.config()]) {
        let digest = descriptor_digest(descriptor, layout.dir())?;
        let path = crate::oci::layout::blob_path(layout.dir(), &digest);
        blobs.push(BlobSource {
            digest,
            size: file_size(&path, descriptor.size())?,
            data: BlobData::File(path),
        });
    }
    push_manifest_with_blobs(
        client,
        reference,
        Bytes::from(bytes),
        entry.media_type().as_ref(),
        blobs,
        options,
    )
    .await
}

/// A reference that pins a digest (`repo:tag@sha256:...`) names the image it wants: one
/// with another digest is refused, naming both (the pin used to be ignored).
pub(crate) fn check_pinned(reference: &Reference, found: &Digest) -> Result<(), RegistryError> {
    match reference.digest() {
        Some(expected) if expected != found => Err(RegistryError::PinnedDigestMismatch {
            reference: reference.to_string(),
            expected: *expected,
            found: *found,
        }),
        _ => Ok(()),
    }
}

fn descriptor_digest(descriptor: &Descriptor, dir: &Path) -> Result<Digest, RegistryError> {
    descriptor
        .digest()
        .to_string()
        .parse()
        .map_err(|e: crate::digest::DigestError| RegistryError::Document {
            path: dir.display().to_string(),
            what: "a layout with sha256 digests",
            detail: e.to_string(),
        })
}

/// The layer blobs (as files, each checked to have the size its descriptor gives) and the
/// config (as the stored bytes) of `image`.
fn stored_blobs(image: &StoredImage) -> Result<Vec<BlobSource>, RegistryError> {
    let mut blobs = Vec::new();
    for layer in &image.layers {
        blobs.push(BlobSource {
            digest: layer.digest,
            size: file_size(&layer.blob, layer.size)?,
            data: BlobData::File(layer.blob.clone()),
        });
    }
    blobs.push(BlobSource {
        digest: image.config.digest,
        size: image.config.size(),
        data: BlobData::Bytes(Bytes::from(image.config.bytes.clone())),
    });
    Ok(blobs)
}

/// The size of the blob file at `path`, which must be the `expected` size its manifest gives.
fn file_size(path: &Path, expected: u64) -> Result<u64, RegistryError> {
    let size = fs_err::metadata(path)
        .map_err(|source| RegistryError::Io {
            path: path.to_path_buf(),
            source,
        })?
        .len();
    if size != expected {
        return Err(RegistryError::Document {
            path: path.display().to_string(),
            what: "the blob its manifest describes",
            detail: format!("it has {size} bytes, the manifest says {expected}"),
        });
    }
    Ok(size)
}

/// Push `blobs` (bounded parallel), then the manifest bytes under `reference`.
pub(crate) async fn push_manifest_with_blobs(
    client: &RegistryClient,
    reference: &Reference,
    manifest: Bytes,
    media_type: &str,
    blobs: Vec<BlobSource>,
    options: &PushOptions,
) -> Result<PushReport, RegistryError> {
    let started = Instant::now();
    let counter = Arc::new(AtomicU64::new(0));
    let repository = reference.repository();
    // The same blob may appear twice (an empty layer); push it once.
    let mut seen = std::collections::HashSet::new();
    let unique: Vec<BlobSource> = blobs
        .into_iter()
        .filter(|b| seen.insert(b.digest))
        .collect();
    let reports: Vec<BlobReport> = futures_util::stream::iter(unique.iter())
        .map(|blob| push_blob(client, repository, blob, options, &counter))
        .buffered(options.parallel.max(1))
        .try_collect()
        .await?;
    let manifest_digest = client.put_manifest(reference, media_type, manifest).await?;
    Ok(PushReport {
        reference: reference.without_digest().to_string(),
        manifest_digest,
        media_type: media_type.to_string(),
        blobs: reports,
        bytes_uploaded: counter.load(Ordering::Relaxed),
        seconds: started.elapsed().as_secs_f64(),
        uploaded_while_building: 0,
    })
}

/// Push one blob file to `repository` as the push of an image does each of its blobs
/// (HEAD first: a blob the repository has is not sent; then a mount from `mount_from`;
/// else an upload, chunked and resumable), before any manifest names it: `build --push`
/// sends each layer as soon as it is built. Bytes put on the wire are added to `sent`.
pub async fn push_blob_file(
    client: &RegistryClient,
    repository: &str,
    digest: Digest,
    size: u64,
    path: &Path,
    options: &PushOptions,
    sent: &Arc<AtomicU64>,
) -> Result<BlobReport, RegistryError> {
    let blob = BlobSource {
        digest,
        size: file_size(path, size)?,
        data: BlobData::File(path.to_path_buf()),
    };
    push_blob(client, repository, &blob, options, sent).await
}

async fn push_blob(
    client: &RegistryClient,
    repository: &str,
    blob: &BlobSource,
    options: &PushOptions,
    counter: &Arc<AtomicU64>,
) -> Result<BlobReport, RegistryError> {
    let wrap = |source: RegistryError| RegistryError::BlobUpload {
        repository: format!("{}/{repository}", client.registry()),
        digest: blob.digest,
        size: blob.size,
        source: Box::new(source),
    };
    let report = |outcome, mounted_from| BlobReport {
        digest: blob.digest,
        size: blob.size,
        outcome,
        mounted_from,
    };
    if client
        .has_blob(repository, &blob.digest)
        .await
        .map_err(wrap)?
    {
        return Ok(report(BlobOutcome::Present, None));
    }
    let mut session = None;
    for from in options.mount_from.iter().filter(|from| *from != repository) {
        match mount(client, repository, from, &blob.digest).await {
            Ok(Mount::Mounted) => return Ok(report(BlobOutcome::Mounted, Some(from.clone()))),
            Ok(Mount::Session(url)) => {
                session = Some(url);
                break;
            }
            Err(error) => {
                tracing::debug!(%from, digest = %blob.digest, %error, "cross-repository mount failed; uploading")
            }
        }
    }
    let outcome = upload(client, repository, blob, options, counter, session)
        .await
        .map_err(wrap)?;
    Ok(report(outcome, None))
}

enum Mount {
    Mounted,
    /// The registry could not mount and opened an upload session instead.
    Session(Url),
}

async fn mount(
    client: &RegistryClient,
    repository: &str,
    from: &str,
    digest: &Digest,
) -> Result<Mount, RegistryError> {
    let mut url = client.url(&format!("{repository}/blobs/uploads/"));
    url.query_pairs_mut()
        .append_pair("mount", &digest.to_string())
        .append_pair("from", from);
    let scopes = [scope(repository, "pull,push"), scope(from, "pull")];
    let (response, attempts) = client
        .request(Method::POST, &url, &scopes, HeaderMap::new(), &Body::Empty)
        .await?;
    match response.status() {
        StatusCode::CREATED => Ok(Mount::Mounted),
        StatusCode::ACCEPTED => Ok(Mount::Session(client.location(&response)?)),
        _ => Err(status_error(Method::POST, &url, response, attempts).await),
    }
}

/// Where an upload stands between attempts.
struct Upload {
    session: Option<Url>,
    /// Bytes the session holds.
    offset: u64,
    /// The last request failed: ask the session how much it holds before sending more.
    check_session: bool,
    resumed: bool,
}

async fn upload(
    client: &RegistryClient,
    repository: &str,
    blob: &BlobSource,
    options: &PushOptions,
    counter: &Arc<AtomicU64>,
    session: Option<Url>,
) -> Result<BlobOutcome, RegistryError> {
    let mut state = Upload {
        session,
        offset: 0,
        check_session: false,
        resumed: false,
    };
    let mut attempts = client.retry_policy().attempts(format_args!(
        "the upload of blob {} to `{}/{repository}`",
        blob.digest,
        client.registry()
    ));
    loop {
        attempts.start();
        let error =
            match upload_attempt(client, repository, blob, options, counter, &mut state).await {
                Ok(()) if state.resumed => return Ok(BlobOutcome::Resumed),
                Ok(()) => return Ok(BlobOutcome::Uploaded),
                Err(error) => error,
            };
        // The session is gone or disagrees about the offset: start the blob over.
        let session_lost = matches!(&error, RegistryError::Status { status, .. }
            if *status == StatusCode::NOT_FOUND || *status == StatusCode::RANGE_NOT_SATISFIABLE);
        if !(error.is_transient() || session_lost)
            || !attempts.retry(error_chain(&error), None).await
        {
            return Err(with_attempts(error, attempts.made()));
        }
        if session_lost {
            state.session = None;
            state.offset = 0;
            state.check_session = false;
        }
    }
}

/// `error` saying how many attempts were made (for the errors that say so).
fn with_attempts(error: RegistryError, attempts: u32) -> RegistryError {
    match error {
        RegistryError::Status {
            method,
            url,
            status,
            detail,
            ..
        } => RegistryError::Status {
            method,
            url,
            status,
            detail,
            attempts,
        },
        RegistryError::Transport {
            method,
            url,
            source,
            ..
        } => RegistryError::Transport {
            method,
            url,
            attempts,
            source,
        },
        error => error,
    }
}

fn octet_stream() -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers
}

/// `Range: 0-N` of an upload session -> bytes held. (`0-0` is what distribution answers
/// for an empty session, so it is read as 0.)
fn range_end(response: &reqwest::Response) -> Option<u64> {
    let value = response.headers().get("range")?.to_str().ok()?;
    let value = value.trim().trim_start_matches("bytes=");
    let (start, end) = value.split_once('-')?;
    let (start, end): (u64, u64) = (start.trim().parse().ok()?, end.trim().parse().ok()?);
    if start != 0 {
        return None;
    }
    Some(if end == 0 { 0 } else { end + 1 })
}

/// One try at uploading `blob`, continuing from where `state` says the session stands.
async fn upload_attempt(
    client: &RegistryClient,
    repository: &str,
    blob: &BlobSource,
    options: &PushOptions,
    counter: &Arc<AtomicU64>,
    state: &mut Upload,
) -> Result<(), RegistryError> {
    let scopes = [scope(repository, "pull,push")];
    if state.check_session {
        ask_session(client, &scopes, blob, state).await?;
        state.check_session = false;
    }
    let url = match state.session.clone() {
        Some(url) => url,
        None => open_session(client, repository, &scopes, state).await?,
    };
    // From here on a failure may leave bytes in the session.
    state.check_session = true;
    if state.offset == 0 && blob.size <= options.chunk_size {
        let body = blob.body(0, blob.size, counter);
        return close_session(client, &scopes, &url, blob, &body).await;
    }
    let url = send_chunks(client, &scopes, url, blob, options, counter, state).await?;
    close_session(client, &scopes, &url, blob, &Body::Empty).await
}

/// After a failure: ask the upload session how much of the blob it holds. An unknown or
/// invalid session means starting the blob over.
async fn ask_session(
    client: &RegistryClient,
    scopes: &[String],
    blob: &BlobSource,
    state: &mut Upload,
) -> Result<(), RegistryError> {
    let Some(url) = state.session.clone() else {
        return Ok(());
    };
    let response = client
        .send(Method::GET, &url, scopes, HeaderMap::new(), &Body::Empty)
        .await?;
    match response.status() {
        StatusCode::NO_CONTENT | StatusCode::OK => {
            let held = range_end(&response).unwrap_or(0).min(blob.size);
            if held > 0 {
                state.resumed = true;
            }
            state.offset = held;
            state.session = Some(client.location(&response).unwrap_or(url));
            tracing::debug!(digest = %blob.digest, held, "upload session found");
        }
        status if status.is_server_error() => {
            return Err(status_error(Method::GET, &url, response, 1).await)
        }
        _ => {
            state.session = None;
            state.offset = 0;
        }
    }
    Ok(())
}

/// Start an upload session (`POST .../blobs/uploads/`); returns its URL.
async fn open_session(
    client: &RegistryClient,
    repository: &str,
    scopes: &[String],
    state: &mut Upload,
) -> Result<Url, RegistryError> {
    let url = client.url(&format!("{repository}/blobs/uploads/"));
    let response = client
        .send(Method::POST, &url, scopes, HeaderMap::new(), &Body::Empty)
        .await?;
    if response.status() != StatusCode::ACCEPTED {
        return Err(status_error(Method::POST, &url, response, 1).await);
    }
    let location = client.location(&response)?;
    state.session = Some(location.clone());
    state.offset = 0;
    Ok(location)
}

/// PATCH the rest of the blob in chunks of `chunk_size`; returns the session's last URL.
async fn send_chunks(
    client: &RegistryClient,
    scopes: &[String],
    mut url: Url,
    blob: &BlobSource,
    options: &PushOptions,
    counter: &Arc<AtomicU64>,
    state: &mut Upload,
) -> Result<Url, RegistryError> {
    while state.offset < blob.size {
        let len = options.chunk_size.max(1).min(blob.size - state.offset);
        let mut headers = octet_stream();
        headers.insert(
            reqwest::header::CONTENT_RANGE,
            HeaderValue::from_str(&format!("{}-{}", state.offset, state.offset + len - 1))
                .expect("a range is ASCII"),
        );
        let body = blob.body(state.offset, len, counter);
        let response = client
            .send(Method::PATCH, &url, scopes, headers, &body)
            .await?;
        if response.status() != StatusCode::ACCEPTED {
            return Err(status_error(Method::PATCH, &url, response, 1).await);
        }
        let held = range_end(&response).unwrap_or(state.offset + len);
        if held != state.offset + len {
            return Err(RegistryError::Protocol {
                registry: client.registry().to_string(),
                what: "a chunk upload",
                detail: format!(
                    "after bytes {}-{} it holds {held} bytes",
                    state.offset,
                    state.offset + len - 1
                ),
            });
        }
        state.offset = held;
        url = client.location(&response)?;
        state.session = Some(url.clone());
    }
    Ok(url)
}

/// Close the session with `PUT ?digest=` (with `body`: the whole blob, or nothing after
/// the chunks).
async fn close_session(
    client: &RegistryClient,
    scopes: &[String],
    url: &Url,
    blob: &BlobSource,
    body: &Body,
) -> Result<(), RegistryError> {
    let mut put_url = url.clone();
    put_url
        .query_pairs_mut()
        .append_pair("digest", &blob.digest.to_string());
    let response = client
        .send(Method::PUT, &put_url, scopes, octet_stream(), body)
        .await?;
    if response.status() != StatusCode::CREATED {
        return Err(status_error(Method::PUT, &put_url, response, 1).await);
    }
    Ok(())
}

/// Repositories pushed to before, per registry: candidates for cross-repository mounts.
/// Kept as a small JSON file (e.g. in the cache directory).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct PushHistory {
    registries: BTreeMap<String, Vec<String>>,
}

impl PushHistory {
    /// Read the history; a missing or unreadable file is an empty history (it is a hint).
    pub fn load(path: &Path) -> Self {
        std::fs::read(path)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default()
    }

    /// Repositories of `registry` pushed to before, most recent first.
    pub fn repositories(&self, registry: &str) -> Vec<String> {
        self.registries.get(registry).cloned().unwrap_or_default()
    }

    pub fn record(&mut self, registry: &str, repository: &str) {
        let list = self.registries.entry(registry.to_string()).or_default();
        list.retain(|r| r != repository);
        list.insert(0, repository.to_string());
        list.truncate(20);
    }

    /// Write the history atomically.
    pub fn save(&self, path: &Path) -> Result<(), RegistryError> {
        let io = |source| RegistryError::Io {
            path: path.to_path_buf(),
            source,
        };
        let dir = path.parent().unwrap_or(Path::new("."));
        fs_err::create_dir_all(dir).map_err(io)?;
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| io(e.into()))?;
        crate::atomic_file::write(path, &bytes).map_err(io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_keeps_recent_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.json");
        let mut history = PushHistory::load(&path);
        history.record("r:5000", "a");
        history.record("r:5000", "b");
        history.record("r:5000", "a");
        history.save(&path).unwrap();
        assert_eq!(PushHistory::load(&path).repositories("r:5000"), ["a", "b"]);
        assert!(PushHistory::load(&path).repositories("other").is_empty());
    }
}
