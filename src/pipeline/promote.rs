//! Promotion (`cudastack promote REF --require-gpu CLASS`): a verified image in a registry
//! gets its plain tag (`repo:2.4.1` for `repo:2.4.1-verified`) once it has passed on every
//! GPU class a release asks for, so what users pull by the plain tag is what was proven.
//!
//! The evidence is what recording left in the registry: the verified matrix in the labels
//! of the `-verified` image (one row per GPU type that passed) and the verification reports
//! stored as referrers of the image and of its verified copy (failed runs too). A class
//! passes when a matrix row names it and no newer report for it failed. Promotion is one
//! manifest PUT of the verified manifest's own bytes under the new tag: nothing is rebuilt,
//! no blob is uploaded, and the digest users pull is the verified one. It reads the
//! registry through [`crate::registry`] and decides; it never prints.

use std::collections::BTreeSet;

use serde::Serialize;

use crate::digest::Digest;
use crate::labels;
use crate::matrix::solve::{SolveError, SolveQuery};
use crate::matrix::Matrix;
use crate::registry::{ClientOptions, Manifest, Reference, RegistryClient, RegistryError};
use crate::target_gpu::TargetGpu;
use crate::verify::record::{config_labels, verified_documents, verified_labels, VerifiedOn};
use crate::verify::report::{Report, ReportError, Verdict};
use crate::verify::REPORT_ARTIFACT_TYPE;

use super::Progress;

/// What `promote` is asked.
#[derive(Debug, Clone)]
pub struct PromoteSettings {
    /// GPU classes (names as the matrix knows them, or compute capabilities) that must
    /// each have a passing verification.
    pub require: Vec<String>,
    /// The tag to give the verified image (default: REF's tag without `-verified`).
    pub to: Option<String>,
    /// Decide and say what would be done; tag nothing.
    pub dry_run: bool,
    /// The verified images to read when each GPU type's verification pushed its own
    /// (`repo:T-verified-gpu-a100`, as the generated publish workflow does); empty: the
    /// `-verified` tag of REF. Several are merged into one verified image whose matrix has
    /// every row, tagged with the plain tag and `-verified`.
    pub verified: Vec<Reference>,
}

/// Where one required GPU class stands.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ClassStatus {
    /// A verified-matrix row names it, and no newer report for it failed.
    Passed {
        gpu: String,
        driver: String,
        date: String,
    },
    /// Its newest report failed these checks.
    Failed { date: String, checks: Vec<String> },
    /// No passing verification on this class.
    Missing,
}

/// One required class and its status.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassCheck {
    /// How the class was asked for, resolved: `H100 (sm_90)`.
    pub class: String,
    #[serde(flatten)]
    pub status: ClassStatus,
}

/// What promotion decided and did.
#[derive(Debug, Clone, Serialize)]
pub struct Promotion {
    /// The verified image, `repo:tag-verified@sha256:…`.
    pub verified: String,
    pub digest: Digest,
    /// The tag it gets (or would get), `repo:tag@sha256:…`.
    pub to: String,
    pub classes: Vec<ClassCheck>,
    /// Whether the tag was written (false on a dry run).
    pub tagged: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum PromoteError {
    #[error("there is no verified image `{verified}` to promote\n  hint: record a verification first: run the job `cudastack verify {image} --emit k8s-job` (or `--emit sbatch`) prints, then the `cudastack verify ... --from-log LOG` line of its header")]
    NoVerifiedImage { verified: String, image: String },
    #[error("`{reference}` is a multi-platform image index; promote names one platform's verified image")]
    Index { reference: String },
    #[error(
        "`{reference}` has no tag to derive the promoted tag from\n  hint: give it with --to TAG"
    )]
    NoTag { reference: String },
    #[error("`{to}` is a multi-platform image index; promoting one platform's verified image would replace it for every platform\n  hint: promote to a tag of this platform (--to TAG)")]
    IndexTag { to: String },
    #[error("`{reference}` carries no verified matrix (label {label}): it is not a verified image\n  hint: promote the `-verified` tag that `cudastack verify --from-log` wrote", label = labels::VERIFIED_MATRIX)]
    NotVerified { reference: String },
    #[error("refusing to promote `{verified}` to `{to}`: {}\n{}\n  hint: verify the image on each missing class (`cudastack verify IMAGE --emit k8s-job --gpu-type TYPE`, then --from-log), and fix what failed", problem_count(.problems), .problems.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n"))]
    Refused {
        verified: String,
        to: String,
        problems: Vec<String>,
    },
    #[error("`{first}` and `{other}` are verified copies of different images (their layers differ); promote merges the verifications of one image\n  hint: give --verified only the tags the verification jobs of this build pushed")]
    DifferentImages { first: String, other: String },
    #[error("`{verified}` is not in the repository of `{to}`; promote tags images within one repository\n  hint: give --verified tags of the repository being promoted")]
    OtherRepository { verified: String, to: String },
    #[error("cannot merge the verified matrices into `{reference}`'s config: {detail}")]
    Merge { reference: String, detail: String },
    #[error(transparent)]
    Gpu(#[from] SolveError),
    #[error(transparent)]
    Reference(#[from] crate::reference::ReferenceError),
    /// Boxed: a registry error names its URL and would make every `Result` large.
    #[error(transparent)]
    Registry(Box<RegistryError>),
    #[error("refusing to promote: {count} verification report(s) of {subject} were not read ({why}); one of them may be a failed run\n  hint: remove the registry's stray referrers of the image, or promote from a registry that serves its reports")]
    ReportsUnread {
        subject: String,
        count: usize,
        why: String,
    },
    #[error("the verification report {digest} stored in `{repository}` cannot be read")]
    Report {
        repository: String,
        digest: String,
        #[source]
        source: ReportError,
    },
}

impl From<RegistryError> for PromoteError {
    fn from(error: RegistryError) -> Self {
        PromoteError::Registry(Box::new(error))
    }
}

fn problem_count(problems: &[String]) -> String {
    match problems.len() {
        1 => "1 required GPU class has no passing verification".to_string(),
        n => format!("{n} required GPU classes have no passing verification"),
    }
}

/// Promote the verified image `reference` names (its `-verified` tag, or the plain tag
/// whose `-verified` copy is meant) to its plain tag, when every class of `settings`
/// passed; refuse with the list of classes that did not.
pub async fn promote(
    reference: &Reference,
    settings: &PromoteSettings,
    client_options: ClientOptions,
    progress: &dyn Progress,
) -> Result<Promotion, PromoteError> {
    let matrix = Matrix::embedded();
    let required: Vec<TargetGpu> = settings
        .require
        .iter()
        .map(|class| SolveQuery::gpu(matrix, class))
        .collect::<Result<_, _>>()?;
    let (derived, plain) = names(reference, settings.to.as_deref())?;
    let sources = match settings.verified.is_empty() {
        true => vec![derived],
        false => settings.verified.clone(),
    };
    // The promoted tag references the verified images' layers: they must be in its
    // repository, on the same registry.
    if let Some(other) = sources.iter().find(|source| {
        (source.registry(), source.repository()) != (plain.registry(), plain.repository())
    }) {
        return Err(PromoteError::OtherRepository {
            verified: other.to_string(),
            to: plain.to_string(),
        });
    }
    let client = RegistryClient::new(reference, client_options)?;
    let mut images = Vec::new();
    for source in sources {
        let manifest = verified_manifest(&client, &source, &plain).await?;
        images.push((source, manifest));
    }
    let (first_ref, first) = &images[0];
    if let Some((other, _)) = images
        .iter()
        .find(|(_, m)| m.digest != first.digest && !same_layers(m, first))
    {
        return Err(PromoteError::DifferentImages {
            first: first_ref.to_string(),
            other: other.to_string(),
        });
    }
    let mut rows = Vec::new();
    for (source, manifest) in &images {
        rows.push(verified_rows(&client, source, manifest).await?);
    }
    let reports = evidence(&client, &images, &plain).await?;
    let all_rows: Vec<VerifiedOn> = rows.iter().flatten().cloned().collect();
    let classes: Vec<ClassCheck> = required
        .iter()
        .map(|class| ClassCheck {
            class: class.label(),
            status: class_status(matrix, class, &all_rows, &reports),
        })
        .collect();
    let verified_name = match images.len() {
        1 => first_ref.pinned(first.digest).to_string(),
        _ => images
            .iter()
            .map(|(r, m)| r.pinned(m.digest).to_string())
            .collect::<Vec<_>>()
            .join(" + "),
    };
    let problems: Vec<String> = classes.iter().filter_map(describe_problem).collect();
    if !problems.is_empty() {
        return Err(PromoteError::Refused {
            verified: verified_name,
            to: plain.to_string(),
            problems,
        });
    }
    // One verified image is tagged as it is; several become one whose matrix has every row.
    let (media_type, bytes) = match images.len() {
        1 => (first.media_type.clone(), first.bytes.clone()),
        _ => {
            let merged = merged_documents(&client, first_ref, first, rows).await?;
            if !settings.dry_run {
                client
                    .put_blob_bytes(first_ref.repository(), merged.0)
                    .await?;
            }
            (first.media_type.clone(), merged.1)
        }
    };
    let digest = Digest::of_bytes(&bytes);
    let mut targets = vec![plain.clone()];
    if images.len() > 1 {
        if let Some(tag) = plain.tag() {
            targets.push(plain.with_tag(&format!("{tag}-verified"))?);
        }
    }
    if !settings.dry_run {
        for target in &targets {
            client
                .put_manifest(target, &media_type, bytes.clone())
                .await?;
            progress.status(&format!("tagged {digest} as {target}"));
        }
    }
    Ok(Promotion {
        verified: verified_name,
        digest,
        to: plain.pinned(digest).to_string(),
        classes,
        tagged: !settings.dry_run,
    })
}

/// The verified image `source` names (not an index); a missing one says how to make it.
async fn verified_manifest(
    client: &RegistryClient,
    source: &Reference,
    plain: &Reference,
) -> Result<Manifest, PromoteError> {
    match client.get_manifest(source).await {
        Ok(manifest) if manifest.is_index() => Err(PromoteError::Index {
            reference: source.to_string(),
        }),
        Ok(manifest) => Ok(manifest),
        Err(RegistryError::ManifestNotFound { .. }) => Err(PromoteError::NoVerifiedImage {
            verified: source.to_string(),
            image: plain.to_string(),
        }),
        Err(error) => Err(error.into()),
    }
}

/// The config and manifest of one verified image with the rows of all of them: the first
/// image's config, its verified matrix extended by the others' rows.
async fn merged_documents(
    client: &RegistryClient,
    reference: &Reference,
    manifest: &Manifest,
    rows: Vec<Vec<VerifiedOn>>,
) -> Result<(bytes::Bytes, bytes::Bytes), PromoteError> {
    let (config, config_json) = image_config(client, reference, manifest).await?;
    let mut labels = config_labels(&config_json);
    let others: Vec<VerifiedOn> = rows.into_iter().skip(1).flatten().collect();
    let merged = verified_labels(&labels, others);
    labels.extend(merged);
    let (config_bytes, manifest_bytes) = verified_documents(&manifest.bytes, &config, &labels)
        .map_err(|e| PromoteError::Merge {
            reference: reference.to_string(),
            detail: e.to_string(),
        })?;
    Ok((config_bytes.into(), manifest_bytes.into()))
}

/// The verified image's reference and the tag it is promoted to: `repo:T-verified` and
/// `repo:T` from either of them, `--to` overriding the second.
fn names(reference: &Reference, to: Option<&str>) -> Result<(Reference, Reference), PromoteError> {
    let tag = reference.tag();
    let verified = match tag {
        Some(tag) if tag.ends_with("-verified") => reference.without_digest(),
        Some(tag) => reference.with_tag(&format!("{tag}-verified"))?,
        None => reference.clone(),
    };
    let plain = match (to, tag) {
        (Some(to), _) => reference.with_tag(to)?,
        (None, Some(tag)) => reference.with_tag(tag.strip_suffix("-verified").unwrap_or(tag))?,
        (None, None) => {
            return Err(PromoteError::NoTag {
                reference: reference.to_string(),
            })
        }
    };
    Ok((verified, plain))
}

/// The verified matrix in the labels of the verified image's config.
async fn verified_rows(
    client: &RegistryClient,
    reference: &Reference,
    manifest: &Manifest,
) -> Result<Vec<VerifiedOn>, PromoteError> {
    let not_verified = || PromoteError::NotVerified {
        reference: reference.to_string(),
    };
    let (_, config) = image_config(client, reference, manifest).await?;
    let labels = config_labels(&config);
    let matrix = labels
        .get(labels::VERIFIED_MATRIX)
        .ok_or_else(not_verified)?;
    serde_json::from_str(matrix).map_err(|_| not_verified())
}

/// The config of an image manifest: its bytes as stored and its JSON.
async fn image_config(
    client: &RegistryClient,
    reference: &Reference,
    manifest: &Manifest,
) -> Result<(bytes::Bytes, serde_json::Value), PromoteError> {
    let not_verified = || PromoteError::NotVerified {
        reference: reference.to_string(),
    };
    let value: serde_json::Value =
        serde_json::from_slice(&manifest.bytes).map_err(|_| not_verified())?;
    let digest: Digest = value["config"]["digest"]
        .as_str()
        .unwrap_or_default()
        .parse()
        .map_err(|_| not_verified())?;
    let bytes = client
        .get_blob_bytes(reference.repository(), &digest, 16 << 20)
        .await?;
    let config = serde_json::from_slice(&bytes).map_err(|_| not_verified())?;
    Ok((bytes, config))
}

/// Every verification report stored as a referrer of the verified images, or of the image
/// they were recorded from (the plain tag, while that is an unverified copy of the same
/// layers).
async fn evidence(
    client: &RegistryClient,
    images: &[(Reference, Manifest)],
    plain: &Reference,
) -> Result<Vec<Report>, PromoteError> {
    let (first_ref, first) = &images[0];
    let mut subjects: Vec<Digest> = images.iter().map(|(_, m)| m.digest).collect();
    match client.get_manifest(plain).await {
        Ok(original) if original.is_index() => {
            return Err(PromoteError::IndexTag {
                to: plain.to_string(),
            })
        }
        Ok(original) if same_layers(&original, first) => subjects.push(original.digest),
        Ok(_) | Err(RegistryError::ManifestNotFound { .. }) => {}
        Err(error) => return Err(error.into()),
    }
    subjects.dedup();
    let mut seen = BTreeSet::new();
    let mut reports = Vec::new();
    for subject in subjects {
        for (digest, bytes) in report_blobs(client, first_ref, &subject).await? {
            if !seen.insert(digest) {
                continue;
            }
            reports.push(
                Report::from_json(&bytes).map_err(|source| PromoteError::Report {
                    repository: first_ref.repository().to_string(),
                    digest: digest.to_string(),
                    source,
                })?,
            );
        }
    }
    Ok(reports)
}

/// The report artifacts of `subject` (their digest and report bytes), within the
/// per-image referrer budget. A report left unread refuses the promotion: it may be the
/// failed run that outweighs a pass (fail closed).
async fn report_blobs(
    client: &RegistryClient,
    repository: &Reference,
    subject: &Digest,
) -> Result<Vec<(Digest, bytes::Bytes)>, PromoteError> {
    use crate::registry::referrers::{fetch_referrers, ArtifactTypes, BlobSink, ReferrerBudget};
    let fetched = fetch_referrers(
        client,
        repository,
        subject,
        ArtifactTypes::Only(&[REPORT_ARTIFACT_TYPE]),
        ReferrerBudget::default(),
        BlobSink::Memory,
    )
    .await?;
    if let Some(first) = fetched.skipped.first() {
        return Err(PromoteError::ReportsUnread {
            subject: subject.to_string(),
            count: fetched.skipped.len(),
            why: fetched
                .over_budget
                .unwrap_or_else(|| format!("{}: {}", first.digest, first.why)),
        });
    }
    Ok(fetched
        .referrers
        .iter()
        .filter_map(|r| Some((r.digest, r.blob_bytes()?.clone())))
        .collect())
}

fn same_layers(a: &Manifest, b: &Manifest) -> bool {
    let layers = |m: &Manifest| {
        serde_json::from_slice::<serde_json::Value>(&m.bytes)
            .ok()
            .map(|v| v["layers"].clone())
    };
    a.digest != b.digest && layers(a).is_some() && layers(a) == layers(b)
}

/// Whether a GPU a report or row names (`NVIDIA H100 80GB HBM3`, compute capability
/// `9.0`) is of `class`: the same matrix GPU when the class is a name (forgiving, as
/// everywhere in the tool), the same compute capability when it is one.
fn is_of_class(matrix: &Matrix, class: &TargetGpu, name: &str, compute_capability: &str) -> bool {
    if class.named() {
        matrix
            .gpu(name)
            .is_some_and(|known| known.name == class.name)
    } else {
        compute_capability.parse().ok() == Some(class.cc)
    }
}

/// A class passes on a matrix row of it, unless a report of it newer than that row failed.
fn class_status(
    matrix: &Matrix,
    class: &TargetGpu,
    rows: &[VerifiedOn],
    reports: &[Report],
) -> ClassStatus {
    let passed = rows
        .iter()
        .filter(|row| is_of_class(matrix, class, &row.gpu, &row.compute_capability))
        .max_by(|a, b| a.date.cmp(&b.date));
    let failed = reports
        .iter()
        .filter(|report| {
            report
                .gpus
                .iter()
                .any(|gpu| is_of_class(matrix, class, &gpu.name, &gpu.compute_capability))
        })
        .filter_map(|report| match report.verdict() {
            Verdict::Failed { checks } => Some((report.started.clone(), checks)),
            _ => None,
        })
        .max_by(|a, b| a.0.cmp(&b.0));
    match (passed, failed) {
        (Some(row), Some((date, _))) if row.date >= date => passed_status(row),
        (_, Some((date, checks))) => ClassStatus::Failed { date, checks },
        (Some(row), None) => passed_status(row),
        (None, None) => ClassStatus::Missing,
    }
}

fn passed_status(row: &VerifiedOn) -> ClassStatus {
    ClassStatus::Passed {
        gpu: row.gpu.clone(),
        driver: row.driver.clone(),
        date: row.date.clone(),
    }
}

/// The line of the refusal for a class that did not pass.
fn describe_problem(check: &ClassCheck) -> Option<String> {
    match &check.status {
        ClassStatus::Passed { .. } => None,
        ClassStatus::Missing => Some(format!(
            "{}: missing (no passing verification on this GPU class)",
            check.class
        )),
        ClassStatus::Failed { date, checks } => Some(format!(
            "{}: FAILED on {date}: {}",
            check.class,
            checks.join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(gpu: &str, cc: &str, date: &str) -> VerifiedOn {
        VerifiedOn {
            gpu: gpu.into(),
            compute_capability: cc.into(),
            count: 1,
            driver: "550.54.15".into(),
            cuda_driver: None,
            date: date.into(),
            cudastack: "0.1.0".into(),
            checks: Default::default(),
            report: format!("sha256:{}", "a".repeat(64)),
        }
    }

    #[test]
    fn classes_match_by_matrix_name_or_compute_capability() {
        let matrix = Matrix::embedded();
        let h100 = SolveQuery::gpu(matrix, "h100").unwrap();
        let sm90 = SolveQuery::gpu(matrix, "9.0").unwrap();
        let a100 = SolveQuery::gpu(matrix, "A100").unwrap();
        let rows = [row("NVIDIA H100 80GB HBM3", "9.0", "2026-11-30T10:00:00Z")];
        assert!(matches!(
            class_status(matrix, &h100, &rows, &[]),
            ClassStatus::Passed { .. }
        ));
        assert!(matches!(
            class_status(matrix, &sm90, &rows, &[]),
            ClassStatus::Passed { .. }
        ));
        assert_eq!(
            class_status(matrix, &a100, &rows, &[]),
            ClassStatus::Missing
        );
        assert!(SolveQuery::gpu(matrix, "H1OO-typo").is_err());
    }

    #[test]
    fn names_derive_the_verified_and_plain_tags() {
        let plain: Reference = "127.0.0.1:5000/team/torch:2.4.1".parse().unwrap();
        let verified: Reference = "127.0.0.1:5000/team/torch:2.4.1-verified".parse().unwrap();
        for reference in [&plain, &verified] {
            let (v, p) = names(reference, None).unwrap();
            assert_eq!(v.tag(), Some("2.4.1-verified"));
            assert_eq!(p.tag(), Some("2.4.1"));
        }
        let (_, to) = names(&verified, Some("stable")).unwrap();
        assert_eq!(to.tag(), Some("stable"));
        let by_digest = plain.with_digest(Digest::of_bytes(b"x"));
        assert!(matches!(
            names(&by_digest, None),
            Err(PromoteError::NoTag { .. })
        ));
    }
}
