//! Step-time simulator: a cost model of devices and links over rewritten traces, and the
//! memory a rank holds, from the same memory plans the executor runs with.

pub(crate) mod arena;
pub(crate) mod calibrate;
pub(crate) mod device;
pub(crate) mod memory;
pub(crate) mod simulate;

pub use arena::{predicted_arena, ArenaEstimate};
pub use calibrate::cpu_model;
pub use device::{named_link, parse_link, DeviceModel, LINK_NAMES};
pub use memory::{predict_memory, SimMemory, ADAMW_STATE_BYTES_PER_ELEMENT};
pub use simulate::{simulate, simulate_step, SimBucket, SimError, SimOptions, SimReport};
