//! `cudastack sbom IMAGE`: the SBOM stored beside an image (a layout's referrer, or a
//! registry's), as the build wrote it: SPDX 2.3 or CycloneDX 1.6 JSON, byte for byte, so a
//! scanner or a compliance archive gets the document the image's signature covers.

use serde::Serialize;

use super::image_source::{read_documents, read_referrers, ImageSource};
use super::PipelineError;
use crate::digest::Digest;
use crate::platform::Platform;
use crate::registry::referrers::ArtifactTypes;

/// The SBOM formats cudastack stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SbomFormat {
    Spdx,
    Cyclonedx,
}

impl SbomFormat {
    pub fn media_type(self) -> &'static str {
        match self {
            SbomFormat::Spdx => crate::sbom::SPDX_MEDIA_TYPE,
            SbomFormat::Cyclonedx => crate::sbom::CYCLONEDX_MEDIA_TYPE,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SbomFormat::Spdx => "SPDX 2.3",
            SbomFormat::Cyclonedx => "CycloneDX 1.6",
        }
    }
}

/// The SBOM of one image and where it was found.
#[derive(Debug, Clone)]
pub struct StoredSbom {
    /// The image's manifest digest (the SBOM's subject).
    pub subject: Digest,
    /// The referrer's location: the layout's index name, or `repository@digest`.
    pub location: String,
    pub bytes: Vec<u8>,
}

/// The SBOM in `format` stored beside the image at `source` (of `platform`'s image when it
/// names a multi-platform one). An image without one is an error that says how to get one.
pub async fn stored_sbom(
    source: &ImageSource,
    platform: Option<Platform>,
    format: SbomFormat,
) -> Result<StoredSbom, PipelineError> {
    let documents = read_documents(source.clone(), platform).await?;
    let Some(subject) = documents.manifest_digest else {
        return Err(PipelineError::NoSbom {
            image: documents.location,
            format: format.name(),
        });
    };
    let read = read_referrers(
        source.clone(),
        &subject,
        ArtifactTypes::Only(&[format.media_type()]),
    )
    .await?;
    let Some(referrer) = read.referrers.into_iter().next() else {
        return Err(PipelineError::NoSbom {
            image: documents.location,
            format: format.name(),
        });
    };
    Ok(StoredSbom {
        subject,
        location: referrer.location,
        bytes: referrer.blob,
    })
}
