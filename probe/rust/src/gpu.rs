//! The GPU levels through cudarc (dynamic loading). Nothing here can run on a machine
//! without an NVIDIA driver and GPU; main.rs checks for libcuda.so.1 (and for cuBLAS/cuDNN
//! with cudarc's `is_culib_present`) before calling in, and every call runs inside
//! `Checks::run`, whose catch_unwind turns a cudarc panic (missing symbol) into one failed check.

use std::ffi::c_void;
use std::sync::Arc;
use std::time::Instant;

use cudarc::cublas::sys as cublas_sys;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::cudnn::{result as dnn, sys as dnn_sys};
use cudarc::driver::sys as cu;
use cudarc::driver::{result as cu_result, CudaContext, CudaStream, DevicePtr, DevicePtrMut};
use serde_json::{json, Value};

use crate::reference::{self, ConvShape, Rng};

/// `cuDriverGetVersion`: 12040 -> "12.4".
pub fn driver_cuda_version() -> Result<String, String> {
    let mut version = 0i32;
    let status = unsafe { cu::cuDriverGetVersion(&mut version) };
    if status != cu::CUresult::CUDA_SUCCESS {
        return Err(format!("cuDriverGetVersion returned {status:?}"));
    }
    Ok(format!("{}.{}", version / 1000, (version % 1000) / 10))
}

pub struct Gpu {
    pub index: u32,
    pub name: String,
    pub major: u32,
    pub minor: u32,
    pub memory_bytes: u64,
    pub uuid: Option<String>,
}

fn format_uuid(bytes: &[u8; 16]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// cuInit, then every device's name, compute capability, memory and UUID.
pub fn devices() -> Result<Vec<Gpu>, String> {
    cu_result::init()
        .map_err(|e| format!("cuInit failed although the driver is visible: {e:?}"))?;
    let count =
        cu_result::device::get_count().map_err(|e| format!("cuDeviceGetCount failed: {e:?}"))?;
    let mut gpus = Vec::new();
    for ordinal in 0..count {
        let device = cu_result::device::get(ordinal)
            .map_err(|e| format!("cuDeviceGet({ordinal}): {e:?}"))?;
        let attribute = |attribute| unsafe { cu_result::device::get_attribute(device, attribute) };
        let major = attribute(cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
            .map_err(|e| format!("cuDeviceGetAttribute(major) on GPU {ordinal}: {e:?}"))?;
        let minor = attribute(cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
            .map_err(|e| format!("cuDeviceGetAttribute(minor) on GPU {ordinal}: {e:?}"))?;
        let name = cu_result::device::get_name(device)
            .map_err(|e| format!("cuDeviceGetName({ordinal}): {e:?}"))?;
        let memory = unsafe { cu_result::device::total_mem(device) }.unwrap_or(0);
        let uuid = cu_result::device::get_uuid(device).ok().map(|u| {
            let bytes: [u8; 16] = u.bytes.map(|b| b as u8);
            format_uuid(&bytes)
        });
        gpus.push(Gpu {
            index: ordinal as u32,
            name,
            major: major as u32,
            minor: minor as u32,
            memory_bytes: memory as u64,
            uuid,
        });
    }
    Ok(gpus)
}

fn context() -> Result<(Arc<CudaContext>, Arc<CudaStream>), String> {
    let ctx =
        CudaContext::new(0).map_err(|e| format!("creating a context on GPU 0 failed: {e:?}"))?;
    let stream = ctx.default_stream();
    Ok((ctx, stream))
}

/// n x n fp32 SGEMM through cuBLAS in pedantic math mode (no TF32, no reduced precision),
/// against a float64 CPU reference. Returns (relative error, TFLOP/s).
pub fn sgemm(n: usize) -> Result<(f64, f64), String> {
    let (_ctx, stream) = context()?;
    let mut rng = Rng::new(0);
    let (a, b) = (rng.vec(n * n), rng.vec(n * n));
    let reference = reference::gemm_f64(n, n, n, &a, &b);
    let blas = CudaBlas::new(stream.clone()).map_err(|e| format!("cublasCreate failed: {e:?}"))?;
    let status = unsafe {
        cublas_sys::cublasSetMathMode(
            *blas.handle(),
            cublas_sys::cublasMath_t::CUBLAS_PEDANTIC_MATH,
        )
    };
    if status != cublas_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Err(format!(
            "cublasSetMathMode(CUBLAS_PEDANTIC_MATH) returned {status:?}"
        ));
    }
    let da = stream
        .clone_htod(&a)
        .map_err(|e| format!("copy to the GPU: {e:?}"))?;
    let db = stream
        .clone_htod(&b)
        .map_err(|e| format!("copy to the GPU: {e:?}"))?;
    let mut dc = stream
        .alloc_zeros::<f32>(n * n)
        .map_err(|e| format!("cuMemAlloc: {e:?}"))?;
    // Row-major C = A B is column-major C^T = B^T A^T: pass B first.
    let ni = n as i32;
    let config = GemmConfig {
        transa: cublas_sys::cublasOperation_t::CUBLAS_OP_N,
        transb: cublas_sys::cublasOperation_t::CUBLAS_OP_N,
        m: ni,
        n: ni,
        k: ni,
        alpha: 1.0f32,
        lda: ni,
        ldb: ni,
        beta: 0.0f32,
        ldc: ni,
    };
    unsafe { blas.gemm(config, &db, &da, &mut dc) }
        .map_err(|e| format!("cublasSgemm (warm-up): {e:?}"))?;
    stream
        .synchronize()
        .map_err(|e| format!("synchronize: {e:?}"))?;
    let runs = 5;
    let started = Instant::now();
    for _ in 0..runs {
        unsafe { blas.gemm(config, &db, &da, &mut dc) }
            .map_err(|e| format!("cublasSgemm: {e:?}"))?;
    }
    stream
        .synchronize()
        .map_err(|e| format!("synchronize: {e:?}"))?;
    let seconds = started.elapsed().as_secs_f64() / runs as f64;
    let product = stream
        .clone_dtoh(&dc)
        .map_err(|e| format!("copy from the GPU: {e:?}"))?;
    let error = reference::relative_frobenius(&product, &reference);
    let tflops = 2.0 * (n as f64).powi(3) / seconds / 1e12;
    Ok((error, tflops))
}

fn dnn_err(what: &str) -> impl Fn(dnn::CudnnError) -> String + '_ {
    move |e| format!("{what}: {e:?}")
}

/// What one cuDNN forward convolution did.
pub struct ConvRun {
    pub error: f64,
    pub algo: String,
    /// The math type cuDNN reported for the chosen algorithm (FMA expected: a first GPU run
    /// tells whether the algorithm filter may demand it).
    pub math: String,
    pub cudnn_version: usize,
    pub milliseconds: f64,
}

/// cuDNN convolution forward (fp32, FMA math only: no TF32 / tensor-op rounding) against the
/// CPU reference. `benchmark`: cudnnFindConvolutionForwardAlgorithm (times every algorithm
/// and takes the fastest, like torch's cudnn.benchmark); otherwise the heuristic's choice
/// (cudnnGetConvolutionForwardAlgorithm_v7, like benchmark off).
pub fn conv_forward(shape: ConvShape, benchmark: bool) -> Result<ConvRun, String> {
    // cudarc's bindings are cuDNN 9's (status codes from 1000): a cuDNN 8 reached through a
    // stray `libcudnn.so` would hand back codes outside that enum.
    let version = dnn::get_version();
    if version < 90000 {
        return Err(format!(
            "the loaded cuDNN reports version {version}: this probe speaks cuDNN 9's API (>= 90000)"
        ));
    }
    let (_ctx, stream) = context()?;
    let mut rng = Rng::new(1);
    let x = rng.vec(shape.input_len());
    let w: Vec<f32> = rng
        .vec(shape.filter_len())
        .iter()
        .map(|v| v * 0.1)
        .collect();
    let reference = reference::conv2d_f64(shape, &x, &w);
    let dims = |a: usize, b: usize, c: usize, d: usize| [a as i32, b as i32, c as i32, d as i32];
    let float = dnn_sys::cudnnDataType_t::CUDNN_DATA_FLOAT;
    let nchw = dnn_sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW;
    unsafe {
        let handle = dnn::create_handle().map_err(dnn_err("cudnnCreate"))?;
        dnn::set_stream(handle, stream.cu_stream() as _).map_err(dnn_err("cudnnSetStream"))?;
        // An NCHW float tensor descriptor of `extent`; `what` names it in errors.
        let tensor = |extent: [i32; 4], what: &'static str| {
            let desc =
                dnn::create_tensor_descriptor().map_err(dnn_err("cudnnCreateTensorDescriptor"))?;
            dnn::set_tensor4d_descriptor(desc, nchw, float, extent).map_err(dnn_err(what))?;
            Ok::<_, String>(desc)
        };
        let x_desc = tensor(
            dims(shape.n, shape.c, shape.h, shape.w),
            "cudnnSetTensor4dDescriptor(x)",
        )?;
        let y_desc = tensor(
            dims(shape.n, shape.k, shape.out_h(), shape.out_w()),
            "cudnnSetTensor4dDescriptor(y)",
        )?;
        let w_desc =
            dnn::create_filter_descriptor().map_err(dnn_err("cudnnCreateFilterDescriptor"))?;
        dnn::set_filter4d_descriptor(
            w_desc,
            float,
            nchw,
            dims(shape.k, shape.c, shape.r, shape.s),
        )
        .map_err(dnn_err("cudnnSetFilter4dDescriptor"))?;
        let conv = dnn::create_convolution_descriptor()
            .map_err(dnn_err("cudnnCreateConvolutionDescriptor"))?;
        let pad = shape.pad as i32;
        dnn::set_convolution2d_descriptor(
            conv,
            pad,
            pad,
            1,
            1,
            1,
            1,
            dnn_sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
            float,
        )
        .map_err(dnn_err("cudnnSetConvolution2dDescriptor"))?;
        dnn::set_convolution_math_type(conv, dnn_sys::cudnnMathType_t::CUDNN_FMA_MATH)
            .map_err(dnn_err("cudnnSetConvolutionMathType(FMA)"))?;

        let dx = stream
            .clone_htod(&x)
            .map_err(|e| format!("copy to the GPU: {e:?}"))?;
        let dw = stream
            .clone_htod(&w)
            .map_err(|e| format!("copy to the GPU: {e:?}"))?;
        let mut dy = stream
            .alloc_zeros::<f32>(shape.output_len())
            .map_err(|e| format!("cuMemAlloc: {e:?}"))?;

        const ALGOS: usize = 8;
        let mut perf: [dnn_sys::cudnnConvolutionFwdAlgoPerf_t; ALGOS] = std::mem::zeroed();
        let mut returned = 0i32;
        if benchmark {
            let status = dnn_sys::cudnnFindConvolutionForwardAlgorithm(
                handle,
                x_desc,
                w_desc,
                conv,
                y_desc,
                ALGOS as i32,
                &mut returned,
                perf.as_mut_ptr(),
            );
            if status != dnn_sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
                return Err(format!(
                    "cudnnFindConvolutionForwardAlgorithm returned {status:?}"
                ));
            }
        } else {
            dnn::get_convolution_forward_algorithm(
                handle,
                x_desc,
                w_desc,
                conv,
                y_desc,
                ALGOS as i32,
                &mut returned,
                perf.as_mut_ptr(),
            )
            .map_err(dnn_err("cudnnGetConvolutionForwardAlgorithm_v7"))?;
        }
        let chosen = perf[..returned.max(0) as usize]
            .iter()
            .find(|p| {
                p.status == dnn_sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS
                    && p.mathType != dnn_sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH
                    && p.mathType != dnn_sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION
            })
            .copied()
            .ok_or_else(|| {
                format!("cuDNN offered no usable FMA-math forward algorithm ({returned} returned)")
            })?;
        let workspace_bytes = dnn::get_convolution_forward_workspace_size(
            handle,
            x_desc,
            w_desc,
            conv,
            y_desc,
            chosen.algo,
        )
        .map_err(dnn_err("cudnnGetConvolutionForwardWorkspaceSize"))?;
        let mut workspace = stream
            .alloc_zeros::<u8>(workspace_bytes.max(1))
            .map_err(|e| format!("cuMemAlloc: {e:?}"))?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        let started = Instant::now();
        {
            let (px, _rx) = dx.device_ptr(&stream);
            let (pw, _rw) = dw.device_ptr(&stream);
            let (py, _ry) = dy.device_ptr_mut(&stream);
            let (pws, _rws) = workspace.device_ptr_mut(&stream);
            dnn::convolution_forward(
                handle,
                &alpha as *const f32 as *const c_void,
                x_desc,
                px as *const c_void,
                w_desc,
                pw as *const c_void,
                conv,
                chosen.algo,
                pws as *mut c_void,
                workspace_bytes,
                &beta as *const f32 as *const c_void,
                y_desc,
                py as *mut c_void,
            )
            .map_err(dnn_err("cudnnConvolutionForward"))?;
        }
        stream
            .synchronize()
            .map_err(|e| format!("synchronize: {e:?}"))?;
        let milliseconds = started.elapsed().as_secs_f64() * 1000.0;
        let out = stream
            .clone_dtoh(&dy)
            .map_err(|e| format!("copy from the GPU: {e:?}"))?;
        let _ = dnn::destroy_convolution_descriptor(conv);
        let _ = dnn::destroy_filter_descriptor(w_desc);
        let _ = dnn::destroy_tensor_descriptor(x_desc);
        let _ = dnn::destroy_tensor_descriptor(y_desc);
        let _ = dnn::destroy_handle(handle);
        Ok(ConvRun {
            error: reference::relative_max(&out, &reference),
            algo: format!("{:?}", chosen.algo),
            math: format!("{:?}", chosen.mathType),
            cudnn_version: dnn::get_version(),
            milliseconds,
        })
    }
}

pub fn gpu_json(gpu: &Gpu, kernels: Option<String>) -> Value {
    let mut value = json!({
        "index": gpu.index,
        "name": gpu.name,
        "compute_capability": format!("{}.{}", gpu.major, gpu.minor),
        "memory_bytes": gpu.memory_bytes,
        "uuid": gpu.uuid,
    });
    if let Some(kernels) = kernels {
        value["kernels"] = json!(kernels);
    }
    value
}

#[cfg(test)]
mod tests {
    #[test]
    fn uuids_read_like_nvidia_smi() {
        let bytes: [u8; 16] = [0xde, 0xad, 0xbe, 0xef, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11];
        assert_eq!(
            super::format_uuid(&bytes),
            "GPU-deadbeef-0001-0203-0405-060708090a0b"
        );
    }
}
