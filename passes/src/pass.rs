//! The pass traits and what passes share.

use crate::pipeline::Anchor;
use std::time::Duration;
use tracepass_ir::{Arg, OpRegistry, Program, Trace, ValueId, VerifyError};

/// Whether a pass changed the program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Changed {
    /// Something changed.
    Yes,
    /// Nothing changed.
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
    /// The ops the traces use (effects, meta functions).
    pub registry: &'r OpRegistry,
    /// Counters passes report (`ddp.buckets`, `dce.removed`), in insertion order.
    pub stats: Vec<(String, u64)>,
    /// Named findings passes report (`ddp.frozen`: the frozen parameters it left alone).
    pub notes: Vec<(String, String)>,
    /// Every counter with the pass and trace that reported it, in insertion order.
    pub stat_details: Vec<Stat>,
    /// Which traces the running pass changed (forward, backward), for their provenance.
    pub(crate) touched: [bool; 2],
    /// The running pass, as spelled in the pipeline.
    pub(crate) pass: String,
    /// The trace a trace-level pass is running on (its name).
    pub(crate) trace: Option<String>,
    /// The return places of the forward and of the backward the running pass changes on
    /// purpose ([`PassContext::changed_return`]): paths, everything under each included.
    pub(crate) changed_returns: [Vec<Vec<u32>>; 2],
}

/// A counter a pass reported, with where it comes from: a trace-level pass runs once per
/// trace, and its counters say which.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    /// The pass, as spelled in the pipeline.
    pub pass: String,
    /// The trace (by name) a trace-level pass reported it on; `None` for a program-level pass.
    pub trace: Option<String>,
    /// The counter's name (`dce.removed`).
    pub key: String,
    /// Its value.
    pub value: u64,
}

impl<'r> PassContext<'r> {
    /// A context for passes over traces that use the ops of `registry`.
    pub fn new(registry: &'r OpRegistry) -> Self {
        PassContext {
            registry,
            stats: Vec::new(),
            notes: Vec::new(),
            stat_details: Vec::new(),
            touched: [false; 2],
            pass: String::new(),
            trace: None,
            changed_returns: Default::default(),
        }
    }
    /// Reports a counter (`dce.removed`), listed in the run's [`crate::RunReport::stats`], and
    /// with the pass and trace that reported it in [`crate::RunReport::stat_details`].
    pub fn stat(&mut self, key: impl Into<String>, value: u64) {
        let key = key.into();
        self.stat_details.push(Stat {
            pass: self.pass.clone(),
            trace: self.trace.clone(),
            key: key.clone(),
            value,
        });
        self.stats.push((key, value));
    }
    /// The trace a trace-level pass is running on (its name); `None` in a program-level pass.
    pub fn current_trace(&self) -> Option<&str> {
        self.trace.as_deref()
    }
    /// Reports a finding a user should read (which tensors a pass left alone, and why).
    pub fn note(&mut self, key: impl Into<String>, text: impl Into<String>) {
        self.notes.push((key.into(), text.into()));
    }
    /// Records that a program-level pass changed the forward (or the backward): the pass's
    /// provenance line goes on the traces it changed (the backward when it names none).
    pub fn changed_trace(&mut self, forward: bool) {
        self.touched[usize::from(!forward)] = true;
    }

    /// Says the running pass changes on purpose the type of what the forward (or the
    /// backward; a lone trace is the backward) returns at `place`, and of everything under it:
    /// a path of indices into nested tuples, lists and dicts, as
    /// [`ReturnTypes::of`](tracepass_ir::ReturnTypes::of) gives them (`&[]`: the whole
    /// return). The manager holds every other place to the type it had before the pass; every
    /// other check still runs.
    pub fn changed_return(&mut self, forward: bool, place: &[u32]) {
        self.changed_returns[usize::from(!forward)].push(place.to_vec());
    }

    /// Declares the return places a change of the parameters' layout changes (`fsdp` takes
    /// shards where parameters were): in the forward, the `flat_args` entry of its return
    /// dict and each saved value that is a parameter; in the backward, each parameter's
    /// gradient. Call it on the program as it was before the pass. Model outputs and other
    /// saved values are still held to their types.
    pub fn changed_parameter_returns(&mut self, p: &Program) {
        let param_args: Vec<ValueId> = p
            .params
            .iter()
            .filter_map(|x| p.forward.args().get(x.forward_arg).copied())
            .collect();
        if let Arg::Tuple(items) = &p.forward.ret {
            if let Some(Arg::Dict(entries)) = items.first() {
                for (k, (key, _)) in entries.iter().enumerate() {
                    if key.as_str() == Some("flat_args") {
                        self.changed_return(true, &[0, k as u32]);
                    }
                }
            }
            if let Some(Arg::Tuple(saved)) = items.get(1) {
                if let Some(Arg::Tuple(first)) = saved.first() {
                    for (i, s) in first.iter().enumerate() {
                        if s.as_value().is_some_and(|v| param_args.contains(&v)) {
                            self.changed_return(true, &[1, 0, i as u32]);
                        }
                    }
                }
            }
        }
        for k in p.params.iter().filter_map(|x| x.grad_output) {
            self.changed_return(false, &[k as u32]);
        }
    }
}

/// A program-level transformation: it sees the forward, the backward and the parameters.
/// Passes never execute anything.
pub trait Pass {
    /// The name used in pipelines (`ddp`).
    fn name(&self) -> &str;
    /// The pass with its options, as a pipeline would spell it.
    fn spec(&self) -> String {
        self.name().to_string()
    }
    /// Rewrites `p`; says whether anything changed.
    fn run(&self, p: &mut Program, cx: &mut PassContext) -> Result<Changed, PassError>;
}

/// A trace-level transformation: it rewrites one trace at a time. In a pipeline it runs on
/// every trace of the program, or on the ones an anchor names (`forward(cse)`, `backward(dce)`).
pub trait TracePass {
    /// The name used in pipelines (`dce`).
    fn name(&self) -> &str;
    /// The pass with its options, as a pipeline would spell it. A pass built by a
    /// [`crate::PassRegistry`] is printed as its declaration spells its options, whatever this
    /// says; the default (the name) is for passes added by hand.
    fn spec(&self) -> String {
        self.name().to_string()
    }
    /// Rewrites `t`; says whether anything changed.
    fn run_on_trace(&self, t: &mut Trace, cx: &mut PassContext) -> Result<Changed, PassError>;
}

/// A trace-level pass on the traces an anchor selects (`None`: every trace of the program; a
/// lone trace has no forward).
pub struct OnTraces {
    /// The pass.
    pub pass: Box<dyn TracePass>,
    /// Which traces it runs on.
    pub anchor: Option<Anchor>,
}

impl OnTraces {
    /// `pass` on the traces `anchor` selects.
    pub fn new(pass: impl TracePass + 'static, anchor: Option<Anchor>) -> OnTraces {
        OnTraces {
            pass: Box::new(pass),
            anchor,
        }
    }
}

impl Pass for OnTraces {
    fn name(&self) -> &str {
        self.pass.name()
    }
    fn spec(&self) -> String {
        match self.anchor {
            Some(a) => format!("{}({})", a.name(), self.pass.spec()),
            None => self.pass.spec(),
        }
    }
    fn run(&self, p: &mut Program, cx: &mut PassContext) -> Result<Changed, PassError> {
        let lone = p.is_lone();
        let (run_fwd, run_bwd) = match self.anchor {
            None => (!lone, true),
            Some(Anchor::Forward) if lone => {
                return Err(PassError::NoForward { pass: self.spec() })
            }
            Some(Anchor::Forward) => (true, false),
            Some(Anchor::Backward) => (false, true),
        };
        let mut changed = false;
        let on = |t: &mut Trace, cx: &mut PassContext| {
            cx.trace = Some(t.name.clone());
            let r = self.pass.run_on_trace(t, cx);
            cx.trace = None;
            r
        };
        if run_fwd && on(&mut p.forward, cx)? == Changed::Yes {
            cx.touched[0] = true;
            changed = true;
        }
        if run_bwd && on(&mut p.backward, cx)? == Changed::Yes {
            cx.touched[1] = true;
            changed = true;
        }
        Ok(changed.into())
    }
}

/// Why a pipeline could not be built or run.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    /// A pipeline names a pass the registry does not know.
    #[error("unknown pass `{name}`; valid passes: {valid}")]
    UnknownPass {
        /// The name as written.
        name: String,
        /// The registered names.
        valid: String,
    },
    /// A pass is given an option it does not declare.
    #[error("pass `{pass}` has no option `{option}`; valid options: {valid}")]
    UnknownOption {
        /// The pass.
        pass: String,
        /// The option as written.
        option: String,
        /// The declared options.
        valid: String,
    },
    /// An option value of the wrong type or out of range.
    #[error("pass `{pass}`: bad value `{value}` for `{option}`: {reason}")]
    BadValue {
        /// The pass.
        pass: String,
        /// The option.
        option: String,
        /// The value as written.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A required option is missing.
    #[error("pass `{pass}`: missing required option `{option}`")]
    MissingOption {
        /// The pass.
        pass: String,
        /// The option.
        option: String,
    },
    /// A pipeline string that does not parse.
    #[error("bad pipeline `{pipeline}` at character {at}: {reason}")]
    Syntax {
        /// The pipeline.
        pipeline: String,
        /// Where (1-based character).
        at: usize,
        /// What was expected.
        reason: String,
    },
    /// A program-level pass under an anchor (`forward(ddp)`).
    #[error("pass `{pass}` rewrites the whole program and cannot be anchored to one trace (`{anchor}(...)`)")]
    NotTraceLevel {
        /// The pass.
        pass: String,
        /// The anchor it was put under.
        anchor: String,
    },
    /// A pass anchored to the forward of a lone trace.
    #[error("`{pass}`: a lone trace has no forward")]
    NoForward {
        /// The pass as spelled.
        pass: String,
    },
    /// A registration under a name already taken.
    #[error("a pass named `{name}` is already registered")]
    Duplicate {
        /// The name.
        name: String,
    },
    /// A declaration registered at the other level (`register_trace_pass` of a program-level
    /// declaration).
    #[error(
        "pass `{name}` is declared {declared}-level but registered as a {registered}-level pass"
    )]
    WrongLevel {
        /// The name.
        name: String,
        /// The level its declaration says.
        declared: &'static str,
        /// The level it was registered at.
        registered: &'static str,
    },
    /// A registration under a name pipelines cannot spell (or an anchor's name).
    #[error("`{name}` cannot name a pass: use letters, digits, `-` and `_`, and not `forward` or `backward`")]
    BadPassName {
        /// The name.
        name: String,
    },
    /// A [`crate::PassManager::remove`] or `insert` at a position past the end.
    #[error("no pass at position {at}: the pipeline has {len}")]
    NoSuchPosition {
        /// The position.
        at: usize,
        /// The pipeline's length.
        len: usize,
    },
    /// A pass refused its input.
    #[error("pass `{pass}` failed: {message}")]
    Failed {
        /// The pass.
        pass: String,
        /// Why.
        message: String,
    },
    /// A pass panicked (a bug in the pass); the manager caught it.
    #[error("pass `{pass}` failed: internal error: panicked: {message}")]
    Panicked {
        /// The pass.
        pass: String,
        /// The panic's message.
        message: String,
    },
    /// A pass's edits could not be applied.
    #[error("pass `{pass}`: {error}")]
    Rewrite {
        /// The pass.
        pass: String,
        /// What the rewriter refused.
        error: Box<tracepass_ir::RewriteError>,
    },
    /// The verifier rejected a pass's output.
    #[error("the IR is invalid after pass `{pass}`: {error}")]
    Verify {
        /// The pass.
        pass: String,
        /// Every violation.
        error: VerifyError,
    },
    /// The verifier rejected the pipeline's output (verification after each pass was off, so
    /// the pass that broke it is not known).
    #[error("the IR is invalid after the pipeline `{pipeline}` (verification after each pass was off): {error}")]
    VerifyAtEnd {
        /// The pipeline.
        pipeline: String,
        /// Every violation.
        error: VerifyError,
    },
    /// The verifier rejected the pipeline's input.
    #[error("the input is invalid (before any pass): {0}")]
    InvalidInput(VerifyError),
}

impl PassError {
    /// A [`PassError::Rewrite`] of pass `pass`.
    pub fn rewrite(pass: impl Into<String>, error: tracepass_ir::RewriteError) -> PassError {
        PassError::Rewrite {
            pass: pass.into(),
            error: Box::new(error),
        }
    }
    /// Whether the failure is a bug in a pass (it panicked, or left IR the verifier rejects,
    /// after it or at the end), not a pass refusing its input: what a reproducer is for.
    pub fn is_internal(&self) -> bool {
        matches!(
            self,
            PassError::Panicked { .. } | PassError::Verify { .. } | PassError::VerifyAtEnd { .. }
        )
    }
}

/// Per-pass result of a pipeline run.
#[derive(Clone, Debug)]
pub struct PassTiming {
    /// The pass as spelled.
    pub pass: String,
    /// How long it ran.
    pub time: Duration,
    /// Whether it changed the program.
    pub changed: Changed,
}
