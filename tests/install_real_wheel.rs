//! The real nvidia-cuda-runtime-cu12 12.1.105 wheel from PyPI (823 KB): install it with the
//! native installer, plan its SONAME chain, audit the result on a glibc base copied from this
//! machine, then put a toolkit copy beside it and check the audit reports the two copies.
//! Skips with a printed reason when pip or the network is unavailable.

use crate::elf_support;

use elf_support::gate;

use std::collections::BTreeMap;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use cudastack::audit::{audit, image_glibc, AuditOptions, FindingKind};
use cudastack::digest::Digest;
use cudastack::elf::chain::plan_for_dir;
use cudastack::elf::read_elf;
use cudastack::install::record::parse_record;
use cudastack::install::{install_wheel, InstallOptions, PythonVersion, Scheme};
use cudastack::names::WheelFilename;

const FILE: &str = "nvidia_cuda_runtime_cu12-12.1.105-py3-none-manylinux1_x86_64.whl";
/// From PyPI's simple index (PEP 691 JSON) for this file.
const SHA256: &str = "6e258468ddf5796e25f1dc591a31029fa317d97a0a94ed93468fc86301d61e40";
const SITE: &str = "/usr/local/lib/python3.11/site-packages";
const TOOLKIT_LIB: &str = "/usr/local/cuda-12.1/targets/x86_64-linux/lib";
const GLIBC_BASE: &[&str] = &[
    "libc.so.6",
    "ld-linux-x86-64.so.2",
    "libdl.so.2",
    "libpthread.so.0",
    "librt.so.1",
];

/// The wheel, downloaded once per target dir and checked against PyPI's sha256.
fn wheel() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("wheels");
    let path = dir.join(FILE);
    let expected: Digest = format!("sha256:{SHA256}").parse().unwrap();
    // Tests in this file run in parallel: one downloads while the others wait, so none
    // reads a file pip is still writing.
    static DOWNLOADING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = DOWNLOADING.lock().unwrap_or_else(|e| e.into_inner());
    if !path.exists() {
        let output = std::process::Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--platform",
                "manylinux1_x86_64",
                "--python-version",
                "3.11",
                "--disable-pip-version-check",
                "--quiet",
                "-d",
            ])
            .arg(&dir)
            .arg("nvidia-cuda-runtime-cu12==12.1.105")
            .output();
        match output {
            Ok(output) if output.status.success() && path.exists() => {}
            Ok(output) => {
                gate::skip(
                    "network",
                    format!(
                        "`pip download nvidia-cuda-runtime-cu12==12.1.105` failed (offline?): {}",
                        String::from_utf8_lossy(&output.stderr).trim()
                    ),
                );
                return None;
            }
            Err(error) => {
                gate::skip("pip", format!("python3 -m pip is not available: {error}"));
                return None;
            }
        }
    }
    let found = Digest::of_bytes(&std::fs::read(&path).unwrap());
    if found != expected {
        let _ = std::fs::remove_file(&path);
        panic!("downloaded {FILE} does not match PyPI\nExpected: {expected}\nFound:    {found}");
    }
    Some(path)
}

/// Copy this machine's glibc into `<root>/usr/lib/x86_64-linux-gnu`, with Debian's merged-usr
/// links (/lib -> usr/lib, /lib64/ld-linux-x86-64.so.2 absolute). None when not available.
fn glibc_base(root: &Path) -> Option<()> {
    let host_dir = Path::new("/lib/x86_64-linux-gnu");
    if !GLIBC_BASE.iter().all(|name| host_dir.join(name).exists()) {
        gate::not_applicable(format!(
            "audit part: this machine has no x86_64 glibc in {}",
            host_dir.display()
        ));
        return None;
    }
    let dir = root.join("usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&dir).unwrap();
    for name in GLIBC_BASE {
        std::fs::copy(host_dir.join(name), dir.join(name)).unwrap();
    }
    symlink("usr/lib", root.join("lib")).unwrap();
    std::fs::create_dir_all(root.join("usr/lib64")).unwrap();
    symlink("usr/lib64", root.join("lib64")).unwrap();
    symlink(
        "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
        root.join("usr/lib64/ld-linux-x86-64.so.2"),
    )
    .unwrap();
    Some(())
}

fn options() -> InstallOptions {
    let python: PythonVersion = "3.11".parse().unwrap();
    InstallOptions::new(Scheme::posix_prefix(Path::new("/usr/local"), python))
}

fn host(root: &Path, image: &str) -> PathBuf {
    root.join(image.trim_start_matches('/'))
}

#[test]
fn real_cuda_runtime_wheel_installs_audits_and_merges() {
    let Some(wheel) = wheel() else { return };
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().join("root");

    // Install.
    let plan = install_wheel(&wheel, &options(), &root).unwrap();
    assert_eq!(plan.project_name, "nvidia-cuda-runtime-cu12");
    assert_eq!(plan.version, "12.1.105");
    let lib_dir = format!("{SITE}/nvidia/cuda_runtime/lib");
    let cudart = host(&root, &format!("{lib_dir}/libcudart.so.12"));
    assert_eq!(std::fs::metadata(&cudart).unwrap().len(), 679_264);
    let record_path = host(
        &root,
        &format!("{SITE}/nvidia_cuda_runtime_cu12-12.1.105.dist-info/RECORD"),
    );
    let rows = parse_record(&std::fs::read_to_string(&record_path).unwrap()).unwrap();
    let cudart_row = rows
        .iter()
        .find(|row| row.path == "nvidia/cuda_runtime/lib/libcudart.so.12")
        .unwrap();
    assert_eq!(
        cudart_row.hash,
        Some(Digest::of_bytes(&std::fs::read(&cudart).unwrap()))
    );

    // ELF facts and the SONAME chain a wheel needs.
    let info = read_elf(&cudart).unwrap().into_elf().unwrap();
    assert_eq!(info.soname.as_deref(), Some("libcudart.so.12"));
    assert!(info.needed.contains(&"libc.so.6".to_string()));
    let min_glibc = info.min_glibc().unwrap();
    eprintln!("libcudart.so.12 needs glibc >= {min_glibc}");
    assert!(min_glibc >= "2.2.5".parse().unwrap());
    let chain = plan_for_dir(&host(&root, &lib_dir)).unwrap();
    assert_eq!(
        chain,
        vec![(
            host(&root, &format!("{lib_dir}/libcudart.so")),
            "libcudart.so.12".to_string()
        )]
    );
    for (link, target) in &chain {
        symlink(target, link).unwrap();
    }

    // Audit on a glibc base.
    if glibc_base(&root).is_none() {
        return;
    }
    let audit_options = AuditOptions {
        pins: BTreeMap::from([(
            "nvidia-cuda-runtime-cu12".to_string(),
            "12.1.105".to_string(),
        )]),
        ..Default::default()
    };
    let report = audit(&root, &audit_options).unwrap();
    assert!(report.is_clean(), "{}", report.render());
    assert!(report.elf_files > GLIBC_BASE.len());
    let image_glibc = image_glibc(&root).unwrap().expect("the base has a glibc");
    eprintln!("image glibc {image_glibc}");
    assert!(min_glibc <= image_glibc);
    let wheel_name: WheelFilename = FILE.parse().unwrap();
    assert!(wheel_name.glibc_floor().unwrap() <= image_glibc);

    // A toolkit copy of the same library (redist naming, chain as links): two copies.
    let toolkit = host(&root, TOOLKIT_LIB);
    std::fs::create_dir_all(&toolkit).unwrap();
    std::fs::copy(&cudart, toolkit.join("libcudart.so.12.1.105")).unwrap();
    symlink("libcudart.so.12.1.105", toolkit.join("libcudart.so.12")).unwrap();
    symlink("libcudart.so.12", toolkit.join("libcudart.so")).unwrap();
    let report = audit(&root, &audit_options).unwrap();
    let duplicates: Vec<_> = report.findings_of(FindingKind::DuplicateSoname).collect();
    assert_eq!(duplicates.len(), 1, "{}", report.render());
    assert!(duplicates[0].evidence.contains("byte-identical"));
}

/// Install the real wheel into a real Debian root given by `CUDASTACK_DEBIAN_ROOT` (made with
/// `mmdebstrap --variant=minbase --include=python3 bookworm DIR`; it is modified), audit it,
/// and load libcudart through the real loader with the image's own python in a chroot:
/// `cudaRuntimeGetVersion` needs no GPU. Needs root for chroot.
/// `CUDASTACK_DEBIAN_ROOT=DIR cargo test --test suite install_real_wheel:: -- --ignored --nocapture`
#[test]
#[ignore = "needs an mmdebstrap'd Debian root and root for chroot; CUDASTACK_DEBIAN_ROOT=DIR cargo test --test suite install_real_wheel:: -- --ignored --nocapture"]
fn real_wheel_in_a_debian_root_loads_with_the_real_loader() {
    let Some(root) = std::env::var_os("CUDASTACK_DEBIAN_ROOT").map(PathBuf::from) else {
        panic!("CUDASTACK_DEBIAN_ROOT is not set: point it at an mmdebstrap'd Debian root");
    };
    let Some(wheel) = wheel() else { return };
    let python: PythonVersion = "3.11".parse().unwrap();
    let options = InstallOptions::new(Scheme::debian_local(python));
    let started = std::time::Instant::now();
    let plan = install_wheel(&wheel, &options, &root).unwrap();
    eprintln!(
        "installed {} entries in {:.2?}",
        plan.entries.len(),
        started.elapsed()
    );
    let lib_dir = "/usr/local/lib/python3.11/dist-packages/nvidia/cuda_runtime/lib";
    for (link, target) in plan_for_dir(&host(&root, lib_dir)).unwrap() {
        if !link.exists() {
            symlink(target, link).unwrap();
        }
    }
    let report = audit(
        &root,
        &AuditOptions {
            pins: BTreeMap::from([(
                "nvidia-cuda-runtime-cu12".to_string(),
                "12.1.105".to_string(),
            )]),
            ..Default::default()
        },
    )
    .unwrap();
    eprintln!("{}", report.render());
    assert!(report.is_clean());
    let script = "import ctypes, importlib.metadata as m, nvidia.cuda_runtime, os\n\
        lib = ctypes.CDLL(os.path.join(os.path.dirname(nvidia.cuda_runtime.__file__), 'lib', 'libcudart.so'))\n\
        v = ctypes.c_int()\n\
        assert lib.cudaRuntimeGetVersion(ctypes.byref(v)) == 0\n\
        print(v.value, m.version('nvidia-cuda-runtime-cu12'), [f for f in m.files('nvidia-cuda-runtime-cu12') if f.name == 'INSTALLER'][0].read_text().strip())\n";
    let output = std::process::Command::new("chroot")
        .arg(&root)
        .args(["/usr/bin/python3", "-c", script])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success());
    assert_eq!(stdout.trim(), "12010 12.1.105 cudastack");
}

/// Install any wheels named by `CUDASTACK_WHEELS` (`:`-separated paths) into
/// `CUDASTACK_INSTALL_ROOT`, complete the SONAME chains of every `nvidia/*/lib`, audit the
/// root with the pins of the installed distributions themselves, and print timings.
/// For one-off checks on wheels too big for CI (nvidia-cudnn-cu12 is ~700 MB):
/// `CUDASTACK_WHEELS=... CUDASTACK_INSTALL_ROOT=... cargo test --test suite install_real_wheel::install_wheels_from_env -- --ignored --nocapture`
#[test]
#[ignore = "installs given wheels; CUDASTACK_WHEELS=A.whl:B.whl CUDASTACK_INSTALL_ROOT=DIR cargo test --test suite install_real_wheel::install_wheels_from_env -- --ignored"]
fn install_wheels_from_env() {
    let (Some(wheels), Some(root)) = (
        std::env::var_os("CUDASTACK_WHEELS"),
        std::env::var_os("CUDASTACK_INSTALL_ROOT").map(PathBuf::from),
    ) else {
        panic!("CUDASTACK_WHEELS and CUDASTACK_INSTALL_ROOT must be set: the wheels (a path list) and the root to install into");
    };
    let mut pins = BTreeMap::new();
    for wheel in std::env::split_paths(&wheels) {
        let started = std::time::Instant::now();
        let plan = install_wheel(&wheel, &options(), &root).unwrap();
        let bytes: u64 = plan.entries.iter().filter_map(|e| e.content.size()).sum();
        eprintln!(
            "{} {}: {} entries, {bytes} bytes in {:.2?}",
            plan.project_name,
            plan.version,
            plan.entries.len(),
            started.elapsed()
        );
        pins.insert(plan.project_name.clone(), plan.version.clone());
    }
    let nvidia = host(&root, &format!("{SITE}/nvidia"));
    if let Ok(packages) = std::fs::read_dir(&nvidia) {
        let mut lib_dirs: Vec<PathBuf> = packages
            .filter_map(Result::ok)
            .map(|entry| entry.path().join("lib"))
            .filter(|dir| dir.is_dir())
            .collect();
        lib_dirs.sort();
        for dir in lib_dirs {
            for (link, target) in plan_for_dir(&dir).unwrap() {
                eprintln!("link {} -> {target}", link.display());
                symlink(target, link).unwrap();
            }
        }
    }
    let started = std::time::Instant::now();
    let report = audit(
        &root,
        &AuditOptions {
            pins,
            ..Default::default()
        },
    )
    .unwrap();
    eprintln!("{}audit took {:.2?}", report.render(), started.elapsed());
}
