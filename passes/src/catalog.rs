//! The built-in passes' declarations, and the registry that holds them.

use crate::accumulate::AccumulateGrads;
use crate::canonicalize::Canonicalize;
use crate::conv_input_grad::ConvInputGrad;
use crate::cse::Cse;
use crate::dce::Dce;
use crate::ddp::{Ddp, DdpOptions, DDP};
use crate::fold_conv_crop::FoldConvCrop;
use crate::fsdp::{Fsdp, FsdpOptions, FSDP};
use crate::fuse_elementwise::FuseElementwise;
use crate::no_sync::NoSync;
use crate::pass::PassError;
use crate::pipeline::PassSpec;
use crate::registry::{BuiltPass, PassDecl, PassLevel, PassRegistry};
use crate::remat::Remat;
use crate::sort_waits::SortWaits;

/// `sort-waits`: see [`crate::sort_waits`].
pub static SORT_WAITS: PassDecl = PassDecl {
    name: "sort-waits",
    help: "collectives as early as their operands allow, waits right before their first reader",
    level: PassLevel::Trace,
    options: &[],
};
/// `no-sync`: see [`crate::no_sync`].
pub static NO_SYNC: PassDecl = PassDecl {
    name: "no-sync",
    help: "removes gradient synchronization (divisions, packs, all-reduces, waits, unpacks)",
    level: PassLevel::Trace,
    options: &[],
};
/// `accumulate-grads`: see [`crate::accumulate`].
pub static ACCUMULATE_GRADS: PassDecl = PassDecl {
    name: "accumulate-grads",
    help: "adds each parameter gradient to a new `acc_<grad>` argument (gradient accumulation)",
    level: PassLevel::Program,
    options: &[],
};
/// `dce`: see [`crate::dce`].
pub static DCE: PassDecl = PassDecl {
    name: "dce",
    help: "removes pure nodes whose outputs nothing reads or returns",
    level: PassLevel::Trace,
    options: &[],
};
/// `cse`: see [`crate::cse`].
pub static CSE: PassDecl = PassDecl {
    name: "cse",
    help: "replaces a pure node identical to an earlier one by it",
    level: PassLevel::Trace,
    options: &[],
};

/// `canonicalize`: see [`crate::canonicalize`].
pub static CANONICALIZE: PassDecl = PassDecl {
    name: "canonicalize",
    help: "exact algebraic identities (x*1, x/1, x-0, -(-x)) and dead casts and reshapes",
    level: PassLevel::Trace,
    options: &[],
};

/// `fuse-elementwise`: see [`mod@crate::fuse_elementwise`].
pub static FUSE_ELEMENTWISE: PassDecl = PassDecl {
    name: "fuse-elementwise",
    help: "chains of elementwise and broadcast ops, each value read once, become fusion regions",
    level: PassLevel::Trace,
    options: &[],
};

/// `fold-conv-crop`: see [`mod@crate::fold_conv_crop`].
pub static FOLD_CONV_CROP: PassDecl = PassDecl {
    name: "fold-conv-crop",
    help: "a convolution whose output is only cropped computes just the outputs it keeps",
    level: PassLevel::Trace,
    options: &[],
};

/// `conv-input-grad`: see [`mod@crate::conv_input_grad`].
pub static CONV_INPUT_GRAD: PassDecl = PassDecl {
    name: "conv-input-grad",
    help: "Thunder's input gradient of a convolution (spread, flipped, cropped) becomes one transposed convolution",
    level: PassLevel::Trace,
    options: &[],
};

/// `remat`: see [`mod@crate::remat`].
pub static REMAT: PassDecl = PassDecl {
    name: "remat",
    help: "the backward recomputes saved values that are elementwise functions of other saved values; the forward stops saving them",
    level: PassLevel::Program,
    options: &[],
};

/// The built-in passes, in the order `--help` lists them.
pub(crate) fn builtin_registry() -> PassRegistry {
    let mut r = PassRegistry::new();
    let all = [
        r.register_pass(&DDP, |o| Ddp::new(DdpOptions::from_values(o)))
            .map(|_| ()),
        r.register_pass(&FSDP, |o| Fsdp::new(FsdpOptions::from_values(o)))
            .map(|_| ()),
        r.register_trace_pass(&SORT_WAITS, |_| Ok(SortWaits))
            .map(|_| ()),
        r.register_trace_pass(&NO_SYNC, |_| Ok(NoSync)).map(|_| ()),
        r.register_pass(&ACCUMULATE_GRADS, |_| Ok(AccumulateGrads))
            .map(|_| ()),
        r.register_trace_pass(&DCE, |_| Ok(Dce)).map(|_| ()),
        r.register_trace_pass(&CSE, |_| Ok(Cse)).map(|_| ()),
        r.register_trace_pass(&CANONICALIZE, |_| Ok(Canonicalize))
            .map(|_| ()),
        r.register_pass(&REMAT, |_| Ok(Remat)).map(|_| ()),
        r.register_trace_pass(&FUSE_ELEMENTWISE, |_| Ok(FuseElementwise))
            .map(|_| ()),
        r.register_trace_pass(&FOLD_CONV_CROP, |_| Ok(FoldConvCrop))
            .map(|_| ()),
        r.register_trace_pass(&CONV_INPUT_GRAD, |_| Ok(ConvInputGrad))
            .map(|_| ()),
    ];
    for res in all {
        res.expect("built-in passes have distinct, valid names");
    }
    r
}

/// Builds a built-in pass from its spec; unknown names and options are errors that list what
/// is valid. Use [`PassRegistry::build`] for a registry with passes of your own.
pub fn build_pass(spec: &PassSpec) -> Result<BuiltPass, PassError> {
    PassRegistry::builtin().build(spec)
}
