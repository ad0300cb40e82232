//! Which CUDA component an nvidia-* wheel (or an NVIDIA redist archive) places in
//! `/usr/local/cuda`, and which component a library file belongs to.
//!
//! A table with sources: the component ids are the keys of NVIDIA's redist manifests
//! (<https://developer.download.nvidia.com/compute/cuda/redist/redistrib_12.1.1.json>,
//! `.../cudnn/redist/redistrib_9.1.0.json`, `.../nccl`), the wheel stems are the PyPI
//! projects `nvidia-<stem>[-cuNN]`, the library prefixes the SONAMEs each wheel's
//! `nvidia/<dir>/lib` holds. A wheel missing from the table is still a component (its
//! stem is its name): the build places every nvidia-* wheel in the toolkit.

/// One CUDA component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaComponent {
    /// The PyPI project without `nvidia-` and the `-cuNN` suffix (`cuda-runtime`).
    pub wheel_stem: &'static str,
    /// NVIDIA's redist component id (`cuda_cudart`).
    pub redist: &'static str,
    /// The name it is known by (`cudart`, `cuDNN`).
    pub name: &'static str,
    /// File name prefixes of its libraries (`libcudart`).
    pub libraries: &'static [&'static str],
}

const fn row(
    wheel_stem: &'static str,
    redist: &'static str,
    name: &'static str,
    libraries: &'static [&'static str],
) -> CudaComponent {
    CudaComponent {
        wheel_stem,
        redist,
        name,
        libraries,
    }
}

/// The components cudastack locks (CUDA 11.8 to 13.2 wheels, cuDNN 8 and 9, NCCL 2).
pub const COMPONENTS: &[CudaComponent] = &[
    row("cuda-runtime", "cuda_cudart", "cudart", &["libcudart"]),
    row(
        "cuda-cupti",
        "cuda_cupti",
        "CUPTI",
        &[
            "libcupti",
            "libnvperf",
            "libpcsamplingutil",
            "libcheckpoint",
        ],
    ),
    row("cuda-nvrtc", "cuda_nvrtc", "NVRTC", &["libnvrtc"]),
    row("cuda-nvcc", "cuda_nvcc", "nvcc", &["libnvptxcompiler"]),
    row("cuda-cccl", "cuda_cccl", "CCCL", &[]),
    row("cuda-crt", "cuda_crt", "crt", &[]),
    row("nvvm", "libnvvm", "NVVM", &["libnvvm"]),
    row("nvtx", "cuda_nvtx", "NVTX", &["libnvToolsExt"]),
    row("cublas", "libcublas", "cuBLAS", &["libcublas", "libnvblas"]),
    row("cufft", "libcufft", "cuFFT", &["libcufft"]),
    row("curand", "libcurand", "cuRAND", &["libcurand"]),
    row("cusolver", "libcusolver", "cuSOLVER", &["libcusolver"]),
    row("cusparse", "libcusparse", "cuSPARSE", &["libcusparse"]),
    row(
        "cusparselt",
        "libcusparse_lt",
        "cuSPARSELt",
        &["libcusparseLt"],
    ),
    row("cufile", "libcufile", "cuFile", &["libcufile"]),
    row("nvjitlink", "libnvjitlink", "nvJitLink", &["libnvJitLink"]),
    row("cudnn", "cudnn", "cuDNN", &["libcudnn"]),
    row("nccl", "nccl", "NCCL", &["libnccl"]),
    row(
        "nvshmem",
        "libnvshmem",
        "NVSHMEM",
        &["libnvshmem", "nvshmem_"],
    ),
];

/// `nvidia-cuda-runtime-cu12` -> `cuda-runtime`; None for a project that is not nvidia-*.
pub fn wheel_stem(project: &str) -> Option<&str> {
    let stem = project.strip_prefix("nvidia-")?;
    let without_cuda = stem.rsplit_once("-cu").and_then(|(head, tail)| {
        (!tail.is_empty() && tail.bytes().all(|b| b.is_ascii_digit())).then_some(head)
    });
    Some(without_cuda.unwrap_or(stem))
}

/// The component of the wheel stem `stem`.
pub fn by_wheel_stem(stem: &str) -> Option<&'static CudaComponent> {
    COMPONENTS.iter().find(|c| c.wheel_stem == stem)
}

/// The component of the redist id `redist` (`cuda_cudart`).
pub fn by_redist(redist: &str) -> Option<&'static CudaComponent> {
    COMPONENTS.iter().find(|c| c.redist == redist)
}

/// The component a library file belongs to, by the longest matching prefix (`libcusparseLt`
/// before `libcusparse`).
pub fn by_library(file_name: &str) -> Option<&'static CudaComponent> {
    COMPONENTS
        .iter()
        .flat_map(|c| c.libraries.iter().map(move |prefix| (prefix, c)))
        .filter(|(prefix, _)| file_name.starts_with(**prefix))
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|(_, component)| component)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stems_drop_the_prefix_and_the_cuda_suffix() {
        assert_eq!(wheel_stem("nvidia-cuda-runtime-cu12"), Some("cuda-runtime"));
        assert_eq!(wheel_stem("nvidia-cudnn-cu13"), Some("cudnn"));
        assert_eq!(wheel_stem("nvidia-nvtx"), Some("nvtx"));
        assert_eq!(wheel_stem("nvidia-cuda-cupti"), Some("cuda-cupti"));
        assert_eq!(wheel_stem("torch"), None);
        assert_eq!(by_wheel_stem("cuda-runtime").unwrap().name, "cudart");
    }

    #[test]
    fn libraries_go_to_the_longest_prefix() {
        let name = |file: &str| by_library(file).map(|c| c.name);
        assert_eq!(name("libcusparseLt.so.0"), Some("cuSPARSELt"));
        assert_eq!(name("libcusparse.so.12.1.0.106"), Some("cuSPARSE"));
        assert_eq!(name("libcublasLt.so.12"), Some("cuBLAS"));
        assert_eq!(name("libcudnn_engines_precompiled.so.9"), Some("cuDNN"));
        assert_eq!(name("libtorch_cuda.so"), None);
    }

    #[test]
    fn ids_and_names_are_unique() {
        for (i, a) in COMPONENTS.iter().enumerate() {
            for b in &COMPONENTS[i + 1..] {
                assert!(a.wheel_stem != b.wheel_stem && a.redist != b.redist && a.name != b.name);
            }
        }
    }
}
