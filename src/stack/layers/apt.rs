//! The `apt` layer: the recipe's own Debian or Ubuntu packages (`apt:`), on top of the
//! shared base.
//!
//! A layer of their own, not part of the base, so every recipe on the same base and stack
//! shares the base layer (one download, one copy on disk, whatever each recipe adds). It
//! is made as mmdebstrap would make it: the base and the `apt:` packages installed
//! together from locked .debs into a scratch root, and the layer is what that root has on
//! top of the base's tree ([`crate::stack::tree_diff`]): the packages' files and what
//! their installation changed (the dpkg database, /etc/passwd for a new system user).

use std::path::{Path, PathBuf};

use super::base::BaseLayer;
use super::{BuildEnv, LayerStager, ASSEMBLER};
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

impl LayerStager for AptLayer {
    fn name(&self) -> &str {
        "apt"
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
