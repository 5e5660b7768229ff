//! Ops the runtime has no kernel for (`KernelEntry::Unsupported`: `layer_norm`,
//! `scaled_dot_product_attention`, `max_pool2d`, `mse_loss`, ...) run through the decomposition
//! Thunder printed below them. Thunder's torch executor runs such an op whole when nothing needs
//! its insides (an inference trace, a no-grad region), and prints its definition below it down
//! to prims; tracepass reads that definition instead of refusing the trace
//! ([`tracepass_ir::inline_unknown_decompositions`], with an op counted as known only when it has
//! a kernel). An op with no printed decomposition, or one whose decomposition needs another op
//! without a kernel, is still refused at plan time with its reason.

use crate::exec::kernel_ops::{kernel_entry, KernelEntry};
use tracepass_ir::{
    inline_unknown_decompositions, parse_trace_with, print_trace, OpRegistry, Program, Provenance,
    Trace,
};

/// How the provenance entry of a trace so rewritten starts.
pub const PROVENANCE: &str =
    "tracepass run: ops without a kernel run through Thunder's printed decomposition: ";

fn unsupported(op: &str) -> bool {
    matches!(kernel_entry(op), Some(KernelEntry::Unsupported { .. }))
}

/// `t` with every op that has no kernel but a printed decomposition replaced by it; `None`
/// when there is none (the trace runs as it is, or is refused as it is).
pub fn expand_unrunnable(t: &Trace) -> Result<Option<Trace>, String> {
    let any = t
        .schedule()
        .iter()
        .filter_map(|&i| t.node(i))
        .any(|n| unsupported(&n.op) && !n.subsymbols().is_empty());
    if !any {
        return Ok(None);
    }
    // opaque ops of a trace read with `--allow-unregistered` stay opaque
    let registry = OpRegistry::builtin_allowing_unregistered();
    let text = print_trace(t);
    let (text, _, inlined) = inline_unknown_decompositions(&text, |callee| {
        registry
            .resolve(callee)
            .is_some_and(|op| registry.get(op).is_some() && !unsupported(op))
    });
    let mut ops: Vec<String> = Vec::new();
    for op in inlined.iter().filter(|op| !op.nested) {
        if !ops.contains(&op.callee) {
            ops.push(op.callee.clone());
        }
    }
    if ops.is_empty() {
        return Ok(None);
    }
    let mut out = parse_trace_with(&text, registry).map_err(|e| {
        format!(
            "trace `{}`: reading its ops without a kernel ({}) through their printed \
             decompositions: {e}",
            t.name,
            ops.join(", ")
        )
    })?;
    out.provenance.push(Provenance {
        pass: format!("{PROVENANCE}{}", ops.join(", ")),
        millis: None,
    });
    Ok(Some(out))
}

/// [`expand_unrunnable`] on both traces of a program.
pub fn expand_program(mut p: Program) -> Result<Program, String> {
    if let Some(f) = expand_unrunnable(&p.forward)? {
        p.forward = f;
    }
    if let Some(b) = expand_unrunnable(&p.backward)? {
        p.backward = b;
    }
    Ok(p)
}
