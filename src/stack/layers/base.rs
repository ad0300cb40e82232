//! The `base` layer: a Debian or Ubuntu root built by mmdebstrap ([`crate::base_root`]),
//! with the packages the rest of the stack needs, checked against the Python and glibc the
//! locked wheels were chosen for.

use std::path::{Path, PathBuf};

use super::{LayerStager, Part, ASSEMBLER};
use crate::base_root::rootless::{BuildHost, BuildMode};
use crate::base_root::{debootstrap, inspect_rootfs, BaseError, DebootstrapSpec, RootfsFacts};
use crate::cache::Staging;
use crate::layer::{CacheKey, DirOptions, ModePolicy};
use crate::lock::lockfile::Lockfile;
use crate::recipe::{Base, Recipe};
use crate::stack::error::{io_error, BuildError};
use crate::stack::files::write_record;
use crate::stack::prepare::PlatformInputs;

/// The base layer of one platform: the mmdebstrap spec is its whole cache key.
pub(crate) struct BaseLayer<'a> {
    spec: DebootstrapSpec,
    key: CacheKey,
    /// The base's facts, recorded beside its staged tree ([`Self::facts`]).
    facts_record: PathBuf,
    /// The owners and modes of a tree staged without root, recorded beside it
    /// (docs/rootless.md); absent for a tree mmdebstrap wrote as root.
    owners_record: PathBuf,
    /// `--build-mode`; None chooses by what this host allows.
    mode: Option<BuildMode>,
    recipe: &'a Recipe,
    lock: &'a Lockfile,
}

impl<'a> BaseLayer<'a> {
    pub fn plan(
        inputs: &'a PlatformInputs,
        mtime: u64,
        staging: &Staging,
        mode: Option<BuildMode>,
    ) -> Result<Self, BuildError> {
        let (distro, release) = match &inputs.recipe.base {
            Base::Debian(release) => ("debian", release.as_str()),
            Base::Ubuntu(release) => ("ubuntu", release.as_str()),
            other => return Err(BuildError::Unsupported(format!("base {other} is not supported by `cudastack build` yet; build from `debian:` or `ubuntu:` releases"))),
        };
        if inputs.base_debs.is_empty() {
            return Err(BuildError::Unsupported(format!(
                "the lock of `{}` has no Debian or Ubuntu packages for its base {}; run `cudastack lock` again (locks made before cudastack locked the base cannot build it)",
                inputs.recipe.name, inputs.recipe.base
            )));
        }
        let spec = DebootstrapSpec::from_debs(
            distro,
            release,
            inputs.platform.to_debian(),
            mtime,
            inputs.base_debs.clone(),
        );
        // `+locked2`: the bases made from locked .debs, apt as root; `+etc2`: /etc/resolv.conf
        // and /etc/hostname emptied.
        let assembler = match spec.foreign_architecture {
            None => format!("{ASSEMBLER}/base-mmdebstrap+etc2+locked2"),
            Some(_) => format!(
                "{ASSEMBLER}/base-mmdebstrap-{}+etc2+locked2",
                crate::base_root::foreign::ASSEMBLER
            ),
        };
        let key = CacheKey::new(&assembler, &spec.deb_digests(), &spec);
        let facts_record = staging.dir(&key).with_extension("facts.json");
        let owners_record = staging.dir(&key).with_extension("owners.json");
        Ok(Self {
            spec,
            key,
            facts_record,
            owners_record,
            mode,
            recipe: inputs.recipe,
            lock: &inputs.lock,
        })
    }

    /// The base's spec (its distribution, release and architecture, its locked .debs).
    pub fn spec(&self) -> &DebootstrapSpec {
        &self.spec
    }

    /// `--build-mode` as given.
    pub fn mode(&self) -> Option<BuildMode> {
        self.mode
    }

    /// Where the base's [`RootfsFacts`] are recorded once its tree has been opened.
    pub fn facts_record(&self) -> &Path {
        &self.facts_record
    }

    /// The recorded facts of the base; none known when the record is missing or unreadable.
    pub fn facts(&self) -> RootfsFacts {
        fs_err::read(&self.facts_record)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(RootfsFacts {
                python: None,
                glibc: None,
                os: None,
            })
    }
}

impl LayerStager for BaseLayer<'_> {
    fn name(&self) -> &str {
        "base"
    }
    fn part(&self) -> Part {
        Part::Stack
    }
    fn key(&self) -> &CacheKey {
        &self.key
    }
    /// mmdebstrap in the mode this host allows; a rootless tree's owners are recorded
    /// (a record left by an earlier rootless staging of this key goes first).
    fn stage(&self, dir: &Path) -> Result<(), BuildError> {
        let mode = staging_mode(self.mode, &self.owners_record)?;
        match debootstrap(&self.spec, dir, mode)? {
            Some(owners) => write_record(&self.owners_record, &owners.to_json()),
            None => Ok(()),
        }
    }
    /// The bottom layer: mmdebstrap reads only the locked .debs.
    fn reads_trees_below(&self) -> bool {
        false
    }
    /// The base is a root filesystem: modes and owners as the packages set them, from
    /// the record when the tree was staged without root.
    fn walk(&self) -> DirOptions {
        package_tree_walk(&self.owners_record)
    }
    fn staged(&self, dir: &Path) -> Result<(), BuildError> {
        let facts = inspect_rootfs(dir)?;
        check_base(self.recipe, &facts, self.lock)?;
        write_record(
            &self.facts_record,
            &serde_json::to_vec(&facts).expect("facts serialise"),
        )
    }
}

/// The mode mmdebstrap runs in (`--build-mode`, else what this host allows), with the
/// owners record an earlier rootless staging of this key left removed first.
pub(crate) fn staging_mode(
    asked: Option<BuildMode>,
    owners_record: &Path,
) -> Result<BuildMode, BuildError> {
    let mode = BuildHost::detect().choose(asked).map_err(BaseError::from)?;
    if owners_record.exists() {
        fs_err::remove_file(owners_record).map_err(io_error(owners_record))?;
    }
    Ok(mode)
}

/// How a tree dpkg installed becomes a layer: modes and owners as the packages set them,
/// from `owners_record` when the tree was staged without root (docs/rootless.md).
pub(crate) fn package_tree_walk(owners_record: &Path) -> DirOptions {
    DirOptions {
        modes: ModePolicy::Exact,
        keep_owners: true,
        recorded: owners_record.exists().then(|| owners_record.to_path_buf()),
        ..DirOptions::default()
    }
}

/// The base must provide the Python and glibc the locked wheels were chosen for.
fn check_base(recipe: &Recipe, facts: &RootfsFacts, lock: &Lockfile) -> Result<(), BuildError> {
    match facts.python {
        Some(python) if python == recipe.python => {}
        found => {
            return Err(BuildError::BaseMismatch {
                base: recipe.base.to_string(),
                what: "Python",
                found: found
                    .map(|p| p.to_string())
                    .unwrap_or_else(|| "no python3".into()),
                expected: recipe.python.to_string(),
                hint: "set `python:` to the base's version, or pick a base release that ships it"
                    .into(),
            })
        }
    }
    let target = (lock.target.glibc.major, lock.target.glibc.minor);
    if let Some(glibc) = facts.glibc {
        if glibc < target {
            return Err(BuildError::BaseMismatch {
                base: recipe.base.to_string(),
                what: "glibc",
                found: format!("{}.{}", glibc.0, glibc.1),
                expected: format!(">= {}.{} (the lock's manylinux level)", target.0, target.1),
                hint: "lock again for this base, or use a newer base release".into(),
            });
        }
    }
    Ok(())
}
