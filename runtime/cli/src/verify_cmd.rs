//! `tracepass verify`: every violation of a file, each with its line. A text trace that does not
//! parse gets every parse error (the failing line is set aside and parsing goes on); one that
//! parses gets every semantic violation, located by its statement's line in the file. An export
//! directory gets its traces checked so, then what training it needs.

use anyhow::{bail, Result};
use std::path::Path;
use tracepass_ir::{fsio, parse_trace_with, verify_with, Diagnostic, Module};
use tracepass_runtime::tensor::TensorFile;
use tracepass_runtime::train::{file_params, forward_output_at, LossKind};

/// At most this many parse errors are reported for one file.
const MAX_PARSE_ERRORS: usize = 100;

/// The names a statement line defines (`t1 = ...`, `[a, b] = ...`, `C0, C1, = ...`).
fn defined_names(line: &str) -> Vec<String> {
    let Some((lhs, _)) = line.split_once(" = ") else {
        return Vec::new();
    };
    lhs.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

/// The name in an "undefined name `x`" message.
fn undefined_name(message: &str) -> Option<&str> {
    let rest = message.split("undefined name `").nth(1)?;
    rest.split('`').next()
}

/// Every parse error of `text`: after each one its line is blanked and parsing starts over
/// (blank lines are allowed anywhere), so later lines are checked too. A use of a name that a
/// blanked line defined is a consequence, not another error: it is set aside unreported.
pub fn parse_errors(text: &str) -> Vec<tracepass_ir::ParseError> {
    let mut lines: Vec<&str> = text.split('\n').collect();
    let mut errors: Vec<tracepass_ir::ParseError> = Vec::new();
    let mut lost: std::collections::HashSet<String> = std::collections::HashSet::new();
    while errors.len() < MAX_PARSE_ERRORS {
        let joined = lines.join("\n");
        let Err(e) = parse_trace_with(&joined, crate::input::registry()) else {
            break;
        };
        let at = e.line.saturating_sub(1);
        // no progress (the error is not on a line of its own): stop here
        if at >= lines.len() || lines[at].trim().is_empty() {
            errors.push(e);
            break;
        }
        let follow_on = undefined_name(&e.message).is_some_and(|n| lost.contains(n));
        if lines[at].trim_start().starts_with("return") {
            // without its return the rest cannot be checked
            if !follow_on {
                errors.push(e);
            }
            break;
        }
        lost.extend(defined_names(lines[at]));
        lines[at] = "";
        if !follow_on {
            errors.push(e);
        }
    }
    errors
}

/// The line (1-based) of `text` that holds the statement a diagnostic shows, if one does.
fn line_of(text: &str, d: &Diagnostic) -> Option<usize> {
    let stmt = d.line.trim();
    let head = stmt.split("  #").next().unwrap_or(stmt).trim();
    if head.is_empty() {
        return None;
    }
    let mut found = text.lines().enumerate().filter(|(_, l)| {
        let l = l.trim();
        !l.starts_with('#') && (l == stmt || l.split("  #").next().unwrap_or(l).trim() == head)
    });
    let first = found.next().map(|(i, _)| i + 1);
    // a statement printed the same on two lines cannot be located
    match found.next() {
        Some(_) => None,
        None => first,
    }
}

pub fn run(file: &Path) -> Result<()> {
    let shown = file.display();
    crate::input::check_exists(file)?;
    if file.is_dir() {
        bail!("{shown}: is a folder without export.json, not an export directory");
    }
    let text = match fsio::Format::from_path(file)? {
        fsio::Format::Text => {
            Some(std::fs::read_to_string(file).map_err(|e| anyhow::anyhow!("{shown}: {e}"))?)
        }
        _ => None,
    };
    if let Some(t) = &text {
        let errors = parse_errors(t);
        if !errors.is_empty() {
            for e in &errors {
                eprintln!("{shown}: {e}");
            }
            bail!(
                "{shown}: {} parse error{}{}",
                errors.len(),
                if errors.len() == 1 { "" } else { "s" },
                if errors.len() >= MAX_PARSE_ERRORS {
                    " (stopped counting)"
                } else {
                    ""
                }
            );
        }
    }
    let m = fsio::load_with(file, crate::input::registry())?;
    crate::input::note_decompositions(file, &m);
    let traces = match &m {
        Module::Trace(t) => vec![t],
        Module::Program(p) => vec![&p.forward, &p.backward],
    };
    let mut count = 0;
    for t in traces {
        if let Err(e) = verify_with(t, crate::input::registry()) {
            for d in &e.diagnostics {
                count += 1;
                match text.as_deref().and_then(|x| line_of(x, d)) {
                    Some(n) => eprintln!("{shown}: line {n}: {}\n  | {}", d.message, d.line),
                    None => eprintln!("{shown}: trace `{}`: {d}", e.trace),
                }
            }
        }
    }
    if count > 0 {
        bail!(
            "{shown}: {count} violation{}",
            if count == 1 { "" } else { "s" }
        );
    }
    crate::input::out(&format!("{shown}: ok\n"))
}

/// `verify DIR` of an export directory: its traces line by line, then how they pair, and what
/// `train` will need of it: a known loss, the model output it names, and every parameter and
/// buffer in `params.safetensors` with the program's shape.
pub fn run_export(dir: &Path) -> Result<()> {
    for name in ["forward.trace", "backward.trace"] {
        run(&dir.join(name))?;
    }
    let e = tracepass_ir::load_export_with(dir, crate::input::registry())?;
    let json = dir.join("export.json");
    let p = &e.program;
    LossKind::from_export(&e.info.loss).map_err(|m| anyhow::anyhow!("{}: {m}", json.display()))?;
    if forward_output_at(&p.forward, e.info.output).is_none() {
        bail!(
            "{}: `output` {}: the forward has no model output {} (they count from 0)",
            json.display(),
            e.info.output,
            e.info.output
        );
    }
    let params = e.file("params.safetensors");
    if !params.is_file() {
        bail!(
            "{}: missing; an export holds every parameter and buffer there (docs/EXPORT_FORMAT.md)",
            params.display()
        );
    }
    let file = TensorFile::load(&params)?;
    file_params(&p.params, &file).map_err(anyhow::Error::msg)?;
    crate::input::out(&format!(
        "{}: ok: {} parameters ({} trainable, {} frozen, {} tied), {} buffers, data {}\n",
        dir.display(),
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
    ))?;
    let unused = p.unused_params();
    if unused.is_empty() {
        return Ok(());
    }
    crate::input::out(&format!(
        "{}: unused: {} (the loss never reaches them: no gradient, never updated)\n",
        dir.display(),
        unused.join(", ")
    ))
}
