//! A GPU an image must run on, by name and compute capability: what a recipe's `gpus:`,
//! `solve --gpu`, `check --gpu` and `promote --require-gpu` name, resolved once by the
//! matrix (`Matrix::target_gpu`), and what the kernel-coverage audit checks the image's GPU
//! code against. A GPU given by compute capability alone carries its sm (`sm_89`) as its name.
//!
//! Shared vocabulary: depends on version only.

use serde::{Deserialize, Serialize};

use crate::version::ComputeCapability;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetGpu {
    pub name: String,
    pub cc: ComputeCapability,
}

impl TargetGpu {
    /// A GPU known only by its compute capability (`--cc 8.9`).
    pub fn from_cc(cc: ComputeCapability) -> TargetGpu {
        TargetGpu { name: cc.sm(), cc }
    }

    /// Whether the GPU was named (rather than given by its compute capability).
    pub fn named(&self) -> bool {
        !self.name.is_empty() && self.name != self.cc.sm()
    }

    /// How messages name it: `GeForce RTX 3090 (sm_86)`, or `sm_89` alone.
    pub fn label(&self) -> String {
        if self.named() {
            format!("{} ({})", self.name, self.cc.sm())
        } else {
            self.cc.sm()
        }
    }

    /// How a recipe's `gpus:` names it: the GPU's name, or its capability (`8.9`), the two
    /// forms `validate` accepts.
    pub fn recipe_entry(&self) -> String {
        if self.named() {
            self.name.clone()
        } else {
            self.cc.to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_given_by_capability_is_named_by_its_sm_alone() {
        let cc: ComputeCapability = "8.9".parse().unwrap();
        let by_cc = TargetGpu::from_cc(cc);
        assert!(!by_cc.named());
        assert_eq!(by_cc.label(), "sm_89");
        assert_eq!(by_cc.recipe_entry(), "8.9");
        let named = TargetGpu {
            name: "RTX 5090".into(),
            cc: "12.0".parse().unwrap(),
        };
        assert_eq!(named.label(), "RTX 5090 (sm_120)");
        assert_eq!(named.recipe_entry(), "RTX 5090");
        let unnamed = TargetGpu {
            name: String::new(),
            cc,
        };
        assert_eq!(unnamed.label(), "sm_89");
    }
}
