//! `torch.nn.MultiheadAttention`, which Thunder 0.2.6 has no rule for: it registers
//! `torch.nn.functional.multi_head_attention_forward` automatically (its backward is the
//! fallback `multi_head_attention_forward_vjp`, `fallback.rs`) and prints the call as is,
//! `(out, weights) = torch.nn.functional.multi_head_attention_forward(q, k, v, E, H, ...)`.
//! Thunder refuses the masks (a bool mask fails PyTorch's dtype check on a proxy, a float one is
//! a keyword operand that needs a gradient) and `need_weights=False` (a `None` output), so
//! exports carry neither; the meta still types them as PyTorch does.

use super::op;
use crate::meta::same_dtype_device;
use crate::registry::DTypeRule::First;
use crate::registry::Effect::Pure;
use crate::registry::{MetaCx, MetaOut, OpSpec};
use crate::types::{TensorType, Type};

type R = Result<MetaOut, String>;

/// The signature of PyTorch 2.9's `F.multi_head_attention_forward`.
pub const MHA_SIGNATURE: &str = "query, key, value, embed_dim_to_check, num_heads, \
     in_proj_weight, in_proj_bias, bias_k, bias_v, add_zero_attn, dropout_p, out_proj_weight, \
     out_proj_bias, training=True, key_padding_mask=None, need_weights=True, attn_mask=None, \
     use_separate_proj_weight=False, q_proj_weight=None, k_proj_weight=None, \
     v_proj_weight=None, static_k=None, static_v=None, average_attn_weights=True, \
     is_causal=False";

fn expect_shape(cx: &MetaCx, name: &str, t: &TensorType, want: &[usize]) -> Result<(), String> {
    if t.shape[..] != want[..] {
        return Err(format!(
            "{}: `{name}` must be {want:?}, got {:?}",
            cx.op, t.shape
        ));
    }
    Ok(())
}

/// `(attn_output, attn_weights)`: the output `[L, N, E]` (`[L, E]` unbatched); the weights
/// `[N, L, S]` averaged over heads, `[N, H, L, S]` with `average_attn_weights=False` (no `N`
/// unbatched), `None` with `need_weights=False`.
fn multi_head_attention_forward(cx: &MetaCx) -> R {
    let q = cx.tensor_param("query")?;
    let k = cx.tensor_param("key")?;
    let v = cx.tensor_param("value")?;
    let batched = match q.shape.len() {
        3 => true,
        2 => false,
        r => {
            return Err(format!(
                "{}: query must be [L, N, E] or [L, E], got rank {r}",
                cx.op
            ))
        }
    };
    if k.shape.len() != q.shape.len() || v.shape.len() != q.shape.len() {
        return Err(format!(
            "{}: query {:?}, key {:?} and value {:?} must have one rank",
            cx.op, q.shape, k.shape, v.shape
        ));
    }
    same_dtype_device(cx.op, &q, &k)?;
    same_dtype_device(cx.op, &q, &v)?;
    let e = q.shape[q.shape.len() - 1];
    let (l, s) = (q.shape[0], k.shape[0]);
    if batched && (k.shape[1] != q.shape[1] || v.shape[1] != q.shape[1]) {
        return Err(format!(
            "{}: query {:?}, key {:?} and value {:?} differ in batch size",
            cx.op, q.shape, k.shape, v.shape
        ));
    }
    if k.shape[..] != v.shape[..] {
        return Err(format!(
            "{}: key {:?} and value {:?} must have one shape",
            cx.op, k.shape, v.shape
        ));
    }
    let check = cx.int_param("embed_dim_to_check")?;
    if check != e as i64 {
        return Err(format!(
            "{}: query's embedding is {e}, embed_dim_to_check {check}",
            cx.op
        ));
    }
    let heads = cx.int_param("num_heads")?;
    if heads <= 0 || e % heads as usize != 0 {
        return Err(format!(
            "{}: embedding {e} is not divisible into {heads} heads",
            cx.op
        ));
    }
    let h = heads as usize;
    if k.shape[k.shape.len() - 1] != e {
        return Err(format!(
            "{}: key's embedding {} differs from query's {e} (separate kdim/vdim use \
             separate projection weights)",
            cx.op,
            k.shape[k.shape.len() - 1]
        ));
    }
    match cx.opt_tensor("in_proj_weight")? {
        Some(w) => {
            same_dtype_device(cx.op, &q, &w)?;
            expect_shape(cx, "in_proj_weight", &w, &[3 * e, e])?;
        }
        None => {
            for name in ["q_proj_weight", "k_proj_weight", "v_proj_weight"] {
                let w = cx.opt_tensor(name)?.ok_or_else(|| {
                    format!("{}: neither in_proj_weight nor {name} is given", cx.op)
                })?;
                expect_shape(cx, name, &w, &[e, e])?;
            }
        }
    }
    if let Some(b) = cx.opt_tensor("in_proj_bias")? {
        expect_shape(cx, "in_proj_bias", &b, &[3 * e])?;
    }
    let wo = cx.tensor_param("out_proj_weight")?;
    same_dtype_device(cx.op, &q, &wo)?;
    expect_shape(cx, "out_proj_weight", &wo, &[e, e])?;
    if let Some(b) = cx.opt_tensor("out_proj_bias")? {
        expect_shape(cx, "out_proj_bias", &b, &[e])?;
    }
    let out = q.clone();
    let need = !matches!(cx.opt("need_weights"), Some(crate::Arg::Bool(false)));
    let average = !matches!(
        cx.opt("average_attn_weights"),
        Some(crate::Arg::Bool(false))
    );
    let weights = if !need {
        Type::None
    } else {
        let mut shape = Vec::new();
        if batched {
            shape.push(q.shape[1]);
        }
        if !average {
            shape.push(h);
        }
        shape.extend([l, s]);
        Type::Tensor(q.with_shape(shape))
    };
    Ok(MetaOut::Types(vec![Type::Tensor(out), weights]))
}

const OPS: &[OpSpec] = &[op(
    "ltorch.multi_head_attention_forward",
    &["torch.nn.functional.multi_head_attention_forward"],
    Pure,
    MHA_SIGNATURE,
    First,
    multi_head_attention_forward,
)];

/// This file's part of the table.
pub(crate) const PARTS: &[&[OpSpec]] = &[OPS];
