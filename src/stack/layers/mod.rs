//! The layers of a CUDA stack, one file per kind, in image order:
//! [`base`] (a Debian or Ubuntu root) -> [`apt`] (the recipe's `apt:` packages, when it
//! has any) -> [`toolkit`] (the `cuda`, `cuda-math` and `cudnn` layers, from the nvidia-*
//! wheels) ->
//! one layer per very large distribution (`torch`, `triton`: [`python::LARGE_DISTRIBUTION`])
//! -> [`python`] (the rest of the stack's wheels, nvidia libraries linked to the toolkit's
//! copies) -> [`user`] (the recipe's `user:`, when it has one) -> one layer per very large
//! distribution of the recipe's own requirements -> `packages` (the recipe's other
//! wheels, a [`python`] layer too, when it has any) -> [`config`] (loader configuration and
//! cache, provenance, pip's constraints, the probe) -> [`copy`] (the recipe's `copy:`
//! entries, the team's code, when it has any: last, so a code change rebuilds it alone).
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
pub mod user;

use std::path::{Path, PathBuf};

use crate::cache::Staging;
use crate::layer::{BuildOptions, CacheKey, DirOptions, LayerCache};
use crate::stack::error::BuildError;
use crate::stack::prepare::{FetchedWheel, PlatformInputs};
use crate::stack::settings::BuildProgress;
use python::PythonPart;

/// Bump when what an assembler writes, or what it refuses to write, changes: it is part of
/// every cache key, so a tree staged under older rules is never reused (stack-2: toolkit
/// wheels may not put libraries in subdirectories of the CUDA lib dir, wheel `.data/data/`
/// members may not land where the loader searches, no `.wh.*` names).
pub(crate) const ASSEMBLER: &str = concat!("cudastack-", env!("CARGO_PKG_VERSION"), "-stack-2");

/// What every step of the assembly shares: the caches, the layer options, the progress.
pub(crate) struct BuildEnv<'a> {
    pub cache: &'a LayerCache,
    pub staging: &'a Staging,
    pub options: &'a BuildOptions,
    pub progress: &'a dyn BuildProgress,
    /// How mmdebstrap builds the base (`--build-mode`); None: what this host allows.
    pub build_mode: Option<crate::base_root::rootless::BuildMode>,
}

/// One layer kind: its name in the image, its cache key, how to fill its staging directory
/// and how to walk that directory into a layer.
pub(crate) trait LayerStager {
    /// The layer's name in reports and history (`base`, `cuda`, ...).
    fn name(&self) -> &str;
    fn key(&self) -> &CacheKey;
    /// Stage the layer's tree into `dir`, a fresh empty directory.
    fn stage(&self, dir: &Path) -> Result<(), BuildError>;
    /// How the tree becomes a layer (modes, owners).
    fn walk(&self) -> DirOptions {
        DirOptions::default()
    }
    /// Checks and records on the staged tree, whether staged now or by an earlier build;
    /// run whenever the tree is opened.
    fn staged(&self, _dir: &Path) -> Result<(), BuildError> {
        Ok(())
    }
}

/// The planned layers of one platform's image, bottom to top.
pub(crate) struct StackLayers<'a> {
    pub base: base::BaseLayer<'a>,
    /// The recipe's `apt:` packages, when it has any.
    pub apt: Option<apt::AptLayer>,
    /// `cuda`, `cuda-math` (when the lock has math libraries) and `cudnn`.
    pub toolkit: toolkit::ToolkitLayers,
    /// One layer per very large distribution of the stack (torch, triton), requirements
    /// first.
    pub large: Vec<python::PythonLayer<'a>>,
    /// One layer per very large distribution of the recipe's own requirements (above the
    /// user: they change as often as the packages).
    pub large_packages: Vec<python::PythonLayer<'a>>,
    pub python: python::PythonLayer<'a>,
    /// The recipe's `user:`, when it has one.
    pub user: Option<user::UserLayer>,
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
        let base = base::BaseLayer::plan(inputs, env.options.mtime, env.staging, env.build_mode)?;
        let apt = apt::AptLayer::plan(inputs, &base, env)?;
        let toolkit = toolkit::ToolkitLayer::plan(inputs, env.staging);
        let split = python::split_wheels(inputs)?;
        let one_each = |large: Vec<(&'a str, &'a FetchedWheel)>| -> Vec<python::PythonLayer<'a>> {
            large
                .into_iter()
                .map(|(name, wheel)| {
                    let part = PythonPart::Large(name);
                    python::PythonLayer::plan(inputs, vec![wheel], part, &toolkit)
                })
                .collect()
        };
        let large = one_each(split.large);
        let large_packages = one_each(split.large_packages);
        let python = python::PythonLayer::plan(inputs, split.stack, PythonPart::Stack, &toolkit);
        let packages = (!split.packages.is_empty()).then(|| {
            python::PythonLayer::plan(inputs, split.packages, PythonPart::Packages, &toolkit)
        });
        let mut below: Vec<&dyn LayerStager> = vec![&base];
        if let Some(apt) = &apt {
            below.push(apt);
        }
        // The user's account files are read from the layers that write /etc.
        let user = user::UserLayer::plan(inputs, &below, env);
        below.extend(toolkit.all().into_iter().map(|l| l as &dyn LayerStager));
        below.extend(large.iter().map(|layer| layer as &dyn LayerStager));
        below.push(&python);
        if let Some(user) = &user {
            below.push(user);
        }
        below.extend(large_packages.iter().map(|layer| layer as &dyn LayerStager));
        if let Some(packages) = &packages {
            below.push(packages);
        }
        let config = config::ConfigLayer::plan(inputs, &below, env);
        below.push(&config);
        let copy =
            copy::CopyLayer::plan(&inputs.recipe.copy, &inputs.context, &below, env.staging)?;
        Ok(Self {
            base,
            apt,
            toolkit,
            large,
            python,
            user,
            large_packages,
            packages,
            config,
            copy,
        })
    }

    /// The layers in image order.
    pub fn all(&self) -> Vec<&dyn LayerStager> {
        let mut layers: Vec<&dyn LayerStager> = vec![&self.base];
        if let Some(apt) = &self.apt {
            layers.push(apt);
        }
        layers.extend(
            self.toolkit
                .all()
                .into_iter()
                .map(|l| l as &dyn LayerStager),
        );
        layers.extend(self.large.iter().map(|layer| layer as &dyn LayerStager));
        layers.push(&self.python);
        if let Some(user) = &self.user {
            layers.push(user);
        }
        layers.extend(
            self.large_packages
                .iter()
                .map(|layer| layer as &dyn LayerStager),
        );
        if let Some(packages) = &self.packages {
            layers.push(packages);
        }
        layers.push(&self.config);
        if let Some(copy) = &self.copy {
            layers.push(copy);
        }
        layers
    }

    /// Where each layer's tree is staged, in image order.
    pub fn dirs(&self, staging: &Staging) -> Vec<PathBuf> {
        self.all().iter().map(|l| staging.dir(l.key())).collect()
    }
}
