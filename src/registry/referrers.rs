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

use super::client::{
    scope, status_error, Body, RegistryClient, OCI_EMPTY, OCI_INDEX, OCI_MANIFEST,
};
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
    let repo = repository.repository();
    let url = client.url(&format!("{repo}/referrers/{subject}"));
    let (response, attempts) = client
        .request(
            Method::GET,
            &url,
            &[scope(repo, "pull")],
            HeaderMap::new(),
            &Body::Empty,
        )
        .await?;
    let index: Value = if response.status().is_success() {
        // The referrers API answers an image index: as small as a manifest is.
        let bytes = super::client::read_limited(response, &url, MAX_REFERRERS_INDEX, || {
            RegistryError::Document {
                path: repository.to_string(),
                what: "a referrers index",
                detail: format!("it is larger than {MAX_REFERRERS_INDEX} bytes"),
            }
        })
        .await?;
        serde_json::from_slice(&bytes).map_err(|e| RegistryError::Document {
            path: repository.to_string(),
            what: "a referrers index",
            detail: e.to_string(),
        })?
    } else if response.status() == StatusCode::NOT_FOUND {
        match client
            .get_manifest(&repository.with_tag(&fallback_tag(subject))?)
            .await
        {
            Ok(manifest) => {
                serde_json::from_slice(&manifest.bytes).map_err(|e| RegistryError::Document {
                    path: repository.to_string(),
                    what: "a referrers index",
                    detail: e.to_string(),
                })?
            }
            Err(RegistryError::ManifestNotFound { .. }) => return Ok(Vec::new()),
            Err(error) => return Err(error),
        }
    } else {
        return Err(status_error(Method::GET, &url, response, attempts).await);
    };
    Ok(index["manifests"].as_array().cloned().unwrap_or_default())
}

/// The referrers index is read up to this size (a manifest's limit).
const MAX_REFERRERS_INDEX: u64 = 4 << 20;
/// At most this many referrers of one image are read, and at most this many bytes of
/// their blobs in all: an index listing thousands of large artifacts is a registry's
/// attempt to exhaust memory, not an image's attestations.
pub const MAX_REFERRERS: usize = 256;
pub const MAX_REFERRER_BYTES: u64 = 256 << 20;

/// A referrer as a registry holds it: its manifest (bytes, as served) and its first blob.
#[derive(Debug, Clone)]
pub struct FetchedReferrer {
    pub digest: Digest,
    /// The manifest's `artifactType`, else its config's media type (OCI 1.1): the index
    /// entry's own field is not trusted (cosign 3 writes the empty config's type there).
    pub artifact_type: String,
    pub annotations: BTreeMap<String, String>,
    pub manifest: Bytes,
    /// (media type, bytes) of the first layer; None for an artifact without one.
    pub blob: Option<(String, Bytes)>,
}

/// The referrers of `subject` in the repository of `repository` (at most
/// [`MAX_REFERRERS`]), each with its first blob when `wanted(artifact type)` (digest-checked
/// by the client, at most `max_blob` bytes each and [`MAX_REFERRER_BYTES`] in all). A
/// referrer that cannot be read is skipped with a warning naming it: one bad artifact does
/// not hide the others. Errors are the registry's answer to the listing itself.
pub async fn fetch_referrers(
    client: &RegistryClient,
    repository: &Reference,
    subject: &Digest,
    max_blob: u64,
    wanted: &dyn Fn(&str) -> bool,
) -> Result<Vec<FetchedReferrer>, RegistryError> {
    let entries = list_referrers(client, repository, subject).await?;
    if entries.len() > MAX_REFERRERS {
        tracing::warn!(
            "{repository}: {} referrers of {subject}; reading the first {MAX_REFERRERS}",
            entries.len()
        );
    }
    let mut fetched: Vec<FetchedReferrer> = Vec::new();
    let mut budget = MAX_REFERRER_BYTES;
    for entry in entries.iter().take(MAX_REFERRERS) {
        match fetch_referrer(client, repository, entry, max_blob.min(budget), wanted).await {
            Ok(referrer) => {
                budget -= referrer.blob.as_ref().map_or(0, |(_, b)| b.len() as u64);
                fetched.push(referrer);
            }
            Err(error) => {
                tracing::warn!("{repository}: a referrer of {subject} is skipped: {error}")
            }
        }
    }
    Ok(fetched)
}

/// One referrer of an index entry: its manifest and, when wanted, its first blob.
async fn fetch_referrer(
    client: &RegistryClient,
    repository: &Reference,
    entry: &Value,
    max_blob: u64,
    wanted: &dyn Fn(&str) -> bool,
) -> Result<FetchedReferrer, RegistryError> {
    {
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
        let manifest = client
            .get_manifest(&repository.without_digest().with_digest(digest))
            .await?;
        let value: Value =
            serde_json::from_slice(&manifest.bytes).map_err(|e| not_a_manifest(e.to_string()))?;
        let artifact_type = value["artifactType"]
            .as_str()
            .or_else(|| value["config"]["mediaType"].as_str())
            .unwrap_or_default()
            .to_string();
        let annotations = value["annotations"]
            .as_object()
            .map(|map| {
                map.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        let blob = match value["layers"].as_array().and_then(|l| l.first()) {
            Some(layer) if wanted(&artifact_type) => {
                let blob_digest: Digest = layer["digest"]
                    .as_str()
                    .unwrap_or_default()
                    .parse()
                    .map_err(|e| not_a_manifest(format!("its layer has no valid digest: {e}")))?;
                let bytes = client
                    .get_blob_bytes(repository.repository(), &blob_digest, max_blob)
                    .await?;
                let media_type = layer["mediaType"].as_str().unwrap_or_default().to_string();
                Some((media_type, bytes))
            }
            _ => None,
        };
        Ok(FetchedReferrer {
            digest,
            artifact_type,
            annotations,
            manifest: manifest.bytes,
            blob,
        })
    }
}
