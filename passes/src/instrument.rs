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
/// fails. By default it keeps a copy of the input from the start of each run: a cost worth
/// paying only where a failure must be replayable; [`ReproducerWriter::reload_input`] reads
/// the input again instead, when it fails. `tracepass opt` writes its reproducers with it.
pub struct ReproducerWriter {
    dir: PathBuf,
    pipeline: String,
    /// The input, copied at the start of the run (without a reloader).
    input: Option<Program>,
    reload: Option<InputReloader>,
    internal_only: bool,
    /// The file written for the last failure, if one was.
    pub written: Option<PathBuf>,
    /// Why the last failure's reproducer could not be written, if it could not.
    pub error: Option<ReproducerError>,
}

/// Why a reproducer could not be written (the folder, the input read again).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ReproducerError(pub String);

/// Reads a pipeline's input again (from the files it came from).
type InputReloader = Box<dyn FnMut() -> Result<Module, String>>;

impl ReproducerWriter {
    /// A writer into `dir` (numbered files, see [`reproducer_path`]), for every failure.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        ReproducerWriter {
            dir: dir.into(),
            pipeline: String::new(),
            input: None,
            reload: None,
            internal_only: false,
            written: None,
            error: None,
        }
    }
    /// Reads the input with `reload` when a failure needs it, instead of copying it at the
    /// start of every run (a million-node program costs more to copy than the passes take).
    /// `reload` must give the pipeline's input as it was: read again from its files.
    pub fn reload_input(
        mut self,
        reload: impl FnMut() -> Result<Module, String> + 'static,
    ) -> Self {
        self.reload = Some(Box::new(reload));
        self
    }
    /// Writes only for failures that are bugs in a pass ([`PassError::is_internal`]): a pass
    /// refusing its input is an error to fix in the input, with nothing to replay.
    pub fn internal_only(mut self) -> Self {
        self.internal_only = true;
        self
    }
    /// The folder reproducers go to.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    fn write(&mut self, pass: &str, error: &PassError) -> Result<PathBuf, String> {
        let input = match (&mut self.reload, &self.input) {
            (Some(reload), _) => reload()?,
            (None, Some(p)) if p.is_lone() => Module::Trace(p.backward.clone()),
            (None, Some(p)) => Module::Program(p.clone()),
            (None, None) => return Err("the run's input was not kept".into()),
        };
        let repro = Reproducer {
            pipeline: self.pipeline.clone(),
            failed_pass: pass.to_string(),
            error: error.to_string(),
            input,
        };
        let path = reproducer_path(&self.dir);
        let bytes = serde_json::to_vec_pretty(&repro).map_err(|e| e.to_string())?;
        tracepass_ir::fsio::write_atomic(&path, &bytes).map_err(|e| e.to_string())?;
        Ok(path)
    }
}

impl PassInstrumentation for ReproducerWriter {
    fn before_pipeline(&mut self, input: &Program, pipeline: &str) {
        self.pipeline = pipeline.to_string();
        self.input = self.reload.is_none().then(|| input.clone());
        self.written = None;
        self.error = None;
    }
    fn after_failure(&mut self, pass: &str, _: &Program, error: &PassError) {
        if self.internal_only && !error.is_internal() {
            return;
        }
        match self.write(pass, error) {
            Ok(path) => self.written = Some(path),
            Err(e) => self.error = Some(ReproducerError(e)),
        }
    }
}
