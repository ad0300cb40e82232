//! How the audit and the layers above see a layer: through the facts recorded beside its
//! tree ([`LayerFacts`]) once they are, or the staged tree itself. A wheel layer's tree is
//! transient (staged, written into its layer, its facts recorded, then removed:
//! [`super::LayerStager::transient`]), so what reads it later reads its facts; the two
//! answer alike (every audit test reads both: tests/elf_support).

use std::path::{Path, PathBuf};

use super::LayerStager;
use crate::audit::{DirFs, FactsFs, ImageFs, LayerFacts};
use crate::cache::Staging;
use crate::stack::error::{io_error, BuildError};
use crate::stack::files::write_record;
use crate::stack::produce::AUDIT_READER;

/// The facts record beside the staged tree `tree`, named after the audit's reader (a
/// reader that reads otherwise does not trust another's facts).
pub(crate) fn facts_record(tree: &Path) -> PathBuf {
    tree.with_extension(format!("layer-facts.{AUDIT_READER}.json"))
}

/// The facts recorded beside `tree`, if any (a record that does not parse is none).
fn recorded_facts(tree: &Path) -> Option<LayerFacts> {
    fs_err::read(facts_record(tree))
        .ok()
        .and_then(|bytes| LayerFacts::from_json(&bytes))
}

/// The facts of the staged tree `tree`: recorded ones, or read from the tree and recorded.
pub(crate) fn record_facts(tree: &Path) -> Result<LayerFacts, BuildError> {
    if let Some(facts) = recorded_facts(tree) {
        return Ok(facts);
    }
    let facts = LayerFacts::read(&DirFs::new(tree)).map_err(io_error(tree))?;
    write_record(&facts_record(tree), &facts.to_json())?;
    Ok(facts)
}

/// A layer as one above it reads it: where its tree is staged, and whether that tree is
/// transient. A transient layer is read through its recorded facts (its tree is removed
/// once they are); any other through its tree, which has everything (the facts hold only
/// what the audit reads: not the base's `ldconfig`, say).
#[derive(Debug, Clone)]
pub(crate) struct LayerBelow {
    pub tree: PathBuf,
    pub transient: bool,
}

impl LayerBelow {
    pub fn of(stager: &dyn LayerStager, staging: &Staging) -> Self {
        Self {
            tree: staging.dir(stager.key()),
            transient: stager.transient(),
        }
    }

    /// A layer that is never transient (a test's tree).
    #[cfg(test)]
    pub fn tree(tree: &Path) -> Self {
        Self {
            tree: tree.to_path_buf(),
            transient: false,
        }
    }

    /// The layer as its facts or its tree answer. A transient tree is removed only after
    /// its facts are recorded, so where they are not yet, the tree is still there; a
    /// transient layer with neither (its record hand-edited or lost after the tree went) is
    /// an error, never an empty layer that would change what the layers above write.
    pub fn view(&self) -> Result<Box<dyn ImageFs>, BuildError> {
        if self.transient {
            if let Some(facts) = recorded_facts(&self.tree) {
                return Ok(Box::new(FactsFs::new(facts)));
            }
            if !self.tree.is_dir() {
                return Err(BuildError::Unsupported(format!(
                    "the layer staged at {} has neither its tree nor readable facts ({})\n  hint: build again: a layer without its facts is staged anew; or `cudastack cache prune --older-than 0`",
                    self.tree.display(),
                    facts_record(&self.tree).display()
                )));
            }
        }
        Ok(Box::new(DirFs::new(&self.tree)))
    }
}

/// Whether readable facts of the layer of `tree` are recorded (its tree may then be gone).
/// A record that does not parse counts as none, so the layer is staged and recorded again.
pub(crate) fn has_facts(tree: &Path) -> bool {
    recorded_facts(tree).is_some()
}
