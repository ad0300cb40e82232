//! What the probe should find: written at build time from the recipe, the lock and the
//! matrix into EXPECT_PATH, so the probe needs no arguments in any runner. The assembler
//! computes it from the stack it builds (`stack::layers::config::expectations`); this
//! module only defines the document.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expectations {
    pub recipe: String,
    /// `3.11`
    pub python: String,
    /// The torch release (`2.4.1`), when the image has torch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch: Option<String>,
    /// The CUDA line torch was built for (`12.1`, what `torch.version.cuda` says).
    pub cuda: String,
    /// The exact CUDA runtime installed (`12.1.105`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_runtime: Option<String>,
    /// The cuDNN release installed (`9.1.0.70`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cudnn: Option<String>,
    pub driver_floor: String,
    pub minor_version_compat: bool,
    /// The arch list of the torch build (`sm_50` ...), from the matrix.
    #[serde(default)]
    pub sm: Vec<String>,
    /// The one CUDA library directory every CUDA library must load from.
    pub cuda_lib_dir: String,
    /// The archs the recipe's CUDA toolkit generates code for (`sm_50` ... `sm_90` for
    /// 12.4), from the matrix: for an image without torch, what its libraries can carry,
    /// so the native probe's device.kernels can say a GPU is too new (or too old) for it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cuda_archs: Vec<String>,
    /// The import names of the packages the recipe's `build:` compiled from source
    /// : the static level imports each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<String>,
}

impl Expectations {
    /// Canonical bytes (sorted keys), so the config layer is deterministic.
    pub fn to_json(&self) -> Vec<u8> {
        let mut bytes = crate::canonical::to_canonical_json(self).expect("serialises");
        bytes.push(b'\n');
        bytes
    }
}

#[cfg(test)]
mod tests {
    use crate::version::CudaVersion;

    fn archs(cuda: &str) -> Vec<String> {
        let cuda: CudaVersion = cuda.parse().unwrap();
        crate::matrix::Matrix::embedded()
            .cuda_archs(cuda)
            .iter()
            .map(|cc| cc.sm())
            .collect()
    }

    /// From data/nvidia.yaml's ptxas rows: 12.4 knows nothing newer than Hopper, 12.8 adds
    /// Blackwell, 13.0 drops Maxwell to Volta and adds Thor (sm_110).
    #[test]
    fn cuda_archs_follow_the_toolkit_release() {
        let v124 = archs("12.4");
        assert_eq!(v124.first().unwrap(), "sm_50");
        assert_eq!(v124.last().unwrap(), "sm_90");
        assert!(!v124.contains(&"sm_37".to_string()));
        let v128 = archs("12.8");
        assert!(v128.contains(&"sm_100".to_string()) && v128.contains(&"sm_120".to_string()));
        assert!(!v128.contains(&"sm_103".to_string()));
        let v130 = archs("13.0");
        assert_eq!(v130.first().unwrap(), "sm_75");
        assert!(v130.contains(&"sm_110".to_string()));
        assert!(!v130.contains(&"sm_70".to_string()));
    }
}
