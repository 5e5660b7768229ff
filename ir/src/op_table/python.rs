//! Plumbing Thunder prints between ops: sequence unpacking, clearing collections, and the
//! in-place updates of buffers (`copy_`, `update_aliases`).

use super::op;
use crate::arg::Arg;
use crate::meta::{declared, identity, no_outputs, one};
use crate::registry::DTypeRule::{First, Meta};
use crate::registry::Effect::{Pure, SideEffect};
use crate::registry::{ops, MetaCx, MetaOut, OpSpec};
use crate::types::Type;

type R = Result<MetaOut, String>;

/// `copy_(copy_from, copy_to)`: writes `copy_from` into `copy_to` and returns it.
fn copy(cx: &MetaCx) -> R {
    let from = cx.tensor_param("copy_from")?;
    let to = cx.tensor_param("copy_to")?;
    if from.shape != to.shape || from.dtype != to.dtype || from.device != to.device {
        return Err(format!(
            "{}: cannot copy {} into {}",
            cx.op,
            Type::Tensor(from),
            Type::Tensor(to)
        ));
    }
    one(to)
}

/// `update_aliases((t, ...))`: the same tensors, marking that later reads see updates.
fn update_aliases(cx: &MetaCx) -> R {
    let items = cx
        .param("aliases")?
        .as_seq()
        .ok_or_else(|| format!("{}: expects a tuple of tensors", cx.op))?;
    let types = items
        .iter()
        .map(|a: &Arg| cx.type_of(a))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(MetaOut::Types(types))
}

const OPS: &[OpSpec] = &[
    op(
        ops::UNPACK_SEQUENCE,
        &["unpack_sequence"],
        Pure,
        "a, /, *rest, **kwargs",
        Meta,
        declared,
    ),
    op(
        ops::CLEAR_COLLECTION,
        &["clear_mutable_collection"],
        SideEffect,
        "a, /",
        Meta,
        no_outputs,
    ),
    op(
        ops::COPY,
        &["copy_", "prims.copy_"],
        SideEffect,
        "copy_from, copy_to, /, *, grad_enabled=False",
        First,
        copy,
    ),
    op(
        ops::UPDATE_ALIASES,
        &["update_aliases", "prims.update_aliases"],
        SideEffect,
        "aliases, /",
        Meta,
        update_aliases,
    ),
    op("prims.get_grad", &[], Pure, "a, /", First, identity),
];

/// This file's part of the table.
pub(crate) const PARTS: &[&[OpSpec]] = &[OPS];
