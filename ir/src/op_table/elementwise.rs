//! Elementwise ops: operands broadcast, dtypes promote as in PyTorch (see `meta::ew`), and the
//! entry's dtype rule says whether the result is promoted, made floating, or boolean.

use super::op;
use crate::meta::ew;
use crate::registry::DTypeRule::{Bool, Promote, PromoteToFloat};
use crate::registry::Effect::Pure;
use crate::registry::{DTypeRule, MetaCx, MetaOut, OpSpec};

type R = Result<MetaOut, String>;

fn a(cx: &MetaCx) -> R {
    ew(cx, &["a"], &[])
}
fn ab(cx: &MetaCx) -> R {
    ew(cx, &["a", "b"], &[])
}
fn abc(cx: &MetaCx) -> R {
    ew(cx, &["a", "b", "c"], &[])
}
/// `where(pred, a, b)`: the predicate broadcasts but does not promote.
fn where_(cx: &MetaCx) -> R {
    ew(cx, &["a", "b"], &["pred"])
}
/// `masked_fill(a, mask, value)`: the result keeps `a`'s dtype.
fn masked_fill(cx: &MetaCx) -> R {
    ew(cx, &["a"], &["mask"])
}
/// `clamp(a, min, max)`.
fn clamp(cx: &MetaCx) -> R {
    ew(cx, &["a", "min", "max"], &[])
}
/// `lerp(start, end, weight)`.
/// `clamp_min(a, min)` and `clamp_max(a, max)` (Thunder's torch fallbacks).
fn clamp_min(cx: &MetaCx) -> R {
    ew(cx, &["a", "min"], &[])
}
fn clamp_max(cx: &MetaCx) -> R {
    ew(cx, &["a", "max"], &[])
}
fn lerp(cx: &MetaCx) -> R {
    ew(cx, &["start", "end", "weight"], &[])
}
/// `div(a, b, rounding_mode=None)`: true division unless a rounding mode is given.
fn div(cx: &MetaCx) -> R {
    let rounding = cx.opt("rounding_mode").is_some();
    let cx = MetaCx {
        op: cx.op,
        args: cx.args,
        kwargs: cx.kwargs,
        trace: cx.trace,
        bound: cx.bound.clone(),
        dtype_rule: if rounding {
            DTypeRule::Promote
        } else {
            DTypeRule::PromoteToFloat
        },
    };
    ab(&cx)
}

/// Unary ops whose result is floating (integers promote to the default float).
const FLOAT_UNARY: &[OpSpec] = &[
    op(
        "ltorch.exp",
        &["torch.exp", "Tensor.exp"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.exp2",
        &["prims.exp2", "torch.exp2"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.expm1",
        &["torch.expm1"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.log",
        &["torch.log", "Tensor.log"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.log1p",
        &["torch.log1p"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.log2",
        &["prims.log2", "torch.log2"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.log10",
        &["prims.log10", "torch.log10"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.sqrt",
        &["torch.sqrt", "Tensor.sqrt"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.rsqrt",
        &["torch.rsqrt", "Tensor.rsqrt"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.reciprocal",
        &["torch.reciprocal"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.sin",
        &["torch.sin", "Tensor.sin"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.cos",
        &["torch.cos", "Tensor.cos"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.tan",
        &["prims.tan", "torch.tan"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.asin",
        &["prims.asin", "torch.asin"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.acos",
        &["prims.acos", "torch.acos"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.atan",
        &["prims.atan", "torch.atan"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.sinh",
        &["prims.sinh", "torch.sinh"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.cosh",
        &["prims.cosh", "torch.cosh"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.tanh",
        &["torch.tanh", "Tensor.tanh"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.asinh",
        &["prims.asinh", "torch.asinh"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.acosh",
        &["prims.acosh", "torch.acosh"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.atanh",
        &["prims.atanh", "torch.atanh"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.erf",
        &["torch.erf"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.erfc",
        &["prims.erfc", "torch.erfc"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.erfinv",
        &["prims.erfinv", "torch.erfinv"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.lgamma",
        &["prims.lgamma", "torch.lgamma"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.digamma",
        &["prims.digamma", "torch.digamma"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.sigmoid",
        &[
            "torch.sigmoid",
            "Tensor.sigmoid",
            "torch.nn.functional.sigmoid",
        ],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
];

/// Unary ops that keep the operand's dtype.
const SAME_UNARY: &[OpSpec] = &[
    op(
        "ltorch.neg",
        &["torch.neg", "Tensor.neg"],
        Pure,
        "a, /",
        Promote,
        a,
    ),
    op(
        "ltorch.abs",
        &["torch.abs", "Tensor.abs"],
        Pure,
        "a, /",
        Promote,
        a,
    ),
    op(
        "ltorch.sign",
        &["torch.sign", "torch.sgn"],
        Pure,
        "a, /",
        Promote,
        a,
    ),
    op(
        "ltorch.floor",
        &["prims.floor", "torch.floor"],
        Pure,
        "a, /",
        Promote,
        a,
    ),
    op(
        "ltorch.ceil",
        &["prims.ceil", "torch.ceil"],
        Pure,
        "a, /",
        Promote,
        a,
    ),
    op(
        "ltorch.round",
        &["prims.round", "torch.round"],
        Pure,
        "a, /",
        Promote,
        a,
    ),
    op(
        "ltorch.trunc",
        &["prims.trunc", "torch.trunc"],
        Pure,
        "a, /",
        Promote,
        a,
    ),
    op(
        "ltorch.bitwise_not",
        &["prims.bitwise_not", "torch.bitwise_not"],
        Pure,
        "a, /",
        Promote,
        a,
    ),
];

/// Predicates: boolean results.
const PREDICATES: &[OpSpec] = &[
    op("ltorch.isnan", &["torch.isnan"], Pure, "a, /", Bool, a),
    op("ltorch.isinf", &["torch.isinf"], Pure, "a, /", Bool, a),
    op(
        "ltorch.isfinite",
        &["prims.isfinite", "torch.isfinite"],
        Pure,
        "a, /",
        Bool,
        a,
    ),
    op(
        "ltorch.signbit",
        &["prims.signbit", "torch.signbit"],
        Pure,
        "a, /",
        Bool,
        a,
    ),
    op(
        "ltorch.logical_not",
        &["torch.logical_not"],
        Pure,
        "a, /",
        Bool,
        a,
    ),
    op(
        "ltorch.eq",
        &["torch.eq", "Tensor.__eq__"],
        Pure,
        "a, b, /",
        Bool,
        ab,
    ),
    op(
        "ltorch.ne",
        &["torch.ne", "Tensor.__ne__"],
        Pure,
        "a, b, /",
        Bool,
        ab,
    ),
    op(
        "ltorch.lt",
        &["torch.lt", "Tensor.__lt__"],
        Pure,
        "a, b, /",
        Bool,
        ab,
    ),
    op(
        "ltorch.le",
        &["torch.le", "Tensor.__le__"],
        Pure,
        "a, b, /",
        Bool,
        ab,
    ),
    op(
        "ltorch.gt",
        &["torch.gt", "Tensor.__gt__"],
        Pure,
        "a, b, /",
        Bool,
        ab,
    ),
    op(
        "ltorch.ge",
        &["torch.ge", "Tensor.__ge__"],
        Pure,
        "a, b, /",
        Bool,
        ab,
    ),
    op(
        "ltorch.logical_and",
        &["torch.logical_and"],
        Pure,
        "a, b, /",
        Bool,
        ab,
    ),
    op(
        "ltorch.logical_or",
        &["torch.logical_or"],
        Pure,
        "a, b, /",
        Bool,
        ab,
    ),
    op(
        "ltorch.logical_xor",
        &["torch.logical_xor"],
        Pure,
        "a, b, /",
        Bool,
        ab,
    ),
];

/// Binary and ternary arithmetic.
const ARITHMETIC: &[OpSpec] = &[
    op(
        "ltorch.add",
        &["torch.add", "Tensor.add", "Tensor.__add__"],
        Pure,
        "a, b, /, *, alpha=None",
        Promote,
        ab,
    ),
    op(
        "ltorch.sub",
        &["torch.sub", "Tensor.sub", "Tensor.__sub__"],
        Pure,
        "a, b, /, *, alpha=None",
        Promote,
        ab,
    ),
    op(
        "ltorch.mul",
        &["torch.mul", "Tensor.mul", "Tensor.__mul__"],
        Pure,
        "a, b, /",
        Promote,
        ab,
    ),
    op(
        "ltorch.div",
        &["torch.div", "Tensor.div"],
        Pure,
        "a, b, /, *, rounding_mode=None",
        PromoteToFloat,
        div,
    ),
    op(
        "ltorch.true_divide",
        &["torch.true_divide", "Tensor.__truediv__"],
        Pure,
        "a, b, /",
        PromoteToFloat,
        ab,
    ),
    op(
        "ltorch.floor_divide",
        &["torch.floor_divide"],
        Pure,
        "a, b, /",
        Promote,
        ab,
    ),
    op(
        "ltorch.remainder",
        &["prims.remainder", "torch.remainder"],
        Pure,
        "a, b, /",
        Promote,
        ab,
    ),
    op(
        "ltorch.fmod",
        &["prims.fmod", "torch.fmod"],
        Pure,
        "a, b, /",
        Promote,
        ab,
    ),
    op(
        "ltorch.pow",
        &["torch.pow", "Tensor.pow", "Tensor.__pow__"],
        Pure,
        "a, b, /",
        Promote,
        ab,
    ),
    op(
        "ltorch.maximum",
        &["torch.maximum"],
        Pure,
        "a, b, /",
        Promote,
        ab,
    ),
    op(
        "ltorch.minimum",
        &["torch.minimum"],
        Pure,
        "a, b, /",
        Promote,
        ab,
    ),
    op(
        "ltorch.logaddexp",
        &["torch.logaddexp", "Tensor.logaddexp"],
        Pure,
        "a, b, /",
        PromoteToFloat,
        ab,
    ),
    op(
        "ltorch.hypot",
        &["torch.hypot", "Tensor.hypot"],
        Pure,
        "a, b, /",
        PromoteToFloat,
        ab,
    ),
    op(
        "ltorch.atan2",
        &["torch.atan2"],
        Pure,
        "a, b, /",
        PromoteToFloat,
        ab,
    ),
    op(
        "ltorch.ldexp",
        &["torch.ldexp"],
        Pure,
        "a, b, /",
        PromoteToFloat,
        ab,
    ),
    op(
        "ltorch.copysign",
        &["torch.copysign"],
        Pure,
        "a, b, /",
        PromoteToFloat,
        ab,
    ),
    op(
        "ltorch.nextafter",
        &["prims.nextafter", "torch.nextafter"],
        Pure,
        "a, b, /",
        Promote,
        ab,
    ),
    op(
        "ltorch.bitwise_and",
        &["prims.bitwise_and", "torch.bitwise_and"],
        Pure,
        "a, b, /",
        Promote,
        ab,
    ),
    op(
        "ltorch.bitwise_or",
        &["prims.bitwise_or", "torch.bitwise_or"],
        Pure,
        "a, b, /",
        Promote,
        ab,
    ),
    op(
        "ltorch.bitwise_left_shift",
        &["prims.bitwise_left_shift", "torch.bitwise_left_shift"],
        Pure,
        "a, b, /",
        Promote,
        ab,
    ),
    op(
        "ltorch.bitwise_right_shift",
        &["prims.bitwise_right_shift", "torch.bitwise_right_shift"],
        Pure,
        "a, b, /",
        Promote,
        ab,
    ),
    op(
        "ltorch.bitwise_xor",
        &["prims.bitwise_xor", "torch.bitwise_xor"],
        Pure,
        "a, b, /",
        Promote,
        ab,
    ),
    op(
        "ltorch.where",
        &["torch.where"],
        Pure,
        "pred, a=None, b=None, /",
        Promote,
        where_,
    ),
    op(
        "ltorch.masked_fill",
        &["Tensor.masked_fill"],
        Pure,
        "a, /, mask, value",
        DTypeRule::First,
        masked_fill,
    ),
    op(
        "ltorch.clamp",
        &["torch.clamp", "torch.clip"],
        Pure,
        "a, /, min=None, max=None",
        Promote,
        clamp,
    ),
    op(
        "ltorch.clamp_min",
        &["torch.clamp_min", "Tensor.clamp_min"],
        Pure,
        "a, /, min",
        Promote,
        clamp_min,
    ),
    op(
        "ltorch.clamp_max",
        &["torch.clamp_max", "Tensor.clamp_max"],
        Pure,
        "a, /, max",
        Promote,
        clamp_max,
    ),
    op(
        "ltorch.lerp",
        &["prims.lerp", "torch.lerp"],
        Pure,
        "start, end, weight",
        Promote,
        lerp,
    ),
    op(
        "ltorch.addcmul",
        &["torch.addcmul"],
        Pure,
        "a, b, c, /, *, value=None",
        Promote,
        abc,
    ),
    op(
        "ltorch.addcdiv",
        &["torch.addcdiv"],
        Pure,
        "a, b, c, /, *, value=None",
        PromoteToFloat,
        abc,
    ),
];

/// Activations (`torch.nn.functional`), all shape- and dtype-preserving.
const ACTIVATIONS: &[OpSpec] = &[
    op(
        "ltorch.relu",
        &["torch.relu", "torch.nn.functional.relu"],
        Pure,
        "a, /, inplace=False",
        Promote,
        a,
    ),
    op(
        "ltorch.relu6",
        &["torch.nn.functional.relu6"],
        Pure,
        "a, /, inplace=False",
        Promote,
        a,
    ),
    op(
        "ltorch.gelu",
        &["torch.nn.functional.gelu"],
        Pure,
        "a, /, *, approximate='none'",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.silu",
        &["torch.nn.functional.silu"],
        Pure,
        "a, /, inplace=False",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.mish",
        &["torch.nn.functional.mish"],
        Pure,
        "a, /, inplace=False",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.selu",
        &["torch.nn.functional.selu"],
        Pure,
        "a, /, inplace=False",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.elu",
        &["torch.nn.functional.elu"],
        Pure,
        "a, /, alpha=1.0, inplace=False",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.celu",
        &["torch.nn.functional.celu"],
        Pure,
        "a, /, alpha=1.0, inplace=False",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.leaky_relu",
        &["torch.nn.functional.leaky_relu"],
        Pure,
        "a, /, negative_slope=0.01, inplace=False",
        Promote,
        a,
    ),
    op(
        "ltorch.hardtanh",
        &["torch.nn.functional.hardtanh"],
        Pure,
        "a, /, min_val=-1.0, max_val=1.0, inplace=False",
        Promote,
        a,
    ),
    op(
        "ltorch.hardswish",
        &["torch.nn.functional.hardswish"],
        Pure,
        "a, /, inplace=False",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.hardsigmoid",
        &["torch.nn.functional.hardsigmoid"],
        Pure,
        "a, /, inplace=False",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.softplus",
        &["torch.nn.functional.softplus"],
        Pure,
        "a, /, beta=1.0, threshold=20.0",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.logsigmoid",
        &["torch.nn.functional.logsigmoid"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.softsign",
        &["torch.nn.functional.softsign"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
    op(
        "ltorch.tanhshrink",
        &["torch.nn.functional.tanhshrink"],
        Pure,
        "a, /",
        PromoteToFloat,
        a,
    ),
];

/// Thunder's primitives (what decompositions and our own passes print): explicit operands, no
/// keywords.
const PRIMS: &[OpSpec] = &[
    op("prims.add", &[], Pure, "a, b, /", Promote, ab),
    op("prims.sub", &[], Pure, "a, b, /", Promote, ab),
    op("prims.mul", &[], Pure, "a, b, /", Promote, ab),
    op(
        "prims.div",
        &["torch_div_prim_impl"],
        Pure,
        "a, b, /",
        Promote,
        ab,
    ),
    op(
        "prims.true_divide",
        &[],
        Pure,
        "a, b, /",
        PromoteToFloat,
        ab,
    ),
    op("prims.pow", &[], Pure, "a, b, /", Promote, ab),
    op("prims.maximum", &[], Pure, "a, b, /", Promote, ab),
    op("prims.minimum", &[], Pure, "a, b, /", Promote, ab),
    op("prims.atan2", &[], Pure, "a, b, /", PromoteToFloat, ab),
    op("prims.eq", &[], Pure, "a, b, /", Bool, ab),
    op("prims.ne", &[], Pure, "a, b, /", Bool, ab),
    op("prims.lt", &[], Pure, "a, b, /", Bool, ab),
    op("prims.le", &[], Pure, "a, b, /", Bool, ab),
    op("prims.gt", &[], Pure, "a, b, /", Bool, ab),
    op("prims.ge", &[], Pure, "a, b, /", Bool, ab),
    op("prims.where", &[], Pure, "pred, a, b, /", Promote, where_),
    op("prims.tanh", &[], Pure, "a, /", PromoteToFloat, a),
    op("prims.exp", &[], Pure, "a, /", PromoteToFloat, a),
    op("prims.log", &[], Pure, "a, /", PromoteToFloat, a),
    op("prims.neg", &[], Pure, "a, /", Promote, a),
    op("prims.abs", &[], Pure, "a, /", Promote, a),
    op("prims.sqrt", &[], Pure, "a, /", PromoteToFloat, a),
    op("prims.rsqrt", &[], Pure, "a, /", PromoteToFloat, a),
    op("prims.sigmoid", &[], Pure, "a, /", PromoteToFloat, a),
    op("prims.relu", &[], Pure, "a, /", Promote, a),
    op("prims.erf", &[], Pure, "a, /", PromoteToFloat, a),
    op("prims.sin", &[], Pure, "a, /", PromoteToFloat, a),
    op("prims.cos", &[], Pure, "a, /", PromoteToFloat, a),
    op("prims.reciprocal", &[], Pure, "a, /", PromoteToFloat, a),
    op("prims.sign", &[], Pure, "a, /", Promote, a),
    op("prims.log1p", &[], Pure, "a, /", PromoteToFloat, a),
    op("prims.expm1", &[], Pure, "a, /", PromoteToFloat, a),
    op("prims.gelu", &[], Pure, "a, /", PromoteToFloat, a),
];

/// This file's part of the table.
pub(crate) const PARTS: &[&[OpSpec]] = &[
    FLOAT_UNARY,
    SAME_UNARY,
    PREDICATES,
    ARITHMETIC,
    ACTIVATIONS,
    PRIMS,
];
