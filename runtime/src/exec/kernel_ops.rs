//! Decoding ops into [`Kernel`]s, registered per op against the IR's op table: [`KERNELS`]
//! maps every canonical op name (`OpRegistry::builtin()`) to its CPU decoder, to the plan
//! compiler (collectives, bucket packing, sequence unpacking), or to an explicit
//! [`KernelEntry::Unsupported`] mark with the reason. A node's op is resolved to its canonical
//! name first, so every spelling Thunder prints (`torch.mul`, `Tensor.__mul__`,
//! `torch_div_prim_impl`, ...) finds the one entry of its op; nothing is matched by a name
//! rebuilt from a spelling. Each decoder reads the node's operands in the op's signature order,
//! positional or keyword.

use crate::exec::kernel::{
    Activation, BinaryFallbackOp, BinaryOp, BitOp, CompareOp, Decoded, Kernel, LossReduction,
    ReduceOp, Side, UnaryOp, VjpOutputs, Window2d,
};
use std::collections::HashMap;

mod attention;
mod prims;
mod setitem;
mod vocab;
use std::sync::OnceLock;
use tracepass_ir::{fallback_call, ops, Arg, DType, LhsSlot, Node, OpRegistry, Trace, ValueId};

/// Reads a node's operands and gives its kernel.
pub type Decoder = fn(&mut Ops<'_>) -> Result<Kernel, String>;

/// How the runtime runs an op of the table.
#[derive(Clone, Copy)]
pub enum KernelEntry {
    /// A CPU kernel, decoded from the node by this function.
    Cpu(Decoder),
    /// Compiled by [`crate::exec::plan::Plan::compile`] into an instruction of its own (no kernel).
    Plan,
    /// Not runnable by this runtime, and why.
    Unsupported { reason: &'static str },
}

impl std::fmt::Debug for KernelEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KernelEntry::Cpu(_) => f.write_str("Cpu(..)"),
            KernelEntry::Plan => f.write_str("Plan"),
            KernelEntry::Unsupported { reason } => f
                .debug_struct("Unsupported")
                .field("reason", reason)
                .finish(),
        }
    }
}

const ELEMENTWISE_FN: &str = "no CPU kernel computes this elementwise function: the kernel set's \
     UnaryOp/BinaryOp lack it, and a new one needs the CUDA backend's kernel too";
const TERNARY: &str = "a three-operand elementwise op: no CPU kernel (the kernel set's \
     elementwise kernels take two operands)";
/// Why an op the parser rewrites has no kernel: only a node built by hand can reach one.
const LOWERED: &str = "rewritten into table ops when a trace is read (`tracepass_ir::lowering`); \
                       build the table ops instead";
const NORM: &str = "a normalization composite with no fused CPU kernel: Thunder's traces of \
     the corpus decompose it into reductions and elementwise ops, which have kernels";
const LOSS: &str = "a loss composite with no CPU kernel: the trainer computes the loss outside \
     the traces, and Thunder's traces decompose losses into prims";
const POOL: &str = "the CPU pooling kernel is 2-d max pooling with indices \
     (max_pool2d_with_indices, as Thunder's torch executor prints it)";

/// Every op of the IR's op table, by canonical name, and how the runtime runs it.
pub static KERNELS: &[(&str, KernelEntry)] = {
    use KernelEntry::{Cpu, Plan, Unsupported};
    &[
        // ----- elementwise, unary -----
        ("ltorch.exp", Cpu(|o| unary(o, UnaryOp::Exp))),
        ("prims.exp", Cpu(|o| unary(o, UnaryOp::Exp))),
        ("ltorch.expm1", Cpu(|o| unary(o, UnaryOp::Expm1))),
        ("prims.expm1", Cpu(|o| unary(o, UnaryOp::Expm1))),
        ("ltorch.log", Cpu(|o| unary(o, UnaryOp::Log))),
        ("prims.log", Cpu(|o| unary(o, UnaryOp::Log))),
        ("ltorch.log1p", Cpu(|o| unary(o, UnaryOp::Log1p))),
        ("prims.log1p", Cpu(|o| unary(o, UnaryOp::Log1p))),
        ("ltorch.sqrt", Cpu(|o| unary(o, UnaryOp::Sqrt))),
        ("prims.sqrt", Cpu(|o| unary(o, UnaryOp::Sqrt))),
        ("ltorch.rsqrt", Cpu(|o| unary(o, UnaryOp::Rsqrt))),
        ("prims.rsqrt", Cpu(|o| unary(o, UnaryOp::Rsqrt))),
        ("ltorch.reciprocal", Cpu(|o| unary(o, UnaryOp::Reciprocal))),
        ("prims.reciprocal", Cpu(|o| unary(o, UnaryOp::Reciprocal))),
        ("ltorch.sin", Cpu(|o| unary(o, UnaryOp::Sin))),
        ("prims.sin", Cpu(|o| unary(o, UnaryOp::Sin))),
        ("ltorch.cos", Cpu(|o| unary(o, UnaryOp::Cos))),
        ("prims.cos", Cpu(|o| unary(o, UnaryOp::Cos))),
        ("ltorch.tanh", Cpu(|o| unary(o, UnaryOp::Tanh))),
        ("prims.tanh", Cpu(|o| unary(o, UnaryOp::Tanh))),
        ("ltorch.erf", Cpu(|o| unary(o, UnaryOp::Erf))),
        ("prims.erf", Cpu(|o| unary(o, UnaryOp::Erf))),
        ("ltorch.sigmoid", Cpu(|o| unary(o, UnaryOp::Sigmoid))),
        ("prims.sigmoid", Cpu(|o| unary(o, UnaryOp::Sigmoid))),
        ("ltorch.neg", Cpu(|o| unary(o, UnaryOp::Neg))),
        ("prims.neg", Cpu(|o| unary(o, UnaryOp::Neg))),
        ("ltorch.abs", Cpu(|o| unary(o, UnaryOp::Abs))),
        ("prims.abs", Cpu(|o| unary(o, UnaryOp::Abs))),
        ("ltorch.sign", Cpu(|o| unary(o, UnaryOp::Sign))),
        ("prims.sign", Cpu(|o| unary(o, UnaryOp::Sign))),
        ("ltorch.relu", Cpu(relu)),
        ("prims.relu", Cpu(|o| unary(o, UnaryOp::Relu))),
        ("ltorch.gelu", Cpu(gelu)),
        ("prims.gelu", Cpu(gelu)),
        ("ltorch.silu", Cpu(silu)),
        ("ltorch.logical_not", Cpu(logical_not)),
        ("ltorch.isnan", Cpu(isnan)),
        ("ltorch.exp2", Cpu(|o| unary(o, UnaryOp::Exp2))),
        ("ltorch.log2", Cpu(|o| unary(o, UnaryOp::Log2))),
        ("ltorch.log10", Cpu(|o| unary(o, UnaryOp::Log10))),
        ("ltorch.tan", Cpu(|o| unary(o, UnaryOp::Tan))),
        ("ltorch.asin", Cpu(|o| unary(o, UnaryOp::Asin))),
        ("ltorch.acos", Cpu(|o| unary(o, UnaryOp::Acos))),
        ("ltorch.atan", Cpu(|o| unary(o, UnaryOp::Atan))),
        ("ltorch.sinh", Cpu(|o| unary(o, UnaryOp::Sinh))),
        ("ltorch.cosh", Cpu(|o| unary(o, UnaryOp::Cosh))),
        ("ltorch.asinh", Cpu(|o| unary(o, UnaryOp::Asinh))),
        ("ltorch.acosh", Cpu(|o| unary(o, UnaryOp::Acosh))),
        ("ltorch.atanh", Cpu(|o| unary(o, UnaryOp::Atanh))),
        ("ltorch.erfc", Cpu(|o| unary(o, UnaryOp::Erfc))),
        ("ltorch.erfinv", Cpu(|o| unary(o, UnaryOp::Erfinv))),
        ("ltorch.lgamma", Cpu(|o| unary(o, UnaryOp::Lgamma))),
        ("ltorch.digamma", Cpu(|o| unary(o, UnaryOp::Digamma))),
        ("prims.bitcast", Cpu(bitcast)),
        ("ltorch.any", Cpu(vocab::any)),
        ("ltorch.zeta", Cpu(|o| binary(o, BinaryOp::Zeta))),
        ("ltorch.index_copy", Cpu(vocab::index_copy)),
        ("ltorch.scatter", Cpu(vocab::scatter)),
        ("ltorch.index_put", Cpu(vocab::index_put)),
        ("ltorch.unfold", Cpu(vocab::unfold)),
        ("ltorch.randint", Cpu(vocab::randint)),
        ("ltorch.erfcinv", Cpu(|o| unary(o, UnaryOp::Erfcinv))),
        ("ltorch.ndtri", Cpu(|o| unary(o, UnaryOp::Ndtri))),
        ("ltorch.polygamma", Cpu(polygamma)),
        ("ltorch.frexp", Cpu(vocab::frexp)),
        (
            "ltorch.log_sigmoid_backward",
            Cpu(vocab::log_sigmoid_backward),
        ),
        ("ltorch.floor", Cpu(|o| unary(o, UnaryOp::Floor))),
        ("ltorch.ceil", Cpu(|o| unary(o, UnaryOp::Ceil))),
        ("ltorch.round", Cpu(|o| unary(o, UnaryOp::Round))),
        ("ltorch.trunc", Cpu(|o| unary(o, UnaryOp::Trunc))),
        ("ltorch.bitwise_not", Cpu(bitwise_not)),
        ("ltorch.isinf", Cpu(|o| float_class(o, true))),
        ("ltorch.isfinite", Cpu(|o| float_class(o, false))),
        ("ltorch.signbit", Cpu(signbit)),
        // ----- elementwise, binary -----
        ("ltorch.add", Cpu(|o| binary(o, BinaryOp::Add))),
        ("prims.add", Cpu(|o| binary(o, BinaryOp::Add))),
        ("ltorch.sub", Cpu(|o| binary(o, BinaryOp::Sub))),
        ("prims.sub", Cpu(|o| binary(o, BinaryOp::Sub))),
        ("ltorch.mul", Cpu(|o| binary(o, BinaryOp::Mul))),
        ("prims.mul", Cpu(|o| binary(o, BinaryOp::Mul))),
        ("ltorch.div", Cpu(|o| binary(o, BinaryOp::Div))),
        ("prims.div", Cpu(prims_div)),
        ("ltorch.true_divide", Cpu(|o| binary(o, BinaryOp::Div))),
        ("prims.true_divide", Cpu(|o| binary(o, BinaryOp::Div))),
        ("ltorch.pow", Cpu(|o| binary(o, BinaryOp::Pow))),
        ("prims.pow", Cpu(|o| binary(o, BinaryOp::Pow))),
        ("ltorch.maximum", Cpu(|o| binary(o, BinaryOp::Maximum))),
        ("prims.maximum", Cpu(|o| binary(o, BinaryOp::Maximum))),
        ("ltorch.minimum", Cpu(|o| binary(o, BinaryOp::Minimum))),
        ("prims.minimum", Cpu(|o| binary(o, BinaryOp::Minimum))),
        ("ltorch.atan2", Cpu(|o| binary(o, BinaryOp::Atan2))),
        ("prims.atan2", Cpu(|o| binary(o, BinaryOp::Atan2))),
        (
            "ltorch.floor_divide",
            Cpu(|o| binary(o, BinaryOp::FloorDivide)),
        ),
        ("ltorch.remainder", Cpu(|o| binary(o, BinaryOp::Remainder))),
        ("ltorch.fmod", Cpu(|o| binary(o, BinaryOp::Fmod))),
        (
            "ltorch.copysign",
            Unsupported {
                reason: ELEMENTWISE_FN,
            },
        ),
        ("ltorch.nextafter", Cpu(|o| binary(o, BinaryOp::Nextafter))),
        ("ltorch.bitwise_and", Cpu(|o| bitwise(o, BitOp::And, false))),
        ("ltorch.bitwise_or", Cpu(|o| bitwise(o, BitOp::Or, false))),
        ("ltorch.bitwise_xor", Cpu(|o| bitwise(o, BitOp::Xor, false))),
        ("ltorch.ldexp", Cpu(ldexp)),
        ("ltorch.bitwise_left_shift", Cpu(|o| shift(o, true))),
        ("ltorch.bitwise_right_shift", Cpu(|o| shift(o, false))),
        ("ltorch.logical_and", Cpu(|o| bitwise(o, BitOp::And, true))),
        ("ltorch.logical_or", Cpu(|o| bitwise(o, BitOp::Or, true))),
        ("ltorch.logical_xor", Cpu(|o| bitwise(o, BitOp::Xor, true))),
        // ----- comparisons and selection -----
        ("ltorch.eq", Cpu(|o| compare(o, CompareOp::Eq))),
        ("prims.eq", Cpu(|o| compare(o, CompareOp::Eq))),
        ("ltorch.ne", Cpu(|o| compare(o, CompareOp::Ne))),
        ("prims.ne", Cpu(|o| compare(o, CompareOp::Ne))),
        ("ltorch.lt", Cpu(|o| compare(o, CompareOp::Lt))),
        ("prims.lt", Cpu(|o| compare(o, CompareOp::Lt))),
        ("ltorch.le", Cpu(|o| compare(o, CompareOp::Le))),
        ("prims.le", Cpu(|o| compare(o, CompareOp::Le))),
        ("ltorch.gt", Cpu(|o| compare(o, CompareOp::Gt))),
        ("prims.gt", Cpu(|o| compare(o, CompareOp::Gt))),
        ("ltorch.ge", Cpu(|o| compare(o, CompareOp::Ge))),
        ("prims.ge", Cpu(|o| compare(o, CompareOp::Ge))),
        ("ltorch.where", Cpu(where_)),
        ("prims.where", Cpu(where_)),
        ("ltorch.masked_fill", Cpu(masked_fill)),
        ("ltorch.clamp", Cpu(clamp)),
        ("ltorch.lerp", Cpu(vocab::lerp)),
        ("ltorch.addcmul", Cpu(addcmul)),
        ("ltorch.addcdiv", Unsupported { reason: TERNARY }),
        // ----- activations -----
        ("ltorch.relu6", Cpu(|o| activation(o, UnaryOp::Relu6))),
        ("ltorch.mish", Cpu(|o| activation(o, UnaryOp::Mish))),
        ("ltorch.selu", Cpu(|o| activation(o, UnaryOp::Selu))),
        ("ltorch.elu", Cpu(|o| param_activation(o, "elu"))),
        ("ltorch.celu", Cpu(|o| param_activation(o, "celu"))),
        (
            "ltorch.leaky_relu",
            Cpu(|o| param_activation(o, "leaky_relu")),
        ),
        ("ltorch.hardtanh", Cpu(|o| param_activation(o, "hardtanh"))),
        (
            "ltorch.hardswish",
            Cpu(|o| activation(o, UnaryOp::Hardswish)),
        ),
        (
            "ltorch.hardsigmoid",
            Cpu(|o| activation(o, UnaryOp::Hardsigmoid)),
        ),
        ("ltorch.softplus", Cpu(softplus)),
        ("ltorch.logsigmoid", Cpu(|o| unary(o, UnaryOp::Logsigmoid))),
        ("ltorch.softsign", Cpu(|o| unary(o, UnaryOp::Softsign))),
        ("ltorch.tanhshrink", Cpu(|o| unary(o, UnaryOp::Tanhshrink))),
        // ----- linear algebra and convolution -----
        ("ltorch.matmul", Cpu(matmul)),
        ("prims.matmul", Cpu(matmul)),
        ("ltorch.bmm", Cpu(matmul)),
        ("ltorch._grouped_mm", Cpu(grouped_mm)),
        ("ltorch.linear", Cpu(linear)),
        ("prims.linear", Cpu(linear)),
        ("ltorch.convolution", Cpu(convolution)),
        ("prims.convolution", Cpu(convolution)),
        ("ltorch.conv1d", Cpu(conv_nd)),
        ("ltorch.conv2d", Cpu(conv_nd)),
        ("ltorch.conv3d", Cpu(conv_nd)),
        ("ltorch.conv_transpose1d", Cpu(conv_transpose)),
        ("ltorch.conv_transpose2d", Cpu(conv_transpose)),
        ("ltorch.conv_transpose3d", Cpu(conv_transpose)),
        ("ltorch.adaptive_avg_pool1d", Cpu(adaptive_avg_pool1d)),
        (
            "ltorch.adaptive_avg_pool1d_vjp",
            Cpu(|o| {
                // the pooling's gradient reads the output's gradient and the input
                let input: Decoder = |f| {
                    f.tensor(0, "input")?;
                    Ok(Kernel::AdaptiveAvgPool1dBackward)
                };
                single_input_vjp(o, "ltorch.adaptive_avg_pool1d", input, Some, true)
            }),
        ),
        (
            "ltorch.adaptive_max_pool1d",
            Cpu(|o| adaptive_max_pool(o, 1)),
        ),
        (
            "ltorch.adaptive_max_pool2d",
            Cpu(|o| adaptive_max_pool(o, 2)),
        ),
        (
            "ltorch.adaptive_max_pool1d_vjp",
            Cpu(|o| {
                // the gradient reads the output's gradient and the input
                let input: Decoder = |f| {
                    f.tensor(0, "input")?;
                    Ok(Kernel::AdaptiveMaxPoolBackward { dims: 1 })
                };
                single_input_vjp(o, "ltorch.adaptive_max_pool1d", input, Some, true)
            }),
        ),
        (
            "ltorch.adaptive_max_pool2d_vjp",
            Cpu(|o| {
                let input: Decoder = |f| {
                    f.tensor(0, "input")?;
                    Ok(Kernel::AdaptiveMaxPoolBackward { dims: 2 })
                };
                single_input_vjp(o, "ltorch.adaptive_max_pool2d", input, Some, true)
            }),
        ),
        ("ltorch.channel_shuffle", Cpu(|o| channel_shuffle(o, false))),
        (
            "ltorch.channel_shuffle_vjp",
            Cpu(|o| {
                single_input_vjp(
                    o,
                    "ltorch.channel_shuffle",
                    |f| channel_shuffle(f, false),
                    inverse_channel_shuffle,
                    false,
                )
            }),
        ),
        ("ltorch.clamp_min", Cpu(|o| clamp_bound(o, false))),
        ("ltorch.clamp_max", Cpu(|o| clamp_bound(o, true))),
        (
            "ltorch.clamp_min_vjp",
            Cpu(|o| clamp_bound_vjp(o, "ltorch.clamp_min", false)),
        ),
        (
            "ltorch.clamp_max_vjp",
            Cpu(|o| clamp_bound_vjp(o, "ltorch.clamp_max", true)),
        ),
        ("ltorch.detach", Cpu(identity)),
        ("ltorch.detach_vjp", Cpu(detach_vjp)),
        (
            "ltorch.unfold_im2col",
            Cpu(|o| im2col(o).map(Kernel::Im2Col)),
        ),
        ("ltorch.fold_col2im", Cpu(col2im)),
        ("ltorch.unfold_im2col_vjp", Cpu(im2col_vjp)),
        (
            "ltorch.fold_col2im_vjp",
            Cpu(|o| single_input_vjp(o, "ltorch.fold_col2im", col2im, fold_grad, false)),
        ),
        ("ltorch.cosine_similarity", Cpu(cosine_similarity)),
        ("ltorch.cosine_similarity_vjp", Cpu(cosine_similarity_vjp)),
        (
            "ltorch.binary_cross_entropy_with_logits",
            Cpu(pointwise_loss),
        ),
        (
            "ltorch.binary_cross_entropy_with_logits_vjp",
            Cpu(pointwise_loss_vjp),
        ),
        ("ltorch.binary_cross_entropy", Cpu(pointwise_loss)),
        ("ltorch.binary_cross_entropy_vjp", Cpu(pointwise_loss_vjp)),
        ("ltorch.l1_loss", Cpu(pointwise_loss)),
        ("ltorch.l1_loss_vjp", Cpu(pointwise_loss_vjp)),
        ("ltorch.smooth_l1_loss", Cpu(pointwise_loss)),
        ("ltorch.smooth_l1_loss_vjp", Cpu(pointwise_loss_vjp)),
        ("ltorch.huber_loss", Cpu(pointwise_loss)),
        ("ltorch.huber_loss_vjp", Cpu(pointwise_loss_vjp)),
        ("ltorch.kl_div", Cpu(pointwise_loss)),
        ("ltorch.kl_div_vjp", Cpu(pointwise_loss_vjp)),
        (
            "ltorch.logaddexp",
            Cpu(|o| binary_fallback(o, BinaryFallbackOp::LogAddExp)),
        ),
        (
            "ltorch.logaddexp_vjp",
            Cpu(|o| binary_fallback_vjp(o, "ltorch.logaddexp", BinaryFallbackOp::LogAddExp)),
        ),
        (
            "ltorch.hypot",
            Cpu(|o| binary_fallback(o, BinaryFallbackOp::Hypot)),
        ),
        (
            "ltorch.hypot_vjp",
            Cpu(|o| binary_fallback_vjp(o, "ltorch.hypot", BinaryFallbackOp::Hypot)),
        ),
        ("ltorch.bilinear", Cpu(bilinear)),
        ("ltorch.bilinear_vjp", Cpu(bilinear_vjp)),
        ("ltorch.pixel_shuffle", Cpu(|o| pixel_shuffle(o, false))),
        ("ltorch.pixel_unshuffle", Cpu(|o| pixel_shuffle(o, true))),
        (
            "ltorch.pixel_shuffle_vjp",
            Cpu(|o| {
                single_input_vjp(
                    o,
                    "ltorch.pixel_shuffle",
                    |f| pixel_shuffle(f, false),
                    inverse_shuffle,
                    false,
                )
            }),
        ),
        (
            "ltorch.pixel_unshuffle_vjp",
            Cpu(|o| {
                single_input_vjp(
                    o,
                    "ltorch.pixel_unshuffle",
                    |f| pixel_shuffle(f, true),
                    inverse_shuffle,
                    false,
                )
            }),
        ),
        (
            "ltorch.conv_transpose1d_vjp",
            Cpu(|o| conv_transpose_vjp(o, "ltorch.conv_transpose1d")),
        ),
        (
            "ltorch.conv_transpose2d_vjp",
            Cpu(|o| conv_transpose_vjp(o, "ltorch.conv_transpose2d")),
        ),
        (
            "ltorch.conv_transpose3d_vjp",
            Cpu(|o| conv_transpose_vjp(o, "ltorch.conv_transpose3d")),
        ),
        // ----- pooling, embedding, normalization, losses -----
        ("ltorch.max_pool2d_with_indices", Cpu(max_pool2d)),
        (
            "ltorch.max_pool2d_with_indices_backward",
            Cpu(max_pool2d_backward),
        ),
        (
            "ltorch.max_pool1d_with_indices",
            Unsupported { reason: POOL },
        ),
        ("ltorch.max_pool3d_with_indices", Cpu(vocab::max_pool3d)),
        (
            "ltorch.max_pool3d_with_indices_backward",
            Cpu(vocab::max_pool3d_backward),
        ),
        ("ltorch.max_pool1d", Unsupported { reason: POOL }),
        ("ltorch.max_pool2d", Unsupported { reason: POOL }),
        ("ltorch.max_pool3d", Unsupported { reason: POOL }),
        ("ltorch.adaptive_avg_pool2d", Cpu(adaptive_avg_pool2d)),
        (
            "ltorch.adaptive_avg_pool2d_backward",
            Cpu(adaptive_avg_pool2d_backward),
        ),
        ("ltorch.embedding", Cpu(embedding)),
        ("prims.embedding", Cpu(embedding)),
        ("ltorch.take_along_dim", Cpu(take_along_dim)),
        ("ltorch.gather", Cpu(gather)),
        ("ltorch.scatter_add", Cpu(scatter_add)),
        ("ltorch.index_select", Cpu(index_select)),
        ("prims.broadcast_in_dim", Cpu(prims::broadcast_in_dim)),
        ("prims.iota", Cpu(prims::iota)),
        ("prims.take", Cpu(prims::take)),
        ("prims.take_along_axis", Cpu(prims::take_along_axis)),
        ("prims.gather", Cpu(prims::gather)),
        ("prims.scatter_add", Cpu(prims::scatter_add)),
        ("prims.index_add", Cpu(prims::index_add)),
        ("prims.index_copy", Cpu(prims::index_copy)),
        ("prims.scatter", Cpu(prims::scatter)),
        ("ltorch.index_add", Cpu(index_add)),
        ("ltorch.nll_loss_backward", Cpu(nll_loss_backward)),
        (
            "ltorch.log_softmax_backward",
            Cpu(|o| softmax_backward(o, true)),
        ),
        (
            "ltorch.softmax_backward",
            Cpu(|o| softmax_backward(o, false)),
        ),
        ("ltorch.embedding_backward", Cpu(embedding_backward)),
        ("ltorch.layer_norm", Unsupported { reason: NORM }),
        ("ltorch.rms_norm", Unsupported { reason: NORM }),
        ("ltorch.batch_norm", Cpu(vocab::batch_norm)),
        ("ltorch.group_norm", Unsupported { reason: NORM }),
        ("ltorch.instance_norm", Unsupported { reason: NORM }),
        (
            "ltorch.dropout",
            Unsupported {
                reason: "Thunder traces dropout as uniform, lt, mul and div; the composite \
                         itself has no CPU kernel",
            },
        ),
        (
            "ltorch.glu",
            Unsupported {
                reason: "no CPU kernel for glu (Thunder decomposes it into split, sigmoid \
                         and mul)",
            },
        ),
        (
            "ltorch.scaled_dot_product_attention",
            Unsupported {
                reason: "no fused attention kernel on the CPU (the corpus's models trace \
                         attention as matmul, softmax and matmul)",
            },
        ),
        ("ltorch.cross_entropy", Unsupported { reason: LOSS }),
        ("ltorch.nll_loss", Unsupported { reason: LOSS }),
        ("ltorch.mse_loss", Unsupported { reason: LOSS }),
        ("ltorch.one_hot", Cpu(one_hot)),
        // ----- reductions -----
        ("ltorch.sum", Cpu(|o| reduce(o, ReduceOp::Sum))),
        ("prims.sum", Cpu(|o| reduce(o, ReduceOp::Sum))),
        ("ltorch.mean", Cpu(|o| reduce(o, ReduceOp::Mean))),
        ("ltorch.amax", Cpu(|o| reduce(o, ReduceOp::Amax))),
        ("prims.amax", Cpu(|o| reduce(o, ReduceOp::Amax))),
        ("ltorch.var_mean", Cpu(var_mean)),
        ("prims.var_mean", Cpu(var_mean)),
        ("ltorch.softmax", Cpu(|o| softmax(o, false))),
        ("ltorch.log_softmax", Cpu(|o| softmax(o, true))),
        ("ltorch.prod", Cpu(|o| reduce(o, ReduceOp::Prod))),
        ("ltorch.amin", Cpu(|o| reduce(o, ReduceOp::Amin))),
        ("prims.amin", Cpu(|o| reduce(o, ReduceOp::Amin))),
        ("ltorch.var", Cpu(|o| var(o, false))),
        ("ltorch.std", Cpu(|o| var(o, true))),
        ("ltorch.logsumexp", Cpu(logsumexp)),
        ("ltorch.argmax", Cpu(|o| arg_extremum(o, true))),
        ("ltorch.argmin", Cpu(|o| arg_extremum(o, false))),
        ("ltorch.cumsum", Cpu(cumsum)),
        ("ltorch.topk", Cpu(topk)),
        ("ltorch.sort", Cpu(|o| sort(o, false))),
        ("ltorch.argsort", Cpu(|o| sort(o, true))),
        // ----- shapes and layout -----
        ("ltorch.reshape", Cpu(reshape)),
        ("ltorch.view", Cpu(view)),
        ("prims.reshape", Cpu(reshape)),
        ("ltorch.flatten", Cpu(reshape)),
        ("ltorch.expand", Cpu(expand)),
        ("ltorch.unsqueeze", Cpu(unsqueeze)),
        ("ltorch.squeeze", Cpu(squeeze)),
        ("ltorch.flip", Cpu(flip)),
        ("ltorch.min", Cpu(torch_min)),
        ("ltorch.triu", Cpu(|o| triangle(o, true))),
        ("ltorch.tril", Cpu(|o| triangle(o, false))),
        ("ltorch.roll", Cpu(roll)),
        (
            "ltorch.roll_vjp",
            Cpu(|o| single_input_vjp(o, "ltorch.roll", roll, roll_back, false)),
        ),
        ("ltorch.permute", Cpu(permute)),
        ("ltorch.movedim", Cpu(movedim)),
        ("ltorch.view_as", Cpu(reshape)),
        ("prims.transpose", Cpu(permute)),
        ("ltorch.transpose", Cpu(transpose)),
        ("ltorch.cat", Cpu(cat)),
        ("ltorch.stack", Cpu(stack)),
        ("ltorch.split", Cpu(split)),
        ("ltorch.chunk", Cpu(chunk)),
        ("prims.slice_prim", Cpu(slice)),
        ("prims.pad", Cpu(pad)),
        ("ltorch.pad", Cpu(functional_pad)),
        ("ltorch.getitem", Cpu(getitem)),
        ("prims.copy_with_setitem", Cpu(setitem::copy_with_setitem)),
        (
            "ltorch.multi_head_attention_forward",
            Cpu(attention::multi_head_attention),
        ),
        (
            "ltorch.multi_head_attention_forward_vjp",
            Cpu(attention::multi_head_attention_vjp),
        ),
        ("ltorch.contiguous", Cpu(identity)),
        ("ltorch.clone", Cpu(identity)),
        ("prims.shallow_copy", Cpu(identity)),
        ("ltorch.to", Cpu(convert)),
        ("prims.convert_element_type", Cpu(convert)),
        ("ltorch.long", Cpu(convert)),
        ("ltorch.int", Cpu(convert)),
        ("ltorch.float", Cpu(convert)),
        ("ltorch.double", Cpu(convert)),
        ("ltorch.half", Cpu(convert)),
        ("ltorch.bfloat16", Cpu(convert)),
        ("ltorch.bool", Cpu(convert)),
        ("ltorch.type_as", Cpu(convert)),
        // ----- creation -----
        ("ltorch.arange", Cpu(arange)),
        ("ltorch.full", Cpu(full)),
        ("prims.full", Cpu(full)),
        ("ltorch.full_like", Cpu(full)),
        ("ltorch.zeros", Cpu(|o| filled(o, 0.0))),
        ("ltorch.zeros_like", Cpu(|o| filled(o, 0.0))),
        ("ltorch.empty", Cpu(|o| filled(o, 0.0))),
        ("ltorch.ones", Cpu(|o| filled(o, 1.0))),
        ("ltorch.ones_like", Cpu(|o| filled(o, 1.0))),
        ("prims.uniform", Cpu(uniform)),
        ("ltorch.rand", Cpu(rand)),
        ("ltorch.randn", Cpu(randn)),
        // ----- plumbing, in-place updates, gradients -----
        (ops::COPY, Cpu(copy)),
        (ops::UPDATE_ALIASES, Plan),
        (ops::UNPACK_SEQUENCE, Plan),
        ("ltorch.item", Plan),
        (ops::CLEAR_COLLECTION, Plan),
        ("prims.get_grad", Cpu(identity)),
        // ----- communication -----
        (ops::ALL_REDUCE, Plan),
        (ops::WAIT, Plan),
        (ops::ALL_GATHER, Plan),
        (ops::REDUCE_SCATTER, Plan),
        (ops::BUCKET_PACK, Plan),
        (ops::UNPACK, Plan),
        (ops::UPDATE_BUCKET_VIEW, Cpu(identity)),
        // ----- fusion regions (`exec::region`) -----
        (ops::FUSION, Plan),
    ]
};

/// The entry of a canonical op name, if the table has one.
pub fn kernel_entry(canonical: &str) -> Option<KernelEntry> {
    static INDEX: OnceLock<HashMap<&'static str, KernelEntry>> = OnceLock::new();
    INDEX
        .get_or_init(|| KERNELS.iter().copied().collect())
        .get(canonical)
        .copied()
        // read as table ops when a trace is parsed, so never decoded from a parsed trace
        .or_else(|| {
            tracepass_ir::lowering::lowers_op(canonical)
                .then_some(KernelEntry::Unsupported { reason: LOWERED })
        })
}

/// Decodes a compute node: its op resolved to the op table's canonical name, then that name's
/// entry of [`KERNELS`]. `Err` says why the node cannot run (the caller adds where).
pub fn decode(trace: &Trace, node: &Node) -> Result<Decoded, String> {
    let spelled = node.op.as_str();
    // parsed nodes carry canonical names; a node built by hand may carry a spelling
    let op = OpRegistry::builtin().resolve(spelled).unwrap_or(spelled);
    let decoder = match kernel_entry(op) {
        Some(KernelEntry::Cpu(d)) => d,
        Some(KernelEntry::Plan) => {
            return Err(format!(
                "`{op}` is compiled by the plan compiler, not decoded to a kernel"
            ))
        }
        Some(KernelEntry::Unsupported { reason }) => {
            return Err(format!("no kernel for op `{op}`: {reason}"))
        }
        None => return Err(format!("no kernel for op `{op}`")),
    };
    let mut o = Ops::new(trace, node);
    let kernel = decoder(&mut o)?;
    Ok(Decoded {
        kernel,
        inputs: o.inputs,
        then: o.then,
    })
}

/// A node's operands, read positionally or by keyword; tensor operands are collected in order
/// (they become the kernel's `Side::Input`s).
pub struct Ops<'a> {
    trace: &'a Trace,
    node: &'a Node,
    inputs: Vec<ValueId>,
    /// A second kernel on the first one's output ([`Decoded::then`]).
    then: Option<Kernel>,
}

impl<'a> Ops<'a> {
    fn new(trace: &'a Trace, node: &'a Node) -> Ops<'a> {
        Ops {
            trace,
            node,
            inputs: Vec::new(),
            then: None,
        }
    }
    /// Operand `i`, or keyword `key`; `None` when absent or Python's `None`.
    fn arg(&self, i: usize, key: &str) -> Option<&Arg> {
        self.raw(i, key).filter(|a| !matches!(a, Arg::None))
    }
    /// Operand `i`, or keyword `key`, as written (`None` included).
    fn raw(&self, i: usize, key: &str) -> Option<&Arg> {
        self.node.args().get(i).or_else(|| self.node.kwarg(key))
    }
    fn tensor(&mut self, i: usize, key: &str) -> Result<(), String> {
        match self.arg(i, key) {
            Some(Arg::Value(v)) => {
                self.inputs.push(*v);
                Ok(())
            }
            other => Err(format!(
                "operand {i} (`{key}`) must be a tensor, got {other:?}"
            )),
        }
    }
    /// A tensor, or nothing when the operand is absent or `None`.
    fn opt_tensor(&mut self, i: usize, key: &str) -> Result<bool, String> {
        match self.arg(i, key) {
            None => Ok(false),
            Some(_) => self.tensor(i, key).map(|_| true),
        }
    }
    fn side(&mut self, i: usize, key: &str) -> Result<Side, String> {
        match self.arg(i, key) {
            Some(Arg::Value(v)) => {
                self.inputs.push(*v);
                Ok(Side::Input(self.inputs.len() - 1))
            }
            Some(a) => a
                .as_f64()
                .map(Side::Scalar)
                .ok_or_else(|| format!("operand {i} (`{key}`) is {a:?}, not a tensor or number")),
            None => Err(format!("operand {i} (`{key}`) is missing")),
        }
    }
    fn ints(&self, i: usize, key: &str) -> Result<Option<Vec<i64>>, String> {
        self.arg(i, key)
            .map(|a| {
                a.as_int_list()
                    .ok_or_else(|| format!("operand {i} (`{key}`) must be ints, got {a:?}"))
            })
            .transpose()
    }
    fn ints_or(&self, i: usize, key: &str, default: &[i64]) -> Result<Vec<i64>, String> {
        Ok(self.ints(i, key)?.unwrap_or_else(|| default.to_vec()))
    }
    /// Ints given as one sequence at `i` or spread over the operands from `i` on
    /// (`permute(x, 1, 0)` and `permute(x, (1, 0))`).
    fn int_varargs(&self, i: usize, key: &str) -> Result<Option<Vec<i64>>, String> {
        let args = self.node.args();
        if args.len() > i + 1 {
            args[i..]
                .iter()
                .map(|a| {
                    a.as_int()
                        .ok_or_else(|| format!("operand {a:?} (`{key}`) is not an int"))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some)
        } else {
            self.ints(i, key)
        }
    }
    fn int(&self, i: usize, key: &str) -> Result<Option<i64>, String> {
        self.arg(i, key)
            .map(|a| {
                a.as_int()
                    .ok_or_else(|| format!("operand {i} (`{key}`) must be an int, got {a:?}"))
            })
            .transpose()
    }
    fn number(&self, i: usize, key: &str) -> Result<Option<f64>, String> {
        self.arg(i, key)
            .map(|a| {
                a.as_f64()
                    .ok_or_else(|| format!("operand {i} (`{key}`) must be a number, got {a:?}"))
            })
            .transpose()
    }
    fn flag(&self, i: usize, key: &str) -> Result<bool, String> {
        self.flag_or(i, key, false)
    }
    /// A bool operand, `default` when absent or `None`.
    fn flag_or(&self, i: usize, key: &str, default: bool) -> Result<bool, String> {
        match self.arg(i, key) {
            None => Ok(default),
            Some(Arg::Bool(b)) => Ok(*b),
            Some(a) => Err(format!("operand {i} (`{key}`) must be a bool, got {a:?}")),
        }
    }
    fn out(&self, k: usize) -> Result<&tracepass_ir::TensorType, String> {
        let v = self
            .node
            .outputs()
            .get(k)
            .ok_or_else(|| format!("the node has no output {k}"))?;
        self.trace
            .ty(*v)
            .and_then(|t| t.as_tensor())
            .ok_or_else(|| format!("output `{}` is not a tensor", self.trace.name(*v)))
    }
    /// The type of the kernel's input `input` (a tensor operand already read).
    fn in_type(&self, input: usize) -> Result<&tracepass_ir::TensorType, String> {
        let v = self.inputs[input];
        self.trace
            .ty(v)
            .and_then(|t| t.as_tensor())
            .ok_or_else(|| format!("`{}` is not a tensor", self.trace.name(v)))
    }
    fn in_shape(&self, input: usize) -> Result<Vec<usize>, String> {
        self.in_type(input).map(|t| t.shape.to_vec())
    }
}

/// A dimension in `0..rank`; a scalar (rank 0) takes dimension 0 or -1.
fn norm_dim(d: i64, rank: usize) -> Result<usize, String> {
    let r = rank.max(1) as i64;
    let n = if d < 0 { d + r } else { d };
    if n < 0 || n >= r {
        return Err(format!("dimension {d} is out of range for rank {rank}"));
    }
    Ok(n as usize)
}

// ----- elementwise -----

fn unary(o: &mut Ops<'_>, op: UnaryOp) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    Ok(Kernel::Unary(op))
}

/// `polygamma(n, a)`: the kernels compute n = 0 (digamma) and n = 1 (trigamma).
fn polygamma(o: &mut Ops<'_>) -> Result<Kernel, String> {
    let n = match o.arg(0, "n") {
        Some(Arg::Int(n)) => *n,
        other => {
            return Err(format!(
                "polygamma's order must be a literal int, not {other:?}"
            ))
        }
    };
    o.tensor(1, "a")?;
    match n {
        0 => Ok(Kernel::Unary(UnaryOp::Digamma)),
        1 => Ok(Kernel::Unary(UnaryOp::Trigamma)),
        n => Err(format!(
            "polygamma of order {n}: the kernels compute orders 0 and 1"
        )),
    }
}

/// An activation `f(a, inplace=False)`: the out-of-place form only.
fn activation(o: &mut Ops<'_>, op: UnaryOp) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    if o.flag(1, "inplace")? {
        return Err(format!("in-place {op:?} is not supported"));
    }
    Ok(Kernel::Unary(op))
}

/// `leaky_relu(a, negative_slope=0.01, inplace=False)`, `elu(a, alpha=1.0, inplace=False)`,
/// `celu(a, alpha=1.0, inplace=False)` and `hardtanh(a, min_val=-1.0, max_val=1.0,
/// inplace=False)` of a float tensor, out of place. PyTorch refuses `celu` with alpha 0 and
/// `hardtanh` with `min_val > max_val`; so does the decoder.
fn param_activation(o: &mut Ops<'_>, name: &str) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    let dtype = o.in_type(0)?.dtype;
    if !matches!(dtype, DType::F32 | DType::F64 | DType::BF16 | DType::F16) {
        return Err(format!(
            "{name} of a {dtype} tensor is not supported (PyTorch computes it on floats)"
        ));
    }
    let out = o.out(0)?.dtype;
    if out != dtype {
        return Err(format!(
            "{name} of a {dtype} tensor into {out} is not supported"
        ));
    }
    let number = |o: &Ops<'_>, i: usize, key: &str, default: f64| -> Result<f64, String> {
        let v = o
            .number(i, key)
            .map_err(|e| format!("{name}: {e}"))?
            .unwrap_or(default);
        if v.is_nan() {
            return Err(format!("{name}: `{key}` is NaN"));
        }
        Ok(v)
    };
    let (act, inplace_at) = match name {
        "leaky_relu" => (
            Activation::LeakyRelu {
                slope: number(o, 1, "negative_slope", 0.01)?,
            },
            2,
        ),
        "elu" => (
            Activation::Elu {
                alpha: number(o, 1, "alpha", 1.0)?,
            },
            2,
        ),
        "celu" => {
            let alpha = number(o, 1, "alpha", 1.0)?;
            if alpha == 0.0 {
                return Err("celu: `alpha` cannot be 0".into());
            }
            (Activation::Celu { alpha }, 2)
        }
        "hardtanh" => {
            let min = number(o, 1, "min_val", -1.0)?;
            let max = number(o, 2, "max_val", 1.0)?;
            if min > max {
                return Err(format!(
                    "hardtanh: `min_val` {min} is greater than `max_val` {max}"
                ));
            }
            (Activation::Hardtanh { min, max }, 3)
        }
        other => return Err(format!("no parametrized activation `{other}`")),
    };
    if o.flag(inplace_at, "inplace")? {
        return Err(format!("in-place {name} is not supported"));
    }
    Ok(Kernel::Activation(act))
}

/// `softplus(a, beta=1.0, threshold=20.0)`: PyTorch's defaults only.
fn softplus(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    let beta = o.number(1, "beta")?.unwrap_or(1.0);
    let threshold = o.number(2, "threshold")?.unwrap_or(20.0);
    if beta != 1.0 || threshold != 20.0 {
        return Err(format!(
            "softplus with beta {beta} and threshold {threshold} is not supported (only 1 and 20)"
        ));
    }
    Ok(Kernel::Unary(UnaryOp::Softplus))
}

/// `clamp(a, min=None, max=None)`: `maximum(a, min)`, then `minimum(_, max)` on its output
/// (`Decoded::then`, which reads only that output: with both bounds, the upper one must be a
/// number).
fn clamp(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    let bound = |op, b| Kernel::Binary {
        op,
        a: Side::Input(0),
        b,
        alpha: 1.0,
    };
    let has_min = o.arg(1, "min").is_some();
    let has_max = o.arg(2, "max").is_some();
    match (has_min, has_max) {
        (true, true) => {
            let lo = o.side(1, "min")?;
            match o.side(2, "max")? {
                Side::Scalar(hi) => {
                    o.then = Some(bound(BinaryOp::Minimum, Side::Scalar(hi)));
                    Ok(bound(BinaryOp::Maximum, lo))
                }
                // `then` reads only the first kernel's output: a tensor max needs the composite
                hi => Ok(Kernel::Clamp {
                    min: lo,
                    max: hi,
                    dtype: o.out(0)?.dtype,
                }),
            }
        }
        (true, false) => Ok(bound(BinaryOp::Maximum, o.side(1, "min")?)),
        (false, true) => Ok(bound(BinaryOp::Minimum, o.side(2, "max")?)),
        (false, false) => Err("clamp needs a min or a max".into()),
    }
}

/// `relu(a, inplace=False)`.
fn relu(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    if o.flag(1, "inplace")? {
        return Err("in-place relu is not supported".into());
    }
    Ok(Kernel::Unary(UnaryOp::Relu))
}

/// `gelu(a, approximate='none')`.
fn gelu(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    match o.arg(1, "approximate").and_then(Arg::as_str) {
        None | Some("none") => Ok(Kernel::Unary(UnaryOp::Gelu)),
        Some("tanh") => Ok(Kernel::Unary(UnaryOp::GeluTanh)),
        Some(other) => Err(format!("gelu approximation '{other}' is not supported")),
    }
}

fn silu(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    if o.flag(1, "inplace")? {
        return Err("in-place silu is not supported".into());
    }
    Ok(Kernel::Silu)
}

/// `logical_not(a)`: `a == 0`, a bool tensor.
fn logical_not(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    Ok(Kernel::Compare {
        op: CompareOp::Eq,
        a: Side::Input(0),
        b: Side::Scalar(0.0),
    })
}

/// `isnan(a)`: `a != a`, true exactly where `a` is NaN.
fn isnan(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    Ok(Kernel::Compare {
        op: CompareOp::Ne,
        a: Side::Input(0),
        b: Side::Input(0),
    })
}

/// `isinf(a)` (`inf`) or `isfinite(a)`: `abs(a) == inf` or `abs(a) < inf` (NaN is neither)
/// for floats; integers and bools are never infinite, so a filled bool tensor.
fn float_class(o: &mut Ops<'_>, inf: bool) -> Result<Kernel, String> {
    let v = match o.arg(0, "a") {
        Some(Arg::Value(v)) => *v,
        other => return Err(format!("operand 0 (`a`) must be a tensor, got {other:?}")),
    };
    let t = o
        .trace
        .ty(v)
        .and_then(|t| t.as_tensor())
        .ok_or("operand 0 (`a`) is not a tensor")?;
    if !t.dtype.is_float() {
        return Ok(Kernel::Full {
            shape: t.shape.to_vec(),
            value: if inf { 0.0 } else { 1.0 },
            dtype: DType::Bool,
        });
    }
    o.tensor(0, "a")?;
    o.then = Some(Kernel::Compare {
        op: if inf { CompareOp::Eq } else { CompareOp::Lt },
        a: Side::Input(0),
        b: Side::Scalar(f64::INFINITY),
    });
    Ok(Kernel::Unary(UnaryOp::Abs))
}

/// `view(a, *shape)`, or `view(a, dtype)`, which is `bitcast(a, dtype)`.
fn view(o: &mut Ops<'_>) -> Result<Kernel, String> {
    match o.arg(1, "shape") {
        Some(Arg::DType(..)) => bitcast(o),
        _ => reshape(o),
    }
}

/// `bitcast(a, dtype)`: to its own dtype it is the identity; between dtypes of one width the
/// kernels have no reinterpretation.
fn bitcast(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    let from = o
        .arg(0, "a")
        .and_then(Arg::as_value)
        .and_then(|v| o.trace.ty(v))
        .and_then(|t| t.as_tensor())
        .map(|t| t.dtype)
        .ok_or("operand 0 (`a`) is not a tensor")?;
    let to = o.out(0)?.dtype;
    if from == to {
        Ok(Kernel::Identity)
    } else {
        Err(format!(
            "bitcast from {from} to {to}: the kernels do not reinterpret bits between dtypes"
        ))
    }
}

/// `signbit(a)`: `atan2(a, -1) < 0`, which is true exactly for a set sign bit of a number
/// (-0.0 and -inf included; NaN gives false, as PyTorch's for the NaN it makes); an integer's
/// is `a < 0`.
fn signbit(o: &mut Ops<'_>) -> Result<Kernel, String> {
    let v = match o.arg(0, "a") {
        Some(Arg::Value(v)) => *v,
        other => return Err(format!("operand 0 (`a`) must be a tensor, got {other:?}")),
    };
    let float = o
        .trace
        .ty(v)
        .and_then(|t| t.as_tensor())
        .ok_or("operand 0 (`a`) is not a tensor")?
        .dtype
        .is_float();
    o.tensor(0, "a")?;
    let negative = Kernel::Compare {
        op: CompareOp::Lt,
        a: Side::Input(0),
        b: Side::Scalar(0.0),
    };
    if !float {
        return Ok(negative);
    }
    o.then = Some(negative);
    Ok(Kernel::Binary {
        op: BinaryOp::Atan2,
        a: Side::Input(0),
        b: Side::Scalar(-1.0),
        alpha: 1.0,
    })
}

/// `bitwise_and/or/xor(a, b)` into the output's dtype, or `logical_and/or/xor(a, b)`.
fn bitwise(o: &mut Ops<'_>, op: BitOp, logical: bool) -> Result<Kernel, String> {
    let a = o.side(0, "a")?;
    let b = o.side(1, "b")?;
    if matches!((a, b), (Side::Scalar(_), Side::Scalar(_))) {
        return Err("both operands are numbers".into());
    }
    Ok(Kernel::Bitwise {
        op,
        a,
        b,
        logical,
        dtype: o.out(0)?.dtype,
    })
}

/// `bitwise_left_shift/bitwise_right_shift(a, b)` into the output's dtype.
fn shift(o: &mut Ops<'_>, left: bool) -> Result<Kernel, String> {
    let a = o.side(0, "a")?;
    let b = o.side(1, "b")?;
    if matches!((a, b), (Side::Scalar(_), Side::Scalar(_))) {
        return Err("both operands are numbers".into());
    }
    Ok(Kernel::Shift {
        left,
        a,
        b,
        dtype: o.out(0)?.dtype,
    })
}

/// `ldexp(a, b)` of two tensors, into the output's float dtype.
fn ldexp(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    o.tensor(1, "b")?;
    Ok(Kernel::Ldexp {
        dtype: o.out(0)?.dtype,
    })
}

/// `addcmul(a, b, c, *, value=1)` of integer tensors.
fn addcmul(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    o.tensor(1, "b")?;
    o.tensor(2, "c")?;
    Ok(Kernel::Addcmul {
        value: o.number(3, "value")?.unwrap_or(1.0),
        dtype: o.out(0)?.dtype,
    })
}

/// `bitwise_not(a)`.
fn bitwise_not(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    Ok(Kernel::BitwiseNot)
}

/// `op(a, b)`, and `add`/`sub` with `alpha` (`a op alpha * b`).
fn binary(o: &mut Ops<'_>, op: BinaryOp) -> Result<Kernel, String> {
    if let Some(mode) = o.node.kwarg("rounding_mode") {
        if !matches!(mode, Arg::None) {
            return Err(format!("div with rounding_mode {mode:?} is not supported"));
        }
    }
    let a = o.side(0, "a")?;
    let b = o.side(1, "b")?;
    if matches!((a, b), (Side::Scalar(_), Side::Scalar(_))) {
        return Err("both operands are numbers; nothing to compute on a tensor".into());
    }
    let alpha = if matches!(op, BinaryOp::Add | BinaryOp::Sub) {
        o.number(2, "alpha")?.unwrap_or(1.0)
    } else {
        1.0
    };
    Ok(Kernel::Binary { op, a, b, alpha })
}

/// Thunder's `prims.div`: true division of floats, and of integers the quotient rounded toward
/// zero (its torch executor calls `div(rounding_mode="trunc")` there).
fn prims_div(o: &mut Ops<'_>) -> Result<Kernel, String> {
    if o.out(0)?.dtype.is_float() {
        return binary(o, BinaryOp::Div);
    }
    let a = o.side(0, "a")?;
    let b = o.side(1, "b")?;
    if matches!((a, b), (Side::Scalar(_), Side::Scalar(_))) {
        return Err("both operands are numbers; nothing to compute on a tensor".into());
    }
    Ok(Kernel::TruncDivide { a, b })
}

fn compare(o: &mut Ops<'_>, op: CompareOp) -> Result<Kernel, String> {
    let a = o.side(0, "a")?;
    let b = o.side(1, "b")?;
    if matches!((a, b), (Side::Scalar(_), Side::Scalar(_))) {
        return Err("both operands are numbers".into());
    }
    Ok(Kernel::Compare { op, a, b })
}

/// `where(pred, a, b)`: the output's dtype is the operands' promotion.
fn where_(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "pred")?;
    if o.arg(1, "a").is_none() && o.arg(2, "b").is_none() {
        return Err(
            "where(condition) alone (the indices of true elements) is not supported".into(),
        );
    }
    let a = o.side(1, "a")?;
    let b = o.side(2, "b")?;
    Ok(Kernel::Where {
        a,
        b,
        dtype: o.out(0)?.dtype,
    })
}

/// `masked_fill(a, mask, value)`: `where(mask, value, a)`, keeping `a`'s dtype.
fn masked_fill(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(1, "mask")?;
    let value = o.side(2, "value")?;
    let a = o.side(0, "a")?;
    if !matches!(a, Side::Input(_)) {
        return Err("masked_fill fills a tensor, got a number".into());
    }
    Ok(Kernel::Where {
        a: value,
        b: a,
        dtype: o.out(0)?.dtype,
    })
}

// ----- linear algebra and convolution -----

fn matmul(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    o.tensor(1, "b")?;
    Ok(Kernel::Matmul)
}

/// `linear(a, w, bias=None)`.
fn linear(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    o.tensor(1, "w")?;
    let bias = o.opt_tensor(2, "bias")?;
    Ok(Kernel::Linear { bias })
}

/// `convolution(a, weight, bias, stride, padding, dilation, transposed, output_padding, groups)`.
fn convolution(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    o.tensor(1, "weight")?;
    let bias = o.opt_tensor(2, "bias")?;
    if o.flag(6, "transposed")? {
        return Ok(Kernel::ConvTranspose {
            stride: o.ints_or(3, "stride", &[1])?,
            padding: o.ints_or(4, "padding", &[0])?,
            output_padding: o.ints_or(7, "output_padding", &[0])?,
            dilation: o.ints_or(5, "dilation", &[1])?,
            groups: o.int(8, "groups")?.unwrap_or(1),
            bias,
        });
    }
    if o.ints_or(7, "output_padding", &[0])?
        .iter()
        .any(|&p| p != 0)
    {
        return Err("output_padding applies only to transposed convolution".into());
    }
    Ok(Kernel::Convolution {
        stride: o.ints_or(3, "stride", &[1])?,
        padding: o.ints_or(4, "padding", &[0])?,
        dilation: o.ints_or(5, "dilation", &[1])?,
        groups: o.int(8, "groups")?.unwrap_or(1),
        bias,
    })
}

/// Thunder's backward of a `conv_transpose*d` it registered automatically:
/// `X_vjp(((args...), {kwargs}), g)`. The forward's operands are read as `forward` reads them;
/// the gradients computed are the ones the statement names (the input's, the weight's, the
/// bias's: the forward's first three operands), in that order.
fn conv_transpose_vjp(o: &mut Ops<'_>, forward: &'static str) -> Result<Kernel, String> {
    let node = o.node;
    let fwd = fallback_forward(node, forward)?;
    let mut f = Ops::new(o.trace, &fwd);
    let Kernel::ConvTranspose {
        stride,
        padding,
        output_padding,
        dilation,
        groups,
        bias,
    } = conv_transpose(&mut f)?
    else {
        return Err(format!("{forward} decodes to another kernel"));
    };
    let outputs = VjpOutputs {
        input: names_gradient(node, 0),
        weight: names_gradient(node, 1),
        bias: names_gradient(node, 2) && bias,
    };
    if outputs.count() != node.outputs().len() {
        return Err(format!(
            "the statement binds {} results; the gradients of {forward}'s input, weight and \
             bias it names are {}",
            node.outputs().len(),
            outputs.count()
        ));
    }
    let [x, w, ..] = f.inputs[..] else {
        return Err(format!("{forward} reads no input and weight"));
    };
    o.inputs.extend([x, w]);
    output_gradient(o, forward)?;
    Ok(Kernel::ConvTransposeVjp {
        stride,
        padding,
        output_padding,
        dilation,
        groups,
        outputs,
    })
}

/// The forward statement a fallback `X_vjp(((args...), {kwargs}), *grads)` differentiates,
/// rebuilt as a node of `forward`, so that op's own decoder reads its operands.
fn fallback_forward(node: &Node, forward: &'static str) -> Result<Node, String> {
    let saved = node.args().first().ok_or("no saved operands")?;
    let (args, kwargs) = fallback_call(saved)?;
    let mut fwd = Node::new(forward, args, Vec::new());
    fwd.set_kwargs(kwargs);
    Ok(fwd)
}

/// Whether a fallback statement names the gradient of the forward's operand `i` (a flat
/// tuple names every place).
fn names_gradient(node: &Node, i: usize) -> bool {
    match node.lhs_pattern() {
        Some(p) => matches!(p.get(i), Some(LhsSlot::Out)),
        None => i < node.outputs().len(),
    }
}

/// Whether the statement binds one result for each gradient `outputs` marks as named.
fn binds_named_gradients(node: &Node, outputs: &[bool], forward: &str) -> Result<(), String> {
    let count = outputs.iter().filter(|&&n| n).count();
    if count != node.outputs().len() {
        return Err(format!(
            "the statement binds {} results; the gradients of {forward}'s operands it names \
             are {count}",
            node.outputs().len()
        ));
    }
    Ok(())
}

/// Reads the gradient of a one-output forward: the fallback's operand 1, and its last.
fn output_gradient(o: &mut Ops<'_>, forward: &str) -> Result<(), String> {
    if o.node.args().len() != 2 {
        return Err(format!(
            "{forward} has one output, so one gradient follows its operands, not {}",
            o.node.args().len() - 1
        ));
    }
    o.tensor(1, "grad_output")
}

/// The backward of a fallback of a one-input, one-output op whose gradient is `grad` of the
/// kernel `decoder` reads from the forward (`pixel_shuffle`'s is `pixel_unshuffle`, `roll`'s a
/// roll back), on the output's gradient and, with `reads_input`, the forward's input: the
/// statement must name the input's gradient, and only it.
fn single_input_vjp(
    o: &mut Ops<'_>,
    forward: &'static str,
    decoder: Decoder,
    grad: fn(Kernel) -> Option<Kernel>,
    reads_input: bool,
) -> Result<Kernel, String> {
    let node = o.node;
    let fwd = fallback_forward(node, forward)?;
    let mut f = Ops::new(o.trace, &fwd);
    let kernel = grad(decoder(&mut f)?).ok_or_else(|| format!("{forward} has no such gradient"))?;
    if node.outputs().len() != 1 || !names_gradient(node, 0) {
        return Err(format!(
            "the statement binds {} results; only the gradient of {forward}'s input is computed",
            node.outputs().len()
        ));
    }
    output_gradient(o, forward)?;
    if reads_input {
        let x = *f
            .inputs
            .first()
            .ok_or_else(|| format!("{forward} reads no input"))?;
        o.inputs.push(x);
    }
    Ok(kernel)
}

/// A pixel shuffle's gradient: the inverse shuffle.
fn inverse_shuffle(k: Kernel) -> Option<Kernel> {
    match k {
        Kernel::PixelShuffle { factor, inverse } => Some(Kernel::PixelShuffle {
            factor,
            inverse: !inverse,
        }),
        _ => None,
    }
}

/// A roll's gradient: the roll back.
fn roll_back(k: Kernel) -> Option<Kernel> {
    match k {
        Kernel::Roll { shifts, dims } => Some(Kernel::Roll {
            shifts: shifts.iter().map(|s| s.wrapping_neg()).collect(),
            dims,
        }),
        _ => None,
    }
}

/// `torch.min` as Thunder prints it (registered automatically): the elementwise minimum of two
/// tensors, or the smallest element. `min(input, dim)` gives values and indices, which no
/// kernel gives together: refused.
fn torch_min(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "input")?;
    let other = o.arg(1, "other").cloned();
    match other {
        None => {
            let rank = o.in_shape(0)?.len();
            Ok(Kernel::Reduce {
                op: ReduceOp::Amin,
                dims: (0..rank).collect(),
                keepdim: false,
                dtype: o.out(0)?.dtype,
            })
        }
        Some(Arg::Value(_)) => {
            let b = o.side(1, "other")?;
            Ok(Kernel::Binary {
                op: BinaryOp::Minimum,
                a: Side::Input(0),
                b,
                alpha: 1.0,
            })
        }
        Some(_) => Err(
            "torch.min(input, dim) gives values and indices: no kernel computes the pair \
             (amin and argmin each run)"
                .into(),
        ),
    }
}

/// `adaptive_avg_pool1d(input, output_size)`.
fn adaptive_avg_pool1d(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "input")?;
    let out = *o.out(0)?.shape.last().ok_or("a 0-d output")?;
    Ok(Kernel::AdaptiveAvgPool1d { out })
}

/// `adaptive_max_pool1d/2d(input, output_size, return_indices=False)` of `dims` dimensions:
/// the output size the meta resolved (`None` entries included).
fn adaptive_max_pool(o: &mut Ops<'_>, dims: usize) -> Result<Kernel, String> {
    o.tensor(0, "input")?;
    if o.flag(2, "return_indices")? {
        return Err("adaptive max pooling with return_indices=True is not supported".into());
    }
    let shape = &o.out(0)?.shape;
    let out = shape
        .get(shape.len().saturating_sub(dims)..)
        .filter(|s| s.len() == dims)
        .ok_or("the pooled output has too few dimensions")?
        .to_vec();
    Ok(Kernel::AdaptiveMaxPool { out })
}

/// `channel_shuffle(input, groups)`.
fn channel_shuffle(o: &mut Ops<'_>, inverse: bool) -> Result<Kernel, String> {
    o.tensor(0, "input")?;
    let groups = o.int(1, "groups")?.ok_or("`groups` is missing")?;
    Ok(Kernel::ChannelShuffle {
        groups: usize::try_from(groups)
            .ok()
            .filter(|g| *g >= 1)
            .ok_or_else(|| format!("`groups` {groups} must be positive"))?,
        inverse,
    })
}

/// A channel shuffle's gradient: the shuffle back.
fn inverse_channel_shuffle(k: Kernel) -> Option<Kernel> {
    match k {
        Kernel::ChannelShuffle { groups, inverse } => Some(Kernel::ChannelShuffle {
            groups,
            inverse: !inverse,
        }),
        _ => None,
    }
}

/// `clamp_min(a, min)` (`maximum`) or, with `upper`, `clamp_max(a, max)` (`minimum`); the
/// bound a number or a tensor.
fn clamp_bound(o: &mut Ops<'_>, upper: bool) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    let (op, key) = if upper {
        (BinaryOp::Minimum, "max")
    } else {
        (BinaryOp::Maximum, "min")
    };
    Ok(Kernel::Binary {
        op,
        a: Side::Input(0),
        b: o.side(1, key)?,
        alpha: 1.0,
    })
}

/// Thunder's `clamp_min_vjp` / `clamp_max_vjp` of a number bound: the input's gradient only. A
/// tensor bound would get a gradient too, which is not computed: refused.
fn clamp_bound_vjp(o: &mut Ops<'_>, forward: &'static str, upper: bool) -> Result<Kernel, String> {
    let node = o.node;
    let fwd = fallback_forward(node, forward)?;
    let mut f = Ops::new(o.trace, &fwd);
    let Kernel::Binary {
        b: Side::Scalar(bound),
        ..
    } = clamp_bound(&mut f, upper)?
    else {
        return Err(format!(
            "{forward} with a tensor bound: the bound's gradient is not computed"
        ));
    };
    if node.outputs().len() != 1 || !names_gradient(node, 0) {
        return Err(format!(
            "the statement binds {} results; only the gradient of {forward}'s input is computed",
            node.outputs().len()
        ));
    }
    output_gradient(o, forward)?;
    let x = *f
        .inputs
        .first()
        .ok_or_else(|| format!("{forward} reads no input"))?;
    o.inputs.push(x);
    Ok(Kernel::ClampBoundBackward { bound, upper })
}

/// Thunder's `detach_vjp`: the output does not depend on the input, so PyTorch's `vjp` gives
/// the input zeros.
fn detach_vjp(o: &mut Ops<'_>) -> Result<Kernel, String> {
    let node = o.node;
    let fwd = fallback_forward(node, "ltorch.detach")?;
    Ops::new(o.trace, &fwd).tensor(0, "a")?;
    if node.outputs().len() != 1 || !names_gradient(node, 0) {
        return Err(format!(
            "the statement binds {} results; detach has one input",
            node.outputs().len()
        ));
    }
    output_gradient(o, "ltorch.detach")?;
    // the gradient is read (the statement's operand) but does not change the zeros
    o.inputs.clear();
    filled(o, 0.0)
}

/// The window of `unfold(input, kernel_size, dilation=1, padding=0, stride=1)`, its operands
/// from `first` on (`fold` has the output size before them).
fn window2d(o: &Ops<'_>, first: usize) -> Result<Window2d, String> {
    let pair =
        |i: usize, key: &str, default: Option<i64>, min: i64| -> Result<[usize; 2], String> {
            let v = match (o.ints(i, key)?, default) {
                (Some(v), _) => v,
                (None, Some(d)) => vec![d],
                (None, None) => return Err(format!("`{key}` is missing")),
            };
            let v: Vec<usize> = v
                .iter()
                .map(|&x| usize::try_from(x).ok().filter(|&x| x as i64 >= min))
                .collect::<Option<_>>()
                .ok_or_else(|| format!("`{key}` {v:?} must be at least {min}"))?;
            match v[..] {
                [a] => Ok([a, a]),
                [a, b] => Ok([a, b]),
                _ => Err(format!("`{key}` {v:?} needs one or two entries")),
            }
        };
    Ok(Window2d {
        kernel: pair(first, "kernel_size", None, 1)?,
        dilation: pair(first + 1, "dilation", Some(1), 1)?,
        padding: pair(first + 2, "padding", Some(0), 0)?,
        stride: pair(first + 3, "stride", Some(1), 1)?,
    })
}

/// `unfold(input, kernel_size, dilation=1, padding=0, stride=1)` (im2col).
fn im2col(o: &mut Ops<'_>) -> Result<Window2d, String> {
    o.tensor(0, "input")?;
    window2d(o, 1)
}

/// `fold(input, output_size, kernel_size, dilation=1, padding=0, stride=1)` (col2im).
fn col2im(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "input")?;
    let output = match o.ints(1, "output_size")?.as_deref() {
        Some(&[a]) => [a, a],
        Some(&[a, b]) => [a, b],
        other => return Err(format!("`output_size` {other:?} needs one or two entries")),
    };
    let output = output
        .map(|x| usize::try_from(x).ok().filter(|&x| x >= 1))
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| format!("`output_size` {output:?} must be positive"))?;
    Ok(Kernel::Col2Im {
        output: [output[0], output[1]],
        window: window2d(o, 2)?,
    })
}

/// A fold's gradient: the unfold of the output's gradient by the same window.
fn fold_grad(k: Kernel) -> Option<Kernel> {
    match k {
        Kernel::Col2Im { window, .. } => Some(Kernel::Im2Col(window)),
        _ => None,
    }
}

/// Thunder's `unfold_vjp`: the fold of the output's gradient back to the input's plane.
fn im2col_vjp(o: &mut Ops<'_>) -> Result<Kernel, String> {
    const FORWARD: &str = "ltorch.unfold_im2col";
    let node = o.node;
    let fwd = fallback_forward(node, FORWARD)?;
    let mut f = Ops::new(o.trace, &fwd);
    let window = im2col(&mut f)?;
    let shape = f.in_shape(0)?;
    let output = match shape[..] {
        [.., h, w] if (3..=4).contains(&shape.len()) => [h, w],
        _ => return Err(format!("unfold of a {}-d input", shape.len())),
    };
    if node.outputs().len() != 1 || !names_gradient(node, 0) {
        return Err(format!(
            "the statement binds {} results; only the gradient of unfold's input is computed",
            node.outputs().len()
        ));
    }
    output_gradient(o, FORWARD)?;
    Ok(Kernel::Col2Im { output, window })
}

/// `cosine_similarity(x1, x2, dim=1, eps=1e-8)`: `dim` of the operands' broadcast rank.
fn cosine_similarity(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "x1")?;
    o.tensor(1, "x2")?;
    let rank = o.in_shape(0)?.len().max(o.in_shape(1)?.len());
    let dim = o.int(2, "dim")?.unwrap_or(1);
    let eps = o.number(3, "eps")?.unwrap_or(1e-8);
    Ok(Kernel::CosineSimilarity {
        dim: norm_dim(dim, rank)?,
        eps,
    })
}

/// Thunder's `cosine_similarity_vjp`: the gradients of `x1` and `x2` the statement names.
fn cosine_similarity_vjp(o: &mut Ops<'_>) -> Result<Kernel, String> {
    const FORWARD: &str = "ltorch.cosine_similarity";
    let node = o.node;
    let fwd = fallback_forward(node, FORWARD)?;
    let mut f = Ops::new(o.trace, &fwd);
    let Kernel::CosineSimilarity { dim, eps } = cosine_similarity(&mut f)? else {
        return Err(format!("{FORWARD} decodes to another kernel"));
    };
    let outputs = [0, 1].map(|i| names_gradient(node, i));
    binds_named_gradients(node, &outputs, FORWARD)?;
    let [a, b, ..] = f.inputs[..] else {
        return Err(format!("{FORWARD} reads no two inputs"));
    };
    o.inputs.extend([a, b]);
    output_gradient(o, FORWARD)?;
    Ok(Kernel::CosineSimilarityVjp { dim, eps, outputs })
}

/// The pointwise losses (`exec/pointwise_loss.rs`): `input, target`, then by op
/// `binary_cross_entropy_with_logits(.., weight, size_average, reduce, reduction, pos_weight)`,
/// `binary_cross_entropy(.., weight, size_average, reduce, reduction)`,
/// `l1_loss(.., size_average, reduce, reduction, weight)`,
/// `smooth_l1_loss(.., size_average, reduce, reduction, beta)`,
/// `huber_loss(.., reduction, delta, weight)`,
/// `kl_div(.., size_average, reduce, reduction, log_target)`. A weight of `l1_loss`/`huber_loss` is refused.
fn pointwise_loss(o: &mut Ops<'_>) -> Result<Kernel, String> {
    use crate::exec::kernel::PointwiseLossKind as K;
    let op = o.node.op.as_str();
    let op = OpRegistry::builtin().resolve(op).unwrap_or(op);
    o.tensor(0, "input")?;
    o.tensor(1, "target")?;
    let (kind, reduction_at) = match op {
        "ltorch.binary_cross_entropy_with_logits" => (K::BceWithLogits, 5),
        "ltorch.binary_cross_entropy" => (K::Bce, 5),
        "ltorch.l1_loss" => (K::L1, 4),
        "ltorch.smooth_l1_loss" => {
            let beta = o.number(5, "beta")?.unwrap_or(1.0);
            if beta < 0.0 {
                return Err(format!("smooth_l1_loss: beta {beta} must not be negative"));
            }
            (K::SmoothL1 { beta }, 4)
        }
        "ltorch.huber_loss" => {
            let delta = o.number(3, "delta")?.unwrap_or(1.0);
            if delta <= 0.0 {
                return Err(format!("huber_loss: delta {delta} must be positive"));
            }
            (K::Huber { delta }, 2)
        }
        "ltorch.kl_div" => {
            let log_target = o.flag(5, "log_target")?;
            let batchmean = o
                .arg(4, "reduction")
                .and_then(Arg::as_str)
                .is_some_and(|r| r == "batchmean");
            (
                K::KlDiv {
                    log_target,
                    batchmean,
                },
                4,
            )
        }
        other => return Err(format!("`{other}` is not a pointwise loss")),
    };
    if reduction_at == 5 || reduction_at == 4 {
        for (i, key) in [
            (reduction_at - 2, "size_average"),
            (reduction_at - 1, "reduce"),
        ] {
            if o.arg(i, key).is_some() {
                return Err(format!(
                    "`{key}` is deprecated and not supported; use `reduction`"
                ));
            }
        }
    }
    let reduction = match o.arg(reduction_at, "reduction") {
        None => LossReduction::Mean,
        // the sum, which the kind divides by the batch size
        Some(a)
            if matches!(
                kind,
                K::KlDiv {
                    batchmean: true,
                    ..
                }
            ) && a.as_str().is_some() =>
        {
            LossReduction::Sum
        }
        Some(a) => {
            let s = a.as_str().ok_or("reduction must be a string")?;
            LossReduction::parse(s).ok_or_else(|| format!("unknown reduction `{s}`"))?
        }
    };
    let weight = match kind {
        K::BceWithLogits | K::Bce => o.opt_tensor(2, "weight")?,
        K::L1 | K::Huber { .. } => {
            let at = if kind == K::L1 { 5 } else { 4 };
            if o.arg(at, "weight").is_some() {
                return Err(format!("{op}: a weight is not supported"));
            }
            false
        }
        K::SmoothL1 { .. } | K::KlDiv { .. } => false,
    };
    let pos_weight = kind == K::BceWithLogits && o.opt_tensor(6, "pos_weight")?;
    Ok(Kernel::PointwiseLoss {
        kind,
        reduction,
        weight,
        pos_weight,
    })
}

/// Thunder's `*_vjp` of a pointwise loss: the gradients of the input and target the statement
/// names.
fn pointwise_loss_vjp(o: &mut Ops<'_>) -> Result<Kernel, String> {
    let node = o.node;
    let vjp = node.op.as_str();
    let vjp = OpRegistry::builtin().resolve(vjp).unwrap_or(vjp);
    let forward: &'static str = match vjp {
        "ltorch.binary_cross_entropy_with_logits_vjp" => "ltorch.binary_cross_entropy_with_logits",
        "ltorch.binary_cross_entropy_vjp" => "ltorch.binary_cross_entropy",
        "ltorch.l1_loss_vjp" => "ltorch.l1_loss",
        "ltorch.smooth_l1_loss_vjp" => "ltorch.smooth_l1_loss",
        "ltorch.huber_loss_vjp" => "ltorch.huber_loss",
        "ltorch.kl_div_vjp" => "ltorch.kl_div",
        other => return Err(format!("`{other}` is not a pointwise loss's vjp")),
    };
    let fwd = fallback_forward(node, forward)?;
    let mut f = Ops::new(o.trace, &fwd);
    let Kernel::PointwiseLoss {
        kind,
        reduction,
        weight,
        pos_weight,
    } = pointwise_loss(&mut f)?
    else {
        return Err(format!("{forward} decodes to another kernel"));
    };
    // PyTorch differentiates neither weight (Thunder's fallback fails on a weight tensor)
    for (i, key) in [(2, "weight"), (6, "pos_weight")] {
        if names_gradient(node, i) {
            return Err(format!(
                "{forward} is not differentiable with respect to `{key}` (PyTorch's rule)"
            ));
        }
    }
    let outputs = [0, 1].map(|i| names_gradient(node, i));
    binds_named_gradients(node, &outputs, forward)?;
    o.inputs.extend(f.inputs.iter().copied());
    output_gradient(o, forward)?;
    Ok(Kernel::PointwiseLossVjp {
        kind,
        reduction,
        weight,
        pos_weight,
        outputs,
    })
}

/// `logaddexp(a, b)` / `hypot(a, b)`: two floating tensors of one dtype (`exec/binary_fallback.rs`).
fn binary_fallback(o: &mut Ops<'_>, op: BinaryFallbackOp) -> Result<Kernel, String> {
    o.tensor(0, "input")?;
    o.tensor(1, "other")?;
    let (a, b) = (o.in_type(0)?.dtype, o.in_type(1)?.dtype);
    if a != b || !a.is_float() {
        return Err(format!(
            "operands {a} and {b} must be floating tensors of one dtype"
        ));
    }
    Ok(Kernel::BinaryFallback(op))
}

/// Thunder's `logaddexp_vjp`/`hypot_vjp`: the gradients of `a` and `b` the statement names.
fn binary_fallback_vjp(
    o: &mut Ops<'_>,
    forward: &'static str,
    op: BinaryFallbackOp,
) -> Result<Kernel, String> {
    let node = o.node;
    let fwd = fallback_forward(node, forward)?;
    let mut f = Ops::new(o.trace, &fwd);
    binary_fallback(&mut f, op)?;
    let outputs = [0, 1].map(|i| names_gradient(node, i));
    binds_named_gradients(node, &outputs, forward)?;
    o.inputs.extend(f.inputs.iter().copied());
    output_gradient(o, forward)?;
    Ok(Kernel::BinaryFallbackVjp { op, outputs })
}

/// `bilinear(input1, input2, weight, bias=None)`.
fn bilinear(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "input1")?;
    o.tensor(1, "input2")?;
    o.tensor(2, "weight")?;
    let bias = o.opt_tensor(3, "bias")?;
    Ok(Kernel::Bilinear { bias })
}

/// Thunder's `bilinear_vjp`: the gradients the statement names (a bias's only when the
/// forward has one), from both inputs, the weight and the output's gradient.
fn bilinear_vjp(o: &mut Ops<'_>) -> Result<Kernel, String> {
    const FORWARD: &str = "ltorch.bilinear";
    let node = o.node;
    let fwd = fallback_forward(node, FORWARD)?;
    let mut f = Ops::new(o.trace, &fwd);
    let Kernel::Bilinear { bias } = bilinear(&mut f)? else {
        return Err(format!("{FORWARD} decodes to another kernel"));
    };
    let outputs = [0, 1, 2, 3].map(|i| names_gradient(node, i) && (i < 3 || bias));
    binds_named_gradients(node, &outputs, FORWARD)?;
    let [a, b, w, ..] = f.inputs[..] else {
        return Err(format!("{FORWARD} reads no inputs and weight"));
    };
    o.inputs.extend([a, b, w]);
    output_gradient(o, FORWARD)?;
    Ok(Kernel::BilinearVjp { outputs })
}

/// `triu(a, diagonal=0, *, fill_value=None)`, and `tril`.
fn triangle(o: &mut Ops<'_>, upper: bool) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    Ok(Kernel::Triangle {
        upper,
        diagonal: o.int(1, "diagonal")?.unwrap_or(0),
        // keyword-only
        fill: o.number(usize::MAX, "fill_value")?.unwrap_or(0.0),
    })
}

/// `one_hot(a, num_classes)`: the class count the meta resolved (the output's last size).
fn one_hot(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    let classes = *o.out(0)?.shape.last().ok_or("one_hot gives a 0-d tensor")?;
    Ok(Kernel::OneHot { classes })
}

/// `pixel_shuffle(input, upscale_factor)` and `pixel_unshuffle(input, downscale_factor)`.
fn pixel_shuffle(o: &mut Ops<'_>, inverse: bool) -> Result<Kernel, String> {
    o.tensor(0, "input")?;
    let key = if inverse {
        "downscale_factor"
    } else {
        "upscale_factor"
    };
    let factor = o
        .int(1, key)?
        .ok_or_else(|| format!("`{key}` is missing"))?;
    Ok(Kernel::PixelShuffle {
        factor: usize::try_from(factor)
            .ok()
            .filter(|f| *f >= 1)
            .ok_or_else(|| format!("`{key}` {factor} must be positive"))?,
        inverse,
    })
}

/// `roll(input, shifts, dims=None)`.
fn roll(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "input")?;
    let rank = o.in_shape(0)?.len();
    let shifts = o.ints(1, "shifts")?.ok_or("`shifts` is missing")?;
    let dims = o
        .ints(2, "dims")?
        .map(|dims| {
            dims.into_iter()
                .map(|d| norm_dim(d, rank))
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    match &dims {
        Some(d) if d.len() != shifts.len() => {
            return Err(format!("{} shifts for {} dims", shifts.len(), d.len()))
        }
        None if shifts.len() != 1 => return Err(format!("{} shifts without dims", shifts.len())),
        _ => {}
    }
    Ok(Kernel::Roll { shifts, dims })
}

/// `conv_transpose1d/2d/3d(a, weight, bias=None, stride=1, padding=0, output_padding=0,
/// groups=1, dilation=1)`.
fn conv_transpose(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    o.tensor(1, "weight")?;
    let bias = o.opt_tensor(2, "bias")?;
    Ok(Kernel::ConvTranspose {
        stride: o.ints_or(3, "stride", &[1])?,
        padding: o.ints_or(4, "padding", &[0])?,
        output_padding: o.ints_or(5, "output_padding", &[0])?,
        groups: o.int(6, "groups")?.unwrap_or(1),
        dilation: o.ints_or(7, "dilation", &[1])?,
        bias,
    })
}

/// `conv1d/conv2d/conv3d(a, weight, bias=None, stride=1, padding=0, dilation=1, groups=1)`.
fn conv_nd(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    o.tensor(1, "weight")?;
    let bias = o.opt_tensor(2, "bias")?;
    if let Some(Arg::Str(mode)) = o.arg(4, "padding") {
        return Err(format!(
            "convolution with padding='{mode}' is not supported (give the padding in numbers)"
        ));
    }
    Ok(Kernel::Convolution {
        stride: o.ints_or(3, "stride", &[1])?,
        padding: o.ints_or(4, "padding", &[0])?,
        dilation: o.ints_or(5, "dilation", &[1])?,
        groups: o.int(6, "groups")?.unwrap_or(1),
        bias,
    })
}

// ----- pooling and embedding -----

/// `max_pool2d_with_indices(a, kernel_size, stride=[], padding=0, dilation=1, ceil_mode=False)`.
fn max_pool2d(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    Ok(Kernel::MaxPool2d {
        kernel: o
            .ints(1, "kernel_size")?
            .ok_or("max_pool2d needs kernel_size")?,
        stride: o.ints_or(2, "stride", &[])?,
        padding: o.ints_or(3, "padding", &[0])?,
        dilation: o.ints_or(4, "dilation", &[1])?,
        ceil_mode: o.flag(5, "ceil_mode")?,
    })
}

/// `max_pool2d_with_indices_backward(grad, a, kernel_size, stride, padding, dilation,
/// ceil_mode, indices)`: the indices say where each gradient goes.
fn max_pool2d_backward(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "grad")?;
    o.tensor(1, "a")?;
    o.tensor(7, "result1")?;
    Ok(Kernel::MaxPool2dBackward)
}

/// `embedding(a, weight, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse)`.
fn embedding(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    o.tensor(1, "weight")?;
    if o.arg(3, "max_norm").is_some() {
        return Err("embedding with max_norm (an in-place renorm) is not supported".into());
    }
    Ok(Kernel::Embedding)
}

/// `adaptive_avg_pool2d(a, output_size)`. Where the output size divides the input's (global
/// average pooling, `output_size=1`, above all): the means of equal windows, as a reshape to
/// `[..., oh, kh, ow, kw]` then a mean over `kh` and `kw`; else the adaptive pooling kernel
/// (PyTorch's overlapping windows).
fn adaptive_avg_pool2d(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    let shape = o.in_shape(0)?;
    let r = shape.len();
    let out = match o.ints(1, "output_size")? {
        Some(v) if v.len() == 2 => v,
        Some(v) if v.len() == 1 => vec![v[0], v[0]],
        _ => {
            let n = o
                .int(1, "output_size")?
                .ok_or("adaptive_avg_pool2d needs an output size")?;
            vec![n, n]
        }
    };
    if r < 3 || out.iter().any(|&s| s < 0) {
        return Err(format!(
            "adaptive_avg_pool2d: input {shape:?} with output size {out:?}"
        ));
    }
    let (h, w) = (shape[r - 2], shape[r - 1]);
    let (oh, ow) = (out[0] as usize, out[1] as usize);
    // an output size of 0 (PyTorch allows it) gives an empty result: no windows to average
    if oh == 0 || ow == 0 || h % oh != 0 || w % ow != 0 {
        return Ok(Kernel::AdaptiveAvgPool2d { oh, ow });
    }
    let mut split = shape[..r - 2].to_vec();
    split.extend([oh, h / oh, ow, w / ow]);
    o.then = Some(Kernel::Reduce {
        op: ReduceOp::Mean,
        dims: vec![r - 1, r + 1],
        keepdim: false,
        dtype: o.out(0)?.dtype,
    });
    Ok(Kernel::Reshape(split))
}

/// `_adaptive_avg_pool2d_backward(grad, a)`. Of global average pooling (a 1x1 output): every
/// input element gets `grad / (H * W)`, a division and an expand; of any other output size,
/// the adaptive pooling backward kernel.
fn adaptive_avg_pool2d_backward(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "grad")?;
    let g = o.in_shape(0)?;
    let a = match o.arg(1, "a").and_then(Arg::as_value) {
        Some(v) => o
            .trace
            .ty(v)
            .and_then(|t| t.as_tensor())
            .map(|t| t.shape.to_vec())
            .ok_or("adaptive_avg_pool2d_backward: `a` is not a tensor")?,
        None => return Err("adaptive_avg_pool2d_backward needs the input `a`".into()),
    };
    let r = a.len();
    if g.len() != r || r < 3 || g[..r - 2] != a[..r - 2] {
        return Err(format!(
            "adaptive_avg_pool2d_backward: grad {g:?} does not pool input {a:?}"
        ));
    }
    if g[r - 2..] != [1, 1] {
        o.tensor(1, "a")?;
        return Ok(Kernel::AdaptiveAvgPool2dBackward);
    }
    o.then = Some(Kernel::Expand(a.iter().map(|&d| d as i64).collect()));
    Ok(Kernel::Binary {
        op: BinaryOp::Div,
        a: Side::Input(0),
        b: Side::Scalar((a[r - 2] * a[r - 1]) as f64),
        alpha: 1.0,
    })
}

/// `take_along_dim(a, indices, dim=None)`.
fn take_along_dim(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    o.tensor(1, "indices")?;
    let rank = o.in_shape(0)?.len();
    let dim = match o.int(2, "dim")? {
        Some(d) => Some(norm_dim(d, rank)?),
        None => None,
    };
    Ok(Kernel::TakeAlongDim { dim })
}

/// The dimension operand `i` (`dim`) of an op on `input`, normalized: negative counts from
/// the end.
fn dim_operand(o: &Ops<'_>, i: usize, input: usize, what: &str) -> Result<usize, String> {
    let rank = o.in_shape(input)?.len();
    let d = o
        .int(i, "dim")?
        .ok_or_else(|| format!("{what} needs a dim"))?;
    norm_dim(d, rank)
}

/// `gather(input, dim, index)`.
fn gather(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "input")?;
    o.tensor(2, "index")?;
    Ok(Kernel::Gather {
        dim: dim_operand(o, 1, 0, "gather")?,
    })
}

/// `scatter_add(a, dim, index, src)`.
fn scatter_add(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    o.tensor(2, "index")?;
    o.tensor(3, "src")?;
    Ok(Kernel::ScatterAdd {
        dim: dim_operand(o, 1, 0, "scatter_add")?,
    })
}

/// `index_select(a, dim, index)`.
fn index_select(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    o.tensor(2, "index")?;
    Ok(Kernel::IndexSelect {
        dim: dim_operand(o, 1, 0, "index_select")?,
    })
}

/// `index_add(a, dim, index, source)` (Thunder's symbol has no `alpha`).
fn index_add(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    o.tensor(2, "index")?;
    o.tensor(3, "source")?;
    Ok(Kernel::IndexAdd {
        dim: dim_operand(o, 1, 0, "index_add")?,
    })
}

/// The dimension of a sort or top-k at operand `i`: the last one when absent or `None`.
fn sort_dim(o: &Ops<'_>, i: usize) -> Result<usize, String> {
    let rank = o.in_shape(0)?.len();
    norm_dim(o.int(i, "dim")?.unwrap_or(-1), rank)
}

/// `sort(a, dim=None, descending=False, stable=False)` and `argsort` (`indices_only`), the same
/// operands. `stable` is read but changes nothing: the kernels always sort stably.
fn sort(o: &mut Ops<'_>, indices_only: bool) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    let dim = sort_dim(o, 1)?;
    let descending = o.flag(2, "descending")?;
    o.flag(3, "stable")?;
    Ok(if indices_only {
        Kernel::Argsort { dim, descending }
    } else {
        Kernel::Sort { dim, descending }
    })
}

/// `topk(a, k, dim=None, largest=True, sorted=True)`. The kernels always give sorted results:
/// PyTorch leaves the order of `sorted=False` unspecified.
fn topk(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    let shape = o.in_shape(0)?;
    let dim = sort_dim(o, 2)?;
    let k = o.int(1, "k")?.ok_or("topk needs k")?;
    let n = shape.get(dim).copied().unwrap_or(1);
    let k = usize::try_from(k)
        .ok()
        .filter(|k| *k <= n)
        .ok_or_else(|| format!("topk: k = {k} is out of range for dimension {dim} of {shape:?}"))?;
    let largest = o.flag_or(3, "largest", true)?;
    o.flag_or(4, "sorted", true)?;
    Ok(Kernel::Topk { k, dim, largest })
}

/// `nll_loss_backward(grad, a, target, weight, reduction, ignore_index, total_weight)`.
fn nll_loss_backward(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "grad")?;
    o.tensor(1, "a")?;
    o.tensor(2, "target")?;
    let reduction = match o.arg(4, "reduction") {
        Some(a) => {
            let s = a
                .as_str()
                .ok_or("nll_loss_backward: reduction must be a string")?;
            LossReduction::parse(s)
                .ok_or_else(|| format!("nll_loss_backward: unknown reduction `{s}`"))?
        }
        None => LossReduction::Mean,
    };
    // Thunder passes `None` for the total weight of an unreduced loss, which does not read
    // it: the gradient stands in for the operand
    let no_total = matches!(o.arg(6, "total_weight"), None | Some(Arg::None));
    if no_total && reduction != LossReduction::Mean {
        o.tensor(0, "grad")?;
    } else {
        o.tensor(6, "total_weight")?;
    }
    let weighted = o.opt_tensor(3, "weight")?;
    let ignore_index = o.int(5, "ignore_index")?.unwrap_or(-100);
    Ok(Kernel::NllLossBackward {
        reduction,
        ignore_index,
        weighted,
    })
}

/// `_log_softmax_backward_data(grad_output, output, dim, input_dtype)` and
/// `_softmax_backward_data(...)`.
fn softmax_backward(o: &mut Ops<'_>, log: bool) -> Result<Kernel, String> {
    o.tensor(0, "grad_output")?;
    o.tensor(1, "output")?;
    let rank = o.in_shape(0)?.len();
    let dim = o.int(2, "dim")?.ok_or("softmax backward needs a dim")?;
    Ok(Kernel::SoftmaxBackward {
        dim: norm_dim(dim, rank)?,
        log,
        dtype: o.out(0)?.dtype,
    })
}

/// `aten.embedding_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq,
/// sparse)`.
fn embedding_backward(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "grad")?;
    o.tensor(1, "indices")?;
    if o.flag(5, "sparse")? {
        return Err("sparse embedding gradients are not supported".into());
    }
    let num_weights = o
        .int(2, "num_weights")?
        .ok_or("embedding_backward needs num_weights")?;
    Ok(Kernel::EmbeddingBackward {
        num_weights: usize::try_from(num_weights)
            .map_err(|_| format!("num_weights {num_weights} is negative"))?,
        padding_idx: o.int(3, "padding_idx")?.unwrap_or(-1),
        scale_grad_by_freq: o.flag(4, "scale_grad_by_freq")?,
    })
}

// ----- reductions -----

/// `sum/mean/amax/amin/prod(a, dim=None, keepdim=False, *, dtype=None)` and the prims'
/// `(a, dims, *, output_dtype=None)`; the result's dtype is the output's.
fn reduce(o: &mut Ops<'_>, op: ReduceOp) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    let rank = o.in_shape(0)?.len();
    let dims = match o.arg(1, "dim").or_else(|| o.node.kwarg("dims")) {
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
    Ok(Kernel::Reduce {
        op,
        dims,
        keepdim: o.flag(2, "keepdim")?,
        dtype: o.out(0)?.dtype,
    })
}

/// `_grouped_mm(a, b, offsets=None, bias=None, dtype=None)`: the meta has refused a bias
/// and another result dtype.
fn grouped_mm(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    o.tensor(1, "b")?;
    let offsets = match o.arg(2, "offsets") {
        None | Some(Arg::None) => false,
        Some(_) => {
            o.tensor(2, "offsets")?;
            true
        }
    };
    Ok(Kernel::GroupedMm { offsets })
}

/// `logsumexp(a, dim, keepdim=False)`: the dims as a reduction's, into the meta's float dtype.
fn logsumexp(o: &mut Ops<'_>) -> Result<Kernel, String> {
    match reduce(o, ReduceOp::Sum)? {
        Kernel::Reduce {
            dims,
            keepdim,
            dtype,
            ..
        } => Ok(Kernel::Logsumexp {
            dims,
            keepdim,
            dtype,
        }),
        other => Err(format!("logsumexp decoded as {other:?}")),
    }
}

/// `cumsum(a, dim, *, dtype=None)`: the output's dtype (the meta's: `dtype=`, else the
/// input's float dtype, else i64).
fn cumsum(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    let rank = o.in_shape(0)?.len();
    let dim = o.int(1, "dim")?.ok_or("cumsum needs a dim")?;
    Ok(Kernel::Cumsum {
        dim: norm_dim(dim, rank)?,
        dtype: o.out(0)?.dtype,
    })
}

/// `argmax/argmin(a, dim=None, keepdim=False)`.
fn arg_extremum(o: &mut Ops<'_>, max: bool) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    let rank = o.in_shape(0)?.len();
    let dim = match o.int(1, "dim")? {
        Some(d) => Some(norm_dim(d, rank)?),
        None => None,
    };
    Ok(Kernel::ArgExtremum {
        max,
        dim,
        keepdim: o.flag(2, "keepdim")?,
    })
}

/// `softmax/log_softmax(a, dim, dtype=None)`; the kernel keeps the input's dtype.
fn softmax(o: &mut Ops<'_>, log: bool) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    let input = o.in_type(0)?.dtype;
    let rank = o.in_shape(0)?.len();
    let dim = o.int(1, "dim")?.ok_or("softmax needs a dim")?;
    let out = o.out(0)?.dtype;
    if out != input {
        return Err(format!(
            "softmax of a {input} tensor into {out} is not supported (the kernel keeps the dtype)"
        ));
    }
    Ok(Kernel::Softmax {
        dim: norm_dim(dim, rank)?,
        log,
    })
}

/// `var_mean(a, dim, *, correction=1, keepdim=False)` (also the older `(a, dim, unbiased,
/// keepdim)` form and `prims.var_mean(a, dims, correction=)`).
fn var_mean(o: &mut Ops<'_>) -> Result<Kernel, String> {
    let (dims, correction, keepdim) = var_args(o)?;
    Ok(Kernel::VarMean {
        dims,
        correction,
        keepdim,
    })
}

/// `var(a, dim=None, *, keepdim=False, correction=1)` and `std(...)` (also the older
/// `(a, dim, unbiased, keepdim)` form) of a float tensor.
fn var(o: &mut Ops<'_>, std: bool) -> Result<Kernel, String> {
    let (dims, correction, keepdim) = var_args(o)?;
    let dtype = o.in_type(0)?.dtype;
    if !matches!(dtype, DType::F32 | DType::F64 | DType::BF16 | DType::F16) {
        return Err(format!(
            "{} of a {dtype} tensor: PyTorch's var and std take floats only",
            if std { "std" } else { "var" }
        ));
    }
    Ok(Kernel::Var {
        dims,
        correction,
        keepdim,
        std,
    })
}

/// The input, dims, correction and keepdim of `var_mean`, `var` and `std`.
fn var_args(o: &mut Ops<'_>) -> Result<(Option<Vec<i64>>, f64, bool), String> {
    o.tensor(0, "a")?;
    let dims = match o.ints(1, "dim")? {
        Some(d) => Some(d),
        None => o.ints(1, "dims")?,
    };
    let (correction, keepdim) = match o.node.args().get(2) {
        Some(Arg::Bool(unbiased)) => (if *unbiased { 1.0 } else { 0.0 }, o.flag(3, "keepdim")?),
        _ => (
            match o
                .node
                .kwarg("correction")
                .filter(|a| !matches!(a, Arg::None))
            {
                Some(a) => a
                    .as_f64()
                    .ok_or_else(|| format!("correction must be a number, got {a:?}"))?,
                None => 1.0,
            },
            match o.node.kwarg("keepdim") {
                Some(Arg::Bool(b)) => *b,
                _ => false,
            },
        ),
    };
    Ok((dims, correction, keepdim))
}

// ----- shapes and layout -----

fn identity(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    Ok(Kernel::Identity)
}

/// `reshape/view/flatten`: the output's shape.
fn reshape(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    Ok(Kernel::Reshape(o.out(0)?.shape.to_vec()))
}

/// `movedim(a, source, destination)`: the permutation that gives the output's order (the
/// meta checked the dims).
fn movedim(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    let rank = o.in_shape(0)?.len();
    let dims = |i: usize, key: &str| -> Result<Vec<usize>, String> {
        let a = o.arg(i, key).ok_or_else(|| format!("`{key}` is missing"))?;
        a.as_int_list()
            .or_else(|| a.as_int().map(|d| vec![d]))
            .ok_or_else(|| format!("movedim: `{key}` must be ints, got {a:?}"))?
            .into_iter()
            .map(|d| norm_dim(d, rank))
            .collect()
    };
    let (src, dst) = (dims(1, "source")?, dims(2, "destination")?);
    let mut perm: Vec<Option<usize>> = vec![None; rank];
    for (&s, &d) in src.iter().zip(&dst) {
        perm[d] = Some(s);
    }
    let mut rest = (0..rank).filter(|i| !src.contains(i));
    let perm = perm
        .into_iter()
        .map(|p| p.or_else(|| rest.next()))
        .collect::<Option<Vec<_>>>()
        .ok_or("movedim: the dims do not make a permutation")?;
    Ok(Kernel::Permute(perm))
}

/// `permute(a, *dims)` and `prims.transpose(a, permutation)`.
fn permute(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    let rank = o.in_shape(0)?.len();
    let perm = match o.int_varargs(1, "dims")? {
        Some(p) => p,
        None => o
            .ints(1, "permutation")?
            .ok_or("the permutation must be a tuple of ints")?,
    };
    let perm = perm
        .into_iter()
        .map(|d| norm_dim(d, rank))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Kernel::Permute(perm))
}

/// `transpose(a, dim0, dim1)`.
fn transpose(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    let rank = o.in_shape(0)?.len();
    let d0 = o.int(1, "dim0")?.ok_or("transpose needs dim0")?;
    let d1 = o.int(2, "dim1")?.ok_or("transpose needs dim1")?;
    let mut perm: Vec<usize> = (0..rank).collect();
    if rank > 0 {
        perm.swap(norm_dim(d0, rank)?, norm_dim(d1, rank)?);
    }
    Ok(Kernel::Permute(perm))
}

/// `to(a, dtype_or_device, ...)`, `convert_element_type(a, dtype)` and PyTorch's dtype methods
/// (`Tensor.int()`, `long()`, ..., `type_as(other)`): a conversion to the output's dtype (which
/// the op table's meta gives) on the input's device.
fn convert(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    let out = o.out(0)?;
    if o.in_type(0)?.device != out.device {
        return Err(format!(
            "moving a tensor to {} is not supported",
            out.device
        ));
    }
    Ok(Kernel::Convert(out.dtype))
}

/// `prims.pad(a, padding_value, padding_config)`: `(lo, hi, interior)` per dim.
fn pad(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    let value = o.number(1, "padding_value")?.unwrap_or(0.0);
    let config = match o.arg(2, "padding_config") {
        Some(Arg::Tuple(items) | Arg::List(items)) => items
            .iter()
            .map(|t| match t.as_int_list().as_deref() {
                Some(&[lo, hi, interior]) => Ok((lo, hi, interior)),
                _ => Err(format!(
                    "a padding triple must be (lo, hi, interior), got {t:?}"
                )),
            })
            .collect::<Result<Vec<_>, _>>()?,
        other => {
            return Err(format!(
                "padding_config must be a list of triples, got {other:?}"
            ))
        }
    };
    Ok(Kernel::Pad { value, config })
}

/// `F.pad(a, pad, mode='constant', value=None)`: `pad` is `(lo, hi)` pairs from the last
/// dimension backwards.
fn functional_pad(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    let rank = o.in_shape(0)?.len();
    match o.arg(2, "mode").and_then(Arg::as_str) {
        None | Some("constant") => {}
        Some(mode) => return Err(format!("pad mode '{mode}' is not supported")),
    }
    let pads = o.ints(1, "pad")?.ok_or("pad needs the padding")?;
    if pads.len() % 2 != 0 || pads.len() / 2 > rank {
        return Err(format!(
            "pad {pads:?} must be (lo, hi) pairs for at most {rank} dimensions"
        ));
    }
    let mut config = vec![(0, 0, 0); rank];
    for (j, pair) in pads.chunks(2).enumerate() {
        config[rank - 1 - j] = (pair[0], pair[1], 0);
    }
    Ok(Kernel::Pad {
        value: o.number(3, "value")?.unwrap_or(0.0),
        config,
    })
}

/// `prims.slice_prim(a, start_indices, end_indices, strides=None)`.
fn slice(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    let start = o
        .ints(1, "start_indices")?
        .ok_or("slice needs start_indices")?;
    let end = o.ints(2, "end_indices")?.ok_or("slice needs end_indices")?;
    let step = o.ints_or(3, "strides", &vec![1; start.len()])?;
    Ok(Kernel::Slice { start, end, step })
}

/// `x[key]` with basic indexing: ints, slices with a positive step, `None` and `...`: a
/// slice (Python's clamping rules, resolved against the input's shape here), then a reshape
/// to the output (ints drop their dimension, `None` adds one); either alone when the other
/// changes nothing.
fn getitem(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    let shape = o.in_shape(0)?;
    let rank = shape.len();
    let key = o.raw(1, "key").ok_or("getitem needs an index")?;
    let holds_tensor = |a: &Arg| matches!(a, Arg::Value(v) if matches!(o.trace.ty(*v), Some(tracepass_ir::Type::Tensor(_))));
    if holds_tensor(key) || matches!(key, Arg::Tuple(items) if items.iter().any(holds_tensor)) {
        let key = key.clone();
        return setitem::getitem_tensor(o, &key);
    }
    let items: Vec<&Arg> = match key {
        Arg::Tuple(items) => items.iter().collect(),
        other => vec![other],
    };
    let consumed = items
        .iter()
        .filter(|a| !matches!(a, Arg::None | Arg::Ellipsis))
        .count();
    if consumed > rank {
        return Err(format!("{consumed} indices for a tensor of rank {rank}"));
    }
    if items.iter().filter(|a| matches!(a, Arg::Ellipsis)).count() > 1 {
        return Err("an index can hold one ellipsis (...)".into());
    }
    let (mut start, mut end, mut step) = (Vec::new(), Vec::new(), Vec::new());
    let mut out = Vec::new();
    let whole = |n: usize, start: &mut Vec<i64>, end: &mut Vec<i64>, step: &mut Vec<i64>| {
        start.push(0);
        end.push(n as i64);
        step.push(1);
        n
    };
    let mut d = 0;
    for item in items {
        match item {
            Arg::None => out.push(1),
            Arg::Ellipsis => {
                for _ in 0..rank - consumed {
                    out.push(whole(shape[d], &mut start, &mut end, &mut step));
                    d += 1;
                }
            }
            Arg::Int(i) => {
                let n = shape[d] as i64;
                let at = if *i < 0 { i + n } else { *i };
                if at < 0 || at >= n {
                    return Err(format!("index {i} is out of range for a dimension of {n}"));
                }
                start.push(at);
                end.push(at + 1);
                step.push(1);
                d += 1;
            }
            Arg::Slice(s) => {
                let n = shape[d] as i64;
                let [lo, hi, k] = **s;
                let k = k.unwrap_or(1);
                if k <= 0 {
                    return Err(format!("slice step {k} must be positive"));
                }
                let clamp = |x: i64| if x < 0 { (x + n).max(0) } else { x.min(n) };
                let lo = lo.map_or(0, clamp);
                let hi = hi.map_or(n, clamp).max(lo);
                start.push(lo);
                end.push(hi);
                step.push(k);
                out.push(((hi - lo + k - 1) / k) as usize);
                d += 1;
            }
            other => {
                return Err(format!(
                    "indexing with {other:?} is not supported (ints, slices, None and ... are)"
                ))
            }
        }
    }
    while d < rank {
        out.push(whole(shape[d], &mut start, &mut end, &mut step));
        d += 1;
    }
    let declared = o.out(0)?.shape.to_vec();
    if declared != out {
        return Err(format!(
            "indexing {shape:?} gives {out:?}, but the output is declared {declared:?}"
        ));
    }
    // the slice's own shape: every input dimension, each cut to its range
    let sliced: Vec<usize> = (0..rank)
        .map(|d| ((end[d] - start[d] + step[d] - 1) / step[d]) as usize)
        .collect();
    let slice = Kernel::Slice { start, end, step };
    if sliced == out {
        return Ok(slice);
    }
    let reshape = Kernel::Reshape(out);
    if sliced == shape {
        // nothing cut: only dimensions added (None) or dropped (ints on dimensions of 1)
        return Ok(reshape);
    }
    o.then = Some(reshape);
    Ok(slice)
}

/// `split(a, size_or_sections, dim=0)`, resolved to explicit sizes from the input shape.
fn split(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    let shape = o.in_shape(0)?;
    let dim = o.int(2, "dim")?.unwrap_or(0);
    let d = crate::cpu::layout::norm_dim(dim, shape.len())?;
    let sizes = match o
        .arg(1, "size_or_sections")
        .or_else(|| o.node.kwarg("split_size_or_sections"))
    {
        Some(Arg::Int(c)) => {
            let c = usize::try_from(*c).map_err(|_| format!("split size {c} is negative"))?;
            if c == 0 {
                return Err("split size 0".into());
            }
            let n = shape[d];
            (0..n.div_ceil(c).max(1))
                .map(|i| c.min(n - i * c))
                .collect()
        }
        Some(a) => a
            .as_int_list()
            .and_then(|v| v.into_iter().map(|x| usize::try_from(x).ok()).collect())
            .ok_or_else(|| format!("split sizes must be non-negative ints, got {a:?}"))?,
        None => return Err("split needs size_or_sections".into()),
    };
    Ok(Kernel::Split { sizes, dim })
}

/// `chunk(a, chunks, dim=0)`: pieces of `ceil(n / chunks)` along `dim`, the last one smaller,
/// so there may be fewer than `chunks` (as in PyTorch).
fn chunk(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    let shape = o.in_shape(0)?;
    let dim = o.int(2, "dim")?.unwrap_or(0);
    let d = crate::cpu::layout::norm_dim(dim, shape.len())?;
    let chunks = o.int(1, "chunks")?.ok_or("chunk needs chunks")?;
    let chunks = usize::try_from(chunks)
        .ok()
        .filter(|&c| c > 0)
        .ok_or_else(|| format!("chunks must be positive, got {chunks}"))?;
    let n = shape[d];
    let size = n.div_ceil(chunks);
    // an empty dimension gives one empty piece (as the op table's meta says)
    let sizes: Vec<usize> = if size == 0 {
        vec![0]
    } else {
        (0..n.div_ceil(size))
            .map(|i| size.min(n - i * size))
            .collect()
    };
    if sizes.len() != o.node.outputs().len() {
        return Err(format!(
            "chunk gives {} pieces {sizes:?} but the node names {} outputs",
            sizes.len(),
            o.node.outputs().len()
        ));
    }
    Ok(Kernel::Split { sizes, dim })
}

/// `cat(tensors, dim=0)`.
fn cat(o: &mut Ops<'_>) -> Result<Kernel, String> {
    let node = o.node;
    match node.args().first().or_else(|| node.kwarg("tensors")) {
        Some(Arg::Tuple(items) | Arg::List(items)) => {
            for t in items {
                match t {
                    Arg::Value(v) => o.inputs.push(*v),
                    other => return Err(format!("cat operands must be tensors, got {other:?}")),
                }
            }
        }
        other => return Err(format!("cat needs a sequence of tensors, got {other:?}")),
    }
    Ok(Kernel::Cat {
        dim: o.int(1, "dim")?.unwrap_or(0),
    })
}

/// `stack(tensors, dim=0)`: each input unsqueezed at `dim`, then concatenated there.
fn stack(o: &mut Ops<'_>) -> Result<Kernel, String> {
    let node = o.node;
    match node.args().first().or_else(|| node.kwarg("tensors")) {
        Some(Arg::Tuple(items) | Arg::List(items)) if !items.is_empty() => {
            for t in items {
                match t {
                    Arg::Value(v) => o.inputs.push(*v),
                    other => return Err(format!("stack operands must be tensors, got {other:?}")),
                }
            }
        }
        other => {
            return Err(format!(
                "stack needs a non-empty sequence of tensors, got {other:?}"
            ))
        }
    }
    Ok(Kernel::Stack {
        dim: o.int(1, "dim")?.unwrap_or(0),
    })
}

/// `Tensor.expand(a, shape)` or `Tensor.expand(a, *sizes)`.
fn expand(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    Ok(Kernel::Expand(
        o.int_varargs(1, "shape")?.ok_or("expand needs a shape")?,
    ))
}

/// `flip(a, dims)` or `flip(a, *dims)`.
fn flip(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    Ok(Kernel::Flip(
        o.int_varargs(1, "dims")?.ok_or("flip needs dims")?,
    ))
}

fn squeeze(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    Ok(Kernel::Squeeze(o.ints(1, "dim")?))
}

fn unsqueeze(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "a")?;
    Ok(Kernel::Unsqueeze(
        o.int(1, "dim")?.ok_or("unsqueeze needs a dim")?,
    ))
}

// ----- creation -----

/// `arange(start, end=None, step=1, device=, dtype=)`; the dtype is the output's.
fn arange(o: &mut Ops<'_>) -> Result<Kernel, String> {
    let first = o.number(0, "start")?.ok_or("arange needs an end")?;
    let (start, end) = match o.number(1, "end")? {
        Some(e) => (first, e),
        None => (0.0, first),
    };
    Ok(Kernel::Arange {
        start,
        end,
        step: o.number(2, "step")?.unwrap_or(1.0),
        dtype: o.out(0)?.dtype,
    })
}

/// `full(shape, fill_value, ...)` and `full_like(a, fill_value, ...)`: the output's shape and
/// dtype, filled.
fn full(o: &mut Ops<'_>) -> Result<Kernel, String> {
    let value = o.number(1, "fill_value")?.ok_or("full needs fill_value")?;
    filled(o, value)
}

/// `zeros/ones/empty(*size)` and `zeros_like/ones_like(a)`: the output's shape and dtype
/// filled with `value` (`empty` with zeros).
fn filled(o: &mut Ops<'_>, value: f64) -> Result<Kernel, String> {
    let out = o.out(0)?;
    Ok(Kernel::Full {
        shape: out.shape.to_vec(),
        value,
        dtype: out.dtype,
    })
}

/// `uniform(shape, minval, maxval, device=, dtype=)`.
fn uniform(o: &mut Ops<'_>) -> Result<Kernel, String> {
    let out = o.out(0)?;
    Ok(Kernel::Uniform {
        shape: out.shape.to_vec(),
        minval: o.number(1, "minval")?.unwrap_or(0.0),
        maxval: o.number(2, "maxval")?.unwrap_or(1.0),
        dtype: out.dtype,
    })
}

/// `rand(*size)`: uniform on [0, 1).
fn rand(o: &mut Ops<'_>) -> Result<Kernel, String> {
    let out = o.out(0)?;
    Ok(Kernel::Uniform {
        shape: out.shape.to_vec(),
        minval: 0.0,
        maxval: 1.0,
        dtype: out.dtype,
    })
}

/// `randn(*size, device=, dtype=)`: standard normal samples of the output's shape and float
/// dtype.
fn randn(o: &mut Ops<'_>) -> Result<Kernel, String> {
    let out = o.out(0)?;
    if !out.dtype.is_float() {
        return Err(format!(
            "randn into {} is not supported (PyTorch draws normal samples in floats)",
            out.dtype
        ));
    }
    Ok(Kernel::Normal {
        shape: out.shape.to_vec(),
        dtype: out.dtype,
    })
}

// ----- in-place updates -----

/// `copy_(copy_from, copy_to)`: the value `copy_to` holds afterwards (`copy_from` in its
/// dtype); the runtime rebinds the buffer elsewhere.
fn copy(o: &mut Ops<'_>) -> Result<Kernel, String> {
    o.tensor(0, "copy_from")?;
    o.tensor(1, "copy_to")?;
    Ok(Kernel::Copy)
}
