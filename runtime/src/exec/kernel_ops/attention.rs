//! Decoders of `torch.nn.functional.multi_head_attention_forward` and Thunder's fallback
//! backward of it, `multi_head_attention_forward_vjp` (`exec/attention.rs` runs both).

use super::{fallback_forward, names_gradient, Ops};
use crate::exec::kernel::{Kernel, Mha};
use tracepass_ir::Arg;

/// The forward's operands that are tensors with a gradient, by position: query, key, value,
/// in_proj_weight, in_proj_bias, out_proj_weight, out_proj_bias.
const DIFFERENTIABLE: [usize; 7] = [0, 1, 2, 5, 6, 11, 12];

/// The forward: inputs `query, key, value, in_proj_weight, in_proj_bias, out_proj_weight,
/// out_proj_bias`. What the kernel leaves out (masks, dropout, `bias_k`/`bias_v`, zero
/// attention, separate projections, `need_weights=False`) is refused by name.
pub(super) fn multi_head_attention(o: &mut Ops<'_>) -> Result<Kernel, String> {
    let absent = |o: &Ops<'_>, i: usize, key: &str| -> Result<(), String> {
        match o.arg(i, key) {
            None => Ok(()),
            Some(a) => Err(format!(
                "multi_head_attention_forward with `{key}`={a:?} is not supported"
            )),
        }
    };
    absent(o, 7, "bias_k")?;
    absent(o, 8, "bias_v")?;
    absent(o, 14, "key_padding_mask")?;
    absent(o, 16, "attn_mask")?;
    for (i, key) in [
        (18, "q_proj_weight"),
        (19, "k_proj_weight"),
        (20, "v_proj_weight"),
    ] {
        absent(o, i, key)?;
    }
    absent(o, 21, "static_k")?;
    absent(o, 22, "static_v")?;
    for (i, key, want) in [
        (9, "add_zero_attn", false),
        (15, "need_weights", true),
        (17, "use_separate_proj_weight", false),
        (24, "is_causal", false),
    ] {
        if o.flag_or(i, key, want)? != want {
            return Err(format!(
                "multi_head_attention_forward with `{key}`={} is not supported",
                !want
            ));
        }
    }
    let dropout = o.number(10, "dropout_p")?.unwrap_or(0.0);
    if dropout != 0.0 && o.flag_or(13, "training", true)? {
        return Err(format!(
            "multi_head_attention_forward with dropout {dropout} in training is not supported"
        ));
    }
    let heads = o
        .int(4, "num_heads")?
        .ok_or("multi_head_attention_forward needs num_heads")?;
    for (i, key) in [
        (0, "query"),
        (1, "key"),
        (2, "value"),
        (5, "in_proj_weight"),
        (6, "in_proj_bias"),
        (11, "out_proj_weight"),
        (12, "out_proj_bias"),
    ] {
        o.tensor(i, key)?;
    }
    let e = *o.in_shape(0)?.last().ok_or("a 0-d query")?;
    if heads <= 0 || e % heads as usize != 0 {
        return Err(format!("{e} features do not split into {heads} heads"));
    }
    Ok(Kernel::MultiHeadAttention(Mha {
        heads: heads as usize,
        average: o.flag_or(23, "average_attn_weights", true)?,
    }))
}

/// `multi_head_attention_forward_vjp(((args...), {kwargs}), g_out, g_weights)`: the forward's
/// seven inputs, then the two gradients; the results are the gradients the statement names.
pub(super) fn multi_head_attention_vjp(o: &mut Ops<'_>) -> Result<Kernel, String> {
    const FORWARD: &str = "ltorch.multi_head_attention_forward";
    let node = o.node;
    let fwd = fallback_forward(node, FORWARD)?;
    let mut f = Ops::new(o.trace, &fwd);
    let Kernel::MultiHeadAttention(mha) = multi_head_attention(&mut f)? else {
        return Err(format!("{FORWARD} decodes to another kernel"));
    };
    let outputs = DIFFERENTIABLE.map(|i| names_gradient(node, i));
    let named = outputs.iter().filter(|&&b| b).count();
    if named != node.outputs().len() {
        return Err(format!(
            "the statement binds {} results; the gradients it names of {FORWARD}'s seven \
             tensors are {named}",
            node.outputs().len()
        ));
    }
    if node.args().len() != 3 {
        return Err(format!(
            "{FORWARD} has two outputs, so two gradients follow its operands, not {}",
            node.args().len().saturating_sub(1)
        ));
    }
    o.inputs.extend(f.inputs.iter().copied());
    for (i, key) in [(1, "grad_output"), (2, "grad_weights")] {
        match node.args().get(i) {
            Some(Arg::Value(_)) => o.tensor(i, key)?,
            other => {
                return Err(format!(
                    "the gradient of {FORWARD}'s output {} must be a tensor, got {other:?}",
                    i - 1
                ))
            }
        }
    }
    Ok(Kernel::MultiHeadAttentionVjp { mha, outputs })
}
