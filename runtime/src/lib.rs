//! tracepass-runtime: runs rewritten traces on ranks. One folder per concern:
//!
//! - [`exec`]: a trace compiled to a [`Plan`] and run step by step by an [`Executor`] on a
//!   [`Backend`], whose [`exec::Kernel`]s each op of the op table maps to.
//! - [`cpu`] and `cuda` (feature `cuda`): the backends; `cuda` also holds the NCCL
//!   communicator.
//! - [`comm`]: the [`Communicator`] interface, [`comm::ThreadComm`] between thread ranks, and
//!   the rendezvous of process ranks.
//! - [`train`](mod@train): forward, loss, DDP backward and optimizer on N ranks, one rank loop for every
//!   backend; what `tracepass train` runs.
//! - [`sim`]: step time predicted on a modelled device and network.
//! - [`tensor`]: host [`Tensor`]s and safetensors files.
//!
//! The `tracepass` command line is its own crate, `tracepass-cli` (in `runtime/cli`).
//!
//! Training the built-in seed model for two steps on two ranks (threads on the CPU backend,
//! joined by a [`comm::ThreadComm`]); the backward is rewritten by the DDP pipeline:
//!
//! ```
//! use tracepass_runtime::{train, TrainConfig};
//! let cfg = TrainConfig {
//!     world_size: 2,
//!     steps: 2,
//!     // leave the threads where the OS puts them (doc tests run side by side)
//!     pin_ranks: false,
//!     ..TrainConfig::default()
//! };
//! let report = train(&cfg, &|step, loss| println!("step {step}: loss {loss}")).unwrap();
//! assert_eq!(report.losses.len(), 2);
//! assert!(report.losses.iter().all(|l| l.is_finite()), "{:?}", report.losses);
//! assert!(report.pipeline.starts_with("ddp("), "{}", report.pipeline);
//! ```

// Policy: no panics on user input. `unwrap()` is denied in library code (clippy checks it);
// `expect()` is used only for invariants the code itself established, its message naming the
// invariant. Everything a user controls (files, options, traces, ranks) returns a typed error.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod comm;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod exec;
pub mod run;
pub mod sim;
pub mod tensor;
pub mod train;

pub use comm::Communicator;
pub use exec::{Backend, Executor, Plan};
pub use tensor::Tensor;
pub use train::{train, Model, ModelSource, TrainConfig, TrainReport};
