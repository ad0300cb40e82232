//! Wheels built from the recipe's `build:` sdists, shared through a registry
//! (`build --wheel-cache REGISTRY/REPOSITORY`): one machine compiles an extension (an hour
//! or more for flash-attn), the others fetch its wheel and compile nothing.
//!
//! An entry is an OCI artifact tagged `wheel-<key>`, where `<key>` is the digest of the
//! source build's [`BuildKey`] (everything the build read: the sdist's sha256, every
//! artifact of the builder, the arch list from `gpus:`, the entry's env, the timestamp).
//! Its config is that key's JSON, so its config digest *is* the key: an entry whose
//! config is another key is refused whatever its tag says. Its one layer is the wheel,
//! named by its title annotation, and a second the build log.
//!
//! Before the source builds, every planned build the local cache lacks is looked up there;
//! a hit is downloaded (digest-checked, at most [`MAX_WHEEL_BYTES`]) and checked as a local
//! build's output is (a wheel of the sdist's own name and version), then stored as the
//! key's cache entry, which the source builds find. After them, every entry the registry
//! lacks is pushed. The registry is a cache: a miss, an error or a refused entry is said
//! on stderr and the wheel is built here; nothing of it fails the build.
//!
//! Trust: without keys, whoever can push to the repository can supply the wheel for a key,
//! as whoever can push an image can supply its layers. With `--sign-key` an entry carries
//! a sigstore bundle (a DSSE envelope over the claim "this key built this wheel": the key
//! digest, the wheel's name and sha256) as a third layer; with `--wheel-cache-key PUB` an
//! entry is taken only when such a bundle verifies with that key and claims exactly this
//! entry. The wheel's sha256 goes into the image's `io.cudastack.built.<name>` label, its
//! SBOM and provenance, whether it was compiled here or fetched.

// Registry errors name their URLs, as in the registry module.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;
use serde::Deserialize;

use crate::cache::BlobStore;
use crate::canonical;
use crate::digest::Digest;
use crate::reference::Reference;
use crate::registry::{ClientOptions, Manifest, RegistryClient, RegistryError, OCI_MANIFEST};
use crate::sign::bundle::Bundle;
use crate::sign::dsse::Envelope;
use crate::sign::key::{PublicKey, SigningKey};
use crate::source_build::{
    cached_wheel, check_wheel_name, store_fetched_wheel, BuildKey, PlannedBuild, SourceBuildError,
};
use crate::stack::BuildProgress;

/// The artifact type of an entry.
pub const WHEEL_ENTRY: &str = "application/vnd.cudastack.built-wheel.v1";
/// Its config: the build key's JSON.
const KEY_MEDIA_TYPE: &str = "application/vnd.cudastack.build-key.v1+json";
const WHEEL_MEDIA_TYPE: &str = "application/vnd.cudastack.wheel.v1+zip";
const LOG_MEDIA_TYPE: &str = "text/plain";
/// A signed entry's third layer: a sigstore bundle v0.3 around a DSSE envelope.
const BUNDLE_MEDIA_TYPE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
/// The DSSE payload type of the claim a bundle signs.
const CLAIM_TYPE: &str = "application/vnd.cudastack.built-wheel.claim.v1+json";
/// The largest signature bundle read.
const MAX_BUNDLE_BYTES: u64 = 64 << 10;
const TITLE: &str = "org.opencontainers.image.title";
/// The largest wheel fetched: flash-attn's wheels are ~250 MB, torch's ~800 MB.
pub const MAX_WHEEL_BYTES: u64 = 4 << 30;
/// The largest build log fetched.
const MAX_LOG_BYTES: u64 = 16 << 20;
/// The largest entry manifest read.
const MAX_ENTRY_MANIFEST: u64 = 64 << 10;

/// Why an entry was not fetched or not shared.
#[derive(Debug, thiserror::Error)]
pub enum SharedWheelError {
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Entry(#[from] SourceBuildError),
    #[error("`{reference}` is not a wheel of this build: {why}")]
    Refused { reference: String, why: String },
}

/// The repository of `build --wheel-cache`, a client for its registry, and the keys
/// entries are signed with and checked against.
pub struct SharedWheels {
    repository: Reference,
    client: RegistryClient,
    /// Signs the entries pushed (`--sign-key`).
    sign_key: Option<SigningKey>,
    /// When not empty, an entry is fetched only when one of these signed it
    /// (`--wheel-cache-key`).
    trusted: Vec<PublicKey>,
}

/// What became of one planned build at the registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The local cache had it: the registry was not asked.
    Local,
    /// Fetched from the registry (the entry's manifest digest).
    Fetched(Digest),
    /// The registry has no entry for the key.
    Missing,
    /// Pushed to the registry (the entry's manifest digest).
    Shared(Digest),
    /// The registry had it already.
    Present,
    /// An error, said on stderr; the build went on without the registry.
    Failed(String),
}

impl SharedWheels {
    /// The wheel cache at `repository` (`REGISTRY/REPOSITORY`, no tag or digest: each
    /// entry is a tag of its own).
    pub fn new(repository: &Reference, options: ClientOptions) -> Result<Self, RegistryError> {
        Ok(Self {
            client: RegistryClient::new(repository, options)?,
            repository: repository.without_digest(),
            sign_key: None,
            trusted: Vec::new(),
        })
    }

    /// Sign every entry pushed with `key`.
    pub fn signed_with(mut self, key: SigningKey) -> Self {
        self.sign_key = Some(key);
        self
    }

    /// Fetch only entries one of `keys` signed.
    pub fn trusting(mut self, keys: Vec<PublicKey>) -> Self {
        self.trusted = keys;
        self
    }

    /// The reference of `key`'s entry: `REPOSITORY:wheel-<key digest>`.
    pub fn entry(&self, key: &BuildKey) -> Reference {
        self.repository
            .with_tag(&format!("wheel-{}", key.digest().hex()))
            .expect("`wheel-` and 64 hex digits make a valid tag")
    }

    /// Fetch into the cache at `cache_root` every planned build's wheel it lacks and the
    /// registry has. Never fails: each outcome is returned, and said through `progress`.
    pub async fn fetch_missing(
        &self,
        cache_root: &Path,
        planned: &[PlannedBuild],
        store: &BlobStore,
        progress: &dyn BuildProgress,
    ) -> Vec<Outcome> {
        let mut outcomes = Vec::new();
        for build in planned {
            let outcome = match cached_wheel(cache_root, &build.key) {
                Ok(Some(_)) => Outcome::Local,
                _ => match self.fetch(cache_root, &build.key, store).await {
                    Ok(Some(manifest)) => Outcome::Fetched(manifest),
                    Ok(None) => Outcome::Missing,
                    Err(error) => Outcome::Failed(error.to_string()),
                },
            };
            let what = format!("{} {}", build.key.package, build.key.version);
            let entry = self.entry(&build.key);
            match &outcome {
                Outcome::Fetched(digest) => progress.stage(
                    "source",
                    &format!("{what}: fetched its wheel from {entry}@{digest}: nothing to compile"),
                ),
                Outcome::Missing => progress.stage(
                    "source",
                    &format!("{what}: not in the wheel cache ({entry}): building it here"),
                ),
                Outcome::Failed(error) => progress.stage(
                    "source",
                    &format!("{what}: the wheel cache failed ({error}); building it here"),
                ),
                _ => {}
            }
            outcomes.push(outcome);
        }
        outcomes
    }

    /// Push every planned build's cache entry the registry lacks (after the source builds:
    /// each has its entry then). Never fails: each outcome is returned, and said through
    /// `progress`.
    pub async fn share(
        &self,
        cache_root: &Path,
        planned: &[PlannedBuild],
        progress: &dyn BuildProgress,
    ) -> Vec<Outcome> {
        let mut outcomes = Vec::new();
        for build in planned {
            let outcome = match self.push(cache_root, &build.key).await {
                Ok(Some(manifest)) => Outcome::Shared(manifest),
                Ok(None) => Outcome::Present,
                Err(error) => Outcome::Failed(error.to_string()),
            };
            let what = format!("{} {}", build.key.package, build.key.version);
            let entry = self.entry(&build.key);
            match &outcome {
                Outcome::Shared(digest) => progress.stage(
                    "source",
                    &format!("{what}: shared its wheel as {entry}@{digest}"),
                ),
                Outcome::Failed(error) => progress.stage(
                    "source",
                    &format!("{what}: could not share its wheel as {entry}: {error}"),
                ),
                _ => {}
            }
            outcomes.push(outcome);
        }
        outcomes
    }

    /// Whether the registry's `manifest` for `key` stays: an entry of that key, signed by
    /// this build's key when it signs.
    async fn keeps(&self, manifest: &Manifest, key: &BuildKey) -> bool {
        let Ok(entry) = EntryManifest::parse(&manifest.bytes, &manifest.media_type, key) else {
            return false;
        };
        let Some(sign_key) = &self.sign_key else {
            return true;
        };
        let Some(bundle) = &entry.bundle else {
            return false;
        };
        let Ok(bundle) = self
            .client
            .get_blob_bytes(
                self.repository.repository(),
                &bundle.digest,
                MAX_BUNDLE_BYTES,
            )
            .await
        else {
            return false;
        };
        let claim = claim(key, &entry.wheel_name, &entry.wheel.digest);
        signed_by_one_of(&bundle, &claim, &[sign_key.public_key()]).is_ok()
    }

    /// The entry of `key`, stored as the key's cache entry: its manifest digest, or None
    /// when the registry has no entry.
    pub async fn fetch(
        &self,
        cache_root: &Path,
        key: &BuildKey,
        store: &BlobStore,
    ) -> Result<Option<Digest>, SharedWheelError> {
        let reference = self.entry(key);
        let manifest = match self
            .client
            .get_manifest_limited(&reference, MAX_ENTRY_MANIFEST)
            .await
        {
            Ok(manifest) => manifest,
            Err(RegistryError::ManifestNotFound { .. }) => return Ok(None),
            Err(error) => return Err(error.into()),
        };
        let refuse = |why: String| SharedWheelError::Refused {
            reference: format!("{reference}@{}", manifest.digest),
            why,
        };
        let entry =
            EntryManifest::parse(&manifest.bytes, &manifest.media_type, key).map_err(refuse)?;
        // Named as a local build's wheel must be, before a byte of it is fetched.
        check_wheel_name(&entry.wheel_name, key)?;
        let repository = self.repository.repository();
        if !self.trusted.is_empty() {
            let bundle = match &entry.bundle {
                Some(bundle) => {
                    self.client
                        .get_blob_bytes(repository, &bundle.digest, MAX_BUNDLE_BYTES)
                        .await?
                }
                None => Bytes::new(),
            };
            let claim = claim(key, &entry.wheel_name, &entry.wheel.digest);
            signed_by_one_of(&bundle, &claim, &self.trusted).map_err(refuse)?;
        }
        let what = format!("the wheel {} of {reference}", entry.wheel_name);
        self.client
            .download_blob(
                repository,
                &entry.wheel.digest,
                entry.wheel.size,
                store,
                &what,
            )
            .await?;
        // A log larger than a fetch takes (pushed by another tool) is left behind: the
        // wheel does not depend on it.
        let log = match entry.log.as_ref().filter(|log| log.size <= MAX_LOG_BYTES) {
            Some(log) => {
                self.client
                    .get_blob_bytes(repository, &log.digest, MAX_LOG_BYTES)
                    .await?
            }
            None => Bytes::new(),
        };
        let how = format!("fetched from {reference}@{}", manifest.digest);
        store_fetched_wheel(
            cache_root,
            key,
            &entry.wheel_name,
            &store.path(&entry.wheel.digest),
            &log,
            &how,
        )?;
        Ok(Some(manifest.digest))
    }

    /// Push the cache entry of `key` unless the registry has one: its manifest digest, or
    /// None when the registry had it.
    pub async fn push(
        &self,
        cache_root: &Path,
        key: &BuildKey,
    ) -> Result<Option<Digest>, SharedWheelError> {
        let reference = self.entry(key);
        match self
            .client
            .get_manifest_limited(&reference, MAX_ENTRY_MANIFEST)
            .await
        {
            Ok(manifest) if self.keeps(&manifest, key).await => return Ok(None),
            // Absent, not an entry of this key (a tag pushed by something else), or
            // unsigned when this build signs: ours replaces it.
            Ok(_) | Err(RegistryError::ManifestNotFound { .. }) => {}
            Err(error) => return Err(error.into()),
        }
        let Some(built) = cached_wheel(cache_root, key)? else {
            return Err(SharedWheelError::Refused {
                reference: reference.to_string(),
                why: "the local cache has no finished entry of it to share".into(),
            });
        };
        let repository = self.repository.repository();
        let key_json = key_json(key);
        self.client
            .put_blob_bytes(repository, Bytes::from(key_json.clone()))
            .await?;
        let wheel_size = fs_err::metadata(built.path())
            .map_err(|source| RegistryError::Io {
                path: built.path().to_path_buf(),
                source,
            })?
            .len();
        let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        crate::registry::push_blob_file(
            &self.client,
            repository,
            built.sha256(),
            wheel_size,
            built.path(),
            &crate::registry::PushOptions::default(),
            &sent,
        )
        .await?;
        // The end of the log, which says why a build did what it did, and no more than a
        // fetch takes.
        let log = log_tail(&built.log, MAX_LOG_BYTES);
        let log_digest = Digest::of_bytes(&log);
        let log_size = log.len() as u64;
        self.client
            .put_blob_bytes(repository, Bytes::from(log))
            .await?;
        let name = built
            .path()
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut layers = vec![
            serde_json::json!({
                "mediaType": WHEEL_MEDIA_TYPE,
                "digest": built.sha256().to_string(),
                "size": wheel_size,
                "annotations": { TITLE: name },
            }),
            serde_json::json!({
                "mediaType": LOG_MEDIA_TYPE,
                "digest": log_digest.to_string(),
                "size": log_size,
                "annotations": { TITLE: "build.log" },
            }),
        ];
        if let Some(sign_key) = &self.sign_key {
            let claim = claim(key, &name, &built.sha256());
            let envelope = Envelope::sign(CLAIM_TYPE, claim, sign_key);
            let bundle = Bundle::new(envelope, &sign_key.public_key()).to_json();
            let size = bundle.len();
            let digest = self
                .client
                .put_blob_bytes(repository, Bytes::from(bundle))
                .await?;
            layers.push(serde_json::json!({
                "mediaType": BUNDLE_MEDIA_TYPE,
                "digest": digest.to_string(),
                "size": size,
            }));
        }
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "artifactType": WHEEL_ENTRY,
            "config": {
                "mediaType": KEY_MEDIA_TYPE,
                "digest": key.digest().to_string(),
                "size": key_json.len(),
            },
            "layers": layers,
        });
        let bytes = Bytes::from(
            canonical::to_canonical_json(&manifest).expect("a JSON value always serialises"),
        );
        let digest = self
            .client
            .put_manifest(&reference, OCI_MANIFEST, bytes)
            .await?;
        Ok(Some(digest))
    }
}

/// The last `max` bytes of the file `path` (nothing when it cannot be read): only those
/// are read, however long a compile's log grew.
fn log_tail(path: &Path, max: u64) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let mut tail = Vec::new();
    let Ok(mut file) = std::fs::File::open(path) else {
        return tail;
    };
    let length = file.metadata().map_or(0, |meta| meta.len());
    if file
        .seek(SeekFrom::Start(length.saturating_sub(max)))
        .is_ok()
    {
        let _ = file.take(max).read_to_end(&mut tail);
    }
    tail
}

/// What a signature of an entry says: this build key made this wheel (canonical JSON).
fn claim(key: &BuildKey, wheel_name: &str, wheel: &Digest) -> Vec<u8> {
    let claim = serde_json::json!({
        "key": key.digest().to_string(),
        "wheel": { "name": wheel_name, "sha256": wheel.to_string() },
    });
    canonical::to_canonical_json(&claim).expect("a JSON value always serialises")
}

/// Ok when `bundle` is a sigstore bundle whose envelope one of `keys` signed and whose
/// payload is exactly `claim`; else why not.
fn signed_by_one_of(bundle: &[u8], claim: &[u8], keys: &[PublicKey]) -> Result<(), String> {
    if bundle.is_empty() {
        return Err("it is not signed, and --wheel-cache-key asks for a signature".into());
    }
    let bundle = Bundle::from_json(bundle, "its signature bundle").map_err(|e| e.to_string())?;
    let mut why = Vec::new();
    for key in keys {
        match bundle.verify(key) {
            Ok(payload) if payload == claim => return Ok(()),
            Ok(_) => why.push(format!("key {} signed another wheel or key", key.key_id())),
            Err(error) => why.push(format!("key {}: {error}", key.key_id())),
        }
    }
    Err(format!("no trusted key signed it ({})", why.join("; ")))
}

/// The bytes whose sha256 is [`BuildKey::digest`]: the entry's config.
fn key_json(key: &BuildKey) -> Vec<u8> {
    let json = serde_json::to_string(&serde_json::to_value(key).expect("serialises"))
        .expect("a JSON value always serialises");
    debug_assert_eq!(Digest::of_bytes(json.as_bytes()), key.digest());
    json.into_bytes()
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    media_type: String,
    digest: Digest,
    size: u64,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawEntry {
    #[serde(default)]
    artifact_type: Option<String>,
    config: Descriptor,
    layers: Vec<Descriptor>,
}

/// An entry's manifest, checked against the key it must be for.
#[derive(Debug)]
struct EntryManifest {
    wheel: Descriptor,
    wheel_name: String,
    log: Option<Descriptor>,
    bundle: Option<Descriptor>,
}

impl EntryManifest {
    /// Refused, with why, unless it is an entry of exactly `key`: its config the key's JSON
    /// (by digest), one wheel layer of at most [`MAX_WHEEL_BYTES`] with a title, and at
    /// most a log beside it.
    fn parse(bytes: &[u8], media_type: &str, key: &BuildKey) -> Result<Self, String> {
        if media_type != OCI_MANIFEST {
            return Err(format!(
                "its manifest is a {media_type}, not an OCI image manifest"
            ));
        }
        let raw: RawEntry = serde_json::from_slice(bytes)
            .map_err(|error| format!("its manifest does not parse: {error}"))?;
        if raw.artifact_type.as_deref() != Some(WHEEL_ENTRY) {
            return Err(format!(
                "its artifact type is {}, not {WHEEL_ENTRY}",
                raw.artifact_type.as_deref().unwrap_or("none")
            ));
        }
        if raw.config.media_type != KEY_MEDIA_TYPE || raw.config.digest != key.digest() {
            return Err(format!(
                "its config ({} {}) is not this build's key ({KEY_MEDIA_TYPE} {}): it was built from other inputs",
                raw.config.media_type,
                raw.config.digest,
                key.digest()
            ));
        }
        let mut wheels = Vec::new();
        let mut logs = Vec::new();
        let mut bundles = Vec::new();
        for layer in raw.layers {
            match layer.media_type.as_str() {
                WHEEL_MEDIA_TYPE => wheels.push(layer),
                LOG_MEDIA_TYPE => logs.push(layer),
                BUNDLE_MEDIA_TYPE => bundles.push(layer),
                other => return Err(format!("it has a layer of type {other}")),
            }
        }
        if bundles.len() > 1 {
            return Err(format!(
                "it has {} signature bundles, not at most one",
                bundles.len()
            ));
        }
        if wheels.len() != 1 {
            return Err(format!("it has {} wheels, not one", wheels.len()));
        }
        if logs.len() > 1 {
            return Err(format!("it has {} build logs, not at most one", logs.len()));
        }
        let wheel = wheels.remove(0);
        if wheel.size > MAX_WHEEL_BYTES {
            return Err(format!(
                "its wheel is {} bytes, more than the {MAX_WHEEL_BYTES} cudastack fetches",
                wheel.size
            ));
        }
        let wheel_name = wheel
            .annotations
            .get(TITLE)
            .cloned()
            .ok_or_else(|| format!("its wheel has no {TITLE} annotation (the file name)"))?;
        Ok(Self {
            wheel,
            wheel_name,
            log: logs.pop(),
            bundle: bundles.pop(),
        })
    }
}
