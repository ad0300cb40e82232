//! How the audit and the layers above see a layer: through the facts recorded beside its
//! tree ([`LayerFacts`]) once they are, or the staged tree itself. A wheel layer's tree is
//! transient (staged, written into its layer, its facts recorded, then removed:
//! [`super::LayerStager::transient`]), so what reads it later reads its facts; the two
//! answer alike (every audit test reads both: tests/elf_support).

use std::path::{Path, PathBuf};

use crate::audit::{DirFs, FactsFs, ImageFs, LayerFacts};
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

/// The layer whose tree is (or was) `tree`: its recorded facts, else the tree.
pub(crate) fn open_view(tree: &Path) -> Box<dyn ImageFs> {
    match recorded_facts(tree) {
        Some(facts) => Box::new(FactsFs::new(facts)),
        None => Box::new(DirFs::new(tree)),
    }
}

/// Whether the layers above can see the layer of `tree` without its staged tree.
pub(crate) fn has_facts(tree: &Path) -> bool {
    facts_record(tree).is_file()
}
