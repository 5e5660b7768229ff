//! A trace compiled for execution: values become numbered slots, nodes become instructions
//! with their kernels decoded, and each instruction lists the slots that die after it.

use crate::comm::ReduceOp;
use crate::exec::kernel::{BinaryOp, Kernel, Side};
use crate::exec::kernel_ops::decode;
use crate::exec::memory_plan::MemoryPlan;
use crate::exec::region::RegionProgram;
use tracepass_ir::{ops, print_node_line, Arg, Trace, Type, ValueId};

/// Index of a value's slot in the executor's table.
pub type Slot = usize;

#[derive(Clone, Debug)]
pub enum InstrKind {
    Compute(Kernel),
    /// `a, b, = collection`
    UnpackSequence,
    /// Thunder's `clear_mutable_collection`: nothing to do once the collection is unpacked.
    Nop,
    /// Thunder's `update_aliases((a, b, ...))`: output `k` is input `k`, the same value.
    Alias,
    /// `Tensor.item(a)`: the one element of tensor `a` as a number (read back from the
    /// device).
    Item,
    /// Inputs are the members, in bucket order; a member with a divisor is divided by it while
    /// it is copied in (a `prims.div` read only by the pack, fused into it).
    Pack {
        divisors: Vec<Option<f64>>,
    },
    AllReduce {
        op: ReduceOp,
        bucket: usize,
    },
    /// fsdp's gather of a bucket's shards (the output is the padded whole).
    AllGather {
        bucket: usize,
    },
    /// fsdp's reduce-scatter of a padded bucket of gradients (the output is this rank's shard).
    ReduceScatter {
        op: ReduceOp,
        bucket: usize,
    },
    Wait {
        bucket: usize,
    },
    /// Outputs are views of the input buffer.
    Unpack {
        offsets: Vec<usize>,
        shapes: Vec<Vec<usize>>,
    },
    /// A fusion region of `fuse-elementwise`: inputs are its operands, one output.
    Region(std::sync::Arc<RegionProgram>),
}

#[derive(Clone, Debug)]
pub struct Instr {
    pub kind: InstrKind,
    pub inputs: Vec<Slot>,
    pub outputs: Vec<Slot>,
    /// Slots whose last use is this instruction (never a result).
    pub free: Vec<Slot>,
    /// The node as printed, for error messages.
    pub line: String,
}

/// What a collective does with the ranks' buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CollectiveKind {
    AllReduce,
    AllGather,
    ReduceScatter,
}

impl CollectiveKind {
    /// Its name in the IR (`all_reduce`, `all_gather`, `reduce_scatter`).
    pub fn name(self) -> &'static str {
        match self {
            CollectiveKind::AllReduce => "all_reduce",
            CollectiveKind::AllGather => "all_gather",
            CollectiveKind::ReduceScatter => "reduce_scatter",
        }
    }
}

/// A collective of the trace, in issue order: what every rank must agree on.
#[derive(Clone, Debug, PartialEq)]
pub struct CollectiveInfo {
    pub kind: CollectiveKind,
    /// The bucket, prefixed `gather:` / `scatter:` for fsdp's collectives (metrics tell the
    /// kinds apart by it); shared with each step's records of it.
    pub label: std::sync::Arc<str>,
    pub op: ReduceOp,
    pub dtype: tracepass_ir::DType,
    pub numel: usize,
    pub group: String,
}

/// An argument of the trace and what it must be.
#[derive(Clone, Debug)]
pub struct ArgSpec {
    pub name: String,
    pub ty: Type,
    pub slot: Slot,
}

/// Why a trace cannot be compiled for execution. When nodes have no kernel, `missing` lists
/// every such op of the trace (`line` and `message` are then the first node's).
#[derive(Debug, Clone, PartialEq)]
pub struct PlanError {
    pub trace: String,
    pub line: String,
    pub message: String,
    pub missing: Vec<MissingKernel>,
}

/// An op of a trace whose nodes cannot be decoded to a kernel.
#[derive(Debug, Clone, PartialEq)]
pub struct MissingKernel {
    /// The op's canonical name.
    pub op: String,
    /// How many nodes of the trace call it.
    pub count: usize,
    /// The first such node as printed.
    pub first_line: String,
    /// Why the first one cannot run.
    pub message: String,
}

impl std::fmt::Display for PlanError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.missing.as_slice() {
            [] => write!(
                f,
                "trace `{}`: cannot run `{}`: {}",
                self.trace, self.line, self.message
            ),
            [one] if one.count == 1 => write!(
                f,
                "trace `{}`: cannot run `{}`: {}",
                self.trace, one.first_line, one.message
            ),
            all => {
                let nodes: usize = all.iter().map(|m| m.count).sum();
                write!(
                    f,
                    "trace `{}`: {} op{} without a kernel ({nodes} node{}):",
                    self.trace,
                    all.len(),
                    if all.len() == 1 { "" } else { "s" },
                    if nodes == 1 { "" } else { "s" },
                )?;
                for m in all {
                    write!(
                        f,
                        "\n  `{}` x{}, first `{}`: {}",
                        m.op, m.count, m.first_line, m.message
                    )?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for PlanError {}

/// The ops [`Plan::compile`] turns into instructions of their own (no kernel); the op table's
/// kernel registrations mark them [`crate::exec::kernel_ops::KernelEntry::Plan`].
pub const PLANNED_OPS: &[&str] = &[
    ops::UNPACK_SEQUENCE,
    ops::CLEAR_COLLECTION,
    ops::UPDATE_ALIASES,
    ops::BUCKET_PACK,
    ops::ALL_REDUCE,
    ops::ALL_GATHER,
    ops::REDUCE_SCATTER,
    ops::WAIT,
    ops::UNPACK,
    ops::FUSION,
    ITEM,
];

/// `Tensor.item`'s canonical name: a number from a tensor, which no kernel gives.
const ITEM: &str = "ltorch.item";

#[derive(Clone, Debug)]
pub struct Plan {
    pub trace_name: String,
    pub slots: usize,
    pub args: Vec<ArgSpec>,
    pub instrs: Vec<Instr>,
    /// Slots of the requested results, in request order (`None`: the trace returns `None` there).
    pub results: Vec<Option<Slot>>,
    pub collectives: Vec<CollectiveInfo>,
    /// Names of the slots (for messages and timelines).
    pub slot_names: Vec<String>,
    /// Every tensor's size, lifetime and arena offset (the buffer pool's size classes).
    pub memory: MemoryPlan,
}

fn reduce_op(a: Option<&Arg>) -> Result<ReduceOp, String> {
    match a {
        None => Ok(ReduceOp::Sum),
        Some(Arg::Str(s)) => ReduceOp::parse(s).ok_or_else(|| format!("unknown reduce op '{s}'")),
        Some(Arg::Opaque(o)) => o
            .member
            .as_deref()
            .and_then(ReduceOp::parse)
            .ok_or_else(|| format!("unknown reduce op {}", o.printed_name())),
        Some(other) => Err(format!("reduce op {other:?} is not understood")),
    }
}

impl Plan {
    /// Compiles `trace`; `results` are the values the caller wants back after a run.
    pub fn compile(trace: &Trace, results: &[Option<ValueId>]) -> Result<Plan, PlanError> {
        let bound = trace.value_bound();
        let mut slot_of: Vec<Option<Slot>> = vec![None; bound];
        let mut slot_names = Vec::new();
        let mut slot = |v: ValueId, slot_names: &mut Vec<String>| -> Slot {
            let i = v.0 as usize;
            if let Some(s) = slot_of.get(i).copied().flatten() {
                return s;
            }
            let s = slot_names.len();
            slot_names.push(trace.name(v));
            if i < slot_of.len() {
                slot_of[i] = Some(s);
            }
            s
        };
        let err = |line: &str, message: String| PlanError {
            trace: trace.name.clone(),
            line: line.to_string(),
            message,
            missing: Vec::new(),
        };
        // nodes without a kernel, by op in order of first appearance: all reported at once
        let mut missing: Vec<MissingKernel> = Vec::new();
        let args = trace
            .args()
            .iter()
            .map(|&v| ArgSpec {
                name: trace.name(v),
                ty: trace.ty(v).cloned().unwrap_or(Type::Any),
                slot: slot(v, &mut slot_names),
            })
            .collect();
        let mut instrs = Vec::with_capacity(trace.schedule().len());
        let mut collectives = Vec::new();
        // which bucket a buffer / future belongs to
        let mut bucket_label: Vec<Option<String>> = vec![None; bound];
        let mut bucket_of_future: Vec<Option<usize>> = vec![None; bound];
        for &idx in trace.schedule() {
            let Some(node) = trace.node(idx) else {
                continue;
            };
            let line = print_node_line(trace, idx);
            let values = |args: &[Arg]| {
                let mut v = Vec::new();
                args.iter()
                    .for_each(|a| a.for_each_value(&mut |x| v.push(x)));
                v
            };
            // fsdp pads a packed bucket before scattering it: the padded buffer is the bucket
            if node.op.as_str() == "prims.pad" {
                let src = node.args().first().and_then(Arg::as_value);
                if let (Some(src), Some(out)) = (src, node.outputs().first()) {
                    bucket_label[out.0 as usize] = bucket_label[src.0 as usize].clone();
                }
            }
            let (kind, inputs): (InstrKind, Vec<ValueId>) = match node.op.as_str() {
                ops::UNPACK_SEQUENCE => (
                    InstrKind::UnpackSequence,
                    values(&node.args()[..node.args().len().min(1)]),
                ),
                ops::CLEAR_COLLECTION => (InstrKind::Nop, values(node.args())),
                ITEM => (
                    InstrKind::Item,
                    values(&node.args()[..node.args().len().min(1)]),
                ),
                ops::UPDATE_ALIASES => {
                    let aliases = node
                        .args()
                        .first()
                        .and_then(Arg::as_seq)
                        .ok_or_else(|| err(&line, "update_aliases takes a tuple".into()))?;
                    let inputs = aliases
                        .iter()
                        .map(|a| {
                            a.as_value().ok_or_else(|| {
                                err(&line, format!("update_aliases of {a:?}, not a value"))
                            })
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    if inputs.len() != node.outputs().len() {
                        return Err(err(
                            &line,
                            format!(
                                "update_aliases of {} values names {} outputs",
                                inputs.len(),
                                node.outputs().len()
                            ),
                        ));
                    }
                    (InstrKind::Alias, inputs)
                }
                ops::BUCKET_PACK => {
                    let members =
                        node.args().first().and_then(Arg::as_seq).ok_or_else(|| {
                            err(&line, "bucket_pack takes a list of tensors".into())
                        })?;
                    let label = node
                        .kwarg("bucket")
                        .and_then(Arg::as_str)
                        .map(str::to_string)
                        .or_else(|| {
                            node.args()
                                .get(1)
                                .and_then(Arg::as_str)
                                .map(|_| format!("bucket{}", collectives.len()))
                        })
                        .unwrap_or_else(|| format!("bucket{}", collectives.len()));
                    if let Some(out) = node.outputs().first() {
                        bucket_label[out.0 as usize] = Some(label);
                    }
                    (
                        InstrKind::Pack {
                            divisors: Vec::new(),
                        },
                        values(members),
                    )
                }
                ops::ALL_REDUCE => {
                    let buf = node
                        .args()
                        .first()
                        .and_then(Arg::as_value)
                        .ok_or_else(|| err(&line, "all_reduce_async takes a tensor".into()))?;
                    let op = reduce_op(node.args().get(1)).map_err(|m| err(&line, m))?;
                    let tt = trace
                        .ty(buf)
                        .and_then(Type::as_tensor)
                        .ok_or_else(|| err(&line, "all_reduce_async takes a tensor".into()))?;
                    let group = match node.args().get(2) {
                        Some(Arg::Str(s)) => s.clone(),
                        Some(Arg::Opaque(o)) => o.printed_name(),
                        _ => "world".into(),
                    };
                    let label = bucket_label[buf.0 as usize]
                        .clone()
                        .unwrap_or_else(|| trace.name(buf));
                    let bucket = collectives.len();
                    collectives.push(CollectiveInfo {
                        kind: CollectiveKind::AllReduce,
                        label: label.into(),
                        op,
                        dtype: tt.dtype,
                        numel: tt.numel(),
                        group,
                    });
                    if let Some(f) = node.outputs().first() {
                        bucket_of_future[f.0 as usize] = Some(bucket);
                    }
                    (InstrKind::AllReduce { op, bucket }, vec![buf])
                }
                ops::ALL_GATHER | ops::REDUCE_SCATTER => {
                    let gather = node.op.as_str() == ops::ALL_GATHER;
                    let what = if gather {
                        "all_gather_async"
                    } else {
                        "reduce_scatter_async"
                    };
                    let buf = node
                        .args()
                        .first()
                        .and_then(Arg::as_value)
                        .ok_or_else(|| err(&line, format!("{what} takes a tensor")))?;
                    let tt = trace
                        .ty(buf)
                        .and_then(Type::as_tensor)
                        .ok_or_else(|| err(&line, format!("{what} takes a tensor")))?;
                    // all_gather_async(shard, group); reduce_scatter_async(buf, op, group)
                    let (op, group_at) = if gather {
                        (ReduceOp::Sum, 1)
                    } else {
                        (reduce_op(node.args().get(1)).map_err(|m| err(&line, m))?, 2)
                    };
                    let group = match node.args().get(group_at) {
                        Some(Arg::Str(s)) => s.clone(),
                        Some(Arg::Opaque(o)) => o.printed_name(),
                        _ => "world".into(),
                    };
                    let name = bucket_label[buf.0 as usize]
                        .clone()
                        .unwrap_or_else(|| trace.name(buf));
                    let name = name.strip_prefix("shard_").unwrap_or(&name);
                    let bucket = collectives.len();
                    collectives.push(CollectiveInfo {
                        kind: if gather {
                            CollectiveKind::AllGather
                        } else {
                            CollectiveKind::ReduceScatter
                        },
                        label: format!("{}:{name}", if gather { "gather" } else { "scatter" })
                            .into(),
                        op,
                        dtype: tt.dtype,
                        numel: tt.numel(),
                        group,
                    });
                    if let Some(f) = node.outputs().first() {
                        bucket_of_future[f.0 as usize] = Some(bucket);
                    }
                    let kind = if gather {
                        InstrKind::AllGather { bucket }
                    } else {
                        InstrKind::ReduceScatter { op, bucket }
                    };
                    (kind, vec![buf])
                }
                ops::WAIT => {
                    let f = node
                        .args()
                        .first()
                        .and_then(Arg::as_value)
                        .ok_or_else(|| err(&line, "wait takes a future".into()))?;
                    let bucket = bucket_of_future[f.0 as usize].ok_or_else(|| {
                        err(
                            &line,
                            format!("`{}` is not the future of a collective", trace.name(f)),
                        )
                    })?;
                    (InstrKind::Wait { bucket }, vec![f])
                }
                ops::UNPACK => {
                    let buf = node
                        .args()
                        .first()
                        .and_then(Arg::as_value)
                        .ok_or_else(|| err(&line, "unpack takes a buffer".into()))?;
                    let shapes: Vec<Vec<usize>> = node
                        .outputs()
                        .iter()
                        .map(|o| {
                            trace
                                .ty(*o)
                                .and_then(Type::as_tensor)
                                .map(|t| t.shape.to_vec())
                                .ok_or_else(|| {
                                    err(
                                        &line,
                                        format!("output `{}` is not a tensor", trace.name(*o)),
                                    )
                                })
                        })
                        .collect::<Result<_, _>>()?;
                    let offsets = match node.kwarg("offsets").and_then(Arg::as_int_list) {
                        Some(o) if o.len() == shapes.len() && o.iter().all(|x| *x >= 0) => {
                            o.into_iter().map(|x| x as usize).collect()
                        }
                        Some(_) => {
                            return Err(err(&line, "offsets do not match the outputs".into()))
                        }
                        None => shapes
                            .iter()
                            .scan(0usize, |acc, s| {
                                let o = *acc;
                                *acc += s.iter().product::<usize>();
                                Some(o)
                            })
                            .collect(),
                    };
                    (InstrKind::Unpack { offsets, shapes }, vec![buf])
                }
                ops::FUSION => {
                    let region = RegionProgram::compile(trace, node).map_err(|m| err(&line, m))?;
                    (
                        InstrKind::Region(std::sync::Arc::new(region)),
                        values(node.args()),
                    )
                }
                _ => match decode(trace, node) {
                    Ok(crate::exec::kernel::Decoded {
                        kernel,
                        inputs,
                        then: Some(then),
                    }) => {
                        // two instructions: the first into a slot of its own
                        let mid = slot_names.len();
                        let named = node.outputs().first().map(|&v| trace.name(v));
                        slot_names.push(format!("{}~", named.unwrap_or_default()));
                        instrs.push(Instr {
                            kind: InstrKind::Compute(kernel),
                            inputs: inputs
                                .into_iter()
                                .map(|v| slot(v, &mut slot_names))
                                .collect(),
                            outputs: vec![mid],
                            free: Vec::new(),
                            line: line.clone(),
                        });
                        instrs.push(Instr {
                            kind: InstrKind::Compute(then),
                            inputs: vec![mid],
                            outputs: node
                                .outputs()
                                .iter()
                                .map(|&v| slot(v, &mut slot_names))
                                .collect(),
                            free: Vec::new(),
                            line,
                        });
                        continue;
                    }
                    Ok(d) => (InstrKind::Compute(d.kernel), d.inputs),
                    Err(message) => {
                        let op = node.op.as_str();
                        match missing.iter_mut().find(|m| m.op == op) {
                            Some(m) => m.count += 1,
                            None => missing.push(MissingKernel {
                                op: op.to_string(),
                                count: 1,
                                first_line: line,
                                message,
                            }),
                        }
                        continue;
                    }
                },
            };
            instrs.push(Instr {
                kind,
                inputs: inputs
                    .into_iter()
                    .map(|v| slot(v, &mut slot_names))
                    .collect(),
                outputs: node
                    .outputs()
                    .iter()
                    .map(|&v| slot(v, &mut slot_names))
                    .collect(),
                free: Vec::new(),
                line,
            });
        }
        if let Some(first) = missing.first() {
            return Err(PlanError {
                trace: trace.name.clone(),
                line: first.first_line.clone(),
                message: first.message.clone(),
                missing,
            });
        }
        let results: Vec<Option<Slot>> = results
            .iter()
            .map(|r| r.map(|v| slot(v, &mut slot_names)))
            .collect();
        let slots = slot_names.len();
        fuse_divisions_into_packs(&mut instrs, &results, slots);
        // liveness: a slot dies after its last reader (or right after its producer if unread)
        let mut last: Vec<Option<usize>> = vec![None; slots];
        for (i, ins) in instrs.iter().enumerate() {
            for &o in &ins.outputs {
                last[o] = Some(i);
            }
            for &s in &ins.inputs {
                last[s] = Some(i);
            }
        }
        let mut keep = vec![false; slots];
        for r in results.iter().flatten() {
            keep[*r] = true;
        }
        for (s, l) in last.iter().enumerate() {
            if let (Some(i), false) = (l, keep[s]) {
                instrs[*i].free.push(s);
            }
        }
        let mut slot_types: Vec<Option<(tracepass_ir::DType, Vec<usize>)>> = vec![None; slots];
        for (v, s) in slot_of.iter().enumerate() {
            if let Some(s) = *s {
                slot_types[s] = trace
                    .ty(ValueId(v as u32))
                    .and_then(Type::as_tensor)
                    .map(|t| (t.dtype, t.shape.to_vec()));
            }
        }
        let mut plan = Plan {
            trace_name: trace.name.clone(),
            slots,
            args,
            instrs,
            results,
            collectives,
            slot_names,
            memory: MemoryPlan::default(),
        };
        plan.memory = MemoryPlan::new(&plan, &slot_types);
        Ok(plan)
    }
}

/// The DDP pass divides each gradient by the world size right before it is packed into its
/// bucket. Running that division as its own kernel writes a fresh tensor only for the pack to
/// copy it; instead the pack divides while it copies, so each gradient is read once. A
/// division is fused only when the pack is its only reader and its result is not returned; the
/// division instruction becomes a no-op. Bitwise the same: the pack divides by the same number
/// in the same compute type.
fn fuse_divisions_into_packs(instrs: &mut [Instr], results: &[Option<Slot>], slots: usize) {
    let mut readers = vec![0usize; slots];
    let mut producer: Vec<Option<usize>> = vec![None; slots];
    for (i, ins) in instrs.iter().enumerate() {
        for &s in &ins.inputs {
            readers[s] += 1;
        }
        for &o in &ins.outputs {
            producer[o] = Some(i);
        }
    }
    for r in results.iter().flatten() {
        readers[*r] += 1;
    }
    for p in 0..instrs.len() {
        if !matches!(instrs[p].kind, InstrKind::Pack { .. }) {
            continue;
        }
        let mut divisors = vec![None; instrs[p].inputs.len()];
        for (k, divisor) in divisors.iter_mut().enumerate() {
            let member = instrs[p].inputs[k];
            let Some(d) = producer[member] else { continue };
            let fusable = match &instrs[d].kind {
                InstrKind::Compute(Kernel::Binary {
                    op: BinaryOp::Div,
                    a: Side::Input(0),
                    b: Side::Scalar(by),
                    ..
                }) if instrs[d].inputs.len() == 1
                    && instrs[d].outputs.len() == 1
                    && readers[member] == 1
                    && d < p =>
                {
                    Some(*by)
                }
                _ => None,
            };
            if let Some(by) = fusable {
                let source = instrs[d].inputs[0];
                instrs[d].kind = InstrKind::Nop;
                instrs[d].inputs.clear();
                instrs[d].outputs.clear();
                instrs[p].inputs[k] = source;
                *divisor = Some(by);
            }
        }
        if divisors.iter().any(Option::is_some) {
            instrs[p].kind = InstrKind::Pack { divisors };
        }
    }
}
