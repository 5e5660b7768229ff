//! The op table: every op tracepass knows, declared once: canonical name, every spelling Thunder
//! prints, effect, signature, dtype rule and meta function. Adding an op is adding one entry to
//! the file of its kind; the registry, the parser, the verifier and the printer all read from here.
//!
//! Canonical namespaces: `prims.*` (Thunder's primitives), `ltorch.*` (torch-level ops),
//! `dist.*` (communication), `python.*` (collection plumbing and in-place updates),
//! `tracepass.*` (tracepass's own constructs: the fusion region of `fuse-elementwise`). Spellings
//! come from Thunder 0.2.6's torch executor (`thunder/executors/torchex.py`): `torch.X`,
//! `Tensor.X`, `torch.nn.functional.X`, `torch_X_prim_impl`, and the bare operator names it
//! registers (`uniform`, `copy_`, `max_pool2d_with_indices`).

mod attention;
mod creation;
mod dist;
mod elementwise;
pub mod fallback;
mod fusion;
mod grouped_mm;
mod indexing;
pub(crate) mod lowered;
mod nn;
mod prims;
mod python;
mod reduction;
mod setitem;
mod shape;
mod vocab;

use crate::registry::{DTypeRule, Effect, MetaFn, OpSpec};

/// Every entry of the table.
pub(crate) fn all() -> impl Iterator<Item = &'static OpSpec> {
    [
        elementwise::PARTS,
        shape::PARTS,
        indexing::PARTS,
        reduction::PARTS,
        nn::PARTS,
        creation::PARTS,
        python::PARTS,
        dist::PARTS,
        fallback::PARTS,
        fusion::PARTS,
        vocab::PARTS,
        attention::PARTS,
        grouped_mm::PARTS,
        setitem::PARTS,
        prims::PARTS,
        lowered::PARTS,
    ]
    .into_iter()
    .flatten()
    .flat_map(|part| part.iter())
}

/// An entry, written on one line per op.
pub(crate) const fn op(
    name: &'static str,
    spellings: &'static [&'static str],
    effect: Effect,
    signature: &'static str,
    dtype: DTypeRule,
    meta: MetaFn,
) -> OpSpec {
    OpSpec {
        name,
        spellings,
        effect,
        signature,
        dtype,
        meta,
    }
}
