//! The image configuration: environment, labels and the loader configuration that make
//! the assembled layers one coherent CUDA environment.
//!
//! Exactly one CUDA library directory goes on LD_LIBRARY_PATH (plus the directory the
//! NVIDIA runtime mounts driver libraries into), so no second copy can win the loader race
//! (DESIGN.md, "dynamic loading order decides which copy wins"). NVIDIA_REQUIRE_CUDA comes
//! from the recipe's driver floor: the runtime refuses to start the image on an older
//! driver instead of letting it fail at the first CUDA call.

use std::collections::BTreeMap;

use crate::matrix::validate::nvidia_require_cuda;
use crate::matrix::{Matrix, TorchBuild};
use crate::platform::Platform;
use crate::recipe::Recipe;
use crate::version::CudaVersion;

/// Where the NVIDIA container runtime mounts the driver's user-space libraries in images
/// that follow the nvidia/cuda convention.
pub const NVIDIA_DRIVER_LIB_DIR: &str = "/usr/local/nvidia/lib64";

/// Paths of the toolkit inside the image, laid out like NVIDIA's installers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolkitPaths {
    pub cuda: CudaVersion,
    pub arch: Platform,
}

impl ToolkitPaths {
    pub fn new(cuda: CudaVersion, arch: Platform) -> Self {
        Self { cuda, arch }
    }
    /// The `targets/` directory NVIDIA's installers use: `x86_64-linux`, and `sbsa-linux`
    /// for arm64 servers (the CUDA packages for Grace/GH200/Jetson Thor).
    pub fn target(&self) -> &'static str {
        match self.arch {
            Platform::LinuxAmd64 => "x86_64-linux",
            Platform::LinuxArm64 => "sbsa-linux",
        }
    }
    /// `/usr/local/cuda-12.1`
    pub fn home(&self) -> String {
        format!("/usr/local/cuda-{}", self.cuda.line())
    }
    /// `/usr/local/cuda-12.1/targets/x86_64-linux/lib`: the one CUDA library directory.
    pub fn lib_dir(&self) -> String {
        format!("{}/targets/{}/lib", self.home(), self.target())
    }
    pub fn include_dir(&self) -> String {
        format!("{}/targets/{}/include", self.home(), self.target())
    }
    pub fn bin_dir(&self) -> String {
        format!("{}/bin", self.home())
    }
}

/// Everything the config says, before it becomes an OCI config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackConfig {
    pub env: Vec<(String, String)>,
    pub labels: BTreeMap<String, String>,
    pub cmd: Vec<String>,
}

/// Facts about the assembled stack the labels record.
#[derive(Debug, Clone, Default)]
pub struct StackFacts {
    /// Exact CUDA runtime installed (`12.1.105`).
    pub cuda_runtime: Option<String>,
    pub cudnn: Option<String>,
    pub torch: Option<String>,
    pub os: Option<String>,
    pub created: String,
}

pub fn stack_config(
    matrix: &Matrix,
    recipe: &Recipe,
    torch_build: Option<&TorchBuild>,
    facts: &StackFacts,
    arch: Platform,
) -> StackConfig {
    // Never claimed at build time: only `cudastack verify` may add io.cudastack.verified.
    StackConfig {
        env: stack_env(matrix, recipe, facts, arch),
        labels: stack_labels(recipe, torch_build, facts),
        cmd: vec!["python3".to_string()],
    }
}

/// The environment: the toolkit on PATH, its one library directory on LD_LIBRARY_PATH,
/// the NVIDIA runtime's switches and the driver floor.
fn stack_env(
    matrix: &Matrix,
    recipe: &Recipe,
    facts: &StackFacts,
    arch: Platform,
) -> Vec<(String, String)> {
    let paths = ToolkitPaths::new(recipe.cuda.version, arch);
    let mut env = vec![
        (
            "PATH".to_string(),
            format!(
                "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                paths.bin_dir()
            ),
        ),
        ("CUDA_HOME".to_string(), paths.home()),
        (
            "LD_LIBRARY_PATH".to_string(),
            format!("{}:{NVIDIA_DRIVER_LIB_DIR}", paths.lib_dir()),
        ),
        ("NVIDIA_VISIBLE_DEVICES".to_string(), "all".to_string()),
        (
            "NVIDIA_DRIVER_CAPABILITIES".to_string(),
            "compute,utility".to_string(),
        ),
        ("LANG".to_string(), "C.UTF-8".to_string()),
    ];
    if let Some(runtime) = &facts.cuda_runtime {
        env.push(("CUDA_VERSION".to_string(), runtime.clone()));
    }
    if let Some(require) = nvidia_require_cuda(matrix, recipe) {
        env.push((
            "NVIDIA_REQUIRE_CUDA".to_string(),
            format!("cuda>={require}"),
        ));
    }
    env
}

/// The OCI annotations-style labels and cudastack's own (`io.cudastack.*`).
fn stack_labels(
    recipe: &Recipe,
    torch_build: Option<&TorchBuild>,
    facts: &StackFacts,
) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut label = |key: &str, value: String| {
        labels.insert(key.to_string(), value);
    };
    label("org.opencontainers.image.title", recipe.name.clone());
    label("org.opencontainers.image.created", facts.created.clone());
    label(
        "org.opencontainers.image.description",
        format!(
            "CUDA {} stack built by cudastack from recipe {}",
            recipe.cuda.version, recipe.name
        ),
    );
    label("io.cudastack.recipe", recipe.name.clone());
    label("io.cudastack.recipe.digest", recipe.digest().to_string());
    label("io.cudastack.driver-floor", recipe.driver_floor.to_string());
    label(
        "io.cudastack.cuda",
        facts
            .cuda_runtime
            .clone()
            .unwrap_or_else(|| recipe.cuda.version.to_string()),
    );
    label(
        "io.cudastack.cuda.flavor",
        format!("{:?}", recipe.cuda.flavor).to_lowercase(),
    );
    label("io.cudastack.python", recipe.python.to_string());
    if let Some(cudnn) = facts
        .cudnn
        .clone()
        .or_else(|| recipe.cudnn.as_ref().map(|c| c.version.to_string()))
    {
        label("io.cudastack.cudnn", cudnn);
    }
    if let Some(torch) = facts
        .torch
        .clone()
        .or_else(|| torch_build.map(TorchBuild::label))
    {
        label("io.cudastack.torch", torch);
    }
    if let Some(build) = torch_build {
        let archs: Vec<String> = build.arch_list.iter().map(|cc| cc.sm()).collect();
        label("io.cudastack.torch.sm", archs.join(" "));
    }
    if let Some(os) = &facts.os {
        label("io.cudastack.os", os.clone());
    }
    labels
}

/// `/etc/ld.so.conf.d/` entry so `ldconfig` and programs without LD_LIBRARY_PATH find the
/// one toolkit library directory.
pub fn ld_so_conf(paths: &ToolkitPaths) -> (String, String) {
    (
        format!("etc/ld.so.conf.d/000-cuda-{}.conf", paths.cuda.line()),
        format!("{}\n", paths.lib_dir()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn one_cuda_library_dir_and_the_driver_dir() {
        let recipe = Recipe::parse("name: t\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"535.104.05\"\ncuda: { version: \"12.1\" }\n", Path::new("t.yaml")).unwrap();
        let config = stack_config(
            Matrix::embedded(),
            &recipe,
            None,
            &StackFacts {
                created: "2024-10-01T00:00:00Z".into(),
                ..Default::default()
            },
            Platform::LinuxAmd64,
        );
        let env: BTreeMap<_, _> = config.env.into_iter().collect();
        assert_eq!(
            env["LD_LIBRARY_PATH"],
            "/usr/local/cuda-12.1/targets/x86_64-linux/lib:/usr/local/nvidia/lib64"
        );
        let arm64 = stack_config(
            Matrix::embedded(),
            &recipe,
            None,
            &StackFacts::default(),
            Platform::LinuxArm64,
        );
        let arm64_env: BTreeMap<_, _> = arm64.env.into_iter().collect();
        assert_eq!(
            arm64_env["LD_LIBRARY_PATH"],
            "/usr/local/cuda-12.1/targets/sbsa-linux/lib:/usr/local/nvidia/lib64"
        );
        assert_eq!(env["CUDA_HOME"], "/usr/local/cuda-12.1");
        // The floor driver supports 12.2, but the image needs only 12.1.
        assert_eq!(env["NVIDIA_REQUIRE_CUDA"], "cuda>=12.1");
        assert_eq!(config.labels["io.cudastack.driver-floor"], "535.104.05");
        assert!(!config.labels.keys().any(|k| k.contains("verified")));
    }
}
