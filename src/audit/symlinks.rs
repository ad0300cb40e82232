//! Symlinks: every link resolves inside the root (absolute targets mean the image's `/`),
//! without a loop.

use std::path::PathBuf;

use super::image::ImageFs;
use super::{io_error, AuditError, Finding, FindingKind};
use crate::rootfs::{Node, Resolution};

/// Documentation and translations: no program loads code from them, and Ubuntu's packages
/// ship links there whose targets live in packages an image does not have (its build
/// moves translations into language packs: `/usr/share/locale/af/LC_TIME/coreutils.mo ->
/// ../LC_MESSAGES/coreutils.mo`), so a dangling link there is the distribution's, not a
/// broken chain of the stack. Loops are still findings everywhere.
const NOT_RUNTIME: [&str; 2] = ["/usr/share/doc/", "/usr/share/locale/"];

/// A finding for each dangling or looping link among `links` (image paths).
pub(super) fn check(fs: &dyn ImageFs, links: &[PathBuf]) -> Result<Vec<Finding>, AuditError> {
    let mut findings = Vec::new();
    for link in links {
        match fs.resolve(link).map_err(io_error(link))? {
            Resolution::Found(_) => {}
            Resolution::Missing { .. }
                if NOT_RUNTIME
                    .iter()
                    .any(|dir| link.to_string_lossy().starts_with(dir)) => {}
            Resolution::Missing { at } => {
                let target = match fs.node(link).map_err(io_error(link))? {
                    Some(Node::Symlink(target)) => target,
                    _ => link.clone(),
                };
                findings.push(Finding {
                    kind: FindingKind::DanglingSymlink,
                    paths: vec![link.clone()],
                    evidence: format!(
                        "points to `{}`; `{}` does not exist in the image",
                        target.display(),
                        at.display()
                    ),
                    hint: "copy the target with the link (`cp -P` / keep the whole symlink chain), or remove the link".into(),
                });
            }
            Resolution::Loop => findings.push(Finding {
                kind: FindingKind::SymlinkLoop,
                paths: vec![link.clone()],
                evidence: "more than 40 symlinks followed".into(),
                hint: "break the cycle of links".into(),
            }),
        }
    }
    Ok(findings)
}
