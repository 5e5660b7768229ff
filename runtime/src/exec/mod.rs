//! Running one trace: a [`Plan`] compiled from it (slots, instructions, collectives), the
//! [`Executor`] that runs a plan step by step on a [`Backend`], the [`Kernel`]s a backend
//! implements, the op table's [`KERNELS`] entries that map each op to one, and the
//! [`Recording`]s of what a step did and when.

pub(crate) mod adaptive_max_pool;
pub(crate) mod attention;
pub(crate) mod backend;
pub(crate) mod bilinear;
pub(crate) mod binary_fallback;
pub(crate) mod bool_ops;
pub(crate) mod composer;
pub(crate) mod composite;
pub(crate) mod conv_transpose;
pub(crate) mod cosine_similarity;
pub(crate) mod executor;
pub(crate) mod grouped_mm;
pub(crate) mod im2col;
pub(crate) mod kernel;
pub(crate) mod kernel_ops;
pub(crate) mod logsumexp;
pub(crate) mod memory_plan;
pub(crate) mod metrics;
pub(crate) mod nextafter;
pub(crate) mod plan;
pub(crate) mod pointwise_loss;
pub(crate) mod region;
pub(crate) mod setitem;
pub mod unrunnable;
pub(crate) mod vocab_composite;

pub use backend::{Backend, Input, KernelError, PoolStats, RngKey};
pub use executor::{ExecError, Executor, RValue};
pub use kernel::{
    Activation, BinaryOp, BitOp, CompareOp, Decoded, Kernel, KeyItem, LossReduction, Mha, ReduceOp,
    Side, UnaryOp, VjpOutputs, Window2d,
};
pub use kernel_ops::{decode, kernel_entry, Decoder, KernelEntry, Ops, KERNELS};
pub use memory_plan::{is_view, Buffer, MemoryPlan, SizeClass, ALIGN};
pub use metrics::{
    busy, overlap, timeline_json, BucketRecord, Clock, Event, OverlapSummary, Recording, Span,
    StepMetrics,
};
pub use plan::{
    ArgSpec, CollectiveInfo, CollectiveKind, Instr, InstrKind, MissingKernel, Plan, PlanError,
    Slot, PLANNED_OPS,
};
pub use region::{FusedLoop, LaneOp, RegionProgram, Src, Step};
