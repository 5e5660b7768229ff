//! The PassManager: runs a pipeline with verification after every pass, IR printing, timing, and
//! a reproducer file when a pass fails.

use crate::catalog::build_pass;
use crate::pass::{Changed, Pass, PassContext, PassError, PassTiming};
use crate::pipeline::{parse_pipeline, print_pipeline, PassSpec};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Instant;
use tracepass_ir::{print_trace, verify_with, Module, OpRegistry, Program, Provenance, Trace};

/// When to print the IR.
#[derive(Clone, Debug, Default)]
pub struct PrintIr {
    pub before: Vec<String>,
    pub after: Vec<String>,
    pub after_all: bool,
    pub after_change: bool,
}

/// A pass pipeline and how to run it.
pub struct PassManager {
    passes: Vec<Box<dyn Pass>>,
    pub verify_each: bool,
    pub print_ir: PrintIr,
    /// Record pass times in the provenance (off by default so output is deterministic).
    pub record_time: bool,
    /// Folder for reproducer files when a pass fails (`None`: none written).
    pub reproducer_dir: Option<PathBuf>,
}

/// What a pipeline run produced besides the program.
#[derive(Clone, Debug, Default)]
pub struct RunReport {
    pub timings: Vec<PassTiming>,
    pub stats: Vec<(String, u64)>,
    /// Named findings of the passes (`ddp.frozen`, `ddp.inputs`), in order.
    pub notes: Vec<(String, String)>,
    /// IR dumps requested with the print options, in order, each with a heading.
    pub dumps: Vec<String>,
}

/// The input of a failed pipeline, replayable with `tracepass opt --reproduce FILE`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Reproducer {
    pub pipeline: String,
    pub failed_pass: String,
    pub error: String,
    pub input: Module,
}

impl Reproducer {
    pub fn load(path: &Path) -> Result<Reproducer, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        serde_json::from_slice(&bytes)
            .map_err(|e| format!("{}: not a reproducer: {e}", path.display()))
    }
}

/// Failure of a run: the error, and the reproducer written for it (if any).
#[derive(Debug, thiserror::Error)]
#[error("{error}{}", reproducer.as_ref().map(|p| format!("\nreproducer written to {}", p.display())).unwrap_or_default())]
pub struct RunError {
    pub error: PassError,
    pub reproducer: Option<PathBuf>,
}

impl PassManager {
    pub fn new() -> PassManager {
        PassManager {
            passes: Vec::new(),
            verify_each: true,
            print_ir: PrintIr::default(),
            record_time: false,
            reproducer_dir: None,
        }
    }
    /// Builds a manager from a pipeline string.
    pub fn parse(pipeline: &str) -> Result<PassManager, PassError> {
        let specs = parse_pipeline(pipeline)?;
        let mut pm = PassManager::new();
        for s in &specs {
            pm.add_boxed(build_pass(s)?);
        }
        Ok(pm)
    }
    pub fn add(&mut self, p: impl Pass + 'static) -> &mut Self {
        self.passes.push(Box::new(p));
        self
    }
    pub fn add_boxed(&mut self, p: Box<dyn Pass>) -> &mut Self {
        self.passes.push(p);
        self
    }
    /// The pipeline, printed back.
    pub fn pipeline(&self) -> String {
        let specs: Vec<PassSpec> = self
            .passes
            .iter()
            .map(|p| {
                parse_pipeline(&p.spec())
                    .ok()
                    .and_then(|mut v| v.pop())
                    .unwrap_or(PassSpec {
                        name: p.name().to_string(),
                        options: Vec::new(),
                    })
            })
            .collect();
        print_pipeline(&specs)
    }

    fn dump(&self, report: &mut RunReport, heading: String, p: &Program) {
        let mut s = format!("// ----- {heading} -----\n");
        s += &print_trace(&p.backward);
        report.dumps.push(s);
    }

    /// Runs every pass in order on `p`, verifying after each (when `verify_each`).
    pub fn run(&self, p: &mut Program, reg: &OpRegistry) -> Result<RunReport, RunError> {
        // the input is kept only when a failure would write a reproducer of it (a copy of a
        // million-node program costs more than the passes)
        let input = self.reproducer_dir.as_ref().map(|_| p.clone());
        let mut cx = PassContext::new(reg);
        let mut report = RunReport::default();
        let fail = |error: PassError, pass: &str| {
            let reproducer = input
                .as_ref()
                .and_then(|i| self.write_reproducer(i, pass, &error));
            RunError { error, reproducer }
        };
        if self.verify_each {
            for t in traces(p) {
                verify_with(t, reg).map_err(|e| fail(PassError::InvalidInput(e), "<input>"))?;
            }
        }
        for pass in &self.passes {
            let name = pass.name().to_string();
            if self.print_ir.before.contains(&name) {
                self.dump(&mut report, format!("IR before {name}"), p);
            }
            let start = Instant::now();
            let changed = pass.run(p, &mut cx).map_err(|e| fail(e, &name))?;
            let time = start.elapsed();
            if changed == Changed::Yes {
                p.backward.provenance.push(Provenance {
                    pass: pass.spec(),
                    millis: self.record_time.then_some(time.as_millis() as u64),
                });
            }
            if self.verify_each {
                for t in traces(p) {
                    verify_with(t, reg).map_err(|error| {
                        fail(
                            PassError::Verify {
                                pass: name.clone(),
                                error,
                            },
                            &name,
                        )
                    })?;
                }
            }
            if self.print_ir.after_all
                || self.print_ir.after.contains(&name)
                || (self.print_ir.after_change && changed == Changed::Yes)
            {
                self.dump(&mut report, format!("IR after {name}"), p);
            }
            report.timings.push(PassTiming {
                pass: pass.spec(),
                time,
                changed,
            });
        }
        report.stats = cx.stats;
        report.notes = cx.notes;
        Ok(report)
    }

    fn write_reproducer(&self, input: &Program, pass: &str, error: &PassError) -> Option<PathBuf> {
        let dir = self.reproducer_dir.as_ref()?;
        let repro = Reproducer {
            pipeline: self.pipeline(),
            failed_pass: pass.to_string(),
            error: error.to_string(),
            input: if input.is_lone() {
                Module::Trace(input.backward.clone())
            } else {
                Module::Program(input.clone())
            },
        };
        let path = dir.join(format!("tracepass-reproducer-{}.json", std::process::id()));
        let bytes = serde_json::to_vec_pretty(&repro).ok()?;
        tracepass_ir::fsio::write_atomic(&path, &bytes).ok()?;
        Some(path)
    }
}

impl Default for PassManager {
    fn default() -> Self {
        PassManager::new()
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
