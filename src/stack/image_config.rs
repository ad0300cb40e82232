//! The image configuration: environment, labels and the loader configuration that make
//! the assembled layers one coherent CUDA environment.
//!
//! Exactly one CUDA library directory goes on LD_LIBRARY_PATH (plus the directory the
//! NVIDIA runtime mounts driver libraries into), so no second copy can win the loader race
//! (DESIGN.md, "dynamic loading order decides which copy wins"). NVIDIA_REQUIRE_CUDA comes
//! from the recipe's driver floor: the runtime refuses to start the image on an older
//! driver instead of letting it fail at the first CUDA call.

use std::collections::BTreeMap;

use crate::audit::kernels::{covered_by_all, CoverageGroup};
use crate::labels::{self, StackLabels};
use crate::matrix::{ResolvedRecipe, TorchBuild};
use crate::platform::Platform;
use crate::recipe::{expand_path, Recipe};
use crate::stack::layers::toolkit::layout::ToolkitPaths;
use crate::stack::layers::SYSTEM_BUNDLE;
use crate::version::PtxIsa;

/// Where the NVIDIA container runtime mounts the driver's user-space libraries in images
/// that follow the nvidia/cuda convention.
pub const NVIDIA_DRIVER_LIB_DIR: &str = "/usr/local/nvidia/lib64";

/// The pip constraints file the config layer writes: every locked distribution pinned, so
/// `pip install` in an image built `FROM` this one cannot replace the stack.
pub const PIP_CONSTRAINTS_PATH: &str = "/etc/pip/constraints.txt";

/// The command of an image whose recipe gives neither `entrypoint` nor `cmd`.
pub const DEFAULT_CMD: &str = "python3";

/// Everything the config says, before it becomes an OCI config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackConfig {
    /// The stack's variables first, then the recipe's (`PATH` with the stack's expanded).
    pub env: Vec<(String, String)>,
    pub labels: BTreeMap<String, String>,
    pub entrypoint: Vec<String>,
    /// None: no `Cmd` at all (an entrypoint without `cmd:` runs with no arguments).
    pub cmd: Option<Vec<String>>,
    /// `uid:gid` of the recipe's user: numeric, so a runtime can tell it is not root
    /// without reading the image's /etc/passwd (Kubernetes' `runAsNonRoot` refuses a
    /// named user it cannot check).
    pub user: Option<String>,
    pub working_dir: Option<String>,
    /// `ExposedPorts` keys, `8080/tcp`, sorted.
    pub exposed_ports: Vec<String>,
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
    resolved: &ResolvedRecipe,
    torch_build: Option<&TorchBuild>,
    facts: &StackFacts,
    arch: Platform,
) -> StackConfig {
    let recipe = resolved.recipe();
    // Never claimed at build time: only `cudastack verify` may add io.cudastack.verified.
    let mut labels = stack_labels(recipe, torch_build, facts);
    // The recipe cannot name `io.cudastack.*` (recipe::image), so nothing of ours is lost.
    labels.extend(recipe.labels.clone());
    StackConfig {
        env: with_recipe_env(stack_env(resolved, facts, arch), recipe),
        labels,
        entrypoint: recipe.entrypoint.clone(),
        cmd: image_cmd(recipe),
        user: recipe.user.as_ref().map(|user| user.oci_user()),
        working_dir: recipe.workdir.as_ref().map(ToString::to_string),
        exposed_ports: recipe.expose.iter().map(ToString::to_string).collect(),
    }
}

/// The recipe's `cmd`, else `[python3]` only when there is no entrypoint either: Docker
/// clears an inherited Cmd when ENTRYPOINT is set, because the Cmd would become the
/// entrypoint's arguments (`train.py python3`, which an argparse script refuses).
fn image_cmd(recipe: &Recipe) -> Option<Vec<String>> {
    match (&recipe.cmd, recipe.entrypoint.is_empty()) {
        (Some(cmd), _) => Some(cmd.clone()),
        (None, true) => Some(vec![DEFAULT_CMD.to_string()]),
        (None, false) => None,
    }
}

/// The recipe's variables after the stack's: a name the stack also sets (`LANG`) takes
/// the recipe's value in the stack's place; `PATH` keeps the stack's where `$PATH` is.
fn with_recipe_env(mut env: Vec<(String, String)>, recipe: &Recipe) -> Vec<(String, String)> {
    for (name, value) in &recipe.env {
        let value = match env.iter().find(|(n, _)| n == "PATH") {
            Some((_, stack_path)) if name == "PATH" => expand_path(value, stack_path),
            _ => value.clone(),
        };
        match env.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = value,
            None => env.push((name.clone(), value)),
        }
    }
    env
}

/// The environment: the toolkit on PATH, its one library directory on LD_LIBRARY_PATH,
/// the NVIDIA runtime's switches and the driver floor.
fn stack_env(
    resolved: &ResolvedRecipe,
    facts: &StackFacts,
    arch: Platform,
) -> Vec<(String, String)> {
    let recipe = resolved.recipe();
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
        // pip in a derived image installs within the lock's versions.
        (
            "PIP_CONSTRAINT".to_string(),
            PIP_CONSTRAINTS_PATH.to_string(),
        ),
        // Debian's EXTERNALLY-MANAGED marker guards /usr/lib/python3; pip as root writes
        // /usr/local/lib/python3.X/dist-packages, the site the lock fills and the
        // constraints guard (docs/recipe-image.md, "Extending the image").
        ("PIP_BREAK_SYSTEM_PACKAGES".to_string(), "1".to_string()),
    ];
    if let Some(runtime) = &facts.cuda_runtime {
        env.push(("CUDA_VERSION".to_string(), runtime.clone()));
    }
    if !resolved.ca_files().is_empty() {
        // The recipe's CAs are in the system bundle (stack::layers::trust); pip and
        // requests read their own copy of Mozilla's roots unless told otherwise.
        for name in ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT"] {
            env.push((name.to_string(), SYSTEM_BUNDLE.to_string()));
        }
    }
    if let Some(require) = resolved.nvidia_require_cuda() {
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
    let mut labels = BTreeMap::from([
        (labels::TITLE.to_string(), recipe.name.clone()),
        (labels::CREATED.to_string(), facts.created.clone()),
        (
            labels::DESCRIPTION.to_string(),
            format!(
                "CUDA {} stack built by cudastack from recipe {}",
                recipe.cuda.version, recipe.name
            ),
        ),
    ]);
    StackLabels {
        recipe: Some(recipe.name.clone()),
        recipe_digest: Some(recipe.digest().to_string()),
        driver_floor: Some(recipe.driver_floor.to_string()),
        cuda: Some(
            facts
                .cuda_runtime
                .clone()
                .unwrap_or_else(|| recipe.cuda.version.to_string()),
        ),
        cuda_flavor: Some(format!("{:?}", recipe.cuda.flavor).to_lowercase()),
        python: Some(recipe.python.to_string()),
        cudnn: facts
            .cudnn
            .clone()
            .or_else(|| recipe.cudnn.as_ref().map(|c| c.version.to_string())),
        torch: facts
            .torch
            .clone()
            .or_else(|| torch_build.map(TorchBuild::label)),
        torch_sm: torch_build.map(|build| build.arch_list.iter().map(|cc| cc.sm()).collect()),
        os: facts.os.clone(),
    }
    .write_into(&mut labels);
    labels.extend(recipe.runtime.iter().flat_map(|r| r.labels()));
    labels
}

impl StackConfig {
    /// This config with the labels of what the kernel-coverage audit found: the coverage
    /// groups and the capabilities all of them cover (PTX counting up to `jit`, the ISA the
    /// driver floor reads). An image without GPU code gets neither label (nothing to say,
    /// and `check` then falls back to the torch arch list).
    pub fn with_kernel_labels(mut self, groups: &[CoverageGroup], jit: Option<PtxIsa>) -> Self {
        if groups.is_empty() {
            return self;
        }
        let json = crate::canonical::to_canonical_json(groups).expect("coverage groups serialise");
        self.labels.insert(
            labels::KERNELS.to_string(),
            String::from_utf8(json).expect("JSON is UTF-8"),
        );
        let sm: Vec<String> = covered_by_all(groups, jit)
            .iter()
            .map(|cc| cc.sm())
            .collect();
        if !sm.is_empty() {
            self.labels.insert(labels::SM.to_string(), sm.join(" "));
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::Matrix;
    use std::path::Path;

    fn resolved(recipe: &Recipe) -> ResolvedRecipe {
        ResolvedRecipe::new(Matrix::embedded(), recipe.clone(), Path::new("t.yaml")).unwrap()
    }

    #[test]
    fn one_cuda_library_dir_and_the_driver_dir() {
        let recipe = Recipe::parse("name: t\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"535.104.05\"\ncuda: { version: \"12.1\" }\n", Path::new("t.yaml")).unwrap();
        let config = stack_config(
            &resolved(&recipe),
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
            &resolved(&recipe),
            None,
            &StackFacts::default(),
            Platform::LinuxArm64,
        );
        let arm64_env: BTreeMap<_, _> = arm64.env.into_iter().collect();
        assert_eq!(
            arm64_env["LD_LIBRARY_PATH"],
            "/usr/local/cuda-12.1/targets/sbsa-linux/lib:/usr/local/nvidia/lib64"
        );
        // A library copied into a directory on LD_LIBRARY_PATH would load into the probe's
        // interpreter before its first line: `copy:` may not write there.
        for dir in [&env["LD_LIBRARY_PATH"], &arm64_env["LD_LIBRARY_PATH"]]
            .into_iter()
            .flat_map(|path| path.split(':'))
        {
            let library = format!("{dir}/libz.so.1");
            assert!(
                crate::recipe::copy::check_destination(&library).is_err(),
                "{library}"
            );
        }
        assert_eq!(env["CUDA_HOME"], "/usr/local/cuda-12.1");
        // The floor driver supports 12.2, but the image needs only 12.1.
        assert_eq!(env["NVIDIA_REQUIRE_CUDA"], "cuda>=12.1");
        assert_eq!(config.labels["io.cudastack.driver-floor"], "535.104.05");
        assert!(!config.labels.keys().any(|k| k.contains("verified")));
    }

    #[test]
    fn the_recipe_config_goes_after_the_stack() {
        let recipe = Recipe::parse(
            concat!(
                "name: t\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"535.104.05\"\ncuda: { version: \"12.1\" }\n",
                "env: { PATH: \"/opt/bin:$PATH:/home/trainer/.local/bin\", LANG: en_US.UTF-8, HF_HOME: /data }\n",
                "workdir: /workspace\nuser: { name: trainer, uid: 1000, gid: 2000 }\n",
                "entrypoint: [python3, train.py]\nexpose: [29500]\nlabels: { com.example.team: ml }\n",
            ),
            Path::new("t.yaml"),
        )
        .unwrap();
        let config = stack_config(
            &resolved(&recipe),
            None,
            &StackFacts::default(),
            Platform::LinuxAmd64,
        );
        let env: BTreeMap<_, _> = config.env.iter().cloned().collect();
        assert_eq!(
            env["PATH"],
            "/opt/bin:/usr/local/cuda-12.1/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/home/trainer/.local/bin"
        );
        assert_eq!(env["LANG"], "en_US.UTF-8");
        assert_eq!(env["PIP_CONSTRAINT"], PIP_CONSTRAINTS_PATH);
        assert_eq!(env["PIP_BREAK_SYSTEM_PACKAGES"], "1");
        assert_eq!(config.env.last().unwrap().0, "HF_HOME");
        assert_eq!(config.env.iter().filter(|(n, _)| n == "LANG").count(), 1);
        assert_eq!(config.user.as_deref(), Some("1000:2000"));
        assert_eq!(config.working_dir.as_deref(), Some("/workspace"));
        assert_eq!(config.entrypoint, ["python3", "train.py"]);
        assert_eq!(config.cmd, None, "an entrypoint without `cmd:` gets no Cmd");
        assert_eq!(config.exposed_ports, ["29500/tcp"]);
        assert_eq!(config.labels["com.example.team"], "ml");
        assert_eq!(config.labels["io.cudastack.recipe"], "t");
    }

    #[test]
    fn kernel_labels_record_the_groups_and_what_all_cover() {
        let recipe = Recipe::parse("name: t\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"535.104.05\"\ncuda: { version: \"12.1\" }\n", Path::new("t.yaml")).unwrap();
        let config = stack_config(
            &resolved(&recipe),
            None,
            &StackFacts::default(),
            Platform::LinuxAmd64,
        );
        assert_eq!(config.clone().with_kernel_labels(&[], None), config);
        let group = |sass: &[&str], library: &str| CoverageGroup {
            sass: sass.iter().map(|s| s.parse().unwrap()).collect(),
            ptx: Default::default(),
            libraries: vec![library.into()],
        };
        let groups = [
            group(&["sm_80", "sm_90"], "/usr/lib/libtorch_cuda.so"),
            group(
                &["sm_80", "sm_86", "sm_90", "sm_120"],
                "/usr/lib/libcudnn_ops.so.9",
            ),
        ];
        let labelled = config.with_kernel_labels(&groups, None);
        assert_eq!(labelled.labels[labels::SM], "sm_80 sm_86 sm_90");
        let back: Vec<CoverageGroup> =
            serde_json::from_str(&labelled.labels[labels::KERNELS]).unwrap();
        assert_eq!(back, groups);
        assert!(!labelled.labels[labels::KERNELS].contains(' '));
    }

    /// Docker's rule: an entrypoint without `cmd:` runs with no arguments; `[python3]` is
    /// the command only of an image that has neither.
    #[test]
    fn the_default_cmd_only_without_an_entrypoint() {
        let cmd_of = |keys: &str| {
            let recipe = Recipe::parse(
                &format!("name: t\nbase: {{ debian: bookworm }}\npython: \"3.11\"\ndriver_floor: \"535.104.05\"\ncuda: {{ version: \"12.1\" }}\n{keys}"),
                Path::new("t.yaml"),
            )
            .unwrap();
            stack_config(
                &resolved(&recipe),
                None,
                &StackFacts::default(),
                Platform::LinuxAmd64,
            )
            .cmd
        };
        let words = |w: &[&str]| Some(w.iter().map(ToString::to_string).collect::<Vec<_>>());
        assert_eq!(cmd_of(""), words(&["python3"]));
        assert_eq!(cmd_of("entrypoint: [python3, train.py]\n"), None);
        assert_eq!(
            cmd_of("entrypoint: [python3, train.py]\ncmd: [--steps, \"8\"]\n"),
            words(&["--steps", "8"])
        );
        assert_eq!(cmd_of("cmd: [bash]\n"), words(&["bash"]));
        assert_eq!(cmd_of("entrypoint: [python3]\ncmd: []\n"), words(&[]));
    }
}
