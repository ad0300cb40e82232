//! The filesystem helpers the stagers share: writing a file or a record of the staging
//! area. How trees are kept (keys, locks, markers) is the cache's
//! [`crate::cache::Staging`]; this is what goes in them.

use std::path::Path;

use crate::stack::error::{io_error, BuildError};

/// Write a small record of the cache (a marker, a scan result, audit facts) whole or not
/// at all, so a concurrent build never reads half of one.
pub(crate) fn write_record(path: &Path, bytes: &[u8]) -> Result<(), BuildError> {
    crate::atomic_file::write(path, bytes).map_err(io_error(path))
}

pub(crate) fn write_file(path: &Path, bytes: &[u8]) -> Result<(), BuildError> {
    if let Some(parent) = path.parent() {
        fs_err::create_dir_all(parent).map_err(io_error(parent))?;
    }
    fs_err::write(path, bytes).map_err(io_error(path))
}
