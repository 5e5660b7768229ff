//! Subcommands of the `tracepass` binary. Errors go to stderr with a non-zero exit code.

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use std::io::Write;
use std::path::{Path, PathBuf};
use tracepass_ir::{
    dot::to_dot, fsio, print_trace_with, verify, Module, OpRegistry, PrintOptions, Program,
};
use tracepass_passes::{timing_table, PassManager, PrintIr, Reproducer};

#[derive(Parser, Debug)]
#[command(
    name = "tracepass",
    version,
    about = "Rewrite and run Lightning Thunder training traces"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Pretty-print a trace (.trace, .tpb or .json).
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
    /// Check every invariant; prints all violations.
    Verify { file: PathBuf },
    /// Graphviz DOT of a trace.
    Dot {
        file: PathBuf,
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Run a pass pipeline, like mlir-opt.
    Opt(OptArgs),
    /// Train a model with DDP on thread ranks (the seed example by default).
    Train(Box<crate::train_cmd::TrainArgs>),
    /// Predict step time, overlap and exposed communication on a modelled device and network.
    Simulate(Box<crate::simulate_cmd::SimulateArgs>),
    /// Run a subcommand as one process per rank with torchrun's environment
    /// (`tracepass launch --nproc-per-node 8 -- train --device cuda`).
    Launch {
        #[arg(long)]
        nproc_per_node: usize,
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

#[derive(clap::Args, Debug)]
pub struct OptArgs {
    /// Input trace or program.
    pub input: Option<PathBuf>,
    /// Pipeline, e.g. `ddp(world_size=4,bucket_mb=25),sort-waits,dce`.
    #[arg(long)]
    pub passes: Option<String>,
    /// Output file (format from its extension); stdout when absent.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// The forward trace a lone backward belongs to (names the parameters `t_<fqn>`).
    #[arg(long)]
    pub forward: Option<PathBuf>,
    /// Skip verification after each pass.
    #[arg(long)]
    pub no_verify: bool,
    #[arg(long, value_name = "PASS")]
    pub print_ir_before: Vec<String>,
    #[arg(long, value_name = "PASS")]
    pub print_ir_after: Vec<String>,
    #[arg(long)]
    pub print_ir_after_all: bool,
    #[arg(long)]
    pub print_ir_after_change: bool,
    /// Print a table of pass times to stderr (and record them in the provenance).
    #[arg(long)]
    pub timing: bool,
    /// Replay a reproducer file written by a failed run.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["input", "passes", "forward"])]
    pub reproduce: Option<PathBuf>,
    /// Where a failed run writes its reproducer (default: the system temp folder).
    #[arg(long)]
    pub reproducer_dir: Option<PathBuf>,
}

pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Show {
            file,
            no_subsymbols,
            no_dels,
            forward,
        } => {
            let m = fsio::load(&file)?;
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
            let m = fsio::load(&input)?;
            fsio::save(&output, &m)?;
            Ok(())
        }
        Command::Verify { file } => {
            let m = fsio::load(&file)?;
            let traces = match &m {
                Module::Trace(t) => vec![t],
                Module::Program(p) => vec![&p.forward, &p.backward],
            };
            for t in traces {
                verify(t).with_context(|| file.display().to_string())?;
            }
            out(&format!("{}: ok\n", file.display()))
        }
        Command::Dot { file, output } => {
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
        } => Ok(crate::launch::launch(
            nproc_per_node,
            &master_addr,
            master_port,
            &args,
        )?),
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

/// Reads the input of `opt`: a program file, or a backward paired with `--forward`.
pub fn load_program(input: &Path, forward: Option<&Path>) -> Result<(Program, bool)> {
    let m = fsio::load(input)?;
    Ok(match (m, forward) {
        (Module::Program(p), None) => (p, false),
        (Module::Program(_), Some(_)) => bail!(
            "{}: already a program; --forward is only for a lone backward trace",
            input.display()
        ),
        (Module::Trace(b), Some(f)) => {
            let fwd = match fsio::load(f)? {
                Module::Trace(t) => t,
                Module::Program(p) => p.forward,
            };
            (
                Program::from_thunder(fwd, b)
                    .with_context(|| format!("pairing {} with {}", input.display(), f.display()))?,
                true,
            )
        }
        (Module::Trace(t), None) => (Program::lone(t), true),
    })
}

fn opt(args: OptArgs) -> Result<()> {
    let (mut program, trace_input, pipeline) = match &args.reproduce {
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
            let (p, t) = load_program(input, args.forward.as_deref())?;
            (p, t, pipeline)
        }
    };
    let mut pm = PassManager::parse(&pipeline)?;
    pm.verify_each = !args.no_verify;
    pm.record_time = args.timing;
    pm.print_ir = PrintIr {
        before: args.print_ir_before.clone(),
        after: args.print_ir_after.clone(),
        after_all: args.print_ir_after_all,
        after_change: args.print_ir_after_change,
    };
    pm.reproducer_dir = Some(
        args.reproducer_dir
            .clone()
            .unwrap_or_else(std::env::temp_dir),
    );
    let result = pm.run(&mut program, OpRegistry::builtin());
    let report = result?;
    for d in &report.dumps {
        eprint!("{d}");
    }
    if args.timing {
        eprint!("{}", timing_table(&report));
    }
    let result = if trace_input {
        Module::Trace(program.backward)
    } else {
        Module::Program(program)
    };
    match (&args.output, result) {
        (Some(o), m) => fsio::save(o, &m)?,
        (None, Module::Trace(t)) => out(&tracepass_ir::print_trace(&t))?,
        (None, Module::Program(p)) => out(&tracepass_ir::print_trace(&p.backward))?,
    }
    Ok(())
}
