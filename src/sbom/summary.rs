//! What `inspect` prints of an image's SPDX SBOM: how many Debian packages and wheels it
//! contains, its CUDA components with their versions, and the image's GPU facts. Read
//! from a stored or pulled document, so any bytes are an error, never a panic.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::inventory::FACT_PREFIX;

/// An SBOM larger than this is refused unread (the torch images' are ~200 kB).
pub const MAX_SBOM_BYTES: usize = 64 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum SbomError {
    #[error("the SBOM is {size} bytes, more than the {limit} bytes cudastack reads\n  hint: it was not written by cudastack; rebuild the image to get a new one")]
    TooLarge { size: usize, limit: usize },
    #[error("the SBOM is not SPDX JSON")]
    Parse(#[source] serde_json::Error),
    #[error("the SBOM is SPDX version `{0}`; cudastack reads SPDX-2.3")]
    Version(String),
    #[error("the SBOM describes no package (no DESCRIBES relationship from SPDXRef-DOCUMENT)")]
    NoRoot,
}

/// A CUDA component of the image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ComponentSummary {
    /// `cuDNN`.
    pub name: String,
    pub version: String,
    /// The wheel or archive it was expanded from: `nvidia-cudnn-cu12 9.1.0.70`.
    pub from: String,
}

/// The SBOM in a few lines.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// The image's name, as the SBOM gives it.
    pub name: String,
    pub created: String,
    pub debs: usize,
    pub wheels: usize,
    /// Wheels compiled from `build:` sdists.
    pub built_wheels: usize,
    pub cuda: Vec<ComponentSummary>,
    /// The image's `cudastack:` facts (`driver-floor` -> `535.104.05`), sorted; a key given
    /// more than once keeps its values joined by `; `.
    pub facts: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Document {
    spdx_version: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    creation_info: Option<CreationInfo>,
    #[serde(default)]
    packages: Vec<SpdxPackage>,
    #[serde(default)]
    relationships: Vec<Relationship>,
}

#[derive(Deserialize)]
struct CreationInfo {
    #[serde(default)]
    created: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpdxPackage {
    #[serde(rename = "SPDXID")]
    id: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    version_info: Option<String>,
    #[serde(default)]
    external_refs: Vec<ExternalRef>,
    #[serde(default)]
    annotations: Vec<Annotation>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ExternalRef {
    #[serde(default)]
    reference_type: String,
    #[serde(default)]
    reference_locator: String,
}

#[derive(Deserialize)]
struct Annotation {
    #[serde(default)]
    comment: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Relationship {
    spdx_element_id: String,
    relationship_type: String,
    related_spdx_element: String,
}

impl SpdxPackage {
    fn purl_type(&self) -> Option<&str> {
        self.external_refs
            .iter()
            .find(|r| r.reference_type == "purl")
            .and_then(|r| r.reference_locator.strip_prefix("pkg:"))
            .and_then(|rest| rest.split('/').next())
    }

    /// The `cudastack:` facts: (key, value).
    fn facts(&self) -> impl Iterator<Item = (&str, &str)> {
        self.annotations.iter().filter_map(|a| {
            a.comment
                .strip_prefix(FACT_PREFIX)
                .and_then(|fact| fact.split_once('='))
        })
    }

    fn has_fact(&self, key: &str) -> bool {
        self.facts().any(|(k, _)| k == key)
    }

    fn label(&self) -> String {
        format!(
            "{} {}",
            self.name,
            self.version_info.as_deref().unwrap_or("")
        )
        .trim_end()
        .to_string()
    }
}

impl Summary {
    /// Read an SPDX 2.3 JSON document (as [`super::spdx_json`] writes it).
    pub fn of_spdx(bytes: &[u8]) -> Result<Summary, SbomError> {
        if bytes.len() > MAX_SBOM_BYTES {
            return Err(SbomError::TooLarge {
                size: bytes.len(),
                limit: MAX_SBOM_BYTES,
            });
        }
        let document: Document = serde_json::from_slice(bytes).map_err(SbomError::Parse)?;
        if document.spdx_version != "SPDX-2.3" {
            return Err(SbomError::Version(document.spdx_version));
        }
        let by_id: BTreeMap<&str, &SpdxPackage> = document
            .packages
            .iter()
            .map(|p| (p.id.as_str(), p))
            .collect();
        // Indexed once, duplicates dropped: a hostile document repeating one relationship
        // or package a million times costs one pass, not a pass per package.
        let mut edges: BTreeMap<(&str, &str), BTreeMap<&str, &SpdxPackage>> = BTreeMap::new();
        for r in &document.relationships {
            if let Some(package) = by_id.get(r.related_spdx_element.as_str()) {
                edges
                    .entry((r.spdx_element_id.as_str(), r.relationship_type.as_str()))
                    .or_default()
                    .insert(package.id.as_str(), *package);
            }
        }
        let related = |from: &str, kind: &str| -> Vec<&SpdxPackage> {
            edges
                .get(&(from, kind))
                .map(|to| to.values().copied().collect())
                .unwrap_or_default()
        };
        let root = related("SPDXRef-DOCUMENT", "DESCRIBES")
            .into_iter()
            .next()
            .ok_or(SbomError::NoRoot)?;
        let contained = related(&root.id, "CONTAINS");
        let cuda = contained
            .iter()
            .filter(|p| p.has_fact("cuda-component"))
            .map(|p| ComponentSummary {
                name: p.name.clone(),
                version: p.version_info.clone().unwrap_or_default(),
                from: related(&p.id, "EXPANDED_FROM_ARCHIVE")
                    .first()
                    .map(|archive| archive.label())
                    .unwrap_or_default(),
            })
            .collect();
        let mut facts: BTreeMap<String, String> = BTreeMap::new();
        for (key, value) in root.facts().filter(|(key, _)| *key != "device-code") {
            facts
                .entry(key.to_string())
                .and_modify(|v| {
                    v.push_str("; ");
                    v.push_str(value);
                })
                .or_insert_with(|| value.to_string());
        }
        let count = |kind: &str| {
            contained
                .iter()
                .filter(|p| p.purl_type() == Some(kind) && !p.has_fact("built-wheel"))
                .count()
        };
        Ok(Summary {
            name: document.name.clone(),
            created: document
                .creation_info
                .map(|c| c.created)
                .unwrap_or_default(),
            debs: count("deb"),
            wheels: count("pypi"),
            built_wheels: contained
                .iter()
                .filter(|p| p.has_fact("built-wheel"))
                .count(),
            cuda,
            facts,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_documents_are_errors() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        for (bytes, says) in [
            (b"".as_slice(), "not SPDX JSON"),
            (b"\xff\xfe{".as_slice(), "not SPDX JSON"),
            (deep.as_bytes(), "not SPDX JSON"),
            (
                br#"{"spdxVersion": "SPDX-2.2"}"#.as_slice(),
                "SPDX version `SPDX-2.2`",
            ),
            (br#"{"spdxVersion": 3}"#.as_slice(), "not SPDX JSON"),
            (
                br#"{"spdxVersion": "SPDX-2.3", "packages": []}"#.as_slice(),
                "describes no package",
            ),
            (
                br#"{"spdxVersion": "SPDX-2.3", "packages": [{"SPDXID": 1}]}"#.as_slice(),
                "not SPDX JSON",
            ),
        ] {
            let error = Summary::of_spdx(bytes).unwrap_err();
            assert!(error.to_string().contains(says), "{error}");
        }
        let big = vec![b' '; MAX_SBOM_BYTES + 1];
        assert!(matches!(
            Summary::of_spdx(&big),
            Err(SbomError::TooLarge { .. })
        ));
    }

    #[test]
    fn a_relationship_to_a_missing_package_is_ignored() {
        let document = br#"{"spdxVersion": "SPDX-2.3", "name": "x",
            "packages": [{"SPDXID": "SPDXRef-Image", "name": "x",
                "annotations": [{"comment": "cudastack:driver-floor=535.104.05"},
                                {"comment": "cudastack:device-code=/a: SASS sm_80; PTX -"}]}],
            "relationships": [
                {"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES", "relatedSpdxElement": "SPDXRef-Image"},
                {"spdxElementId": "SPDXRef-Image", "relationshipType": "CONTAINS", "relatedSpdxElement": "SPDXRef-gone"}]}"#;
        let summary = Summary::of_spdx(document).unwrap();
        assert_eq!(
            (summary.debs, summary.wheels, summary.cuda.len()),
            (0, 0, 0)
        );
        assert_eq!(
            summary.facts.into_iter().collect::<Vec<_>>(),
            [("driver-floor".to_string(), "535.104.05".to_string())]
        );
    }

    proptest::proptest! {
        /// Arbitrary bytes are an error or a summary, never a panic.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let _ = Summary::of_spdx(&bytes);
        }
    }
}
