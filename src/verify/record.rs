//! Recording a verification: the report is always stored beside the image (an OCI artifact
//! whose `subject` is the image), and only a `Verified` report produces a new config (same
//! layers) with `io.cudastack.verified*` labels and the `-verified` refs.
//!
//! Labels accumulate: verifying an image that already carries a verified matrix (from
//! another GPU type) adds a row instead of replacing it.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::report::{ImageFacts, Report, Status, Verdict};
use super::REPORT_ARTIFACT_TYPE;
use crate::digest::Digest;
use crate::labels;
use crate::oci::layout::{self, Artifact};
use crate::oci::{OciError, StoredImage};

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error(transparent)]
    Oci(#[from] OciError),
    #[error("the report is {verdict}; only a report whose every level passed on a GPU may label an image as verified")]
    NotVerified { verdict: Verdict },
    #[error("the log does not say which image ran: it has no `{prefix}` line, so it cannot be recorded on `{image}`\n  hint: run the Job or sbatch script that `cudastack verify {image} --emit k8s-job` (or `--emit sbatch`) prints now: it prints the image's digest before the probe runs", prefix = super::IMAGE_PREFIX.trim_end())]
    NoImageInLog { image: String },
    #[error("the log is about another image than `{image}`\n  Expected: {expected}\n  Found:    {found}\n  hint: record a log only on the image whose job you emitted (`cudastack verify {image} --emit ...`) and ran; the line naming the image is printed inside the container, so code in an image can print another")]
    OtherImage {
        image: String,
        expected: Digest,
        found: String,
    },
    #[error("the log names more than one image ({found}); code in the image can print that line too, so the log cannot say which image ran\n  hint: run the job that `cudastack verify IMAGE --emit ...` prints again and record its log")]
    SeveralImagesInLog { found: String },
    #[error("`{what}` is not a usable image document: {detail}")]
    Document { what: String, detail: String },
}

/// One row of the verified matrix: one GPU type on one driver.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerifiedOn {
    pub gpu: String,
    pub compute_capability: String,
    pub count: u32,
    pub driver: String,
    pub cuda_driver: Option<String>,
    /// RFC 3339 date of the run.
    pub date: String,
    pub cudastack: String,
    /// Check id -> seconds, every check passed.
    pub checks: BTreeMap<String, f64>,
    pub report: String,
}

/// The matrix rows a verified report adds.
pub fn matrix_rows(
    report: &Report,
    report_digest: &Digest,
) -> Result<Vec<VerifiedOn>, RecordError> {
    let verdict = report.verdict();
    if verdict != Verdict::Verified {
        return Err(RecordError::NotVerified { verdict });
    }
    let driver = report
        .driver
        .as_ref()
        .expect("a verified report names its driver");
    let checks: BTreeMap<String, f64> = report
        .checks
        .iter()
        .filter(|c| c.status == Status::Pass)
        .map(|c| (c.id.clone(), c.seconds))
        .collect();
    let mut by_type: BTreeMap<(String, String), u32> = BTreeMap::new();
    for gpu in &report.gpus {
        *by_type
            .entry((gpu.name.clone(), gpu.compute_capability.clone()))
            .or_default() += 1;
    }
    Ok(by_type
        .into_iter()
        .map(|((gpu, compute_capability), count)| VerifiedOn {
            gpu,
            compute_capability,
            count,
            driver: driver.version.clone(),
            cuda_driver: driver.cuda.clone(),
            date: report.started.clone(),
            cudastack: report
                .runner
                .as_ref()
                .map(|r| r.cudastack_version.clone())
                .unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_string()),
            checks: checks.clone(),
            report: report_digest.to_string(),
        })
        .collect())
}

/// The verified labels: the existing matrix (if any) plus `rows`, and flat summaries.
pub fn verified_labels(
    existing: &BTreeMap<String, String>,
    rows: Vec<VerifiedOn>,
) -> BTreeMap<String, String> {
    let mut matrix: Vec<VerifiedOn> = existing
        .get(labels::VERIFIED_MATRIX)
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default();
    for row in rows {
        matrix.retain(|old| {
            (&old.gpu, &old.compute_capability, &old.driver)
                != (&row.gpu, &row.compute_capability, &row.driver)
        });
        matrix.push(row);
    }
    matrix.sort_by(|a, b| (&a.gpu, &a.driver).cmp(&(&b.gpu, &b.driver)));
    let latest = matrix
        .iter()
        .max_by(|a, b| a.date.cmp(&b.date))
        .expect("at least one row");
    let join = |values: Vec<String>| {
        let mut values = values;
        values.sort();
        values.dedup();
        values.join(",")
    };
    BTreeMap::from([
        (labels::VERIFIED.to_string(), latest.date.clone()),
        (
            labels::VERIFIED_MATRIX.to_string(),
            String::from_utf8(crate::oci::canonical::to_canonical_json(&matrix).expect("rows"))
                .expect("JSON is UTF-8"),
        ),
        (
            labels::VERIFIED_GPUS.to_string(),
            join(
                matrix
                    .iter()
                    .map(|r| format!("{} (sm_{})", r.gpu, r.compute_capability.replace('.', "")))
                    .collect(),
            ),
        ),
        (
            labels::VERIFIED_DRIVER.to_string(),
            join(matrix.iter().map(|r| r.driver.clone()).collect()),
        ),
        (labels::VERIFIED_REPORT.to_string(), latest.report.clone()),
    ])
}

/// The image a cluster job's log names (its `cudastack-image-v1 REF` line), as the report's
/// image facts: the reference and the digest after its `@`. The job prints that line before
/// the probe runs, but code in the image can print one too: a log whose lines name more than
/// one image is refused, never resolved by taking the first or the last.
pub fn image_in_log(log: &str) -> Result<Option<ImageFacts>, RecordError> {
    let mut named: Vec<&str> = log
        .lines()
        .filter_map(|line| line.trim_end().strip_prefix(super::IMAGE_PREFIX))
        .map(str::trim)
        .collect();
    named.dedup();
    let reference = match named.as_slice() {
        [] => return Ok(None),
        [one] => *one,
        several => {
            return Err(RecordError::SeveralImagesInLog {
                found: several
                    .iter()
                    .map(|r| crate::printable::short(r))
                    .collect::<Vec<_>>()
                    .join(", "),
            })
        }
    };
    let digest = reference
        .rsplit_once('@')
        .map(|(_, digest)| digest.to_string());
    Ok(Some(ImageFacts {
        reference: reference.to_string(),
        manifest_digest: digest,
        config_digest: None,
    }))
}

/// Refuse to record `report` on the image `expected` (named `image` for the message) when
/// the report is about another image; `required`: also when it names no image (a log
/// recorded on a registry image must say which image ran).
pub fn check_report_image(
    report: &Report,
    image: &str,
    expected: &Digest,
    required: bool,
) -> Result<(), RecordError> {
    let named = report
        .image
        .as_ref()
        .and_then(|facts| facts.manifest_digest.clone());
    match named {
        None if required => Err(RecordError::NoImageInLog {
            image: image.to_string(),
        }),
        None => Ok(()),
        Some(found) if found.parse::<Digest>().ok().as_ref() == Some(expected) => Ok(()),
        Some(found) => Err(RecordError::OtherImage {
            image: image.to_string(),
            expected: *expected,
            found,
        }),
    }
}

/// The annotations of a stored report artifact: when it ran and its verdict.
pub fn report_annotations(report: &Report) -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::CREATED.to_string(), report.started.clone()),
        (
            labels::VERDICT.to_string(),
            match report.verdict() {
                Verdict::Verified => "verified",
                Verdict::Partial { .. } => "partial",
                Verdict::Failed { .. } => "failed",
            }
            .to_string(),
        ),
    ])
}

/// The labels of a config document (`config.Labels`); empty when it has none.
pub fn config_labels(config: &serde_json::Value) -> BTreeMap<String, String> {
    config["config"]["Labels"]
        .as_object()
        .map(|labels| {
            labels
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// The verified image of a registry image, from its manifest and config as the registry
/// holds them: the config with `labels` added (every other field kept as it is, Docker or
/// OCI), and the manifest naming that config with the same layer descriptors. Returns the
/// canonical bytes of (config, manifest).
pub fn verified_documents(
    manifest: &[u8],
    config: &[u8],
    labels: &BTreeMap<String, String>,
) -> Result<(Vec<u8>, Vec<u8>), RecordError> {
    let document = |what: &str, detail: String| RecordError::Document {
        what: what.to_string(),
        detail,
    };
    let mut config: serde_json::Value =
        serde_json::from_slice(config).map_err(|e| document("the image config", e.to_string()))?;
    let mut manifest: serde_json::Value = serde_json::from_slice(manifest)
        .map_err(|e| document("the image manifest", e.to_string()))?;
    if !config.is_object() || !manifest["config"].is_object() {
        return Err(document(
            "the image manifest",
            "it has no config descriptor, or the config is not a JSON object".to_string(),
        ));
    }
    let runtime = config
        .as_object_mut()
        .expect("checked")
        .entry("config")
        .or_insert_with(|| serde_json::json!({}));
    if !runtime.is_object() {
        *runtime = serde_json::json!({});
    }
    let existing = runtime
        .as_object_mut()
        .expect("an object")
        .entry("Labels")
        .or_insert_with(|| serde_json::json!({}));
    if !existing.is_object() {
        *existing = serde_json::json!({});
    }
    let existing = existing.as_object_mut().expect("an object");
    for (key, value) in labels {
        existing.insert(key.clone(), serde_json::Value::String(value.clone()));
    }
    let config_bytes = crate::canonical::to_canonical_json(&config)
        .map_err(|e| document("the image config", e.to_string()))?;
    manifest["config"]["digest"] = Digest::of_bytes(&config_bytes).to_string().into();
    manifest["config"]["size"] = (config_bytes.len() as u64).into();
    let manifest_bytes = crate::canonical::to_canonical_json(&manifest)
        .map_err(|e| document("the image manifest", e.to_string()))?;
    Ok((config_bytes, manifest_bytes))
}

/// What recording did.
#[derive(Debug, Clone, Serialize)]
pub struct Recorded {
    pub verdict: Verdict,
    /// The report artifact in the layout.
    pub report_digest: Digest,
    pub report_ref: String,
    /// The verified image, when the verdict allowed one.
    pub verified_manifest: Option<Digest>,
    /// Refs written or moved to the verified image.
    pub verified_refs: Vec<String>,
    /// The manifest the probe ran in, and the verified image made of it: the subjects of
    /// the verification attestation (crate::attest).
    #[serde(skip)]
    pub ran: Option<oci_spec::image::Descriptor>,
    #[serde(skip)]
    pub verified: Option<oci_spec::image::Descriptor>,
    /// The verified image as written to the layout, under the verified ref (what a load
    /// after the verification takes); None for a report recorded elsewhere.
    #[serde(skip)]
    pub verified_image: Option<layout::LayoutImage>,
}

/// Ref name of the report artifact stored beside `ref_name`.
pub fn report_ref(ref_name: &str) -> String {
    format!("{ref_name}.verify-report")
}

/// Store `report` in the layout at `dir` as an artifact on the image `ref_name`, and on a
/// verified report write the labelled image under every ref that named the same image,
/// plus `-verified` refs (`repo:tag` -> `repo:tag-verified`, `latest` -> `verified`).
pub fn record_in_layout(
    dir: &Path,
    ref_name: &str,
    report: &Report,
) -> Result<Recorded, RecordError> {
    let resolved = layout::resolve(dir, ref_name)?;
    check_report_image(report, ref_name, &resolved.manifest_digest, false)?;
    let report_bytes = report.to_json();
    let report_digest = Digest::of_bytes(&report_bytes);
    let artifact = Artifact {
        artifact_type: REPORT_ARTIFACT_TYPE.to_string(),
        subject: resolved.manifest.clone(),
        blobs: vec![(REPORT_ARTIFACT_TYPE.to_string(), report_bytes)],
        annotations: report_annotations(report),
    };
    let report_ref = report_ref(&image_ref(dir, ref_name)?);
    layout::write_artifact(dir, &artifact, &report_ref)?;
    let verdict = report.verdict();
    if verdict != Verdict::Verified {
        return Ok(Recorded {
            verdict,
            report_digest,
            report_ref,
            verified_manifest: None,
            verified_refs: Vec::new(),
            ran: Some(resolved.manifest),
            verified: None,
            verified_image: None,
        });
    }
    let rows = matrix_rows(report, &report_digest)?;
    let existing: BTreeMap<String, String> = resolved
        .config
        .config()
        .as_ref()
        .and_then(|c| c.labels().clone())
        .map(|labels| labels.into_iter().collect())
        .unwrap_or_default();
    let mut image = layout::read(dir, ref_name)?;
    for (key, value) in verified_labels(&existing, rows) {
        image = image.with_label(&key, &value);
    }
    // Every ref that named the unverified image moves to the verified one; an image index
    // that held it (a multi-platform image) gets the verified image in its place, the other
    // platforms untouched.
    let verified_descriptor = image.documents()?.manifest_descriptor();
    let mut refs = Vec::new();
    let mut index_refs = Vec::new();
    for name in layout::list_refs(dir)? {
        if let Some(children) = layout::index_images(dir, &name)? {
            if children
                .iter()
                .any(|(d, _)| crate::oci::digest_of(d).ok() == Some(resolved.manifest_digest))
            {
                let replaced: Vec<_> = children
                    .into_iter()
                    .map(|(d, platform)| {
                        if crate::oci::digest_of(&d).ok() == Some(resolved.manifest_digest) {
                            (verified_descriptor.clone(), platform)
                        } else {
                            (d, platform)
                        }
                    })
                    .collect();
                // A `-verified` index only when every platform in it is verified: an arm64
                // node pulling `:tag-verified` must never get an image nobody ran.
                let all_verified = replaced.iter().all(|(d, _)| {
                    d.digest() == verified_descriptor.digest()
                        || layout::config_of(dir, d)
                            .ok()
                            .and_then(|c| c.config().clone())
                            .and_then(|c| c.labels().clone())
                            .is_some_and(|l| l.contains_key(labels::VERIFIED))
                });
                if all_verified && !is_verified_ref(&name) {
                    index_refs.push((verified_ref(&name), replaced.clone()));
                }
                index_refs.push((name.clone(), replaced));
            }
        } else if layout::resolve(dir, &name)
            .map(|r| r.manifest_digest == resolved.manifest_digest)
            .unwrap_or(false)
        {
            refs.push(name.clone());
            if !is_verified_ref(&name) {
                refs.push(verified_ref(&name));
            }
        }
    }
    refs.sort();
    refs.dedup();
    let mut digest = None;
    for name in &refs {
        digest = Some(layout::write(&image, dir, name)?);
    }
    if !index_refs.is_empty() && digest.is_none() {
        layout::write_blobs(&image, dir)?;
        digest = Some(image.digest()?);
    }
    for (name, children) in &index_refs {
        layout::write_index(dir, children, name)?;
        refs.push(name.clone());
    }
    let others: Vec<String> = refs.iter().filter(|r| *r != ref_name).cloned().collect();
    let verified_image =
        layout::LayoutImage::written(dir, ref_name, &others, StoredImage::of(&image)?);
    Ok(Recorded {
        verdict,
        report_digest,
        report_ref,
        verified_manifest: digest,
        verified_refs: refs,
        ran: Some(resolved.manifest),
        verified: Some(verified_descriptor),
        verified_image: Some(verified_image),
    })
}

/// `repo:tag` -> `repo:tag-verified`; a plain ref name (`latest`) -> `verified`.
pub fn verified_ref(name: &str) -> String {
    match name.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => format!("{repo}:{tag}-verified"),
        _ if name == "latest" => "verified".to_string(),
        _ => format!("{name}-verified"),
    }
}

/// The report stored beside `ref_name` in the layout at `dir`, as its canonical bytes.
/// For an image index, the host platform's image (whose report it is).
pub fn stored_report(dir: &Path, ref_name: &str) -> Result<Option<Vec<u8>>, OciError> {
    layout::read_artifact_blob(dir, &report_ref(&image_ref(dir, ref_name)?))
}

/// The name reports of the image `ref_name` resolves to are stored under: `ref_name`
/// itself, or for an image index the platform ref of the image verified on this host
/// (`latest-linux-amd64`), so each platform keeps its own report.
pub fn image_ref(dir: &Path, ref_name: &str) -> Result<String, OciError> {
    if layout::index_images(dir, ref_name)?.is_none() {
        return Ok(ref_name.to_string());
    }
    let config = layout::resolve(dir, ref_name)?.config;
    Ok(layout::platform_ref_name(
        ref_name,
        &config.architecture().to_string(),
    ))
}

fn is_verified_ref(name: &str) -> bool {
    name == "verified" || name.ends_with("-verified")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verified_refs_keep_the_repository() {
        assert_eq!(verified_ref("latest"), "verified");
        assert_eq!(
            verified_ref("127.0.0.1:5000/cudastack/torch:2.4.1-cu121"),
            "127.0.0.1:5000/cudastack/torch:2.4.1-cu121-verified"
        );
        assert_eq!(
            verified_ref("127.0.0.1:5000/x"),
            "127.0.0.1:5000/x-verified"
        );
    }

    #[test]
    fn the_image_line_of_a_log_names_the_digest_a_report_is_checked_against() {
        let digest = Digest::of_bytes(b"image");
        let log = format!(
            "cudastack-image-v1 ghcr.io/acme/torch@{digest}\nnoise\ncudastack-report-v1 {{}}\n"
        );
        let facts = image_in_log(&log).unwrap().unwrap();
        assert_eq!(facts.reference, format!("ghcr.io/acme/torch@{digest}"));
        assert_eq!(facts.manifest_digest, Some(digest.to_string()));
        assert!(image_in_log("cudastack-report-v1 {}").unwrap().is_none());
        // The same line twice is one image; a second image is a refusal, whichever comes first.
        let twice = format!("{log}cudastack-image-v1 ghcr.io/acme/torch@{digest}\n");
        assert!(image_in_log(&twice).unwrap().is_some());
        let other = Digest::of_bytes(b"other");
        let forged = format!("{log}cudastack-image-v1 ghcr.io/acme/torch@{other}\n");
        let error = image_in_log(&forged).unwrap_err().to_string();
        assert!(error.contains("more than one image"), "{error}");
        let report_json = serde_json::json!({
            "schema": super::super::report::REPORT_SCHEMA, "probe_version": "1",
            "started": "2026-11-30T10:00:00Z", "seconds": 1.0, "hostname": "h",
            "levels": ["static"], "checks": [], "counts": {"pass": 0, "fail": 0, "skip": 0},
        });
        let mut report = Report::from_json(report_json.to_string().as_bytes()).unwrap();
        assert!(check_report_image(&report, "x", &digest, false).is_ok());
        let error = check_report_image(&report, "x", &digest, true).unwrap_err();
        assert!(error.to_string().contains("cudastack-image-v1"), "{error}");
        report.image = Some(facts);
        assert!(check_report_image(&report, "x", &digest, true).is_ok());
        let other = Digest::of_bytes(b"other");
        let error = check_report_image(&report, "x", &other, true).unwrap_err();
        let text = error.to_string();
        assert!(
            text.contains(&format!("Expected: {other}"))
                && text.contains(&format!("Found:    {digest}")),
            "{text}"
        );
    }

    #[test]
    fn verified_documents_keep_every_field_and_the_layers() {
        let layer = serde_json::json!({"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
            "digest": Digest::of_bytes(b"layer").to_string(), "size": 5});
        let config = serde_json::json!({"architecture": "amd64", "os": "linux",
            "config": {"Env": ["A=1"], "Labels": {"keep": "me"}},
            "rootfs": {"type": "layers", "diff_ids": []}, "history": [{"created_by": "x"}]});
        let config_bytes = serde_json::to_vec(&config).unwrap();
        let manifest = serde_json::json!({"schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                       "digest": Digest::of_bytes(&config_bytes).to_string(), "size": config_bytes.len()},
            "layers": [layer]});
        let labels = BTreeMap::from([(labels::VERIFIED.to_string(), "2026".to_string())]);
        let (new_config, new_manifest) = verified_documents(
            &serde_json::to_vec(&manifest).unwrap(),
            &config_bytes,
            &labels,
        )
        .unwrap();
        let new_config: serde_json::Value = serde_json::from_slice(&new_config).unwrap();
        assert_eq!(new_config["config"]["Labels"]["keep"], "me");
        assert_eq!(new_config["config"]["Labels"][labels::VERIFIED], "2026");
        assert_eq!(new_config["history"], config["history"]);
        let new_manifest: serde_json::Value = serde_json::from_slice(&new_manifest).unwrap();
        assert_eq!(new_manifest["layers"], manifest["layers"]);
        assert_eq!(new_manifest["mediaType"], manifest["mediaType"]);
        assert_ne!(
            new_manifest["config"]["digest"],
            manifest["config"]["digest"]
        );
        // A config without `config` gets one; a manifest that is not one is an error.
        let (bare, _) =
            verified_documents(&serde_json::to_vec(&manifest).unwrap(), b"{}", &labels).unwrap();
        assert!(String::from_utf8(bare).unwrap().contains(labels::VERIFIED));
        assert!(verified_documents(b"[]", b"{}", &labels).is_err());
        assert!(verified_documents(b"not json", b"{}", &labels).is_err());
    }

    #[test]
    fn rows_accumulate_per_gpu_and_driver() {
        let row = |gpu: &str, driver: &str, date: &str| VerifiedOn {
            gpu: gpu.into(),
            compute_capability: "9.0".into(),
            count: 1,
            driver: driver.into(),
            cuda_driver: Some("12.4".into()),
            date: date.into(),
            cudastack: "0.1.0".into(),
            checks: BTreeMap::new(),
            report: format!("sha256:{}", "a".repeat(64)),
        };
        let first = verified_labels(
            &BTreeMap::new(),
            vec![row("NVIDIA H200", "550.54.15", "2026-01-01T00:00:00Z")],
        );
        let second = verified_labels(
            &first,
            vec![
                row(
                    "NVIDIA A100-SXM4-80GB",
                    "535.104.05",
                    "2026-02-01T00:00:00Z",
                ),
                row("NVIDIA H200", "550.54.15", "2026-03-01T00:00:00Z"),
            ],
        );
        let matrix: Vec<VerifiedOn> =
            serde_json::from_str(&second[labels::VERIFIED_MATRIX]).unwrap();
        assert_eq!(
            matrix.len(),
            2,
            "the H200 row is replaced, the A100 row added"
        );
        assert_eq!(second[labels::VERIFIED], "2026-03-01T00:00:00Z");
        assert_eq!(second[labels::VERIFIED_DRIVER], "535.104.05,550.54.15");
        assert!(second[labels::VERIFIED_GPUS].contains("NVIDIA H200 (sm_90)"));
    }
}
