//! Fusion regions (`tracepass.fusion`, made by `fuse-elementwise`) compiled for execution.
//!
//! A region's body ([`tracepass_ir::region_body`]) is decoded once, node by node, into the
//! kernels the unfused ops would run ([`RegionProgram::steps`]): any backend can run those one
//! after the other ([`RegionProgram::run_steps`], the [`Backend::run_region`] default), with the
//! same results as the unfused trace. When every value of the body is an f32 tensor (or a
//! number) and every step is elementwise arithmetic, math or a broadcast, the region is also
//! compiled to a [`FusedLoop`]: one loop over the output's elements in which each input is read
//! through strides over the output's index (0 where it is broadcast) and every step is a lane
//! operation, so no tensor is made for the values in between. The CPU runs it in chunks
//! (`cpu::region`), CUDA as one generated kernel (`cuda::region`).

use crate::exec::backend::{Backend, Input, KernelError};
use crate::exec::kernel::{BinaryOp, Kernel, Side, UnaryOp};
use crate::exec::kernel_ops::decode;
use tracepass_ir::{region_body, DType, Node, Trace, Type, ValueId};

/// Where a step reads an operand.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Src {
    /// The region's operand `i`.
    Input(usize),
    /// The result of step `k`.
    Step(usize),
}

/// One node of the body: its kernel (and the second kernel some nodes decode to), reading
/// `inputs` as the kernel's `Side::Input`s.
#[derive(Clone, Debug)]
pub struct Step {
    pub kernel: Kernel,
    pub then: Option<Kernel>,
    pub inputs: Vec<Src>,
}

/// One operation of a [`FusedLoop`], over a lane of elements; operands are earlier lanes.
#[derive(Clone, Debug, PartialEq)]
pub enum LaneOp {
    /// The region's operand `input` at the element whose index over the output is `i`:
    /// position `sum(i[d] * strides[d])` of its row-major elements (a number: itself).
    Load {
        input: usize,
        strides: Vec<usize>,
    },
    /// A literal.
    Const(f64),
    Unary(UnaryOp, usize),
    /// `a op (alpha * b)`.
    Binary {
        op: BinaryOp,
        a: usize,
        b: usize,
        alpha: f64,
    },
    /// `a ** e` for a literal exponent (the special cases the `pow` kernel makes).
    PowScalar(usize, f64),
}

/// A region as one loop over its output: `ops` in order, the last one the result.
#[derive(Clone, Debug, PartialEq)]
pub struct FusedLoop {
    /// The output's shape.
    pub shape: Vec<usize>,
    /// The loop's index space: `shape` with its dims of size one dropped and each run of
    /// dims that every load reads as one merged into one dim (a per-channel vector over
    /// `[N, C, H, W]` reads `[N, C, H * W]` with strides `[0, 1, 0]`), so that a backend walks
    /// long runs. The same elements in the same row-major order as `shape`.
    pub dims: Vec<usize>,
    /// The loads' strides are over `dims`.
    pub ops: Vec<LaneOp>,
    /// Per op, where a reader finds its value ([`FusedLoop::new`] derives it from `ops`).
    pub reads: Vec<LaneRead>,
}

/// Where the ops of a [`FusedLoop`] read an earlier op's value: a lane of its own, or (for a
/// literal, and a load that reads its operand's elements in loop order) the value itself,
/// which a backend may read in place instead of copying it into a lane first.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LaneRead {
    /// The op's lane.
    Lane,
    /// The literal.
    Const(f64),
    /// Operand `input` of the region, element `i` at loop position `i` (or a number).
    InOrder(usize),
}

impl FusedLoop {
    /// The loop of `ops` over `shape` (the loads' strides over `shape`).
    pub fn new(shape: Vec<usize>, mut ops: Vec<LaneOp>) -> FusedLoop {
        let dims = merge_dims(&shape, &mut ops);
        let reads = ops
            .iter()
            .map(|op| match op {
                LaneOp::Const(x) => LaneRead::Const(*x),
                LaneOp::Load { input, strides } if in_loop_order(&dims, strides) => {
                    LaneRead::InOrder(*input)
                }
                _ => LaneRead::Lane,
            })
            .collect();
        FusedLoop {
            shape,
            dims,
            ops,
            reads,
        }
    }

    /// How many elements the loop computes.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A region compiled for execution.
#[derive(Clone, Debug)]
pub struct RegionProgram {
    /// How many operands the region takes.
    pub inputs: usize,
    /// The body's kernels; the last step's result is the region's.
    pub steps: Vec<Step>,
    /// The body as one loop, when it is one (f32 elementwise and broadcasts only).
    pub fused: Option<FusedLoop>,
}

impl RegionProgram {
    /// Compiles the region `node` of `trace`: an error names what in the body cannot run.
    pub fn compile(trace: &Trace, node: &Node) -> Result<RegionProgram, String> {
        let body = region_body(trace, node).map_err(|e| e.to_string())?;
        let mut src_of: Vec<Option<Src>> = vec![None; body.value_bound()];
        for (i, a) in body.args().iter().enumerate() {
            src_of[a.0 as usize] = Some(Src::Input(i));
        }
        let mut steps = Vec::new();
        let mut nodes = Vec::new();
        for (_, n) in body.nodes() {
            let d = decode(&body, n).map_err(|m| format!("in its body, `{}`: {m}", n.op))?;
            let inputs = d
                .inputs
                .iter()
                .map(|v| {
                    src_of[v.0 as usize]
                        .ok_or_else(|| format!("`{}` is read before it is defined", body.name(*v)))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let [out] = n.outputs() else {
                return Err(format!(
                    "`{}` in a region defines more than one value",
                    n.op
                ));
            };
            src_of[out.0 as usize] = Some(Src::Step(steps.len()));
            steps.push(Step {
                kernel: d.kernel,
                then: d.then,
                inputs,
            });
            nodes.push((d.inputs, *out));
        }
        if steps.is_empty() {
            return Err("the region's body is empty".into());
        }
        let fused = fused_loop(&body, &steps, &nodes);
        Ok(RegionProgram {
            inputs: body.args().len(),
            steps,
            fused,
        })
    }

    /// Runs the body's kernels one after the other on `backend`: what the unfused trace runs.
    pub fn run_steps<B: Backend + ?Sized>(
        &self,
        backend: &B,
        inputs: &[Input<'_, B::Tensor>],
    ) -> Result<B::Tensor, KernelError> {
        // on the stack for the regions fusion makes (a few steps, a few operands each)
        let mut results: smallvec::SmallVec<[B::Tensor; 8]> =
            smallvec::SmallVec::with_capacity(self.steps.len());
        for s in &self.steps {
            let out = {
                let args: smallvec::SmallVec<[Input<'_, B::Tensor>; 8]> = s
                    .inputs
                    .iter()
                    .map(|src| match *src {
                        Src::Input(i) => inputs
                            .get(i)
                            .map(|a| match a {
                                Input::Tensor(t) => Input::Tensor(*t),
                                Input::Scalar(x) => Input::Scalar(*x),
                            })
                            .ok_or_else(|| KernelError(format!("region operand {i} is missing"))),
                        Src::Step(k) => Ok(Input::Tensor(&results[k])),
                    })
                    .collect::<Result<_, _>>()?;
                let first = backend.run(&s.kernel, &args)?;
                match &s.then {
                    Some(then) => backend.run(then, &[Input::Tensor(&first)])?,
                    None => first,
                }
            };
            results.push(out);
        }
        results
            .pop()
            .ok_or_else(|| KernelError("the region's body is empty".into()))
    }
}

/// Whether a value is an f32 tensor or a number (what a fused loop computes with).
fn lane_type(t: Option<&Type>) -> bool {
    match t {
        Some(Type::Tensor(tt)) => tt.dtype == DType::F32,
        Some(Type::Int(_) | Type::Float(_)) => true,
        _ => false,
    }
}

fn shape_of(body: &Trace, v: ValueId) -> Vec<usize> {
    body.ty(v)
        .and_then(Type::as_tensor)
        .map(|t| t.shape.to_vec())
        .unwrap_or_default()
}

/// The body as one loop, or `None` when a step is not a lane operation.
fn fused_loop(
    body: &Trace,
    steps: &[Step],
    nodes: &[(Vec<ValueId>, ValueId)],
) -> Option<FusedLoop> {
    if steps.iter().any(|s| s.then.is_some()) {
        return None;
    }
    for (ins, out) in nodes {
        if !lane_type(body.ty(*out)) || ins.iter().any(|v| !lane_type(body.ty(*v))) {
            return None;
        }
    }
    let root = nodes.last()?.1;
    let shape = shape_of(body, root);
    // each value's dimensions as dimensions of the loop (None: broadcast), from the root down
    let mut dims: Vec<Option<Vec<Option<usize>>>> = vec![None; body.value_bound()];
    dims[root.0 as usize] = Some((0..shape.len()).map(Some).collect());
    let mut reads: Vec<Vec<(ValueId, Vec<Option<usize>>)>> = vec![Vec::new(); steps.len()];
    for (k, (s, (ins, out))) in steps.iter().zip(nodes).enumerate().rev() {
        let out_dims = dims[out.0 as usize].clone()?;
        let out_shape = shape_of(body, *out);
        for v in ins {
            let in_shape = shape_of(body, *v);
            let d = match s.kernel {
                Kernel::Unsqueeze(dim) => {
                    let at = if dim < 0 {
                        dim + out_shape.len() as i64
                    } else {
                        dim
                    };
                    let at = usize::try_from(at).ok()?;
                    (0..in_shape.len())
                        .map(|i| out_dims[if i < at { i } else { i + 1 }])
                        .collect()
                }
                Kernel::Unary(_) | Kernel::Binary { .. } | Kernel::Expand(_) | Kernel::Identity => {
                    let lead = out_shape.len().checked_sub(in_shape.len())?;
                    (0..in_shape.len())
                        .map(|i| {
                            if in_shape[i] == 1 {
                                None
                            } else {
                                out_dims[i + lead]
                            }
                        })
                        .collect::<Vec<_>>()
                }
                _ => return None,
            };
            match &dims[v.0 as usize] {
                // a value read twice (`x * x`) is read the same way, or not fused
                Some(prev) if *prev != d && body.args().iter().all(|a| a != v) => return None,
                _ => {}
            }
            if body.args().iter().all(|a| a != v) {
                dims[v.0 as usize] = Some(d.clone());
            }
            reads[k].push((*v, d));
        }
    }
    // lanes, in body order
    let mut ops: Vec<LaneOp> = Vec::new();
    let mut lane_of: Vec<Option<usize>> = vec![None; body.value_bound()];
    let arg_index = |v: ValueId| body.args().iter().position(|a| *a == v);
    let loop_rank = shape.len();
    for (k, (s, (_, out))) in steps.iter().zip(nodes).enumerate() {
        let mut operand = |i: usize, ops: &mut Vec<LaneOp>| -> Option<usize> {
            let (v, d) = reads[k].get(i)?;
            if let Some(input) = arg_index(*v) {
                let shape = shape_of(body, *v);
                let mut strides = vec![0usize; loop_rank];
                let mut step = 1usize;
                for (j, &size) in shape.iter().enumerate().rev() {
                    if let Some(Some(loop_dim)) = d.get(j) {
                        strides[*loop_dim] += step;
                    }
                    step *= size;
                }
                let load = LaneOp::Load { input, strides };
                Some(match ops.iter().position(|o| *o == load) {
                    Some(p) => p,
                    None => {
                        ops.push(load);
                        ops.len() - 1
                    }
                })
            } else {
                lane_of[v.0 as usize]
            }
        };
        let side = |side: Side,
                    ops: &mut Vec<LaneOp>,
                    operand: &mut dyn FnMut(usize, &mut Vec<LaneOp>) -> Option<usize>|
         -> Option<usize> {
            match side {
                Side::Input(i) => operand(i, ops),
                Side::Scalar(x) => {
                    ops.push(LaneOp::Const(x));
                    Some(ops.len() - 1)
                }
            }
        };
        let lane = match s.kernel {
            Kernel::Unary(u) => {
                let a = operand(0, &mut ops)?;
                ops.push(LaneOp::Unary(u, a));
                ops.len() - 1
            }
            Kernel::Binary {
                op: BinaryOp::Pow,
                a,
                b: Side::Scalar(e),
                ..
            } => {
                let a = side(a, &mut ops, &mut operand)?;
                ops.push(LaneOp::PowScalar(a, e));
                ops.len() - 1
            }
            // a number exponent that is a value: the kernel's special cases depend on it
            Kernel::Binary {
                op: BinaryOp::Pow,
                b: Side::Input(i),
                ..
            } if !matches!(
                reads[k].get(i).and_then(|(v, _)| body.ty(*v)),
                Some(Type::Tensor(_))
            ) =>
            {
                return None
            }
            Kernel::Binary { op, a, b, alpha } => {
                let a = side(a, &mut ops, &mut operand)?;
                let b = side(b, &mut ops, &mut operand)?;
                ops.push(LaneOp::Binary { op, a, b, alpha });
                ops.len() - 1
            }
            Kernel::Expand(_) | Kernel::Unsqueeze(_) | Kernel::Identity => operand(0, &mut ops)?,
            _ => return None,
        };
        lane_of[out.0 as usize] = Some(lane);
    }
    // the result must be a computed lane of the output's shape (not a bare load of an input)
    let last = lane_of[root.0 as usize]?;
    if last + 1 != ops.len() || matches!(ops[last], LaneOp::Load { .. } | LaneOp::Const(_)) {
        return None;
    }
    Some(FusedLoop::new(shape, ops))
}

/// The index space [`FusedLoop::dims`] of a loop over `shape`, rewriting the loads' strides to
/// it: dims of size one dropped, and a dim merged into the next inner one when every load
/// steps over it as over the whole inner one (its stride is the inner's times the inner's
/// size; both zero included). At least one dim is left.
fn merge_dims(shape: &[usize], ops: &mut [LaneOp]) -> Vec<usize> {
    // each load's strides, in op order (a load of a number has none: stride 0 everywhere)
    let mut loads: Vec<&mut Vec<usize>> = ops
        .iter_mut()
        .filter_map(|op| match op {
            LaneOp::Load { strides, .. } => Some(strides),
            _ => None,
        })
        .collect();
    // built from the innermost dim out: (size, each load's stride)
    let mut merged: Vec<(usize, Vec<usize>)> = Vec::new();
    for (d, &n) in shape.iter().enumerate().rev() {
        if n == 1 {
            continue;
        }
        let strides: Vec<usize> = loads
            .iter()
            .map(|s| s.get(d).copied().unwrap_or(0))
            .collect();
        match merged.last_mut() {
            Some((size, inner))
                if n != 0
                    && *size != 0
                    && strides.iter().zip(&*inner).all(|(&s, &i)| s == i * *size) =>
            {
                *size *= n;
            }
            _ => merged.push((n, strides)),
        }
    }
    if merged.is_empty() {
        merged.push((1, vec![0; loads.len()]));
    }
    merged.reverse();
    for (j, strides) in loads.iter_mut().enumerate() {
        **strides = merged.iter().map(|(_, s)| s[j]).collect();
    }
    merged.into_iter().map(|(n, _)| n).collect()
}

/// Whether `strides` over `shape` address the elements in row-major loop order (dims of size
/// one excepted).
fn in_loop_order(shape: &[usize], strides: &[usize]) -> bool {
    let mut step = 1usize;
    for (&n, &s) in shape.iter().zip(strides).rev() {
        if n != 1 && s != step {
            return false;
        }
        step *= n;
    }
    strides.len() == shape.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(input: usize, strides: &[usize]) -> LaneOp {
        LaneOp::Load {
            input,
            strides: strides.to_vec(),
        }
    }

    fn strides(f: &FusedLoop, k: usize) -> &[usize] {
        match &f.ops[k] {
            LaneOp::Load { strides, .. } => strides,
            other => panic!("op {k} is {other:?}"),
        }
    }

    /// The loop of `a + b` over `shape`, the operands read with these strides.
    fn sum(shape: &[usize], a: &[usize], b: &[usize]) -> FusedLoop {
        let add = LaneOp::Binary {
            op: BinaryOp::Add,
            a: 0,
            b: 1,
            alpha: 1.0,
        };
        FusedLoop::new(shape.to_vec(), vec![load(0, a), load(1, b), add])
    }

    #[test]
    fn dims_every_load_reads_as_one_are_merged() {
        // a BatchNorm-style per-channel vector over NCHW: H and W merge, N and C do not
        let f = sum(&[8, 64, 16, 16], &[16384, 256, 16, 1], &[0, 1, 0, 0]);
        assert_eq!(f.dims, [8, 64, 256]);
        assert_eq!(strides(&f, 0), [16384, 256, 1]);
        assert_eq!(strides(&f, 1), [0, 1, 0]);
        assert_eq!(f.shape, [8, 64, 16, 16]);
        assert_eq!(f.reads[0], LaneRead::InOrder(0));
        // a bias over [B, T, C] merges B and T; dims of size one go
        let f = sum(&[4, 1, 128, 384], &[49152, 49152, 384, 1], &[0, 0, 0, 1]);
        assert_eq!(f.dims, [512, 384]);
        assert_eq!(strides(&f, 1), [0, 1]);
        // a transposed read merges nothing
        let f = sum(&[2, 3], &[3, 1], &[1, 2]);
        assert_eq!(f.dims, [2, 3]);
        assert_eq!(strides(&f, 1), [1, 2]);
        // one element: one dim of one
        let f = sum(&[1, 1], &[1, 1], &[0, 0]);
        assert_eq!((f.dims.as_slice(), strides(&f, 1)), (&[1][..], &[0][..]));
        assert_eq!(f.numel(), 1);
    }
}
