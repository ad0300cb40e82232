//! The `cuda` and `cudnn` layers: the CUDA toolkit and cuDNN laid out like NVIDIA's
//! installers, from the locked nvidia-* wheels ([`crate::stack::toolkit::stage`]).
//!
//! One stager serves both kinds: they differ only in which wheels they take (cuDNN's, or
//! every other nvidia-* wheel) and in the top-level links (`/usr/local/cuda`, `lib64`),
//! which belong to the toolkit. cuDNN is its own layer so that a cuDNN change leaves the
//! toolkit layer cached. Each staged tree records which wheel members it holds (its
//! placement), for the Python layer to link to.

use std::path::{Path, PathBuf};

use super::{LayerStager, ASSEMBLER};
use crate::digest::Digest;
use crate::layer::CacheKey;
use crate::recipe::Flavor;
use crate::stack::config::ToolkitPaths;
use crate::stack::error::BuildError;
use crate::stack::prepare::PlatformInputs;
use crate::stack::staging::{write_record, Staging};
use crate::stack::toolkit::{self, NvidiaWheel};

/// The `cuda` or the `cudnn` layer of one platform.
pub(crate) struct ToolkitLayer {
    name: &'static str,
    key: CacheKey,
    wheels: Vec<NvidiaWheel>,
    paths: ToolkitPaths,
    flavor: Flavor,
    /// Add `/usr/local/cuda`, `lib64` and `include` (the toolkit layer only).
    top_links: bool,
    /// Where the staged tree's placement is recorded.
    placement_record: PathBuf,
}

impl ToolkitLayer {
    /// The `cuda` and `cudnn` layers of `inputs`, in that order.
    pub fn plan(inputs: &PlatformInputs, staging: &Staging) -> (Self, Self) {
        let cuda_line = inputs.recipe.cuda.version.line().to_string();
        let flavor = inputs.recipe.cuda.flavor;
        let (cudnn, cuda): (Vec<_>, Vec<_>) = inputs
            .wheels
            .iter()
            .filter(|(name, _)| is_toolkit_wheel(name))
            .map(|(name, wheel)| {
                let nvidia = NvidiaWheel {
                    path: wheel.path.clone(),
                    project: name.clone(),
                    version: wheel.version.clone(),
                };
                (nvidia, wheel.sha256)
            })
            .partition(|(wheel, _)| wheel.is_cudnn());
        let layer = |name, key: CacheKey, wheels: Vec<(NvidiaWheel, Digest)>, top_links| Self {
            name,
            placement_record: placement_record(&staging.dir(&key)),
            key,
            wheels: wheels.into_iter().map(|(wheel, _)| wheel).collect(),
            paths: inputs.paths(),
            flavor,
            top_links,
        };
        let cuda_key = CacheKey::new(
            &format!("{ASSEMBLER}/toolkit"),
            &digests(&cuda),
            &(cuda_line.clone(), format!("{flavor:?}")),
        );
        let cudnn_key = CacheKey::new(&format!("{ASSEMBLER}/cudnn"), &digests(&cudnn), &cuda_line);
        (
            layer("cuda", cuda_key, cuda, true),
            layer("cudnn", cudnn_key, cudnn, false),
        )
    }

    /// Which wheel members the staged tree holds ([`toolkit::Placement`] as JSON).
    pub fn placement_record(&self) -> &Path {
        &self.placement_record
    }
}

/// Whether the toolkit layers place the wheel `name`'s libraries (every nvidia-* wheel): the
/// Python layers then hold only its few Python files and links.
pub(crate) fn is_toolkit_wheel(name: &str) -> bool {
    name.starts_with("nvidia-")
}

fn digests(wheels: &[(NvidiaWheel, Digest)]) -> Vec<Digest> {
    wheels.iter().map(|(_, digest)| *digest).collect()
}

/// The placement record beside a staged toolkit tree.
fn placement_record(dir: &Path) -> PathBuf {
    dir.with_extension("placement.json")
}

impl LayerStager for ToolkitLayer {
    fn name(&self) -> &'static str {
        self.name
    }
    fn key(&self) -> &CacheKey {
        &self.key
    }
    fn stage(&self, dir: &Path) -> Result<(), BuildError> {
        let wheels: Vec<&NvidiaWheel> = self.wheels.iter().collect();
        let placed = toolkit::stage(&wheels, &self.paths, self.flavor, self.top_links, dir)?;
        write_record(
            &placement_record(dir),
            &serde_json::to_vec(&placed).expect("placement serialises"),
        )
    }
}
