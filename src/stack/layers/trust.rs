//! The recipe's certificate authorities (`ca_certificates:`, checked by `recipe::ca`) in the
//! image's trust store, written by the config layer as Debian's `update-ca-certificates`
//! would leave it:
//!
//! - each file's certificates in `/usr/local/share/ca-certificates/cudastack/NAME.crt`, the
//!   directory update-ca-certificates adds, so an image built `FROM` this one that runs it
//!   (installing another package, say) keeps them;
//! - the bundle `/etc/ssl/certs/ca-certificates.crt`, which OpenSSL (and so Python's `ssl`,
//!   curl, git) reads: the layers' own bundle with these appended.
//!
//! pip and requests carry their own copy of Mozilla's roots (certifi); the image's
//! environment names the bundle to them (`stack::image_config`). The hashed links of
//! `/etc/ssl/certs` (`c_rehash`) are not written: every client above reads the bundle.

use std::path::{Path, PathBuf};

use crate::audit::ImageFs;
use crate::recipe::ca::CaFile;
use crate::rootfs::{Node, Resolution};
use crate::stack::error::BuildError;
use crate::stack::files::write_file;

/// The system bundle: what OpenSSL's default CA file on Debian and Ubuntu points at.
pub(crate) const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Where update-ca-certificates finds a site's own certificates (`.crt` only).
const LOCAL_CA_DIR: &str = "usr/local/share/ca-certificates/cudastack";

/// Write `files` into the layer staged at `dir`, over the layers `below` (whose bundle
/// they extend). Nothing without files.
pub(crate) fn write_trust_store(
    below: &dyn ImageFs,
    files: &[CaFile],
    dir: &Path,
) -> Result<(), BuildError> {
    if files.is_empty() {
        return Ok(());
    }
    let (bundle_path, mut bundle) = system_bundle(below)?;
    for file in files {
        write_file(
            &dir.join(LOCAL_CA_DIR).join(file.path.image_name()),
            file.pem.as_bytes(),
        )?;
        if !bundle.is_empty() && !bundle.ends_with(b"\n") {
            bundle.push(b'\n');
        }
        bundle.extend_from_slice(file.pem.as_bytes());
    }
    // Where the bundle is, through any link of the layers below: a real directory here
    // would hide a linked /etc/ssl/certs.
    let relative = bundle_path.strip_prefix("/").unwrap_or(&bundle_path);
    write_file(&dir.join(relative), &bundle)
}

/// The bundle of the layers below: ca-certificates is one of the base's own packages, so
/// an image without it was built from a base cudastack did not make.
fn system_bundle(below: &dyn ImageFs) -> Result<(PathBuf, Vec<u8>), BuildError> {
    let found = match below.resolve(Path::new(SYSTEM_BUNDLE)) {
        Ok(Resolution::Found(path)) => Some(path),
        _ => None,
    };
    let file = found.filter(|path| matches!(below.node(path), Ok(Some(Node::File { .. }))));
    let Some(file) = file else {
        return Err(BuildError::Unsupported(format!(
            "`ca_certificates` adds to the image's trust store, but the layers below have no {SYSTEM_BUNDLE}\n  hint: add `ca-certificates` to `apt:`"
        )));
    };
    let bytes = below.read(&file).map_err(|e| {
        BuildError::Unsupported(format!("cannot read the image's {SYSTEM_BUNDLE}: {e}"))
    })?;
    Ok((file, bytes))
}
