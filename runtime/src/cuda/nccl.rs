//! NCCL communicator: collectives on a dedicated communication stream. An all-reduce starts
//! after the compute stream's work so far (an event), and `wait` makes the compute stream wait
//! on an event recorded after the collective: no host blocking.
//!
//! Failure handling follows PyTorch's NCCL watchdog ([`super::watchdog`]): a thread polls each
//! collective's completion event and `ncclCommGetAsyncError`; a collective not done within
//! `--collective-timeout`, or an asynchronous error, aborts the communicator, and the rank's
//! next call returns an error naming the rank and the collective. Every rank runs its own
//! watchdog, so when one rank dies the others time out instead of hanging. Joining the group
//! (`ncclCommInitRank`) is bounded by the same timeout.
//!
//! Each collective is bracketed by two timing events, so the metrics hold the collective's
//! time on the device ([`NcclComm::take_timings`], once the step is synchronized).

use super::backend::{CudaBackend, CudaTensor};
use super::watchdog::{Guard, RawComm, Watchdog, WatchdogThread, Work};
use super::CudaError;
use crate::comm::{CommError, CommTiming, Communicator, ReduceOp};
use cudarc::driver::{sys as driver_sys, CudaContext, CudaEvent, CudaStream};
use cudarc::nccl::{result as nccl_result, sys as nccl_sys};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracepass_ir::DType;

/// How often the watchdog looks at the outstanding collectives.
const POLL: Duration = Duration::from_millis(20);

/// The raw NCCL communicator.
struct RawNccl(nccl_sys::ncclComm_t);

// SAFETY: NCCL communicators may be used from several threads when calls are serialized (the
// Guard does) and ncclCommAbort may be called from another thread to stop a blocked call.
unsafe impl Send for RawNccl {}
// SAFETY: as above.
unsafe impl Sync for RawNccl {}

impl RawComm for RawNccl {
    fn async_error(&self) -> Result<(), String> {
        let mut state = nccl_sys::ncclResult_t::ncclSuccess;
        // SAFETY: a live communicator (the Guard refuses calls after abort), one out-parameter.
        let r = unsafe { nccl_sys::ncclCommGetAsyncError(self.0, &mut state) };
        if r != nccl_sys::ncclResult_t::ncclSuccess {
            return Err(format!("ncclCommGetAsyncError: {r:?}"));
        }
        match state {
            nccl_sys::ncclResult_t::ncclSuccess | nccl_sys::ncclResult_t::ncclInProgress => Ok(()),
            other => Err(format!("{other:?}")),
        }
    }
    fn abort(&self) {
        // SAFETY: called once (the Guard), on a communicator that was not destroyed.
        let _ = unsafe { nccl_result::comm_abort(self.0) };
    }
    fn destroy(&self) {
        // SAFETY: called once, from the Guard's drop, only when not aborted.
        let _ = unsafe { nccl_result::comm_destroy(self.0) };
    }
}

/// A collective is done when the event recorded after it is.
struct EventWork(Arc<CudaEvent>);

impl Work for EventWork {
    fn done(&self) -> Result<bool, String> {
        self.0.try_is_complete().map_err(|e| e.to_string())
    }
}

/// One collective the rank has waited on, for its device time once the step is synchronized.
struct Waited {
    label: String,
    launched: Instant,
    start: Arc<CudaEvent>,
    end: Arc<CudaEvent>,
}

pub struct NcclComm {
    rank: usize,
    world: usize,
    /// Stopped (joined) before anything else drops.
    _thread: WatchdogThread,
    watchdog: Arc<Watchdog<RawNccl, EventWork>>,
    compute: Arc<CudaStream>,
    stream: Arc<CudaStream>,
    /// One element to all-reduce for a barrier.
    scratch: CudaTensor,
    seq: u64,
    /// An event on the communication stream and the host time it completed: device times
    /// are read relative to it.
    anchor: (CudaEvent, Instant),
    waited: Vec<Waited>,
}

pub struct NcclHandle {
    tensor: CudaTensor,
    /// The input of an out-of-place collective, kept alive until it is waited on.
    _input: Option<CudaTensor>,
    start: Arc<CudaEvent>,
    end: Arc<CudaEvent>,
    launched: Instant,
    label: String,
}

/// A fresh NCCL unique id (rank 0 makes it and hands it out through the rendezvous). Every
/// communicator group needs its own: a second `ncclCommInitRank` with a used id hangs.
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

fn timing_event(stream: &CudaStream) -> Result<CudaEvent, String> {
    stream
        .record_event(Some(driver_sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|e| e.to_string())
}

/// An event recorded on `stream` now, waited for, and the host time after.
fn anchor(stream: &CudaStream) -> Result<(CudaEvent, Instant), String> {
    let e = timing_event(stream)?;
    e.synchronize().map_err(|e| e.to_string())?;
    Ok((e, Instant::now()))
}

/// `ncclCommInitRank` on a helper thread, so that a peer that never joins is a timeout error
/// instead of a hang (the stuck thread ends with the process).
fn init_rank(
    ctx: &Arc<CudaContext>,
    rank: usize,
    world: usize,
    id: nccl_sys::ncclUniqueId,
    timeout: Duration,
) -> Result<RawNccl, CudaError> {
    let nccl_err = |message: String| CudaError::Library {
        lib: "NCCL",
        message,
    };
    let (world_i, rank_i) = (
        i32::try_from(world).map_err(|_| nccl_err(format!("world size {world} is too large")))?,
        i32::try_from(rank).map_err(|_| nccl_err(format!("rank {rank} is too large")))?,
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let ctx = ctx.clone();
    std::thread::Builder::new()
        .name(format!("nccl-init-{rank}"))
        .spawn(move || {
            let r = ctx
                .bind_to_thread()
                .map_err(|e| e.to_string())
                .and_then(|()| {
                    let mut comm = std::mem::MaybeUninit::uninit();
                    // SAFETY: `comm` is written by NCCL on success; the id came from
                    // ncclGetUniqueId; the device is the one bound above.
                    unsafe {
                        nccl_result::comm_init_rank(comm.as_mut_ptr(), world_i, id, rank_i)
                            .map_err(|e| format!("ncclCommInitRank: {e:?}"))?;
                        Ok(RawNccl(comm.assume_init()))
                    }
                });
            let _ = tx.send(r);
        })
        .map_err(|e| nccl_err(format!("starting the init thread: {e}")))?;
    match rx.recv_timeout(timeout) {
        Ok(r) => r.map_err(nccl_err),
        Err(_) => Err(nccl_err(format!(
            "rank {rank}: ncclCommInitRank did not finish within {:.1} s (--collective-timeout): \
             a rank of the {world} did not join",
            timeout.as_secs_f64()
        ))),
    }
}

impl NcclComm {
    /// Joins the NCCL group `id` as `rank` of `world`, on a new stream of `backend`'s GPU;
    /// collectives that take longer than `timeout` abort it.
    pub fn new(
        backend: &CudaBackend,
        rank: usize,
        world: usize,
        id: &[u8],
        timeout: Duration,
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
        let drv = |e: String| CudaError::Driver(e);
        let stream = backend
            .context()
            .new_stream()
            .map_err(|e| drv(e.to_string()))?;
        let raw = init_rank(
            backend.context(),
            rank,
            world,
            nccl_sys::ncclUniqueId { internal },
            timeout,
        )?;
        let guard = Arc::new(Guard::new(raw));
        let watchdog = Arc::new(Watchdog::new(rank, timeout, guard));
        let ctx = backend.context().clone();
        let thread = WatchdogThread::spawn(watchdog.clone(), POLL, move || {
            // events are queried on this thread
            let _ = ctx.bind_to_thread();
        })
        .map_err(|e| drv(format!("starting the NCCL watchdog: {e}")))?;
        let scratch = crate::exec::backend::Backend::upload(
            backend,
            &crate::tensor::Tensor::from_f32(vec![1], vec![0.0]),
        )
        .map_err(|e| drv(e.0))?;
        let anchor = anchor(&stream).map_err(drv)?;
        Ok(NcclComm {
            rank,
            world,
            _thread: thread,
            watchdog,
            compute: backend.stream().clone(),
            stream,
            scratch,
            seq: 0,
            anchor,
            waited: Vec::new(),
        })
    }

    fn err(&self, message: String) -> CommError {
        CommError::Invalid {
            rank: self.rank,
            message,
        }
    }

    /// The watchdog's failure, if any, as this rank's error.
    fn check(&self) -> Result<(), CommError> {
        match self.watchdog.failure() {
            Some(m) => Err(self.err(m)),
            None => Ok(()),
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

    /// Queues collective `what` (an NCCL call on the communication stream) between two timing
    /// events, and hands its completion to the watchdog.
    fn launch(
        &mut self,
        label: &str,
        what: &str,
        call: impl FnOnce(nccl_sys::ncclComm_t, nccl_sys::cudaStream_t) -> Result<(), String>,
    ) -> Result<(Arc<CudaEvent>, Arc<CudaEvent>), CommError> {
        self.check()?;
        self.after_compute()?;
        let start = Arc::new(timing_event(&self.stream).map_err(|e| self.err(e))?);
        let stream = self.stream.cu_stream() as nccl_sys::cudaStream_t;
        match self.watchdog.guard().call(|c| call(c.0, stream)) {
            None => {
                self.check()?;
                return Err(self.err(format!("{what} ({label}): the communicator was aborted")));
            }
            Some(Err(e)) => {
                let msg = self.watchdog.fail(format!(
                    "{what} ({label}) failed: {e}; the communicator was aborted"
                ));
                return Err(self.err(msg));
            }
            Some(Ok(())) => {}
        }
        let end = Arc::new(timing_event(&self.stream).map_err(|e| self.err(e))?);
        self.seq += 1;
        self.watchdog
            .watch(self.seq, label, EventWork(end.clone()), Instant::now());
        Ok((start, end))
    }

    /// Issues `what` on `t` (the part every collective shares): the dtype NCCL takes, the
    /// output (`t` itself in place, or a fresh buffer of the received size out of place, `t`
    /// kept alive until the wait), the launch between timing events, and the handle.
    fn collective(
        &mut self,
        t: CudaTensor,
        what: Collective,
        label: &str,
    ) -> Result<NcclHandle, CommError> {
        let launched = Instant::now();
        let name = what.name();
        let ty = nccl_type(t.dtype())
            .ok_or_else(|| self.err(format!("NCCL cannot {} {}", what.verb(), t.dtype())))?;
        let shape = what
            .shape(t.numel(), self.world)
            .map_err(|m| self.err(format!("{name} ({label}): {m}")))?;
        let out = match shape.out_numel {
            None => None,
            Some(n) => Some(
                CudaTensor::uninit_on(&self.stream, vec![n], t.dtype())
                    .map_err(|m| self.err(format!("{name} ({label}): {m}")))?,
            ),
        };
        let src = t.ptr(&self.stream);
        let dst = out.as_ref().map_or(src, |o| o.ptr(&self.stream));
        let count = shape.count;
        let (start, end) = self.launch(label, what.nccl_call(), |comm, stream| {
            let (src, dst) = (src as *const _, dst as *mut _);
            // SAFETY: `src` and `dst` are live device buffers of the sizes `Collective::shape`
            // gives for `count` (the same buffer in place, else the output made above), kept
            // alive by the handle until it is waited on; on the communication stream, `comm`
            // live (the Guard's call).
            unsafe {
                match what {
                    Collective::AllReduce(op) => {
                        nccl_result::all_reduce(src, dst, count, ty, nccl_op(op), comm, stream)
                    }
                    Collective::AllGather => {
                        nccl_result::all_gather(src, dst, count, ty, comm, stream)
                    }
                    Collective::ReduceScatter(op) => {
                        nccl_result::reduce_scatter(src, dst, count, ty, nccl_op(op), comm, stream)
                    }
                }
            }
            .map(|_| ())
            .map_err(|e| format!("{e:?}"))
        })?;
        let (tensor, input) = match out {
            Some(o) => (o, Some(t)),
            None => (t, None),
        };
        Ok(NcclHandle {
            tensor,
            _input: input,
            start,
            end,
            launched,
            label: label.to_string(),
        })
    }

    /// Waits on the host for `end`, returning early with the watchdog's failure.
    fn wait_host(&self, end: &CudaEvent) -> Result<(), CommError> {
        loop {
            self.check()?;
            if end.try_is_complete().map_err(|e| self.err(e.to_string()))? {
                return Ok(());
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// When each collective waited on since the last call ran on the device, in wait order,
    /// with its label. Call after the compute stream is synchronized (the events are done).
    pub fn take_timings(&mut self) -> Result<Vec<(String, CommTiming)>, CommError> {
        self.check()?;
        let (base, at) = (&self.anchor.0, self.anchor.1);
        let when = |e: &CudaEvent| -> Result<Instant, CommError> {
            let ms = base.elapsed_ms(e).map_err(|e| self.err(e.to_string()))?;
            let d = Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3);
            Ok(at + d)
        };
        let mut out = Vec::with_capacity(self.waited.len());
        for w in &self.waited {
            let started = when(&w.start)?.max(w.launched);
            let finished = when(&w.end)?.max(started);
            out.push((
                w.label.clone(),
                CommTiming {
                    launched: w.launched,
                    started,
                    finished,
                },
            ));
        }
        self.waited.clear();
        // a fresh anchor keeps the f32 milliseconds of the next step small and exact
        self.anchor = anchor(&self.stream).map_err(|e| self.err(e))?;
        Ok(out)
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
        self.collective(t, Collective::AllReduce(op), label)
    }

    fn all_gather_async(&mut self, t: CudaTensor, label: &str) -> Result<NcclHandle, CommError> {
        self.collective(t, Collective::AllGather, label)
    }

    fn reduce_scatter_async(
        &mut self,
        t: CudaTensor,
        op: ReduceOp,
        label: &str,
    ) -> Result<NcclHandle, CommError> {
        self.collective(t, Collective::ReduceScatter(op), label)
    }

    fn wait(&mut self, h: NcclHandle) -> Result<(CudaTensor, CommTiming), CommError> {
        self.check()?;
        // the compute stream waits on the device; the host goes on queueing work
        self.compute
            .wait(&h.end)
            .map_err(|e| self.err(format!("wait ({}): {e}", h.label)))?;
        // host times for now; `take_timings` gives the device's once the step is synchronized
        let now = Instant::now();
        self.waited.push(Waited {
            label: h.label,
            launched: h.launched,
            start: h.start,
            end: h.end,
        });
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
        let (ptr, n) = (t.ptr(&self.stream), t.numel());
        let root_i = i32::try_from(root).map_err(|_| self.err(format!("root {root}")))?;
        let (_, end) = self.launch("broadcast", "ncclBroadcast", |comm, stream| {
            // SAFETY: in place on the tensor's buffer, which the caller hands over.
            unsafe {
                nccl_result::broadcast(ptr as *const _, ptr as *mut _, n, ty, root_i, comm, stream)
            }
            .map(|_| ())
            .map_err(|e| format!("{e:?}"))
        })?;
        self.compute
            .wait(&end)
            .map_err(|e| self.err(e.to_string()))?;
        Ok(t)
    }

    fn barrier(&mut self) -> Result<(), CommError> {
        let h = self.all_reduce_async(self.scratch.clone(), ReduceOp::Sum, "barrier")?;
        self.wait_host(&h.end)?;
        self.compute
            .wait(&h.end)
            .map_err(|e| self.err(e.to_string()))
    }

    fn abort(&self, reason: &str) {
        self.watchdog
            .fail(format!("aborted by this rank: {reason}"));
    }

    fn failure(&self) -> Option<(usize, String)> {
        self.watchdog.failure().map(|m| (self.rank, m))
    }
}

/// One of the collectives a step issues on a whole tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Collective {
    /// In place: every rank ends with the reduction of everyone's buffer.
    AllReduce(ReduceOp),
    /// Each rank sends its shard and receives the whole.
    AllGather,
    /// Each rank sends the whole and receives the reduction of its shard.
    ReduceScatter(ReduceOp),
}

/// What NCCL is told for a collective of a buffer: the element count it takes (the whole
/// buffer for an all-reduce, the sent shard for an all-gather, the received shard for a
/// reduce-scatter), and the output's elements when it is out of place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Counts {
    count: usize,
    out_numel: Option<usize>,
}

impl Collective {
    /// Its name in messages (`all_gather (gather:b0): ...`).
    fn name(self) -> &'static str {
        match self {
            Collective::AllReduce(_) => "all_reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter(_) => "reduce_scatter",
        }
    }
    /// The NCCL function, for the watchdog's messages.
    fn nccl_call(self) -> &'static str {
        match self {
            Collective::AllReduce(_) => "ncclAllReduce",
            Collective::AllGather => "ncclAllGather",
            Collective::ReduceScatter(_) => "ncclReduceScatter",
        }
    }
    /// What it does to a dtype, for `NCCL cannot gather i64`.
    fn verb(self) -> &'static str {
        match self {
            Collective::AllGather => "gather",
            _ => "reduce",
        }
    }
    /// The counts for a buffer of `numel` elements on `world` ranks. A reduce-scattered
    /// buffer must split evenly (the fsdp pass pads every bucket to a multiple of the world
    /// size).
    fn shape(self, numel: usize, world: usize) -> Result<Counts, String> {
        let world = world.max(1);
        match self {
            Collective::AllReduce(_) => Ok(Counts {
                count: numel,
                out_numel: None,
            }),
            Collective::AllGather => numel
                .checked_mul(world)
                .map(|whole| Counts {
                    count: numel,
                    out_numel: Some(whole),
                })
                .ok_or_else(|| format!("{numel} elements on {world} ranks overflow")),
            Collective::ReduceScatter(_) if numel.is_multiple_of(world) => Ok(Counts {
                count: numel / world,
                out_numel: Some(numel / world),
            }),
            Collective::ReduceScatter(_) => Err(format!(
                "{numel} elements do not split into {world} equal shards"
            )),
        }
    }
}

fn nccl_op(op: ReduceOp) -> nccl_sys::ncclRedOp_t {
    match op {
        ReduceOp::Sum => nccl_sys::ncclRedOp_t::ncclSum,
        ReduceOp::Max => nccl_sys::ncclRedOp_t::ncclMax,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collectives_count_shards_and_wholes() {
        let counts = |c: Collective, n, w| c.shape(n, w).map(|k| (k.count, k.out_numel));
        let sum = ReduceOp::Sum;
        // in place: the whole buffer
        assert_eq!(counts(Collective::AllReduce(sum), 10, 4), Ok((10, None)));
        // out of place: a gather sends its shard and receives the whole, a scatter the reverse
        assert_eq!(counts(Collective::AllGather, 3, 4), Ok((3, Some(12))));
        assert_eq!(
            counts(Collective::ReduceScatter(sum), 12, 4),
            Ok((3, Some(3)))
        );
        let e = counts(Collective::ReduceScatter(sum), 10, 4).expect_err("uneven");
        assert!(e.contains("4 equal shards"), "{e}");
        assert!(counts(Collective::AllGather, usize::MAX, 2).is_err());
        assert_eq!(
            counts(Collective::ReduceScatter(ReduceOp::Max), 5, 1),
            Ok((5, Some(5)))
        );
        // names in messages
        assert_eq!(Collective::AllGather.nccl_call(), "ncclAllGather");
        assert_eq!(Collective::ReduceScatter(sum).name(), "reduce_scatter");
        assert_eq!(Collective::AllReduce(sum).verb(), "reduce");
    }
}
