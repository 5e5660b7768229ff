//! Kernels: what a compute node asks a backend to do, decoded once from the trace.
//!
//! Decoding happens when a trace is compiled into a plan, so running a step does no string
//! matching; which decoder an op has is registered per canonical op name in
//! [`crate::exec::kernel_ops::KERNELS`]. Every backend implements the same `Kernel` set.

use tracepass_ir::{DType, ValueId};

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
    Exp2,
    Log2,
    Log10,
    Tan,
    Asin,
    Acos,
    Atan,
    Sinh,
    Cosh,
    Asinh,
    Acosh,
    Atanh,
    Floor,
    Ceil,
    /// Half to even, as `torch.round`.
    Round,
    Trunc,
    Erfc,
    /// `min(max(x, 0), 6)`.
    Relu6,
    /// `x * relu6(x + 3) / 6`.
    Hardswish,
    /// `relu6(x + 3) / 6`.
    Hardsigmoid,
    /// `log(1 + exp(x))`, linear above 20 (PyTorch's default threshold, beta 1).
    Softplus,
    /// `x * tanh(softplus(x))`.
    Mish,
    /// `log(sigmoid(x))`, computed without overflow.
    Logsigmoid,
    /// `x / (1 + |x|)`.
    Softsign,
    /// `x - tanh(x)`.
    Tanhshrink,
    /// `scale * (max(0, x) + min(0, alpha * (exp(x) - 1)))`, PyTorch's constants.
    Selu,
    /// `ln |Gamma(x)|`.
    Lgamma,
    /// `psi(x)`, the derivative of lgamma.
    Digamma,
    /// `polygamma(1, x)`, the derivative of digamma.
    Trigamma,
    Erfinv,
    Erfcinv,
    /// The inverse of the standard normal CDF (`torch.special.ndtri`).
    Ndtri,
}

/// An activation with parameters, as PyTorch's functional form computes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    /// `leaky_relu(x, negative_slope)`: `x > 0 ? x : x * slope`.
    LeakyRelu { slope: f64 },
    /// `elu(x, alpha)`: `x > 0 ? x : alpha * (exp(x) - 1)`.
    Elu { alpha: f64 },
    /// `celu(x, alpha)`: `x > 0 ? x : alpha * (exp(x / alpha) - 1)`; alpha is not 0.
    Celu { alpha: f64 },
    /// `hardtanh(x, min_val, max_val)`: `x` clamped to `[min, max]` (NaN stays NaN);
    /// `min <= max`.
    Hardtanh { min: f64, max: f64 },
}

impl Activation {
    /// The two parameters the kernels take: `[slope, 0]`, `[alpha, 0]`, `[alpha, 1 / alpha]`
    /// (PyTorch's celu is elu with input scale `1 / alpha`), `[min, max]`.
    pub fn params(self) -> [f64; 2] {
        match self {
            Activation::LeakyRelu { slope } => [slope, 0.0],
            Activation::Elu { alpha } => [alpha, 0.0],
            Activation::Celu { alpha } => [alpha, 1.0 / alpha],
            Activation::Hardtanh { min, max } => [min, max],
        }
    }
    /// The kernel name's stem.
    pub fn name(self) -> &'static str {
        match self {
            Activation::LeakyRelu { .. } => "leaky_relu",
            Activation::Elu { .. } => "elu",
            Activation::Celu { .. } => "celu",
            Activation::Hardtanh { .. } => "hardtanh",
        }
    }
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
    /// `floor_divide`: the quotient rounded toward negative infinity (PyTorch's `div_floor`).
    FloorDivide,
    /// `remainder`: `a - floor_divide(a, b) * b`, the sign of `b` (Python's `%`).
    Remainder,
    /// `fmod`: C's `fmod`, the sign of `a`.
    Fmod,
    /// `nextafter(a, b)`: the next float after `a` toward `b`, in the operands' dtype.
    Nextafter,
    /// `special.zeta(x, q)`: the Hurwitz zeta function, sum over k >= 0 of (k + q)^-x.
    Zeta,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Mean,
    /// NaN wins, as in `torch.amax`.
    Amax,
    /// NaN wins, as in `torch.amin`.
    Amin,
    /// `torch.prod`: the product, 1 over no elements.
    Prod,
}

/// `and`, `or` and `xor`, bitwise or logical.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BitOp {
    And,
    Or,
    Xor,
}

impl BitOp {
    /// PyTorch's spelling (`bitwise_and`'s `and`).
    pub fn name(self) -> &'static str {
        match self {
            BitOp::And => "and",
            BitOp::Or => "or",
            BitOp::Xor => "xor",
        }
    }
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
    /// A float tensor's activation with parameters; the result has the input's dtype.
    Activation(Activation),
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
    /// `torch._grouped_mm(a, b, offsets)`: inputs `a, b` and, when `offsets`, the int32
    /// cumulative group ends (`exec/grouped_mm.rs`).
    GroupedMm {
        offsets: bool,
    },
    /// `logsumexp(a, dims, keepdim)` into the float `dtype` (`exec/logsumexp.rs`: PyTorch's
    /// composition of amax, exp, sum and log).
    Logsumexp {
        dims: Vec<usize>,
        keepdim: bool,
        dtype: DType,
    },
    /// `torch.convolution`, not transposed; inputs `x, w[, bias]`.
    Convolution {
        stride: Vec<i64>,
        padding: Vec<i64>,
        dilation: Vec<i64>,
        groups: i64,
        bias: bool,
    },
    /// `conv_transpose*d` / `torch.convolution(transposed=True)`; inputs `x, w[, bias]`, `w`
    /// as `[C_in, C_out / groups, *kernel]`. Backends run it from their own kernels
    /// (`exec/conv_transpose.rs`).
    ConvTranspose {
        stride: Vec<i64>,
        padding: Vec<i64>,
        output_padding: Vec<i64>,
        dilation: Vec<i64>,
        groups: i64,
        bias: bool,
    },
    /// Thunder's `conv_transpose*d_vjp`: inputs `x, w, g` (the output's gradient); gives the
    /// gradients `outputs` names, in the order input, weight, bias (`exec/conv_transpose.rs`).
    ConvTransposeVjp {
        stride: Vec<i64>,
        padding: Vec<i64>,
        output_padding: Vec<i64>,
        dilation: Vec<i64>,
        groups: i64,
        outputs: VjpOutputs,
    },
    /// `triu` (`upper`) or `tril`: elements off the triangle set to `fill`
    /// (`exec/composite.rs`, as are the three below).
    Triangle {
        upper: bool,
        diagonal: i64,
        fill: f64,
    },
    /// `one_hot` of i64 indices into `classes` classes.
    OneHot {
        classes: usize,
    },
    /// `pixel_shuffle` by `factor`, or `pixel_unshuffle` (`inverse`).
    PixelShuffle {
        factor: usize,
        inverse: bool,
    },
    /// Thunder's `prims.div` of integers: the quotient rounded toward zero, as C divides
    /// (`exec/composite.rs`: `floor_divide(a - fmod(a, b), b)`, exact).
    TruncDivide {
        a: Side,
        b: Side,
    },
    /// `roll` by `shifts` along `dims`, or the flattened tensor by one shift (`None`).
    Roll {
        shifts: Vec<i64>,
        dims: Option<Vec<usize>>,
    },
    /// `adaptive_avg_pool1d` of `[*, C, L]` to `out` (`exec/composite.rs`: the 2-d pooling
    /// of one row).
    AdaptiveAvgPool1d {
        out: usize,
    },
    /// Its gradient: inputs `grad, a` (`a` gives the shape).
    AdaptiveAvgPool1dBackward,
    /// `channel_shuffle(x, groups)` of `[N, C, *]`: `[N, groups, C / groups, *]` with its
    /// dimensions 1 and 2 swapped; with `inverse`, the shuffle back (`exec/composite.rs`).
    ChannelShuffle {
        groups: usize,
        inverse: bool,
    },
    /// The gradient of `clamp_min(x, bound)` (`upper`: `clamp_max`): inputs `grad, x`;
    /// `grad` where `x >= bound` (`x <= bound`), else 0, as PyTorch's derivative formula.
    ClampBoundBackward {
        bound: f64,
        upper: bool,
    },
    /// `cosine_similarity(x1, x2, dim, eps)`, `dim` of the broadcast shape
    /// (`exec/cosine_similarity.rs`).
    CosineSimilarity {
        dim: usize,
        eps: f64,
    },
    /// Thunder's `cosine_similarity_vjp`: inputs `x1, x2, g`; the gradients `outputs` names
    /// (x1's, x2's), in that order.
    CosineSimilarityVjp {
        dim: usize,
        eps: f64,
        outputs: [bool; 2],
    },
    /// `F.unfold` (im2col): `[N, C, H, W]` to `[N, C * kh * kw, L]` (`exec/im2col.rs`).
    Im2Col(Window2d),
    /// `F.fold` (col2im) to an `output` plane: the columns summed back into place.
    Col2Im {
        output: [usize; 2],
        window: Window2d,
    },
    /// A pointwise loss of `input` and `target` (one shape), times the optional `weight` (and,
    /// for `binary_cross_entropy_with_logits`, `pos_weight`), broadcast to it, then reduced;
    /// inputs `input, target[, weight][, pos_weight]` (`exec/pointwise_loss.rs`).
    PointwiseLoss {
        kind: PointwiseLossKind,
        reduction: LossReduction,
        weight: bool,
        pos_weight: bool,
    },
    /// Thunder's `*_vjp` of a [`Kernel::PointwiseLoss`]: its inputs, then the output's
    /// gradient; the gradients `outputs` names (input's, target's), in that order.
    PointwiseLossVjp {
        kind: PointwiseLossKind,
        reduction: LossReduction,
        weight: bool,
        pos_weight: bool,
        outputs: [bool; 2],
    },
    /// `torch.logaddexp(a, b)` or `torch.hypot(a, b)`, broadcast (`exec/binary_fallback.rs`).
    BinaryFallback(BinaryFallbackOp),
    /// Thunder's `logaddexp_vjp`/`hypot_vjp`: inputs `a, b, g`; the gradients `outputs` names
    /// (a's, b's), each summed back to its operand's shape.
    BinaryFallbackVjp {
        op: BinaryFallbackOp,
        outputs: [bool; 2],
    },
    /// `adaptive_max_pool1d/2d` of the last `out.len()` dimensions to `out`, the maxima only
    /// (`exec/adaptive_max_pool.rs`).
    AdaptiveMaxPool {
        out: Vec<usize>,
    },
    /// Its gradient: inputs `grad, a`, the last `dims` dimensions of `a` pooled.
    AdaptiveMaxPoolBackward {
        dims: usize,
    },
    /// `bilinear(input1, input2, weight[, bias])`: inputs in that order
    /// (`exec/bilinear.rs`).
    Bilinear {
        bias: bool,
    },
    /// Thunder's `bilinear_vjp`: inputs `input1, input2, weight, g`; gives the gradients
    /// `outputs` names, in the order input1, input2, weight, bias.
    BilinearVjp {
        outputs: [bool; 4],
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
    /// `var` (or `std`, its square root when `std`): one output, computed as `VarMean`'s
    /// variance.
    Var {
        dims: Option<Vec<i64>>,
        correction: f64,
        keepdim: bool,
        std: bool,
    },
    /// `cumsum(a, dim, dtype=)`: `a` cast to `dtype`, then summed along `dim`.
    Cumsum {
        dim: usize,
        dtype: DType,
    },
    /// `argmax` (`max`) or `argmin`: i64 indices along `dim`, or into the flattened tensor.
    ArgExtremum {
        max: bool,
        dim: Option<usize>,
        keepdim: bool,
    },
    /// `bitwise_and/or/xor(a, b)` into the integer or bool `dtype` or, when `logical`,
    /// `logical_and/or/xor` (a bool tensor of the operands' truthiness).
    Bitwise {
        op: BitOp,
        a: Side,
        b: Side,
        logical: bool,
        dtype: DType,
    },
    /// `bitwise_not(a)` of an integer or bool tensor.
    BitwiseNot,
    /// `bitwise_left_shift` (`left`) or `bitwise_right_shift(a, b)` of integers, into the
    /// promoted integer `dtype`, whose width bounds the shift count.
    Shift {
        left: bool,
        a: Side,
        b: Side,
        dtype: DType,
    },

    /// `adaptive_avg_pool2d(a, (oh, ow))` for any output size (windows that may overlap).
    AdaptiveAvgPool2d {
        oh: usize,
        ow: usize,
    },
    /// `_adaptive_avg_pool2d_backward(grad, a)`: inputs `grad, a` (`a` gives the shape).
    AdaptiveAvgPool2dBackward,
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
    /// Every input, in order, along a new dimension `dim` (of the output's rank).
    Stack {
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
    /// `take_along_dim(a, indices, dim)`: inputs `a, indices`.
    TakeAlongDim {
        dim: Option<usize>,
    },
    /// `gather(a, dim, index)`: inputs `a, index`; shaped like `index`.
    Gather {
        dim: usize,
    },
    /// `scatter_add(a, dim, index, src)`: inputs `a, index, src`; `a` plus each `src`
    /// element added where `index` sends it along `dim`.
    ScatterAdd {
        dim: usize,
    },
    /// `index_select(a, dim, index)`: inputs `a, index` (a vector of indices).
    IndexSelect {
        dim: usize,
    },
    /// `index_add(a, dim, index, source)`: inputs `a, index, source`; slice `i` of `source`
    /// added to slice `index[i]` of `a`.
    IndexAdd {
        dim: usize,
    },
    /// `sort(a, dim, descending)`: two outputs, the sorted values and their i64 indices. Always
    /// stable (ties keep their order), so `stable=False` is deterministic too.
    Sort {
        dim: usize,
        descending: bool,
    },
    /// `argsort(a, dim, descending)`: the i64 indices of [`Kernel::Sort`].
    Argsort {
        dim: usize,
        descending: bool,
    },
    /// `topk(a, k, dim, largest, sorted)`: two outputs, the `k` largest (or smallest) values
    /// and their i64 indices, always in sorted order, ties by lower index first.
    Topk {
        k: usize,
        dim: usize,
        largest: bool,
    },
    /// `nll_loss_backward(grad, a, target, weight, reduction, ignore_index, total_weight)`:
    /// inputs `grad, a, target, total_weight` and, when `weighted`, `weight`.
    NllLossBackward {
        reduction: LossReduction,
        ignore_index: i64,
        weighted: bool,
    },
    /// `_log_softmax_backward_data` (`log`) / `_softmax_backward_data`: inputs `grad, output`;
    /// the result has `dtype`.
    SoftmaxBackward {
        dim: usize,
        log: bool,
        dtype: DType,
    },
    /// Standard normal samples (`randn`), from the same keyed stream as `Uniform`.
    Normal {
        shape: Vec<usize>,
        dtype: DType,
    },
    /// `lerp(start, end, weight)`: inputs `start, end` and, when `weight` is an input, the
    /// weight tensor (`exec/vocab_composite.rs`, as are the kernels below up to `Unfold`).
    Lerp {
        weight: Side,
    },
    /// `ldexp(a, b)`: `a * 2^b` in the float `dtype`, both operands converted to it first.
    Ldexp {
        dtype: DType,
    },
    /// `addcmul(a, t1, t2, value=v)` of integers: `a + v * t1 * t2`, wrapping in `dtype`.
    Addcmul {
        value: f64,
        dtype: DType,
    },
    /// `clamp(a, min, max)` with a tensor bound: `minimum(maximum(a, min), max)` in `dtype`
    /// (input 0 is `a`; each bound an input or a number).
    Clamp {
        min: Side,
        max: Side,
        dtype: DType,
    },
    /// aten's `log_sigmoid_backward(grad, x, buffer)`: inputs `grad, x`; `grad * sigmoid(-x)`.
    LogSigmoidBackward,
    /// `any(a, dim, keepdim)`: a bool tensor, whether any element along `dims` is nonzero.
    Any {
        dims: Vec<usize>,
        keepdim: bool,
    },
    /// `index_copy(a, dim, index, source)`: inputs `a, index, source`; slice `i` of `source`
    /// replaces slice `index[i]` of `a`.
    IndexCopy {
        dim: usize,
    },
    /// `scatter(a, dim, index, src)`: inputs `a, index` and `src` unless `value` is given;
    /// each `src` element (or `value`) replaces the element of `a` `index` sends it to.
    Scatter {
        dim: usize,
        value: Option<f64>,
    },
    /// `index_put(a, indices, values, accumulate)`: inputs `a, values, *indices` (integer
    /// tensors that broadcast together, indexing `a`'s leading dimensions).
    IndexPut {
        accumulate: bool,
    },
    /// `Tensor.unfold(dim, size, step)`: windows of `size` every `step` along `dim`, in a new
    /// last dimension.
    Unfold {
        dim: usize,
        size: usize,
        step: usize,
    },
    /// `batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)`:
    /// inputs `x`, then `running_mean, running_var` when `running`, `weight` and `bias` when
    /// present. Training normalizes by the batch's statistics (the running statistics are not
    /// updated: a trace's values are immutable), evaluation by the running ones.
    BatchNorm {
        training: bool,
        eps: f64,
        running: bool,
        weight: bool,
        bias: bool,
    },
    /// `frexp(a)` of a float tensor: two outputs, the mantissa (`a`'s dtype, magnitude in
    /// [0.5, 1)) and the i32 exponent, `a = mantissa * 2^exponent`; 0, inf and NaN keep
    /// themselves as mantissa with exponent 0.
    Frexp,
    /// `max_pool3d_with_indices` of `[N, C, D, H, W]` (or `[C, D, H, W]`), dilation 1, floor
    /// mode: two outputs, the maxima and their i64 positions in each `D * H * W` plane.
    MaxPool3d {
        kernel: [usize; 3],
        stride: [usize; 3],
        padding: [usize; 3],
    },
    /// Its gradient: inputs `grad, a, indices`; each gradient added at its position.
    MaxPool3dBackward,
    /// Thunder's `copy_with_setitem(a, key, value)`: `a` with `a[key]` replaced by `value`
    /// (`exec/setitem.rs`); inputs `a`, then the value unless `value` is a number, then the
    /// key's tensors in order.
    SetItem {
        key: Vec<KeyItem>,
        value: Option<f64>,
    },
    /// `a[key]` with index tensors (`exec/setitem.rs`); inputs `a`, then the key's tensors.
    GetItemTensor {
        key: Vec<KeyItem>,
    },
    /// `F.multi_head_attention_forward` without masks, dropout or extra key/value biases
    /// (`exec/attention.rs`): inputs `query, key, value, in_proj_weight, in_proj_bias,
    /// out_proj_weight, out_proj_bias`; two outputs, the attention output and the weights.
    MultiHeadAttention(Mha),
    /// Thunder's `multi_head_attention_forward_vjp`: the forward's seven inputs, then the
    /// gradients of its two outputs; gives the gradients `outputs` names, in input order.
    MultiHeadAttentionVjp {
        mha: Mha,
        outputs: [bool; 7],
    },
    /// Needs a random stream keyed by (seed, rank, step, node), which the executor provides.
    Uniform {
        shape: Vec<usize>,
        minval: f64,
        maxval: f64,
        dtype: DType,
    },
}

/// A [`Kernel::BinaryFallback`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryFallbackOp {
    /// `max(a, b) + log1p(exp(-|a - b|))` (`a` where both are the same infinity).
    LogAddExp,
    /// `sqrt(a^2 + b^2)`.
    Hypot,
}

/// The loss of one element of a [`Kernel::PointwiseLoss`], as PyTorch 2.9 defines it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PointwiseLossKind {
    /// `(1 - y) x - (1 + (pos_weight - 1) y) log_sigmoid(x)`.
    BceWithLogits,
    /// `(y - 1) max(log1p(-x), -100) - y max(log(x), -100)`.
    Bce,
    /// `|x - y|`.
    L1,
    /// `0.5 d^2 / beta` where `|d| < beta`, else `|d| - 0.5 beta` (`d = x - y`; `beta = 0`
    /// is L1).
    SmoothL1 { beta: f64 },
    /// `0.5 d^2` where `|d| < delta`, else `delta (|d| - 0.5 delta)`.
    Huber { delta: f64 },
    /// `exp(y) (y - x)` with `log_target`, else `xlogy(y, y) - y x`; `batchmean` divides the
    /// sum (the kernel's reduction) by the batch size, the first dimension's.
    KlDiv { log_target: bool, batchmean: bool },
}

/// How a loss reduces over its elements (PyTorch's `reduction=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossReduction {
    Mean,
    Sum,
    None,
}

impl LossReduction {
    /// PyTorch's spelling: `mean`, `sum`, `none`.
    pub fn parse(s: &str) -> Option<LossReduction> {
        match s {
            "mean" => Some(LossReduction::Mean),
            "sum" => Some(LossReduction::Sum),
            "none" => Some(LossReduction::None),
            _ => None,
        }
    }
    /// PyTorch's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            LossReduction::Mean => "mean",
            LossReduction::Sum => "sum",
            LossReduction::None => "none",
        }
    }
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
    /// Whether the kernel draws from the executor's keyed random stream
    /// ([`crate::exec::backend::Backend::random`]).
    pub fn is_random(&self) -> bool {
        matches!(self, Kernel::Uniform { .. } | Kernel::Normal { .. })
    }

    /// How many tensors the kernel gives (the node's outputs).
    pub fn outputs(&self) -> usize {
        match self {
            Kernel::MaxPool2d { .. }
            | Kernel::VarMean { .. }
            | Kernel::Sort { .. }
            | Kernel::Topk { .. }
            | Kernel::Frexp
            | Kernel::MaxPool3d { .. } => 2,
            Kernel::ConvTransposeVjp { outputs, .. } => outputs.count(),
            Kernel::MultiHeadAttention(_) => 2,
            Kernel::MultiHeadAttentionVjp { outputs, .. } => outputs.iter().filter(|&&o| o).count(),
            Kernel::BilinearVjp { outputs } => outputs.iter().filter(|&&o| o).count(),
            Kernel::CosineSimilarityVjp { outputs, .. } => outputs.iter().filter(|&&o| o).count(),
            Kernel::PointwiseLossVjp { outputs, .. } => outputs.iter().filter(|&&o| o).count(),
            Kernel::BinaryFallbackVjp { outputs, .. } => outputs.iter().filter(|&&o| o).count(),
            Kernel::Split { sizes, .. } => sizes.len(),
            _ => 1,
        }
    }

    /// Rough floating-point operation count (for metrics and the cost model).
    pub fn flops(&self, inputs: &[&[usize]], out: &[usize]) -> f64 {
        let numel = |s: &[usize]| s.iter().product::<usize>() as f64;
        match self {
            Kernel::Matmul | Kernel::Linear { .. } | Kernel::GroupedMm { .. } => {
                let k = inputs.first().and_then(|s| s.last()).copied().unwrap_or(1) as f64;
                2.0 * numel(out) * k
            }
            Kernel::Convolution { .. } => {
                // 2 * out elements * (C_in / groups) * kernel taps: the weight's numel / C_out
                let w = inputs.get(1).map_or(0.0, |s| numel(s));
                let cout = inputs.get(1).and_then(|s| s.first()).copied().unwrap_or(1) as f64;
                2.0 * numel(out) * w / cout.max(1.0)
            }
            Kernel::ConvTranspose { .. } => {
                // each input element meets (C_out / groups) * kernel taps weights: w's numel / C_in
                let x = inputs.first().map_or(0.0, |s| numel(s));
                let w = inputs.get(1).map_or(0.0, |s| numel(s));
                let cin = inputs.get(1).and_then(|s| s.first()).copied().unwrap_or(1) as f64;
                2.0 * x * w / cin.max(1.0)
            }
            Kernel::ConvTransposeVjp { outputs, .. } => {
                // each gradient costs about what the forward does
                let g = inputs.get(2).map_or(0.0, |s| numel(s));
                let w = inputs.get(1).map_or(0.0, |s| numel(s));
                let cin = inputs.get(1).and_then(|s| s.first()).copied().unwrap_or(1) as f64;
                let forward = 2.0 * inputs.first().map_or(0.0, |s| numel(s)) * w / cin.max(1.0);
                forward * (usize::from(outputs.input) + usize::from(outputs.weight)) as f64
                    + if outputs.bias { g } else { 0.0 }
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
            Kernel::Logsumexp { .. } => 4.0 * inputs.first().map(|s| numel(s)).unwrap_or(0.0),
            _ => numel(out),
        }
    }
}

/// One item of an indexing key ([`Kernel::SetItem`], [`Kernel::GetItemTensor`]).
#[derive(Clone, Debug, PartialEq)]
pub enum KeyItem {
    Int(i64),
    /// `start:stop:step`, as written.
    Slice([Option<i64>; 3]),
    /// `None`: a new dimension of 1.
    NewAxis,
    /// `...`.
    Ellipsis,
    /// An index tensor (integer or bool), the kernel's next tensor input.
    Tensor,
}

/// The shape of a multi-head attention ([`Kernel::MultiHeadAttention`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mha {
    pub heads: usize,
    /// The weights averaged over heads (`average_attn_weights`).
    pub average: bool,
}

/// The window of [`Kernel::Im2Col`] and [`Kernel::Col2Im`], per spatial dimension (height,
/// width).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window2d {
    pub kernel: [usize; 2],
    pub dilation: [usize; 2],
    pub padding: [usize; 2],
    pub stride: [usize; 2],
}

/// Which gradients a [`Kernel::ConvTransposeVjp`] gives, in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VjpOutputs {
    /// The input's gradient.
    pub input: bool,
    /// The weight's.
    pub weight: bool,
    /// The bias's.
    pub bias: bool,
}

impl VjpOutputs {
    /// How many gradients.
    pub fn count(self) -> usize {
        usize::from(self.input) + usize::from(self.weight) + usize::from(self.bias)
    }
}

/// A compute node decoded: the kernel and the values it reads, in `Side::Input` order.
#[derive(Clone, Debug)]
pub struct Decoded {
    pub kernel: Kernel,
    pub inputs: Vec<ValueId>,
    /// A second kernel run on `kernel`'s single output, whose result is the node's output
    /// (`x[:, 0]`: a slice, then a reshape that drops the indexed dimension).
    pub then: Option<Kernel>,
}
