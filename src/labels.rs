//! The image's labels: every key cudastack writes into an image's config or reads back from
//! one is spelled here and nowhere else, so a writer and its readers cannot drift apart.
//!
//! [`StackLabels`] is what the build says about the stack it assembled (written by the
//! stack's image config, read by `check`, `inspect` and promotion); the other keys are
//! written by one stage each and read by others: the kernel-coverage audit, the build's
//! source-built wheels, the recipe's runtime settings, and verification.
//!
//! Shared vocabulary: depends on std only.

use std::collections::BTreeMap;

/// The recipe's name, as OCI's title.
pub const TITLE: &str = "org.opencontainers.image.title";
/// When the image was built (the recipe's `source_date_epoch`), RFC 3339; also the annotation
/// of a stored verification report (when it ran).
pub const CREATED: &str = "org.opencontainers.image.created";
pub const DESCRIPTION: &str = "org.opencontainers.image.description";

pub const RECIPE: &str = "io.cudastack.recipe";
pub const RECIPE_DIGEST: &str = "io.cudastack.recipe.digest";
pub const DRIVER_FLOOR: &str = "io.cudastack.driver-floor";
pub const CUDA: &str = "io.cudastack.cuda";
pub const CUDA_FLAVOR: &str = "io.cudastack.cuda.flavor";
pub const PYTHON: &str = "io.cudastack.python";
pub const CUDNN: &str = "io.cudastack.cudnn";
pub const TORCH: &str = "io.cudastack.torch";
/// The compute capabilities of torch's own arch list, space-separated `sm_XY`.
pub const TORCH_SM: &str = "io.cudastack.torch.sm";
pub const OS: &str = "io.cudastack.os";

/// The coverage groups of the kernel-coverage audit, as canonical JSON.
pub const KERNELS: &str = "io.cudastack.kernels";
/// The compute capabilities every library with GPU code covers, with SASS or with PTX the
/// driver floor JIT-compiles: `sm_80 sm_86 sm_90`.
pub const SM: &str = "io.cudastack.sm";

/// A wheel compiled from a `build:` sdist: `io.cudastack.built.<name>` = `<version> <wheel
/// file> <sha256>`.
pub const BUILT_PREFIX: &str = "io.cudastack.built.";

/// The OCI chain ID of the image's layers as cudastack built them. An image built
/// FROM a cudastack image by another tool keeps the labels but has more layers: this says
/// which of them the labels describe.
pub const LAYERS: &str = "io.cudastack.layers";

/// Where the config layer puts the image's lock (relative to the root, as in a layer's tar).
pub const LOCK_IN_IMAGE: &str = "usr/share/cudastack/lock.json";

/// The `created_by` of the history entry of each layer cudastack writes (`cudastack torch
/// layer`): how a reader finds one of them in an image another tool built on top.
pub fn layer_created_by(name: &str) -> String {
    format!("cudastack {name} layer")
}

/// The recipe's /dev/shm size, in bytes.
pub const RUNTIME_SHM_SIZE: &str = "io.cudastack.runtime.shm-size";
/// The recipe's ulimits: `io.cudastack.runtime.ulimit.memlock` = `-1`.
pub const RUNTIME_ULIMIT_PREFIX: &str = "io.cudastack.runtime.ulimit.";

/// Verification: the verdict, the matrix rows (JSON), the driver and GPUs it ran on, and
/// the digest of the report it came from.
/// On the image of one step of a load into Docker (src/engine/load.rs): the process that
/// loaded it, as `engine::run::RunOwner` writes it. The step goes once the image is in;
/// one left by a killed process is removed by the next load that can tell it is dead.
pub const LOAD_STEP_OWNER: &str = "io.cudastack.load-step.owner";
/// On a load step's image: Unix time after which any load removes it, whoever its owner
/// (one a process in another PID namespace or on another host left).
pub const LOAD_STEP_UNTIL: &str = "io.cudastack.load-step.until";
/// On a load step's image: unique to the load, so two loads of one process never share
/// (and remove) each other's steps.
pub const LOAD_STEP_NONCE: &str = "io.cudastack.load-step.nonce";
pub const VERIFIED: &str = "io.cudastack.verified";
pub const VERIFIED_MATRIX: &str = "io.cudastack.verified.matrix";
pub const VERIFIED_DRIVER: &str = "io.cudastack.verified.driver";
pub const VERIFIED_GPUS: &str = "io.cudastack.verified.gpus";
pub const VERIFIED_REPORT: &str = "io.cudastack.verified.report";
/// The annotation of a stored verification report: `verified`, `partial` or `failed`.
pub const VERDICT: &str = "io.cudastack.verdict";

/// What the build says about the stack it assembled. Each field is one label; `None` (or an
/// empty list) is a label the image does not carry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StackLabels {
    pub recipe: Option<String>,
    pub recipe_digest: Option<String>,
    pub driver_floor: Option<String>,
    pub cuda: Option<String>,
    pub cuda_flavor: Option<String>,
    pub python: Option<String>,
    pub cudnn: Option<String>,
    pub torch: Option<String>,
    /// `sm_80`, `sm_90`, ...: torch's arch list (present and empty for a torch without one).
    pub torch_sm: Option<Vec<String>>,
    pub os: Option<String>,
}

impl StackLabels {
    fn fields(&self) -> [(&'static str, Option<&String>); 9] {
        [
            (RECIPE, self.recipe.as_ref()),
            (RECIPE_DIGEST, self.recipe_digest.as_ref()),
            (DRIVER_FLOOR, self.driver_floor.as_ref()),
            (CUDA, self.cuda.as_ref()),
            (CUDA_FLAVOR, self.cuda_flavor.as_ref()),
            (PYTHON, self.python.as_ref()),
            (CUDNN, self.cudnn.as_ref()),
            (TORCH, self.torch.as_ref()),
            (OS, self.os.as_ref()),
        ]
    }

    /// Add these labels to `labels`.
    pub fn write_into(&self, labels: &mut BTreeMap<String, String>) {
        for (key, value) in self.fields() {
            if let Some(value) = value {
                labels.insert(key.to_string(), value.clone());
            }
        }
        if let Some(list) = &self.torch_sm {
            labels.insert(TORCH_SM.to_string(), list.join(" "));
        }
    }

    /// The stack labels among an image's `labels` (others are ignored).
    pub fn read(labels: &BTreeMap<String, String>) -> Self {
        let label = |key: &str| labels.get(key).cloned();
        StackLabels {
            recipe: label(RECIPE),
            recipe_digest: label(RECIPE_DIGEST),
            driver_floor: label(DRIVER_FLOOR),
            cuda: label(CUDA),
            cuda_flavor: label(CUDA_FLAVOR),
            python: label(PYTHON),
            cudnn: label(CUDNN),
            torch: label(TORCH),
            torch_sm: label(TORCH_SM)
                .map(|list| list.split_whitespace().map(str::to_string).collect()),
            os: label(OS),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_written_is_read_back() {
        let written = StackLabels {
            recipe: Some("team".into()),
            recipe_digest: Some("sha256:00".into()),
            driver_floor: Some("535.104.05".into()),
            cuda: Some("12.1.105".into()),
            cuda_flavor: Some("runtime".into()),
            python: Some("3.11".into()),
            cudnn: None,
            torch: Some("2.4.1+cu121".into()),
            torch_sm: Some(vec!["sm_80".into(), "sm_90".into()]),
            os: Some("debian 12".into()),
        };
        let mut labels = BTreeMap::from([(TITLE.to_string(), "team".to_string())]);
        written.write_into(&mut labels);
        assert_eq!(labels[TORCH_SM], "sm_80 sm_90");
        assert!(!labels.contains_key(CUDNN), "an absent fact is no label");
        assert_eq!(StackLabels::read(&labels), written);
    }
}
