//! The layers of a CUDA stack, one file per kind, in image order. The stack's layers come
//! first, the team's after them:
//!
//! - the stack: [`base`] (a Debian or Ubuntu root) -> [`toolkit`] (the `cuda`, `cuda-math`
//!   and `cudnn` layers, from the nvidia-* wheels) -> one layer per very large distribution
//!   (`torch`, `triton`: [`python::LARGE_DISTRIBUTION`]) -> [`python`] (the rest of the
//!   stack's wheels, nvidia libraries linked to the toolkit's copies);
//! - the team's: [`apt`] (the recipe's `apt:` packages, when it has any) -> [`user`] (the
//!   recipe's `user:`, when it has one) -> one layer per very large distribution of the
//!   recipe's own requirements -> `packages` (the recipe's other wheels, a [`python`] layer
//!   too, when it has any) -> [`config`] (loader configuration and cache, provenance, pip's
//!   constraints, the probe) -> [`copy`] (the recipe's `copy:` entries, the team's code, when
//!   it has any: last, so a code change rebuilds it alone).
//!
//! The stack's layers are the same bytes for every recipe on the same stack: they read only
//! the stack's locked artifacts, and their entries carry [`STACK_MTIME`], never the recipe's
//! SOURCE_DATE_EPOCH. So the stack is a common prefix of every team image's layer chain,
//! which registries store once and a node's runtime unpacks once (its snapshots are keyed
//! by the chain of parents, not by the blob alone).
//!
//! `apt:` packages above the stack still leave a consistent system: their layer is the
//! difference between the base and the base with them installed, so its dpkg status is the
//! base's plus theirs (no stack layer writes dpkg's files), and the loader cache is written
//! again by the config layer above every library. An `apt:` package may add files but not
//! replace one of the stack's (the audit refuses it, naming the package).
//!
//! Each kind is a type that is planned from the platform's inputs (which gives its cache
//! key) and implements [`LayerStager`] (which fills a staging directory). Planning stages
//! nothing (it reads only wheel metadata and the files `copy:` names, whose bytes are that
//! layer's key), so a fully cached build stages nothing; [`super::produce`] decides what
//! to stage. A layer's key names exactly the inputs its tree depends on, including the keys
//! of the layers below it when it reads their trees.

pub mod apt;
pub mod base;
mod below;
pub mod config;
pub mod copy;
pub mod python;
pub mod toolkit;
mod trust;
pub(crate) use trust::SYSTEM_BUNDLE;
pub mod user;
pub(crate) mod view;
pub mod wheel_members;

use std::path::{Path, PathBuf};

use crate::cache::Staging;
use crate::layer::{BuildOptions, CacheKey, DirOptions, LayerCache};
use crate::stack::error::BuildError;
use crate::stack::prepare::{FetchedWheel, PlatformInputs};
use crate::stack::settings::BuildProgress;
use python::PythonPart;
pub use wheel_members::WheelMembers;

/// Bump when what an assembler writes, or what it refuses to write, changes: it is part of
/// every cache key, so a tree staged under older rules is never reused (stack-2: toolkit
/// wheels may not put libraries in subdirectories of the CUDA lib dir, wheel `.data/data/`
/// members may not land where the loader searches, no `.wh.*` names; stack-3: the wheel
/// stagers record their trees' wheel members, [`WheelMembers`]).
pub(crate) const ASSEMBLER: &str = concat!("cudastack-", env!("CARGO_PKG_VERSION"), "-stack-3");

/// The mtime of every entry of the stack's layers (and the base's SOURCE_DATE_EPOCH):
/// 2024-01-01T00:00:00Z, whatever the recipe's `source_date_epoch`, so that recipes on one
/// stack share its layers. The team's layers and the image's `created` keep the recipe's.
pub(crate) const STACK_MTIME: u64 = crate::stack::DEFAULT_SOURCE_DATE_EPOCH;

/// Which part of the image a layer belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    /// The same bytes for every recipe on the stack: written with [`STACK_MTIME`].
    Stack,
    /// The recipe's own: written with its SOURCE_DATE_EPOCH.
    Team,
}

/// What every step of the assembly shares: the caches, the layer options, the progress.
pub(crate) struct BuildEnv<'a> {
    pub cache: &'a LayerCache,
    pub staging: &'a Staging,
    /// The team's layer options: the recipe's SOURCE_DATE_EPOCH and the compression.
    pub options: &'a BuildOptions,
    pub progress: &'a dyn BuildProgress,
    /// How mmdebstrap builds the base (`--build-mode`); None: what this host allows.
    pub build_mode: Option<crate::base_root::rootless::BuildMode>,
}

impl BuildEnv<'_> {
    /// How a layer of `part` is written: the stack's with [`STACK_MTIME`], the team's with
    /// the recipe's SOURCE_DATE_EPOCH; the same compression for both.
    pub fn options_for(&self, part: Part) -> BuildOptions {
        match part {
            Part::Stack => BuildOptions {
                mtime: STACK_MTIME,
                ..*self.options
            },
            Part::Team => *self.options,
        }
    }
}

/// One layer kind: its name in the image, its cache key, how to fill its staging directory
/// and how to walk that directory into a layer.
pub(crate) trait LayerStager: Sync {
    /// The layer's name in reports and history (`base`, `cuda`, ...).
    fn name(&self) -> &str;
    /// Whether it is one of the stack's layers or one of the team's.
    fn part(&self) -> Part;
    fn key(&self) -> &CacheKey;
    /// Stage the layer's tree into `dir`, a fresh empty directory.
    fn stage(&self, dir: &Path) -> Result<(), BuildError>;
    /// How the tree becomes a layer (modes, owners).
    fn walk(&self) -> DirOptions {
        DirOptions::default()
    }
    /// Whether staging reads the trees (or records) of the layers below: such a tree
    /// stages only once they are staged; one that does not may stage beside them.
    fn reads_trees_below(&self) -> bool {
        true
    }
    /// Whether the tree is needed only to write the layer and record its facts: a wheel
    /// layer's tree is removed once both are done, and what reads the layer later reads
    /// its facts ([`view`]). Its staging must then record everything the layers above read
    /// beside the tree, not in it.
    fn transient(&self) -> bool {
        false
    }
    /// Whether the stager records the wheel members its tree holds unchanged
    /// ([`WheelMembers`]), for the layer to copy their deflate data.
    fn records_wheel_members(&self) -> bool {
        false
    }
    /// Checks and records on the staged tree, whether staged now or by an earlier build;
    /// run whenever the tree is opened.
    fn staged(&self, _dir: &Path) -> Result<(), BuildError> {
        Ok(())
    }
}

/// The planned layers of one platform's image, bottom to top: the stack's, then the
/// team's.
pub(crate) struct StackLayers<'a> {
    pub base: base::BaseLayer<'a>,
    /// `cuda`, `cuda-math` (when the lock has math libraries) and `cudnn`.
    pub toolkit: toolkit::ToolkitLayers,
    /// One layer per very large distribution of the stack (torch, triton), requirements
    /// first.
    pub large: Vec<python::PythonLayer<'a>>,
    pub python: python::PythonLayer<'a>,
    /// The recipe's `apt:` packages, when it has any.
    pub apt: Option<apt::AptLayer>,
    /// The recipe's `user:`, when it has one.
    pub user: Option<user::UserLayer>,
    /// One layer per very large distribution of the recipe's own requirements (above the
    /// user: they change as often as the packages).
    pub large_packages: Vec<python::PythonLayer<'a>>,
    /// The wheels outside the stack (the recipe's requirements), when there are any.
    pub packages: Option<python::PythonLayer<'a>>,
    pub config: config::ConfigLayer<'a>,
    /// The recipe's `copy:` entries, when it has any.
    pub copy: Option<copy::CopyLayer>,
}

impl<'a> StackLayers<'a> {
    /// Plan every layer (keys, what each reads) from the platform's inputs. Nothing is
    /// staged; the config layer's planning looks for the native probe.
    pub fn plan(inputs: &'a PlatformInputs, env: &'a BuildEnv) -> Result<Self, BuildError> {
        let base = base::BaseLayer::plan(inputs, STACK_MTIME, env.staging, env.build_mode)?;
        let toolkit = toolkit::ToolkitLayer::plan(inputs, env.staging);
        let split = python::split_wheels(inputs)?;
        let one_each = |large: Vec<(&'a str, &'a FetchedWheel)>, part: Part| {
            large
                .into_iter()
                .map(|(name, wheel)| {
                    let kind = PythonPart::Large(name, part);
                    python::PythonLayer::plan(inputs, vec![wheel], kind, &toolkit)
                })
                .collect::<Vec<_>>()
        };
        let large = one_each(split.large, Part::Stack);
        let large_packages = one_each(split.large_packages, Part::Team);
        let python = python::PythonLayer::plan(inputs, split.stack, PythonPart::Stack, &toolkit);
        let packages = (!split.packages.is_empty()).then(|| {
            python::PythonLayer::plan(inputs, split.packages, PythonPart::Packages, &toolkit)
        });
        let apt = apt::AptLayer::plan(inputs, &base, env)?;
        // The user's account files are read from the layers that write /etc.
        let mut etc: Vec<&dyn LayerStager> = vec![&base];
        if let Some(apt) = &apt {
            etc.push(apt);
        }
        let user = user::UserLayer::plan(inputs, &etc, env);
        // Everything below the config layer, in image order (as `all` gives it).
        let mut below: Vec<&dyn LayerStager> = vec![&base];
        below.extend(toolkit.all().into_iter().map(|l| l as &dyn LayerStager));
        below.extend(large.iter().map(|layer| layer as &dyn LayerStager));
        below.push(&python);
        below.extend(apt.iter().map(|layer| layer as &dyn LayerStager));
        below.extend(user.iter().map(|layer| layer as &dyn LayerStager));
        below.extend(large_packages.iter().map(|layer| layer as &dyn LayerStager));
        below.extend(packages.iter().map(|layer| layer as &dyn LayerStager));
        let config = config::ConfigLayer::plan(inputs, &below, env);
        below.push(&config);
        let copy =
            copy::CopyLayer::plan(&inputs.recipe.copy, &inputs.context, &below, env.staging)?;
        Ok(Self {
            base,
            toolkit,
            large,
            python,
            apt,
            user,
            large_packages,
            packages,
            config,
            copy,
        })
    }

    /// The layers in image order.
    pub fn all(&self) -> Vec<&dyn LayerStager> {
        let mut layers = self.stack();
        layers.extend(self.apt.iter().map(|layer| layer as &dyn LayerStager));
        layers.extend(self.user.iter().map(|layer| layer as &dyn LayerStager));
        layers.extend(self.recipe_wheels());
        layers.push(&self.config);
        layers.extend(self.copy.iter().map(|layer| layer as &dyn LayerStager));
        layers
    }

    /// The stack's layers, bottom to top: what every recipe on this stack shares.
    pub fn stack(&self) -> Vec<&dyn LayerStager> {
        let mut layers: Vec<&dyn LayerStager> = vec![&self.base];
        layers.extend(
            self.toolkit
                .all()
                .into_iter()
                .map(|l| l as &dyn LayerStager),
        );
        layers.extend(self.large.iter().map(|layer| layer as &dyn LayerStager));
        layers.push(&self.python);
        layers
    }

    /// The layers that install software, in image order: the stack's, the `apt:` packages
    /// and the recipe's wheels (no user, config or code). A source build's builder is these.
    pub fn software(&self) -> Vec<&dyn LayerStager> {
        let mut layers = self.stack();
        layers.extend(self.apt.iter().map(|layer| layer as &dyn LayerStager));
        layers.extend(self.recipe_wheels());
        layers
    }

    /// The layers of the recipe's own wheels: its very large distributions, then the rest.
    fn recipe_wheels(&self) -> Vec<&dyn LayerStager> {
        let large = self
            .large_packages
            .iter()
            .map(|layer| layer as &dyn LayerStager);
        large
            .chain(self.packages.iter().map(|layer| layer as &dyn LayerStager))
            .collect()
    }

    /// Where each layer's tree is staged, in image order.
    pub fn dirs(&self, staging: &Staging) -> Vec<PathBuf> {
        self.all().iter().map(|l| staging.dir(l.key())).collect()
    }
}
