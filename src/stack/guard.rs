//! The start-time guard of a recipe with `runtime: { guard: true }` (docs/guard.md): the
//! config's entrypoint gets the guard in front (`crate::probe::guard`), and its
//! environment the facts the guard compares the node with: what `cudastack check` reads
//! from the image's labels and `NVIDIA_REQUIRE_CUDA`, taken from the same values the
//! labels are written from, plus the matrix's driver -> CUDA table that `check` consults,
//! since the guard runs where there is no matrix. Made after the audit, as the kernel
//! coverage is one of the facts. The guard's texts are `check`'s; tests/guard_start.rs
//! compares the two on planted nodes.

use serde::Serialize;

use crate::audit::kernels::CoverageGroup;
use crate::matrix::{Matrix, ResolvedRecipe, TorchBuild};
use crate::probe::guard::{guarded_entrypoint, GUARD_EXPECT_ENV};
use crate::stack::image_config::StackConfig;
use crate::version::PtxIsa;

/// What the guard compares the node with, as `CUDASTACK_GUARD_EXPECT` holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GuardFacts {
    /// The recipe's driver floor (`io.cudastack.driver-floor`).
    pub floor: String,
    /// `NVIDIA_REQUIRE_CUDA`'s version and the oldest driver that supports it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub require_cuda: Option<RequiredCuda>,
    /// Every CUDA release the matrix knows with its oldest driver: the newest a driver
    /// reaches is its CUDA ceiling, and the PTX ISA that release reads is its JIT's limit.
    pub cuda_lines: Vec<CudaLine>,
    /// What a GPU needs code for: the audit's groups, else torch's arch list, else CUDA's.
    pub gpu_rule: GpuRule,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RequiredCuda {
    pub cuda: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_driver: Option<String>,
    /// The oldest driver the CUDA major's minor-version compatibility runs it on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub minor_compat_driver: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CudaLine {
    pub min_driver: String,
    pub cuda: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ptx_isa: Option<String>,
}

/// The same choice `check` makes: the kernels label when the image has one, else the
/// torch arch list, else the archs of the required CUDA; empty when none applies.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GpuRule {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernels: Option<Vec<GroupFacts>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub torch_sm: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuda: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuda_archs: Option<Vec<String>>,
}

/// One coverage group: its targets to decide with, and the texts `check` prints of it,
/// made by the same functions (file names, not the paths, keep the variable short).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupFacts {
    pub names: String,
    pub sass: Vec<String>,
    pub ptx: Vec<PtxFacts>,
    pub sass_text: String,
    pub ptx_text: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PtxFacts {
    pub arch: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub isa: Option<String>,
}

impl GuardFacts {
    /// The facts of an image of `resolved` with `torch_build` whose audit found `groups`.
    pub fn new(
        matrix: &Matrix,
        resolved: &ResolvedRecipe,
        torch_build: Option<&TorchBuild>,
        groups: &[CoverageGroup],
    ) -> Self {
        let require = resolved.nvidia_require_cuda();
        Self {
            floor: resolved.recipe().driver_floor.to_string(),
            require_cuda: require.map(|cuda| RequiredCuda {
                cuda: cuda.to_string(),
                min_driver: matrix.min_driver_for(&cuda).map(ToString::to_string),
                minor_compat_driver: matrix
                    .minor_compat_floor(cuda.major)
                    .map(|floor| floor.min_driver.to_string()),
            }),
            cuda_lines: matrix
                .cuda_releases
                .iter()
                .map(|release| CudaLine {
                    min_driver: release.min_driver.to_string(),
                    cuda: release.version.line().to_string(),
                    ptx_isa: PtxIsa::newest_for(release.version.line()).map(|i| i.to_string()),
                })
                .collect(),
            gpu_rule: gpu_rule(matrix, require, torch_build, groups),
        }
    }
}

fn gpu_rule(
    matrix: &Matrix,
    require: Option<crate::version::CudaVersion>,
    torch_build: Option<&TorchBuild>,
    groups: &[CoverageGroup],
) -> GpuRule {
    let sm_words = |archs: &[crate::version::ComputeCapability]| {
        Some(archs.iter().map(|cc| cc.sm()).collect::<Vec<_>>())
    };
    let torch_sm = torch_build.map(|build| build.arch_list.as_slice());
    match (groups.is_empty(), torch_sm, require) {
        (false, _, _) => GpuRule {
            kernels: Some(groups.iter().map(group_facts).collect()),
            ..GpuRule::default()
        },
        (true, Some(archs), _) if !archs.is_empty() => GpuRule {
            torch_sm: sm_words(archs),
            ..GpuRule::default()
        },
        (true, _, Some(cuda)) => GpuRule {
            cuda: Some(cuda.to_string()),
            cuda_archs: sm_words(&matrix.cuda_archs(cuda)),
            ..GpuRule::default()
        },
        _ => GpuRule::default(),
    }
}

fn group_facts(group: &CoverageGroup) -> GroupFacts {
    GroupFacts {
        names: group.library_names().join(", "),
        sass: group.sass.iter().map(ToString::to_string).collect(),
        ptx: group
            .ptx
            .iter()
            .map(|ptx| PtxFacts {
                arch: ptx.arch.to_string(),
                isa: ptx.isa.map(|isa| isa.to_string()),
            })
            .collect(),
        sass_text: group.sass_text(),
        ptx_text: group.ptx_text(),
    }
}

impl StackConfig {
    /// This config with the start-time guard in front of its entrypoint and its facts in
    /// the environment, when the recipe asks for it (`runtime: { guard: true }`).
    pub fn with_start_guard(
        mut self,
        resolved: &ResolvedRecipe,
        torch_build: Option<&TorchBuild>,
        groups: &[CoverageGroup],
    ) -> Self {
        let asked = resolved.recipe().runtime.as_ref().is_some_and(|r| r.guard);
        if !asked {
            return self;
        }
        let facts = GuardFacts::new(Matrix::embedded(), resolved, torch_build, groups);
        let json = crate::canonical::to_canonical_json(&facts).expect("guard facts serialise");
        self.env.push((
            GUARD_EXPECT_ENV.to_string(),
            String::from_utf8(json).expect("JSON is UTF-8"),
        ));
        self.entrypoint = guarded_entrypoint(&self.entrypoint);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::Platform;
    use crate::recipe::Recipe;
    use crate::stack::image_config::{stack_config, StackFacts};
    use std::path::Path;

    fn config(extra: &str) -> (ResolvedRecipe, StackConfig) {
        let text = format!("name: t\nbase: {{ debian: bookworm }}\npython: \"3.11\"\ndriver_floor: \"535.104.05\"\ncuda: {{ version: \"12.1\" }}\n{extra}");
        let recipe = Recipe::parse(&text, Path::new("t.yaml")).unwrap();
        let resolved =
            ResolvedRecipe::new(Matrix::embedded(), recipe, Path::new("t.yaml")).unwrap();
        let config = stack_config(
            &resolved,
            None,
            &StackFacts::default(),
            Platform::LinuxAmd64,
        );
        (resolved, config)
    }

    #[test]
    fn without_the_key_nothing_changes() {
        let (resolved, plain) = config("entrypoint: [python3, train.py]\n");
        assert_eq!(plain.clone().with_start_guard(&resolved, None, &[]), plain);
    }

    #[test]
    fn the_guard_goes_in_front_of_the_entrypoint_with_its_facts() {
        let (resolved, plain) = config(
            "entrypoint: [python3, train.py]\ncmd: [--steps, \"8\"]\nruntime: { guard: true }\n",
        );
        let guarded = plain.clone().with_start_guard(&resolved, None, &[]);
        assert_eq!(
            guarded.entrypoint,
            [
                "/usr/bin/python3",
                "-I",
                "-S",
                "/opt/cudastack/guard.py",
                "--",
                "python3",
                "train.py"
            ]
        );
        assert_eq!(
            guarded.cmd, plain.cmd,
            "the command stays the entrypoint's arguments"
        );
        let (name, json) = guarded.env.last().unwrap();
        assert_eq!(name, GUARD_EXPECT_ENV);
        let facts: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(facts["floor"], "535.104.05");
        assert_eq!(facts["require_cuda"]["cuda"], "12.1");
        // No audit groups and no torch: the archs CUDA 12.1 generates code for.
        assert_eq!(facts["gpu_rule"]["cuda"], "12.1");
        assert!(facts["gpu_rule"]["cuda_archs"].as_array().unwrap().len() > 3);
        let line = facts["cuda_lines"]
            .as_array()
            .unwrap()
            .iter()
            .find(|line| line["cuda"] == "12.1")
            .unwrap();
        assert_eq!(line["ptx_isa"], "8.1");
    }

    /// No entrypoint: the guard alone, and the default `python3` command is what it starts.
    #[test]
    fn an_image_without_entrypoint_guards_its_command() {
        let (resolved, plain) = config("runtime: { guard: true }\n");
        let guarded = plain.with_start_guard(&resolved, None, &[]);
        assert_eq!(guarded.entrypoint.last().unwrap(), "--");
        assert_eq!(guarded.cmd, Some(vec!["python3".to_string()]));
    }

    #[test]
    fn the_audit_groups_win_and_carry_check_texts() {
        let (resolved, plain) = config("runtime: { guard: true }\n");
        let group = CoverageGroup {
            sass: ["sm_80", "sm_90a"]
                .iter()
                .map(|s| s.parse().unwrap())
                .collect(),
            ptx: Default::default(),
            libraries: vec!["/usr/lib/libcudnn_ops.so.9".into()],
        };
        let guarded = plain.with_start_guard(&resolved, None, &[group]);
        let facts: serde_json::Value =
            serde_json::from_str(&guarded.env.last().unwrap().1).unwrap();
        let kernels = &facts["gpu_rule"]["kernels"][0];
        assert_eq!(kernels["names"], "libcudnn_ops.so.9");
        assert_eq!(kernels["sass"], serde_json::json!(["sm_80", "sm_90a"]));
        assert_eq!(kernels["ptx_text"], "-");
        assert!(facts["gpu_rule"].get("cuda_archs").is_none());
    }
}
