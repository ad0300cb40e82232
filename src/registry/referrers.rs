//! Referrers: attach an artifact (a verification report, an SBOM) to an image manifest.
//!
//! The artifact is an OCI 1.1 image manifest with `artifactType`, the empty config and a
//! `subject` naming the image. A registry with the referrers API says so by answering the
//! PUT with an `OCI-Subject` header; for one without it (docker-registry 2.8, many
//! mirrors) the client maintains the spec's fallback: an image index tagged
//! `sha256-<hex of the subject>` listing the referrers.

use std::collections::BTreeMap;

use bytes::Bytes;
use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use super::authorized::{status_error, Body};
use super::client::{scope, RegistryClient, OCI_EMPTY, OCI_INDEX, OCI_MANIFEST};
use super::RegistryError;
use crate::canonical::to_canonical_json;
use crate::digest::Digest;
use crate::reference::Reference;

/// The manifest an artifact refers to.
#[derive(Debug, Clone)]
pub struct Subject {
    pub media_type: String,
    pub digest: Digest,
    pub size: u64,
}

/// One payload of an artifact.
#[derive(Debug, Clone)]
pub struct ArtifactLayer {
    pub media_type: String,
    pub bytes: Bytes,
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ReferrerReport {
    /// The artifact manifest's digest.
    pub digest: Digest,
    /// Blob bytes sent (the registry had the others).
    pub bytes_uploaded: u64,
    /// The fallback tag written when the registry has no referrers API.
    pub fallback_tag: Option<String>,
}

/// The tag the referrers fallback uses for `subject` (`sha256-<hex>`).
pub fn fallback_tag(subject: &Digest) -> String {
    format!("sha256-{}", subject.hex())
}

fn descriptor(media_type: &str, digest: &Digest, size: u64) -> Value {
    json!({"mediaType": media_type, "digest": digest.to_string(), "size": size})
}

/// Push an artifact of `artifact_type` whose subject is `subject` in the repository of
/// `repository` (its tag and digest are ignored). Returns the artifact's digest.
pub async fn push_referrer(
    client: &RegistryClient,
    repository: &Reference,
    subject: &Subject,
    artifact_type: &str,
    layers: Vec<ArtifactLayer>,
    annotations: BTreeMap<String, String>,
) -> Result<ReferrerReport, RegistryError> {
    let repo = repository.repository();
    let (bytes, bytes_uploaded) =
        artifact_manifest(client, repo, subject, artifact_type, &layers, &annotations).await?;
    let digest = Digest::of_bytes(&bytes);
    let size = bytes.len() as u64;
    if put_artifact_manifest(client, repo, &digest, bytes).await? {
        return Ok(ReferrerReport {
            digest,
            bytes_uploaded,
            fallback_tag: None,
        });
    }
    let mut entry = descriptor(OCI_MANIFEST, &digest, size);
    entry["artifactType"] = json!(artifact_type);
    if !annotations.is_empty() {
        entry["annotations"] = json!(annotations);
    }
    let tag = fallback_tag(&subject.digest);
    add_to_fallback_index(client, &repository.with_tag(&tag)?, &digest, entry).await?;
    Ok(ReferrerReport {
        digest,
        bytes_uploaded,
        fallback_tag: Some(tag),
    })
}

/// Upload the artifact's blobs (the empty config and `layers`) to `repo`; returns its
/// manifest's canonical bytes and the blob bytes sent.
async fn artifact_manifest(
    client: &RegistryClient,
    repo: &str,
    subject: &Subject,
    artifact_type: &str,
    layers: &[ArtifactLayer],
    annotations: &BTreeMap<String, String>,
) -> Result<(Bytes, u64), RegistryError> {
    let empty = Bytes::from_static(b"{}");
    let (empty_digest, mut sent) = client.put_blob_bytes_counted(repo, empty.clone()).await?;
    let mut layer_descriptors = Vec::new();
    for layer in layers {
        let (digest, bytes) = client
            .put_blob_bytes_counted(repo, layer.bytes.clone())
            .await?;
        sent += bytes;
        let mut d = descriptor(&layer.media_type, &digest, layer.bytes.len() as u64);
        if !layer.annotations.is_empty() {
            d["annotations"] = json!(layer.annotations);
        }
        layer_descriptors.push(d);
    }
    let mut manifest = json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": artifact_type,
        "config": descriptor(OCI_EMPTY, &empty_digest, 2),
        "layers": layer_descriptors,
        "subject": descriptor(&subject.media_type, &subject.digest, subject.size),
    });
    if !annotations.is_empty() {
        manifest["annotations"] = json!(annotations);
    }
    Ok((
        Bytes::from(to_canonical_json(&manifest).expect("JSON values serialise")),
        sent,
    ))
}

/// PUT the artifact manifest by digest; true when the registry indexes its subject (it
/// answers with `OCI-Subject`), so no fallback tag is needed.
async fn put_artifact_manifest(
    client: &RegistryClient,
    repo: &str,
    digest: &Digest,
    bytes: Bytes,
) -> Result<bool, RegistryError> {
    let url = client.url(&format!("{repo}/manifests/{digest}"));
    let scopes = [scope(repo, "pull,push")];
    let mut headers = HeaderMap::new();
    headers.insert(
        reqwest::header::CONTENT_TYPE,
        reqwest::header::HeaderValue::from_static(OCI_MANIFEST),
    );
    let (response, attempts) = client
        .request(Method::PUT, &url, &scopes, headers, &Body::Bytes(bytes))
        .await?;
    if !response.status().is_success() {
        return Err(status_error(Method::PUT, &url, response, attempts).await);
    }
    Ok(response.headers().contains_key("oci-subject"))
}

/// Add `entry` (the artifact `digest`) to the referrers index under the fallback tag
/// `tag_reference`, creating the index when there is none.
async fn add_to_fallback_index(
    client: &RegistryClient,
    tag_reference: &Reference,
    digest: &Digest,
    entry: Value,
) -> Result<(), RegistryError> {
    let not_an_index = |detail: String| RegistryError::Document {
        path: tag_reference.to_string(),
        what: "a referrers index",
        detail,
    };
    let mut index = match client.get_manifest(tag_reference).await {
        Ok(existing) => serde_json::from_slice::<Value>(&existing.bytes)
            .map_err(|e| not_an_index(e.to_string()))?,
        Err(RegistryError::ManifestNotFound { .. }) => {
            json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []})
        }
        Err(error) => return Err(error),
    };
    let manifests = index["manifests"]
        .as_array_mut()
        .ok_or_else(|| not_an_index("it has no `manifests` list".to_string()))?;
    if !manifests
        .iter()
        .any(|m| m["digest"].as_str() == Some(&digest.to_string()))
    {
        manifests.push(entry);
    }
    let index_bytes = Bytes::from(to_canonical_json(&index).expect("JSON values serialise"));
    client
        .put_manifest(tag_reference, OCI_INDEX, index_bytes)
        .await?;
    Ok(())
}

/// The referrers of `subject` (descriptors with `artifactType`), from the referrers API,
/// or the fallback tag when the registry has none.
pub async fn list_referrers(
    client: &RegistryClient,
    repository: &Reference,
    subject: &Digest,
) -> Result<Vec<Value>, RegistryError> {
    Ok(list_entries(client, repository, subject, None).await?.0)
}

/// The index entries listing the referrers of `subject`, and the bytes read for them. With
/// `artifact_type`, the referrers API is asked for that type only (`?artifactType=`, OCI
/// distribution 1.1); a registry may ignore it, so callers filter again.
async fn list_entries(
    client: &RegistryClient,
    repository: &Reference,
    subject: &Digest,
    artifact_type: Option<&str>,
) -> Result<(Vec<Value>, u64), RegistryError> {
    let repo = repository.repository();
    let mut url = client.url(&format!("{repo}/referrers/{subject}"));
    if let Some(artifact_type) = artifact_type {
        url.query_pairs_mut()
            .append_pair("artifactType", artifact_type);
    }
    let not_an_index = |detail: String| RegistryError::Document {
        path: repository.to_string(),
        what: "a referrers index",
        detail,
    };
    let (response, attempts) = client
        .request(
            Method::GET,
            &url,
            &[scope(repo, "pull")],
            HeaderMap::new(),
            &Body::Empty,
        )
        .await?;
    let bytes = if response.status().is_success() {
        // The referrers API answers an image index: as small as a manifest is.
        super::authorized::read_limited(response, &url, MAX_REFERRERS_INDEX, || {
            not_an_index(format!("it is larger than {MAX_REFERRERS_INDEX} bytes"))
        })
        .await?
    } else if response.status() == StatusCode::NOT_FOUND {
        match client
            .get_manifest(&repository.with_tag(&fallback_tag(subject))?)
            .await
        {
            Ok(manifest) => manifest.bytes,
            Err(RegistryError::ManifestNotFound { .. }) => return Ok((Vec::new(), 0)),
            Err(error) => return Err(error),
        }
    } else {
        return Err(status_error(Method::GET, &url, response, attempts).await);
    };
    let index: Value = serde_json::from_slice(&bytes).map_err(|e| not_an_index(e.to_string()))?;
    let entries = index["manifests"].as_array().cloned().unwrap_or_default();
    Ok((entries, bytes.len() as u64))
}

/// The referrers index is read up to this size (a manifest's limit).
const MAX_REFERRERS_INDEX: u64 = super::client::MAX_MANIFEST;

/// How much of one image's referrers one operation reads: at most `max_count`
/// referrer manifests fetched, and at most `max_bytes` in all of what is read for them
/// (the listing, every manifest and every blob). A registry listing 256 referrers of
/// 4 MiB took `inspect`, `check` and `pull` to 2.1 GB of memory: an image's attestations
/// are a few documents of a few MB, so a listing past this is skipped, and said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReferrerBudget {
    pub max_count: usize,
    pub max_bytes: u64,
}

/// The default budget: 64 referrers, 64 MiB.
pub const MAX_REFERRERS: usize = 64;
pub const MAX_REFERRER_BYTES: u64 = 64 << 20;

impl Default for ReferrerBudget {
    fn default() -> Self {
        ReferrerBudget {
            max_count: MAX_REFERRERS,
            max_bytes: MAX_REFERRER_BYTES,
        }
    }
}

impl std::fmt::Display for ReferrerBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "at most {} referrers and {} MiB of their manifests and blobs per image",
            self.max_count,
            self.max_bytes >> 20
        )
    }
}

/// The artifact types an operation reads; the others are never fetched.
#[derive(Debug, Clone, Copy)]
pub enum ArtifactTypes<'a> {
    All,
    Only(&'a [&'a str]),
}

impl ArtifactTypes<'_> {
    pub fn wants(&self, artifact_type: &str) -> bool {
        match self {
            ArtifactTypes::All => true,
            ArtifactTypes::Only(types) => types.contains(&artifact_type),
        }
    }

    /// The one type to ask the referrers API for, when there is one.
    fn query(&self) -> Option<&str> {
        match self {
            ArtifactTypes::Only([one]) => Some(*one),
            _ => None,
        }
    }

    /// Whether an index entry listed as `listed` may be of a wanted type. An entry without
    /// a type, or with the empty config's (cosign 3 writes that there), is fetched to learn
    /// its type from its manifest; a lie here can only hide a referrer, as a registry can.
    fn may_want(&self, listed: Option<&str>) -> bool {
        match listed {
            None | Some(OCI_EMPTY) | Some("") => true,
            Some(listed) => self.wants(listed),
        }
    }
}

/// Where the blob of a wanted referrer goes: into memory (what `inspect` and `check`
/// parse), or streamed into the blob store, digest-checked (what `pull` copies).
#[derive(Clone, Copy)]
pub enum BlobSink<'a> {
    Memory,
    Store(&'a crate::cache::BlobStore),
}

/// The first blob of a fetched referrer.
#[derive(Debug, Clone)]
pub struct FetchedBlob {
    pub media_type: String,
    pub digest: Digest,
    pub size: u64,
    pub content: BlobContent,
}

#[derive(Debug, Clone)]
pub enum BlobContent {
    Bytes(Bytes),
    /// In the blob store, at this path.
    File(std::path::PathBuf),
}

/// A referrer as a registry holds it: its manifest (bytes, as served) and its first blob.
#[derive(Debug, Clone)]
pub struct FetchedReferrer {
    pub digest: Digest,
    /// The manifest's `artifactType`, else its config's media type (OCI 1.1): the index
    /// entry's own field is not trusted (cosign 3 writes the empty config's type there).
    pub artifact_type: String,
    pub annotations: BTreeMap<String, String>,
    pub manifest: Bytes,
    /// None for an artifact without a layer.
    pub blob: Option<FetchedBlob>,
}

impl FetchedReferrer {
    /// The blob's bytes, when it was read into memory.
    pub fn blob_bytes(&self) -> Option<&Bytes> {
        match &self.blob.as_ref()?.content {
            BlobContent::Bytes(bytes) => Some(bytes),
            BlobContent::File(_) => None,
        }
    }
}

/// A referrer of a wanted (or unknown) type that was not read, and why.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SkippedReferrer {
    /// As the listing gives it (escaped for printing).
    pub digest: String,
    /// The reason, in words.
    pub why: String,
}

/// What [`fetch_referrers`] read, and what it did not.
#[derive(Debug, Clone, Default)]
pub struct FetchedReferrers {
    pub referrers: Vec<FetchedReferrer>,
    /// Referrers of types the operation does not read (never fetched, or fetched only as
    /// far as their manifest).
    pub other_types: usize,
    pub skipped: Vec<SkippedReferrer>,
    /// When the budget ran out: the line to say on stderr, naming the registry, the image
    /// and the limit.
    pub over_budget: Option<String>,
}

/// The budget left while reading one image's referrers.
struct Spending {
    budget: ReferrerBudget,
    count: usize,
    bytes: u64,
    /// Referrers left unread for the budget.
    refused: usize,
}

impl Spending {
    fn bytes_left(&self) -> u64 {
        self.budget.max_bytes.saturating_sub(self.bytes)
    }

    /// Take one more referrer, or say which limit it is over.
    fn take_one(&mut self) -> Result<(), String> {
        if self.count >= self.budget.max_count {
            self.refused += 1;
            return Err(format!(
                "over the limit of {} referrers per image",
                self.budget.max_count
            ));
        }
        self.count += 1;
        Ok(())
    }

    /// Take `size` bytes (as a descriptor declares them, before reading), or say why not.
    fn take_bytes(&mut self, size: u64, what: &str) -> Result<(), String> {
        if size > self.bytes_left() {
            self.refused += 1;
            return Err(format!(
                "its {what} of {size} bytes is over what is left of the {} MiB read per image ({} bytes)",
                self.budget.max_bytes >> 20,
                self.bytes_left()
            ));
        }
        self.bytes += size;
        Ok(())
    }
}

/// Why a referrer was not kept: over the budget (said once, in the summary) or unreadable
/// (a warning naming it: one bad artifact does not hide the others).
enum NotRead {
    Budget(String),
    OtherType,
    Error(RegistryError),
}

impl From<RegistryError> for NotRead {
    fn from(error: RegistryError) -> Self {
        NotRead::Error(error)
    }
}

/// The referrers of `subject` in the repository of `repository` of the `types` wanted,
/// within `budget`: entries the listing gives another type are never fetched;
/// each manifest is read up to the size its entry declares and each blob up to the size
/// its manifest declares, both counted before they are read, and blobs go to `sink`
/// (digest-checked). Errors are the registry's answer to the listing itself.
pub async fn fetch_referrers(
    client: &RegistryClient,
    repository: &Reference,
    subject: &Digest,
    types: ArtifactTypes<'_>,
    budget: ReferrerBudget,
    sink: BlobSink<'_>,
) -> Result<FetchedReferrers, RegistryError> {
    let (entries, listing_bytes) = list_entries(client, repository, subject, types.query()).await?;
    let mut spending = Spending {
        budget,
        count: 0,
        bytes: listing_bytes,
        refused: 0,
    };
    let mut fetched = FetchedReferrers::default();
    for entry in &entries {
        let listed = entry["digest"].as_str().unwrap_or_default();
        if !types.may_want(entry["artifactType"].as_str()) {
            fetched.other_types += 1;
            continue;
        }
        let skip = |why: String| SkippedReferrer {
            digest: crate::printable::short(listed),
            why,
        };
        match fetch_referrer(client, repository, entry, types, &mut spending, sink).await {
            Ok(referrer) => fetched.referrers.push(referrer),
            Err(NotRead::OtherType) => fetched.other_types += 1,
            Err(NotRead::Budget(why)) => fetched.skipped.push(skip(why)),
            Err(NotRead::Error(error)) => {
                tracing::warn!("{repository}: a referrer of {subject} is skipped: {error}");
                fetched.skipped.push(skip(error.to_string()));
            }
        }
    }
    if spending.refused > 0 {
        fetched.over_budget = Some(format!(
            "{}/{}: {} referrer(s) of {subject} were not read: cudastack reads {budget}, so a registry cannot make it read without end; the rest are skipped",
            client.registry(),
            repository.repository(),
            spending.refused,
        ));
    }
    Ok(fetched)
}

/// One referrer of an index entry: its manifest and, when of a wanted type, its first blob.
async fn fetch_referrer(
    client: &RegistryClient,
    repository: &Reference,
    entry: &Value,
    types: ArtifactTypes<'_>,
    spending: &mut Spending,
    sink: BlobSink<'_>,
) -> Result<FetchedReferrer, NotRead> {
    let not_a_manifest = |detail: String| RegistryError::Document {
        path: repository.to_string(),
        what: "a referrer manifest",
        detail,
    };
    let digest: Digest = entry["digest"]
        .as_str()
        .unwrap_or_default()
        .parse()
        .map_err(|e| not_a_manifest(format!("its index entry has no valid digest: {e}")))?;
    let size = entry["size"]
        .as_u64()
        .ok_or_else(|| not_a_manifest("its index entry has no size".to_string()))?;
    spending.take_one().map_err(NotRead::Budget)?;
    spending
        .take_bytes(size, "manifest")
        .map_err(NotRead::Budget)?;
    let manifest = client
        .get_manifest_limited(&repository.without_digest().with_digest(digest), size)
        .await?;
    let value: Value =
        serde_json::from_slice(&manifest.bytes).map_err(|e| not_a_manifest(e.to_string()))?;
    let artifact_type = value["artifactType"]
        .as_str()
        .or_else(|| value["config"]["mediaType"].as_str())
        .unwrap_or_default()
        .to_string();
    if !types.wants(&artifact_type) {
        return Err(NotRead::OtherType);
    }
    let annotations = value["annotations"]
        .as_object()
        .map(|map| {
            map.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default();
    let blob = match value["layers"].as_array().and_then(|l| l.first()) {
        Some(layer) => Some(fetch_blob(client, repository, layer, spending, sink).await?),
        None => None,
    };
    Ok(FetchedReferrer {
        digest,
        artifact_type,
        annotations,
        manifest: manifest.bytes,
        blob,
    })
}

/// The blob a referrer's layer descriptor names, read up to the size it declares.
async fn fetch_blob(
    client: &RegistryClient,
    repository: &Reference,
    layer: &Value,
    spending: &mut Spending,
    sink: BlobSink<'_>,
) -> Result<FetchedBlob, NotRead> {
    let not_a_manifest = |detail: String| RegistryError::Document {
        path: repository.to_string(),
        what: "a referrer manifest",
        detail,
    };
    let digest: Digest = layer["digest"]
        .as_str()
        .unwrap_or_default()
        .parse()
        .map_err(|e| not_a_manifest(format!("its layer has no valid digest: {e}")))?;
    let size = layer["size"]
        .as_u64()
        .ok_or_else(|| not_a_manifest("its layer has no size".to_string()))?;
    spending.take_bytes(size, "blob").map_err(NotRead::Budget)?;
    let repo = repository.repository();
    let content = match sink {
        BlobSink::Memory => BlobContent::Bytes(client.get_blob_bytes(repo, &digest, size).await?),
        BlobSink::Store(store) => {
            BlobContent::File(blob_into_store(client, repo, &digest, size, store).await?)
        }
    };
    Ok(FetchedBlob {
        media_type: layer["mediaType"].as_str().unwrap_or_default().to_string(),
        digest,
        size,
        content,
    })
}

/// Stream the blob `digest` of `size` bytes into `store` (never more than `size` bytes
/// written, the digest checked before it is kept); returns its path there.
async fn blob_into_store(
    client: &RegistryClient,
    repository: &str,
    digest: &Digest,
    size: u64,
    store: &crate::cache::BlobStore,
) -> Result<std::path::PathBuf, RegistryError> {
    if !store.contains(digest) {
        let what = format!(
            "referrer blob {digest} of `{}/{repository}`",
            client.registry()
        );
        client
            .download_blob(repository, digest, size, store, &what)
            .await?;
    }
    Ok(store.path(digest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listed_type_filters_before_fetching_unless_it_says_nothing() {
        let bundles = ArtifactTypes::Only(&[crate::sign::bundle::MEDIA_TYPE]);
        assert!(bundles.may_want(Some(crate::sign::bundle::MEDIA_TYPE)));
        assert!(!bundles.may_want(Some("application/spdx+json")));
        // No type, or the empty config's (cosign 3): the manifest says what it is.
        assert!(bundles.may_want(None));
        assert!(bundles.may_want(Some(OCI_EMPTY)));
        assert_eq!(bundles.query(), Some(crate::sign::bundle::MEDIA_TYPE));
        assert_eq!(ArtifactTypes::All.query(), None);
    }

    #[test]
    fn the_budget_counts_manifests_and_blobs_and_says_which_limit() {
        let mut spending = Spending {
            budget: ReferrerBudget {
                max_count: 2,
                max_bytes: 100,
            },
            count: 0,
            bytes: 10,
            refused: 0,
        };
        assert!(spending.take_one().is_ok());
        assert!(spending.take_bytes(60, "manifest").is_ok());
        let over = spending.take_bytes(31, "blob").unwrap_err();
        assert!(
            over.contains("blob of 31 bytes") && over.contains("30 bytes"),
            "{over}"
        );
        assert!(spending.take_one().is_ok());
        assert!(spending
            .take_one()
            .unwrap_err()
            .contains("limit of 2 referrers"));
        assert_eq!(spending.refused, 2);
    }
}
