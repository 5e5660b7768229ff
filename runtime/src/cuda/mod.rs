//! The CUDA path (feature `cuda`): a backend on cudarc (driver, cuBLAS, NVRTC), an NCCL
//! communicator, and the one-process-per-GPU trainer. CUDA is loaded at run time, so this
//! compiles and runs on machines without it and reports what is missing.

pub(crate) mod backend;
pub(crate) mod kernels;
pub(crate) mod layouts;
pub(crate) mod model_kernels;
pub(crate) mod nccl;
pub mod nvrtc;
pub(crate) mod region;
pub(crate) mod solo;
pub(crate) mod train;
pub(crate) mod watchdog;

pub use backend::{CudaBackend, CudaTensor};
pub use kernels::{catalog, every_kernel, sources, Source};
pub use model_kernels::ALL_DTYPES;
pub use nccl::{unique_id, NcclComm, NcclHandle};
pub use solo::{SoloComm, SoloHandle};
pub use train::train;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CudaError {
    #[error("no CUDA driver: {0}")]
    NoDriver(String),
    #[error("no CUDA GPU with index {ordinal} ({count} found)")]
    NoDevice { ordinal: usize, count: usize },
    #[error("CUDA driver error: {0}")]
    Driver(String),
    #[error("{lib} could not be loaded or failed: {message}")]
    Library { lib: &'static str, message: String },
}

/// Checks, without panicking, that the driver loads and GPU `ordinal` exists. (cudarc panics
/// when a library it needs is missing, so presence is checked first.)
pub fn check_available(ordinal: usize) -> Result<(), CudaError> {
    // SAFETY: only tries to dlopen the library.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(CudaError::NoDriver(
            "libcuda.so could not be loaded (is the NVIDIA driver installed?)".into(),
        ));
    }
    let count = std::panic::catch_unwind(cudarc::driver::CudaContext::device_count)
        .map_err(|_| CudaError::NoDriver("the CUDA driver could not be initialized".into()))?
        .map_err(|e| CudaError::Driver(e.to_string()))?;
    let count = count.max(0) as usize;
    if ordinal >= count {
        return Err(CudaError::NoDevice { ordinal, count });
    }
    // SAFETY: only tries to dlopen the libraries.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(CudaError::Library {
            lib: "NVRTC",
            message: "libnvrtc.so could not be loaded".into(),
        });
    }
    // SAFETY: as above.
    if !unsafe { cudarc::cublas::sys::is_culib_present() } {
        return Err(CudaError::Library {
            lib: "cuBLAS",
            message: "libcublas.so could not be loaded".into(),
        });
    }
    Ok(())
}

/// Whether NCCL can be loaded (needed for more than one rank; one GPU trains without it).
pub fn nccl_available() -> Result<(), CudaError> {
    // SAFETY: only tries to dlopen the library.
    if unsafe { cudarc::nccl::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(CudaError::Library {
            lib: "NCCL",
            message: "libnccl.so could not be loaded".into(),
        })
    }
}
