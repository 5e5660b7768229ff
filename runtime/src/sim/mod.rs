//! Step-time simulator: a cost model of devices and links over rewritten traces, and the
//! memory a rank holds, from the same memory plans the executor runs with.

pub(crate) mod calibrate;
pub(crate) mod device;
pub(crate) mod memory;
pub(crate) mod simulate;

pub use calibrate::cpu_model;
pub use device::{named_link, parse_link, DeviceModel, LINK_NAMES};
pub use memory::{predicted_memory, MemoryEstimate};
pub use simulate::{simulate, SimBucket, SimError, SimOptions, SimReport};
