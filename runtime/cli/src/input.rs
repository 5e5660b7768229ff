//! The command line's files: reading a trace, program or export directory with the op registry
//! the flags chose, and checking before any work that an output can be written.

use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};
use tracepass_ir::{fsio, Module, OpRegistry, Program, Trace};

/// Set once from `--allow-unregistered`, before any file is read.
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
    check_exists(path)?;
    if path.is_dir() && !tracepass_ir::is_export_dir(path) {
        bail!(
            "{}: is a folder without export.json, not an export directory",
            path.display()
        );
    }
    let m = fsio::load_with(path, registry())?;
    note_decompositions(path, &m);
    Ok(m)
}

/// Says on stderr which ops of `m` were read through Thunder's printed decomposition (ops
/// tracepass has no entry for), so that nothing is read differently from how it was printed
/// without a word.
pub fn note_decompositions(path: &Path, m: &Module) {
    let traces: Vec<&Trace> = match m {
        Module::Trace(t) => vec![t],
        Module::Program(p) => vec![&p.forward, &p.backward],
    };
    for t in traces {
        for p in &t.provenance {
            if let Some(ops) = p.pass.strip_prefix(tracepass_ir::decomposition::PROVENANCE) {
                eprintln!(
                    "note: {}: `{}`: read through Thunder's printed decomposition: {ops}",
                    path.display(),
                    t.name
                );
            }
        }
    }
}

/// Refuses a path that names nothing, before its extension is looked at (a missing folder would
/// otherwise be "an unknown file extension").
pub fn check_exists(path: &Path) -> Result<()> {
    if !path.exists() {
        bail!("{}: No such file or directory", path.display());
    }
    Ok(())
}

/// Chooses the registry of [`registry`]: with `--allow-unregistered`, unknown ops are kept.
pub fn set_allow_unregistered(allow: bool) {
    ALLOW_UNREGISTERED.store(allow, std::sync::atomic::Ordering::Relaxed);
}

/// Writes to stdout; a closed pipe (`tracepass show x | head`) is not an error.
pub fn out(s: &str) -> Result<()> {
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
    let m = fsio::load_with(path, registry())?;
    note_decompositions(path, &m);
    Ok(match m {
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
