//! "Will this image run on this node?", answered from the image config alone: the labels
//! cudastack writes and `NVIDIA_REQUIRE_CUDA` (what nvidia-container-cli enforces). Reading
//! only the config means a login node can answer for a multi-GB image without pulling it.

use std::collections::BTreeMap;
use std::str::FromStr;

use serde::Serialize;

use super::record::VerifiedOn;
use crate::audit::kernels::{CoverageGroup, Reach};
use crate::digest::Digest;
use crate::labels::{self, StackLabels};
use crate::matrix::{GpuDrivers, Matrix};
use crate::target_gpu::TargetGpu;
use crate::version::{ComputeCapability, CudaVersion, DriverVersion, PtxIsa};

/// What an image's config declares about what it needs.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ImageClaims {
    pub recipe: Option<String>,
    pub torch: Option<String>,
    pub cuda: Option<String>,
    pub cudnn: Option<String>,
    pub driver_floor: Option<DriverVersion>,
    /// From `NVIDIA_REQUIRE_CUDA=cuda>=X.Y`.
    pub require_cuda: Option<CudaVersion>,
    /// The torch build's cubin archs (`io.cudastack.torch.sm`).
    pub sm: Vec<ComputeCapability>,
    /// The image's libraries with GPU code, grouped by identical targets
    /// (`io.cudastack.kernels`, written by the kernel-coverage audit); empty in older images.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kernels: Vec<CoverageGroup>,
    /// Why `io.cudastack.kernels` is present but does not parse; the answer is then unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernels_unreadable: Option<String>,
    /// The capabilities every library with GPU code covers (`io.cudastack.sm`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub covered_sm: Vec<ComputeCapability>,
    pub verified: Vec<VerifiedOn>,
    /// Whether the labels describe all of the image's layers or only those below.
    pub lineage: Lineage,
}

/// The image's layers against those its io.cudastack labels were written for
/// ([`labels::LAYERS`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Lineage {
    /// No label to compare with: built by a cudastack from before the label, or not by
    /// cudastack.
    #[default]
    Unrecorded,
    /// Exactly the layers cudastack built.
    Built { layers: usize },
    /// Built FROM a cudastack image by another tool (a Dockerfile, ...): `added` layers
    /// above its `base`; the labels describe the base only.
    Derived { base: usize, added: usize },
    /// The labels were written for layers this image does not have (squashed, or rebuilt
    /// with its labels copied): they do not describe it.
    Mismatched,
}

impl Lineage {
    /// Where the labelled chain ends among the image's `diff_ids`.
    pub fn of(labels: &BTreeMap<String, String>, diff_ids: &[Digest]) -> Self {
        let Some(recorded) = labels.get(labels::LAYERS) else {
            return Lineage::Unrecorded;
        };
        let chain = crate::oci::chain_ids(diff_ids);
        match chain.iter().position(|id| id.to_string() == *recorded) {
            Some(top) if top + 1 == diff_ids.len() => Lineage::Built {
                layers: diff_ids.len(),
            },
            Some(top) => Lineage::Derived {
                base: top + 1,
                added: diff_ids.len() - top - 1,
            },
            None => Lineage::Mismatched,
        }
    }
}

/// An image config's labels and environment (`NAME=value` entries split), sorted.
pub fn labels_and_env(
    config: &oci_spec::image::Config,
) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let labels = config
        .labels()
        .clone()
        .map(|l| l.into_iter().collect())
        .unwrap_or_default();
    let env = config
        .env()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|e| {
            e.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect();
    (labels, env)
}

impl ImageClaims {
    /// What an image's configuration claims, and which of its layers the claims are about.
    pub fn from_image(image: &oci_spec::image::ImageConfiguration) -> Self {
        let (labels, env) = labels_and_env(&image.config().clone().unwrap_or_default());
        let diff_ids: Vec<Digest> = image
            .rootfs()
            .diff_ids()
            .iter()
            .filter_map(|id| id.parse().ok())
            .collect();
        Self::from_labels_and_env(&labels, &env, &diff_ids)
    }

    /// The claims of `labels` and `env`, about an image whose layers have `diff_ids`.
    pub fn from_labels_and_env(
        labels: &BTreeMap<String, String>,
        env: &BTreeMap<String, String>,
        diff_ids: &[Digest],
    ) -> Self {
        let label = |key: &str| labels.get(key).cloned();
        let sm_list = |key: &str| -> Vec<ComputeCapability> {
            label(key)
                .map(|list| {
                    list.split_whitespace()
                        .filter_map(|sm| ComputeCapability::from_str(sm).ok())
                        .collect()
                })
                .unwrap_or_default()
        };
        // Present but unreadable is not absent: falling back to the torch list would answer
        // yes for a GPU whose cuDNN has no code.
        let kernels = label(labels::KERNELS).map(|text| {
            serde_json::from_str::<Vec<CoverageGroup>>(&text).map_err(|error| error.to_string())
        });
        let stack = StackLabels::read(labels);
        Self {
            recipe: stack.recipe,
            torch: stack.torch,
            cuda: stack.cuda,
            cudnn: stack.cudnn,
            driver_floor: stack.driver_floor.and_then(|v| v.parse().ok()),
            require_cuda: env.get("NVIDIA_REQUIRE_CUDA").and_then(|v| require_cuda(v)),
            sm: stack
                .torch_sm
                .unwrap_or_default()
                .iter()
                .filter_map(|sm| ComputeCapability::from_str(sm).ok())
                .collect(),
            kernels: kernels
                .as_ref()
                .and_then(|parsed| parsed.as_ref().ok())
                .cloned()
                .unwrap_or_default(),
            kernels_unreadable: kernels.and_then(|parsed| parsed.err()),
            covered_sm: sm_list(labels::SM),
            verified: label(labels::VERIFIED_MATRIX)
                .and_then(|text| serde_json::from_str(&text).ok())
                .unwrap_or_default(),
            lineage: Lineage::of(labels, diff_ids),
        }
    }
}

/// The `cuda>=X.Y` term of an NVIDIA_REQUIRE_CUDA value (other terms, such as `brand=`
/// alternatives in NVIDIA's own images, widen the condition and are not modelled).
fn require_cuda(value: &str) -> Option<CudaVersion> {
    value
        .split_whitespace()
        .find_map(|term| term.strip_prefix("cuda>="))
        .and_then(|v| v.parse().ok())
}

/// The node: its driver and GPUs, as far as known.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Node {
    pub driver: Option<DriverVersion>,
    pub gpus: Vec<NodeGpu>,
}

#[derive(Debug, Clone, Serialize)]
pub struct NodeGpu {
    pub name: String,
    pub compute_capability: ComputeCapability,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Fit {
    /// Every requirement the image declares was compared with a fact of the node, and met.
    Yes,
    /// A requirement is not met.
    No,
    /// Nothing failed, but something was not compared: the image declares nothing to
    /// check, or the node fact a declared requirement needs is missing. Unknown is not
    /// yes: `cudastack check` exits 3 for it.
    Unknown,
}

#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub ok: bool,
    pub subject: String,
    pub what: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Answer {
    pub fits: Fit,
    /// For `unknown`: what was missing, and what to give to get an answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unknown_because: Option<String>,
    /// The drivers each node GPU runs on at all, where the matrix knows them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gpu_drivers: Vec<GpuDrivers>,
    pub findings: Vec<Finding>,
}

pub fn check(matrix: &Matrix, image: &ImageClaims, node: &Node) -> Answer {
    let mut findings = Vec::new();
    let gpu_drivers: Vec<GpuDrivers> = node
        .gpus
        .iter()
        .filter_map(|gpu| {
            matrix.gpu_drivers(&TargetGpu {
                name: gpu.name.clone(),
                cc: gpu.compute_capability,
            })
        })
        .collect();
    if let Some(driver) = &node.driver {
        check_driver(matrix, image, driver, &mut findings);
        // A GPU the driver does not support is a no whatever the image needs.
        for drivers in gpu_drivers
            .iter()
            .filter(|drivers| !drivers.runs_on(driver))
        {
            findings.push(Finding {
                ok: false,
                subject: format!("driver {driver}"),
                what: drivers.refusal(driver),
                hint: Some(drivers.hint(driver)),
            });
        }
    }
    // The driver's JIT reads PTX up to the ISA of the newest CUDA it supports.
    let jit = node
        .driver
        .as_ref()
        .and_then(|driver| matrix.cuda_ceiling(driver))
        .and_then(PtxIsa::newest_for);
    for gpu in &node.gpus {
        if image.kernels.is_empty() {
            check_gpu(matrix, image, gpu, &mut findings);
        } else {
            check_kernels(image, gpu, jit, &mut findings);
        }
        verified_on(image, gpu, &mut findings);
    }
    if let Lineage::Derived { base, added } = image.lineage {
        findings.push(Finding {
            ok: true,
            subject: "image".to_string(),
            what: format!("derives from a cudastack image: {added} layer(s) added above its {base} by another tool; the claims are that image's, and say nothing of what the added layers changed"),
            hint: Some("`cudastack verify` it: the host compares the added layers with the image's lock, then the probe checks the image as it is".to_string()),
        });
    }
    if findings.iter().any(|f| !f.ok) {
        return Answer {
            fits: Fit::No,
            unknown_because: None,
            gpu_drivers,
            findings,
        };
    }
    let unknown_because = unknown_because(image, node);
    Answer {
        fits: if unknown_because.is_some() {
            Fit::Unknown
        } else {
            Fit::Yes
        },
        unknown_because,
        gpu_drivers,
        findings,
    }
}

/// The node's driver against the image's NVIDIA_REQUIRE_CUDA and driver floor.
fn check_driver(
    matrix: &Matrix,
    image: &ImageClaims,
    driver: &DriverVersion,
    findings: &mut Vec<Finding>,
) {
    let mut push = |ok: bool, subject: String, what: String, hint: Option<String>| {
        findings.push(Finding {
            ok,
            subject,
            what,
            hint,
        })
    };
    let subject = format!("driver {driver}");
    match (image.require_cuda, matrix.cuda_ceiling(driver)) {
        (Some(need), Some(ceiling)) if ceiling < need => push(
            false,
            subject,
            format!("supports CUDA up to {ceiling}; the image requires CUDA >= {need} (NVIDIA_REQUIRE_CUDA), so the NVIDIA runtime refuses to start it (`requirement error: unsatisfied condition: cuda>={need}`)"),
            Some(format!(
                "upgrade the driver to {} or newer, or use an image built for CUDA {ceiling} or older{}",
                matrix
                    .min_driver_for(&need)
                    .map(|d| d.to_string())
                    .unwrap_or_else(|| format!("one that supports CUDA {need}")),
                minor_version_compat_hint(matrix, need, ceiling, driver)
            )),
        ),
        (Some(need), Some(ceiling)) => push(
            true,
            subject,
            format!("supports CUDA up to {ceiling}; the image requires CUDA >= {need}"),
            None,
        ),
        (Some(need), None) => push(
            false,
            subject,
            format!("is older than every driver the matrix knows; the image requires CUDA >= {need}"),
            Some("upgrade the driver".to_string()),
        ),
        (None, _) => push(
            true,
            subject.clone(),
            "the image sets no NVIDIA_REQUIRE_CUDA, nothing to compare".to_string(),
            None,
        ),
    }
    if let Some(floor) = &image.driver_floor {
        if driver < floor {
            push(
                false,
                format!("driver {driver}"),
                format!("is below the recipe's driver floor {floor}"),
                Some(format!("upgrade the driver to {floor} or newer")),
            );
        }
    }
}

/// The third way out when the driver is below the image's CUDA but within its major's
/// minor-version compatibility (what `validate` suggests for a recipe): the same image
/// built with `minor_version_compat: true` and this driver as its floor starts here, since
/// its NVIDIA_REQUIRE_CUDA then admits the driver. Empty when the driver is older than
/// that floor or of another major.
fn minor_version_compat_hint(
    matrix: &Matrix,
    need: CudaVersion,
    ceiling: CudaVersion,
    driver: &DriverVersion,
) -> String {
    match matrix.minor_compat_floor(need.major) {
        Some(floor) if ceiling.major == need.major && *driver >= floor.min_driver => format!(
            ", or build it again with `minor_version_compat: true` and `driver_floor: \"{driver}\"` (CUDA {}.x minor-version compatibility runs it from driver {}; PTX newer than the driver cannot be JIT-compiled)",
            need.major, floor.min_driver
        ),
        _ => String::new(),
    }
}

/// One GPU of the node against the kernels the image carries, and what it was verified on.
fn check_gpu(matrix: &Matrix, image: &ImageClaims, gpu: &NodeGpu, findings: &mut Vec<Finding>) {
    let mut push = |ok: bool, subject: String, what: String, hint: Option<String>| {
        findings.push(Finding {
            ok,
            subject,
            what,
            hint,
        })
    };
    let cc = gpu.compute_capability;
    let subject = format!("{} (sm_{}{})", gpu.name, cc.major, cc.minor);
    let sm_list =
        |archs: &[ComputeCapability]| archs.iter().map(|s| s.sm()).collect::<Vec<_>>().join(" ");
    if !image.sm.is_empty() {
        match image.sm.iter().filter(|arch| arch.cubin_runs_on(&cc)).max() {
            Some(arch) => push(
                true,
                subject.clone(),
                format!("runs the build's {} kernels", arch.sm()),
                None,
            ),
            None => push(
                false,
                subject.clone(),
                format!("has no kernels in this build ({}): torch fails with `no kernel image is available for execution on the device`", sm_list(&image.sm)),
                Some("use a torch build whose arch list covers this GPU (`cudastack solve --gpu NAME`)".to_string()),
            ),
        }
    } else if let Some(cuda) = image.require_cuda {
        // No torch: the CUDA libraries carry code for what the toolkit targets, the
        // native probe's device.kernels rule (expect.json's `cuda_archs`).
        let archs = matrix.cuda_archs(cuda);
        match archs.iter().filter(|arch| arch.cubin_runs_on(&cc)).max() {
            Some(arch) => push(
                true,
                subject.clone(),
                format!("within CUDA {cuda}'s archs: its libraries can carry {} kernels (no torch arch list to compare)", arch.sm()),
                None,
            ),
            None => push(
                false,
                subject.clone(),
                format!("is not among the archs CUDA {cuda} generates code for ({}): its cuBLAS/cuDNN carry no kernels for this GPU", sm_list(&archs)),
                Some("use an image of a CUDA release that targets this GPU (`cudastack check` of a recipe names it: error[gpu-arch-too-new] / error[gpu-arch-removed])".to_string()),
            ),
        }
    } else {
        push(
            true,
            subject.clone(),
            "the image declares no kernel arch list and no CUDA requirement, nothing to compare"
                .to_string(),
            None,
        );
    }
}

/// One GPU of the node against every library's GPU code (the `io.cudastack.kernels` label):
/// a no names each group of libraries without code it can run, and what they carry.
/// `jit`: the newest PTX ISA the node's driver reads (None: driver unknown, PTX counts).
fn check_kernels(
    image: &ImageClaims,
    gpu: &NodeGpu,
    jit: Option<PtxIsa>,
    findings: &mut Vec<Finding>,
) {
    let cc = gpu.compute_capability;
    let subject = format!("{} ({})", gpu.name, cc.sm());
    let mut jitted = Vec::new();
    let mut missing = false;
    for group in &image.kernels {
        let names = group.library_names().join(", ");
        match group.reach(&cc, jit) {
            Reach::Sass(_) => {}
            Reach::Ptx(ptx) => jitted.push(format!("{ptx} of {names}")),
            Reach::PtxTooNew(_) | Reach::None => {
                missing = true;
                findings.push(Finding {
                    ok: false,
                    subject: subject.clone(),
                    what: format!(
                        "has no kernels in {names} (SASS {}; PTX {}{}): the first launch fails with `no kernel image is available for execution on the device`",
                        group.sass_text(),
                        group.ptx_text(),
                        jit.map(|isa| format!("; this driver JIT-compiles PTX ISA {isa} at most")).unwrap_or_default()
                    ),
                    hint: Some(format!(
                        "use an image built for this GPU: add \"{}\" to the recipe's `gpus:` and build again, and the audit names the library to upgrade",
                        gpu.name
                    )),
                });
            }
        }
    }
    if missing {
        return;
    }
    let libraries: usize = image.kernels.iter().map(|g| g.libraries.len()).sum();
    let what = if jitted.is_empty() {
        format!("runs native kernels of all {libraries} libraries with GPU code")
    } else {
        format!(
            "runs all {libraries} libraries with GPU code, JIT-compiling at first use {}",
            jitted.join("; ")
        )
    };
    findings.push(Finding {
        ok: true,
        subject,
        what,
        hint: None,
    });
}

/// The row of the verified matrix for this GPU's capability, as an ok finding.
fn verified_on(image: &ImageClaims, gpu: &NodeGpu, findings: &mut Vec<Finding>) {
    let cc = gpu.compute_capability;
    if let Some(row) = image
        .verified
        .iter()
        .find(|row| row.compute_capability == format!("{}.{}", cc.major, cc.minor))
    {
        findings.push(Finding {
            ok: true,
            subject: format!("{} (sm_{}{})", gpu.name, cc.major, cc.minor),
            what: format!(
                "verified on {} with driver {} on {}",
                row.gpu, row.driver, row.date
            ),
            hint: None,
        });
    }
}

/// Why nothing-failed is not yet a yes: a requirement with no node fact to compare it
/// with, or no requirement at all. `None` when every declared requirement was compared.
fn unknown_because(image: &ImageClaims, node: &Node) -> Option<String> {
    if image.lineage == Lineage::Mismatched {
        return Some(format!(
            "the image's io.cudastack labels were written for other layers ({} names a chain this image does not have: squashed, or rebuilt with the labels copied), so they do not describe it; check the image cudastack built, or verify this one with `cudastack verify`",
            labels::LAYERS
        ));
    }
    // What the driver is compared with, and what the GPUs are (the torch arch list, or
    // the archs of the required CUDA when there is no torch).
    let needs_driver = image.require_cuda.is_some() || image.driver_floor.is_some();
    let needs_gpus =
        !image.sm.is_empty() || !image.kernels.is_empty() || image.require_cuda.is_some();
    if !needs_driver && !needs_gpus {
        return Some(
            "the image declares nothing to check against (no NVIDIA_REQUIRE_CUDA, no io.cudastack.driver-floor, no io.cudastack.torch.sm label): it was not built by cudastack, or its labels were removed".to_string(),
        );
    }
    if let Some(error) = &image.kernels_unreadable {
        return Some(format!(
            "the image's {} label does not parse ({error}): the GPU code of its libraries cannot be compared; rebuild it, or check it with the cudastack that built it",
            labels::KERNELS
        ));
    }
    if node.driver.is_none() && node.gpus.is_empty() {
        return Some(
            "nothing is known about the node: give --driver and --gpu/--cc, or --detect on the node".to_string(),
        );
    }
    if needs_driver && node.driver.is_none() {
        return Some(
            "the image has a driver requirement and the node's driver is not known: give --driver (as nvidia-smi prints it) or --detect".to_string(),
        );
    }
    if needs_gpus && node.gpus.is_empty() {
        return Some(
            "the image carries kernels for some GPUs only and the node's GPUs are not known: give --gpu NAME or --cc X.Y, or --detect".to_string(),
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims() -> ImageClaims {
        let labels = BTreeMap::from([
            (
                "io.cudastack.driver-floor".to_string(),
                "525.60.13".to_string(),
            ),
            (
                "io.cudastack.torch.sm".to_string(),
                "sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90".to_string(),
            ),
        ]);
        let env = BTreeMap::from([("NVIDIA_REQUIRE_CUDA".to_string(), "cuda>=12.1".to_string())]);
        ImageClaims::from_labels_and_env(&labels, &env, &[])
    }

    fn node(driver: &str, gpus: &[(&str, &str)]) -> Node {
        Node {
            driver: Some(driver.parse().unwrap()),
            gpus: gpus
                .iter()
                .map(|(name, cc)| NodeGpu {
                    name: name.to_string(),
                    compute_capability: cc.parse().unwrap(),
                })
                .collect(),
        }
    }

    #[test]
    fn a_driver_below_the_requirement_says_no_with_the_runtime_error() {
        let answer = check(Matrix::embedded(), &claims(), &node("470.82.01", &[]));
        assert_eq!(answer.fits, Fit::No);
        let text = serde_json::to_string(&answer).unwrap();
        assert!(text.contains("supports CUDA up to 11.4"), "{text}");
        assert!(text.contains("unsatisfied condition: cuda>=12.1"), "{text}");
        // A CUDA 11 driver: minor-version compatibility cannot bridge the majors.
        assert!(!text.contains("minor_version_compat"), "{text}");
    }

    /// Below the image's CUDA but within its major's minor-version compatibility: the hint
    /// gives the rebuild `validate` suggests for a recipe, with this driver as the floor.
    #[test]
    fn a_driver_within_minor_version_compatibility_is_told_how_to_rebuild_for_it() {
        let labels = BTreeMap::from([(
            "io.cudastack.driver-floor".to_string(),
            "550.54.14".to_string(),
        )]);
        let env = BTreeMap::from([("NVIDIA_REQUIRE_CUDA".to_string(), "cuda>=12.4".to_string())]);
        let claims = ImageClaims::from_labels_and_env(&labels, &env, &[]);
        let answer = check(Matrix::embedded(), &claims, &node("535.104.05", &[]));
        assert_eq!(answer.fits, Fit::No);
        let hint = answer.findings[0].hint.as_deref().unwrap();
        assert_eq!(
            hint,
            "upgrade the driver to 550.54.14 or newer, or use an image built for CUDA 12.2 or older, or build it again with `minor_version_compat: true` and `driver_floor: \"535.104.05\"` (CUDA 12.x minor-version compatibility runs it from driver 525.60.13; PTX newer than the driver cannot be JIT-compiled)"
        );
        // Below the compatibility floor itself: no such way out.
        let answer = check(Matrix::embedded(), &claims, &node("520.61.05", &[]));
        let hint = answer.findings[0].hint.as_deref().unwrap();
        assert!(!hint.contains("minor_version_compat"), "{hint}");
    }

    #[test]
    fn a_gpu_without_kernels_says_no() {
        let answer = check(
            Matrix::embedded(),
            &claims(),
            &node("570.124.06", &[("NVIDIA GeForce RTX 5090", "12.0")]),
        );
        assert_eq!(answer.fits, Fit::No);
        let text = serde_json::to_string(&answer).unwrap();
        assert!(text.contains("no kernel image is available"), "{text}");
        let answer = check(
            Matrix::embedded(),
            &claims(),
            &node("550.54.15", &[("NVIDIA A10G", "8.6")]),
        );
        assert_eq!(answer.fits, Fit::Yes, "{answer:?}");
        assert!(answer.findings.iter().any(|f| f.what.contains("sm_86")));
    }

    /// An image without torch: the GPU is checked against the archs its CUDA toolkit
    /// targets, as the native probe does.
    #[test]
    fn a_torch_free_image_is_checked_against_its_cuda_archs() {
        let claims = ImageClaims {
            require_cuda: Some("12.4".parse().unwrap()),
            ..ImageClaims::default()
        };
        let b200 = check(
            Matrix::embedded(),
            &claims,
            &node("570.124.06", &[("NVIDIA B200", "10.0")]),
        );
        assert_eq!(b200.fits, Fit::No, "{b200:?}");
        let text = serde_json::to_string(&b200).unwrap();
        assert!(
            text.contains("CUDA 12.4 generates code for (sm_50"),
            "{text}"
        );
        let h200 = check(
            Matrix::embedded(),
            &claims,
            &node("570.124.06", &[("NVIDIA H200", "9.0")]),
        );
        assert_eq!(h200.fits, Fit::Yes, "{h200:?}");
        assert!(h200
            .findings
            .iter()
            .any(|f| f.what.contains("sm_90 kernels")));
    }

    /// A Blackwell GPU on an R550 driver was a yes when the image needed CUDA 12.1.
    #[test]
    fn a_driver_older_than_the_gpu_says_no_and_names_the_branch() {
        let answer = check(
            Matrix::embedded(),
            &claims_with_sm("sm_80 sm_90 sm_100 sm_120"),
            &node("550.54.15", &[("NVIDIA GeForce RTX 5090", "12.0")]),
        );
        assert_eq!(answer.fits, Fit::No, "{answer:?}");
        let refusal = answer.findings.iter().find(|f| !f.ok).unwrap();
        assert!(
            refusal
                .what
                .contains("GeForce RTX 5090 (sm_120) needs the R570 driver branch or later"),
            "{refusal:?}"
        );
        assert!(refusal.what.contains("docs.nvidia.com"), "{refusal:?}");
        assert!(
            refusal
                .hint
                .as_deref()
                .unwrap()
                .contains("install the R570 driver branch"),
            "{refusal:?}"
        );
        assert_eq!(answer.gpu_drivers[0].min_branch.as_deref(), Some("R570"));
        // A GPU whose architecture a newer driver dropped is a no too.
        let v100 = check(
            Matrix::embedded(),
            &claims_with_sm("sm_70 sm_80"),
            &node("590.44.01", &[("Tesla V100", "7.0")]),
        );
        assert_eq!(v100.fits, Fit::No, "{v100:?}");
        let refusal = v100.findings.iter().find(|f| !f.ok).unwrap();
        assert!(
            refusal.what.contains("no longer supports it"),
            "{refusal:?}"
        );
        assert!(
            refusal.hint.as_deref().unwrap().contains("R580 branch"),
            "{refusal:?}"
        );
        // B200 has its own, later minimum within R570.
        let b200 = check(
            Matrix::embedded(),
            &claims_with_sm("sm_80 sm_90 sm_100 sm_120"),
            &node("570.124.06", &[("NVIDIA B200", "10.0")]),
        );
        assert_eq!(b200.fits, Fit::No, "{b200:?}");
        assert!(serde_json::to_string(&b200).unwrap().contains("570.133.20"));
        let fits = check(
            Matrix::embedded(),
            &claims_with_sm("sm_80 sm_90 sm_100 sm_120"),
            &node("570.133.20", &[("NVIDIA B200", "10.0")]),
        );
        assert_eq!(fits.fits, Fit::Yes, "{fits:?}");
    }

    fn claims_with_sm(sm: &str) -> ImageClaims {
        let labels = BTreeMap::from([("io.cudastack.torch.sm".to_string(), sm.to_string())]);
        let env = BTreeMap::from([("NVIDIA_REQUIRE_CUDA".to_string(), "cuda>=12.1".to_string())]);
        ImageClaims::from_labels_and_env(&labels, &env, &[])
    }

    /// A kernels label that does not parse (cut short, or a suffix this version does not
    /// know) is no reason to fall back to the torch list and say yes.
    #[test]
    fn an_unreadable_kernels_label_is_unknown_not_yes() {
        let env = BTreeMap::from([("NVIDIA_REQUIRE_CUDA".to_string(), "cuda>=12.4".to_string())]);
        for bad in [
            r#"[{"libraries":["/l.so"],"ptx":[],"sass":["sm_120x"]}]"#,
            r#"[{"libraries":["/l.so"],"ptx":[],"sa"#,
        ] {
            let labels = BTreeMap::from([
                (
                    "io.cudastack.torch.sm".to_string(),
                    "sm_80 sm_90 sm_120".to_string(),
                ),
                (
                    "io.cudastack.driver-floor".to_string(),
                    "570.86.10".to_string(),
                ),
                (labels::KERNELS.to_string(), bad.to_string()),
            ]);
            let claims = ImageClaims::from_labels_and_env(&labels, &env, &[]);
            assert!(claims.kernels_unreadable.is_some(), "{bad}");
            let answer = check(
                Matrix::embedded(),
                &claims,
                &node("570.133.20", &[("NVIDIA GeForce RTX 5090", "12.0")]),
            );
            assert_eq!(answer.fits, Fit::Unknown, "{answer:?}");
            assert!(
                answer
                    .unknown_because
                    .as_deref()
                    .unwrap_or_default()
                    .contains(labels::KERNELS),
                "{answer:?}"
            );
        }
    }

    /// The torch arch list covers sm_120, the image's cuDNN does not.
    #[test]
    fn a_library_without_kernels_for_the_gpu_says_no_and_names_it() {
        let groups = r#"[{"libraries":["/usr/local/lib/python3.11/site-packages/nvidia/cudnn/lib/libcudnn_engines_precompiled.so.9"],"ptx":[{"arch":"sm_90","isa":"8.4"}],"sass":["sm_50","sm_80","sm_86","sm_90"]},{"libraries":["/usr/local/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so"],"ptx":[],"sass":["sm_80","sm_90","sm_120"]}]"#;
        let labels = BTreeMap::from([
            (
                "io.cudastack.torch.sm".to_string(),
                "sm_80 sm_90 sm_120".to_string(),
            ),
            (labels::KERNELS.to_string(), groups.to_string()),
            (labels::SM.to_string(), "sm_80 sm_86 sm_90".to_string()),
        ]);
        let env = BTreeMap::from([("NVIDIA_REQUIRE_CUDA".to_string(), "cuda>=12.4".to_string())]);
        let claims = ImageClaims::from_labels_and_env(&labels, &env, &[]);
        assert_eq!(claims.kernels.len(), 2);
        assert_eq!(claims.covered_sm.len(), 3);
        // R570 supports CUDA 12.8, whose JIT reads ISA 8.4: cuDNN's compute_90 PTX runs.
        let jit = check(
            Matrix::embedded(),
            &claims,
            &node("570.133.20", &[("NVIDIA GeForce RTX 5090", "12.0")]),
        );
        assert_eq!(jit.fits, Fit::Yes, "{jit:?}");
        assert!(
            jit.findings
                .iter()
                .any(|f| f.what.contains("JIT-compiling")),
            "{jit:?}"
        );
        let no_ptx = groups.replace(r#"{"arch":"sm_90","isa":"8.4"}"#, "");
        let labels = BTreeMap::from([(labels::KERNELS.to_string(), no_ptx)]);
        let claims = ImageClaims::from_labels_and_env(&labels, &env, &[]);
        let answer = check(
            Matrix::embedded(),
            &claims,
            &node("570.133.20", &[("NVIDIA GeForce RTX 5090", "12.0")]),
        );
        assert_eq!(answer.fits, Fit::No, "{answer:?}");
        let refusal = answer.findings.iter().find(|f| !f.ok).unwrap();
        assert!(
            refusal.what.contains("libcudnn_engines_precompiled.so.9"),
            "{refusal:?}"
        );
        assert!(
            refusal.what.contains("SASS sm_50 sm_80 sm_86 sm_90"),
            "{refusal:?}"
        );
        let h100 = check(
            Matrix::embedded(),
            &claims,
            &node("570.133.20", &[("NVIDIA H100", "9.0")]),
        );
        assert_eq!(h100.fits, Fit::Yes, "{h100:?}");
        assert!(h100
            .findings
            .iter()
            .any(|f| f.what.contains("native kernels of all 2 libraries")));
    }

    #[test]
    fn nothing_known_is_unknown() {
        let answer = check(Matrix::embedded(), &claims(), &Node::default());
        assert_eq!(answer.fits, Fit::Unknown);
        assert!(answer
            .unknown_because
            .unwrap()
            .contains("nothing is known about the node"));
    }

    /// An image that declares nothing was answered "yes" for any node.
    #[test]
    fn an_image_that_declares_nothing_is_unknown_not_yes() {
        let answer = check(
            Matrix::embedded(),
            &ImageClaims::default(),
            &node("550.54.15", &[("NVIDIA A100", "8.0")]),
        );
        assert_eq!(answer.fits, Fit::Unknown, "{answer:?}");
        assert!(answer
            .unknown_because
            .as_deref()
            .unwrap()
            .contains("declares nothing to check"));
        let text = serde_json::to_string(&answer).unwrap();
        assert!(text.contains(r#""fits":"unknown""#), "{text}");
    }

    /// Half the node is not half a yes: a driver alone cannot say the GPUs have kernels,
    /// and GPUs alone cannot say the driver is new enough.
    #[test]
    fn a_requirement_without_its_node_fact_is_unknown() {
        let driver_only = Node {
            driver: Some("550.54.15".parse().unwrap()),
            gpus: Vec::new(),
        };
        let answer = check(Matrix::embedded(), &claims(), &driver_only);
        assert_eq!(answer.fits, Fit::Unknown, "{answer:?}");
        assert!(answer.unknown_because.unwrap().contains("--gpu"));
        let gpus_only = Node {
            driver: None,
            gpus: vec![NodeGpu {
                name: "NVIDIA A100".to_string(),
                compute_capability: "8.0".parse().unwrap(),
            }],
        };
        let answer = check(Matrix::embedded(), &claims(), &gpus_only);
        assert_eq!(answer.fits, Fit::Unknown, "{answer:?}");
        assert!(answer.unknown_because.unwrap().contains("--driver"));
        // A failure needs no more facts: no is no.
        let old = Node {
            driver: Some("470.82.01".parse().unwrap()),
            gpus: Vec::new(),
        };
        assert_eq!(check(Matrix::embedded(), &claims(), &old).fits, Fit::No);
    }

    #[test]
    fn the_layers_label_tells_built_derived_and_mismatched_images_apart() {
        let ids: Vec<Digest> = ["a", "b", "c"]
            .iter()
            .map(|s| Digest::of_bytes(s.as_bytes()))
            .collect();
        // sha256("sha256:<sha256 of a> sha256:<sha256 of b>"), computed with sha256sum.
        let chain = crate::oci::chain_ids(&ids);
        assert_eq!(chain[0], ids[0]);
        assert_eq!(
            chain[1].hex(),
            "51c0c8ace48498d6f5fee6b0592cc06f2da0f3cbe09c5a34a97dce85c3889676"
        );
        let labelled =
            |top: &Digest| BTreeMap::from([(labels::LAYERS.to_string(), top.to_string())]);
        assert_eq!(
            Lineage::of(&labelled(&chain[1]), &ids[..2]),
            Lineage::Built { layers: 2 }
        );
        assert_eq!(
            Lineage::of(&labelled(&chain[1]), &ids),
            Lineage::Derived { base: 2, added: 1 }
        );
        // The same diff_ids in another order are other layers.
        let reordered = [ids[1], ids[0], ids[2]];
        assert_eq!(
            Lineage::of(&labelled(&chain[1]), &reordered),
            Lineage::Mismatched
        );
        assert_eq!(Lineage::of(&BTreeMap::new(), &ids), Lineage::Unrecorded);
    }
}
