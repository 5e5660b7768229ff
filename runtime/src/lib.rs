//! tracepass-runtime: runs rewritten traces on ranks.
//!
//! - [`backend::Backend`] and the [`cpu::CpuBackend`]: kernels over [`tensor::Tensor`]s.
//! - [`comm::Communicator`] and [`thread_comm::ThreadComm`]: collectives between ranks.
//! - [`plan::Plan`] and [`executor::Executor`]: a trace compiled to slots, run step by step.
//! - [`trainer`]: forward, loss, DDP backward, optimizer on N ranks; `tracepass train`.
//!
//! Training the built-in seed model for two steps on two ranks (threads on the CPU backend,
//! joined by a [`thread_comm::ThreadComm`]); the backward is rewritten by the DDP pipeline:
//!
//! ```
//! use tracepass_runtime::trainer::{train, TrainConfig};
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

pub mod affinity;
pub mod alloc;
pub mod backend;
pub mod buffer_updates;
pub mod checkpoint;
pub mod cli;
pub mod comm;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod data;
pub mod executor;
pub mod fingerprint;
pub mod kernel;
pub mod kernel_ops;
pub mod launch;
pub mod loss;
pub mod memory;
pub mod metrics;
pub mod model;
pub mod optim;
pub mod plan;
pub mod rank_loop;
pub mod reduction;
pub mod rendezvous;
pub mod sim;
pub mod simulate_cmd;
pub mod tensor;
pub mod tensorfile;
pub mod thread_comm;
pub mod train_cmd;
pub mod trainer;
pub mod verify_cmd;
