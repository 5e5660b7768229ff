//! Subcommands of the `tracepass` binary. Errors go to stderr with a non-zero exit code.

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use std::io::Write;
use std::path::{Path, PathBuf};
use tracepass_ir::{
    dot::to_dot, fsio, print_trace_with, Module, OpRegistry, PrintOptions, Program, Trace,
};
use tracepass_passes::{
    build_pass, timing_table, Changed, Pass, PassContext, PassError, PassManager, PrintIr,
    Reproducer,
};

#[derive(Parser, Debug)]
#[command(
    name = "tracepass",
    version,
    about = "Rewrite and run Lightning Thunder training traces"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Keep ops no table entry knows as opaque nodes (their declared types trusted, ordered as
    /// side effects) instead of refusing the trace, as mlir-opt's flag of that name does.
    #[arg(long, global = true)]
    pub allow_unregistered: bool,
}

static ALLOW_UNREGISTERED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// The op registry the command line reads with (`--allow-unregistered` or not).
pub fn registry() -> &'static OpRegistry {
    if ALLOW_UNREGISTERED.load(std::sync::atomic::Ordering::Relaxed) {
        OpRegistry::builtin_allowing_unregistered()
    } else {
        OpRegistry::builtin()
    }
}

/// A trace or program file, or an export directory (read as the program it holds).
pub fn load_module(path: &Path) -> Result<Module> {
    if tracepass_ir::is_export_dir(path) {
        return Ok(Module::Program(
            tracepass_ir::load_export_with(path, registry())?.program,
        ));
    }
    if path.is_dir() {
        bail!(
            "{}: is a folder without export.json, not an export directory",
            path.display()
        );
    }
    Ok(fsio::load_with(path, registry())?)
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Pretty-print a trace (.trace, .tpb, .json, or an export directory: its backward).
    Show {
        file: PathBuf,
        /// Leave out decompositions (the indented comments under each statement).
        #[arg(long)]
        no_subsymbols: bool,
        /// Leave out `del` statements.
        #[arg(long)]
        no_dels: bool,
        /// Show the forward of a program instead of its backward.
        #[arg(long)]
        forward: bool,
    },
    /// Convert between formats; the extension decides (.trace text, .tpb binary, .json).
    Convert { input: PathBuf, output: PathBuf },
    /// Check every invariant; prints every violation (parse errors included) with its line. An
    /// export directory: its forward and backward, its prologue, and how they pair.
    Verify { file: PathBuf },
    /// Pair a forward and its backward into one program file (forward, backward, parameters).
    Pack {
        /// The forward trace (.trace, .tpb, .json; a program file stands for its forward).
        forward: PathBuf,
        /// The backward trace (a program file stands for its backward).
        backward: PathBuf,
        /// Thunder's prologue trace: which forward argument is which parameter or buffer, by
        /// its PyTorch name. Without it, parameters are recognised by Thunder's `t_` names.
        #[arg(long)]
        prologue: Option<PathBuf>,
        /// The program file to write: .tpb or .json.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Graphviz DOT of a trace (of a program: its backward).
    Dot {
        file: PathBuf,
        /// Output file; stdout when absent.
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Run a pass pipeline, like mlir-opt.
    Opt(OptArgs),
    /// Train a model with DDP on thread ranks (the seed example by default).
    Train(Box<crate::train_cmd::TrainArgs>),
    /// Predict step time, overlap and exposed communication on a modelled device and network.
    Simulate(Box<crate::simulate_cmd::SimulateArgs>),
    /// Run `train --device cuda` as one process per GPU with torchrun's environment
    /// (`tracepass launch --nproc-per-node 8 -- train --device cuda`). On CPU, ranks are threads
    /// of one process: use `tracepass train --world-size N`.
    Launch {
        /// Processes (GPUs) on this machine.
        #[arg(long, allow_negative_numbers = true, value_parser = crate::train_cmd::count)]
        nproc_per_node: usize,
        /// Address rank 0 listens on for the rendezvous.
        #[arg(long, default_value = "127.0.0.1")]
        master_addr: String,
        /// Default: a free port.
        #[arg(long)]
        master_port: Option<u16>,
        /// The tracepass subcommand and its options, after `--`.
        #[arg(last = true, required = true)]
        args: Vec<String>,
    },
    /// Testing aid: the TCP rendezvous of a launched rank; prints a digest of rank 0's id.
    #[command(hide = true)]
    RendezvousCheck {
        #[arg(long, default_value_t = 30.0)]
        timeout: f64,
    },
}

/// The passes a pipeline may name, for help texts.
const PASSES_HELP: &str = "Passes (comma-separated, options in parentheses):
  ddp(world_size=N[,bucket_mb=25][,first_bucket_mb=MB][,average=pre|post][,group=world][,launch=ready|end])
      pre-average, bucket and all-reduce the gradients asynchronously (needs the forward)
  sort-waits        move each wait to just before its first use
  no-sync           remove gradient synchronization (Thunder's own DDP included)
  accumulate-grads  the synchronized step of gradient accumulation (adds acc_* arguments)
  dce               remove dead code
  cse               merge identical pure computations

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
    /// Skip verification after each pass.
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

pub fn run(cli: Cli) -> Result<()> {
    ALLOW_UNREGISTERED.store(cli.allow_unregistered, std::sync::atomic::Ordering::Relaxed);
    match cli.command {
        Command::Show {
            file,
            no_subsymbols,
            no_dels,
            forward,
        } => {
            let m = load_module(&file)?;
            let t = match (&m, forward) {
                (Module::Trace(t), false) => t,
                (Module::Trace(_), true) => {
                    bail!("{}: holds a single trace, not a program", file.display())
                }
                (Module::Program(p), false) => &p.backward,
                (Module::Program(p), true) => &p.forward,
            };
            let opts = PrintOptions {
                subsymbols: !no_subsymbols,
                dels: !no_dels,
                ..PrintOptions::default()
            };
            out(&print_trace_with(t, opts))
        }
        Command::Convert { input, output } => {
            check_output(&output, "output")?;
            let m = fsio::load(&input)?;
            fsio::save(&output, &m)?;
            Ok(())
        }
        Command::Verify { file } if tracepass_ir::is_export_dir(&file) => {
            for name in ["forward.trace", "backward.trace"] {
                crate::verify_cmd::run(&file.join(name))?;
            }
            let e = tracepass_ir::load_export_with(&file, registry())?;
            let p = &e.program;
            out(&format!(
                "{}: ok: {} parameters ({} trainable, {} frozen, {} tied), {} buffers, data {}\n",
                file.display(),
                p.params.iter().filter(|x| !x.buffer).count(),
                p.params.iter().filter(|x| x.requires_grad).count(),
                p.params
                    .iter()
                    .filter(|x| !x.buffer && !x.requires_grad)
                    .count(),
                p.params.iter().filter(|x| x.tied_to.is_some()).count(),
                p.params.iter().filter(|x| x.buffer).count(),
                p.data_inputs()
                    .into_iter()
                    .map(|(_, n)| n)
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        }
        Command::Verify { file } => crate::verify_cmd::run(&file),
        Command::Pack {
            forward,
            backward,
            prologue,
            output,
        } => {
            check_output(&output, "-o")?;
            if fsio::Format::from_path(&output)? == fsio::Format::Text {
                bail!(
                    "-o {}: a .trace file holds one trace; write the program as .tpb or .json",
                    output.display()
                );
            }
            let p = program_from_traces(&forward, &backward, prologue.as_deref())?;
            fsio::save(&output, &Module::Program(p))?;
            Ok(())
        }
        Command::Dot { file, output } => {
            if let Some(o) = &output {
                check_output(o, "-o")?;
            }
            let m = fsio::load(&file)?;
            let t = match &m {
                Module::Trace(t) => t,
                Module::Program(p) => &p.backward,
            };
            let dot = to_dot(t);
            match output {
                Some(o) => Ok(fsio::write_atomic(&o, dot.as_bytes())?),
                None => out(&dot),
            }
        }
        Command::Opt(args) => opt(args),
        Command::Train(args) => crate::train_cmd::run(*args),
        Command::Simulate(args) => crate::simulate_cmd::run(*args),
        Command::Launch {
            nproc_per_node,
            master_addr,
            master_port,
            args,
        } => {
            crate::launch::check_args(&args)?;
            Ok(crate::launch::launch(
                nproc_per_node,
                &master_addr,
                master_port,
                &args,
            )?)
        }
        Command::RendezvousCheck { timeout } => {
            let env = crate::rendezvous::DistEnv::from_env()?;
            // rank 0's "id": 128 bytes that differ from run to run
            let seed = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
                ^ u64::from(std::process::id());
            let id: Vec<u8> = (0..128u64)
                .map(|i| {
                    (seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(i * 1442695040888963407)
                        >> 33) as u8
                })
                .collect();
            let got = crate::rendezvous::exchange(
                &env,
                (env.rank == 0).then_some(id.as_slice()),
                std::time::Duration::from_secs_f64(timeout.max(0.01)),
            )?;
            let digest = got.iter().fold(0xcbf29ce484222325u64, |h, b| {
                (h ^ u64::from(*b)).wrapping_mul(0x100000001b3)
            });
            out(&format!(
                "rank {} of {}: id {digest:016x} ({} bytes)\n",
                env.rank,
                env.world_size,
                got.len()
            ))
        }
    }
}

pub(crate) fn out(s: &str) -> Result<()> {
    let mut o = std::io::stdout().lock();
    match o.write_all(s.as_bytes()).and_then(|_| o.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

/// Checks, before any work, that `path` can be written: not a folder, its folder exists and
/// accepts a new file (writes are atomic: a temporary file in that folder, then a rename).
pub fn check_output(path: &Path, what: &str) -> Result<()> {
    let shown = path.display();
    if path.is_dir() {
        bail!("{what} {shown}: is a folder, not a file");
    }
    let name = path
        .file_name()
        .with_context(|| format!("{what} {shown}: not a file path"))?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if dir.exists() && !dir.is_dir() {
        bail!("{what} {shown}: {} is not a folder", dir.display());
    }
    if !dir.is_dir() {
        bail!(
            "{what} {shown}: the folder {} does not exist",
            dir.display()
        );
    }
    let probe = dir.join(format!(
        ".{}.probe-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => bail!(
            "{what} {shown}: cannot write in the folder {}: {e}",
            dir.display()
        ),
    }
}

/// The trace a file holds; of a program file, its forward or its backward.
fn load_trace(path: &Path, forward: bool) -> Result<Trace> {
    if path.is_dir() {
        bail!(
            "{}: is a folder; give a trace file here (an export directory is read whole where a program is expected)",
            path.display()
        );
    }
    Ok(match fsio::load_with(path, registry())? {
        Module::Trace(t) => t,
        Module::Program(p) if forward => p.forward,
        Module::Program(p) => p.backward,
    })
}

/// A program from a forward and its backward (each `.trace`, `.tpb` or `.json`), paired in
/// Thunder's convention. `prologue` is where Thunder's prologue trace will name the parameters.
pub fn program_from_traces(
    forward: &Path,
    backward: &Path,
    prologue: Option<&Path>,
) -> Result<Program> {
    let (f, b) = (load_trace(forward, true)?, load_trace(backward, false)?);
    let ctx = || format!("pairing {} with {}", forward.display(), backward.display());
    match prologue {
        Some(pro) => {
            let text = std::fs::read_to_string(pro)
                .with_context(|| format!("--prologue {}", pro.display()))?;
            let prologue = tracepass_ir::parse_prologue(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", pro.display()))?;
            Program::from_prologue(f, b, &prologue, &[]).with_context(ctx)
        }
        None => {
            eprintln!(
                "note: no --prologue: parameters are the forward's arguments named t_<module path> (give Thunder's prologue to be exact)"
            );
            Program::from_thunder(f, b).with_context(ctx)
        }
    }
}

/// The one place a whole program is read from a path: a `.tpb` or `.json` program file (an
/// export directory will be dispatched here too).
pub fn load_program(path: &Path) -> Result<Program> {
    match load_module(path)? {
        Module::Program(p) => Ok(p),
        Module::Trace(_) => bail!(
            "{}: holds one trace, not a program; pair a forward with its backward (`tracepass pack FORWARD BACKWARD -o prog.tpb`, or --forward F --backward B)",
            path.display()
        ),
    }
}

/// Reads the input of `opt` and `simulate`: a program file, or a trace (paired with
/// `--forward` when given). The flag says whether the input was a lone trace.
pub fn load_input(
    input: &Path,
    forward: Option<&Path>,
    prologue: Option<&Path>,
) -> Result<(Program, bool)> {
    if prologue.is_some() && forward.is_none() {
        bail!("--prologue pairs a backward with its --forward; give --forward too");
    }
    let m = load_module(input)?;
    Ok(match (m, forward) {
        (Module::Program(p), None) => (p, false),
        (Module::Program(_), Some(_)) => bail!(
            "{}: already a program; --forward is only for a lone backward trace",
            input.display()
        ),
        (Module::Trace(_), Some(f)) => (program_from_traces(f, input, prologue)?, false),
        (Module::Trace(t), None) => (Program::lone(t), true),
    })
}

/// What `--inject-fault` does to a pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PassFault {
    Panic,
    /// The pass runs, then breaks the IR (the schedule reversed: uses before definitions).
    Corrupt,
}

/// A pass as `opt` runs it: the IR printed as it goes (so a later failure still shows what came
/// before), a panic turned into an error and remembered as an internal failure.
struct Watched {
    inner: Box<dyn Pass>,
    print: std::rc::Rc<PrintIr>,
    fault: Option<PassFault>,
    panicked: std::rc::Rc<std::cell::Cell<bool>>,
}

fn dump(heading: &str, p: &Program) {
    eprint!(
        "// ----- {heading} -----\n{}",
        tracepass_ir::print_trace(&p.backward)
    );
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
        if self.print.before.contains(&name) {
            dump(&format!("IR before {name}"), p);
        }
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let r = self.inner.run(p, cx);
            match self.fault {
                Some(PassFault::Panic) => panic!("injected fault: pass `{name}` panics"),
                Some(PassFault::Corrupt) => {
                    let mut order = p.backward.schedule().to_vec();
                    order.reverse();
                    p.backward.set_schedule(order);
                    r.map(|_| Changed::Yes)
                }
                None => r,
            }
        }));
        let changed = match r {
            Ok(r) => r?,
            Err(payload) => {
                self.panicked.set(true);
                return Err(PassError::Failed {
                    pass: name,
                    message: format!(
                        "internal error: panicked: {}",
                        crate::trainer::panic_message(payload)
                    ),
                });
            }
        };
        if self.print.after_all
            || self.print.after.contains(&name)
            || (self.print.after_change && changed == Changed::Yes)
        {
            dump(&format!("IR after {name}"), p);
        }
        Ok(changed)
    }
}

fn opt(args: OptArgs) -> Result<()> {
    if let Some(o) = &args.output {
        check_output(o, "-o")?;
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
            Some((pass.to_string(), kind))
        }
        None => None,
    };
    let print = std::rc::Rc::new(PrintIr {
        before: args.print_ir_before.clone(),
        after: args.print_ir_after.clone(),
        after_all: args.print_ir_after_all,
        after_change: args.print_ir_after_change,
    });
    let panicked = std::rc::Rc::new(std::cell::Cell::new(false));
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
            print: print.clone(),
            fault: fault
                .as_ref()
                .filter(|(p, _)| *p == spec.name)
                .map(|(_, k)| *k),
            panicked: panicked.clone(),
        }));
    }
    pm.verify_each = !args.no_verify;
    pm.record_time = args.timing;
    let report = match pm.run(&mut program, registry()) {
        Ok(r) => r,
        Err(e) => {
            let internal = panicked.get() || matches!(e.error, PassError::Verify { .. });
            if !internal || args.reproduce.is_some() {
                return Err(e.error.into());
            }
            let written = write_reproducer(&args, &pm.pipeline(), &e.error);
            return Err(match written {
                Ok(path) => anyhow::anyhow!(
                    "{}\nthis is a bug in tracepass; reproducer written to {} (replay: tracepass opt --reproduce {})",
                    e.error,
                    path.display(),
                    path.display()
                ),
                Err(w) => anyhow::anyhow!(
                    "{}\nthis is a bug in tracepass; no reproducer could be written: {w:#}",
                    e.error
                ),
            });
        }
    };
    if args.timing {
        eprint!("{}", timing_table(&report));
    }
    if args.stats {
        for (k, v) in &report.stats {
            eprintln!("stat {k}: {v}");
        }
        for (k, v) in &report.notes {
            eprintln!("note {k}: {v}");
        }
    }
    match (&args.output, lone) {
        (Some(o), true) => fsio::save(o, &Module::Trace(program.backward))?,
        (Some(o), false) => {
            if fsio::Format::from_path(o)? == fsio::Format::Text {
                eprintln!(
                    "note: {} holds the backward only (a .trace file holds one trace); write .tpb or .json for the whole program",
                    o.display()
                );
                fsio::save(o, &Module::Trace(program.backward))?
            } else {
                fsio::save(o, &Module::Program(program))?
            }
        }
        (None, _) => out(&tracepass_ir::print_trace(&program.backward))?,
    }
    Ok(())
}

/// Writes the input of a failed run (read again from its files) and its pipeline.
fn write_reproducer(args: &OptArgs, pipeline: &str, error: &PassError) -> Result<PathBuf> {
    let input = args.input.as_deref().context("no input file")?;
    let (p, lone) = load_input(input, args.forward.as_deref(), args.prologue.as_deref())?;
    let failed_pass = match error {
        PassError::Failed { pass, .. } | PassError::Verify { pass, .. } => pass.clone(),
        _ => "<input>".to_string(),
    };
    let repro = Reproducer {
        pipeline: pipeline.to_string(),
        failed_pass,
        error: error.to_string(),
        input: if lone {
            Module::Trace(p.backward)
        } else {
            Module::Program(p)
        },
    };
    let dir = match (&args.reproducer_dir, &args.output) {
        (Some(d), _) => d.clone(),
        (None, Some(o)) => match o.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        },
        (None, None) => PathBuf::from("."),
    };
    let path = dir.join(format!("tracepass-reproducer-{}.json", std::process::id()));
    fsio::write_atomic(&path, &serde_json::to_vec_pretty(&repro)?)?;
    Ok(path)
}
