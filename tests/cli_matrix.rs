//! CLI behaviour of validate / matrix / solve, as the user sees it (insta snapshots of
//! stdout), plus precise checks of each validation failure. Runs the real binary.

use std::path::Path;

use assert_cmd::Command;

fn cudastack() -> Command {
    // An empty cache: a matrix the developer refreshed (`matrix refresh`) must not change
    // what these tests see.
    static CACHE: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    let cache = CACHE.get_or_init(|| tempfile::tempdir().unwrap());
    let mut command = Command::cargo_bin("cudastack").unwrap();
    command
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("CUDASTACK_CACHE_DIR", cache.path());
    command
}

fn run(args: &[&str]) -> (i32, String, String) {
    let output = cudastack().args(args).output().unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

#[test]
fn every_shipped_recipe_is_valid() {
    let mut recipes: Vec<String> =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("recipes"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .map(|p| format!("recipes/{}", p.file_name().unwrap().to_string_lossy()))
            .collect();
    recipes.sort();
    assert!(recipes.len() >= 5);
    let mut args = vec!["validate"];
    args.extend(recipes.iter().map(String::as_str));
    let (code, stdout, stderr) = run(&args);
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    for recipe in &recipes {
        assert!(
            stdout.contains(&format!("{recipe}: valid")),
            "{recipe} not valid:\n{stdout}"
        );
    }
}

/// Each invalid fixture fails with exit 1, its own error code, and a message naming the
/// facts involved.
#[test]
fn each_invalid_case_has_a_precise_error_and_hint() {
    let cases: &[(&str, &[&str])] = &[
        ("driver-floor-below-toolkit", &["driver floor 525.85.12 is below 530.30.02", "525.60.13", "NVIDIA_REQUIRE_CUDA", "WITHOUT minor-version compatibility", "minor_version_compat: true"]),
        ("driver-floor-too-old", &["driver floor 470.82.01 is too old for CUDA 12.1", "supports CUDA <= 11.4", "raise driver_floor to >= 530.30.02"]),
        ("cudnn-cuda-major", &["cuDNN 8.7.0.84 is not built for CUDA 12", "CUDA 11"]),
        ("torch-cudnn-mismatch", &["pins cuDNN 9.1.0.70", "asks for cuDNN 8.9.2.26", "set cudnn.version to 9.1.0.70"]),
        ("torch-cuda-mismatch", &["is built for CUDA 12.1", "12.1.105", "asks for CUDA 12.4", "set cuda.version to 12.1"]),
        ("python-not-supported", &["no wheel for Python 3.12 (cp312)", "cp311"]),
        ("gpu-no-kernels", &["GeForce RTX 5090 (compute capability 12.0, sm_120) has no kernels in torch 2.6.0+cu124", "no kernel image is available", "2.8.0"]),
        ("unknown-torch", &["torch 2.99.0 is not in the matrix", "matrix refresh"]),
        ("unknown-cuda", &["CUDA 12.7 is not a release cudastack knows"]),
        ("unknown-cudnn", &["cuDNN 7.6.5 is not a release cudastack knows"]),
        ("unknown-gpu", &["GPU `Voodoo 5` is not in the matrix"]),
        ("base-python-mismatch", &["base debian:bookworm ships Python 3.11; the recipe asks for Python 3.12"]),
        ("gpu-arch-removed", &["CUDA 13.0 cannot compile for Tesla V100 (sm_70)"]),
        ("gpu-host-platform", &["GPU `GH200` exists only in linux/arm64 machines", "add linux/arm64 to `platforms:`"]),
        ("gpu-driver-unsupported", &["driver floor 550.54.15 is too old for GeForce RTX 5090 (sm_120): it needs the R570 driver branch or later", "cuda-toolkit-driver-and-architecture-matrix", "raise driver_floor to >= 570.26"]),
    ];
    for (name, fragments) in cases {
        let path = format!("tests/fixtures/recipes/invalid/{name}.yaml");
        let (code, stdout, _) = run(&["validate", &path]);
        assert_eq!(code, 1, "{name} should be invalid:\n{stdout}");
        assert!(
            stdout.contains(&format!("error[{name}]")),
            "{name}: expected error[{name}] in:\n{stdout}"
        );
        assert!(stdout.contains("hint: "), "{name}: no hint:\n{stdout}");
        for fragment in *fragments {
            assert!(
                stdout.contains(fragment),
                "{name}: expected `{fragment}` in:\n{stdout}"
            );
        }
    }
}

#[test]
fn unknown_keys_point_at_line_and_column() {
    let (code, stdout, _) = run(&[
        "validate",
        "tests/fixtures/recipes/invalid/unknown-key.yaml",
    ]);
    assert_eq!(code, 1);
    assert!(stdout.contains("unknown-key.yaml:5:"), "{stdout}");
    assert!(stdout.contains("unknown field `flavour`"), "{stdout}");
}

#[test]
fn minor_version_compat_turns_the_floor_error_into_a_note() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/recipes/invalid/driver-floor-below-toolkit.yaml"),
    )
    .unwrap();
    let path = dir.path().join("compat.yaml");
    std::fs::write(&path, format!("{text}minor_version_compat: true\n")).unwrap();
    let (code, stdout, _) = run(&["validate", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("note[minor-version-compat]"), "{stdout}");
    assert!(
        stdout.contains("NVIDIA_REQUIRE_CUDA=cuda>=12.0"),
        "{stdout}"
    );
}

#[test]
fn validate_json_is_machine_readable() {
    let (code, stdout, _) = run(&[
        "validate",
        "--json",
        "recipes/torch2.4.1-cu121-py3.11.yaml",
        "tests/fixtures/recipes/invalid/torch-cudnn-mismatch.yaml",
    ]);
    assert_eq!(code, 1);
    let value: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(value[0]["valid"], true);
    assert_eq!(value[0]["torch_build"], "2.4.1+cu121");
    assert_eq!(value[0]["nvidia_require_cuda"], "cuda>=12.1");
    assert!(value[0]["recipe_digest"]
        .as_str()
        .unwrap()
        .starts_with("sha256:"));
    assert_eq!(value[1]["valid"], false);
    assert_eq!(value[1]["problems"][0]["code"], "torch-cudnn-mismatch");
}

#[test]
fn snapshot_validate_error_output() {
    let (_, stdout, _) = run(&[
        "validate",
        "tests/fixtures/recipes/invalid/torch-cudnn-mismatch.yaml",
        "tests/fixtures/recipes/invalid/driver-floor-below-toolkit.yaml",
    ]);
    insta::assert_snapshot!(stdout);
}

fn solve_json(args: &[&str]) -> serde_json::Value {
    let mut full = vec!["solve", "--json"];
    full.extend_from_slice(args);
    let (_, stdout, stderr) = run(&full);
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}{stderr}"))
}

fn best(solution: &serde_json::Value) -> (String, bool) {
    let best = &solution["candidates"][0];
    assert_eq!(best["accepted"], true, "no accepted candidate: {solution}");
    (
        best["torch_build"].as_str().unwrap().to_string(),
        best["minor_compat"].as_bool().unwrap(),
    )
}

#[test]
fn solve_driver_535_rtx_3090() {
    let solution = solve_json(&["--driver", "535.104.05", "--gpu", "RTX 3090"]);
    assert_eq!(solution["cuda_ceiling"], "12.2");
    // Natively supported (no minor-version compatibility), CUDA within the 12.2 ceiling: the
    // newest PyPI build, 2.4.1+cu121, ranks first (PyPI is what a recipe locks from by
    // default); builds of PyTorch's own index are accepted natively too, after it.
    let (build, minor_compat) = best(&solution);
    assert!(!minor_compat);
    assert!(
        build.ends_with("+cu121") || build.ends_with("+cu118"),
        "{build}"
    );
    let pypi = solution["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["torch_build"] == "2.4.1+cu121" && c["index"] == "pypi")
        .unwrap();
    assert_eq!(
        (pypi["accepted"].as_bool(), pypi["minor_compat"].as_bool()),
        (Some(true), Some(false))
    );
    // cu124 builds need 550.54.14 natively; they come after, through minor-version compat.
    let rejected_or_compat = solution["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["torch_build"] == "2.5.1+cu124")
        .unwrap();
    assert_eq!(rejected_or_compat["minor_compat"], true);
}

#[test]
fn solve_driver_470_v100_needs_minor_compat() {
    let solution = solve_json(&["--driver", "470.82.01", "--gpu", "V100"]);
    assert_eq!(solution["cuda_ceiling"], "11.4");
    let (build, minor_compat) = best(&solution);
    assert!(
        minor_compat,
        "{build} should need minor-version compatibility"
    );
    assert!(
        build.ends_with("+cu117") || build.ends_with("+cu118"),
        "{build}"
    );
    let strict = solve_json(&[
        "--driver",
        "470.82.01",
        "--gpu",
        "V100",
        "--no-minor-compat",
    ]);
    assert_eq!(strict["candidates"][0]["accepted"], false);
}

#[test]
fn solve_driver_570_rtx_5090() {
    let solution = solve_json(&["--driver", "570.124.06", "--gpu", "RTX 5090"]);
    assert_eq!(solution["cuda_ceiling"], "12.8");
    // PyPI's 2.10.0+cu128 (read from the wheel) before 2.11.0+cu128 of PyTorch's index (a
    // partial row, on an index `--index pypi` does not reach); with `--index pytorch` the
    // partial row still comes after the derived one.
    let (build, minor_compat) = best(&solution);
    assert_eq!((build.as_str(), minor_compat), ("2.10.0+cu128", false));
    let all = solve_json(&[
        "--driver",
        "570.124.06",
        "--gpu",
        "RTX 5090",
        "--index",
        "pytorch",
    ]);
    assert_eq!(best(&all), ("2.10.0+cu128".to_string(), false));
    let rejected: Vec<&serde_json::Value> = solution["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["accepted"] == false)
        .collect();
    let old = rejected
        .iter()
        .find(|c| c["torch_build"] == "2.6.0+cu124")
        .unwrap();
    assert!(
        old["reasons"][0]
            .as_str()
            .unwrap()
            .contains("no kernels for GeForce RTX 5090 (sm_120)"),
        "{old}"
    );
    let new = rejected
        .iter()
        .find(|c| c["torch_build"] == "2.11.0+cu130")
        .unwrap();
    assert!(
        new["reasons"][0]
            .as_str()
            .unwrap()
            .contains("CUDA 13.0 needs 580.65.06"),
        "{new}"
    );
}

/// Issue 24: Blackwell GPUs were offered R550 builds through minor-version compatibility;
/// they do not run on an R550 driver at all.
#[test]
fn solve_blackwell_on_driver_550_offers_nothing_and_says_why() {
    for gpu in ["B200", "RTX 5090"] {
        let (code, stdout, _) = run(&["solve", "--driver", "550.54.15", "--gpu", gpu]);
        assert_eq!(code, 1, "{gpu}:\n{stdout}");
        assert!(stdout.contains("no torch build fits."), "{gpu}:\n{stdout}");
        assert!(
            stdout.contains("driver does not support the GPU: "),
            "{gpu}:\n{stdout}"
        );
        assert!(
            stdout.contains("hint: install the R570 driver branch"),
            "{gpu}:\n{stdout}"
        );
        let solution = solve_json(&["--driver", "550.54.15", "--gpu", gpu]);
        let candidates = solution["candidates"].as_array().unwrap();
        assert!(candidates.iter().all(|c| c["accepted"] == false));
        let reason = candidates[0]["reasons"][0].as_str().unwrap();
        assert!(
            reason.contains("driver 550.54.15 does not support it at all"),
            "{reason}"
        );
        assert_eq!(
            solution["gpu_drivers"][0]["min_branch"], "R570",
            "{solution}"
        );
    }
    let b200 = solve_json(&["--driver", "550.54.15", "--gpu", "B200"]);
    assert_eq!(b200["gpu_drivers"][0]["min_driver"], "570.133.20");
    assert!(b200["candidates"][0]["reasons"][0]
        .as_str()
        .unwrap()
        .contains("B200 (sm_100) needs driver 570.133.20 or later (R570 branch)"));
    // On an R570 driver the Blackwell-capable builds come back.
    let b200 = solve_json(&["--driver", "570.133.20", "--gpu", "B200"]);
    assert_eq!(best(&b200), ("2.10.0+cu128".to_string(), false));
    let recipe = b200["candidates"][0]["recipe"].as_str().unwrap();
    assert!(recipe.contains("driver_floor: \"570.133.20\""), "{recipe}");
}

/// Issue 24: `--torch 2.5` meant `==2.5` (2.5.0); it is the 2.5 series, and says so.
#[test]
fn solve_torch_two_parts_is_a_series() {
    let (code, stdout, _) = run(&[
        "solve",
        "--driver",
        "550.54.15",
        "--gpu",
        "RTX 3090",
        "--torch",
        "2.5",
    ]);
    assert_eq!(code, 0, "{stdout}");
    assert!(
        stdout.contains("note: torch 2.5 means the 2.5 series (==2.5.*); picked 2.5.1"),
        "{stdout}"
    );
    let series = solve_json(&[
        "--driver",
        "550.54.15",
        "--gpu",
        "RTX 3090",
        "--torch",
        "2.5",
    ]);
    assert_eq!(best(&series).0, "2.5.1+cu124");
    let exact = solve_json(&[
        "--driver",
        "550.54.15",
        "--gpu",
        "RTX 3090",
        "--torch",
        "2.5.0",
    ]);
    assert_eq!(best(&exact).0, "2.5.0+cu124");
    assert!(exact.get("notes").is_none(), "{exact}");
}

/// A recipe's `version: "2.4"` validates as the 2.4 series, resolved to 2.4.1.
#[test]
fn validate_torch_two_parts_names_the_release_chosen() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_recipe(&dir, "name: series\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"530.30.02\"\ncuda: { version: \"12.1\" }\ntorch: { version: \"2.4\" }\n");
    let (code, stdout, _) = run(&["validate", &path]);
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("valid (torch 2.4.1+cu121"), "{stdout}");
    assert!(
        stdout.contains("note[torch-series]: torch \"2.4\" means the 2.4 series; picked 2.4.1"),
        "{stdout}"
    );
}

#[test]
fn solve_driver_550_gtx_1080_ti() {
    let solution = solve_json(&["--driver", "550.54.15", "--gpu", "GTX 1080 Ti"]);
    assert_eq!(solution["cuda_ceiling"], "12.4");
    // 2.7.1+cu118 still carries sm_61 and CUDA 11.8 runs natively on 550, but its row is
    // unconfirmed and on PyTorch's index: PyPI's newest build that fits, read from the
    // wheel, comes first, and with `--index pytorch` too.
    let (build, minor_compat) = best(&solution);
    assert_eq!((build.as_str(), minor_compat), ("2.6.0+cu124", false));
    assert_eq!(solution["candidates"][0]["status"], "derived");
    let all = solve_json(&[
        "--driver",
        "550.54.15",
        "--gpu",
        "GTX 1080 Ti",
        "--index",
        "pytorch",
    ]);
    assert_eq!(best(&all), ("2.6.0+cu124".to_string(), false));
    let unconfirmed = accepted(&all)
        .iter()
        .position(|c| c["torch_build"] == "2.7.1+cu118")
        .unwrap();
    assert!(accepted(&all)[..unconfirmed]
        .iter()
        .all(|c| c["status"] != "unconfirmed" && c["status"] != "partial"));
}

#[test]
fn snapshot_solve_output() {
    let (code, stdout, _) = run(&[
        "solve",
        "--driver",
        "535.104.05",
        "--gpu",
        "RTX 3090",
        "--top",
        "3",
    ]);
    assert_eq!(code, 0);
    insta::assert_snapshot!(stdout);
}

#[test]
fn snapshot_matrix_torch_filter() {
    let (code, stdout, _) = run(&["matrix", "--torch", ">=2.4,<2.5"]);
    assert_eq!(code, 0);
    insta::assert_snapshot!(stdout);
}

#[test]
fn matrix_gpu_filter_keeps_only_builds_with_kernels() {
    let (code, stdout, _) = run(&["matrix", "--json", "--gpu", "RTX 5090"]);
    assert_eq!(code, 0);
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    // Which matrix answered is part of the output.
    assert_eq!(json["matrix"]["source"], "embedded");
    assert!(json["matrix"]["generated"].is_string(), "{json}");
    let rows = json["rows"].as_array().unwrap();
    assert!(!rows.is_empty());
    assert!(rows.iter().all(|row| row["arch_list"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a.as_str().unwrap().starts_with("12."))));
}

#[test]
fn bad_input_to_solve_is_a_clear_error() {
    let (code, _, stderr) = run(&["solve", "--gpu", "Voodoo 5"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("GPU `Voodoo 5` is not in the matrix"),
        "{stderr}"
    );
    let (code, _, stderr) = run(&["solve", "--driver", "twelve"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("not a valid NVIDIA driver version"),
        "{stderr}"
    );
}

/// Issue 24: the GPUs users rent and the ways they type them are found.
#[test]
fn solve_finds_cloud_gpus_and_typed_names() {
    for (query, name) in [
        ("A10G", "A10G"),
        ("A6000", "RTX A6000"),
        ("K80", "Tesla K80"),
        ("rtx3090", "GeForce RTX 3090"),
        ("NVIDIA L40S", "L40S"),
        ("h100-sxm5-80gb", "H100"),
    ] {
        let solution = solve_json(&["--gpu", query]);
        assert_eq!(solution["gpus"][0]["name"], name, "{query}");
    }
}

/// Issue 24: `check --gpu` with a mistyped name says which known names are closest, as
/// `solve` and `validate` do, before it reads any image.
#[test]
fn check_with_an_unknown_gpu_says_did_you_mean() {
    let (code, _, stderr) = run(&["check", "/nonexistent", "--gpu", "RTX 30900"]);
    assert_ne!(code, 0, "{stderr}");
    assert!(
        stderr.contains("unknown GPU `RTX 30900`; did you mean `GeForce RTX 3090`"),
        "{stderr}"
    );
    assert!(stderr.contains("--cc X.Y"), "{stderr}");
}

/// Issue 24: an unknown GPU name says which known names are closest, and what to do.
#[test]
fn unknown_gpu_names_say_did_you_mean() {
    let (code, _, stderr) = run(&["solve", "--gpu", "RTX 30900"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("GPU `RTX 30900` is not in the matrix; did you mean `GeForce RTX 3090`"),
        "{stderr}"
    );
    assert!(stderr.contains("cudastack matrix --table gpus"), "{stderr}");
    let (code, stdout, _) = run(&[
        "validate",
        "tests/fixtures/recipes/invalid/unknown-gpu.yaml",
    ]);
    assert_eq!(code, 1);
    assert!(!stdout.contains("matrix --gpus"), "{stdout}");
    assert!(
        stdout.contains("`cudastack matrix --table gpus`"),
        "{stdout}"
    );
}

fn write_recipe(dir: &tempfile::TempDir, recipe: &str) -> String {
    let path = dir.path().join("solved.yaml");
    std::fs::write(&path, recipe).unwrap();
    path.to_str().unwrap().to_string()
}

/// Issue 24: `solve --cc 8.9` wrote `gpus: ["sm_89"]` and "sm_89 (sm_89) runs ...".
#[test]
fn solve_by_compute_capability_writes_what_the_recipe_accepts() {
    let solution = solve_json(&["--driver", "550.54.15", "--cc", "8.9"]);
    let best = &solution["candidates"][0];
    let recipe = best["recipe"].as_str().unwrap();
    assert!(recipe.contains("gpus: [\"8.9\"]\n"), "{recipe}");
    let reasons = best["reasons"].to_string();
    assert!(!reasons.contains("sm_89 (sm_89)"), "{reasons}");
    assert!(reasons.contains("sm_89 runs its sm_"), "{reasons}");
    let dir = tempfile::tempdir().unwrap();
    let (code, stdout, _) = run(&["validate", &write_recipe(&dir, recipe)]);
    assert_eq!(code, 0, "{recipe}\n{stdout}");
}

/// Without `--driver`, solve says what the GPU's hosts need and writes a recipe whose floor
/// runs it, which `validate` accepts (issue 24).
#[test]
fn solve_without_a_driver_names_the_gpus_minimum_and_its_recipe_validates() {
    let (code, stdout, _) = run(&["solve", "--gpu", "B200", "--top", "1"]);
    assert_eq!(code, 0, "{stdout}");
    assert!(
        stdout.contains(
            "note: B200 (sm_100) needs driver 570.133.20 or later (R570 branch) (confirmed)"
        ),
        "{stdout}"
    );
    let solution = solve_json(&["--gpu", "RTX 5090"]);
    let recipe = solution["candidates"][0]["recipe"].as_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (code, stdout, _) = run(&["validate", &write_recipe(&dir, recipe)]);
    assert_eq!(code, 0, "{recipe}\n{stdout}");
}

/// Issue 24: `solve --gpu GH200` suggested an amd64 recipe that `validate` rejected.
#[test]
fn solve_for_an_arm_only_gpu_writes_an_arm64_recipe() {
    for gpu in ["GH200", "GB200"] {
        let solution = solve_json(&["--gpu", gpu]);
        let best = &solution["candidates"][0];
        assert_eq!(best["accepted"], true, "{gpu}: {solution}");
        assert_eq!(best["index"], "pypi", "{gpu}");
        let recipe = best["recipe"].as_str().unwrap();
        assert!(recipe.contains("platforms: [linux/arm64]\n"), "{recipe}");
        let dir = tempfile::tempdir().unwrap();
        let (code, stdout, _) = run(&["validate", &write_recipe(&dir, recipe)]);
        assert_eq!(code, 0, "{gpu}: {recipe}\n{stdout}");
        // Builds without aarch64 CUDA wheels on PyPI are rejected with the reason: a limit
        // of cudastack's (it locks arm64 torch from PyPI only), said to be one.
        let old = solution["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["torch_build"] == "2.4.1+cu121" && c["index"] == "pypi")
            .unwrap();
        assert_eq!(old["accepted"], false);
        // GB200 (sm_100) finds no kernels in it, a fact that comes first; GH200 (sm_90)
        // would run it.
        let (by, why) = match gpu {
            "GB200" => ("compatibility", "no kernels for GB200 (sm_100)"),
            _ => (
                "cudastack_limit",
                "PyPI's first CUDA linux/arm64 torch is 2.11.0 (2.4.1 there is CPU-only)",
            ),
        };
        assert_eq!(old["rejected_by"], by, "{old}");
        assert!(old["reasons"][0].as_str().unwrap().contains(why), "{old}");
    }
}

/// Issue 24: an unconfirmed row ranked below far older builds of the same certainty, and the
/// text output never showed a row's status. Newest torch first among builds alike in
/// reach, minor-version compatibility and certainty (confirmed rows before the rest).
#[test]
fn solve_ranks_newest_torch_first_and_shows_status() {
    let solution = solve_json(&[
        "--driver",
        "535.104.05",
        "--gpu",
        "RTX 3090",
        "--index",
        "pytorch",
    ]);
    let accepted: Vec<&serde_json::Value> = solution["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["accepted"] == true && c["minor_compat"] == false)
        .collect();
    let position = |label: &str| {
        accepted
            .iter()
            .position(|c| c["torch_build"] == label)
            .unwrap_or_else(|| panic!("{label} not accepted"))
    };
    assert!(position("2.7.1+cu118") < position("2.6.0+cu118"));
    assert!(position("2.5.1+cu121") < position("2.0.0+cu118"));
    let sure = |c: &serde_json::Value| {
        !["partial", "unconfirmed"].contains(&c["status"].as_str().unwrap())
    };
    for tier in [true, false] {
        let torch: Vec<pep440_rs::Version> = accepted
            .iter()
            .filter(|c| sure(c) == tier)
            .map(|c| c["torch"].as_str().unwrap().parse().unwrap())
            .collect();
        assert!(torch.windows(2).all(|pair| pair[0] >= pair[1]), "{torch:?}");
    }
    assert!(accepted.iter().all(|c| [
        "derived",
        "confirmed",
        "secondary",
        "partial",
        "unconfirmed"
    ]
    .contains(&c["status"].as_str().unwrap())));

    let (code, stdout, _) = run(&[
        "solve",
        "--driver",
        "535.104.05",
        "--gpu",
        "RTX 3090",
        "--top",
        "40",
    ]);
    assert_eq!(code, 0);
    assert!(stdout.contains(", unconfirmed)"), "{stdout}");
    assert!(
        stdout.contains("status (how sure cudastack's matrix is of a row):"),
        "{stdout}"
    );
    assert!(!stdout.contains("ConfirmedSecondary"), "{stdout}");
}

/// Issue 24: the matrix says which data it shows and how old it is.
#[test]
fn matrix_names_the_data_it_shows_and_its_date() {
    for table in ["torch", "cuda", "cudnn", "gpus"] {
        let (code, stdout, _) = run(&["matrix", "--table", table]);
        assert_eq!(code, 0);
        let generated = cudastack::matrix::source::embedded_generated().unwrap();
        assert_eq!(
            stdout.lines().next(),
            Some(format!("matrix: embedded, generated {generated}").as_str()),
            "{table}"
        );
        let (code, stdout, _) = run(&["matrix", "--json", "--table", table]);
        assert_eq!(code, 0);
        let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(json["matrix"]["source"], "embedded", "{table}");
        assert_eq!(
            json["matrix"]["generated"],
            generated.to_string(),
            "{table}"
        );
        assert!(!json["rows"].as_array().unwrap().is_empty(), "{table}");
    }
}

/// Issue 24: sm lists were unsorted ("86 37 90") and statuses printed as Rust names.
#[test]
fn matrix_tables_sort_sm_lists_and_print_plain_status_words() {
    let (code, stdout, _) = run(&["matrix"]);
    assert_eq!(code, 0);
    assert!(!stdout.contains("86 37 90"), "{stdout}");
    assert!(stdout.contains("37 50 60 70 75 80 86 90"), "{stdout}");
    for internal in [
        "Derived",
        "Confirmed",
        "ConfirmedSecondary",
        "Unconfirmed",
        "Partial",
    ] {
        assert!(
            !stdout.contains(&format!(" {internal} ")),
            "{internal}: {stdout}"
        );
    }
    let (code, stdout, _) = run(&["matrix", "--table", "gpus"]);
    assert_eq!(code, 0);
    assert!(stdout.contains("A10G"), "{stdout}");
    assert!(stdout.contains("RTX A6000 (also A6000)"), "{stdout}");
    // Issue 24: each GPU's own minimum driver.
    let row = |name: &str| {
        stdout
            .lines()
            .find(|line| line.contains(&format!("│ {name} ")))
            .unwrap_or_else(|| panic!("no row for {name}: {stdout}"))
            .to_string()
    };
    assert!(row("B200").contains("570.133.20 (confirmed)"), "{stdout}");
    assert!(
        row("GeForce RTX 5090").contains("R570 (partial)"),
        "{stdout}"
    );
    assert!(
        row("Tesla V100").contains("up to R580 (confirmed)"),
        "{stdout}"
    );
    assert!(row("Tesla T4").contains(" - "), "{stdout}");
    assert!(stdout.contains("secondary"), "{stdout}");
    assert!(!stdout.contains("ConfirmedSecondary"), "{stdout}");
}

/// `solve --write` is the first step of a first image: the recipe it writes validates, and
/// an existing file (maybe a recipe with a lock beside it) is never replaced.
#[test]
fn solve_write_saves_a_recipe_that_validates_and_never_replaces_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = dir.path().join("my-stack.yaml");
    let recipe_arg = recipe.to_str().unwrap();
    let args = [
        "solve",
        "--driver",
        "550.54.15",
        "--gpu",
        "H100",
        "--torch",
        "2.4",
        "--write",
        recipe_arg,
    ];
    let (code, _, stderr) = run(&args);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("next: cudastack lock"), "{stderr}");
    let text = std::fs::read_to_string(&recipe).unwrap();
    assert!(text.contains("torch: { version: \"2.4.1\" }"), "{text}");
    assert!(text.contains("gpus: [\"H100\"]"), "{text}");
    let (code, stdout, stderr) = run(&["validate", recipe_arg]);
    assert_eq!(code, 0, "{stdout}{stderr}");

    std::fs::write(&recipe, "keep me").unwrap();
    let (code, _, stderr) = run(&args);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("does not replace it"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&recipe).unwrap(), "keep me");

    // No answer, no file: the reasons say why.
    let none = dir.path().join("none.yaml");
    let (code, _, stderr) = run(&[
        "solve",
        "--driver",
        "450.80.02",
        "--gpu",
        "B200",
        "--write",
        none.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("no recipe was written"), "{stderr}");
    assert!(!none.exists());
}

/// Issue 18: an `apt:` package that would add a second cuDNN fails `validate` with its
/// code, reason and hint; ordinary system packages validate.
#[test]
fn validate_apt_refuses_a_second_cudnn_and_accepts_system_tools() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = |apt: &str| {
        format!("name: apt\nbase: {{ debian: bookworm }}\npython: \"3.11\"\ndriver_floor: \"530.30.02\"\ncuda: {{ version: \"12.1\" }}\ntorch: {{ version: \"2.4.1\" }}\napt: {apt}\n")
    };
    let (code, stdout, _) = run(&["validate", &write_recipe(&dir, &recipe("[git, libcudnn8]"))]);
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.contains("invalid, 1 error"), "{stdout}");
    assert!(
        stdout.contains(
            "error[apt-second-cudnn]: apt package `libcudnn8` would install a second cuDNN"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("one copy of every library"), "{stdout}");
    assert!(
        stdout.contains("hint: remove it from `apt:`; torch's cuDNN is in the image already"),
        "{stdout}"
    );
    let (code, stdout, _) = run(&[
        "--json",
        "validate",
        &write_recipe(&dir, &recipe("[libcuda1]")),
    ]);
    assert_eq!(code, 1, "{stdout}");
    let value: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(value[0]["problems"][0]["code"], "apt-driver-library");
    let (code, stdout, _) = run(&[
        "validate",
        &write_recipe(&dir, &recipe("[git, openssh-client, libgl1]")),
    ]);
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains(": valid (torch 2.4.1+cu121"), "{stdout}");
}

fn accepted(solution: &serde_json::Value) -> Vec<&serde_json::Value> {
    solution["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["accepted"] == true)
        .collect()
}

/// H100 on driver 535: the best answer was 2.7.1+cu118 from PyTorch's own index, marked
/// unconfirmed, above confirmed PyPI builds, and its recipe did not lock where only PyPI is
/// reachable. By default solve ranks what a recipe without `index:` locks (PyPI) first, and
/// confirmed rows before unconfirmed ones; `--index pytorch` lets PyTorch's index in.
#[test]
fn solve_ranks_reachable_then_confirmed_builds_first() {
    let solution = solve_json(&["--driver", "535.104.05", "--gpu", "H100"]);
    assert_eq!(solution["index"], "pypi", "{solution}");
    let best = &solution["candidates"][0];
    assert_eq!(
        (&best["torch_build"], &best["index"], &best["status"]),
        (
            &serde_json::json!("2.4.1+cu121"),
            &serde_json::json!("pypi"),
            &serde_json::json!("derived")
        ),
        "{best}"
    );
    assert!(best["recipe"]
        .as_str()
        .unwrap()
        .contains("torch: { version: \"2.4.1\" }\n"));
    let reachable: Vec<bool> = accepted(&solution)
        .iter()
        .map(|c| c["reachable"].as_bool().unwrap())
        .collect();
    assert!(
        reachable.windows(2).all(|pair| pair[0] >= pair[1]),
        "{reachable:?}"
    );
    assert!(reachable.contains(&false), "{reachable:?}");
    let (code, stdout, _) = run(&["solve", "--driver", "535.104.05", "--gpu", "H100"]);
    assert_eq!(code, 0);
    assert!(
        stdout.contains("with `--index pytorch` (where download.pytorch.org is reachable) the best answer would be torch 2.5.1+cu121 (confirmed)"),
        "{stdout}"
    );

    let all = solve_json(&[
        "--driver",
        "535.104.05",
        "--gpu",
        "H100",
        "--index",
        "pytorch",
    ]);
    assert_eq!(all["index"], "pytorch");
    assert_eq!(best_of(&all), ("2.5.1+cu121", "confirmed"));
    // Among native builds, every confirmed row comes before the unconfirmed 2.7.1+cu118.
    let native: Vec<&serde_json::Value> = accepted(&all)
        .into_iter()
        .filter(|c| c["minor_compat"] == false)
        .collect();
    let unsure = native
        .iter()
        .position(|c| ["partial", "unconfirmed"].contains(&c["status"].as_str().unwrap()))
        .unwrap();
    assert!(native[unsure..]
        .iter()
        .all(|c| ["partial", "unconfirmed"].contains(&c["status"].as_str().unwrap())));
    assert!(native[..unsure]
        .iter()
        .any(|c| c["torch_build"] == "2.4.1+cu121" && c["index"] == "pypi"));
}

fn best_of(solution: &serde_json::Value) -> (&str, &str) {
    let best = &solution["candidates"][0];
    assert_eq!(best["accepted"], true, "{solution}");
    (
        best["torch_build"].as_str().unwrap(),
        best["status"].as_str().unwrap(),
    )
}

/// `--index` names what the host reaches: one variant (`cu118` or its URL), PyTorch's
/// index or a mirror of its root; the recipe names the index the lock will read.
#[test]
fn solve_index_names_what_the_host_reaches() {
    let mirror = solve_json(&[
        "--driver",
        "535.104.05",
        "--gpu",
        "H100",
        "--index",
        "https://mirror.example/whl/",
    ]);
    assert_eq!(best_of(&mirror), ("2.5.1+cu121", "confirmed"));
    let recipe = mirror["candidates"][0]["recipe"].as_str().unwrap();
    assert!(
        recipe.contains(
            "torch: { version: \"2.5.1\", index: \"https://mirror.example/whl/cu121\" }\n"
        ),
        "{recipe}"
    );
    let dir = tempfile::tempdir().unwrap();
    let (code, stdout, _) = run(&["validate", &write_recipe(&dir, recipe)]);
    assert_eq!(code, 0, "{recipe}\n{stdout}");

    let one = solve_json(&[
        "--driver",
        "535.104.05",
        "--gpu",
        "H100",
        "--index",
        "cu118",
    ]);
    let reachable: Vec<(&str, &str)> = accepted(&one)
        .iter()
        .filter(|c| c["reachable"] == true)
        .map(|c| {
            (
                c["torch_build"].as_str().unwrap(),
                c["index"].as_str().unwrap(),
            )
        })
        .collect();
    assert!(reachable
        .iter()
        .all(|(build, index)| *index == "pypi" || build.ends_with("+cu118")));
    assert_eq!(best_of(&one), ("2.5.1+cu118", "confirmed"));

    let (code, _, stderr) = run(&[
        "solve",
        "--gpu",
        "H100",
        "--index",
        "ftp://mirror.example/whl",
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--index"), "{stderr}");
}

/// When no PyPI build fits, the best answer needs PyTorch's index, and solve says that the
/// lock needs it reachable.
#[test]
fn solve_says_when_the_best_answer_needs_an_index_the_host_may_not_reach() {
    let (code, stdout, _) = run(&[
        "solve",
        "--driver",
        "520.61.05",
        "--gpu",
        "H100",
        "--top",
        "1",
    ]);
    assert_eq!(code, 0, "{stdout}");
    assert!(
        stdout.contains("note: no build on PyPI fits; the best answer needs PyTorch's cu118 index (https://download.pytorch.org/whl/cu118)"),
        "{stdout}"
    );
    assert!(stdout.contains("`cudastack lock`"), "{stdout}");
}

/// GH200 on R550: "no torch build fits" read as a compatibility fact; it is cudastack's
/// limit (arm64 torch is locked from PyPI only). The answer says so apart from the
/// compatibility rejections, and ends with the smallest changes that make something fit.
#[test]
fn solve_words_cudastack_limits_apart_and_ends_with_the_smallest_change() {
    let (code, stdout, _) = run(&["solve", "--driver", "550.54.15", "--gpu", "GH200"]);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("cudastack locks linux/arm64 torch from PyPI only; PyPI's first CUDA linux/arm64 torch is 2.11.0"),
        "{stdout}"
    );
    assert!(
        stdout.contains("\nruled out by cudastack's own limits, not by compatibility ("),
        "{stdout}"
    );
    let tail = stdout
        .rsplit("smallest changes that make a build fit:")
        .next()
        .unwrap();
    assert!(
        stdout.contains("smallest changes that make a build fit:")
            && tail.contains("  - driver 580.65.06 or newer (R580 branch): torch 2.14.1+cu130"),
        "{stdout}"
    );
    assert!(tail.contains("instead of GH200"), "{stdout}");

    let solution = solve_json(&["--driver", "550.54.15", "--gpu", "GH200"]);
    let candidates = solution["candidates"].as_array().unwrap();
    let by = |label: &str| {
        candidates
            .iter()
            .find(|c| c["torch_build"] == label)
            .unwrap_or_else(|| panic!("{label}"))
    };
    assert_eq!(by("2.14.1+cu130")["rejected_by"], "compatibility");
    assert_eq!(by("2.10.0+cu128")["rejected_by"], "cudastack_limit");
    assert_eq!(by("2.6.0+cu126")["rejected_by"], "cudastack_limit");
    assert!(by("2.6.0+cu126")["reasons"][0]
        .as_str()
        .unwrap()
        .starts_with("cudastack's limit, not the stack's: "));
    let driver = &solution["changes"][0];
    assert_eq!(
        (&driver["kind"], &driver["driver"], &driver["torch_build"]),
        (
            &serde_json::json!("driver"),
            &serde_json::json!("580.65.06"),
            &serde_json::json!("2.14.1+cu130")
        ),
        "{solution}"
    );
}

/// The smallest change is computed by solving again with one change at a time: another
/// Python, a GPU left out, a driver branch.
#[test]
fn solve_nothing_fits_names_another_python_or_gpu() {
    let (code, stdout, _) = run(&[
        "solve",
        "--driver",
        "550.54.15",
        "--gpu",
        "A100",
        "--python",
        "3.15",
    ]);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("  - Python 3.14 instead of 3.15: torch "),
        "{stdout}"
    );
    assert!(
        stdout.contains("  - driver 580.65.06 or newer (R580 branch): torch 2.15.0+cu132"),
        "{stdout}"
    );

    let (code, stdout, _) = run(&[
        "solve",
        "--driver",
        "535.104.05",
        "--gpu",
        "A100",
        "--gpu",
        "RTX 5090",
    ]);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("  - without GeForce RTX 5090: torch 2.4.1+cu121"),
        "{stdout}"
    );
    assert!(
        stdout.contains("  - the R570 driver branch or newer: torch "),
        "{stdout}"
    );
}
