//! The start-time guard (probe/guard.py, `runtime: { guard: true }`, docs/guard.md) on a
//! planted host: a driver version file in /proc's format and an NVML stub, a real shared
//! library compiled here with `cc` and found through LD_LIBRARY_PATH. The guard runs as
//! the image's entrypoint says, with the facts the build writes for a recipe (the config
//! of `stack_config` with the audit's kernel groups), and each of its answers is compared
//! with `cudastack check`'s for the same node: a no prints check's findings word for word,
//! so the two cannot drift.

use crate::gate;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use cudastack::audit::kernels::CoverageGroup;
use cudastack::matrix::{Matrix, ResolvedRecipe};
use cudastack::platform::Platform;
use cudastack::probe::guard::{GUARD_EXPECT_ENV, GUARD_PATH, GUARD_SOURCE};
use cudastack::probe::PROBE_INTERPRETER;
use cudastack::recipe::Recipe;
use cudastack::stack::image_config::{stack_config, StackConfig, StackFacts};
use cudastack::verify::check::{check, Fit, ImageClaims, Node, NodeGpu};

/// NVML's entry points the guard calls, answering from STUB_DRIVER and STUB_GPUS
/// (`NAME=MAJOR.MINOR;...`).
const NVML_STUB: &str = r#"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *gpu(unsigned index) {
    const char *list = getenv("STUB_GPUS");
    for (; list && *list; index--) {
        if (index == 0) return list;
        list = strchr(list, ';');
        if (list) list++;
    }
    return NULL;
}
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlSystemGetDriverVersion(char *version, unsigned length) {
    snprintf(version, length, "%s", getenv("STUB_DRIVER") ? getenv("STUB_DRIVER") : "");
    return 0;
}
int nvmlDeviceGetCount_v2(unsigned *count) {
    for (*count = 0; gpu(*count); (*count)++) {}
    return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned index, void **device) {
    *device = (void *)(uintptr_t)(index + 1);
    return gpu(index) ? 0 : 2;
}
int nvmlDeviceGetName(void *device, char *name, unsigned length) {
    const char *entry = gpu((unsigned)(uintptr_t)device - 1);
    size_t size = strcspn(entry, "=");
    snprintf(name, length, "%.*s", (int)size, entry);
    return 0;
}
int nvmlDeviceGetCudaComputeCapability(void *device, int *major, int *minor) {
    const char *entry = gpu((unsigned)(uintptr_t)device - 1);
    return sscanf(strchr(entry, '=') + 1, "%d.%d", major, minor) == 2 ? 0 : 1;
}
"#;

/// What the host has: python3 to run the guard, cc to build the stub.
fn skip_without_tools() -> bool {
    for (tool, why) in [
        ("python3", "the guard is a Python script"),
        ("cc", "the NVML stub is compiled at test time"),
    ] {
        let found = Command::new(tool).arg("--version").output();
        if !found.is_ok_and(|output| output.status.success()) {
            gate::skip(tool, format!("{tool} is not installed; {why}"));
            return true;
        }
    }
    false
}

/// A planted host: `root/proc/driver/nvidia/version` and `root/nvml/libnvidia-ml.so.1`, each
/// planted or not, and the guard's source where the image has it.
struct Host {
    dir: tempfile::TempDir,
}

impl Host {
    fn new() -> Self {
        let host = Host {
            dir: tempfile::tempdir().unwrap(),
        };
        std::fs::write(host.guard(), GUARD_SOURCE).unwrap();
        host
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn guard(&self) -> PathBuf {
        self.root().join("guard.py")
    }

    fn marker(&self) -> PathBuf {
        self.root().join("started")
    }

    /// `/proc/driver/nvidia/version` as the open kernel module writes it.
    fn with_proc_driver(self, driver: &str) -> Self {
        let dir = self.root().join("proc/driver/nvidia");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("version"), format!("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {driver}  Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Mar  5 22:21:54 UTC 2024\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")).unwrap();
        self
    }

    fn with_nvml(self) -> Self {
        let dir = self.root().join("nvml");
        std::fs::create_dir_all(&dir).unwrap();
        let source = dir.join("stub.c");
        std::fs::write(&source, NVML_STUB).unwrap();
        let built = Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-o"])
            .arg(dir.join("libnvidia-ml.so.1"))
            .arg(&source)
            .output()
            .unwrap();
        assert!(built.status.success(), "{}", text(&built));
        self
    }

    /// The image's entrypoint run here: the guard at its planted path, by the image's
    /// interpreter when this host has it, with the marker's path as the command.
    fn start(&self, config: &StackConfig, node: &[(&str, &str)]) -> Output {
        let mut words: Vec<String> = config.entrypoint.clone();
        for word in &mut words {
            if word == GUARD_PATH {
                *word = self.guard().display().to_string();
            } else if word == PROBE_INTERPRETER && !Path::new(PROBE_INTERPRETER).exists() {
                *word = "python3".to_string();
            }
        }
        // The recipe's entrypoint writes a marker at the path it is given.
        words.push(self.marker().display().to_string());
        let mut command = Command::new(&words[0]);
        command
            .args(&words[1..])
            .env_remove("CUDASTACK_GUARD")
            .env("CUDASTACK_GUARD_TEST_ROOT", self.root())
            .env("LD_LIBRARY_PATH", self.root().join("nvml"));
        for (name, value) in &config.env {
            if name == GUARD_EXPECT_ENV {
                command.env(name, value);
            }
        }
        for (name, value) in node {
            command.env(name, value);
        }
        command.output().unwrap()
    }

    fn started(&self) -> bool {
        self.marker().exists()
    }
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A recipe's config as the build makes it, with the guard in front of an entrypoint that
/// writes a marker at the path it is given: `groups` are what the audit
/// found (none: the archs CUDA 12.1 generates code for decide, as in `check`).
fn guarded_config(groups: &[CoverageGroup]) -> StackConfig {
    let text = "name: t\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"535.104.05\"\ncuda: { version: \"12.1\" }\nentrypoint: [sh, -c, 'echo started > \"$0\"']\nruntime: { guard: true }\n";
    let recipe = Recipe::parse(text, Path::new("t.yaml")).unwrap();
    let resolved = ResolvedRecipe::new(Matrix::embedded(), recipe, Path::new("t.yaml")).unwrap();
    stack_config(
        &resolved,
        None,
        &StackFacts::default(),
        Platform::LinuxAmd64,
    )
    .with_kernel_labels(groups, resolved.jit_ptx_isa())
    .with_start_guard(&resolved, None, groups)
}

/// cuDNN-like code: SASS up to sm_90 and compute_90 PTX written in ISA 8.8 (CUDA 12.9),
/// which an R550 driver (CUDA 12.4, ISA 8.4) cannot JIT.
fn groups() -> Vec<CoverageGroup> {
    let group = |sass: &[&str], ptx: &str, library: &str| {
        let json = format!(
            r#"{{"libraries":["{library}"],"ptx":[{ptx}],"sass":{}}}"#,
            serde_json::to_string(sass).unwrap()
        );
        serde_json::from_str::<CoverageGroup>(&json).unwrap()
    };
    vec![
        group(
            &["sm_80", "sm_86"],
            r#"{"arch":"sm_90","isa":"8.8"}"#,
            "/usr/local/lib/python3.11/dist-packages/nvidia/cudnn/lib/libcudnn_engines_precompiled.so.9",
        ),
        group(
            &["sm_80", "sm_86", "sm_90", "sm_90a"],
            "",
            "/usr/local/lib/python3.11/dist-packages/torch/lib/libtorch_cuda.so",
        ),
    ]
}

/// `check`'s answer for the node the stub plants, from the config's labels and env as
/// `check` reads an image, and its failures printed as `cudastack check` prints them.
fn check_says(
    config: &StackConfig,
    driver: Option<&str>,
    gpus: &[(&str, &str)],
) -> (Fit, Vec<String>) {
    let labels: BTreeMap<String, String> = config.labels.clone();
    let env: BTreeMap<String, String> = config.env.iter().cloned().collect();
    let claims = ImageClaims::from_labels_and_env(&labels, &env, &[]);
    let node = Node {
        driver: driver.map(|d| d.parse().unwrap()),
        gpus: gpus
            .iter()
            .map(|(name, cc)| NodeGpu {
                name: name.to_string(),
                compute_capability: cc.parse().unwrap(),
            })
            .collect(),
    };
    let answer = check(Matrix::embedded(), &claims, &node);
    let lines = answer
        .findings
        .iter()
        .filter(|finding| !finding.ok)
        .flat_map(|finding| {
            [
                format!("NO  {} {}", finding.subject, finding.what),
                format!("    hint: {}", finding.hint.clone().unwrap_or_default()),
            ]
        })
        .collect();
    (answer.fits, lines)
}

/// The NVML stub's variables for `driver` and `gpus`.
fn stub(driver: &str, gpus: &[(&str, &str)]) -> Vec<(&'static str, String)> {
    let list: Vec<String> = gpus
        .iter()
        .map(|(name, cc)| format!("{name}={cc}"))
        .collect();
    vec![
        ("STUB_DRIVER", driver.to_string()),
        ("STUB_GPUS", list.join(";")),
    ]
}

fn as_env<'a>(vars: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    vars.iter()
        .map(|(name, value)| (*name, value.as_str()))
        .collect()
}

/// The guard's refusal says exactly what `check` says of the same node, after its headline.
fn assert_says_what_check_says(
    output: &Output,
    config: &StackConfig,
    driver: Option<&str>,
    gpus: &[(&str, &str)],
) {
    let (fits, expected) = check_says(config, driver, gpus);
    assert_eq!(fits, Fit::No, "check says no too");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let mut lines = stderr.lines();
    assert_eq!(
        lines.next(),
        Some("cudastack guard: no: this image will not run on this node"),
        "{stderr}"
    );
    assert_eq!(
        lines.map(String::from).collect::<Vec<_>>(),
        expected,
        "{stderr}"
    );
}

#[test]
fn a_node_that_fits_starts_the_entrypoint() {
    if skip_without_tools() {
        return;
    }
    let config = guarded_config(&groups());
    let host = Host::new().with_nvml().with_proc_driver("550.54.15");
    let a100 = [
        ("NVIDIA A100-SXM4-80GB", "8.0"),
        ("NVIDIA A100-SXM4-80GB", "8.0"),
    ];
    assert_eq!(check_says(&config, Some("550.54.15"), &a100).0, Fit::Yes);
    let output = host.start(&config, &as_env(&stub("550.54.15", &a100)));
    assert!(output.status.success(), "{}", text(&output));
    assert!(host.started(), "the entrypoint ran: {}", text(&output));
    assert!(
        output.stderr.is_empty(),
        "a yes is silent: {}",
        text(&output)
    );
}

#[test]
fn a_driver_below_the_floor_refuses_with_checks_words() {
    if skip_without_tools() {
        return;
    }
    let config = guarded_config(&groups());
    let host = Host::new().with_nvml().with_proc_driver("525.60.13");
    let a100 = [("NVIDIA A100-SXM4-80GB", "8.0")];
    let output = host.start(&config, &as_env(&stub("525.60.13", &a100)));
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    assert!(!host.started());
    assert_says_what_check_says(&output, &config, Some("525.60.13"), &a100);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("NO  driver 525.60.13 is below the recipe's driver floor 535.104.05"),
        "{stderr}"
    );
    assert!(
        stderr.contains("hint: upgrade the driver to 535.104.05 or newer"),
        "{stderr}"
    );
    // CUDA 12.0 on this driver, 12.1 asked: within 12.x minor-version compatibility, so the
    // guard gives the rebuild `check` and `validate` give.
    assert!(
        stderr.contains(
            "or build it again with `minor_version_compat: true` and `driver_floor: \"525.60.13\"`"
        ),
        "{stderr}"
    );
}

#[test]
fn a_gpu_without_kernels_refuses_with_checks_words() {
    if skip_without_tools() {
        return;
    }
    let config = guarded_config(&groups());
    let host = Host::new().with_nvml().with_proc_driver("550.54.15");
    // H100: the cuDNN-like group has PTX for it, in an ISA R550's JIT cannot read.
    let h100 = [("NVIDIA H100 80GB HBM3", "9.0")];
    let output = host.start(&config, &as_env(&stub("550.54.15", &h100)));
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    assert!(!host.started());
    assert_says_what_check_says(&output, &config, Some("550.54.15"), &h100);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("libcudnn_engines_precompiled.so.9"),
        "{stderr}"
    );
    assert!(
        stderr.contains("this driver JIT-compiles PTX ISA 8.4 at most"),
        "{stderr}"
    );
    // An R575 driver (CUDA 12.9) JIT-compiles it: a yes, as check says.
    let newer = Host::new().with_nvml();
    assert_eq!(check_says(&config, Some("575.51.03"), &h100).0, Fit::Yes);
    let output = newer.start(&config, &as_env(&stub("575.51.03", &h100)));
    assert!(output.status.success(), "{}", text(&output));
    assert!(newer.started());
}

/// An image without audit groups or torch: the GPU against the archs its CUDA targets.
#[test]
fn a_gpu_beyond_the_cuda_release_refuses_with_checks_words() {
    if skip_without_tools() {
        return;
    }
    let config = guarded_config(&[]);
    let host = Host::new().with_nvml();
    let b200 = [("NVIDIA B200", "10.0")];
    let output = host.start(&config, &as_env(&stub("570.133.20", &b200)));
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    assert_says_what_check_says(&output, &config, Some("570.133.20"), &b200);
}

#[test]
fn no_driver_is_unknown_and_names_the_way_out() {
    if skip_without_tools() {
        return;
    }
    let config = guarded_config(&groups());
    let host = Host::new();
    let output = host.start(&config, &[]);
    assert_eq!(output.status.code(), Some(3), "{}", text(&output));
    assert!(!host.started());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with("cudastack guard: unknown: no NVIDIA driver is visible"),
        "{stderr}"
    );
    assert!(stderr.contains("CUDASTACK_GUARD=skip"), "{stderr}");
    // The opt-out starts the command unchecked.
    let output = host.start(&config, &[("CUDASTACK_GUARD", "skip")]);
    assert!(output.status.success(), "{}", text(&output));
    assert!(host.started());
}

/// Without NVML the driver comes from /proc: a driver below the floor is still a no (no
/// is no whatever else is missing); a good one leaves the GPUs unknown.
#[test]
fn without_nvml_the_proc_driver_is_compared() {
    if skip_without_tools() {
        return;
    }
    let config = guarded_config(&groups());
    let old = Host::new().with_proc_driver("525.60.13");
    let output = old.start(&config, &[]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    assert_says_what_check_says(&output, &config, Some("525.60.13"), &[]);
    let good = Host::new().with_proc_driver("550.54.15");
    let output = good.start(&config, &[]);
    assert_eq!(output.status.code(), Some(3), "{}", text(&output));
    assert!(!good.started());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("the driver is 550.54.15, but libnvidia-ml.so.1 does not load"),
        "{stderr}"
    );
    assert_eq!(check_says(&config, Some("550.54.15"), &[]).0, Fit::Unknown);
}

/// The guard in front of a good start, against the command alone (`true`): 50 runs each,
/// median and p90. Run by scripts/bench-guard.sh; a figure, not a pass/fail.
#[test]
#[ignore = "a measurement: scripts/bench-guard.sh runs it"]
fn start_cost() {
    if skip_without_tools() {
        return;
    }
    let config = guarded_config(&groups());
    let host = Host::new().with_nvml().with_proc_driver("575.51.03");
    let node = stub("575.51.03", &[("NVIDIA H100 80GB HBM3", "9.0"); 8]);
    let runs = 50;
    let time = |guarded: bool| {
        let mut samples: Vec<Duration> = (0..runs)
            .map(|_| {
                let started = Instant::now();
                let output = if guarded {
                    host.start(&config, &as_env(&node))
                } else {
                    Command::new("sh")
                        .args(["-c", "echo started > \"$0\""])
                        .arg(host.marker())
                        .output()
                        .unwrap()
                };
                let took = started.elapsed();
                assert!(output.status.success(), "{}", text(&output));
                took
            })
            .collect();
        samples.sort();
        (samples[runs / 2], samples[runs * 9 / 10])
    };
    let (alone_median, alone_p90) = time(false);
    let (guarded_median, guarded_p90) = time(true);
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "entrypoint alone:  median {:.1} ms, p90 {:.1} ms ({runs} runs)",
        ms(alone_median),
        ms(alone_p90)
    );
    println!(
        "guard + entrypoint: median {:.1} ms, p90 {:.1} ms ({runs} runs)",
        ms(guarded_median),
        ms(guarded_p90)
    );
    println!(
        "guard's cost:       median {:.1} ms",
        ms(guarded_median) - ms(alone_median)
    );
}
