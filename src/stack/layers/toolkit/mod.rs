//! The `cuda`, `cuda-math` and `cudnn` layers: the CUDA toolkit and cuDNN laid out like
//! NVIDIA's installers, from the locked nvidia-* wheels ([`layout::stage`]).
//!
//! One stager serves the three kinds: they differ only in which wheels they take (cuDNN's,
//! the math libraries', or every other nvidia-* wheel) and in the top-level links
//! (`/usr/local/cuda`, `lib64`), which belong to the toolkit. cuDNN is its own layer so that
//! a cuDNN change leaves the toolkit layer cached; the math libraries are theirs so that no
//! layer at the bottom of a pull is much larger than needed ([`family`]). Each staged tree records which wheel members it holds (its
//! placement), for the Python layer to link to.

pub(crate) mod error;
pub mod layout;

use std::path::{Path, PathBuf};

use super::{LayerStager, Part, WheelMembers, ASSEMBLER};
use crate::cache::Staging;
use crate::digest::Digest;
use crate::layer::CacheKey;
use crate::recipe::Flavor;
use crate::stack::error::BuildError;
use crate::stack::files::write_record;
use crate::stack::prepare::PlatformInputs;
use layout::{NvidiaWheel, ToolkitPaths};

/// A toolkit layer of one platform: `cuda`, `cuda-math` or `cudnn`.
pub(crate) struct ToolkitLayer {
    name: &'static str,
    key: CacheKey,
    pub(super) wheels: Vec<NvidiaWheel>,
    paths: ToolkitPaths,
    flavor: Flavor,
    /// Add `/usr/local/cuda`, `lib64` and `include` (the toolkit layer only).
    top_links: bool,
    /// Where the staged tree's placement is recorded.
    placement_record: PathBuf,
}

/// The toolkit layers of one platform, in image order.
pub(crate) struct ToolkitLayers {
    /// The runtime, compilers, cuBLAS, NCCL and the rest; the top-level links.
    pub cuda: ToolkitLayer,
    /// cuFFT, cuRAND, cuSOLVER, cuSPARSE, when the lock has any.
    pub math: Option<ToolkitLayer>,
    pub cudnn: ToolkitLayer,
}

impl ToolkitLayers {
    /// The layers in image order.
    pub fn all(&self) -> Vec<&ToolkitLayer> {
        let mut layers = vec![&self.cuda];
        layers.extend(&self.math);
        layers.push(&self.cudnn);
        layers
    }
}

/// Which toolkit layer an nvidia-* wheel's libraries go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Cuda,
    Math,
    Cudnn,
}

/// The family of the nvidia-* wheel `project`. `cuda-math` holds NVIDIA's CUDA Math
/// Libraries (docs.nvidia.com/cuda-math-libraries) but cuBLAS: with cuBLAS (623 MB of 1.81 GB
/// unpacked for CUDA 12.1) the toolkit splits into two near halves, 1063 and 751 MB, so the
/// first large layer of a pull is about half as long to wait for (docs/build.md, "Where the
/// layers are cut"). cuSPARSELt (`nvidia-cusparselt-*`) is a cuSPARSE library too.
fn family(project: &str) -> Family {
    const MATH: [&str; 4] = [
        "nvidia-cufft",
        "nvidia-curand",
        "nvidia-cusolver",
        "nvidia-cusparse",
    ];
    if project.starts_with("nvidia-cudnn") {
        Family::Cudnn
    } else if MATH.iter().any(|prefix| project.starts_with(prefix)) {
        Family::Math
    } else {
        Family::Cuda
    }
}

impl ToolkitLayer {
    /// The `cuda`, `cuda-math` and `cudnn` layers of `inputs`.
    pub fn plan(inputs: &PlatformInputs, staging: &Staging) -> ToolkitLayers {
        let cuda_line = inputs.recipe.cuda.version.line().to_string();
        let flavor = inputs.recipe.cuda.flavor;
        let of_family = |wanted: Family| -> Vec<(NvidiaWheel, Digest)> {
            inputs
                .wheels
                .iter()
                .filter(|(name, _)| is_toolkit_wheel(name) && family(name) == wanted)
                .map(|(name, wheel)| {
                    let nvidia = NvidiaWheel {
                        path: wheel.path.clone(),
                        project: name.clone(),
                        version: wheel.version.clone(),
                    };
                    (nvidia, wheel.sha256)
                })
                .collect()
        };
        let layer = |name, key: CacheKey, wheels: Vec<(NvidiaWheel, Digest)>, top_links| Self {
            name,
            placement_record: placement_record(&staging.dir(&key)),
            key,
            wheels: wheels.into_iter().map(|(wheel, _)| wheel).collect(),
            paths: inputs.paths(),
            flavor,
            top_links,
        };
        let (cuda, math, cudnn) = (
            of_family(Family::Cuda),
            of_family(Family::Math),
            of_family(Family::Cudnn),
        );
        let options = (cuda_line.clone(), format!("{flavor:?}"));
        let cuda_key = CacheKey::new(&format!("{ASSEMBLER}/toolkit"), &digests(&cuda), &options);
        let math_key = CacheKey::new(&format!("{ASSEMBLER}/cuda-math"), &digests(&math), &options);
        let cudnn_key = CacheKey::new(&format!("{ASSEMBLER}/cudnn"), &digests(&cudnn), &cuda_line);
        ToolkitLayers {
            cuda: layer("cuda", cuda_key, cuda, true),
            math: (!math.is_empty()).then(|| layer("cuda-math", math_key, math, false)),
            cudnn: layer("cudnn", cudnn_key, cudnn, false),
        }
    }

    /// Which wheel members the staged tree holds ([`layout::Placement`] as JSON).
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
    fn name(&self) -> &str {
        self.name
    }
    fn part(&self) -> Part {
        Part::Stack
    }
    fn key(&self) -> &CacheKey {
        &self.key
    }
    fn stage(&self, dir: &Path) -> Result<(), BuildError> {
        let wheels: Vec<&NvidiaWheel> = self.wheels.iter().collect();
        let mut members = WheelMembers::default();
        let placed = layout::stage(
            &wheels,
            &self.paths,
            self.flavor,
            self.top_links,
            dir,
            &mut members,
        )?;
        members.write(dir)?;
        write_record(
            &placement_record(dir),
            &serde_json::to_vec(&placed).expect("placement serialises"),
        )
    }
    /// A wheel layer: written from the wheels, read above through its facts.
    fn transient(&self) -> bool {
        true
    }
    fn records_wheel_members(&self) -> bool {
        true
    }
    fn reads_trees_below(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_math_libraries_have_a_layer_of_their_own_cublas_stays() {
        // The nvidia-* wheels torch 2.4.1 (cu121) and 2.7 (cu128) require.
        let math = [
            "nvidia-cufft-cu12",
            "nvidia-curand-cu12",
            "nvidia-cusolver-cu12",
            "nvidia-cusparse-cu12",
            "nvidia-cusparselt-cu12",
        ];
        let cuda = [
            "nvidia-cublas-cu12",
            "nvidia-cuda-runtime-cu12",
            "nvidia-cuda-nvrtc-cu12",
            "nvidia-cuda-cupti-cu12",
            "nvidia-nvjitlink-cu12",
            "nvidia-nccl-cu12",
            "nvidia-nvtx-cu12",
            "nvidia-cufile-cu12",
            "nvidia-cuda-nvcc-cu12",
        ];
        for name in math {
            assert_eq!(family(name), Family::Math, "{name}");
        }
        for name in cuda {
            assert_eq!(family(name), Family::Cuda, "{name}");
        }
        assert_eq!(family("nvidia-cudnn-cu12"), Family::Cudnn);
        assert!(is_toolkit_wheel("nvidia-cufft-cu12") && !is_toolkit_wheel("torch"));
    }
}
