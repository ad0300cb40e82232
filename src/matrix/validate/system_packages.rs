//! Which Debian and Ubuntu packages would put a second copy of a library the stack already
//! has (CUDA, cuDNN, NCCL) or a copy of the host's driver into the image.
//!
//! One copy of every library: the stack's CUDA, cuDNN and NCCL are the locked nvidia-*
//! wheels torch loads, and the driver's libraries come from the host through the NVIDIA
//! container runtime. A table of package-name patterns per family, each with its reason,
//! so `validate` refuses the recipe's `apt:` entries and the lock can ask the same of every
//! package apt resolves (a dependency can pull in a CUDA library too).

use crate::recipe::DebName;

/// How a family's packages are named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamePattern {
    /// This name only.
    Exact(&'static str),
    /// Every name that starts with this (`libcudnn` for `libcudnn8`, `libcudnn9-cuda-12`).
    Prefix(&'static str),
}

impl NamePattern {
    /// The length of the match, for the longest match to win (`cuda-drivers` over `cuda-`).
    fn matches(self, name: &str) -> Option<usize> {
        match self {
            NamePattern::Exact(exact) => (name == exact).then_some(exact.len()),
            NamePattern::Prefix(prefix) => name.starts_with(prefix).then_some(prefix.len()),
        }
    }
}

/// When the stack puts a family's libraries in the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provided {
    /// Always: CUDA (every recipe has `cuda:`), and the driver (the host's, at run time).
    Always,
    /// With `torch:` (its pin) or `cudnn:`.
    WithTorchOrCudnn,
    /// With `torch:` (its pin).
    WithTorch,
}

/// A family of libraries the image holds one copy of, and the packages that would add
/// another.
#[derive(Debug)]
pub struct LibraryFamily {
    /// The problem's stable code in `validate`.
    pub code: &'static str,
    /// What one of its packages would install, completing "would install ...".
    pub installs: &'static str,
    pub names: &'static [NamePattern],
    /// Why that is refused.
    pub why: &'static str,
    /// When the stack has the family already.
    pub provided: Provided,
    /// What to do instead, when the stack has the family.
    pub hint: &'static str,
    /// What to do instead, when the recipe does not give the stack this family: how to
    /// get it the locked way.
    pub hint_when_absent: &'static str,
    /// Where the package names come from.
    pub source: &'static str,
}

use NamePattern::{Exact, Prefix};

/// The families, each with the package names of Debian (bookworm, trixie: contrib and
/// non-free), Ubuntu (multiverse, restricted) and NVIDIA's own CUDA repository.
pub static LIBRARY_FAMILIES: &[LibraryFamily] = &[
    LibraryFamily {
        code: "apt-second-cuda",
        installs: "a second CUDA (the toolkit or its libraries)",
        names: &[
            Exact("nvidia-cuda-toolkit"),
            Exact("nvidia-cuda-toolkit-gcc"),
            Exact("nvidia-cuda-dev"),
            Exact("cuda"),
            Prefix("cuda-"),
            Prefix("libcudart"),
            Prefix("libcublas"),
            Prefix("libnvblas"),
            Prefix("libcufft"),
            Prefix("libcufile"),
            Prefix("libcurand"),
            Prefix("libcusparse"),
            Prefix("libcusolver"),
            Prefix("libnvjitlink"),
            Prefix("libnvrtc"),
            Prefix("libnvvm"),
            Prefix("libcupti"),
            Prefix("libnvtoolsext"),
            Prefix("libnpp"),
            Prefix("libnvjpeg"),
            Prefix("libcuinj"),
            Prefix("libaccinj"),
        ],
        why: "the image's CUDA is the recipe's `cuda:`, from the locked nvidia-*-cu* wheels that torch loads; a distribution's CUDA is a second copy, of another version (Debian bookworm ships 11.8), on the loader's default path, so what a program or an extension built with nvcc loads depends on search order, and the image grows by gigabytes; one copy of every library",
        provided: Provided::Always,
        hint: "remove it from `apt:`; the recipe's CUDA is in the image already, and `cuda: { flavor: devel }` adds nvcc and the headers for building extensions",
        hint_when_absent: "",
        source: "packages.debian.org (source nvidia-cuda-toolkit: libcudart11.0, libcublas11, libcufft10, libnvjitlink12 ...); NVIDIA CUDA Installation Guide for Linux, meta packages (cuda, cuda-toolkit-X-Y, cuda-runtime-X-Y, cuda-libraries-X-Y)",
    },
    LibraryFamily {
        code: "apt-second-cudnn",
        installs: "a second cuDNN",
        names: &[
            Exact("nvidia-cudnn"),
            Prefix("libcudnn"),
            Prefix("cudnn"),
        ],
        why: "the image's cuDNN is the nvidia-cudnn-cu* wheel for the recipe's CUDA that the lock pins (torch's pin, or the recipe's `cudnn:`); a distribution's cuDNN is another copy, of another version and perhaps for another CUDA, that whatever loads libcudnn by name may find first: the version skew behind CUDNN_STATUS_NOT_INITIALIZED and CUDNN_STATUS_EXECUTION_FAILED; one copy of every library (Debian's nvidia-cudnn even downloads cuDNN from NVIDIA while it installs, bytes no lock pins)",
        provided: Provided::WithTorchOrCudnn,
        hint: "remove it from `apt:`; torch's cuDNN is in the image already (give `cudnn: { version: ... }` to check which one)",
        hint_when_absent: "remove it from `apt:` and give `cudnn: { version: ... }`: cudastack installs the nvidia-cudnn wheel built for the recipe's CUDA, locked by hash",
        source: "packages.debian.org/nvidia-cudnn (contrib); NVIDIA cuDNN Installation Guide, Linux packages (libcudnn8, libcudnn8-dev, libcudnn9-cuda-12, cudnn9-cuda-12)",
    },
    LibraryFamily {
        code: "apt-second-nccl",
        installs: "a second NCCL",
        names: &[Prefix("libnccl")],
        why: "the image's NCCL is the nvidia-nccl-cu* wheel torch pins, locked by hash; a libnccl.so.2 in /usr/lib is another copy, of another version, and ranks that load different NCCL versions fail or hang in their collectives; one copy of every library",
        provided: Provided::WithTorch,
        hint: "remove it from `apt:`; torch's NCCL is in the image already",
        hint_when_absent: "remove it from `apt:` and add the NCCL wheel of the recipe's CUDA major to `packages:` (such as `nvidia-nccl-cu12`), locked by hash like every wheel",
        source: "packages.debian.org/libnccl2 (non-free); NVIDIA NCCL Installation Guide (libnccl2, libnccl-dev)",
    },
    LibraryFamily {
        code: "apt-driver-library",
        installs: "NVIDIA driver libraries, which come from the host",
        names: &[
            Exact("libcuda1"),
            Prefix("libcuda1-"),
            Prefix("libnvidia-"),
            Prefix("libnvcuvid"),
            Prefix("libnvoptix"),
            Prefix("nvidia-driver"),
            Prefix("nvidia-kernel-"),
            Prefix("nvidia-open"),
            Exact("nvidia-smi"),
            Exact("nvidia-persistenced"),
            Exact("nvidia-cuda-mps"),
            Prefix("nvidia-utils-"),
            Prefix("nvidia-compute-utils-"),
            Exact("xserver-xorg-video-nvidia"),
            Prefix("cuda-drivers"),
        ],
        why: "the driver's user-space libraries (libcuda.so.1, libnvidia-ml.so.1, libnvidia-ptxjitcompiler.so.1) and nvidia-smi must be the version of the host's kernel module; the NVIDIA container runtime mounts the host's own copies into the container (NVIDIA_DRIVER_CAPABILITIES=compute,utility), and a copy in the image shadows them: on every host with another driver, CUDA fails with error 803, \"system has unsupported display driver / cuda driver combination\"",
        provided: Provided::Always,
        hint: "remove it from `apt:`; run the image with the NVIDIA container runtime (`docker run --gpus all`), which brings the host's driver libraries and nvidia-smi",
        hint_when_absent: "",
        source: "packages.debian.org (source nvidia-graphics-drivers: libcuda1, libnvidia-ml1, nvidia-smi, nvidia-driver); Ubuntu (nvidia-utils-550, libnvidia-compute-550); NVIDIA Container Toolkit, driver capabilities",
    },
];

/// The family a package would add a copy of, if any: the longest matching pattern wins.
pub fn library_family(name: &DebName) -> Option<&'static LibraryFamily> {
    LIBRARY_FAMILIES
        .iter()
        .flat_map(|family| family.names.iter().map(move |pattern| (family, pattern)))
        .filter_map(|(family, pattern)| pattern.matches(name.as_str()).map(|len| (len, family)))
        .max_by_key(|(len, _)| *len)
        .map(|(_, family)| family)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(name: &str) -> Option<&'static str> {
        library_family(&name.parse().unwrap()).map(|family| family.code)
    }

    #[test]
    fn each_family_catches_its_packages() {
        for (names, expected) in [
            (
                &[
                    "nvidia-cuda-toolkit",
                    "nvidia-cuda-dev",
                    "cuda",
                    "cuda-toolkit-12-4",
                    "cuda-runtime-12-4",
                    "cuda-libraries-12-4",
                    "cuda-cudart-12-4",
                    "libcudart11.0",
                    "libcudart12",
                    "libcublas12",
                    "libcublaslt12",
                    "libcufft11",
                    "libcurand10",
                    "libcusparse12",
                    "libcusparselt0",
                    "libcusolver11",
                    "libnvjitlink12",
                    "libnvrtc12",
                ][..],
                "apt-second-cuda",
            ),
            (
                &[
                    "nvidia-cudnn",
                    "libcudnn8",
                    "libcudnn8-dev",
                    "libcudnn9-cuda-12",
                    "libcudnn9-dev-cuda-12",
                    "cudnn",
                    "cudnn9-cuda-12",
                ][..],
                "apt-second-cudnn",
            ),
            (&["libnccl2", "libnccl-dev"][..], "apt-second-nccl"),
            (
                &[
                    "libcuda1",
                    "libnvidia-ml1",
                    "libnvidia-ptxjitcompiler1",
                    "libnvidia-compute-550",
                    "nvidia-driver",
                    "nvidia-driver-550",
                    "nvidia-smi",
                    "nvidia-utils-550",
                    "cuda-drivers",
                    "cuda-drivers-550",
                ][..],
                "apt-driver-library",
            ),
        ] {
            for name in names {
                assert_eq!(code(name), Some(expected), "{name}");
            }
        }
    }

    /// Packages whose names start like a CUDA library's but are not one.
    #[test]
    fn look_alikes_pass() {
        for name in [
            "git",
            "openssh-client",
            "libgl1",
            "libcurl4",
            "libcups2",
            "libcue2",
            "libnvpair3linux",
            "cudatext",
            "nvidia-cuda-toolkit-doc",
            "libibverbs1",
            "rdma-core",
            "build-essential",
        ] {
            assert_eq!(code(name), None, "{name}");
        }
    }

    #[test]
    fn every_family_says_why_and_what_to_do() {
        for family in LIBRARY_FAMILIES {
            assert!(family.code.starts_with("apt-"), "{}", family.code);
            assert!(
                family.hint.starts_with("remove it from `apt:`"),
                "{}",
                family.code
            );
            assert!(!family.why.is_empty() && !family.source.is_empty());
            assert_eq!(
                family.hint_when_absent.is_empty(),
                family.provided == Provided::Always,
                "{}",
                family.code
            );
            if family.provided != Provided::Always {
                assert!(
                    family.hint_when_absent.starts_with("remove it from `apt:`"),
                    "{}",
                    family.code
                );
            }
        }
    }
}
