//! Kernels: what a compute node asks a backend to do, decoded once from the trace.
//!
//! Decoding happens when a trace is compiled into a plan, so running a step does no string
//! matching. Every backend implements the same `Kernel` set.

use tracepass_ir::{Arg, DType, Node, Trace, ValueId};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnaryOp {
    Neg,
    Abs,
    Exp,
    Log,
    Log1p,
    Expm1,
    Sqrt,
    Rsqrt,
    Tanh,
    Sigmoid,
    Relu,
    Sin,
    Cos,
    Reciprocal,
    Sign,
    Erf,
    /// `gelu(x, approximate='none')`: x * Phi(x).
    Gelu,
    /// `gelu(x, approximate='tanh')`.
    GeluTanh,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Maximum,
    Minimum,
    Atan2,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Mean,
    Amax,
}

/// One operand of an elementwise kernel: an input of the call, or a literal.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Side {
    Input(usize),
    Scalar(f64),
}

#[derive(Clone, Debug, PartialEq)]
pub enum Kernel {
    Unary(UnaryOp),
    /// `a op (alpha * b)`; alpha is 1 except for `add`/`sub` with an `alpha` argument.
    Binary {
        op: BinaryOp,
        a: Side,
        b: Side,
        alpha: f64,
    },
    /// Same tensor (shallow copies, `contiguous`, bucket views).
    Identity,
    Reshape(Vec<usize>),
    Permute(Vec<usize>),
    Convert(DType),
    Matmul,
    /// `x @ w.T (+ b)`.
    Linear {
        bias: bool,
    },
    Reduce {
        op: ReduceOp,
        dims: Vec<usize>,
        keepdim: bool,
        dtype: DType,
    },
    Softmax {
        dim: usize,
        log: bool,
    },
    /// `torch.convolution`, not transposed; inputs `x, w[, bias]`.
    Convolution {
        stride: Vec<i64>,
        padding: Vec<i64>,
        dilation: Vec<i64>,
        groups: i64,
        bias: bool,
    },
    /// Two outputs: values and i64 indices (per (N, C) plane).
    MaxPool2d {
        kernel: Vec<i64>,
        stride: Vec<i64>,
        padding: Vec<i64>,
        dilation: Vec<i64>,
        ceil_mode: bool,
    },
    /// Inputs `grad, x, indices`.
    MaxPool2dBackward,
    /// Inputs `indices, weight`.
    Embedding,
    /// Inputs `grad, indices`.
    EmbeddingBackward {
        num_weights: usize,
        padding_idx: i64,
        scale_grad_by_freq: bool,
    },
    /// Two outputs: variance and mean.
    VarMean {
        dims: Option<Vec<i64>>,
        correction: f64,
        keepdim: bool,
    },
    /// Thunder's `prims.pad`: `(lo, hi, interior)` per dim.
    Pad {
        value: f64,
        config: Vec<(i64, i64, i64)>,
    },
    Slice {
        start: Vec<i64>,
        end: Vec<i64>,
        step: Vec<i64>,
    },
    /// One output per entry of `sizes`.
    Split {
        sizes: Vec<usize>,
        dim: i64,
    },
    /// Every input, in order.
    Cat {
        dim: i64,
    },
    Expand(Vec<i64>),
    Flip(Vec<i64>),
    Squeeze(Option<Vec<i64>>),
    Unsqueeze(i64),
    Arange {
        start: f64,
        end: f64,
        step: f64,
        dtype: DType,
    },
    Full {
        shape: Vec<usize>,
        value: f64,
        dtype: DType,
    },
    /// A bool tensor.
    Compare {
        op: CompareOp,
        a: Side,
        b: Side,
    },
    /// Input 0 is the bool condition.
    Where {
        a: Side,
        b: Side,
        dtype: DType,
    },
    Silu,
    /// `copy_(src, dst)` as a value: inputs `src, dst`.
    Copy,
    /// Needs a random stream keyed by (seed, rank, step, node), which the executor provides.
    Uniform {
        shape: Vec<usize>,
        minval: f64,
        maxval: f64,
        dtype: DType,
    },
}

/// A comparison; the result is a bool tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareOp {
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
}

impl Kernel {
    /// How many tensors the kernel gives (the node's outputs).
    pub fn outputs(&self) -> usize {
        match self {
            Kernel::MaxPool2d { .. } | Kernel::VarMean { .. } => 2,
            Kernel::Split { sizes, .. } => sizes.len(),
            _ => 1,
        }
    }

    /// Rough floating-point operation count (for metrics and the cost model).
    pub fn flops(&self, inputs: &[&[usize]], out: &[usize]) -> f64 {
        let numel = |s: &[usize]| s.iter().product::<usize>() as f64;
        match self {
            Kernel::Matmul | Kernel::Linear { .. } => {
                let k = inputs.first().and_then(|s| s.last()).copied().unwrap_or(1) as f64;
                2.0 * numel(out) * k
            }
            Kernel::Convolution { .. } => {
                // 2 * out elements * (C_in / groups) * kernel taps: the weight's numel / C_out
                let w = inputs.get(1).map_or(0.0, |s| numel(s));
                let cout = inputs.get(1).and_then(|s| s.first()).copied().unwrap_or(1) as f64;
                2.0 * numel(out) * w / cout.max(1.0)
            }
            Kernel::Identity
            | Kernel::Reshape(_)
            | Kernel::Permute(_)
            | Kernel::Expand(_)
            | Kernel::Squeeze(_)
            | Kernel::Unsqueeze(_)
            | Kernel::Slice { .. }
            | Kernel::Split { .. } => 0.0,
            Kernel::Reduce { .. } => inputs.first().map(|s| numel(s)).unwrap_or(0.0),
            _ => numel(out),
        }
    }
}

/// A compute node decoded: the kernel and the values it reads, in `Side::Input` order.
#[derive(Clone, Debug)]
pub struct Decoded {
    pub kernel: Kernel,
    pub inputs: Vec<ValueId>,
}

fn unary_op(name: &str) -> Option<UnaryOp> {
    use UnaryOp::*;
    Some(match name {
        "neg" => Neg,
        "abs" => Abs,
        "exp" => Exp,
        "log" => Log,
        "log1p" => Log1p,
        "expm1" => Expm1,
        "sqrt" => Sqrt,
        "rsqrt" => Rsqrt,
        "tanh" => Tanh,
        "sigmoid" => Sigmoid,
        "relu" => Relu,
        "sin" => Sin,
        "cos" => Cos,
        "reciprocal" => Reciprocal,
        "sign" => Sign,
        "erf" => Erf,
        _ => return None,
    })
}

fn binary_op(name: &str) -> Option<BinaryOp> {
    use BinaryOp::*;
    Some(match name {
        "add" => Add,
        "sub" => Sub,
        "mul" => Mul,
        "div" | "true_divide" => Div,
        "pow" => Pow,
        "maximum" => Maximum,
        "minimum" => Minimum,
        "atan2" => Atan2,
        _ => return None,
    })
}

/// Collects value operands in order, numbering them for `Side::Input`.
struct Operands<'a> {
    node: &'a Node,
    inputs: Vec<ValueId>,
}

impl<'a> Operands<'a> {
    fn side(&mut self, i: usize) -> Result<Side, String> {
        match self.node.args().get(i) {
            Some(Arg::Value(v)) => {
                self.inputs.push(*v);
                Ok(Side::Input(self.inputs.len() - 1))
            }
            Some(a) => a
                .as_f64()
                .map(Side::Scalar)
                .ok_or_else(|| format!("operand {i} is {a:?}, not a tensor or number")),
            None => Err(format!("operand {i} is missing")),
        }
    }
    fn tensor(&mut self, i: usize) -> Result<(), String> {
        match self.side(i)? {
            Side::Input(_) => Ok(()),
            Side::Scalar(_) => Err(format!("operand {i} must be a tensor")),
        }
    }
}

fn out_type(trace: &Trace, node: &Node) -> Result<tracepass_ir::TensorType, String> {
    let out = node
        .outputs()
        .first()
        .ok_or_else(|| "the node has no output".to_string())?;
    trace
        .ty(*out)
        .and_then(|t| t.as_tensor())
        .cloned()
        .ok_or_else(|| format!("output `{}` is not a tensor", trace.name(*out)))
}

fn in_rank(trace: &Trace, v: ValueId) -> Result<usize, String> {
    trace
        .ty(v)
        .and_then(|t| t.as_tensor())
        .map(|t| t.shape.len())
        .ok_or_else(|| format!("`{}` is not a tensor", trace.name(v)))
}

fn norm_dim(d: i64, rank: usize) -> Result<usize, String> {
    let r = rank.max(1) as i64;
    let n = if d < 0 { d + r } else { d };
    if n < 0 || n >= r {
        return Err(format!("dimension {d} is out of range for rank {rank}"));
    }
    Ok(n as usize)
}

/// Decodes a compute node. `Err` says why the node cannot run (the caller adds where).
pub fn decode(trace: &Trace, node: &Node) -> Result<Decoded, String> {
    let op = node.op.as_str();
    let base = crate::kernel_ops::canonical_base(op);
    let mut o = Operands {
        node,
        inputs: Vec::new(),
    };
    let kernel = if let Some(u) = unary_op(base) {
        o.tensor(0)?;
        Kernel::Unary(u)
    } else if base == "gelu" {
        o.tensor(0)?;
        match node
            .kwarg("approximate")
            .and_then(Arg::as_str)
            .or_else(|| node.args().get(1).and_then(Arg::as_str))
        {
            None | Some("none") => Kernel::Unary(UnaryOp::Gelu),
            Some("tanh") => Kernel::Unary(UnaryOp::GeluTanh),
            Some(other) => return Err(format!("gelu approximation '{other}' is not supported")),
        }
    } else if let Some(b) = binary_op(base) {
        if let Some(mode) = node.kwarg("rounding_mode") {
            if !matches!(mode, Arg::None) {
                return Err(format!("div with rounding_mode {mode:?} is not supported"));
            }
        }
        let a = o.side(0)?;
        let bs = o.side(1)?;
        if matches!((a, bs), (Side::Scalar(_), Side::Scalar(_))) {
            return Err("both operands are numbers; nothing to compute on a tensor".into());
        }
        let alpha = match node.kwarg("alpha").or_else(|| {
            if matches!(b, BinaryOp::Add | BinaryOp::Sub) {
                node.args().get(2)
            } else {
                None
            }
        }) {
            Some(a) => a
                .as_f64()
                .ok_or_else(|| format!("alpha must be a number, got {a:?}"))?,
            None => 1.0,
        };
        Kernel::Binary {
            op: b,
            a,
            b: bs,
            alpha,
        }
    } else {
        match base {
            "shallow_copy" | "contiguous" | "get_grad" | "update_bucket_view" => {
                o.tensor(0)?;
                Kernel::Identity
            }
            "reshape" | "view" => {
                o.tensor(0)?;
                Kernel::Reshape(out_type(trace, node)?.shape.to_vec())
            }
            "permute" | "transpose" if node.args().len() == 2 => {
                o.tensor(0)?;
                let rank = in_rank(trace, o.inputs[0])?;
                let perm = node
                    .args()
                    .get(1)
                    .and_then(Arg::as_int_list)
                    .ok_or("the permutation must be a tuple of ints")?;
                let perm = perm
                    .into_iter()
                    .map(|d| norm_dim(d, rank))
                    .collect::<Result<Vec<_>, _>>()?;
                Kernel::Permute(perm)
            }
            "transpose" => {
                o.tensor(0)?;
                let rank = in_rank(trace, o.inputs[0])?;
                let d = |i: usize| {
                    node.args()
                        .get(i)
                        .and_then(Arg::as_int)
                        .ok_or_else(|| format!("transpose needs dimension {i}"))
                        .and_then(|d| norm_dim(d, rank))
                };
                let (d0, d1) = (d(1)?, d(2)?);
                let mut perm: Vec<usize> = (0..rank).collect();
                perm.swap(d0, d1);
                Kernel::Permute(perm)
            }
            "to" | "convert_element_type" => {
                o.tensor(0)?;
                let out = out_type(trace, node)?;
                let input_device = trace
                    .ty(o.inputs[0])
                    .and_then(|t| t.as_tensor())
                    .map(|t| t.device);
                if input_device != Some(out.device) {
                    return Err(format!(
                        "moving a tensor to {} is not supported",
                        out.device
                    ));
                }
                Kernel::Convert(out.dtype)
            }
            "matmul" => {
                o.tensor(0)?;
                o.tensor(1)?;
                Kernel::Matmul
            }
            "linear" => {
                o.tensor(0)?;
                o.tensor(1)?;
                let bias = match node.args().get(2).or_else(|| node.kwarg("bias")) {
                    None | Some(Arg::None) => false,
                    Some(Arg::Value(v)) => {
                        o.inputs.push(*v);
                        true
                    }
                    Some(other) => {
                        return Err(format!("bias must be a tensor or None, got {other:?}"))
                    }
                };
                Kernel::Linear { bias }
            }
            "sum" | "mean" | "amax" => {
                o.tensor(0)?;
                let rank = in_rank(trace, o.inputs[0])?;
                let dims = match node.args().get(1).or_else(|| node.kwarg("dim")) {
                    None | Some(Arg::None) => (0..rank).collect(),
                    Some(a) => {
                        let list = a
                            .as_int_list()
                            .ok_or_else(|| format!("dims must be ints, got {a:?}"))?;
                        let mut dims = list
                            .into_iter()
                            .map(|d| norm_dim(d, rank))
                            .collect::<Result<Vec<_>, _>>()?;
                        dims.sort_unstable();
                        dims.dedup();
                        dims
                    }
                };
                let keepdim = node
                    .args()
                    .get(2)
                    .or_else(|| node.kwarg("keepdim"))
                    .and_then(|a| match a {
                        Arg::Bool(b) => Some(*b),
                        _ => None,
                    })
                    .unwrap_or(false);
                let op = match base {
                    "sum" => ReduceOp::Sum,
                    "mean" => ReduceOp::Mean,
                    _ => ReduceOp::Amax,
                };
                Kernel::Reduce {
                    op,
                    dims,
                    keepdim,
                    dtype: out_type(trace, node)?.dtype,
                }
            }
            "softmax" | "log_softmax" => {
                o.tensor(0)?;
                let rank = in_rank(trace, o.inputs[0])?;
                let dim = node
                    .args()
                    .get(1)
                    .or_else(|| node.kwarg("dim"))
                    .and_then(Arg::as_int)
                    .ok_or("softmax needs a dim")?;
                Kernel::Softmax {
                    dim: norm_dim(dim, rank)?,
                    log: base == "log_softmax",
                }
            }
            _ => match crate::kernel_ops::decode_op(trace, node)? {
                Some(d) => return Ok(d),
                None => return Err(format!("no kernel for op `{op}`")),
            },
        }
    };
    Ok(Decoded {
        kernel,
        inputs: o.inputs,
    })
}
