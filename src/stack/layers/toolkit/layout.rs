//! The CUDA toolkit and cuDNN layers, laid out the way NVIDIA's installers do, from the
//! nvidia-* wheels the lock names:
//! ```text
//! /usr/local/cuda -> cuda-12.1
//! /usr/local/cuda-12.1/targets/x86_64-linux/{lib,include}
//! /usr/local/cuda-12.1/{lib64 -> targets/x86_64-linux/lib, include -> targets/x86_64-linux/include}
//! /usr/local/cuda-12.1/{bin,nvvm}          (devel flavor: nvcc and its helpers)
//! ```
//! (`targets/sbsa-linux` for linux/arm64, as NVIDIA's SBSA packages have it).
//! Wheels cannot hold symlinks, so each library arrives as one regular file named after its
//! SONAME (`libcudnn.so.9`). The file is renamed to its full version (`libcudnn.so.9.1.0`,
//! as NVIDIA's archives name it) and the chain `libcudnn.so -> libcudnn.so.9 ->
//! libcudnn.so.9.1.0` is planned from each library's ELF DT_SONAME (`elf::chain`).
//! The returned [`Placement`] tells the Python layer which wheel members now live in the
//! toolkit, so site-packages/nvidia/*/lib can point there instead of holding a second copy.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

pub use super::error::ToolkitError;
use crate::elf::chain::{plan_soname_links, scan_library_dir};
use crate::elf::read_elf;
use crate::platform::Platform;
use crate::recipe::Flavor;
use crate::stack::layers::wheel_members::WheelMembers;
use crate::version::CudaVersion;

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

/// An nvidia-* wheel from the lock, already in the blob cache.
#[derive(Debug, Clone)]
pub struct NvidiaWheel {
    pub path: PathBuf,
    /// Normalised project name (`nvidia-cudnn-cu12`).
    pub project: String,
    pub version: String,
}

impl NvidiaWheel {
    pub fn is_cudnn(&self) -> bool {
        self.project.starts_with("nvidia-cudnn")
    }
}

/// Wheel members placed in the toolkit: member name (`nvidia/cudnn/lib/libcudnn.so.9`) ->
/// absolute image path that now provides it (`/usr/local/cuda-12.1/.../libcudnn.so.9`).
pub type Placement = BTreeMap<String, String>;

/// Where a wheel member goes in the toolkit, relative to the image root; None to skip it.
fn destination(member: &str, paths: &ToolkitPaths, flavor: Flavor, cudnn: bool) -> Option<String> {
    let rest = member.strip_prefix("nvidia/")?;
    let (_component, inner) = rest.split_once('/')?;
    if inner.ends_with("__init__.py") || inner.contains("__pycache__") || inner.ends_with('/') {
        return None;
    }
    let strip = |prefix: &str| inner.strip_prefix(prefix).map(str::to_string);
    let home = paths.home();
    let home = home.trim_start_matches('/');
    if let Some(file) = strip("lib/") {
        return Some(format!(
            "{}/{file}",
            paths.lib_dir().trim_start_matches('/')
        ));
    }
    // cuDNN's headers belong to its layer whatever the flavor (the audit compares
    // cudnn_version.h with the library); CUDA headers and tools are the devel flavor.
    if let Some(file) = strip("include/") {
        return (cudnn || flavor == Flavor::Devel)
            .then(|| format!("{}/{file}", paths.include_dir().trim_start_matches('/')));
    }
    if flavor == Flavor::Devel {
        for dir in ["bin/", "nvvm/"] {
            if let Some(file) = strip(dir) {
                return Some(format!("{home}/{dir}{file}"));
            }
        }
    }
    None
}

/// The name NVIDIA's archives give the real file: `libcudnn.so.9` from cuDNN 9.1.0.70 ->
/// `libcudnn.so.9.1.0`; `libcudart.so.12` from 12.1.105 -> `libcudart.so.12.1.105`.
/// Libraries whose SONAME major is not the wheel's major (cuFFT 11 in a CUDA 12 wheel,
/// NCCL 2) keep their SONAME name.
pub fn versioned_name(soname: &str, wheel_version: &str, cudnn: bool) -> Option<String> {
    let (_, major) = soname.rsplit_once(".so.")?;
    if major.contains('.') || !major.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut parts: Vec<&str> = wheel_version.split('.').collect();
    if parts.first() != Some(&major) || parts.len() < 2 {
        return None;
    }
    if cudnn {
        parts.truncate(3); // the fourth cuDNN component is a build number
    }
    Some(format!("{soname}.{}", parts[1..].join(".")))
}

/// Extract the toolkit part of `wheels` under `root` (a staging directory that becomes one
/// layer), complete the SONAME chains, and add the top-level links (`lib64`, `include`,
/// `/usr/local/cuda`) when `top_links` is set. Every file extracted is a wheel member
/// unchanged, recorded in `members` under its final name.
pub fn stage(
    wheels: &[&NvidiaWheel],
    paths: &ToolkitPaths,
    flavor: Flavor,
    top_links: bool,
    root: &Path,
    members: &mut WheelMembers,
) -> Result<Placement, ToolkitError> {
    let mut placement = Placement::new();
    let lib_dir = root.join(paths.lib_dir().trim_start_matches('/'));
    fs_err::create_dir_all(&lib_dir).map_err(io_error(&lib_dir))?;
    // Library files as extracted: file name -> (member name, wheel).
    let mut libraries: Vec<Library> = Vec::new();
    for wheel in wheels {
        for extracted in extract_wheel(wheel, paths, flavor, root)? {
            let Extracted {
                member,
                relative,
                target,
            } = extracted;
            if target.parent() == Some(lib_dir.as_path()) {
                let file_name = target
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or_default()
                    .to_string();
                libraries.push(Library {
                    file_name,
                    member,
                    wheel,
                });
            } else {
                members.insert(&relative, &wheel.path, &member);
                placement.insert(member, format!("/{relative}"));
            }
        }
    }
    version_libraries(&libraries, &lib_dir, paths, &mut placement, members)?;
    for link in plan_soname_links(&scan_library_dir(&lib_dir)?) {
        let path = lib_dir.join(&link.link);
        std::os::unix::fs::symlink(&link.target, &path).map_err(io_error(&path))?;
    }
    if top_links {
        add_top_links(paths, root)?;
    }
    Ok(placement)
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> ToolkitError {
    let path = path.to_path_buf();
    move |source| ToolkitError::Io { path, source }
}

/// A library extracted into the one library directory.
struct Library<'a> {
    file_name: String,
    member: String,
    wheel: &'a NvidiaWheel,
}

/// A wheel member written under the root.
struct Extracted {
    /// Its name in the wheel.
    member: String,
    /// Its path under the root, relative.
    relative: String,
    target: PathBuf,
}

/// Write the members of `wheel` that belong in the toolkit under `root`, in wheel order.
fn extract_wheel(
    wheel: &NvidiaWheel,
    paths: &ToolkitPaths,
    flavor: Flavor,
    root: &Path,
) -> Result<Vec<Extracted>, ToolkitError> {
    let zip_error = |source| ToolkitError::Zip {
        wheel: wheel.path.clone(),
        source,
    };
    let file = fs_err::File::open(&wheel.path).map_err(io_error(&wheel.path))?;
    let mut archive = zip::ZipArchive::new(file.into_parts().0).map_err(zip_error)?;
    let mut extracted = Vec::new();
    for index in 0..archive.len() {
        let mut member = archive.by_index(index).map_err(zip_error)?;
        let name = member.name().map_err(zip_error)?.to_string();
        let Some(relative) = destination(&name, paths, flavor, wheel.is_cudnn()) else {
            continue;
        };
        if relative
            .split('/')
            .any(|part| part == ".." || part.is_empty())
        {
            return Err(ToolkitError::UnsafeMember {
                wheel: wheel.path.clone(),
                member: name,
            });
        }
        // The loader finds libraries by name (`lib*.so*`); CUDA 13's `lib/cmake/` and
        // `lib/pkgconfig/` files are no concern of it.
        let library_in_lib_subdirectory = relative
            .strip_prefix(paths.lib_dir().trim_start_matches('/'))
            .and_then(|rest| rest.strip_prefix('/'))
            .and_then(|rest| rest.rsplit_once('/'))
            .is_some_and(|(_, file)| file.contains(".so"));
        if library_in_lib_subdirectory {
            return Err(ToolkitError::LibrarySubdirectory {
                wheel: wheel.path.clone(),
                member: name,
            });
        }
        let target = root.join(&relative);
        if let Some(parent) = target.parent() {
            fs_err::create_dir_all(parent).map_err(io_error(parent))?;
        }
        let mut out = fs_err::File::create(&target).map_err(io_error(&target))?;
        io::copy(&mut member, &mut out).map_err(io_error(&target))?;
        let executable = member.unix_mode().is_some_and(|mode| mode & 0o111 != 0)
            || relative.contains("/bin/")
            || relative.contains("/nvvm/bin/");
        set_mode(&target, if executable { 0o755 } else { 0o644 })?;
        extracted.push(Extracted {
            member: name,
            relative,
            target,
        });
    }
    Ok(extracted)
}

/// Rename each library to its full version, keeping the SONAME as the link name, and
/// record where each library member now lives.
fn version_libraries(
    libraries: &[Library],
    lib_dir: &Path,
    paths: &ToolkitPaths,
    placement: &mut Placement,
    members: &mut WheelMembers,
) -> Result<(), ToolkitError> {
    for library in libraries {
        let (file_name, wheel) = (&library.file_name, library.wheel);
        let path = lib_dir.join(file_name);
        let soname = read_elf(&path)?.into_elf().and_then(|info| info.soname);
        let mut final_name = file_name.clone();
        if let Some(versioned) = soname
            .as_deref()
            .filter(|s| s == file_name)
            .and_then(|s| versioned_name(s, &wheel.version, wheel.is_cudnn()))
        {
            let renamed = lib_dir.join(&versioned);
            fs_err::rename(&path, &renamed).map_err(io_error(&path))?;
            final_name = versioned;
        }
        members.insert(
            &format!("{}/{final_name}", paths.lib_dir()),
            &wheel.path,
            &library.member,
        );
        // The member's name is what torch's RUNPATH looks for; it resolves to this path
        // once the SONAME chain is complete.
        placement.insert(
            library.member.clone(),
            format!("{}/{file_name}", paths.lib_dir()),
        );
    }
    Ok(())
}

/// `lib64` and `include` in the toolkit home, and `/usr/local/cuda` -> `cuda-X.Y`.
fn add_top_links(paths: &ToolkitPaths, root: &Path) -> Result<(), ToolkitError> {
    let home = root.join(paths.home().trim_start_matches('/'));
    let targets = format!("targets/{}", paths.target());
    for (link, target) in [
        ("lib64", format!("{targets}/lib")),
        ("include", format!("{targets}/include")),
    ] {
        fs_err::create_dir_all(home.join(&target)).map_err(io_error(&home))?;
        let path = home.join(link);
        std::os::unix::fs::symlink(target, &path).map_err(io_error(&path))?;
    }
    let cuda_link = root.join("usr/local/cuda");
    let target = format!("cuda-{}", paths.cuda.line());
    std::os::unix::fs::symlink(&target, &cuda_link).map_err(io_error(&cuda_link))
}

fn set_mode(path: &Path, mode: u32) -> Result<(), ToolkitError> {
    use std::os::unix::fs::PermissionsExt;
    fs_err::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|source| {
        ToolkitError::Io {
            path: path.to_path_buf(),
            source,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::Platform;
    use crate::version::CudaVersion;

    /// A shared library in a subdirectory of `lib/` (a `glibc-hwcaps/x86-64-v2/libz.so.1`)
    /// would land under the directory on LD_LIBRARY_PATH, where glibc looks first; CUDA
    /// 13's `lib/cmake/` files are extracted.
    #[test]
    fn a_library_in_a_subdirectory_of_lib_is_refused() {
        let temp = tempfile::tempdir().unwrap();
        let path = temp
            .path()
            .join("nvidia_cuda_runtime_cu12-12.1.105-py3-none-any.whl");
        let mut zip = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
        for member in [
            "nvidia/cuda_runtime/lib/libcudart.so.12",
            "nvidia/cuda_runtime/lib/cmake/cudart/cudart-config.cmake",
            "nvidia/cuda_runtime/lib/glibc-hwcaps/x86-64-v2/libz.so.1",
        ] {
            zip.start_file(member, zip::write::SimpleFileOptions::default())
                .unwrap();
            std::io::Write::write_all(&mut zip, b"not an ELF").unwrap();
        }
        zip.finish().unwrap();
        let wheel = NvidiaWheel {
            path,
            project: "nvidia-cuda-runtime-cu12".into(),
            version: "12.1.105".into(),
        };
        let paths = ToolkitPaths::new(CudaVersion::new(12, 1, None), Platform::LinuxAmd64);
        let root = temp.path().join("root");
        let error = match extract_wheel(&wheel, &paths, Flavor::Runtime, &root) {
            Err(error) => error.to_string(),
            Ok(_) => panic!("a library under lib/glibc-hwcaps/ was extracted"),
        };
        assert!(
            error.contains("glibc-hwcaps/x86-64-v2/libz.so.1") && error.contains("LD_LIBRARY_PATH"),
            "{error}"
        );
    }

    #[test]
    fn versioned_names_follow_nvidia_archives() {
        assert_eq!(
            versioned_name("libcudnn.so.9", "9.1.0.70", true).as_deref(),
            Some("libcudnn.so.9.1.0")
        );
        assert_eq!(
            versioned_name("libcudnn_ops_infer.so.8", "8.9.2.26", true).as_deref(),
            Some("libcudnn_ops_infer.so.8.9.2")
        );
        assert_eq!(
            versioned_name("libcudart.so.12", "12.1.105", false).as_deref(),
            Some("libcudart.so.12.1.105")
        );
        assert_eq!(
            versioned_name("libcufft.so.11", "11.0.2.54", false).as_deref(),
            Some("libcufft.so.11.0.2.54")
        );
        assert_eq!(versioned_name("libcufft.so.11", "12.1.0", false), None);
        assert_eq!(
            versioned_name("libnccl.so.2", "2.20.5", false).as_deref(),
            Some("libnccl.so.2.20.5")
        );
        assert_eq!(
            versioned_name("libnvrtc-builtins.so.12.1", "12.1.105", false),
            None
        );
    }

    #[test]
    fn member_destinations_by_flavor() {
        let paths = ToolkitPaths::new(CudaVersion::new(12, 1, None), Platform::LinuxAmd64);
        let lib = "usr/local/cuda-12.1/targets/x86_64-linux/lib";
        assert_eq!(
            destination(
                "nvidia/cudnn/lib/libcudnn.so.9",
                &paths,
                Flavor::Runtime,
                true
            )
            .unwrap(),
            format!("{lib}/libcudnn.so.9")
        );
        assert_eq!(
            destination(
                "nvidia/cudnn/include/cudnn_version.h",
                &paths,
                Flavor::Runtime,
                true
            )
            .unwrap(),
            "usr/local/cuda-12.1/targets/x86_64-linux/include/cudnn_version.h"
        );
        assert_eq!(
            destination(
                "nvidia/cuda_runtime/include/cuda.h",
                &paths,
                Flavor::Runtime,
                false
            ),
            None
        );
        assert!(destination(
            "nvidia/cuda_runtime/include/cuda.h",
            &paths,
            Flavor::Devel,
            false
        )
        .is_some());
        assert_eq!(
            destination("nvidia/cuda_nvcc/bin/nvcc", &paths, Flavor::Devel, false).unwrap(),
            "usr/local/cuda-12.1/bin/nvcc"
        );
        assert_eq!(
            destination("nvidia/cuda_nvcc/bin/nvcc", &paths, Flavor::Runtime, false),
            None
        );
        assert_eq!(
            destination(
                "nvidia/cudnn/lib/__init__.py",
                &paths,
                Flavor::Runtime,
                true
            ),
            None
        );
        assert_eq!(
            destination("torch/lib/libtorch.so", &paths, Flavor::Runtime, false),
            None
        );
    }
}
