//! An image's documents (manifest and config, never a layer) from where the image lives:
//! an OCI layout on disk, a registry or the local Docker daemon. What `inspect`, `check` and `verify --emit` read.
//! Parsing the text a person typed is `verify::source::ImageLocation`'s; credentials are
//! the caller's, resolved before this is called.

use std::path::PathBuf;

use crate::digest::Digest;
use crate::recipe::Platform;
use crate::registry::{ClientOptions, Reference, RegistryClient};
use crate::verify::source::{read_layout, ImageDocuments};

use super::PipelineError;

/// Configs are small JSON documents; refuse anything that is not.
const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// Where to read an image from.
#[derive(Debug, Clone)]
pub enum ImageSource {
    /// `ref_name` of the OCI layout at `dir`.
    Layout { dir: PathBuf, ref_name: String },
    /// A registry reference, and how to reach that registry (boxed: the options are
    /// large beside a layout's path).
    Registry {
        reference: Reference,
        client: Box<ClientOptions>,
    },
    /// An image of the local Docker daemon (`name:tag` or an ID), which keeps its config
    /// but no referrers.
    Daemon { reference: String },
}

/// The documents of the image at `source`; of `platform`'s image when it names a
/// multi-platform image (default: this machine's platform).
pub async fn read_documents(
    source: ImageSource,
    platform: Option<Platform>,
) -> Result<ImageDocuments, PipelineError> {
    let asked = platform.is_some();
    let platform = platform.or_else(crate::stack::host_platform);
    match source {
        ImageSource::Layout { dir, ref_name } => {
            let architecture = platform.map(|p| p.to_oci_arch());
            Ok(read_layout(&dir, &ref_name, architecture.as_ref())?)
        }
        ImageSource::Registry { reference, client } => {
            let client = RegistryClient::new(&reference, *client)?;
            read_registry(&client, &reference, platform).await
        }
        ImageSource::Daemon { reference } => read_daemon(&reference, platform, asked).await,
    }
}

/// The daemon's image: one per name, of the platform it was pulled or loaded for, which
/// must be `platform` when one was asked for.
async fn read_daemon(
    reference: &str,
    platform: Option<Platform>,
    asked: bool,
) -> Result<ImageDocuments, PipelineError> {
    let engine = crate::engine::Engine::connect().await?;
    let image = engine.image(reference).await?;
    let architecture = image.config.architecture().to_string();
    if let Some(platform) = platform.filter(|_| asked) {
        if platform.to_oci_arch().to_string() != architecture {
            return Err(PipelineError::DaemonPlatform {
                image: reference.to_string(),
                asked: platform.to_string(),
                holds: architecture,
            });
        }
    }
    Ok(ImageDocuments {
        location: format!("{}{reference}", crate::verify::source::DAEMON_PREFIX),
        manifest_digest: image.manifest_digest,
        config_digest: image.config_digest,
        config: image.config,
        bytes_read: 0,
    })
}

/// The manifest of `platform`'s image at `reference`, and its config.
async fn read_registry(
    client: &RegistryClient,
    reference: &Reference,
    platform: Option<Platform>,
) -> Result<ImageDocuments, PipelineError> {
    let wanted = platform.map_or_else(
        crate::registry::Platform::default,
        crate::registry::Platform::from,
    );
    let manifest = client.get_image_manifest(reference, &wanted).await?;
    let parsed: oci_spec::image::ImageManifest = serde_json::from_slice(&manifest.bytes)?;
    let config_digest: Digest = parsed.config().digest().to_string().parse()?;
    let config_bytes = client
        .get_blob_bytes(reference.repository(), &config_digest, MAX_CONFIG_BYTES)
        .await?;
    Ok(ImageDocuments {
        location: reference.to_string(),
        manifest_digest: Some(manifest.digest),
        config_digest: Some(config_digest),
        config: serde_json::from_slice(&config_bytes)?,
        bytes_read: (manifest.bytes.len() + config_bytes.len()) as u64,
    })
}

/// One referrer of an image, wherever the image lives: what it is and its (first) blob.
#[derive(Debug, Clone)]
pub struct Referrer {
    /// Where it was found: the layout's index name, or `repository@digest`.
    pub location: String,
    pub kind: Option<String>,
    pub artifact_type: String,
    pub annotations: std::collections::BTreeMap<String, String>,
    pub blob: Vec<u8>,
}

/// The referrers [`read_referrers`] read, and what it did not.
#[derive(Debug, Clone, Default)]
pub struct ReadReferrers {
    pub referrers: Vec<Referrer>,
    /// Referrers of types the caller does not read: never fetched.
    pub other_types: usize,
    /// Referrers of the types read (or of a type the listing did not give) that were not
    /// read: over the budget, or unreadable. Only from a registry.
    pub skipped: Vec<crate::registry::referrers::SkippedReferrer>,
    /// When the budget ran out: the line naming the registry, the image and the limit.
    pub over_budget: Option<String>,
}

/// The referrers of `types` of the manifest `subject` at `source` (a layout's index, or
/// the registry's referrers API or its fallback tag). From a registry, within the
/// per-image budget, and only the types asked for are fetched (`check` reads bundles,
/// never an SBOM):.
pub async fn read_referrers(
    source: ImageSource,
    subject: &Digest,
    types: crate::registry::referrers::ArtifactTypes<'_>,
) -> Result<ReadReferrers, PipelineError> {
    use crate::registry::referrers::{fetch_referrers, BlobContent, BlobSink, ReferrerBudget};
    match source {
        // A daemon keeps no artifact beside an image.
        ImageSource::Daemon { .. } => Ok(ReadReferrers::default()),
        ImageSource::Layout { dir, .. } => {
            let (wanted, others): (Vec<_>, Vec<_>) =
                crate::attest::store::referrers_of(&dir, subject)?
                    .into_iter()
                    .partition(|r| types.wants(&r.artifact_type));
            Ok(ReadReferrers {
                referrers: wanted
                    .into_iter()
                    .map(|r| Referrer {
                        location: r.ref_name,
                        kind: Some(r.kind),
                        artifact_type: r.artifact_type,
                        annotations: r.annotations,
                        blob: r.blob,
                    })
                    .collect(),
                other_types: others.len(),
                ..ReadReferrers::default()
            })
        }
        ImageSource::Registry { reference, client } => {
            let client = RegistryClient::new(&reference, *client)?;
            let fetched = fetch_referrers(
                &client,
                &reference,
                subject,
                types,
                ReferrerBudget::default(),
                BlobSink::Memory,
            )
            .await?;
            // Each blob moved, not copied: the budget is what is held.
            let referrers = fetched
                .referrers
                .into_iter()
                .map(|r| Referrer {
                    location: format!("{}@{}", reference.without_digest(), r.digest),
                    kind: r
                        .annotations
                        .get(crate::attest::store::KIND_ANNOTATION)
                        .cloned(),
                    blob: match r.blob.map(|b| b.content) {
                        Some(BlobContent::Bytes(bytes)) => Vec::from(bytes),
                        _ => Vec::new(),
                    },
                    artifact_type: r.artifact_type,
                    annotations: r.annotations,
                })
                .collect();
            Ok(ReadReferrers {
                referrers,
                other_types: fetched.other_types,
                skipped: fetched.skipped,
                over_budget: fetched.over_budget,
            })
        }
    }
}
