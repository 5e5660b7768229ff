//! Predicts a backward's step time from a cost model: each op's FLOPs and bytes against the
//! device's peaks on one compute stream, each collective (all-reduce, and `fsdp`'s all-gather
//! and reduce-scatter) by the ring alpha-beta model on one communication stream, waits joining
//! the two.

use super::device::DeviceModel;
use crate::comm::LinkModel;
use crate::exec::kernel::Kernel;
use crate::exec::kernel_ops::decode;
use crate::exec::metrics::{OverlapSummary, Span};
use serde::Serialize;
use tracepass_ir::{ops, print_node_line, Arg, Trace, Type, ValueId};

#[derive(Clone, Debug)]
pub struct SimOptions {
    pub world_size: usize,
    pub device: DeviceModel,
    pub link: LinkModel,
    /// The reduction runs on the host, reading every rank's buffer (ThreadComm): a collective
    /// takes at least `(world + 1) * bytes / mem_bw`.
    pub host_reduction: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct SimBucket {
    pub label: String,
    pub bytes: usize,
    pub launch_s: f64,
    pub start_s: f64,
    pub end_s: f64,
    pub wait_s: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct SimReport {
    pub step_s: f64,
    pub compute_s: f64,
    pub comm_s: f64,
    pub overlap_s: f64,
    pub overlap_pct: f64,
    pub exposed_comm_s: f64,
    pub ops: usize,
    pub buckets: Vec<SimBucket>,
    /// Predicted memory per rank ([`crate::sim::predicted_memory`]), when the caller has the
    /// whole program and every op has a kernel to plan.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<crate::sim::MemoryEstimate>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("cannot simulate `{line}`: {message}")]
pub struct SimError {
    pub line: String,
    pub message: String,
}

fn tensor_bytes(t: &Trace, v: ValueId) -> usize {
    match t.ty(v) {
        Some(Type::Tensor(tt)) | Some(Type::Future(tt)) => tt.nbytes(),
        _ => 0,
    }
}

/// Seconds one compute node takes on `dev`.
fn op_time(
    t: &Trace,
    kernel: &Kernel,
    inputs: &[ValueId],
    outputs: &[ValueId],
    dev: &DeviceModel,
) -> f64 {
    let shape = |v: ValueId| -> Vec<usize> {
        t.ty(v)
            .and_then(Type::as_tensor)
            .map(|tt| tt.shape.to_vec())
            .unwrap_or_default()
    };
    let out_dtype = outputs
        .first()
        .and_then(|o| t.ty(*o))
        .and_then(Type::as_tensor)
        .map_or(tracepass_ir::DType::F32, |tt| tt.dtype);
    match kernel {
        // views: no kernel runs
        Kernel::Identity | Kernel::Reshape(_) | Kernel::Permute(_) => 0.0,
        _ => {
            let in_shapes: Vec<Vec<usize>> = inputs.iter().map(|v| shape(*v)).collect();
            let refs: Vec<&[usize]> = in_shapes.iter().map(Vec::as_slice).collect();
            let out_shape = outputs.first().map(|o| shape(*o)).unwrap_or_default();
            let flops = kernel.flops(&refs, &out_shape);
            let bytes: usize = inputs
                .iter()
                .chain(outputs)
                .map(|v| tensor_bytes(t, *v))
                .sum();
            let is_gemm = matches!(kernel, Kernel::Matmul | Kernel::Linear { .. });
            let peak = if is_gemm {
                dev.flops_for(out_dtype) * dev.gemm_efficiency
            } else {
                dev.f32_flops * dev.gemm_efficiency
            };
            let compute = flops / peak.max(1.0);
            let memory = bytes as f64 / (dev.mem_bw * dev.bw_efficiency).max(1.0);
            (dev.op_overhead_s + compute.max(memory)) * dev.sharing
        }
    }
}

/// Simulates one execution of `trace` (typically a backward rewritten by ddp + sort-waits).
pub fn simulate(trace: &Trace, opts: &SimOptions) -> Result<SimReport, SimError> {
    let dev = &opts.device;
    let mut now = 0.0f64;
    let mut comm_free = 0.0f64;
    let mut busy: Vec<Span> = Vec::new();
    let mut comm: Vec<Span> = Vec::new();
    let mut buckets: Vec<SimBucket> = Vec::new();
    let mut future_bucket: std::collections::HashMap<ValueId, usize> =
        std::collections::HashMap::new();
    let mut label_of: std::collections::HashMap<ValueId, String> = std::collections::HashMap::new();
    let mut ops_count = 0;
    let push_busy = |now: &mut f64, dt: f64, busy: &mut Vec<Span>| {
        if dt > 0.0 {
            busy.push(Span {
                start_us: *now * 1e6,
                end_us: (*now + dt) * 1e6,
            });
            *now += dt;
        }
    };
    for &idx in trace.schedule() {
        let Some(n) = trace.node(idx) else { continue };
        let err = |m: String| SimError {
            line: print_node_line(trace, idx),
            message: m,
        };
        match n.op.as_str() {
            ops::UNPACK_SEQUENCE | ops::CLEAR_COLLECTION | ops::UNPACK | ops::UPDATE_ALIASES => {}
            ops::BUCKET_PACK => {
                let bytes: usize = n.outputs().iter().map(|o| tensor_bytes(trace, *o)).sum();
                if let (Some(o), Some(b)) =
                    (n.outputs().first(), n.kwarg("bucket").and_then(Arg::as_str))
                {
                    label_of.insert(*o, b.to_string());
                }
                let dt = (dev.op_overhead_s
                    + 2.0 * bytes as f64 / (dev.mem_bw * dev.bw_efficiency))
                    * dev.sharing;
                push_busy(&mut now, dt, &mut busy);
                ops_count += 1;
            }
            ops::ALL_REDUCE | ops::ALL_GATHER | ops::REDUCE_SCATTER => {
                let buf = n
                    .args()
                    .first()
                    .and_then(Arg::as_value)
                    .ok_or_else(|| err(format!("{} of no tensor", n.op)))?;
                let w = opts.world_size;
                // what the ring moves is the whole buffer: the gathered result, or the buffer
                // being reduce-scattered
                let (bytes, ring) = match n.op.as_str() {
                    ops::ALL_REDUCE => {
                        let bytes = tensor_bytes(trace, buf);
                        (bytes, opts.link.all_reduce_time(bytes, w))
                    }
                    ops::ALL_GATHER => {
                        let bytes = n.outputs().first().map_or(0, |f| tensor_bytes(trace, *f));
                        (bytes, opts.link.all_gather_time(bytes, w))
                    }
                    _ => {
                        let bytes = tensor_bytes(trace, buf);
                        (bytes, opts.link.reduce_scatter_time(bytes, w))
                    }
                };
                let mut dur = ring.as_secs_f64();
                if opts.host_reduction && w > 1 {
                    // the host reads every rank's part of what it reduces and writes its own
                    let reduced = match n.op.as_str() {
                        ops::ALL_REDUCE => bytes,
                        ops::REDUCE_SCATTER => bytes / w,
                        _ => 0,
                    };
                    dur = dur.max((w + 1) as f64 * reduced as f64 / dev.mem_bw);
                }
                let start = now.max(comm_free);
                let end = start + dur;
                comm_free = end;
                comm.push(Span {
                    start_us: start * 1e6,
                    end_us: end * 1e6,
                });
                if let Some(f) = n.outputs().first() {
                    future_bucket.insert(*f, buckets.len());
                }
                buckets.push(SimBucket {
                    label: label_of
                        .get(&buf)
                        .cloned()
                        .unwrap_or_else(|| trace.name(buf)),
                    bytes,
                    launch_s: now,
                    start_s: start,
                    end_s: end,
                    wait_s: f64::NAN,
                });
            }
            ops::WAIT => {
                let f = n
                    .args()
                    .first()
                    .and_then(Arg::as_value)
                    .ok_or_else(|| err("wait on no future".into()))?;
                let b = *future_bucket
                    .get(&f)
                    .ok_or_else(|| err("wait before its collective".into()))?;
                buckets[b].wait_s = now;
                now = now.max(buckets[b].end_s);
            }
            // a fusion region is one kernel: its operands read once, its output written once
            // (timed as one elementwise op over them: regions are memory bound)
            ops::FUSION => {
                let mut ins: Vec<ValueId> = Vec::new();
                n.args()
                    .iter()
                    .for_each(|a| a.for_each_value(&mut |v| ins.push(v)));
                let one = Kernel::Unary(crate::exec::kernel::UnaryOp::Neg);
                let dt = op_time(trace, &one, &ins, n.outputs(), dev);
                push_busy(&mut now, dt, &mut busy);
                ops_count += 1;
            }
            _ => {
                let d = decode(trace, n).map_err(err)?;
                // `d.then` (so far only the reshape after a getitem's slice) is not timed
                let dt = op_time(trace, &d.kernel, &d.inputs, n.outputs(), dev);
                push_busy(&mut now, dt, &mut busy);
                ops_count += 1;
            }
        }
    }
    let o = OverlapSummary::of(&busy, &comm);
    Ok(SimReport {
        step_s: now,
        compute_s: o.compute_s,
        comm_s: o.comm_s,
        overlap_s: o.overlap_s,
        overlap_pct: o.overlap_pct,
        exposed_comm_s: o.exposed_comm_s,
        ops: ops_count,
        buckets,
        memory: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An all-gather and a reduce-scatter each take the ring time of their whole buffer, on
    /// the communication stream, and their waits join it.
    #[test]
    fn sharded_collectives_take_their_ring_time() {
        let t = tracepass_ir::parse_trace(concat!(
            "def f(shard, g):\n",
            "  # shard: \"cpu f32[250000]\"\n",
            "  # g: \"cpu f32[1000000]\"\n",
            "  ft0 = dist.all_gather_async(shard, 'world', world_size=4)  # ft0: \"FUTURE cpu f32[1000000]\"\n",
            "  t0 = dist.wait(ft0)  # t0: \"cpu f32[1000000]\"\n",
            "  ft1 = dist.reduce_scatter_async(g, 'sum', 'world', world_size=4)  # ft1: \"FUTURE cpu f32[250000]\"\n",
            "  t1 = dist.wait(ft1)  # t1: \"cpu f32[250000]\"\n",
            "  return (t0, t1)\n",
        ))
        .expect("parses");
        let link = crate::comm::LinkModel::parse("10,80").expect("valid");
        let opts = SimOptions {
            world_size: 4,
            device: DeviceModel::named("h100").expect("known"),
            link,
            host_reduction: false,
        };
        let r = simulate(&t, &opts).expect("simulates");
        assert_eq!(r.buckets.len(), 2);
        let ring = link.all_gather_time(4_000_000, 4).as_secs_f64();
        for b in &r.buckets {
            assert_eq!(b.bytes, 4_000_000);
            assert!((b.end_s - b.start_s - ring).abs() < 1e-12);
        }
        // nothing overlaps them: the step is the two collectives back to back
        assert!((r.step_s - 2.0 * ring).abs() < 1e-12, "{}", r.step_s);
    }
}
