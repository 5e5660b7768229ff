//! `tracepass opt`: a pass pipeline run over a trace, program or export directory, like
//! mlir-opt, with IR printing around passes, timing, statistics and reproducers of failures.

use crate::input::{load_input, out, registry};
use crate::outputs::Files;
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use tracepass_ir::{fsio, Module, Program};
use tracepass_passes::{
    build_pass, timing_table, Changed, IrPrinter, Pass, PassContext, PassError, PassManager,
    PrintIr, Reproducer, ReproducerWriter,
};

/// The passes a pipeline may name, for help texts.
const PASSES_HELP: &str = "Passes (comma-separated, options in parentheses):
  ddp(world_size=N[,bucket_mb=25][,first_bucket_mb=MB][,average=pre|post][,group=world][,launch=ready|end])
      pre-average, bucket and all-reduce the gradients asynchronously (needs the forward)
  fsdp(world_size=N[,sharding=zero3|zero2][,bucket_mb=25][,prefetch=1][,shard_frozen=false])
      shard the parameters: all-gather them in the forward (zero3: again in the backward),
      reduce-scatter the gradients (needs the forward; write a .tpb or .json to keep it)
  sort-waits        move each wait to just before its first use
  no-sync           remove gradient synchronization (Thunder's own DDP included)
  accumulate-grads  the synchronized step of gradient accumulation (adds acc_* arguments)
  dce               remove dead code
  cse               merge identical pure computations
  canonicalize      exact algebraic identities (x*1, x/1, x-0, -(-x)), dead casts and
                    exact constant folds (x*2*4 -> x*8, 2*3 -> 6)
  remat             the backward recomputes saved values that are cheap arithmetic of other
                    saved values, and the forward stops saving them (needs the forward;
                    write a .tpb or .json to keep it)
  fuse-elementwise  group chains of elementwise ops (each intermediate read once) into
                    tracepass.fusion regions, run as one loop (CPU) or one kernel (CUDA)
  fold-conv-crop    a convolution whose output is only cropped (Thunder's input gradient)
                    computes just the kept outputs, with a smaller padding
  conv-input-grad   Thunder's input gradient of a convolution (the gradient spread by the
                    stride, convolved by the flipped weight, cropped) becomes one transposed
                    convolution: no products with the inserted zeros, no flipped copy

A reproducer (input + pipeline, replay with --reproduce) is written only when a pass fails
internally (panics or leaves invalid IR): to --reproducer-dir, else next to -o, else the
current folder.";

#[derive(clap::Args, Debug)]
#[command(after_help = PASSES_HELP)]
pub struct OptArgs {
    /// Input trace or program (.trace, .tpb, .json), or an export directory.
    pub input: Option<PathBuf>,
    /// Pipeline, e.g. `ddp(world_size=4,bucket_mb=25),sort-waits,dce` (passes listed below).
    #[arg(long)]
    pub passes: Option<String>,
    /// Output file (format from its extension). With --forward or a program input, .tpb and
    /// .json get the whole program (forward, backward, parameters); .trace and stdout the
    /// backward only.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// The forward trace a lone backward belongs to.
    #[arg(long)]
    pub forward: Option<PathBuf>,
    /// Thunder's prologue trace for --forward: which argument is which parameter, by PyTorch
    /// name (without it, parameters are recognised by Thunder's `t_` names).
    #[arg(long, requires = "forward")]
    pub prologue: Option<PathBuf>,
    /// Print the passes' statistics and notes to stderr (what ddp synchronized, and the
    /// frozen parameters, buffers and inputs it left alone).
    #[arg(long)]
    pub stats: bool,
    /// Skip verification after each pass (what the pipeline changed is still verified once, at
    /// the end).
    #[arg(long)]
    pub no_verify: bool,
    /// Print the backward to stderr before each run of PASS (repeatable).
    #[arg(long, value_name = "PASS")]
    pub print_ir_before: Vec<String>,
    /// Print the backward to stderr after each run of PASS (repeatable).
    #[arg(long, value_name = "PASS")]
    pub print_ir_after: Vec<String>,
    /// Print the backward to stderr after every pass (as each pass ends, so a later failure
    /// still shows what came before).
    #[arg(long)]
    pub print_ir_after_all: bool,
    /// Print the backward to stderr after every pass that changed it.
    #[arg(long)]
    pub print_ir_after_change: bool,
    /// Print a table of pass times to stderr (and record them in the provenance).
    #[arg(long)]
    pub timing: bool,
    /// Replay a reproducer file written by a failed run.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["input", "passes", "forward"])]
    pub reproduce: Option<PathBuf>,
    /// Where an internal failure writes its reproducer (default: the folder of -o, else the
    /// current folder).
    #[arg(long, value_name = "DIR")]
    pub reproducer_dir: Option<PathBuf>,
    /// Testing aid: `PASS:panic` or `PASS:corrupt` (the pass breaks the IR after running).
    #[arg(long, hide = true)]
    pub inject_fault: Option<String>,
}

/// What `--inject-fault` does to a pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PassFault {
    Panic,
    /// The pass runs, then breaks the IR (the schedule reversed: uses before definitions).
    Corrupt,
}

/// A pass as `opt` runs it, with the fault `--inject-fault` asks for (the manager turns a
/// panic into [`PassError::Panicked`]; an [`IrPrinter`] prints the IR as passes end).
struct Watched {
    inner: Box<dyn Pass>,
    fault: Option<PassFault>,
}

impl Pass for Watched {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn spec(&self) -> String {
        self.inner.spec()
    }
    fn run(&self, p: &mut Program, cx: &mut PassContext) -> Result<Changed, PassError> {
        let name = self.inner.name().to_string();
        let r = self.inner.run(p, cx);
        let changed = match self.fault {
            Some(PassFault::Panic) => panic!("injected fault: pass `{name}` panics"),
            Some(PassFault::Corrupt) => {
                let mut order = p.backward.schedule().to_vec();
                order.reverse();
                p.backward.set_schedule(order);
                r.map(|_| Changed::Yes)?
            }
            None => r?,
        };
        Ok(changed)
    }
}

/// Runs `tracepass opt`.
pub fn run(args: OptArgs) -> Result<()> {
    Files::new()
        .input("", args.input.as_deref())
        .input("--forward", args.forward.as_deref())
        .input("--prologue", args.prologue.as_deref())
        .input("--reproduce", args.reproduce.as_deref())
        .output("-o", args.output.as_deref())
        .check()?;
    if let Some(o) = &args.output {
        fsio::Format::from_path(o)?;
    }
    if let Some(d) = &args.reproducer_dir {
        if !d.is_dir() {
            bail!("--reproducer-dir {}: not an existing folder", d.display());
        }
    }
    let (mut program, lone, pipeline) = match &args.reproduce {
        Some(r) => {
            let repro = Reproducer::load(r).map_err(anyhow::Error::msg)?;
            let (p, lone) = match repro.input {
                Module::Program(p) => (p, false),
                Module::Trace(t) => (Program::lone(t), true),
            };
            eprintln!(
                "replaying `{}` (failed in `{}`: {})",
                repro.pipeline, repro.failed_pass, repro.error
            );
            (p, lone, repro.pipeline)
        }
        None => {
            let input = args
                .input
                .as_deref()
                .context("an input file is needed (or --reproduce FILE)")?;
            let pipeline = args.passes.clone().context("--passes PIPELINE is needed")?;
            let (p, lone) = load_input(input, args.forward.as_deref(), args.prologue.as_deref())?;
            (p, lone, pipeline)
        }
    };
    let specs = tracepass_passes::parse_pipeline(&pipeline)?;
    let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    for (flag, asked) in [
        ("--print-ir-before", &args.print_ir_before),
        ("--print-ir-after", &args.print_ir_after),
    ] {
        for a in asked {
            if !names.contains(&a.as_str()) {
                bail!(
                    "{flag}={a}: the pipeline has no pass `{a}` (it runs: {})",
                    if names.is_empty() {
                        "nothing".to_string()
                    } else {
                        names.join(", ")
                    }
                );
            }
        }
    }
    let fault = match &args.inject_fault {
        Some(f) => {
            let (pass, kind) = f
                .split_once(':')
                .with_context(|| format!("--inject-fault {f}: expected PASS:panic|corrupt"))?;
            let kind = match kind {
                "panic" => PassFault::Panic,
                "corrupt" => PassFault::Corrupt,
                _ => bail!("--inject-fault {f}: expected PASS:panic|corrupt"),
            };
            if !names.contains(&pass) {
                bail!(
                    "--inject-fault {f}: the pipeline has no pass `{pass}` (it runs: {}; the fault would never fire)",
                    names.join(", ")
                );
            }
            Some((pass.to_string(), kind))
        }
        None => None,
    };
    // the backward, to stderr, as each pass ends (a later failure still shows what came before)
    let when = PrintIr {
        before: args.print_ir_before.clone(),
        after: args.print_ir_after.clone(),
        after_all: args.print_ir_after_all,
        after_change: args.print_ir_after_change,
    };
    let mut printer = IrPrinter::new(when, |dump| eprint!("{dump}"));
    printer.backward_only = true;
    let mut pm = PassManager::new();
    for spec in &specs {
        pm.add_boxed(Box::new(Watched {
            inner: match build_pass(spec)? {
                tracepass_passes::BuiltPass::Program(p) => p,
                tracepass_passes::BuiltPass::Trace(t) => Box::new(tracepass_passes::OnTraces {
                    pass: t,
                    anchor: spec.anchor,
                }),
            },
            fault: fault
                .as_ref()
                .filter(|(p, _)| *p == spec.name)
                .map(|(_, k)| *k),
        }));
    }
    pm.instrument(printer);
    // a replay writes no other reproducer
    if let Some(input) = args.input.clone().filter(|_| args.reproduce.is_none()) {
        pm.reproducer(reproducer_writer(&args, input));
    }
    pm.verify_each = !args.no_verify;
    pm.record_time = args.timing;
    // a pass that changes the forward adds a provenance line to it
    let forward_passes = program.forward.provenance.len();
    let report = match pm.run(&mut program, registry()) {
        Ok(r) => r,
        Err(e) => {
            if !e.error.is_internal() || args.reproduce.is_some() {
                return Err(e.error.into());
            }
            return Err(match (&e.reproducer, &e.report.reproducer_error) {
                (Some(path), _) => anyhow::anyhow!(
                    "{}\nthis is a bug in tracepass; reproducer written to {} (replay: tracepass opt --reproduce {})",
                    e.error,
                    path.display(),
                    path.display()
                ),
                (None, why) => anyhow::anyhow!(
                    "{}\nthis is a bug in tracepass; no reproducer could be written: {}",
                    e.error,
                    why.as_ref().map_or("no input file".to_string(), |w| w.to_string())
                ),
            });
        }
    };
    if args.timing {
        eprint!("{}", timing_table(&report));
    }
    if args.stats {
        // each counter with the pass that reported it and, for a trace-level pass, its trace
        for st in &report.stat_details {
            match &st.trace {
                Some(t) => eprintln!(
                    "stat {}: {} (pass {}, trace {t})",
                    st.key, st.value, st.pass
                ),
                None => eprintln!("stat {}: {} (pass {})", st.key, st.value, st.pass),
            }
        }
        for (k, v) in &report.notes {
            eprintln!("note {k}: {v}");
        }
    }
    // a backward alone after a pass that changed the forward (`remat`: what it saves; `fsdp`:
    // what it gathers) no longer pairs with the forward the user has
    let forward_changed = program.forward.provenance.len() > forward_passes;
    let unpaired = |to: &str| {
        if forward_changed {
            eprintln!(
                "note: the pipeline changed the forward too, so the backward {to} does not pair with the forward given; write .tpb or .json (-o FILE) to keep both"
            );
        }
    };
    match (&args.output, lone) {
        (Some(o), true) => fsio::save(o, &Module::Trace(program.backward))?,
        (Some(o), false) => {
            if fsio::Format::from_path(o)? == fsio::Format::Text {
                eprintln!(
                    "note: {} holds the backward only (a .trace file holds one trace); write .tpb or .json for the whole program",
                    o.display()
                );
                unpaired(&format!("in {}", o.display()));
                fsio::save(o, &Module::Trace(program.backward))?
            } else {
                fsio::save(o, &Module::Program(program))?
            }
        }
        (None, _) => {
            unpaired("printed");
            out(&tracepass_ir::print_trace(&program.backward))?
        }
    }
    Ok(())
}

/// The library's reproducer writer, for internal failures only: into --reproducer-dir, else
/// next to -o, else the current folder; the input is read again from its files when a pass
/// fails (not copied before every run).
fn reproducer_writer(args: &OptArgs, input: PathBuf) -> ReproducerWriter {
    let dir = match (&args.reproducer_dir, &args.output) {
        (Some(d), _) => d.clone(),
        (None, Some(o)) => match o.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        },
        (None, None) => PathBuf::from("."),
    };
    let (forward, prologue) = (args.forward.clone(), args.prologue.clone());
    ReproducerWriter::new(dir)
        .internal_only()
        .reload_input(move || {
            let (p, lone) = load_input(&input, forward.as_deref(), prologue.as_deref())
                .map_err(|e| format!("{e:#}"))?;
            Ok(if lone {
                Module::Trace(p.backward)
            } else {
                Module::Program(p)
            })
        })
}
