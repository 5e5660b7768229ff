//! Instrumentation: code that runs around every pass of a pipeline without being part of any
//! pass, as MLIR's `PassInstrumentation`. IR printing ([`IrPrinter`]) and reproducers
//! ([`ReproducerWriter`]) are instrumentations; register your own with
//! [`crate::PassManager::instrument`].
//!
//! ```
//! use std::{cell::RefCell, rc::Rc};
//! use tracepass_ir::{synth, OpRegistry, Program};
//! use tracepass_passes::{Pass, PassInstrumentation, PassManager, PassTiming};
//! /// Counts the nodes of the backward after each pass.
//! struct Sizes(Rc<RefCell<Vec<(String, usize)>>>);
//! impl PassInstrumentation for Sizes {
//!     fn after_pass(&mut self, pass: &dyn Pass, p: &Program, _: &PassTiming) {
//!         self.0.borrow_mut().push((pass.spec(), p.backward.node_count()));
//!     }
//! }
//! let sizes = Rc::new(RefCell::new(Vec::new()));
//! let mut pm = PassManager::parse("ddp(world_size=2),dce").unwrap();
//! pm.instrument(Sizes(sizes.clone()));
//! let mut program = synth::mlp_program(&synth::MlpSpec::seed()).unwrap();
//! pm.run(&mut program, OpRegistry::builtin()).unwrap();
//! assert_eq!(sizes.borrow().len(), 2);
//! ```

use crate::manager::{reproducer_path, PrintIr, Reproducer};
use crate::pass::{Changed, Pass, PassError, PassTiming};
use std::path::PathBuf;
use tracepass_ir::{print_trace, Module, Program};

/// Hooks the pass manager calls around a pipeline. Every method has an empty default.
pub trait PassInstrumentation {
    /// Before the first pass, with the pipeline's input and its printed form.
    fn before_pipeline(&mut self, _input: &Program, _pipeline: &str) {}
    /// Before each pass.
    fn before_pass(&mut self, _pass: &dyn Pass, _program: &Program) {}
    /// After each pass that succeeded (and whose output verified, when verification is on).
    fn after_pass(&mut self, _pass: &dyn Pass, _program: &Program, _run: &PassTiming) {}
    /// After a failure: `pass` is the pass that failed (`<input>` when the input did not
    /// verify, `<end>` when the pipeline's output did not), `program` as the failure left it.
    fn after_failure(&mut self, _pass: &str, _program: &Program, _error: &PassError) {}
}

/// The printed traces of a program: the backward only, or every trace (forward, then
/// backward), under a heading.
pub fn dump_program(heading: &str, p: &Program, backward_only: bool) -> String {
    let mut s = format!("// ----- {heading} -----\n");
    if p.is_lone() || backward_only {
        s += &print_trace(&p.backward);
    } else {
        s += &print_trace(&p.forward);
        s += &print_trace(&p.backward);
    }
    s
}

/// Prints the IR around the passes [`PrintIr`] names, to a sink of your choice (stderr, a
/// vector, a log), as each pass ends: a later failure still shows what came before.
pub struct IrPrinter<F: FnMut(String)> {
    /// When to print.
    pub when: PrintIr,
    /// Print the backward only (the command line's choice), not every trace.
    pub backward_only: bool,
    sink: F,
}

impl<F: FnMut(String)> IrPrinter<F> {
    /// A printer that hands each dump to `sink`.
    pub fn new(when: PrintIr, sink: F) -> Self {
        IrPrinter {
            when,
            backward_only: false,
            sink,
        }
    }
}

impl<F: FnMut(String)> PassInstrumentation for IrPrinter<F> {
    fn before_pass(&mut self, pass: &dyn Pass, p: &Program) {
        let name = pass.name();
        if self.when.before.iter().any(|b| b == name) {
            (self.sink)(dump_program(
                &format!("IR before {name}"),
                p,
                self.backward_only,
            ));
        }
    }
    fn after_pass(&mut self, pass: &dyn Pass, p: &Program, run: &PassTiming) {
        let name = pass.name();
        if self.when.after_all
            || self.when.after.iter().any(|a| a == name)
            || (self.when.after_change && run.changed == Changed::Yes)
        {
            (self.sink)(dump_program(
                &format!("IR after {name}"),
                p,
                self.backward_only,
            ));
        }
    }
    /// The IR a pass left that the verifier rejected is printed too: it is what to look at.
    fn after_failure(&mut self, pass: &str, p: &Program, error: &PassError) {
        if matches!(error, PassError::Verify { .. })
            && (self.when.after_all
                || self.when.after_change
                || self.when.after.iter().any(|a| a == pass))
        {
            (self.sink)(dump_program(
                &format!("IR after {pass}"),
                p,
                self.backward_only,
            ));
        }
    }
}

/// Writes a [`Reproducer`] (the pipeline's input and the pipeline) to a folder when a run
/// fails. It keeps a copy of the input from the start of each run: a cost worth paying only
/// where a failure must be replayable.
pub struct ReproducerWriter {
    dir: PathBuf,
    input: Option<(Program, String)>,
    /// The file written for the last failure, if one was.
    pub written: Option<PathBuf>,
}

impl ReproducerWriter {
    /// A writer into `dir` (numbered files, see [`reproducer_path`]).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        ReproducerWriter {
            dir: dir.into(),
            input: None,
            written: None,
        }
    }
}

impl PassInstrumentation for ReproducerWriter {
    fn before_pipeline(&mut self, input: &Program, pipeline: &str) {
        self.input = Some((input.clone(), pipeline.to_string()));
        self.written = None;
    }
    fn after_failure(&mut self, pass: &str, _: &Program, error: &PassError) {
        let Some((input, pipeline)) = &self.input else {
            return;
        };
        let repro = Reproducer {
            pipeline: pipeline.clone(),
            failed_pass: pass.to_string(),
            error: error.to_string(),
            input: if input.is_lone() {
                Module::Trace(input.backward.clone())
            } else {
                Module::Program(input.clone())
            },
        };
        let path = reproducer_path(&self.dir);
        let written = serde_json::to_vec_pretty(&repro)
            .ok()
            .and_then(|bytes| tracepass_ir::fsio::write_atomic(&path, &bytes).ok());
        self.written = written.map(|_| path);
    }
}
