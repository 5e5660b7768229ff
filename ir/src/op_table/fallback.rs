//! The backward halves of Thunder's automatically registered torch ops.
//!
//! Thunder 0.2.6 registers the torch functions it has no rule for
//! (`thunder/torch/default_torch_ops.py`: `conv_transpose2d`, ...) with a generic backward
//! that runs `torch.autograd.functional.vjp` (`register_default_torch_op`, `backward_adaptor`
//! in `thunder/torch/__init__.py`). The backward trace prints it as
//! `(g_a, g_w, g_b, (_, _), ...) = conv_transpose2d_vjp(((a, w, b, (2, 2), ...), {}), g)`
//! (also `pixel_shuffle`, `pixel_unshuffle`, `roll`, `adaptive_avg_pool1d`, `adaptive_max_pool1d/2d`, `bilinear`, `detach`, `channel_shuffle`, `clamp_min`, `clamp_max`, `cosine_similarity`, `F.unfold`/`F.fold`,
//! the pointwise losses `binary_cross_entropy(_with_logits)`, `l1_loss`, `smooth_l1_loss`, `huber_loss`, `kl_div`, `logaddexp`, `hypot`,
//! `multi_head_attention_forward` of `nn.MultiheadAttention`, whose two outputs give two
//! gradients):
//! the forward's positional operands and keywords, then one gradient per forward output. The
//! result mirrors the positional operands (tuples and lists nested, every other operand a leaf,
//! `None` included): a leaf that is a floating-point tensor gets a gradient of its own type,
//! every other leaf `None`. Its names and `_`s are bound by [`crate::MetaOut::bind`].
//!
//! Each op is listed by name: only forward ops whose gradient the runtime computes are declared,
//! so a trace with another fallback is refused as an unknown op, never run on a guess.

use super::op;
use crate::arg::Arg;
use crate::registry::DTypeRule::Meta;
use crate::registry::Effect::Pure;
use crate::registry::{MetaCx, MetaOut, OpSpec, ResultPlace};
use crate::types::Type;

type R = Result<MetaOut, String>;

/// How deep the forward's operands may nest (Thunder's are one tuple inside another).
const MAX_DEPTH: usize = 32;

/// The forward's positional operands and its keyword operands (key, value).
pub type SavedOperands<'a> = (&'a [Arg], &'a [(Arg, Arg)]);

/// The forward's positional and keyword operands a fallback statement saved, its first operand
/// `((args...), {kwargs})`.
pub fn saved_operands(saved: &Arg) -> Result<SavedOperands<'_>, String> {
    match saved {
        Arg::Tuple(pair) if pair.len() == 2 => match (&pair[0], &pair[1]) {
            (Arg::Tuple(args) | Arg::List(args), Arg::Dict(kwargs)) => Ok((args, kwargs)),
            (args, kwargs) => Err(format!(
                "the forward's operands must be a tuple and a dict, got {args:?} and {kwargs:?}"
            )),
        },
        other => Err(format!(
            "operand 0 must be the forward's `((args...), {{kwargs}})`, got {other:?}"
        )),
    }
}

/// The forward's positional operands, and its keyword operands by name.
pub type SavedCall = (Vec<Arg>, Vec<(String, Arg)>);

/// The forward's positional operands and its keywords by name, from a fallback statement's
/// first operand `((args...), {kwargs})`.
pub fn saved_call(saved: &Arg) -> Result<SavedCall, String> {
    let (args, kwargs) = saved_operands(saved)?;
    let kwargs = kwargs
        .iter()
        .map(|(k, v)| match k {
            Arg::Str(k) => Ok((k.clone(), v.clone())),
            other => Err(format!("the forward's keyword {other:?} is not a string")),
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok((args.to_vec(), kwargs))
}

/// `X_vjp(((args...), {kwargs}), *grads)`: a gradient for each floating-point tensor leaf of
/// `args`, `None` for every other leaf, nested as `args` is.
fn torch_fallback_vjp(cx: &MetaCx) -> R {
    let (args, kwargs) = saved_operands(cx.arg(0)?).map_err(|m| format!("{}: {m}", cx.op))?;
    // Thunder refuses (NotImplementedError) a keyword operand that needs a gradient
    for (k, v) in kwargs {
        if differentiable(cx, v)?.is_some() {
            return Err(format!(
                "{}: keyword operand {k:?} is a floating-point tensor; Thunder's fallback gives \
                 keyword operands no gradient",
                cx.op
            ));
        }
    }
    if cx.args.len() < 2 {
        return Err(format!(
            "{}: no gradient of the forward's output follows its operands",
            cx.op
        ));
    }
    for (i, g) in cx.args.iter().enumerate().skip(1) {
        match cx.type_of(g)? {
            Type::Tensor(_) | Type::None => {}
            other => {
                return Err(format!(
                    "{}: operand {i} must be the gradient of a forward output, got {other}",
                    cx.op
                ))
            }
        }
    }
    Ok(MetaOut::Places(places(cx, args, 1)?))
}

fn places(cx: &MetaCx, args: &[Arg], depth: usize) -> Result<Vec<ResultPlace>, String> {
    if depth > MAX_DEPTH {
        return Err(format!(
            "{}: the forward's operands nest deeper than {MAX_DEPTH} levels",
            cx.op
        ));
    }
    args.iter()
        .map(|a| match a {
            Arg::Tuple(inner) | Arg::List(inner) => {
                places(cx, inner, depth + 1).map(ResultPlace::Group)
            }
            Arg::Dict(_) => Err(format!(
                "{}: a dict among the forward's positional operands is not supported",
                cx.op
            )),
            leaf => Ok(match differentiable(cx, leaf)? {
                Some(t) => ResultPlace::Value(t),
                None => ResultPlace::Nothing,
            }),
        })
        .collect()
}

/// The type of a leaf that gets a gradient: a tensor of a floating-point dtype.
fn differentiable(cx: &MetaCx, a: &Arg) -> Result<Option<Type>, String> {
    Ok(match a {
        Arg::Value(_) => match cx.type_of(a)? {
            t @ Type::Tensor(_) if t.as_tensor().is_some_and(|t| t.dtype.is_float()) => Some(t),
            _ => None,
        },
        _ => None,
    })
}

#[rustfmt::skip]
const OPS: &[OpSpec] = &[
    op("ltorch.conv_transpose1d_vjp", &["conv_transpose1d_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.conv_transpose2d_vjp", &["conv_transpose2d_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.conv_transpose3d_vjp", &["conv_transpose3d_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.pixel_shuffle_vjp", &["pixel_shuffle_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.pixel_unshuffle_vjp", &["pixel_unshuffle_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.roll_vjp", &["roll_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    // rewritten into table ops as the trace is read (`crate::lowering`)
    op("ltorch.mm_vjp", &["mm_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.addmm_vjp", &["addmm_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.diff_vjp", &["diff_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.reshape_as_vjp", &["reshape_as_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.vector_norm_vjp", &["vector_norm_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.norm_vjp", &["norm_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.swapaxes_vjp", &["swapaxes_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.swapdims_vjp", &["swapdims_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.moveaxis_vjp", &["moveaxis_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.multiply_vjp", &["multiply_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.subtract_vjp", &["subtract_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.divide_vjp", &["divide_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.negative_vjp", &["negative_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.absolute_vjp", &["absolute_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.clip_vjp", &["clip_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.fix_vjp", &["fix_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.ravel_vjp", &["ravel_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.narrow_vjp", &["narrow_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.tile_vjp", &["tile_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.adaptive_avg_pool1d_vjp", &["adaptive_avg_pool1d_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.adaptive_max_pool1d_vjp", &["adaptive_max_pool1d_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.adaptive_max_pool2d_vjp", &["adaptive_max_pool2d_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.detach_vjp", &["detach_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.channel_shuffle_vjp", &["channel_shuffle_vjp", "native_channel_shuffle_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.clamp_min_vjp", &["clamp_min_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.clamp_max_vjp", &["clamp_max_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.unfold_im2col_vjp", &["unfold_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.fold_col2im_vjp", &["fold_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.cosine_similarity_vjp", &["cosine_similarity_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.bilinear_vjp", &["bilinear_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.binary_cross_entropy_with_logits_vjp", &["binary_cross_entropy_with_logits_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.binary_cross_entropy_vjp", &["binary_cross_entropy_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.l1_loss_vjp", &["l1_loss_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.smooth_l1_loss_vjp", &["smooth_l1_loss_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.huber_loss_vjp", &["huber_loss_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.kl_div_vjp", &["kl_div_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.logaddexp_vjp", &["logaddexp_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.hypot_vjp", &["hypot_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
    op("ltorch.multi_head_attention_forward_vjp", &["multi_head_attention_forward_vjp"], Pure, "saved_for_backward, *grad_output", Meta, torch_fallback_vjp),
];

pub(crate) const PARTS: &[&[OpSpec]] = &[OPS];
