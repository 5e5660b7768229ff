//! The Pass trait and what passes share.

use std::time::Duration;
use tracepass_ir::{OpRegistry, Program, VerifyError};

/// Whether a pass changed the program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Changed {
    Yes,
    No,
}

impl From<bool> for Changed {
    fn from(b: bool) -> Changed {
        if b {
            Changed::Yes
        } else {
            Changed::No
        }
    }
}

/// State shared by the passes of one pipeline run.
pub struct PassContext<'r> {
    pub registry: &'r OpRegistry,
    /// Counters passes report (`ddp.buckets`, `dce.removed`), in insertion order.
    pub stats: Vec<(String, u64)>,
    /// Named findings passes report (`ddp.frozen`: the frozen parameters it left alone).
    pub notes: Vec<(String, String)>,
}

impl<'r> PassContext<'r> {
    pub fn new(registry: &'r OpRegistry) -> Self {
        PassContext {
            registry,
            stats: Vec::new(),
            notes: Vec::new(),
        }
    }
    /// Reports a counter.
    pub fn stat(&mut self, key: impl Into<String>, value: u64) {
        self.stats.push((key.into(), value));
    }
    /// Reports a finding a user should read (which tensors a pass left alone, and why).
    pub fn note(&mut self, key: impl Into<String>, text: impl Into<String>) {
        self.notes.push((key.into(), text.into()));
    }
}

/// A program transformation. Passes never execute anything.
pub trait Pass {
    /// The name used in pipelines (`ddp`, `sort-waits`).
    fn name(&self) -> &str;
    /// The pass with its options, as a pipeline would spell it.
    fn spec(&self) -> String {
        self.name().to_string()
    }
    fn run(&self, p: &mut Program, cx: &mut PassContext) -> Result<Changed, PassError>;
}

/// Why a pipeline could not be built or run.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    #[error("unknown pass `{name}`; valid passes: {valid}")]
    UnknownPass { name: String, valid: String },
    #[error("pass `{pass}` has no option `{option}`; valid options: {valid}")]
    UnknownOption {
        pass: String,
        option: String,
        valid: String,
    },
    #[error("pass `{pass}`: bad value `{value}` for `{option}`: {reason}")]
    BadValue {
        pass: String,
        option: String,
        value: String,
        reason: String,
    },
    #[error("pass `{pass}`: missing required option `{option}`")]
    MissingOption { pass: String, option: String },
    #[error("bad pipeline `{pipeline}` at character {at}: {reason}")]
    Syntax {
        pipeline: String,
        at: usize,
        reason: String,
    },
    #[error("pass `{pass}` failed: {message}")]
    Failed { pass: String, message: String },
    #[error("the IR is invalid after pass `{pass}`: {error}")]
    Verify { pass: String, error: VerifyError },
    #[error("the input is invalid (before any pass): {0}")]
    InvalidInput(VerifyError),
}

/// Per-pass result of a pipeline run.
#[derive(Clone, Debug)]
pub struct PassTiming {
    pub pass: String,
    pub time: Duration,
    pub changed: Changed,
}
