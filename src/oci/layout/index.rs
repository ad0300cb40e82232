//! A layout's `index.json`: the one place it is parsed and serialised.
//!
//! Readers get it through [`super::Layout`], writers through [`super::LayoutWriter::name`];
//! no other code of cudastack reads or writes the file. An entry is named by its
//! `org.opencontainers.image.ref.name` annotation; a name is on one entry at most.

use std::collections::HashMap;
use std::io;
use std::path::Path;

use oci_spec::image::{Descriptor, ImageIndex, ANNOTATION_REF_NAME};

use crate::oci::{annotated, image_index, OciError};

pub(super) const INDEX_FILE: &str = "index.json";

/// The entries of a layout's `index.json`.
#[derive(Debug, Clone, Default)]
pub struct LayoutIndex {
    manifests: Vec<Descriptor>,
}

impl LayoutIndex {
    /// Read `dir/index.json` (a missing file is an error naming it).
    pub fn read(dir: &Path) -> Result<Self, OciError> {
        let path = dir.join(INDEX_FILE);
        let bytes = super::read_document_file(&path)?;
        let index: ImageIndex =
            serde_json::from_slice(&bytes).map_err(|source| OciError::Json {
                path,
                what: "an OCI image index",
                source,
            })?;
        Ok(Self {
            manifests: index.manifests().clone(),
        })
    }

    /// [`Self::read`], with a layout that has no `index.json` yet read as empty.
    pub(super) fn read_or_empty(dir: &Path) -> Result<Self, OciError> {
        match Self::read(dir) {
            Err(OciError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                Ok(Self::default())
            }
            other => other,
        }
    }

    /// Every entry, in the file's order.
    pub fn entries(&self) -> &[Descriptor] {
        &self.manifests
    }

    /// The entry named `ref_name`.
    pub fn named(&self, ref_name: &str) -> Option<&Descriptor> {
        self.manifests
            .iter()
            .find(|m| ref_name_of(m) == Some(ref_name))
    }

    /// Every ref name, sorted.
    pub fn ref_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .manifests
            .iter()
            .filter_map(ref_name_of)
            .map(str::to_string)
            .collect();
        names.sort();
        names
    }

    /// The ref names of the entries that point at the same manifest as `entry`.
    pub fn names_of_same_manifest(&self, entry: &Descriptor) -> Vec<&str> {
        self.manifests
            .iter()
            .filter(|m| m.digest() == entry.digest())
            .filter_map(ref_name_of)
            .collect()
    }

    /// The index with `ref_name` moved to `descriptor` (its old entry, if any, dropped),
    /// in a fixed order, so the same set of images gives the same `index.json`.
    pub(super) fn with_name(mut self, descriptor: Descriptor, ref_name: &str) -> Self {
        self.manifests
            .retain(|existing| ref_name_of(existing) != Some(ref_name));
        let annotations = HashMap::from([(ANNOTATION_REF_NAME.to_string(), ref_name.to_string())]);
        self.manifests.push(annotated(descriptor, annotations));
        self.manifests.sort_by(|a, b| {
            (ref_name_of(a), a.digest().to_string()).cmp(&(ref_name_of(b), b.digest().to_string()))
        });
        self
    }

    /// The index without the entries named in `names`.
    pub(super) fn without_names(mut self, names: &[String]) -> Self {
        self.manifests
            .retain(|entry| !ref_name_of(entry).is_some_and(|n| names.iter().any(|x| x == n)));
        self
    }

    /// The canonical bytes of `index.json`.
    pub(super) fn to_bytes(&self) -> Result<Vec<u8>, OciError> {
        Ok(image_index(self.manifests.clone())?.1)
    }
}

/// The ref name annotation of an index entry.
pub fn ref_name_of(descriptor: &Descriptor) -> Option<&str> {
    descriptor
        .annotations()
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_REF_NAME))
        .map(String::as_str)
}

/// The ref names for a not-found message (`a, b`), or "no named images".
pub(super) fn available(index: &LayoutIndex) -> String {
    let names = index.ref_names();
    if names.is_empty() {
        "no named images".to_string()
    } else {
        names.join(", ")
    }
}
