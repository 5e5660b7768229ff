//! The PassManager: runs a pipeline with verification after every pass, IR printing, timing, and
//! a reproducer file when a pass fails.

use crate::instrument::{IrPrinter, PassInstrumentation, ReproducerError, ReproducerWriter};
use crate::pass::{Changed, OnTraces, Pass, PassContext, PassError, PassTiming, Stat, TracePass};
use crate::pipeline::{parse_pipeline, print_pipeline, PassSpec};
use crate::registry::{BuiltPass, PassRegistry};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Instant;
use tracepass_ir::{
    verify_return_types, verify_with, Module, OpRegistry, Program, Provenance, ReturnTypes, Trace,
};

/// When to print the IR (every trace of the program: forward, then backward).
#[derive(Clone, Debug, Default)]
pub struct PrintIr {
    /// Before each pass with one of these names.
    pub before: Vec<String>,
    /// After each pass with one of these names.
    pub after: Vec<String>,
    /// After every pass.
    pub after_all: bool,
    /// After every pass that changed the program.
    pub after_change: bool,
}

/// A pass pipeline and how to run it.
pub struct PassManager {
    passes: Vec<Box<dyn Pass>>,
    /// Hooks around every pass ([`PassManager::instrument`]).
    instrumentations: std::cell::RefCell<Vec<Box<dyn PassInstrumentation>>>,
    /// Verify every trace before the first pass, and after each pass every trace whose
    /// [fingerprint](Trace::fingerprint) changed, whatever the pass says it changed (on by
    /// default).
    pub verify_each: bool,
    /// Without `verify_each`: verify the traces the pipeline changed once, after its last pass
    /// (on by default; off only to time passes alone).
    pub verify_at_end: bool,
    /// When to print the IR.
    pub print_ir: PrintIr,
    /// Record pass times in the provenance (off by default so output is deterministic).
    pub record_time: bool,
    /// Folder for reproducer files when a pass fails (`None`: none written).
    pub reproducer_dir: Option<PathBuf>,
    /// A reproducer writer of the caller's making ([`PassManager::reproducer`]), in place of
    /// the one `reproducer_dir` makes.
    reproducer: std::cell::RefCell<Option<ReproducerWriter>>,
}

/// What a pipeline run produced besides the program.
#[derive(Clone, Debug, Default)]
pub struct RunReport {
    /// Each pass's time and whether it changed the program, in pipeline order.
    pub timings: Vec<PassTiming>,
    /// The counters passes reported, in order.
    pub stats: Vec<(String, u64)>,
    /// The same counters with the pass and trace that reported each.
    pub stat_details: Vec<Stat>,
    /// Named findings of the passes (`ddp.frozen`, `ddp.inputs`), in order.
    pub notes: Vec<(String, String)>,
    /// IR dumps requested with the print options, in order, each with a heading.
    pub dumps: Vec<String>,
    /// For a failed run: why no reproducer could be written, where one was due (a folder
    /// that cannot be written, an input that cannot be read again).
    pub reproducer_error: Option<ReproducerError>,
}

/// The input of a failed pipeline, replayable with `tracepass opt --reproduce FILE`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Reproducer {
    /// The pipeline that failed.
    pub pipeline: String,
    /// The pass that failed.
    pub failed_pass: String,
    /// Its error, printed.
    pub error: String,
    /// The pipeline's input.
    pub input: Module,
}

impl Reproducer {
    /// Reads a reproducer file.
    pub fn load(path: &Path) -> Result<Reproducer, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        serde_json::from_slice(&bytes)
            .map_err(|e| format!("{}: not a reproducer: {e}", path.display()))
    }
}

/// Failure of a run: the error, the reproducer written for it (if any), and what the passes
/// before it reported.
#[derive(Debug, thiserror::Error)]
#[error("{error}{}", reproducer.as_ref().map(|p| format!("\nreproducer written to {}", p.display())).unwrap_or_default())]
pub struct RunError {
    /// What went wrong.
    pub error: PassError,
    /// The reproducer file written for it, if any (boxed, as the report: a `Result` of a
    /// run stays small).
    pub reproducer: Option<Box<Path>>,
    /// What the run reported up to the failure: the passes that ran, their statistics and
    /// the IR dumps asked for (the IR after the last good pass shows what the failing one
    /// was given).
    pub report: Box<RunReport>,
}

impl RunError {
    /// A failure outside a run (building its passes): no reproducer, nothing reported.
    pub fn new(error: PassError) -> RunError {
        RunError {
            error,
            reproducer: None,
            report: Box::default(),
        }
    }
}

/// Where the next reproducer in `dir` goes: `tracepass-reproducer-<pid>-<n>.json`, numbered
/// per process, past any file already there, so that several failures of one process each
/// keep their own.
pub fn reproducer_path(dir: &Path) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    loop {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = dir.join(format!(
            "tracepass-reproducer-{}-{n}.json",
            std::process::id()
        ));
        if !path.exists() {
            return path;
        }
    }
}

/// The message of a caught panic.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".into()
    }
}

impl PassManager {
    /// An empty pipeline that verifies after each pass.
    pub fn new() -> PassManager {
        PassManager {
            passes: Vec::new(),
            instrumentations: Default::default(),
            verify_each: true,
            verify_at_end: true,
            print_ir: PrintIr::default(),
            record_time: false,
            reproducer_dir: None,
            reproducer: Default::default(),
        }
    }
    /// Builds a manager from a pipeline string of built-in passes.
    pub fn parse(pipeline: &str) -> Result<PassManager, PassError> {
        PassManager::parse_with(PassRegistry::builtin(), pipeline)
    }
    /// Builds a manager from a pipeline string of the passes `registry` knows.
    pub fn parse_with(registry: &PassRegistry, pipeline: &str) -> Result<PassManager, PassError> {
        PassManager::from_specs(registry, &parse_pipeline(pipeline)?)
    }
    /// Builds a manager from a pipeline value (passes `registry` knows, with their options),
    /// as a program builds one without writing a string: `[ddp_options.spec(),
    /// PassSpec::new("sort-waits")]`.
    pub fn from_specs(
        registry: &PassRegistry,
        specs: &[PassSpec],
    ) -> Result<PassManager, PassError> {
        let mut pm = PassManager::new();
        for s in specs {
            pm.passes.push(build(registry, s)?);
        }
        Ok(pm)
    }
    /// Appends a program-level pass.
    pub fn add(&mut self, p: impl Pass + 'static) -> &mut Self {
        self.passes.push(Box::new(p));
        self
    }
    /// Appends a boxed program-level pass.
    pub fn add_boxed(&mut self, p: Box<dyn Pass>) -> &mut Self {
        self.passes.push(p);
        self
    }
    /// Appends a trace-level pass that runs on every trace of the program.
    pub fn add_trace_pass(&mut self, p: impl TracePass + 'static) -> &mut Self {
        self.add(OnTraces::new(p, None))
    }
    /// Appends the passes of a pipeline string, built from `registry`.
    pub fn extend_parsed(
        &mut self,
        registry: &PassRegistry,
        pipeline: &str,
    ) -> Result<&mut Self, PassError> {
        let built = parse_pipeline(pipeline)?
            .iter()
            .map(|s| build(registry, s))
            .collect::<Result<Vec<_>, _>>()?;
        self.passes.extend(built);
        Ok(self)
    }
    /// Inserts a pass at position `at` (0: first; `len()`: last).
    pub fn insert(&mut self, at: usize, p: Box<dyn Pass>) -> Result<&mut Self, PassError> {
        if at > self.passes.len() {
            return Err(PassError::NoSuchPosition {
                at,
                len: self.passes.len(),
            });
        }
        self.passes.insert(at, p);
        Ok(self)
    }
    /// Removes the pass at position `at` and returns it.
    pub fn remove(&mut self, at: usize) -> Result<Box<dyn Pass>, PassError> {
        if at >= self.passes.len() {
            return Err(PassError::NoSuchPosition {
                at,
                len: self.passes.len(),
            });
        }
        Ok(self.passes.remove(at))
    }
    /// Where the first pass named `name` is.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.passes.iter().position(|p| p.name() == name)
    }
    /// How many passes the pipeline has.
    pub fn len(&self) -> usize {
        self.passes.len()
    }
    /// Whether the pipeline has no pass.
    pub fn is_empty(&self) -> bool {
        self.passes.is_empty()
    }
    /// The pipeline, printed back.
    pub fn pipeline(&self) -> String {
        let specs: Vec<PassSpec> = self
            .passes
            .iter()
            .flat_map(|p| {
                parse_pipeline(&p.spec())
                    .ok()
                    .filter(|v| !v.is_empty())
                    .unwrap_or_else(|| vec![PassSpec::new(p.name())])
            })
            .collect();
        print_pipeline(&specs)
    }

    /// Adds an instrumentation: its hooks run around every pass of every later run, after
    /// the manager's own IR printing and reproducer.
    pub fn instrument(&mut self, i: impl PassInstrumentation + 'static) -> &mut Self {
        self.instrumentations.get_mut().push(Box::new(i));
        self
    }

    /// Writes reproducers with `w` (its folder, which failures, how it keeps the input), in
    /// place of the writer [`PassManager::reproducer_dir`] makes; [`RunError::reproducer`]
    /// names what it wrote.
    pub fn reproducer(&mut self, w: ReproducerWriter) -> &mut Self {
        *self.reproducer.get_mut() = Some(w);
        self
    }

    /// Runs every pass in order on `p`; with `verify_each`, verifies the input and, after each
    /// pass, every trace it changed.
    pub fn run(&self, p: &mut Program, reg: &OpRegistry) -> Result<RunReport, RunError> {
        let mut user = self.instrumentations.borrow_mut();
        // the manager's own printing and reproducer are instrumentations too, run first
        let dumps = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let sink = dumps.clone();
        let mut printer = IrPrinter::new(self.print_ir.clone(), move |d| sink.borrow_mut().push(d));
        // the input is kept only when a failure would write a reproducer of it (a copy of a
        // million-node program costs more than the passes)
        let mut own = self.reproducer_dir.as_ref().map(ReproducerWriter::new);
        let mut given = self.reproducer.borrow_mut();
        let mut repro = given.as_mut().or(own.as_mut());
        let mut hooks: Vec<&mut dyn PassInstrumentation> = vec![&mut printer];
        if let Some(r) = repro.as_deref_mut() {
            hooks.push(r);
        }
        hooks.extend(
            user.iter_mut()
                .map(|b| &mut **b as &mut dyn PassInstrumentation),
        );
        let pipeline = self.pipeline();
        for h in hooks.iter_mut() {
            h.before_pipeline(p, &pipeline);
        }
        let mut cx = PassContext::new(reg);
        let mut report = RunReport::default();
        let r = self.run_hooked(p, reg, &mut hooks, &mut cx, &mut report);
        drop(hooks);
        report.dumps = std::mem::take(&mut *dumps.borrow_mut());
        report.stats = std::mem::take(&mut cx.stats);
        report.stat_details = std::mem::take(&mut cx.stat_details);
        report.notes = std::mem::take(&mut cx.notes);
        match r {
            Ok(()) => Ok(report),
            Err(error) => Err(RunError {
                error,
                reproducer: repro
                    .as_ref()
                    .and_then(|r| r.written.clone())
                    .map(PathBuf::into_boxed_path),
                report: Box::new(RunReport {
                    reproducer_error: repro.as_ref().and_then(|r| r.error.clone()),
                    ..report
                }),
            }),
        }
    }

    fn run_hooked(
        &self,
        p: &mut Program,
        reg: &OpRegistry,
        hooks: &mut [&mut dyn PassInstrumentation],
        cx: &mut PassContext,
        report: &mut RunReport,
    ) -> Result<(), PassError> {
        let fail = |error: PassError,
                    pass: &str,
                    p: &Program,
                    hooks: &mut [&mut dyn PassInstrumentation]| {
            for h in hooks.iter_mut() {
                h.after_failure(pass, p, &error);
            }
            error
        };
        if self.verify_each {
            for t in traces(p) {
                if let Err(e) = verify_with(t, reg) {
                    return Err(fail(PassError::InvalidInput(e), "<input>", p, hooks));
                }
            }
        }
        // what each trace was when last verified (or at the start): a pass is checked on what
        // it changed, not on what it says it changed
        let fingerprinting = self.verify_each || self.verify_at_end;
        let fingerprints = |p: &Program| -> Vec<u64> {
            if fingerprinting {
                traces(p).into_iter().map(Trace::fingerprint).collect()
            } else {
                Vec::new()
            }
        };
        let start_prints = fingerprints(p);
        let mut prints = start_prints.clone();
        for pass in &self.passes {
            let name = pass.name().to_string();
            for h in hooks.iter_mut() {
                h.before_pass(pass.as_ref(), p);
            }
            // what each trace returns, which no pass may change (a fold that turns an f32
            // result into its i64 operand leaves a valid trace of the wrong type)
            let returns: Vec<ReturnTypes> = if self.verify_each {
                traces(p).into_iter().map(ReturnTypes::of).collect()
            } else {
                Vec::new()
            };
            let start = Instant::now();
            cx.touched = [false; 2];
            cx.changed_returns = Default::default();
            cx.pass = pass.spec();
            // a panicking pass is an error like any other (the program may be half rewritten)
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pass.run(p, cx)));
            let time = start.elapsed();
            let changed = match ran {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => return Err(fail(e, &name, p, hooks)),
                Err(payload) => {
                    let error = PassError::Panicked {
                        pass: name.clone(),
                        message: panic_message(payload.as_ref()),
                    };
                    return Err(fail(error, &name, p, hooks));
                }
            };
            // the traces the pass changed; a program-level pass that names none may have
            // changed either
            let [fwd, bwd] = cx.touched;
            if changed == Changed::Yes {
                // the provenance line goes on the traces the pass changed, the backward when
                // it names none
                let record = Provenance {
                    pass: pass.spec(),
                    millis: self.record_time.then_some(time.as_millis() as u64),
                };
                if fwd && !p.is_lone() {
                    p.forward.provenance.push(record.clone());
                }
                if bwd || !fwd {
                    p.backward.provenance.push(record);
                }
            }
            // a pass that changed nothing leaves verified IR verified, so only the traces whose
            // fingerprint changed are checked again (a pass that says it changed nothing, or
            // names the wrong trace, is checked all the same)
            if self.verify_each {
                let now = fingerprints(p);
                let mut bad = None;
                for ((t, was), is) in traces(p).into_iter().zip(&prints).zip(&now) {
                    if was != is {
                        if let Err(error) = verify_with(t, reg) {
                            bad = Some(error);
                            break;
                        }
                    }
                }
                if bad.is_none() {
                    // the places the pass declared it changes are not held to their types
                    let declared = if p.is_lone() {
                        &cx.changed_returns[1..]
                    } else {
                        &cx.changed_returns[..]
                    };
                    for ((t, before), places) in traces(p).into_iter().zip(&returns).zip(declared) {
                        if let Err(error) = verify_return_types(t, &before.without(places)) {
                            bad = Some(error);
                            break;
                        }
                    }
                }
                if let Some(error) = bad {
                    let error = PassError::Verify {
                        pass: name.clone(),
                        error,
                    };
                    return Err(fail(error, &name, p, hooks));
                }
                prints = now;
            }
            let timing = PassTiming {
                pass: pass.spec(),
                time,
                changed,
            };
            for h in hooks.iter_mut() {
                h.after_pass(pass.as_ref(), p, &timing);
            }
            report.timings.push(timing);
        }
        if !self.verify_each && self.verify_at_end {
            let now = fingerprints(p);
            let mut bad = None;
            for ((t, was), is) in traces(p).into_iter().zip(&start_prints).zip(&now) {
                if was != is {
                    if let Err(error) = verify_with(t, reg) {
                        bad = Some(error);
                        break;
                    }
                }
            }
            if let Some(error) = bad {
                let error = PassError::VerifyAtEnd {
                    pipeline: self.pipeline(),
                    error,
                };
                return Err(fail(error, "<end>", p, hooks));
            }
        }
        Ok(())
    }
}

impl Default for PassManager {
    fn default() -> Self {
        PassManager::new()
    }
}

/// A pass built from a spec, anchored where the spec says.
fn build(registry: &PassRegistry, spec: &PassSpec) -> Result<Box<dyn Pass>, PassError> {
    match (registry.build(spec)?, spec.anchor) {
        (BuiltPass::Program(p), None) => Ok(p),
        (BuiltPass::Program(_), Some(a)) => Err(PassError::NotTraceLevel {
            pass: spec.name.clone(),
            anchor: a.name().to_string(),
        }),
        (BuiltPass::Trace(t), anchor) => Ok(Box::new(OnTraces { pass: t, anchor })),
    }
}

fn traces(p: &Program) -> Vec<&Trace> {
    if p.is_lone() {
        vec![&p.backward]
    } else {
        vec![&p.forward, &p.backward]
    }
}

/// The timing table `--timing` prints.
pub fn timing_table(report: &RunReport) -> String {
    let total: f64 = report.timings.iter().map(|t| t.time.as_secs_f64()).sum();
    let mut s = String::from("===-------------------------------------------------------===\n");
    s += "  pass                                       time (ms)   share  changed\n";
    for t in &report.timings {
        let ms = t.time.as_secs_f64() * 1e3;
        let share = if total > 0.0 {
            100.0 * t.time.as_secs_f64() / total
        } else {
            0.0
        };
        s += &format!(
            "  {:<42} {:>9.3} {:>6.1}%  {}\n",
            t.pass,
            ms,
            share,
            if t.changed == Changed::Yes {
                "yes"
            } else {
                "no"
            }
        );
    }
    s += &format!("  {:<42} {:>9.3}\n", "total", total * 1e3);
    s
}
