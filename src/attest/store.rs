//! Referrers in an OCI layout: each an artifact manifest whose `subject` is an image of the
//! layout, named `sha256-<subject hex>.<kind>` in `index.json` (one of each kind per image,
//! so a rebuild or a second signing replaces rather than piles up), with the kind in the
//! annotation [`KIND_ANNOTATION`] so a pull can name what it fetched the same way.

use std::collections::BTreeMap;
use std::path::Path;

use oci_spec::image::{Descriptor, ImageManifest};

use super::statement::{Statement, Subject};
use super::{AttestError, CYCLONEDX_PREDICATE_TYPE, SPDX_PREDICATE_TYPE, STATEMENT_ARTIFACT_TYPE};
use crate::digest::Digest;
use crate::oci::layout::{self, Artifact, Layout};
use crate::oci::OciError;
use crate::registry::referrers::BlobContent;
use crate::sign::bundle::{self, Bundle};
use crate::sign::key::SigningKey;

/// The annotation naming a referrer's kind (`sbom`, `provenance`, ...).
pub const KIND_ANNOTATION: &str = "io.cudastack.referrer";
pub const SBOM: &str = "sbom";
pub const CYCLONEDX: &str = "sbom.cdx";
pub const SBOM_STATEMENT: &str = "sbom.att";
pub const CYCLONEDX_STATEMENT: &str = "sbom.cdx.att";
pub const PROVENANCE: &str = "provenance";
/// Verification statements accumulate, one per report: `verification-<report hex, 12>`.
pub const VERIFICATION_PREFIX: &str = "verification-";
/// The slot of a referrer `pull` fetched: `pulled-<its digest, 12 hex>`. What a registry
/// served is kept and shown, and pushed again, but never signed by this cudastack.
pub const FETCHED_PREFIX: &str = "pulled-";

/// One referrer of an image in a layout, with its first (only) blob.
#[derive(Debug, Clone)]
pub struct StoredReferrer {
    pub ref_name: String,
    /// Fetched from a registry (`pull`) rather than made here.
    pub fetched: bool,
    pub digest: Digest,
    pub kind: String,
    pub artifact_type: String,
    pub subject: Digest,
    pub annotations: BTreeMap<String, String>,
    pub blob: Vec<u8>,
}

/// The index name of `subject`'s referrer of `kind`.
pub fn referrer_name(subject: &Digest, kind: &str) -> String {
    format!("sha256-{}.{kind}", subject.hex())
}

/// Store `bytes` (of media type `artifact_type`) as `subject`'s referrer of `kind`.
pub fn attach(
    dir: &Path,
    subject: &Descriptor,
    kind: &str,
    artifact_type: &str,
    bytes: Vec<u8>,
    mut annotations: BTreeMap<String, String>,
) -> Result<Digest, OciError> {
    annotations.insert(KIND_ANNOTATION.to_string(), kind.to_string());
    write_referrer(dir, subject, kind, artifact_type, bytes, annotations)
}

/// Write a referrer of `subject` into the slot `sha256-<subject hex>.<slot>`.
fn write_referrer(
    dir: &Path,
    subject: &Descriptor,
    slot: &str,
    artifact_type: &str,
    bytes: Vec<u8>,
    annotations: BTreeMap<String, String>,
) -> Result<Digest, OciError> {
    let subject_digest =
        crate::oci::digest_of(subject).map_err(|problem| OciError::InvalidLayout {
            dir: dir.to_path_buf(),
            problem,
        })?;
    let artifact = Artifact {
        artifact_type: artifact_type.to_string(),
        subject: subject.clone(),
        blobs: vec![(artifact_type.to_string(), bytes)],
        annotations,
    };
    layout::write_artifact(dir, &artifact, &referrer_name(&subject_digest, slot))
}

/// Store an unsigned statement as `subject`'s referrer of `kind`.
pub fn attach_statement(
    dir: &Path,
    subject: &Descriptor,
    kind: &str,
    statement: &Statement,
) -> Result<Digest, OciError> {
    attach(
        dir,
        subject,
        kind,
        STATEMENT_ARTIFACT_TYPE,
        statement.to_bytes(),
        BTreeMap::from([(
            bundle::PREDICATE_TYPE_ANNOTATION.to_string(),
            statement.predicate_type.clone(),
        )]),
    )
}

/// [`attach_statement`], unless this cudastack already stored the same statement about
/// `subject` signed (a rebuild of a signed image keeps its signature). Returns whether it
/// was stored.
pub fn attach_statement_unless_signed(
    dir: &Path,
    subject: &Descriptor,
    kind: &str,
    statement: &Statement,
) -> Result<bool, AttestError> {
    let digest = crate::oci::digest_of(subject).map_err(AttestError::Statement)?;
    let bytes = statement.to_bytes();
    let signed = referrers_of(dir, &digest)?.into_iter().any(|r| {
        !r.fetched
            && r.kind == kind
            && r.artifact_type == bundle::MEDIA_TYPE
            && Bundle::from_json(&r.blob, &r.ref_name).is_ok_and(|b| b.envelope.payload == bytes)
    });
    if signed {
        return Ok(false);
    }
    attach_statement(dir, subject, kind, statement)?;
    Ok(true)
}

/// Every referrer of the manifest `subject` in the layout at `dir`, by index name.
pub fn referrers_of(dir: &Path, subject: &Digest) -> Result<Vec<StoredReferrer>, OciError> {
    let layout = Layout::open(dir)?;
    let mut found = Vec::new();
    for entry in layout.index().entries() {
        let Some(artifact_type) = entry.artifact_type() else {
            continue;
        };
        let manifest: ImageManifest = layout.read_json_blob(entry, "an artifact manifest")?;
        let about = manifest
            .subject()
            .as_ref()
            .and_then(|s| crate::oci::digest_of(s).ok());
        if about.as_ref() != Some(subject) {
            continue;
        }
        let Some(first) = manifest.layers().first() else {
            continue;
        };
        let annotations: BTreeMap<String, String> = manifest
            .annotations()
            .clone()
            .map(|a| a.into_iter().collect())
            .unwrap_or_default();
        let ref_name = layout::ref_name_of(entry).unwrap_or_default().to_string();
        let fetched = ref_name
            .split_once('.')
            .is_some_and(|(_, slot)| slot.starts_with(FETCHED_PREFIX));
        found.push(StoredReferrer {
            fetched,
            kind: annotations
                .get(KIND_ANNOTATION)
                .cloned()
                .unwrap_or_else(|| {
                    ref_name
                        .rsplit_once('.')
                        .map(|(_, k)| k.to_string())
                        .unwrap_or_default()
                }),
            digest: crate::oci::digest_of(entry).map_err(|problem| OciError::InvalidLayout {
                dir: dir.to_path_buf(),
                problem,
            })?,
            ref_name,
            artifact_type: artifact_type.to_string(),
            subject: *subject,
            annotations,
            blob: layout.read_blob(first)?,
        });
    }
    found.sort_by(|a, b| a.ref_name.cmp(&b.ref_name));
    Ok(found)
}

/// What signing did to one referrer.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Signed {
    pub kind: String,
    pub predicate_type: String,
    pub digest: Digest,
}

/// Sign, with `key`, what this cudastack stored about `subject`: each unsigned statement
/// about it becomes a bundle, and each SBOM gets a signed statement of its own
/// ([`SBOM_STATEMENT`], [`CYCLONEDX_STATEMENT`]). Nothing a registry served is signed, no
/// statement about other images is, and bundles are left as they are (a bundle is extended
/// to a verified copy only by [`carry_referrers`], in the run that made the copy).
pub fn sign_referrers(
    dir: &Path,
    subject: &Descriptor,
    name: &str,
    key: &SigningKey,
) -> Result<Vec<Signed>, AttestError> {
    let digest = crate::oci::digest_of(subject).map_err(AttestError::Statement)?;
    let referrers = referrers_of(dir, &digest)?;
    let mut signed = Vec::new();
    for referrer in referrers.iter().filter(|r| !r.fetched) {
        if referrer.artifact_type == STATEMENT_ARTIFACT_TYPE {
            let statement = Statement::from_bytes(&referrer.blob)?;
            if statement.is_about(&digest) {
                signed.push(store_signed(dir, subject, &referrer.kind, &statement, key)?);
            }
            continue;
        }
        let Some((kind, predicate_type)) = sbom_statement_of(&referrer.artifact_type) else {
            continue;
        };
        if referrers.iter().any(|r| r.kind == kind && !r.fetched) {
            continue;
        }
        let document = serde_json::from_slice(&referrer.blob)
            .map_err(|e| AttestError::Statement(format!("the stored SBOM is not JSON: {e}")))?;
        let statement = Statement::new(
            vec![Subject::image(name, &digest)],
            predicate_type,
            document,
        );
        signed.push(store_signed(dir, subject, kind, &statement, key)?);
    }
    Ok(signed)
}

/// The signed statement an SBOM of `media_type` gets: its kind and predicate type (cosign's
/// `--type spdxjson` and `--type cyclonedx`).
fn sbom_statement_of(media_type: &str) -> Option<(&'static str, &'static str)> {
    match media_type {
        crate::sbom::SPDX_MEDIA_TYPE => Some((SBOM_STATEMENT, SPDX_PREDICATE_TYPE)),
        crate::sbom::CYCLONEDX_MEDIA_TYPE => Some((CYCLONEDX_STATEMENT, CYCLONEDX_PREDICATE_TYPE)),
        _ => None,
    }
}

fn store_signed(
    dir: &Path,
    subject: &Descriptor,
    kind: &str,
    statement: &Statement,
    key: &SigningKey,
) -> Result<Signed, AttestError> {
    let bundle = super::sign(statement, key);
    let annotations = BTreeMap::from([
        (
            bundle::CONTENT_ANNOTATION.to_string(),
            bundle::CONTENT_DSSE.to_string(),
        ),
        (
            bundle::PREDICATE_TYPE_ANNOTATION.to_string(),
            statement.predicate_type.clone(),
        ),
    ]);
    let digest = attach(
        dir,
        subject,
        kind,
        bundle::MEDIA_TYPE,
        bundle.to_json(),
        annotations,
    )?;
    Ok(Signed {
        kind: kind.to_string(),
        predicate_type: statement.predicate_type.clone(),
        digest,
    })
}

/// Give the image `to`, the verified copy `record` just made of `from` (same layers, labels
/// added), the referrers of `from` but its reports: a statement this cudastack made about
/// `from` gets `to` as a subject too; a bundle that `key` signed about `from` is signed again
/// with `to` added (the same claim, on the same layers); everything else (SBOMs, what a
/// registry served, bundles of other keys) is copied as it is. Returns how many were copied.
pub fn carry_referrers(
    dir: &Path,
    from: &Digest,
    to: &Descriptor,
    name: &str,
    key: Option<&SigningKey>,
) -> Result<usize, AttestError> {
    let to_digest = crate::oci::digest_of(to).map_err(AttestError::Statement)?;
    let mut carried = 0;
    for referrer in referrers_of(dir, from)? {
        if referrer.artifact_type == crate::verify::REPORT_ARTIFACT_TYPE {
            continue;
        }
        let extended =
            |statement: Statement| statement.with_subject(Subject::image(name, &to_digest));
        if !referrer.fetched && referrer.artifact_type == STATEMENT_ARTIFACT_TYPE {
            let statement = Statement::from_bytes(&referrer.blob)?;
            if statement.is_about(from) {
                attach_statement(dir, to, &referrer.kind, &extended(statement))?;
                carried += 1;
            }
            continue;
        }
        if let (Some(key), bundle::MEDIA_TYPE) = (key, referrer.artifact_type.as_str()) {
            let ours = Bundle::from_json(&referrer.blob, &referrer.ref_name)
                .ok()
                .and_then(|b| super::open(&b, &key.public_key()).ok())
                .filter(|statement| statement.is_about(from));
            if let Some(statement) = ours {
                store_signed(dir, to, &referrer.kind, &extended(statement), key)?;
                carried += 1;
                continue;
            }
        }
        let slot = referrer
            .ref_name
            .split_once('.')
            .map_or(referrer.kind.as_str(), |(_, slot)| slot);
        write_referrer(
            dir,
            to,
            slot,
            &referrer.artifact_type,
            referrer.blob,
            referrer.annotations,
        )?;
        carried += 1;
    }
    Ok(carried)
}

/// Store a referrer fetched from a registry as it was served (its manifest bytes, so its
/// digest stays the registry's) beside `subject`, named by its kind annotation, else by
/// its digest. The artifact's config must be the empty one (every referrer cudastack and
/// cosign write has it); another is refused, as nothing here would read it.
pub fn store_fetched(
    dir: &Path,
    subject: &Digest,
    referrer: &crate::registry::referrers::FetchedReferrer,
) -> Result<String, AttestError> {
    let manifest: ImageManifest = serde_json::from_slice(&referrer.manifest).map_err(|e| {
        AttestError::Statement(format!(
            "referrer {}: not an OCI manifest: {e}",
            referrer.digest
        ))
    })?;
    let about = manifest
        .subject()
        .as_ref()
        .and_then(|s| crate::oci::digest_of(s).ok());
    if about.as_ref() != Some(subject) {
        return Err(AttestError::Statement(format!(
            "referrer {}: its manifest's subject is not {subject}",
            referrer.digest
        )));
    }
    let empty = Digest::of_bytes(layout::EMPTY_CONFIG);
    if manifest.config().digest().to_string() != empty.to_string() {
        return Err(AttestError::Statement(format!(
            "referrer {}: its config is not the empty descriptor ({}), so it is not an artifact cudastack reads",
            referrer.digest,
            manifest.config().digest()
        )));
    }
    // One slot per artifact: two referrers of one kind (a rebuild's provenance, a signed
    // and an unsigned copy) are both kept.
    let slot = format!("{FETCHED_PREFIX}{}", &referrer.digest.hex()[..12]);
    let mut writer = layout::LayoutWriter::open(dir)?;
    writer.put_bytes(layout::EMPTY_CONFIG)?;
    if let Some(blob) = &referrer.blob {
        match &blob.content {
            BlobContent::Bytes(bytes) => {
                writer.put_bytes(bytes)?;
            }
            // Streamed into the blob store, digest-checked there: linked or
            // copied, never read into memory.
            BlobContent::File(path) => writer.put_file(path, &blob.digest)?,
        }
    }
    let digest = writer.put_bytes(&referrer.manifest)?;
    let mut entry = crate::oci::descriptor(
        oci_spec::image::MediaType::ImageManifest,
        &digest,
        referrer.manifest.len() as u64,
    );
    entry.set_artifact_type(Some(oci_spec::image::MediaType::Other(
        referrer.artifact_type.clone(),
    )));
    let name = referrer_name(subject, &slot);
    writer.name_in_index_only(entry, &name)?;
    writer.commit();
    Ok(name)
}

/// Drop the referrers of images no ref of the layout names any more (a rebuilt `latest`,
/// an image whose refs moved to its verified copy), so rebuilds do not pile them up.
/// Returns the names dropped.
pub fn prune(dir: &Path) -> Result<Vec<String>, OciError> {
    let layout = Layout::open(dir)?;
    let mut live = std::collections::BTreeSet::new();
    for entry in layout.index().entries() {
        if entry.artifact_type().is_some() {
            continue;
        }
        live.insert(entry.digest().to_string());
        if *entry.media_type() == oci_spec::image::MediaType::ImageIndex {
            for child in layout.child_index(entry)?.manifests() {
                live.insert(child.digest().to_string());
            }
        }
    }
    let stale: Vec<String> = layout
        .index()
        .entries()
        .iter()
        .filter(|entry| entry.artifact_type().is_some())
        .filter_map(layout::ref_name_of)
        .filter(|name| {
            name.strip_prefix("sha256-")
                .and_then(|rest| rest.split_once('.'))
                .is_some_and(|(hex, _)| !live.contains(&format!("sha256:{hex}")))
        })
        .map(str::to_string)
        .collect();
    if !stale.is_empty() {
        let mut writer = layout::LayoutWriter::open(dir)?;
        writer.unname(&stale)?;
        writer.commit();
    }
    Ok(stale)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oci::Image;

    fn image(dir: &Path, label: &str, ref_name: &str) -> Descriptor {
        let image = Image::new(1_700_000_000).with_label("x", label);
        layout::write(&image, dir, ref_name).unwrap();
        layout::resolve(dir, ref_name).unwrap().manifest
    }

    fn statement(about: &Descriptor) -> Statement {
        Statement::new(
            vec![Subject::image("x", &crate::oci::digest_of(about).unwrap())],
            "https://example.com/p",
            serde_json::json!({}),
        )
    }

    fn kinds(dir: &Path, image: &Descriptor) -> Vec<String> {
        referrers_of(dir, &crate::oci::digest_of(image).unwrap())
            .unwrap()
            .into_iter()
            .map(|r| format!("{} {}", r.kind, r.artifact_type))
            .collect()
    }

    #[test]
    fn a_rebuilt_ref_drops_the_old_images_referrers_only() {
        let dir = tempfile::tempdir().unwrap();
        let old = image(dir.path(), "old", "latest");
        attach_statement(dir.path(), &old, PROVENANCE, &statement(&old)).unwrap();
        let new = image(dir.path(), "new", "latest");
        attach_statement(dir.path(), &new, PROVENANCE, &statement(&new)).unwrap();
        let dropped = prune(dir.path()).unwrap();
        assert_eq!(dropped.len(), 1, "{dropped:?}");
        assert!(kinds(dir.path(), &old).is_empty());
        assert_eq!(kinds(dir.path(), &new).len(), 1);
        assert!(prune(dir.path()).unwrap().is_empty());
    }

    #[test]
    fn the_verified_copy_gets_the_statements_about_the_image_it_was_made_of() {
        let dir = tempfile::tempdir().unwrap();
        let ran = image(dir.path(), "ran", "latest");
        let verified = image(dir.path(), "verified", "latest-verified");
        attach_statement(dir.path(), &ran, PROVENANCE, &statement(&ran)).unwrap();
        attach_statement(
            dir.path(),
            &ran,
            "verification-0123456789ab",
            &statement(&ran),
        )
        .unwrap();
        let ran_digest = crate::oci::digest_of(&ran).unwrap();
        // A statement about another image, stored beside this one, is not carried.
        let elsewhere = image(dir.path(), "elsewhere", "elsewhere");
        attach_statement(dir.path(), &ran, "misplaced", &statement(&elsewhere)).unwrap();
        let count = carry_referrers(dir.path(), &ran_digest, &verified, "x", None).unwrap();
        assert_eq!(count, 2);
        let verified_digest = crate::oci::digest_of(&verified).unwrap();
        let carried = referrers_of(dir.path(), &verified_digest).unwrap();
        assert_eq!(carried.len(), 2, "{carried:#?}");
        for referrer in carried {
            let statement = Statement::from_bytes(&referrer.blob).unwrap();
            assert!(statement.is_about(&ran_digest) && statement.is_about(&verified_digest));
        }
    }

    #[test]
    fn signing_twice_signs_nothing_new_and_leaves_another_keys_bundles() {
        let dir = tempfile::tempdir().unwrap();
        let subject = image(dir.path(), "a", "latest");
        attach_statement(dir.path(), &subject, PROVENANCE, &statement(&subject)).unwrap();
        let theirs = SigningKey::generate().unwrap();
        store_signed(
            dir.path(),
            &subject,
            "theirs",
            &statement(&subject),
            &theirs,
        )
        .unwrap();
        // What a registry served (a pull) and statements about other images are never signed.
        let served = statement(&subject).to_bytes();
        let slot = format!("{FETCHED_PREFIX}0123456789ab");
        write_referrer(
            dir.path(),
            &subject,
            &slot,
            STATEMENT_ARTIFACT_TYPE,
            served,
            BTreeMap::new(),
        )
        .unwrap();
        let elsewhere = image(dir.path(), "elsewhere", "elsewhere");
        attach_statement(dir.path(), &subject, "misplaced", &statement(&elsewhere)).unwrap();
        let ours = SigningKey::generate().unwrap();
        let signed = sign_referrers(dir.path(), &subject, "x", &ours).unwrap();
        assert_eq!(signed.len(), 1, "{signed:?}");
        assert_eq!(signed[0].kind, PROVENANCE);
        assert!(sign_referrers(dir.path(), &subject, "x", &ours)
            .unwrap()
            .is_empty());
        let stored = referrers_of(dir.path(), &crate::oci::digest_of(&subject).unwrap()).unwrap();
        let bundle_of = |kind: &str| {
            let referrer = stored.iter().find(|r| r.kind == kind).unwrap();
            assert_eq!(referrer.artifact_type, bundle::MEDIA_TYPE);
            Bundle::from_json(&referrer.blob, kind).unwrap()
        };
        assert!(super::super::open(&bundle_of(PROVENANCE), &ours.public_key()).is_ok());
        assert!(super::super::open(&bundle_of("theirs"), &theirs.public_key()).is_ok());
        assert!(super::super::open(&bundle_of("theirs"), &ours.public_key()).is_err());
    }
}
