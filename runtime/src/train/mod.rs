//! Training on N ranks: a [`Model`] (the seed example, a program, or an export directory),
//! its data and loss, the DDP-rewritten backward, the optimizer and checkpoints, and the one
//! rank loop that runs a step on any [`crate::exec::Backend`] and communicator.

pub(crate) mod affinity;
pub(crate) mod buffer_updates;
pub mod checkpoint;
pub(crate) mod data;
pub(crate) mod fingerprint;
pub(crate) mod finite;
pub(crate) mod keep_awake;
pub(crate) mod loss;
pub(crate) mod memory;
pub(crate) mod model;
pub(crate) mod optim;
pub(crate) mod rank_loop;
pub(crate) mod rank_threads;
pub mod shard;
pub mod sharded_checkpoint;
#[cfg(test)]
mod steady_alloc;
pub(crate) mod trainer;

pub use data::{file_params, seeded_params, Batch, DataSource};
pub use model::{
    cotangents_for, forward_output, forward_output_args, forward_output_at, Cotangent, DataArg,
    LossKind, Model, ModelError, ModelSource, SEED_BACKWARD, SEED_FORWARD,
};
pub use optim::{Optimizer, OptimizerKind};
pub use rank_loop::StepComm;
pub use trainer::{
    check_pipeline, check_trainable, local_gradients, local_gradients_at, panic_message,
    shards_parameters, train, train_with, Fault, TrainConfig, TrainError, TrainReport,
};
