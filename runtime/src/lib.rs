//! tracepass-runtime: hosts the `tracepass` command line. The executor, backends, communicators
//! and trainer belong here too (next issue).

pub mod cli;
