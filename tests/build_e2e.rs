//! The real end-to-end build of the first shipped recipe (torch 2.4.1 + CUDA 12.1 + cuDNN
//! 9.1.0.70 on Debian bookworm, Python 3.11) from PyPI and Debian packages, then checks with
//! real peers: skopeo copies the layout into the Docker daemon, and the container proves the
//! stack (versions, sm list, exactly one libcudnn.so.9 on disk, in `ldconfig -p` and in
//! /proc/self/maps). A rebuild must give the same manifest digest with every layer cached.
//!
//! The build's verification stage (recipe `verify.gpu: auto`) runs the probe in a container
//! through the Docker API: with no GPU here, the static level must pass, every GPU level be
//! skipped with the reason, and the image must carry no verified label or tag. A planted
//! second cuDNN copy on LD_LIBRARY_PATH must make the probe fail, naming it.
//!
//! Needs root (mmdebstrap --mode=root), mmdebstrap, skopeo and a Docker daemon; without them
//! it says why and stops. No GPU is needed: nothing here launches a kernel.

use crate::e2e_support;

use std::path::{Path, PathBuf};
use std::process::Command;

const RECIPE: &str = "recipes/torch2.4.1-cu121-py3.11.yaml";
const IMAGE: &str = "cudastack-e2e-torch241:test";
/// The recipe's own tag, which the verification stage loads the image under.
const RECIPE_TAG: &str = "localhost/torch:2.4.1-cuda12.1-cudnn9-py3.11";

fn build(layout: &Path) -> (String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        // --load: the image must be in the daemon under its tag for the planted-copy run
        // below, also when the verification is a cached report (which loads nothing).
        // gzip, not `auto` (none for --load alone): the tests that load a torch image share
        // its layers in the e2e cache, and compressed they take 2.8 GB there and in Docker's
        // load spool instead of 5.2 (CI's disk, stop 29). Uncompressed loads are tested in
        // build_publish.
        .args([
            "build",
            RECIPE,
            "--load",
            "--compression",
            "gzip",
            "--layout",
        ])
        .arg(layout)
        .arg("--cache-dir")
        .arg(e2e_support::cache_dir())
        .output()
        .unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(output.status.success(), "build failed:\n{stderr}");
    (
        stdout.lines().next().unwrap_or_default().to_string(),
        stderr,
    )
}

/// The ops and train levels of the image's probe.py, run on the CPU with the image's real
/// torch. There is no GPU here, so the device is the test's substitution (a verification
/// always runs them on "cuda"): what it proves is that the GPU levels' code works against
/// this torch (its API, the state_dict copy, backward, the optimizer), that the matmul bound
/// holds for a correct fp32 product, and that the network's loss falls as the check demands.
const CPU_REHEARSAL: &str = r#"
import json, sys
sys.path.insert(0, "/opt/cudastack/probe")
import probe, torch
run = probe.Probe(json.load(open(probe.EXPECT_PATH)), probe.LEVELS)
run.torch, run.device = torch, "cpu"
probe.ops_level(run)
probe.train_level(run)
print(json.dumps(run.checks))
"#;

fn docker_run(script: &str) -> String {
    let output = Command::new("docker")
        .args(["run", "--rm", IMAGE, "sh", "-c", script])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "`{script}` failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

struct RemoveImage;
impl Drop for RemoveImage {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["rmi", "-f", IMAGE, RECIPE_TAG])
            .output();
    }
}

#[test]
fn real_torch_stack_builds_loads_and_proves_itself() {
    if let Some(reason) =
        e2e_support::skip_reason(&[("skopeo", &["--version"][..]), ("docker", &["info"][..])])
    {
        reason.report();
        return;
    }
    // Declared first, so it is released after the images are removed.
    let _slot = e2e_support::large_image_slot();
    let _cleanup = RemoveImage;
    let work = tempfile::tempdir().unwrap();
    let (digest, first_log) = build(&work.path().join("layout-a"));
    assert!(digest.starts_with("sha256:"), "{digest}\n{first_log}");
    check_static_verification(&work.path().join("layout-a"), &digest, &first_log);
    check_sbom(&work.path().join("layout-a"), &digest);

    // Rebuild into another layout: same digest, nothing rebuilt.
    let (again, second_log) = build(&work.path().join("layout-b"));
    assert_eq!(
        digest, again,
        "rebuild changed the manifest digest:\n{second_log}"
    );
    // The math libraries, torch and triton each have a layer of their own (issue 21).
    for layer in [
        "base",
        "cuda",
        "cuda-math",
        "cudnn",
        "triton",
        "torch",
        "python",
        "packages",
        "config",
    ] {
        assert!(
            second_log
                .lines()
                .any(|l| l.contains(layer) && l.contains(", cached")),
            "layer {layer} was not reused:\n{second_log}"
        );
    }

    // skopeo, a real peer, accepts the layout and loads it into the daemon.
    let copy = Command::new("skopeo")
        .args(["copy", "--quiet"])
        .arg(format!(
            "oci:{}:latest",
            work.path().join("layout-a").display()
        ))
        .arg(format!("docker-daemon:{IMAGE}"))
        .output()
        .unwrap();
    assert!(
        copy.status.success(),
        "skopeo copy failed: {}",
        String::from_utf8_lossy(&copy.stderr)
    );

    // `python`, as teams' scripts call it, is the image's python3.
    let versions = docker_run("python -c 'import torch; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), torch._C._cuda_getArchFlags())'");
    assert_eq!(
        versions.trim(),
        "2.4.1+cu121 12.1 90100 sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90",
        "{versions}"
    );

    // Exactly one file provides libcudnn.so.9, ldconfig lists it once, and the Python
    // process maps that one file.
    let files = docker_run("find / -xdev -name 'libcudnn.so.9*' -type f");
    assert_eq!(files.lines().count(), 1, "{files}");
    assert_eq!(
        files.trim(),
        "/usr/local/cuda-12.1/targets/x86_64-linux/lib/libcudnn.so.9.1.0"
    );
    let ldconfig = docker_run("ldconfig -p | grep 'libcudnn.so.9 '");
    assert_eq!(ldconfig.lines().count(), 1, "{ldconfig}");
    let maps = docker_run("python3 -c 'import torch; torch.backends.cudnn.version(); print(open(\"/proc/self/maps\").read())' | grep libcudnn.so | awk '{print $6}' | sort -u");
    assert_eq!(
        maps.trim(),
        "/usr/local/cuda-12.1/targets/x86_64-linux/lib/libcudnn.so.9.1.0",
        "{maps}"
    );
    let cudart = docker_run("python3 -c 'import torch; print(open(\"/proc/self/maps\").read())' | grep -o '/[^ ]*libcudart[^ ]*' | sort -u");
    assert_eq!(cudart.lines().count(), 1, "{cudart}");

    let rehearsal = docker_run(&format!("python3 -c '{CPU_REHEARSAL}'"));
    let checks: Vec<serde_json::Value> = serde_json::from_str(rehearsal.trim()).unwrap();
    let ids: Vec<&str> = checks.iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        [
            "ops.matmul",
            "ops.conv",
            "ops.conv_benchmark",
            "ops.loaded_libraries",
            "train.mlp"
        ]
    );
    for check in &checks {
        eprintln!("rehearsed on the CPU: {check}");
        assert_eq!(check["status"], "pass", "{check}");
    }
    let error = checks[0]["data"]["relative_error"].as_f64().unwrap();
    assert!(error > 0.0 && error < 1e-5, "fp32 against float64: {error}");
    let losses: Vec<f64> = checks[4]["data"]["losses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_f64().unwrap())
        .collect();
    assert!(losses.windows(2).all(|w| w[1] < w[0]), "{losses:?}");

    // A runtime setting that forces TF32 whatever the probe asks is named, not reported as
    // a wrong product.
    let forced = docker_run(&format!(
        "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 python3 -c '{CPU_REHEARSAL}'"
    ));
    let checks: Vec<serde_json::Value> = serde_json::from_str(forced.trim()).unwrap();
    assert_eq!(checks[0]["status"], "fail", "{}", checks[0]);
    assert!(
        checks[0]["detail"]
            .as_str()
            .unwrap()
            .contains("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 forces TF32"),
        "{}",
        checks[0]
    );
}

/// The verification stage ran in the build: static level passed, GPU levels skipped with
/// the reason, the report stored beside the image, no verified label or ref anywhere.
/// The SBOM stored beside the image lists the CUDA components of the recipe's lock (issue 22).
fn check_sbom(layout: &Path, digest: &str) {
    let lock = cudastack::lock::Lockfile::read(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(RECIPE)
            .with_extension("lock"),
    )
    .unwrap();
    let referrers =
        cudastack::attest::store::referrers_of(layout, &digest.parse().unwrap()).unwrap();
    let sbom = referrers
        .iter()
        .find(|r| r.kind == cudastack::attest::store::SBOM)
        .unwrap_or_else(|| panic!("no SBOM beside the image: {referrers:#?}"));
    crate::attestations::assert_sbom_lists_cuda_wheels(&sbom.blob, &lock);
}

fn check_static_verification(layout: &Path, digest: &str, log: &str) {
    assert!(
        log.contains("verify  running the probe in a container"),
        "{log}"
    );
    for check in [
        "static.torch",
        "static.cudnn",
        "static.arch_list",
        "static.loaded_libraries",
        "static.ld_library_path",
    ] {
        assert!(
            log.lines().any(|l| l.contains(check) && l.contains("pass")),
            "{check} did not pass:\n{log}"
        );
    }
    // Without a GPU, the skipped GPU levels are one line, not a row each.
    assert!(
        log.lines().any(
            |l| l.contains("checks that need a GPU skipped; driver.version:")
                && l.contains("no NVIDIA driver")
        ),
        "{log}"
    );
    assert!(
        !log.lines().any(|l| l.contains("│ driver.version")),
        "a row for a GPU skip: {log}"
    );
    assert!(log.contains("no verified label"), "{log}");

    let index = std::fs::read_to_string(layout.join("index.json")).unwrap();
    assert!(index.contains("latest.verify-report"), "{index}");
    assert!(
        !index.contains("verified\""),
        "a verified ref appeared: {index}"
    );
    let inspect = Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .args(["--json", "inspect"])
        .arg(layout)
        .output()
        .unwrap();
    assert!(inspect.status.success());
    let value: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
    assert_eq!(
        value["manifest_digest"], digest,
        "the image was not replaced"
    );
    assert_eq!(value["declared"]["verified"], serde_json::json!([]));
    assert!(
        !value["labels"]
            .as_object()
            .unwrap()
            .keys()
            .any(|k| k.starts_with("io.cudastack.verified")),
        "{value}"
    );

    // A second cuDNN copy planted on LD_LIBRARY_PATH and winning the loader race (preloaded,
    // as a stale copy found first would be): the probe must fail and name it.
    let planted = Command::new("docker")
        .args(["run", "--rm", RECIPE_TAG, "sh", "-c"])
        .arg(
            "mkdir /tmp/stale && cp -P /usr/local/cuda-12.1/targets/x86_64-linux/lib/libcudnn.so* /tmp/stale/ \
             && LD_PRELOAD=/tmp/stale/libcudnn.so.9 LD_LIBRARY_PATH=/tmp/stale:$LD_LIBRARY_PATH python3 /opt/cudastack/probe/probe.py --level static",
        )
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&planted.stdout);
    assert_eq!(planted.status.code(), Some(1), "{stdout}");
    let report =
        cudastack::verify::report::Report::from_output(&stdout, "the planted run").unwrap();
    let status = |id: &str| {
        let check = report.checks.iter().find(|c| c.id == id).unwrap();
        (check.status, check.detail.clone())
    };
    use cudastack::verify::report::Status;
    let (loaded, detail) = status("static.loaded_libraries");
    assert_eq!(loaded, Status::Fail, "{detail}");
    assert!(
        detail.contains("libcudnn is loaded from 2 directories") && detail.contains("/tmp/stale"),
        "{detail}"
    );
    let (path, detail) = status("static.ld_library_path");
    assert_eq!(path, Status::Fail, "{detail}");
    assert!(detail.contains("libcudnn in /tmp/stale"), "{detail}");
}

/// The smallest stack the tests build, without tags: stand-in CUDA 12.4 wheels on Debian
/// bookworm, locked against its mirror. Returns the recipe and the mirror.
fn untagged_stand_in(work: &Path, name: &str, epoch: u64) -> (PathBuf, PathBuf) {
    use e2e_support::stand_in::{cuda_12_4_wheels, lock, Target};
    let mirror = work.join("mirror");
    cuda_12_4_wheels(Target::X86_64, &work.join("libs"), &mirror);
    let recipe = work.join(format!("{name}.yaml"));
    std::fs::write(&recipe, format!("name: {name}\nbase: {{ debian: bookworm }}\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: {{ version: \"12.4\" }}\ncudnn: {{ version: \"9.1.0.70\" }}\nsource_date_epoch: {epoch}\n")).unwrap();
    lock(&recipe, &mirror);
    (recipe, mirror)
}

/// Issue 16: every no-op rebuild with a Docker daemon loaded the whole image again and
/// re-ran the probe. The smallest stack the tests build (stand-in CUDA 12.4 wheels on
/// Debian bookworm, no tags) is built three times into one layout: the second build must
/// take its verification from the cache (nothing loaded, no container), the third, with
/// the verification cache emptied, does what every rebuild did before. Prints the times.
#[test]
fn a_no_op_rebuild_with_docker_loads_and_runs_nothing() {
    if let Some(reason) =
        e2e_support::skip_reason(&[("gcc", &["--version"][..]), ("docker", &["info"][..])])
    {
        reason.report();
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let (recipe, mirror) = untagged_stand_in(work.path(), "noop-rebuild", 1700000000);
    let cache = e2e_support::cache_dir();
    let layout = work.path().join("layout");
    let build = || {
        let started = std::time::Instant::now();
        let output = Command::new(env!("CARGO_BIN_EXE_cudastack"))
            .args(["build", "--mirror"])
            .arg(&mirror)
            .arg("--layout")
            .arg(&layout)
            .arg("--cache-dir")
            .arg(&cache)
            .arg(&recipe)
            .output()
            .unwrap();
        let seconds = started.elapsed().as_secs_f64();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(output.status.success(), "build failed:\n{stderr}");
        let digest = String::from_utf8_lossy(&output.stdout)
            .lines()
            .next()
            .unwrap_or_default()
            .to_string();
        (digest, stderr, seconds)
    };
    let forget_verifications = || {
        let _ = std::fs::remove_dir_all(cache.join("verify"));
    };
    forget_verifications();
    let (digest, first, first_s) = build();
    assert!(!first.contains("cached report"), "{first}");
    let (again, second, second_s) = build();
    assert_eq!(digest, again);
    assert!(
        second.contains("verification: cached report of ") && second.contains(&digest),
        "{second}"
    );
    forget_verifications();
    let (_, third, third_s) = build();
    assert!(!third.contains("cached report"), "{third}");
    eprintln!(
        "cudastack build (verify.gpu: auto, Docker): first {first_s:.2} s; no-op rebuild \
         {second_s:.2} s; no-op rebuild without the verification cache (what every rebuild \
         did before) {third_s:.2} s"
    );
    assert!(second_s < third_s, "{second_s:.2} s >= {third_s:.2} s");
    // Nothing named it, so its default name is the layout's: the verification's image is not
    // left in Docker under it (only `--load` puts it there).
    let left = Command::new("docker")
        .args(["image", "inspect", "localhost/noop-rebuild:latest"])
        .output()
        .unwrap();
    assert!(
        !left.status.success(),
        "a build without --load left localhost/noop-rebuild:latest in Docker"
    );
}

/// `build --load` of an image without tags loaded it twice: the verification loaded it for
/// the probe and removed it (an untagged image would be an anonymous leftover), then the
/// load sent every layer again. Now the probe's image stays until the verified image is
/// loaded: the load sends no layer again, and the probe's image is gone afterwards unless it
/// is the loaded one. (A recipe without `tags:` now has a default name, so the probe's image
/// is tagged; the layers still go to Docker once.)
#[test]
fn build_load_of_an_untagged_image_sends_its_layers_once() {
    if let Some(reason) =
        e2e_support::skip_reason(&[("gcc", &["--version"][..]), ("docker", &["info"][..])])
    {
        reason.report();
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let (recipe, mirror) = untagged_stand_in(work.path(), "load-once", 1700000001);
    let cache = e2e_support::cache_dir();
    let output = Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .args(["build", "--load", "--json", "--mirror"])
        .arg(&mirror)
        .arg("--layout")
        .arg(work.path().join("layout"))
        .arg("--cache-dir")
        .arg(&cache)
        .arg(&recipe)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "build failed:\n{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let (probe, load) = (&report["verify"]["load"], &report["load"]);
    let loaded_id = load["image_id"].as_str().unwrap().to_string();
    let inspect = |id: &str| {
        Command::new("docker")
            .args(["image", "inspect", "--format", "{{.Id}}", id])
            .output()
            .unwrap()
            .status
            .success()
    };
    let loaded_exists = inspect(&loaded_id);
    let probe_id = probe["image_id"].as_str().unwrap_or_default().to_string();
    let probe_left = probe_id != loaded_id && inspect(&probe_id);
    let _ = Command::new("docker").args(["rmi", &loaded_id]).output();
    if probe_left {
        let _ = Command::new("docker").args(["rmi", &probe_id]).output();
    }
    eprintln!("the probe's load: {probe}\nthe build's load: {load}");
    assert!(loaded_exists, "the loaded image is in Docker");
    assert!(!probe_left, "the probe's image {probe_id} was left behind");
    let layers = report["layers"].as_array().unwrap().len() as u64;
    // What the probe's load sent depends on the stack layers other images in this Docker
    // share with it; the build's load must send none again.
    assert_eq!(probe["skipped"], false, "the probe's load: {probe}");
    // A recipe without `tags:` is loaded under its default name, not as an anonymous image.
    assert_eq!(
        load["tags"],
        serde_json::json!(["localhost/load-once:latest"])
    );
    assert!(
        load["skipped"] == true || load["layers_present"].as_u64() == Some(layers),
        "the build's load sent layers again: {load}"
    );
}

/// A build whose verification loads the image sends the lower layers into Docker while it
/// builds the upper ones: by the time the probe's load runs, every layer is there, and the
/// load sends the config alone. The step images are gone when the build ends. The stand-in's
/// team layer is new on every run (its epoch is now), so the build always builds one.
#[test]
fn a_verified_build_loads_its_layers_while_it_builds() {
    if let Some(reason) =
        e2e_support::skip_reason(&[("gcc", &["--version"][..]), ("docker", &["info"][..])])
    {
        reason.report();
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let (recipe, mirror) = untagged_stand_in(work.path(), "early-load", epoch);
    let child = Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .args(["build", "--json", "--mirror"])
        .arg(&mirror)
        .arg("--layout")
        .arg(work.path().join("layout"))
        .arg("--cache-dir")
        .arg(e2e_support::cache_dir())
        .arg(&recipe)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "build failed:\n{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let layers = report["layers"].as_array().unwrap();
    assert!(
        layers.iter().any(|layer| layer["cached"] == false),
        "the build built no layer: {report}"
    );
    let probe = &report["verify"]["load"];
    eprintln!("the probe's load: {probe}");
    assert_eq!(
        probe["layers_present"].as_u64(),
        Some(layers.len() as u64),
        "the probe's load sent layers the build could have loaded early: {probe}"
    );
    // The build says what went early: every layer, in bounded steps, nothing stopped them.
    let early = &report["early_load"];
    assert_eq!(
        early["layers"].as_u64(),
        Some(layers.len() as u64),
        "{early}"
    );
    let steps = early["steps"].as_u64().unwrap();
    assert!((1..=layers.len() as u64).contains(&steps), "{early}");
    let sizes: u64 = layers.iter().map(|l| l["size"].as_u64().unwrap()).sum();
    assert!(early["bytes"].as_u64().unwrap() > sizes, "{early}");
    assert!(early.get("stopped").is_none(), "{early}");
    assert!(
        stderr.contains("loaded into Docker while building"),
        "{stderr}"
    );
    let steps = Command::new("docker")
        .args(["images", "-aq", "--filter"])
        .arg(format!("label={}", cudastack::labels::LOAD_STEP_OWNER))
        .output()
        .unwrap();
    let owners: Vec<String> = String::from_utf8_lossy(&steps.stdout)
        .lines()
        .map(|id| {
            let format = format!(
                "{{{{index .Config.Labels \"{}\"}}}}",
                cudastack::labels::LOAD_STEP_OWNER
            );
            let owner = Command::new("docker")
                .args(["image", "inspect", "--format", &format, id])
                .output()
                .unwrap();
            String::from_utf8_lossy(&owner.stdout).trim().to_string()
        })
        .collect();
    assert!(
        !owners
            .iter()
            .any(|owner| owner.contains(&format!("/{pid}/"))),
        "the build left its step images: {owners:?}"
    );
}

/// Removes the Docker image `tag` when dropped: a test leaves no image behind, pass or fail.
struct RemoveTag(&'static str);
impl Drop for RemoveTag {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rmi", "-f", self.0]).output();
    }
}

/// `cudastack build --no-verify --load --tag TAG` of a stand-in `recipe` locked against
/// `mirror`, into `layout`, with the shared e2e cache.
fn load_stand_in(recipe: &Path, mirror: &Path, layout: &Path, tag: &str) {
    let output = Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .args(["build", "--no-verify", "--load", "--tag", tag, "--mirror"])
        .arg(mirror)
        .arg("--layout")
        .arg(layout)
        .arg("--cache-dir")
        .arg(e2e_support::cache_dir())
        .arg(recipe)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        e2e_support::output_text(&output)
    );
}

/// `openssl` with `args`, in `dir`; panics with its output when it fails.
fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "openssl {args:?}: {}",
        e2e_support::output_text(&output)
    );
}

/// A root CA `NAME.pem` (key `NAME.key`) and a `localhost` server certificate it signed,
/// `NAME-server.pem` with key `NAME-server.key`, all made in `dir` by openssl.
fn ca_and_server(dir: &Path, name: &str) {
    let subject = format!("/O=Example {name}/CN=Example {name} Root CA");
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.pem"),
            "-days",
            "30",
            "-subj",
            &subject,
            "-addext",
            "basicConstraints=critical,CA:TRUE",
        ],
    );
    std::fs::write(
        dir.join("server.ext"),
        "basicConstraints=CA:FALSE\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &format!("{name}-server.key"),
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            &format!("{name}.pem"),
            "-CAkey",
            &format!("{name}.key"),
            "-CAcreateserial",
            "-out",
            &format!("{name}-server.pem"),
            "-days",
            "30",
            "-extfile",
            "server.ext",
        ],
    );
}

/// Inside the image: an HTTPS server on localhost with each server certificate, fetched by
/// Python's urllib with the image's default trust; prints `ok` or the failure per server.
const FETCH_OVER_TLS: &str = r#"
import http.server, ssl, sys, threading, urllib.request
def serve(name):
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(f"/certs/{name}-server.pem", f"/certs/{name}-server.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]
for name in sys.argv[1:]:
    port = serve(name)
    try:
        urllib.request.urlopen(f"https://localhost:{port}/", timeout=10).read()
        print(name, "ok")
    except Exception as error:
        print(name, "failed:", error)
"#;

/// `ca_certificates:` puts a corporate root into the image's trust store: Python's `ssl`
/// (OpenSSL) trusts a server it signed and still refuses one signed by a root nobody named;
/// pip and requests are pointed at the same bundle; `update-ca-certificates` in a derived
/// image keeps the root. Real openssl-made certificates, a real Docker daemon.
#[test]
fn a_corporate_ca_is_trusted_by_everything_in_the_image() {
    if let Some(reason) = e2e_support::skip_reason(&[
        ("gcc", &["--version"][..]),
        ("openssl", &["version"][..]),
        ("docker", &["info"][..]),
    ]) {
        reason.report();
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let certs = work.path().join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    ca_and_server(&certs, "corp");
    ca_and_server(&certs, "stranger");
    let (recipe, mirror) = untagged_stand_in(work.path(), "corp-ca", 1700000002);
    // An image-only key: the lock made above stays fresh.
    let mut text = std::fs::read_to_string(&recipe).unwrap();
    text.push_str("ca_certificates: [certs/corp.pem]\n");
    std::fs::write(&recipe, text).unwrap();
    const TAG: &str = "localhost/corp-ca:test";
    let _remove = RemoveTag(TAG);
    load_stand_in(&recipe, &mirror, &work.path().join("layout"), TAG);
    let run = |script: &str| {
        let output = Command::new("docker")
            .args(["run", "--rm", "-v"])
            .arg(format!("{}:/certs:ro", certs.display()))
            .args([TAG, "sh", "-c", script])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            e2e_support::output_text(&output)
        );
        String::from_utf8(output.stdout).unwrap()
    };
    let fetched = run(&format!(
        "python3 -c '{FETCH_OVER_TLS}' corp stranger; echo \"$PIP_CERT $REQUESTS_CA_BUNDLE $SSL_CERT_FILE\""
    ));
    eprintln!("{fetched}");
    let mut lines = fetched.lines();
    assert_eq!(lines.next(), Some("corp ok"), "{fetched}");
    let stranger = lines.next().unwrap_or_default();
    assert!(
        stranger.starts_with("stranger failed:") && stranger.contains("CERTIFICATE_VERIFY_FAILED"),
        "{fetched}"
    );
    let bundle = "/etc/ssl/certs/ca-certificates.crt";
    assert_eq!(
        lines.next(),
        Some(format!("{bundle} {bundle} {bundle}").as_str())
    );
    // The distribution's roots are still there, the corporate one after them, and a derived
    // image that runs update-ca-certificates keeps it.
    let kept = run(&format!(
        "grep -c 'BEGIN CERTIFICATE' {bundle}; ls /usr/local/share/ca-certificates/cudastack; \
         update-ca-certificates >/dev/null 2>&1; python3 -c '{FETCH_OVER_TLS}' corp"
    ));
    let mut lines = kept.lines();
    let roots: usize = lines.next().unwrap().trim().parse().unwrap();
    assert!(roots > 100, "{kept}");
    assert_eq!(lines.next(), Some("corp.crt"), "{kept}");
    assert_eq!(
        lines.next(),
        Some("corp ok"),
        "after update-ca-certificates: {kept}"
    );
}

/// `inspect` and `check` read an image in the local Docker daemon (`docker-daemon:NAME`) as
/// they read its layout: the same config digest and claims, the same answer for a node;
/// what the daemon does not keep (Docker 20.10 keeps no manifest for a loaded image, no
/// daemon keeps signatures or an SBOM) is said, never made up.
#[test]
fn inspect_and_check_read_an_image_in_the_docker_daemon() {
    if let Some(reason) =
        e2e_support::skip_reason(&[("gcc", &["--version"][..]), ("docker", &["info"][..])])
    {
        reason.report();
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let (recipe, mirror) = untagged_stand_in(work.path(), "daemon-read", 1700000003);
    const TAG: &str = "localhost/daemon-read:test";
    let _remove = RemoveTag(TAG);
    let layout = work.path().join("layout");
    let cudastack = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_cudastack"))
            .args(args)
            .output()
            .unwrap()
    };
    load_stand_in(&recipe, &mirror, &layout, TAG);
    let layout = layout.to_str().unwrap();
    let daemon = format!("docker-daemon:{TAG}");
    let json = |image: &str| {
        let output = cudastack(&["inspect", "--json", image]);
        assert!(
            output.status.success(),
            "{}",
            e2e_support::output_text(&output)
        );
        serde_json::from_slice::<serde_json::Value>(&output.stdout).unwrap()
    };
    let (from_layout, from_daemon) = (json(layout), json(&daemon));
    assert_eq!(from_daemon["location"], daemon.as_str());
    // The classic store names an image by its config; the containerd store by its manifest.
    let config = &from_daemon["config_digest"];
    assert!(
        *config == from_layout["config_digest"] || config.is_null(),
        "{config}"
    );
    for claim in ["declared", "labels", "env"] {
        assert_eq!(from_daemon[claim], from_layout[claim], "{claim}");
    }
    // Docker's classic store keeps no manifest; the containerd store says it.
    let manifest = &from_daemon["manifest_digest"];
    assert!(
        manifest.is_null() || *manifest == from_layout["manifest_digest"],
        "{manifest}"
    );
    let human = cudastack(&["inspect", &daemon]);
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(human.contains("recipe        daemon-read"), "{human}");
    // The same answer for the same node, from either place.
    let check = |image: &str, driver: &str| {
        let output = cudastack(&["check", image, "--gpu", "A100", "--driver", driver]);
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
        )
    };
    for driver in ["550.54.15", "470.57.02"] {
        let (layout_code, layout_text) = check(layout, driver);
        let (daemon_code, daemon_text) = check(&daemon, driver);
        assert_eq!(daemon_code, layout_code, "{driver}: {daemon_text}");
        let layout_name = format!("oci:{layout}:latest");
        assert_eq!(
            daemon_text.replace(&daemon, "IMAGE"),
            layout_text.replace(&layout_name, "IMAGE"),
            "{driver}"
        );
    }
    assert_eq!(check(&daemon, "550.54.15").0, Some(0));
    assert_eq!(check(&daemon, "470.57.02").0, Some(1));
    // A daemon holds one platform's image per name: another platform is refused, not
    // answered with this one.
    let arm = cudastack(&[
        "check",
        &daemon,
        "--platform",
        "linux/arm64",
        "--gpu",
        "A100",
        "--driver",
        "550.54.15",
    ]);
    let text = e2e_support::output_text(&arm);
    assert_eq!(arm.status.code(), Some(2), "{text}");
    assert!(text.contains("not linux/arm64"), "{text}");
    // Signatures and SBOMs live beside a layout or a registry's image, never a daemon's.
    let prefix = work.path().join("cosign");
    let generated = Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .args(["key", "generate", "--output-prefix"])
        .arg(&prefix)
        .env("COSIGN_PASSWORD", "unused")
        .output()
        .unwrap();
    assert!(
        generated.status.success(),
        "{}",
        e2e_support::output_text(&generated)
    );
    let key = prefix.with_extension("pub");
    let signed = cudastack(&[
        "check",
        &daemon,
        "--gpu",
        "A100",
        "--driver",
        "550.54.15",
        "--require-signed-by",
        key.to_str().unwrap(),
    ]);
    let text = e2e_support::output_text(&signed);
    assert!(
        !signed.status.success() && text.contains("keeps no signature"),
        "{text}"
    );
    let sbom = cudastack(&["sbom", &daemon]);
    let text = e2e_support::output_text(&sbom);
    assert!(
        !sbom.status.success() && text.contains("a Docker daemon keeps none"),
        "{text}"
    );
    let missing = cudastack(&["inspect", "docker-daemon:localhost/no-such-image:none"]);
    let text = e2e_support::output_text(&missing);
    assert!(text.contains("is not in the Docker daemon"), "{text}");
}

/// README's first command, `scripts/run.sh RECIPE [build options]`: the build host's
/// packages (present here, so nothing is installed), the binary (`CUDASTACK`, as a release
/// install or a checkout build gives it), then the build with the options passed through.
#[test]
fn the_readme_front_door_script_builds_a_locked_recipe() {
    // With the build host's packages present, the script installs nothing.
    if let Some(reason) = e2e_support::skip_reason(&[
        ("gcc", &["--version"][..]),
        ("mmdebstrap", &["--version"][..]),
        ("fakechroot", &["--version"][..]),
    ]) {
        reason.report();
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let (recipe, mirror) = untagged_stand_in(work.path(), "front-door", 1700000004);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/run.sh");
    let output = Command::new("bash")
        .arg(&script)
        .arg(&recipe)
        .args(["--no-verify", "--mirror"])
        .arg(&mirror)
        .arg("--layout")
        .arg(work.path().join("layout"))
        .arg("--cache-dir")
        .arg(e2e_support::cache_dir())
        .env("CUDASTACK", env!("CARGO_BIN_EXE_cudastack"))
        .output()
        .unwrap();
    let text = e2e_support::output_text(&output);
    assert!(output.status.success(), "{text}");
    assert!(
        text.contains(&format!("run: cudastack {}", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    let digest = String::from_utf8_lossy(&output.stdout);
    assert!(digest.trim_start().starts_with("sha256:"), "{text}");
    assert!(work.path().join("layout/index.json").is_file(), "{text}");
    // A recipe that is not there is refused before anything else.
    let missing = Command::new("bash")
        .arg(&script)
        .arg(work.path().join("absent.yaml"))
        .output()
        .unwrap();
    assert_eq!(
        missing.status.code(),
        Some(2),
        "{}",
        e2e_support::output_text(&missing)
    );
}
