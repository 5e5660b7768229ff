//! Communication: Thunder's DDP prims (`torch_all_reduce_prim_impl`, `torch_pack_prim_impl`,
//! ...) and tracepass's bucketed forms of them, one canonical op each.

use super::op;
use crate::meta::{all_gather, all_reduce, bucket_pack, identity, reduce_scatter, unpack, wait};
use crate::registry::DTypeRule::{First, Meta};
use crate::registry::Effect::{Collective, Pure};
use crate::registry::{ops, OpSpec};

const OPS: &[OpSpec] = &[
    op(
        ops::ALL_REDUCE,
        &[
            "torch_all_reduce_prim_impl",
            "thunder.distributed.prims.all_reduce",
        ],
        Collective,
        "a, op=None, group=None, do_async=True, skip_clone=False",
        First,
        all_reduce,
    ),
    // tracepass's sharded collectives (the `fsdp` pass): flat buffers, resolved by `wait`
    op(
        ops::ALL_GATHER,
        &[],
        Collective,
        "a, group=None, /, *, world_size",
        First,
        all_gather,
    ),
    op(
        ops::REDUCE_SCATTER,
        &[],
        Collective,
        "a, op=None, group=None, /, *, world_size",
        First,
        reduce_scatter,
    ),
    op(
        ops::WAIT,
        &["torch_wait_prim_impl", "thunder.distributed.prims.wait"],
        Collective,
        "a, /",
        Meta,
        wait,
    ),
    op(
        ops::BUCKET_PACK,
        &["torch_pack_prim_impl", "thunder.distributed.prims.pack"],
        Pure,
        "tensors, bucket_key=None, /, *, bucket=None, offsets=None, nbytes=None",
        Meta,
        bucket_pack,
    ),
    op(
        ops::UNPACK,
        &["torch_unpack_prim_impl", "thunder.distributed.prims.unpack"],
        Pure,
        "buffer, tensors=None, bucket_key=None, /, *, bucket=None, offsets=None, shapes=None",
        Meta,
        unpack,
    ),
    op(
        ops::UPDATE_BUCKET_VIEW,
        &[
            "torch_update_bucket_view_prim_impl",
            "thunder.distributed.prims.update_bucket_view",
        ],
        Pure,
        "a, index, bucket_key, /",
        First,
        identity,
    ),
];

/// This file's part of the table.
pub(crate) const PARTS: &[&[OpSpec]] = &[OPS];
