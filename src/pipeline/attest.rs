//! The attestation stages of the pipeline: after the build, each image's SBOM and build
//! provenance; after a verification, the statement of the run (and the verified copy gets
//! the image's referrers); last, when a key is given, every statement signed. What the
//! documents say is `attest`'s and `sbom`'s; this module decides when and on which image.

use std::collections::BTreeMap;
use std::path::Path;

use oci_spec::image::Descriptor;

use crate::attest::statement::{Statement, Subject};
use crate::attest::store::{self, Signed};
use crate::attest::{provenance, verification};
use crate::digest::Digest;
use crate::oci::layout;
use crate::sign::key::SigningKey;
use crate::stack::{BuildReport, BuildSettings, PlatformReport};
use crate::verify::check::ImageClaims;
use crate::verify::record::Recorded;
use crate::verify::report::Report;

use super::{PipelineError, Progress};

/// The name statements give the image: its first tag, else the recipe's name.
pub fn image_name(built: &BuildReport) -> String {
    built
        .tags
        .first()
        .cloned()
        .unwrap_or_else(|| built.recipe.clone())
}

/// Store the SBOM and the provenance of every platform's image of `built`.
pub fn after_build(
    settings: &BuildSettings,
    built: &BuildReport,
    progress: &dyn Progress,
) -> Result<(), PipelineError> {
    let name = image_name(built);
    store::prune(&built.layout)?;
    let source = provenance::GitSource::of(&settings.recipe_path);
    for platform in &built.platforms {
        let (Some(lock), Some(built_image)) =
            (&platform.built_from.lock, &platform.built_from.image)
        else {
            continue;
        };
        let created = built_image.created();
        let manifest = built_image.documents()?.manifest_descriptor();
        let configuration = built_image.configuration()?;
        let claims = ImageClaims::from_image(&configuration);
        let (labels, _) = crate::verify::check::labels_and_env(
            &configuration.config().clone().unwrap_or_default(),
        );
        let built_wheels = crate::sbom::BuiltWheel::from_labels(&labels);
        let image = SbomImage {
            name: &name,
            created,
            claims: &claims,
            built: &built_wheels,
        };
        let (spdx, cyclonedx) = sboms_of(&image, lock, platform);
        for (kind, media_type, document) in [
            (store::SBOM, crate::sbom::SPDX_MEDIA_TYPE, spdx),
            (
                store::CYCLONEDX,
                crate::sbom::CYCLONEDX_MEDIA_TYPE,
                cyclonedx,
            ),
        ] {
            store::attach(
                &built.layout,
                &manifest,
                kind,
                media_type,
                document,
                BTreeMap::new(),
            )?;
        }
        let facts = provenance::BuildFacts {
            recipe_path: &settings.recipe_path.display().to_string(),
            lock,
            platform: &platform.platform,
            compression: serde_json::to_value(settings.compression).unwrap_or_default(),
            encoder: settings.compression.encoder(),
            source_date_epoch: created,
            layers: &platform.layers,
            source: source.as_ref(),
        };
        let statement = Statement::new(
            vec![Subject::image(&name, &platform.manifest_digest)],
            provenance::PREDICATE_TYPE,
            provenance::predicate(&facts),
        );
        store::attach_statement_unless_signed(
            &built.layout,
            &manifest,
            store::PROVENANCE,
            &statement,
        )?;
    }
    progress.status(&format!(
        "attest  SBOM (SPDX 2.3, CycloneDX 1.6) and SLSA provenance stored as referrers in {}",
        built.layout.display()
    ));
    Ok(())
}

/// The image an SBOM is about, as its config states it.
struct SbomImage<'a> {
    name: &'a str,
    created: u64,
    claims: &'a ImageClaims,
    built: &'a [crate::sbom::BuiltWheel],
}

/// The image's SBOM as SPDX 2.3 and as CycloneDX 1.6 (one inventory, two spellings).
fn sboms_of(
    image: &SbomImage,
    lock: &crate::lock::Lockfile,
    platform: &PlatformReport,
) -> (Vec<u8>, Vec<u8>) {
    let licenses = |artifact: &crate::lock::Artifact| {
        let wheel = matches!(
            artifact.kind,
            crate::lock::ArtifactKind::Wheel | crate::lock::ArtifactKind::Sdist
        );
        wheel
            .then(|| platform.built_from.wheel_files.get(&artifact.name))
            .flatten()
            .and_then(|path| crate::sbom::wheel_license(path))
    };
    let input = crate::sbom::SbomInput {
        name: image.name,
        // Not the digest: the SBOM describes the content, which the verified copy shares;
        // the referrer's subject says which image it is attached to.
        image: None,
        lock,
        claims: image.claims,
        built: image.built,
        targets: &platform.built_from.targets,
        created: image.created,
        licenses: &licenses,
    };
    (
        crate::sbom::spdx_json(&input),
        crate::sbom::cyclonedx_json(&input),
    )
}

/// Store the statement of a verification run on the verified image (or, when the run
/// verified nothing, on the image it ran in), and give the verified image the referrers
/// of the one it was made from (bundles `key` signed about it, signed again for both).
pub fn after_verify(
    layout_dir: &Path,
    report: &Report,
    recorded: &Recorded,
    name: &str,
    key: Option<&SigningKey>,
) -> Result<(), PipelineError> {
    let Some(ran) = &recorded.ran else {
        return Ok(());
    };
    let ran_digest = digest_of(ran)?;
    let verified_digest = recorded.verified.as_ref().map(digest_of).transpose()?;
    let statement = verification::statement(name, report, &ran_digest, verified_digest.as_ref());
    let kind = format!(
        "{}{}",
        store::VERIFICATION_PREFIX,
        &recorded.report_digest.hex()[..12]
    );
    let subject = recorded.verified.as_ref().unwrap_or(ran);
    store::attach_statement(layout_dir, subject, &kind, &statement)?;
    if let Some(verified) = &recorded.verified {
        store::carry_referrers(layout_dir, &ran_digest, verified, name, key)?;
        store::prune(layout_dir)?;
    }
    Ok(())
}

/// After a verification run recorded in the layout at `layout_dir`: store its statement
/// beside the image (and the image's referrers on its verified copy); with a key, sign
/// every statement about the image `ref_name` names now (the verified copy, when the run
/// made one).
pub fn after_run(
    layout_dir: &Path,
    ref_name: &str,
    report: &Report,
    recorded: &Recorded,
    key: Option<&SigningKey>,
    progress: &dyn Progress,
) -> Result<(), PipelineError> {
    after_verify(layout_dir, report, recorded, ref_name, key)?;
    if let Some(key) = key {
        sign(layout_dir, ref_name, ref_name, key, progress)?;
    }
    Ok(())
}

/// Sign every statement about the image (each platform's of an image index) `ref_name`
/// names in the layout.
pub fn sign(
    layout_dir: &Path,
    ref_name: &str,
    name: &str,
    key: &SigningKey,
    progress: &dyn Progress,
) -> Result<Vec<Signed>, PipelineError> {
    let images: Vec<Descriptor> = match layout::index_images(layout_dir, ref_name)? {
        Some(children) => children.into_iter().map(|(d, _)| d).collect(),
        None => vec![layout::resolve(layout_dir, ref_name)?.manifest],
    };
    let mut signed = Vec::new();
    for image in &images {
        signed.extend(store::sign_referrers(layout_dir, image, name, key)?);
    }
    progress.status(&format!(
        "sign    {} attestation(s) signed by key {}: {}",
        signed.len(),
        &key.public_key().key_id()[..12],
        signed
            .iter()
            .map(|s| s.kind.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    Ok(signed)
}

fn digest_of(descriptor: &Descriptor) -> Result<Digest, PipelineError> {
    crate::oci::digest_of(descriptor).map_err(PipelineError::Descriptor)
}

/// The artifact types cudastack reads and keeps as referrers: signed bundles, unsigned
/// statements (provenance, verification), SBOMs and verification reports. `inspect` reads
/// these and `pull` copies these; others are counted, never fetched.
pub const KNOWN_REFERRER_TYPES: &[&str] = &[
    crate::sign::bundle::MEDIA_TYPE,
    crate::attest::STATEMENT_ARTIFACT_TYPE,
    crate::sbom::SPDX_MEDIA_TYPE,
    crate::sbom::CYCLONEDX_MEDIA_TYPE,
    crate::verify::REPORT_ARTIFACT_TYPE,
];

/// What [`pull_referrers`] copied, and what it left.
#[derive(Debug, Clone, Default)]
pub struct PulledReferrers {
    /// The index names of the referrers stored in the layout.
    pub stored: Vec<String>,
    /// Referrers of types cudastack does not read: not copied.
    pub other_types: usize,
    /// Referrers of known types not copied: over the budget, or unreadable.
    pub skipped: usize,
    /// The line saying the budget ran out (registry, image, limit), for stderr.
    pub over_budget: Option<String>,
}

/// After a pull: the referrers of the pulled image of the types cudastack reads (SBOM,
/// provenance, signed statements, verification reports) into the layout beside it, as the
/// registry serves them, within the per-image budget; their blobs are streamed through
/// `store` into the layout, digest-checked, never held in memory.
pub async fn pull_referrers(
    client: &crate::registry::RegistryClient,
    reference: &crate::registry::Reference,
    layout_dir: &Path,
    subject: &Digest,
    store: &crate::cache::BlobStore,
) -> Result<PulledReferrers, PipelineError> {
    use crate::registry::referrers::{fetch_referrers, ArtifactTypes, BlobSink, ReferrerBudget};
    let fetched = fetch_referrers(
        client,
        reference,
        subject,
        ArtifactTypes::Only(KNOWN_REFERRER_TYPES),
        ReferrerBudget::default(),
        BlobSink::Store(store),
    )
    .await?;
    let mut pulled = PulledReferrers {
        other_types: fetched.other_types,
        skipped: fetched.skipped.len(),
        over_budget: fetched.over_budget,
        ..PulledReferrers::default()
    };
    for referrer in fetched.referrers.iter().filter(|r| r.blob.is_some()) {
        match store::store_fetched(layout_dir, subject, referrer) {
            Ok(name) => pulled.stored.push(name),
            Err(error) => {
                pulled.skipped += 1;
                tracing::warn!("a referrer of {subject} is not kept: {error}")
            }
        }
    }
    Ok(pulled)
}
