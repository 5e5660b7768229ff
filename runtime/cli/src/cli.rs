//! Subcommands of the `tracepass` binary. Errors go to stderr with a non-zero exit code.

use crate::input::{load_module, out, program_from_traces};
use crate::outputs::Files;
use anyhow::{bail, Result};
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use tracepass_ir::{dot::to_dot, fsio, print_trace_with, Module, PrintOptions};
use tracepass_runtime::comm::{exchange, DistEnv};

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
    /// Convert between formats; the extension decides (.trace text, .tpb binary, .json). An
    /// export directory is read as its program.
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
    /// Graphviz DOT of a trace (of a program or an export directory: its backward).
    Dot {
        file: PathBuf,
        /// Output file; stdout when absent.
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Run a pass pipeline, like mlir-opt.
    Opt(crate::opt_cmd::OptArgs),
    /// Execute a trace (or a forward and its backward) on tensors from a safetensors file,
    /// like mlir-cpu-runner.
    Run(Box<crate::run_cmd::RunArgs>),
    /// The op table: canonical names, dtype rule, effect, kernel status, spellings.
    Ops(crate::ops_cmd::OpsArgs),
    /// Train a model with DDP on thread ranks (the seed example by default).
    Train(Box<crate::train_cmd::TrainArgs>),
    /// Predict step time, overlap and exposed communication on a modelled device and network.
    Simulate(Box<crate::simulate_cmd::SimulateArgs>),
    /// Run `train --device cuda` as one process per GPU with torchrun's environment
    /// (`tracepass launch --nproc-per-node 8 -- train --device cuda`). On CPU, ranks are threads
    /// of one process: use `tracepass train --world-size N`.
    Launch {
        /// Processes (GPUs) on this machine.
        #[arg(long, allow_negative_numbers = true, value_parser = crate::numbers::count_from_1)]
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
        #[arg(long, default_value_t = 30.0, allow_negative_numbers = true, value_parser = crate::numbers::seconds)]
        timeout: f64,
    },
}

/// Runs the command line's subcommand.
pub fn run(cli: Cli) -> Result<()> {
    crate::input::set_allow_unregistered(cli.allow_unregistered);
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
            Files::new()
                .input("", Some(&input))
                .output("output", Some(&output))
                .check()?;
            let m = load_module(&input)?;
            fsio::save(&output, &m)?;
            Ok(())
        }
        Command::Verify { file } if tracepass_ir::is_export_dir(&file) => {
            crate::verify_cmd::run_export(&file)
        }
        Command::Verify { file } => crate::verify_cmd::run(&file),
        Command::Pack {
            forward,
            backward,
            prologue,
            output,
        } => {
            Files::new()
                .input("forward", Some(&forward))
                .input("backward", Some(&backward))
                .input("--prologue", prologue.as_deref())
                .output("-o", Some(&output))
                .check()?;
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
            Files::new()
                .input("", Some(&file))
                .output("-o", output.as_deref())
                .check()?;
            let m = load_module(&file)?;
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
        Command::Opt(args) => crate::opt_cmd::run(args),
        Command::Run(args) => crate::run_cmd::run(*args),
        Command::Ops(args) => crate::ops_cmd::run(args),
        Command::Train(args) => crate::train_cmd::run(*args),
        Command::Simulate(args) => crate::simulate_cmd::run(*args),
        Command::Launch {
            nproc_per_node,
            master_addr,
            master_port,
            args,
        } => {
            crate::launch::check_args(&args, nproc_per_node)?;
            Ok(crate::launch::launch(
                nproc_per_node,
                &master_addr,
                master_port,
                &args,
            )?)
        }
        Command::RendezvousCheck { timeout } => {
            let env = DistEnv::from_env()?;
            // rank 0's "id": 128 bytes that differ from run to run
            let seed = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
                ^ u64::from(std::process::id());
            let id: Vec<u8> = (0..128u64)
                .map(|i| {
                    (seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(i.wrapping_mul(1442695040888963407))
                        >> 33) as u8
                })
                .collect();
            let got = exchange(
                &env,
                (env.rank == 0).then_some(id.as_slice()),
                std::time::Duration::try_from_secs_f64(timeout.max(0.01))?,
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
