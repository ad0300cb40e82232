//! What stops the `copy` layer: a source that is missing, outside the recipe's directory,
//! excluded, special or changed; destinations that overlap or go through a link. A leaf:
//! the stack's error wraps it.

use std::path::PathBuf;

use crate::contained_file::ContainedError;
use crate::digest::Digest;
use crate::printable::{path as printable_path, short};

#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("copy `{}`: the source `{}` does not exist\n  hint: `src` is relative to the recipe's directory `{}`", short(.entry), printable_path(.path), printable_path(.context))]
    Missing {
        entry: String,
        path: PathBuf,
        context: PathBuf,
    },
    #[error("copy `{}`: `{}` leads outside the recipe's directory `{}` through a symbolic link\n  hint: a recipe copies only from its own directory; copy the files next to it", short(.entry), printable_path(.path), printable_path(.context))]
    Escapes {
        entry: String,
        path: PathBuf,
        context: PathBuf,
    },
    #[error("copy `{}`: `{}` is excluded by {why}, so there is nothing to copy\n  hint: remove the pattern or the entry", short(.entry), printable_path(.path))]
    Excluded {
        entry: String,
        path: PathBuf,
        why: String,
    },
    #[error("copy `{}`: `{}` is a {kind}; an image layer holds files, directories and symbolic links only", short(.entry), printable_path(.path))]
    SpecialFile {
        entry: String,
        path: PathBuf,
        kind: &'static str,
    },
    #[error("copy `{}`: the file name `{}` is not UTF-8; image layers name files in UTF-8", short(.entry), printable_path(.path))]
    NotUtf8 { entry: String, path: PathBuf },
    #[error("copy: `{first}` and `{second}` both write `/{path}`; give each its own destination")]
    Overlap {
        first: String,
        second: String,
        path: String,
    },
    #[error("copy: `{}` changed while the image was being built (sha256 {planned} when planned, {staged} when copied); build again when the files are settled", printable_path(.path))]
    Changed {
        path: PathBuf,
        planned: Digest,
        staged: Digest,
    },
    #[error("copy: {0}")]
    Patterns(String),
    #[error("copy `{}`: {error}", short(.entry))]
    Source {
        entry: String,
        error: ContainedError,
    },
    #[error("copy: `{path}` goes through `{link}`, a symbolic link in the image (-> {target}); a layer cannot write through a link, it would replace it\n  hint: copy to the path the link points at")]
    ThroughLink {
        path: String,
        link: String,
        target: String,
    },
    #[error("copy: `{path}` would put {what} the layers below have; the image would lose what is there\n  hint: choose another destination")]
    Replaces { path: String, what: &'static str },
    #[error("copy `{entry}`: `{path}` goes through `{link}`, a symbolic link (-> {target}) that `{link_entry}` copies; staging would follow it on the build host\n  hint: give the entries destinations that do not go through a copied link")]
    ThroughCopiedLink {
        path: String,
        entry: String,
        link: String,
        target: String,
        link_entry: String,
    },
}
