//! NCCL communicator: collectives on a dedicated communication stream. An all-reduce starts
//! after the compute stream's work so far (an event), and `wait` makes the compute stream wait
//! on an event recorded after the collective: no host blocking.

use super::backend::{CudaBackend, CudaTensor};
use super::CudaError;
use crate::comm::{CommError, CommTiming, Communicator, ReduceOp};
use cudarc::driver::{CudaEvent, CudaStream};
use cudarc::nccl::{result as nccl_result, sys as nccl_sys};
use std::sync::Arc;
use std::time::Instant;
use tracepass_ir::DType;

pub struct NcclComm {
    rank: usize,
    world: usize,
    comm: nccl_sys::ncclComm_t,
    compute: Arc<CudaStream>,
    stream: Arc<CudaStream>,
    /// One element to all-reduce for a barrier.
    scratch: CudaTensor,
    failed: Option<(usize, String)>,
}

// SAFETY: the NCCL communicator is used from one thread at a time (the rank's), as NCCL requires.
unsafe impl Send for NcclComm {}

pub struct NcclHandle {
    tensor: CudaTensor,
    done: CudaEvent,
    launched: Instant,
    label: String,
}

/// A fresh NCCL unique id (rank 0 makes it and hands it out through the rendezvous).
pub fn unique_id() -> Result<Vec<u8>, CudaError> {
    super::nccl_available()?;
    let id = nccl_result::get_uniqueid().map_err(|e| CudaError::Library {
        lib: "NCCL",
        message: format!("{e:?}"),
    })?;
    Ok(id.internal.iter().map(|c| *c as u8).collect())
}

fn nccl_type(d: DType) -> Option<nccl_sys::ncclDataType_t> {
    Some(match d {
        DType::F32 => nccl_sys::ncclDataType_t::ncclFloat32,
        DType::F16 => nccl_sys::ncclDataType_t::ncclFloat16,
        DType::BF16 => nccl_sys::ncclDataType_t::ncclBfloat16,
        _ => return None,
    })
}

impl NcclComm {
    /// Joins the NCCL group `id` as `rank` of `world`, on a new stream of `backend`'s GPU.
    pub fn new(
        backend: &CudaBackend,
        rank: usize,
        world: usize,
        id: &[u8],
    ) -> Result<NcclComm, CudaError> {
        super::nccl_available()?;
        if id.len() != 128 {
            return Err(CudaError::Library {
                lib: "NCCL",
                message: format!("the unique id has {} bytes, not 128", id.len()),
            });
        }
        let mut internal = [0 as std::ffi::c_char; 128];
        for (d, s) in internal.iter_mut().zip(id) {
            *d = *s as std::ffi::c_char;
        }
        let stream = backend
            .context()
            .new_stream()
            .map_err(|e| CudaError::Driver(e.to_string()))?;
        let mut comm = std::mem::MaybeUninit::uninit();
        // SAFETY: `comm` is written by NCCL on success; the id came from ncclGetUniqueId.
        let comm = unsafe {
            nccl_result::comm_init_rank(
                comm.as_mut_ptr(),
                world as i32,
                nccl_sys::ncclUniqueId { internal },
                rank as i32,
            )
            .map_err(|e| CudaError::Library {
                lib: "NCCL",
                message: format!("ncclCommInitRank: {e:?}"),
            })?;
            comm.assume_init()
        };
        let scratch = crate::backend::Backend::upload(
            backend,
            &crate::tensor::Tensor::from_f32(vec![1], vec![0.0]),
        )
        .map_err(|e| CudaError::Driver(e.0))?;
        Ok(NcclComm {
            rank,
            world,
            comm,
            compute: backend.stream().clone(),
            stream,
            scratch,
            failed: None,
        })
    }

    fn err(&self, message: String) -> CommError {
        CommError::Invalid {
            rank: self.rank,
            message,
        }
    }

    /// The communication stream waits for everything queued on the compute stream so far.
    fn after_compute(&self) -> Result<(), CommError> {
        let ready = self
            .compute
            .record_event(None)
            .map_err(|e| self.err(e.to_string()))?;
        self.stream
            .wait(&ready)
            .map_err(|e| self.err(e.to_string()))
    }
}

impl Communicator for NcclComm {
    type Tensor = CudaTensor;
    type Handle = NcclHandle;

    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }

    fn all_reduce_async(
        &mut self,
        t: CudaTensor,
        op: ReduceOp,
        label: &str,
    ) -> Result<NcclHandle, CommError> {
        let launched = Instant::now();
        let ty = nccl_type(t.dtype())
            .ok_or_else(|| self.err(format!("NCCL cannot reduce {}", t.dtype())))?;
        let op = match op {
            ReduceOp::Sum => nccl_sys::ncclRedOp_t::ncclSum,
            ReduceOp::Max => nccl_sys::ncclRedOp_t::ncclMax,
        };
        self.after_compute()?;
        let ptr = t.ptr(&self.stream);
        // SAFETY: in place on a buffer this rank owns (the bucket it packed), on the comm stream.
        unsafe {
            nccl_result::all_reduce(
                ptr as *const _,
                ptr as *mut _,
                t.numel(),
                ty,
                op,
                self.comm,
                self.stream.cu_stream() as _,
            )
        }
        .map_err(|e| self.err(format!("ncclAllReduce ({label}): {e:?}")))?;
        let done = self
            .stream
            .record_event(None)
            .map_err(|e| self.err(e.to_string()))?;
        Ok(NcclHandle {
            tensor: t,
            done,
            launched,
            label: label.to_string(),
        })
    }

    fn wait(&mut self, h: NcclHandle) -> Result<(CudaTensor, CommTiming), CommError> {
        // the compute stream waits on the device; the host goes on queueing work
        self.compute
            .wait(&h.done)
            .map_err(|e| self.err(format!("wait ({}): {e}", h.label)))?;
        let now = Instant::now();
        Ok((
            h.tensor,
            CommTiming {
                launched: h.launched,
                started: h.launched,
                finished: now,
            },
        ))
    }

    fn broadcast(&mut self, t: CudaTensor, root: usize) -> Result<CudaTensor, CommError> {
        if root >= self.world {
            return Err(self.err(format!(
                "broadcast root {root} is not a rank of a world of {}",
                self.world
            )));
        }
        let ty = nccl_type(t.dtype())
            .ok_or_else(|| self.err(format!("NCCL cannot broadcast {}", t.dtype())))?;
        self.after_compute()?;
        let ptr = t.ptr(&self.stream);
        // SAFETY: in place on the tensor's buffer, which the caller hands over.
        unsafe {
            nccl_result::broadcast(
                ptr as *const _,
                ptr as *mut _,
                t.numel(),
                ty,
                root as i32,
                self.comm,
                self.stream.cu_stream() as _,
            )
        }
        .map_err(|e| self.err(format!("ncclBroadcast: {e:?}")))?;
        let done = self
            .stream
            .record_event(None)
            .map_err(|e| self.err(e.to_string()))?;
        self.compute
            .wait(&done)
            .map_err(|e| self.err(e.to_string()))?;
        Ok(t)
    }

    fn barrier(&mut self) -> Result<(), CommError> {
        let h = self.all_reduce_async(self.scratch.clone(), ReduceOp::Sum, "barrier")?;
        self.stream
            .synchronize()
            .map_err(|e| self.err(e.to_string()))?;
        self.wait(h).map(|_| ())
    }

    fn abort(&self, _reason: &str) {
        // SAFETY: aborting makes pending NCCL operations of this communicator return.
        let _ = unsafe { nccl_result::comm_abort(self.comm) };
    }

    fn failure(&self) -> Option<(usize, String)> {
        self.failed.clone()
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        // SAFETY: the communicator is not used after this.
        let _ = unsafe { nccl_result::comm_destroy(self.comm) };
    }
}
