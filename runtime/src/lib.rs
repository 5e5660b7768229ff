//! tracepass-runtime: executes traces (CPU backend, thread communicator), trains, and hosts the
//! `tracepass` command line.

pub mod cli;
pub mod trainer;
