//! Small CUDA-shaped stacks for real builds: gcc-built ELF libraries with the real SONAMEs
//! (NVIDIA's libraries are far too large for a test; the build and its audit read only
//! ELF headers), packed as nvidia-* wheels with valid RECORDs in a local mirror.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest as _, Sha256};

/// A wheel architecture and the C compiler that makes its objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    X86_64,
    Aarch64,
}

impl Target {
    pub fn compiler(self) -> &'static str {
        match self {
            Target::X86_64 => "gcc",
            Target::Aarch64 => "aarch64-linux-gnu-gcc",
        }
    }
    pub fn platform_tag(self) -> &'static str {
        match self {
            Target::X86_64 => "manylinux2014_x86_64",
            Target::Aarch64 => "manylinux2014_aarch64",
        }
    }
}

/// Build `dir/<target>/<soname>` with DT_SONAME `soname`, DT_NEEDED on `needed` (built
/// before, in the same directory) and the C definitions `body` (a dummy function if empty).
pub fn gcc_lib(target: Target, dir: &Path, soname: &str, needed: &[&str], body: &str) -> Vec<u8> {
    let dir = dir.join(format!("{target:?}"));
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join(format!("{soname}.c"));
    let body = if body.is_empty() {
        format!(
            "int {}(void) {{ return 42; }}\n",
            soname.replace(['.', '-'], "_")
        )
    } else {
        body.to_string()
    };
    std::fs::write(&source, body).unwrap();
    let out = dir.join(soname);
    let mut command = Command::new(target.compiler());
    command
        .args(["-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&source)
        .arg(format!("-Wl,-soname,{soname}"))
        .arg("-Wl,--no-as-needed");
    for name in needed {
        command.arg(dir.join(name));
    }
    assert!(
        command.status().unwrap().success(),
        "{} failed for {soname}",
        target.compiler()
    );
    std::fs::read(out).unwrap()
}

/// Write `project-version` as a wheel for `target` into `mirror`, with `files` + metadata.
pub fn write_wheel(
    mirror: &Path,
    target: Target,
    project: &str,
    version: &str,
    files: &[(&str, Vec<u8>)],
) -> PathBuf {
    let dist = project.replace('-', "_");
    let dist_info = format!("{dist}-{version}.dist-info");
    let tag = target.platform_tag();
    let mut all: Vec<(String, Vec<u8>)> = files
        .iter()
        .map(|(n, b)| (n.to_string(), b.clone()))
        .collect();
    all.push((
        format!("{dist_info}/METADATA"),
        format!("Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n\n").into_bytes(),
    ));
    all.push((
        format!("{dist_info}/WHEEL"),
        format!("Wheel-Version: 1.0\nGenerator: cudastack-test\nRoot-Is-Purelib: false\nTag: py3-none-{tag}\n").into_bytes(),
    ));
    let mut record = String::new();
    for (name, bytes) in &all {
        let hash = cudastack::install::record::urlsafe_b64_nopad(&Sha256::digest(bytes));
        record.push_str(&format!("{name},sha256={hash},{}\n", bytes.len()));
    }
    record.push_str(&format!("{dist_info}/RECORD,,\n"));
    all.push((format!("{dist_info}/RECORD"), record.into_bytes()));
    let path = mirror.join(format!("{dist}-{version}-py3-none-{tag}.whl"));
    let mut zip = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .unix_permissions(0o644);
    for (name, bytes) in &all {
        zip.start_file(name.as_str(), options).unwrap();
        zip.write_all(bytes).unwrap();
    }
    zip.finish().unwrap();
    path
}

/// Stand-in CUDA 12.4 runtime + cuBLAS + cuDNN 9.1 wheels for `target` in `mirror`. The
/// libraries answer the version queries a probe makes (`cudaRuntimeGetVersion`,
/// `cublasGetProperty`, `cudnnGetVersion`) with those versions.
pub fn cuda_12_4_wheels(target: Target, libs: &Path, mirror: &Path) {
    std::fs::create_dir_all(mirror).unwrap();
    let cudart = gcc_lib(
        target,
        libs,
        "libcudart.so.12",
        &[],
        "int cudaRuntimeGetVersion(int *v) { *v = 12040; return 0; }\n",
    );
    let lt = gcc_lib(target, libs, "libcublasLt.so.12", &[], "");
    let cublas = gcc_lib(
        target,
        libs,
        "libcublas.so.12",
        &["libcublasLt.so.12"],
        "int cublasGetProperty(int type, int *v) { static const int p[3] = {12, 4, 5}; if (type < 0 || type > 2) return 7; *v = p[type]; return 0; }\n",
    );
    let cudnn = gcc_lib(
        target,
        libs,
        "libcudnn.so.9",
        &[],
        "unsigned long cudnnGetVersion(void) { return 90100; }\n",
    );
    let init = ("nvidia/__init__.py", Vec::new());
    write_wheel(
        mirror,
        target,
        "nvidia-cuda-runtime-cu12",
        "12.4.127",
        &[
            init.clone(),
            ("nvidia/cuda_runtime/lib/libcudart.so.12", cudart),
        ],
    );
    write_wheel(
        mirror,
        target,
        "nvidia-cublas-cu12",
        "12.4.5.8",
        &[
            init.clone(),
            ("nvidia/cublas/lib/libcublas.so.12", cublas),
            ("nvidia/cublas/lib/libcublasLt.so.12", lt),
        ],
    );
    write_wheel(
        mirror,
        target,
        "nvidia-cudnn-cu12",
        "9.1.0.70",
        &[
            init,
            ("nvidia/cudnn/lib/libcudnn.so.9", cudnn),
            (
                "nvidia/cudnn/include/cudnn_version.h",
                b"#define CUDNN_MAJOR 9\n#define CUDNN_MINOR 1\n#define CUDNN_PATCHLEVEL 0\n"
                    .to_vec(),
            ),
        ],
    );
    // Every lock has pip, the image's installer: a stand-in of it, so a stand-in stack
    // locks and builds from the mirror alone (offline tests cut the network).
    write_wheel(
        mirror,
        target,
        "pip",
        "24.2",
        &[("pip/__init__.py", b"__version__ = \"24.2\"\n".to_vec())],
    );
}

/// `cudastack lock --mirror MIRROR RECIPE` (every platform of the recipe).
pub fn lock(recipe: &Path, mirror: &Path) {
    let lock = Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .args(["lock", "--mirror"])
        .arg(mirror)
        .arg(recipe)
        .output()
        .unwrap();
    assert!(
        lock.status.success(),
        "lock failed: {}",
        String::from_utf8_lossy(&lock.stderr)
    );
}
