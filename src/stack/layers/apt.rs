//! The `apt` layer: the recipe's own Debian or Ubuntu packages (`apt:`), on top of the
//! shared base.
//!
//! A layer of their own, not part of the base, so every recipe on the same base and stack
//! shares the base layer (one download, one copy on disk, whatever each recipe adds). It
//! is made as mmdebstrap would make it: the base and the `apt:` packages installed
//! together from locked .debs into a scratch root, and the layer is what that root has on
//! top of the base's tree ([`crate::stack::tree_diff`]): the packages' files and what
//! their installation changed (the dpkg database, /etc/passwd for a new system user).
//!
//! The layer sits above the stack's layers (they are shared by every recipe on
//! the stack), so a package could replace one of their files; [`refuse_replacing`]
//! refuses that, naming the package.

use std::path::{Path, PathBuf};

use super::base::BaseLayer;
use super::{BuildEnv, LayerStager, Part, ASSEMBLER};
use crate::audit::ImageFs;
use crate::base_root::rootless::BuildMode;
use crate::base_root::{debootstrap, DebootstrapSpec};
use crate::layer::{CacheKey, DirOptions, RecordedOwners};
use crate::stack::error::{io_error, BuildError};
use crate::stack::files::write_record;
use crate::stack::prepare::PlatformInputs;
use crate::stack::tree_diff::{diff_trees, Tree};

pub(crate) struct AptLayer {
    /// The whole root: the base's debs and the `apt:` layer's.
    spec: DebootstrapSpec,
    key: CacheKey,
    base_dir: PathBuf,
    base_owners: PathBuf,
    /// Where the scratch root is made (the staging area: same filesystem, removed after).
    scratch_parent: PathBuf,
    owners_record: PathBuf,
    mode: Option<BuildMode>,
}

impl AptLayer {
    /// None when the recipe has no `apt:` packages.
    pub fn plan(
        inputs: &PlatformInputs,
        base: &BaseLayer,
        env: &BuildEnv,
    ) -> Result<Option<Self>, BuildError> {
        if inputs.apt_debs.is_empty() {
            return Ok(None);
        }
        let base_spec = base.spec();
        let mut debs = base_spec.debs.clone();
        debs.extend(inputs.apt_debs.iter().cloned());
        let spec = DebootstrapSpec::from_debs(
            &base_spec.distro,
            &base_spec.release,
            inputs.platform.to_debian(),
            base_spec.source_date_epoch,
            debs,
        );
        let inputs_digests: Vec<_> = [base.key().digest()]
            .into_iter()
            .chain(spec.deb_digests())
            .collect();
        let key = CacheKey::new(&format!("{ASSEMBLER}/apt"), &inputs_digests, &spec);
        let base_dir = env.staging.dir(base.key());
        Ok(Some(Self {
            base_owners: base_dir.with_extension("owners.json"),
            base_dir,
            scratch_parent: env.staging.dir(&key).with_extension("scratch"),
            owners_record: env.staging.dir(&key).with_extension("owners.json"),
            spec,
            key,
            mode: base.mode(),
        }))
    }
}

/// Refuse an apt `tree` that replaces a file of the `stack` trees (name, tree) above the
/// base (a directory in both is shared, not replaced): the image would silently hold the
/// package's file where the stack was verified with its own.
pub(crate) fn refuse_replacing(
    tree: &Path,
    stack: &[(&str, &dyn ImageFs)],
) -> Result<(), BuildError> {
    let mut replaced = Vec::new();
    find_replaced(tree, Path::new("/"), stack, &mut replaced)?;
    if replaced.is_empty() {
        return Ok(());
    }
    let owners = package_lists(tree);
    let shown: Vec<String> = replaced
        .iter()
        .take(5)
        .map(|(path, layer)| {
            let package = owners
                .iter()
                .find(|(_, files)| files.contains(path))
                .map_or("an `apt:` package", |(package, _)| package.as_str());
            format!("{path} (from {package}, over the `{layer}` layer)")
        })
        .collect();
    Err(BuildError::Unsupported(format!(
        "the recipe's `apt:` packages replace {} of the stack's files: {}\n  why: the stack's layers come first and are shared by every image on the stack; an `apt:` package may add files above them, not replace theirs\n  hint: leave the package out of `apt:` (a Python package belongs in the requirements)",
        replaced.len(),
        shown.join(", ")
    )))
}

/// Walk `dir` (the apt tree at the image path `image_dir`) beside the same directory of
/// each lower layer (a directory there, never a link: the walk never follows one of the
/// image's links), collecting what the apt tree has where a lower layer has something that
/// is not a directory in both.
fn find_replaced(
    dir: &Path,
    image_dir: &Path,
    lowers: &[(&str, &dyn ImageFs)],
    replaced: &mut Vec<(String, String)>,
) -> Result<(), BuildError> {
    for entry in fs_err::read_dir(dir).map_err(io_error(dir))? {
        let entry = entry.map_err(io_error(dir))?;
        let path = image_dir.join(entry.file_name());
        let is_dir = entry.file_type().map_err(io_error(&entry.path()))?.is_dir();
        let mut below: Vec<(&str, &dyn ImageFs)> = Vec::new();
        for (layer, lower) in lowers {
            let Some(node) = lower.node(&path).map_err(io_error(&path))? else {
                continue;
            };
            if is_dir && node.is_dir() {
                below.push((layer, *lower));
            } else {
                replaced.push((path.to_string_lossy().into_owned(), layer.to_string()));
            }
        }
        if is_dir && !below.is_empty() {
            find_replaced(&entry.path(), &path, &below, replaced)?;
        }
    }
    Ok(())
}

/// Each installed package's file list (dpkg's `info/<package>.list`) in the apt tree.
fn package_lists(tree: &Path) -> Vec<(String, Vec<String>)> {
    let info = tree.join("var/lib/dpkg/info");
    let Ok(entries) = fs_err::read_dir(&info) else {
        return Vec::new();
    };
    let mut lists: Vec<(String, Vec<String>)> = entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            // `libfoo:amd64.list` for a package of one architecture.
            let package = name.strip_suffix(".list")?;
            let package = package.split(':').next().unwrap_or(package).to_string();
            let text = fs_err::read_to_string(entry.path()).ok()?;
            Some((package, text.lines().map(str::to_string).collect()))
        })
        .collect();
    lists.sort();
    lists
}

impl LayerStager for AptLayer {
    fn name(&self) -> &str {
        "apt"
    }
    fn part(&self) -> Part {
        Part::Team
    }
    fn key(&self) -> &CacheKey {
        &self.key
    }
    /// The whole root in a scratch directory, then what it has on top of the base.
    fn stage(&self, dir: &Path) -> Result<(), BuildError> {
        let mode = super::base::staging_mode(self.mode, &self.owners_record)?;
        fs_err::create_dir_all(&self.scratch_parent).map_err(io_error(&self.scratch_parent))?;
        let scratch = tempfile::Builder::new()
            .prefix("root-")
            .tempdir_in(&self.scratch_parent)
            .map_err(io_error(&self.scratch_parent))?;
        let root = scratch.path().join("root");
        fs_err::create_dir(&root).map_err(io_error(&root))?;
        let owners = match debootstrap(&self.spec, &root, mode) {
            Ok(owners) => owners,
            Err(error) => {
                drop(scratch);
                let _ = fs_err::remove_dir(&self.scratch_parent);
                return Err(error.into());
            }
        };
        let base_owners = self
            .base_owners
            .exists()
            .then(|| RecordedOwners::read(&self.base_owners))
            .transpose()?;
        let diff = diff_trees(
            &Tree {
                root: &root,
                owners: owners.as_ref(),
            },
            &Tree {
                root: &self.base_dir,
                owners: base_owners.as_ref(),
            },
            dir,
        )?;
        drop(scratch);
        let _ = fs_err::remove_dir(&self.scratch_parent);
        if !diff.removed.is_empty() {
            return Err(BuildError::Unsupported(format!(
                "installing the recipe's `apt:` packages removed {} files of the base (e.g. {}); a layer on top of the base cannot remove them\n  hint: leave out the package that replaces base files, and report it to cudastack",
                diff.removed.len(),
                diff.removed.iter().take(5).cloned().collect::<Vec<_>>().join(", ")
            )));
        }
        match diff.owners {
            Some(owners) => write_record(&self.owners_record, &owners.to_json()),
            None => Ok(()),
        }
    }
    /// Like the base: modes and owners as the packages set them.
    fn walk(&self) -> DirOptions {
        super::base::package_tree_walk(&self.owners_record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::DirFs;

    fn write(path: &Path, text: &str) {
        fs_err::create_dir_all(path.parent().unwrap()).unwrap();
        fs_err::write(path, text).unwrap();
    }

    #[test]
    fn apt_may_add_to_the_stack_but_not_replace_its_files() {
        let dir = tempfile::tempdir().unwrap();
        let (apt, python, cuda) = (
            dir.path().join("apt"),
            dir.path().join("python"),
            dir.path().join("cuda"),
        );
        let site = "usr/local/lib/python3.11/dist-packages";
        write(&python.join(site).join("six.py"), "stack");
        write(&apt.join(site).join("extra.py"), "added beside the stack's");
        write(&apt.join("usr/bin/git"), "added");
        assert!(refuse_replacing(&apt, &[("python", &DirFs::new(&python))]).is_ok());

        write(&apt.join(site).join("six.py"), "replaced");
        write(
            &apt.join("var/lib/dpkg/info/python3-six:amd64.list"),
            &format!("/{site}\n/{site}/six.py\n"),
        );
        let error = refuse_replacing(&apt, &[("python", &DirFs::new(&python))])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains(&format!("replace 1 of the stack's files: /{site}/six.py (from python3-six, over the `python` layer)")),
            "{error}"
        );

        // A link of the stack's tree is never followed on the host: a directory of the apt
        // tree where the stack has a link replaces the link.
        fs_err::create_dir_all(cuda.join("usr/local")).unwrap();
        std::os::unix::fs::symlink("/etc", cuda.join("usr/local/cuda")).unwrap();
        write(&apt.join("usr/local/cuda/passwd"), "x");
        let error = refuse_replacing(&apt, &[("cuda", &DirFs::new(&cuda))])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("/usr/local/cuda (from an `apt:` package, over the `cuda` layer)"),
            "{error}"
        );
    }
}
