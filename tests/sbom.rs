//! The SBOM of every committed lock (runtime, devel, arm64, and a source build), checked by
//! the reference validators: SPDX 2.3 by `pyspdxtools -i` (PyPI `spdx-tools`). The CUDA
//! components of the torch 2.4.1 image against its lock; determinism; licenses read from
//! real wheels of the lock, downloaded from PyPI and checked against the lock's sha256.
//!
//! The validators are Python programs: a test that needs one it cannot find skips through
//! the gate (fails under CUDASTACK_REQUIRE=1); install with `pip install spdx-tools`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use cudastack::audit::kernels::CoverageGroup;
use cudastack::digest::Digest;
use cudastack::lock::lockfile::{Artifact, ArtifactKind, Lockfile};
use cudastack::matrix::{Matrix, ResolvedRecipe};
use cudastack::sbom::{self, BuiltWheel, SbomInput, Summary};
use cudastack::stack::image_config::{stack_config, StackFacts};
use cudastack::target_gpu::TargetGpu;
use cudastack::verify::check::ImageClaims;
use serde_json::Value;

use crate::gate;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every committed lock, with the recipe it was made from.
fn committed_locks() -> Vec<(PathBuf, PathBuf)> {
    let mut locks: Vec<(PathBuf, PathBuf)> = fs_err::read_dir(repo().join("recipes"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "lock"))
        .map(|lock| {
            let name = lock.file_name().unwrap().to_string_lossy().into_owned();
            // `X.linux-arm64.lock` is the arm64 lock of `X.yaml`.
            let stem = name
                .trim_end_matches(".lock")
                .trim_end_matches(".linux-arm64")
                .to_string();
            (lock.clone(), lock.with_file_name(format!("{stem}.yaml")))
        })
        .collect();
    locks.sort();
    assert!(locks.len() >= 15, "{locks:?}");
    locks
}

/// The coverage groups the kernel audit records for a torch image (the libraries' real
/// paths in the image; the targets as cuDNN 9.1 and torch 2.4.1 carry them).
fn kernel_groups(lock: &Lockfile) -> Vec<CoverageGroup> {
    let cuda_lib = match lock.target.arch.wheel_arch() {
        "aarch64" => "targets/sbsa-linux/lib",
        _ => "targets/x86_64-linux/lib",
    };
    let site = format!("/usr/local/lib/python{}/dist-packages", lock.target.python);
    serde_json::from_value(serde_json::json!([
        {
            "sass": ["sm_50", "sm_60", "sm_70", "sm_80", "sm_86", "sm_90"],
            "ptx": [{"arch": "sm_90", "isa": "8.1"}],
            "libraries": [
                format!("/usr/local/cuda-12.1/{cuda_lib}/libcudnn_engines_precompiled.so.9.1.0"),
                format!("/usr/local/cuda-12.1/{cuda_lib}/libcublasLt.so.12.1.3.1"),
            ],
        },
        {
            "sass": ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"],
            "ptx": [],
            "libraries": [
                format!("{site}/torch/lib/libtorch_cuda.so"),
                format!("/usr/local/cuda-12.1/{cuda_lib}/libnccl.so.2"),
                "/usr/lib/x86_64-linux-gnu/libunknown.so.1".to_string(),
            ],
        },
    ]))
    .unwrap()
}

/// What the image config of `recipe` built from `lock` states: the labels the stack writes
/// (src/stack/image_config.rs), with the kernel audit's.
fn claims_of(resolved: &ResolvedRecipe, lock: &Lockfile) -> ImageClaims {
    let version = |pick: &dyn Fn(&str) -> bool| {
        lock.artifacts
            .iter()
            .find(|a| pick(&a.name))
            .map(|a| a.version.clone())
    };
    let facts = StackFacts {
        cuda_runtime: version(&|n| n.starts_with("nvidia-cuda-runtime")),
        cudnn: version(&|n| n.starts_with("nvidia-cudnn")),
        torch: version(&|n| n == "torch"),
        os: None,
        created: "2024-10-01T00:00:00Z".into(),
    };
    let config = stack_config(resolved, None, &facts, lock.target.arch)
        .with_kernel_labels(&kernel_groups(lock), None);
    let env: BTreeMap<String, String> = config.env.iter().cloned().collect();
    ImageClaims::from_labels_and_env(&config.labels, &env, &[])
}

struct Image {
    name: String,
    lock: Lockfile,
    claims: ImageClaims,
    built: Vec<BuiltWheel>,
    targets: Vec<TargetGpu>,
    created: u64,
}

impl Image {
    fn of(lock_path: &Path, recipe_path: &Path) -> Image {
        let lock = Lockfile::read(lock_path).unwrap();
        let resolved = ResolvedRecipe::load(recipe_path, Matrix::embedded()).unwrap();
        let recipe = resolved.recipe();
        Image {
            name: format!("{}:latest", recipe.name),
            claims: claims_of(&resolved, &lock),
            // As the build records them: the recipe's `gpus:` as validation resolved them.
            targets: resolved.target_gpus().to_vec(),
            created: recipe.source_date_epoch.unwrap_or(1_727_740_800),
            lock,
            built: Vec::new(),
        }
    }

    fn spdx(&self, licenses: &dyn Fn(&Artifact) -> Option<String>) -> Vec<u8> {
        sbom::spdx_json(&self.input(licenses))
    }

    fn input<'a>(&'a self, licenses: &'a dyn Fn(&Artifact) -> Option<String>) -> SbomInput<'a> {
        SbomInput {
            name: &self.name,
            image: Some(Digest::of_bytes(self.name.as_bytes())),
            lock: &self.lock,
            claims: &self.claims,
            built: &self.built,
            targets: &self.targets,
            created: self.created,
            licenses,
        }
    }
}

fn no_licenses(_: &Artifact) -> Option<String> {
    None
}

/// A real sdist of the fixture extension (tests/fixtures/cuda_ext): its gzip tar's bytes.
fn cuda_ext_sdist() -> Vec<u8> {
    let mut archive = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::default(),
    ));
    archive
        .append_dir_all("cuda_ext-0.1.0", repo().join("tests/fixtures/cuda_ext"))
        .unwrap();
    archive.into_inner().unwrap().finish().unwrap()
}

/// The CUDA 13.0 image with a `build:` entry, as `lock` records one (docs/source-builds.md):
/// the sdist, the builder's wheels (nvcc, cicc and the crt headers of the devel lock) and
/// Debian packages, and the wheel `build` compiled, as the image's label records it.
fn source_build_image() -> Image {
    let recipes = repo().join("recipes");
    let mut image = Image::of(
        &recipes.join("torch2.11.0-cu130-py3.11.lock"),
        &recipes.join("torch2.11.0-cu130-py3.11.yaml"),
    );
    let sdist_bytes = cuda_ext_sdist();
    let template = image.lock.artifact("setuptools").unwrap().clone();
    let sdist = Artifact {
        kind: ArtifactKind::Sdist,
        name: "cuda-ext".into(),
        version: "0.1.0".into(),
        filename: "cuda_ext-0.1.0.tar.gz".parse().unwrap(),
        url: "http://127.0.0.1:8080/packages/cuda_ext-0.1.0.tar.gz"
            .parse()
            .unwrap(),
        sha256: Digest::of_bytes(&sdist_bytes),
        size: sdist_bytes.len() as u64,
        required_by: vec!["<root>".into()],
        ..template
    };
    sdist.check().unwrap();
    let devel = Lockfile::read(&recipes.join("torch2.15.0-cu132-py3.11-devel.lock")).unwrap();
    let build_wheels = [
        "nvidia-cuda-nvcc",
        "nvidia-nvvm",
        "nvidia-cuda-crt",
        "setuptools",
    ]
    .into_iter()
    .map(|name| Artifact {
        kind: ArtifactKind::BuildWheel,
        ..devel.artifact(name).unwrap().clone()
    });
    let build_debs: Vec<Artifact> = ["libc6", "libgcc-s1"]
        .into_iter()
        .map(|name| Artifact {
            kind: ArtifactKind::BuildDeb,
            ..image.lock.artifact(name).unwrap().clone()
        })
        .collect();
    image.lock.artifacts.push(sdist);
    image.lock.artifacts.extend(build_wheels.chain(build_debs));
    image.built = vec![BuiltWheel {
        name: "cuda-ext".into(),
        version: "0.1.0".into(),
        filename: "cuda_ext-0.1.0-cp311-cp311-linux_x86_64.whl".into(),
        sha256: Digest::of_bytes(b"the built wheel"),
    }];
    image
}

/// `pyspdxtools -i FILE`: (passed, its output). None when it is not installed.
fn pyspdxtools(file: &Path) -> Option<(bool, String)> {
    let output = Command::new("pyspdxtools")
        .arg("-i")
        .arg(file)
        .output()
        .ok()?;
    Some((
        output.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    ))
}

fn validator_missing() -> bool {
    if Command::new("pyspdxtools")
        .arg("--help")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return false;
    }
    gate::skip(
        "pyspdxtools",
        "`pyspdxtools` (PyPI spdx-tools) is not on PATH: pip install spdx-tools",
    );
    true
}

/// Write `bytes` as `<name>.spdx.json` under `dir` and validate it.
fn assert_valid_spdx(dir: &Path, name: &str, bytes: &[u8]) {
    let file = dir.join(format!("{name}.spdx.json"));
    fs_err::write(&file, bytes).unwrap();
    let (ok, output) = pyspdxtools(&file).expect("pyspdxtools runs");
    assert!(ok, "pyspdxtools refused {name}:\n{output}");
    assert!(
        !output.to_lowercase().contains("invalid") && !output.to_lowercase().contains("error"),
        "pyspdxtools on {name}:\n{output}"
    );
}

/// Every image of the committed locks and the source build, by name.
fn all_images() -> Vec<(String, Image)> {
    let mut images: Vec<(String, Image)> = committed_locks()
        .into_iter()
        .map(|(lock, recipe)| {
            let name = lock.file_name().unwrap().to_string_lossy().into_owned();
            (name, Image::of(&lock, &recipe))
        })
        .collect();
    images.push(("source-build".into(), source_build_image()));
    images
}

#[test]
fn every_committed_lock_gives_spdx_the_reference_validator_accepts() {
    if validator_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut last = Vec::new();
    for (name, image) in all_images() {
        let started = std::time::Instant::now();
        last = image.spdx(&no_licenses);
        eprintln!("{name}: {} bytes in {:?}", last.len(), started.elapsed());
        assert_valid_spdx(dir.path(), &name, &last);
    }
    // The check can fail: a license that is no SPDX id is refused.
    let mut broken: Value = serde_json::from_slice(&last).unwrap();
    broken["packages"][1]["licenseDeclared"] = "BSD-3".into();
    let file = dir.path().join("broken.spdx.json");
    fs_err::write(&file, serde_json::to_vec(&broken).unwrap()).unwrap();
    let (ok, output) = pyspdxtools(&file).unwrap();
    assert!(!ok && output.contains("BSD-3"), "{output}");
}

/// cyclonedx-python-lib's strict JSON schema validation of CycloneDX 1.6, over `files`:
/// (passed, output); None when the library (with its json-validation extra) is missing.
fn cyclonedx_validate(files: &[PathBuf]) -> Option<(bool, String)> {
    const SCRIPT: &str = r#"
import sys
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
validator = JsonStrictValidator(SchemaVersion.V1_6)
failed = False
for path in sys.argv[1:]:
    with open(path) as f:
        error = validator.validate_str(f.read())
    if error is not None:
        failed = True
        print(f"{path}: {error}")
    else:
        print(f"{path}: valid")
sys.exit(1 if failed else 0)
"#;
    let probe = Command::new("python3")
        .args(["-c", "import cyclonedx.validation.json, jsonschema"])
        .output()
        .ok()?;
    if !probe.status.success() {
        return None;
    }
    let output = Command::new("python3")
        .args(["-c", SCRIPT])
        .args(files)
        .output()
        .unwrap();
    Some((
        output.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    ))
}

/// One image of each kind: runtime, devel, arm64, a lock made against a local mirror
/// (127.0.0.1 URLs), and the source build. Not every lock: the validator checks each URL
/// against RFC 3987 at ~30 ms, ~5 s per document.
#[test]
fn each_kind_of_lock_gives_cyclonedx_the_reference_validator_accepts() {
    let kinds = [
        "torch2.4.1-cu121-py3.11.lock",
        "torch2.15.0-cu132-py3.11-devel.lock",
        "torch2.11.0-cu130-py3.11.linux-arm64.lock",
        "torch2.1.2-cu118-py3.11.lock",
        "source-build",
    ];
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    let images: Vec<(String, Image)> = all_images()
        .into_iter()
        .filter(|(name, _)| kinds.contains(&name.as_str()))
        .collect();
    assert_eq!(images.len(), kinds.len());
    for (name, image) in images {
        let file = dir.path().join(format!("{name}.cdx.json"));
        fs_err::write(&file, sbom::cyclonedx_json(&image.input(&no_licenses))).unwrap();
        files.push(file);
    }
    // The check can fail: a component type the schema does not know.
    let mut broken: Value = serde_json::from_slice(&fs_err::read(&files[0]).unwrap()).unwrap();
    broken["components"][0]["type"] = "wheel".into();
    let broken_file = dir.path().join("broken.cdx.json");
    fs_err::write(&broken_file, serde_json::to_vec(&broken).unwrap()).unwrap();
    files.push(broken_file.clone());
    let Some((ok, output)) = cyclonedx_validate(&files) else {
        gate::skip(
            "cyclonedx-python-lib",
            "python3 cannot import cyclonedx.validation.json: pip install 'cyclonedx-python-lib[json-validation]'",
        );
        return;
    };
    assert!(!ok, "{output}");
    assert_eq!(output.matches(": valid").count(), kinds.len(), "{output}");
    assert!(
        !output.contains(&format!("{}: valid", broken_file.display())),
        "{output}"
    );
}

/// The CycloneDX document says what the SPDX one says: the same packages, hashes and
/// purls, the image's facts as properties, build-only packages excluded from the image.
#[test]
fn cyclonedx_says_what_spdx_says() {
    let image = source_build_image();
    let spdx = image.spdx(&no_licenses);
    let (packages, _) = parse(&spdx);
    let bom: Value =
        serde_json::from_slice(&sbom::cyclonedx_json(&image.input(&no_licenses))).unwrap();
    let components = bom["components"].as_array().unwrap();
    assert_eq!(components.len() + 1, packages.len());
    for component in components {
        let id = format!("SPDXRef-{}", component["bom-ref"].as_str().unwrap());
        let package = &packages[&id];
        assert_eq!(component["name"], package["name"]);
        assert_eq!(component["version"], package["versionInfo"]);
        if let Some(hash) = component["hashes"][0]["content"].as_str() {
            assert_eq!(hash, sha256_of(package));
        }
        if let Some(purl) = component["purl"].as_str() {
            assert_eq!(purl, package["externalRefs"][0]["referenceLocator"]);
        }
        let excluded = component["scope"] == "excluded";
        assert_eq!(
            excluded,
            id.starts_with("SPDXRef-Build") || id.starts_with("SPDXRef-Sdist"),
            "{id}"
        );
    }
    let properties = bom["metadata"]["component"]["properties"]
        .as_array()
        .unwrap();
    assert!(properties
        .iter()
        .any(|p| p["name"] == "cudastack:driver-floor" && p["value"].is_string()));
    let nvcc = components
        .iter()
        .find(|c| c["name"] == "nvidia-cuda-nvcc")
        .unwrap();
    assert!(nvcc["properties"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["name"] == "cudastack:build-dependency-of-ref"));
}

/// A relationship: (from, type, to).
type Relationship = (String, String, String);

/// The packages of a document by SPDX id, and its relationships.
fn parse(bytes: &[u8]) -> (BTreeMap<String, Value>, Vec<Relationship>) {
    let document: Value = serde_json::from_slice(bytes).unwrap();
    let packages = document["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["SPDXID"].as_str().unwrap().to_string(), p.clone()))
        .collect();
    let relationships = document["relationships"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let text = |key: &str| r[key].as_str().unwrap().to_string();
            (
                text("spdxElementId"),
                text("relationshipType"),
                text("relatedSpdxElement"),
            )
        })
        .collect();
    (packages, relationships)
}

fn sha256_of(package: &Value) -> &str {
    package["checksums"][0]["checksumValue"].as_str().unwrap()
}

fn comments(package: &Value) -> Vec<String> {
    package["annotations"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|x| x["comment"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Each nvidia-* wheel of the torch 2.4.1 lock is a CUDA component the image contains,
/// with the wheel's version and sha256, expanded from the wheel's package.
#[test]
fn the_torch_2_4_1_image_lists_its_cuda_components_as_the_lock_pins_them() {
    let recipes = repo().join("recipes");
    let image = Image::of(
        &recipes.join("torch2.4.1-cu121-py3.11.lock"),
        &recipes.join("torch2.4.1-cu121-py3.11.yaml"),
    );
    let bytes = image.spdx(&no_licenses);
    let (packages, relationships) = parse(&bytes);
    let contained: Vec<&String> = relationships
        .iter()
        .filter(|(from, kind, _)| from == "SPDXRef-Image" && kind == "CONTAINS")
        .map(|(_, _, to)| to)
        .collect();
    let nvidia: Vec<&Artifact> = image
        .lock
        .artifacts
        .iter()
        .filter(|a| a.kind == ArtifactKind::Wheel && a.name.starts_with("nvidia-"))
        .collect();
    assert_eq!(nvidia.len(), 12);
    let mut names = Vec::new();
    for wheel in &nvidia {
        let wheel_id = packages
            .iter()
            .find(|(_, p)| p["name"] == wheel.name.as_str())
            .map(|(id, _)| id.clone())
            .unwrap();
        let (component_id, _, _) = relationships
            .iter()
            .find(|(_, kind, to)| kind == "EXPANDED_FROM_ARCHIVE" && *to == wheel_id)
            .unwrap_or_else(|| panic!("no component expanded from {}", wheel.name));
        let component = &packages[component_id];
        assert!(contained.contains(&component_id), "{component_id}");
        assert_eq!(component["versionInfo"], wheel.version.as_str());
        assert_eq!(sha256_of(component), wheel.sha256.hex());
        assert_eq!(sha256_of(&packages[&wheel_id]), wheel.sha256.hex());
        assert_eq!(component["downloadLocation"], wheel.url.to_string());
        names.push((
            component["name"].as_str().unwrap().to_string(),
            wheel.name.clone(),
        ));
    }
    for (expected, wheel) in [
        ("cuDNN", "nvidia-cudnn-cu12"),
        ("cuBLAS", "nvidia-cublas-cu12"),
        ("NCCL", "nvidia-nccl-cu12"),
        ("cudart", "nvidia-cuda-runtime-cu12"),
    ] {
        assert!(
            names.contains(&(expected.to_string(), wheel.to_string())),
            "{expected} from {wheel}: {names:?}"
        );
    }
    // The GPU facts: on the image, and per library on the component that holds it.
    let image_facts = comments(&packages["SPDXRef-Image"]);
    for fact in [
        "cudastack:driver-floor=530.30.02",
        "cudastack:cuda=12.1.105",
        "cudastack:cudnn=9.1.0.70",
        "cudastack:require-cuda=12.1",
    ] {
        assert!(
            image_facts.iter().any(|c| c == fact),
            "{fact}: {image_facts:?}"
        );
    }
    let cudnn = packages.values().find(|p| p["name"] == "cuDNN").unwrap();
    assert!(
        comments(cudnn).iter().any(|c| c.starts_with("cudastack:device-code=/usr/local/cuda-12.1/targets/x86_64-linux/lib/libcudnn_engines_precompiled.so.9.1.0: SASS sm_50")),
        "{:?}",
        comments(cudnn)
    );
    let torch = packages.values().find(|p| p["name"] == "torch").unwrap();
    assert!(comments(torch)
        .iter()
        .any(|c| c.contains("libtorch_cuda.so: SASS")));
    assert!(image_facts.iter().any(|c| c.contains("libunknown.so.1")));

    // The summary `inspect` prints, against the lock.
    let summary = Summary::of_spdx(&bytes).unwrap();
    let count = |kind| {
        image
            .lock
            .artifacts
            .iter()
            .filter(|a| a.kind == kind)
            .count()
    };
    assert_eq!(summary.debs, count(ArtifactKind::Deb));
    assert_eq!(summary.wheels, count(ArtifactKind::Wheel));
    assert_eq!(summary.cuda.len(), nvidia.len());
    for wheel in &nvidia {
        let from = format!("{} {}", wheel.name, wheel.version);
        let component = summary.cuda.iter().find(|c| c.from == from).unwrap();
        assert_eq!(component.version, wheel.version);
    }
    assert_eq!(summary.facts["driver-floor"], "530.30.02");
    // The recipe's four GPUs, resolved by the matrix.
    let targets: Vec<&str> = summary.facts["target-gpu"].split("; ").collect();
    assert_eq!(targets.len(), 4, "{targets:?}");
    for sm in ["(sm_80)", "(sm_90)", "(sm_89)", "(sm_86)"] {
        assert!(targets.iter().any(|t| t.ends_with(sm)), "{sm}: {targets:?}");
    }
    eprintln!("{}", serde_json::to_string_pretty(&summary).unwrap());
}

/// The source build: the sdist, the wheel built from it (GENERATED_FROM), the builder's
/// packages (BUILD_DEPENDENCY_OF), none of which but the built wheel is in the image.
#[test]
fn a_source_build_records_the_sdist_and_what_built_it() {
    let image = source_build_image();
    let bytes = image.spdx(&no_licenses);
    let (packages, relationships) = parse(&bytes);
    let id_of = |name: &str, purpose: &str| {
        packages
            .iter()
            .find(|(_, p)| p["name"] == name && p["primaryPackagePurpose"] == purpose)
            .map(|(id, _)| id.clone())
            .unwrap_or_else(|| panic!("{name} {purpose}"))
    };
    let sdist = id_of("cuda-ext", "SOURCE");
    let built = id_of("cuda-ext", "LIBRARY");
    let has = |from: &str, kind: &str, to: &str| {
        relationships
            .iter()
            .any(|r| r.0 == from && r.1 == kind && r.2 == to)
    };
    assert!(has(&built, "GENERATED_FROM", &sdist));
    assert!(has("SPDXRef-Image", "CONTAINS", &built));
    assert!(!has("SPDXRef-Image", "CONTAINS", &sdist));
    assert_eq!(
        sha256_of(&packages[&sdist]),
        image.lock.artifact("cuda-ext").unwrap().sha256.hex()
    );
    assert_eq!(sha256_of(&packages[&built]), image.built[0].sha256.hex());
    let builders: Vec<&Artifact> = image
        .lock
        .artifacts
        .iter()
        .filter(|a| matches!(a.kind, ArtifactKind::BuildWheel | ArtifactKind::BuildDeb))
        .collect();
    assert_eq!(builders.len(), 6);
    for builder in builders {
        let (id, _) = packages
            .iter()
            .find(|(id, p)| id.starts_with("SPDXRef-Build") && p["name"] == builder.name.as_str())
            .unwrap();
        assert!(has(id, "BUILD_DEPENDENCY_OF", &built), "{id}");
        assert!(!has("SPDXRef-Image", "CONTAINS", id), "{id}");
    }
    // libc6 is both in the image and in the builder: two packages, two ids.
    assert_eq!(
        packages.values().filter(|p| p["name"] == "libc6").count(),
        2
    );
    let summary = Summary::of_spdx(&bytes).unwrap();
    assert_eq!(summary.built_wheels, 1);
}

#[test]
fn the_same_inputs_give_the_same_bytes() {
    let image = source_build_image();
    let first = image.spdx(&no_licenses);
    assert_eq!(image.spdx(&no_licenses), first);
    // The lock's order does not matter; its content does.
    let mut reordered = source_build_image();
    reordered.lock.artifacts.reverse();
    assert_eq!(reordered.spdx(&no_licenses), first);
    let mut other = source_build_image();
    other.created += 1;
    let other_bytes = other.spdx(&no_licenses);
    assert_ne!(other_bytes, first);
    let namespace = |bytes: &[u8]| {
        serde_json::from_slice::<Value>(bytes).unwrap()["documentNamespace"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_ne!(namespace(&other_bytes), namespace(&first));
    assert!(namespace(&first)
        .starts_with("https://cudastack.dev/spdx/torch2.11.0-cu130-py3.11%3Alatest-"));
}

/// A wheel of the lock, downloaded from its URL into `dir` and checked against the lock's
/// sha256; None (after the gate) when the network is unavailable.
fn download(dir: &Path, artifact: &Artifact) -> Option<PathBuf> {
    let path = dir.join(&*artifact.filename);
    let output = Command::new("curl")
        .args(["-sSfL", "--max-time", "60", "-o"])
        .arg(&path)
        .arg(artifact.url.to_string())
        .output();
    match output {
        Ok(output) if output.status.success() => {}
        Ok(output) => {
            gate::skip(
                "network",
                format!(
                    "downloading {} failed (offline?): {}",
                    artifact.url,
                    String::from_utf8_lossy(&output.stderr).trim()
                ),
            );
            return None;
        }
        Err(error) => {
            gate::skip("curl", format!("curl is not available: {error}"));
            return None;
        }
    }
    assert_eq!(
        Digest::of_bytes(&fs_err::read(&path).unwrap()),
        artifact.sha256
    );
    Some(path)
}

/// Licenses from the METADATA of real wheels: PEP 639 `License-Expression` (filelock,
/// typing-extensions), none for NVIDIA's proprietary license; written as licenseDeclared,
/// and the document still validates.
#[test]
fn licenses_come_from_the_wheels_metadata() {
    let recipes = repo().join("recipes");
    let image = Image::of(
        &recipes.join("torch2.4.1-cu121-py3.11.lock"),
        &recipes.join("torch2.4.1-cu121-py3.11.yaml"),
    );
    let dir = tempfile::tempdir().unwrap();
    let mut files = BTreeMap::new();
    for (name, expected) in [
        ("filelock", Some("MIT")),
        ("typing-extensions", Some("PSF-2.0")),
        ("nvidia-nvtx-cu12", None),
    ] {
        let artifact = image.lock.artifact(name).unwrap();
        let Some(path) = download(dir.path(), artifact) else {
            return;
        };
        assert_eq!(sbom::wheel_license(&path).as_deref(), expected, "{name}");
        files.insert(name.to_string(), path);
    }
    let licenses = |artifact: &Artifact| {
        files
            .get(&artifact.name)
            .and_then(|p| sbom::wheel_license(p))
    };
    let bytes = image.spdx(&licenses);
    let (packages, _) = parse(&bytes);
    let declared = |name: &str, purpose: &str| {
        packages
            .values()
            .find(|p| p["name"] == name && p["primaryPackagePurpose"] == purpose)
            .unwrap()["licenseDeclared"]
            .clone()
    };
    assert_eq!(declared("filelock", "LIBRARY"), "MIT");
    assert_eq!(declared("typing-extensions", "LIBRARY"), "PSF-2.0");
    assert_eq!(declared("nvidia-nvtx-cu12", "LIBRARY"), "NOASSERTION");
    // An invalid expression from the caller is written as NOASSERTION, never as given.
    let bad = |artifact: &Artifact| (artifact.name == "torch").then(|| "BSD-3".to_string());
    let (packages, _) = parse(&image.spdx(&bad));
    let torch = packages.values().find(|p| p["name"] == "torch").unwrap();
    assert_eq!(torch["licenseDeclared"], "NOASSERTION");
    if validator_missing() {
        return;
    }
    assert_valid_spdx(dir.path(), "licensed", &bytes);
}
