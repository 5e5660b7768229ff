//! Prints traces in Thunder's text form (see TRACE_FORMAT.md).

use crate::arg::{Arg, DTypeSpelling, DeviceSpelling};
use crate::node::{Lhs, LhsSlot, Node, SubSymbol};
use crate::pyfloat;
use crate::registry::ops;
use crate::trace::Trace;
use crate::value::ValueId;
use petgraph::stable_graph::NodeIndex;
use std::collections::BTreeSet;
use std::fmt::Write;

/// What to print besides the statements.
#[derive(Clone, Copy, Debug)]
pub struct PrintOptions {
    /// Decompositions as indented comments.
    pub subsymbols: bool,
    /// `del` statements after each value's last use.
    pub dels: bool,
    /// Source-location comments.
    pub source: bool,
    /// `# Constructed by` lines.
    pub provenance: bool,
}

impl Default for PrintOptions {
    fn default() -> Self {
        PrintOptions {
            subsymbols: true,
            dels: true,
            source: true,
            provenance: true,
        }
    }
}

impl PrintOptions {
    /// Statements only: what snapshot tests compare.
    pub fn bare() -> Self {
        PrintOptions {
            subsymbols: false,
            dels: false,
            source: false,
            provenance: true,
        }
    }
}

/// Prints with the default options.
pub fn print_trace(t: &Trace) -> String {
    print_trace_with(t, PrintOptions::default())
}

/// The trace as Thunder prints it, with options.
pub fn print_trace_with(t: &Trace, opts: PrintOptions) -> String {
    let mut out = String::with_capacity(112 * t.node_count() + 256);
    if opts.provenance {
        for p in &t.provenance {
            match p.millis {
                Some(ms) => {
                    let _ = writeln!(out, "# Constructed by {} (took {ms} milliseconds)", p.pass);
                }
                None => {
                    let _ = writeln!(out, "# Constructed by {}", p.pass);
                }
            }
        }
    }
    for line in imports(t) {
        out.push_str(&line);
        out.push('\n');
    }
    out.push('\n');
    for d in &t.decorators {
        let _ = writeln!(out, "@{d}");
    }
    let _ = write!(out, "def {}(", t.name);
    for (i, a) in t.args().iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        push_name(&mut out, t, *a);
    }
    out.push_str("):\n");
    for a in t.args() {
        write_type_comment(&mut out, t, *a, 1);
    }
    // a value's `del` follows the statement that reads it last (found during the one sweep
    // that prints the statements)
    let mut last = if opts.dels { t.last_uses() } else { Vec::new() };
    let mut dead: Vec<ValueId> = Vec::new();
    for (pos, (idx, node)) in t.nodes().enumerate() {
        if opts.source {
            if let Some(src) = node.source() {
                let _ = write!(out, "\n  # {src}\n");
            }
        }
        write_statement(&mut out, t, idx, node, 1);
        if opts.subsymbols {
            for s in node.subsymbols() {
                write_subsymbol(&mut out, s, 2);
            }
        }
        if opts.dels {
            dead.clear();
            node.for_each_operand(&mut |v| {
                if let Some(l) = last.get_mut(v.0 as usize) {
                    if *l == pos as u32 {
                        dead.push(v);
                        *l = crate::trace::NOT_READ; // listed once, however often it is read
                    }
                }
            });
            if !dead.is_empty() {
                out.push_str("  del ");
                for (i, v) in dead.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    push_name(&mut out, t, *v);
                }
                out.push('\n');
            }
        }
    }
    out.push_str("  return ");
    write_arg(&mut out, t, &t.ret);
    out.push('\n');
    out
}

/// One statement as printed, without its decomposition: used in diagnostics.
pub fn print_node_line(t: &Trace, idx: NodeIndex) -> String {
    let mut s = String::new();
    if let Some(n) = t.node(idx) {
        write_statement(&mut s, t, idx, n, 0);
    }
    s.trim_end().to_string()
}

fn imports(t: &Trace) -> Vec<String> {
    // the modules of the callees, collected without allocating per node
    let mut modules: BTreeSet<&str> = BTreeSet::new();
    for (_, n) in t.nodes() {
        if n.lhs == Lhs::Unpack {
            continue;
        }
        if let Some((module, _)) = n.callee_name().rsplit_once('.') {
            modules.insert(module);
        }
    }
    let mut set = BTreeSet::new();
    set.insert("import torch".to_string());
    for module in modules {
        match module {
            "ltorch" => {
                set.insert("import thunder".into());
                set.insert("import thunder.torch as ltorch".into());
            }
            "prims" => {
                set.insert("import thunder".into());
                set.insert("import thunder.core.prims as prims".into());
            }
            "dist" => {
                set.insert("import tracepass.dist as dist".into());
            }
            "python" => {
                set.insert("import tracepass.python as python".into());
            }
            // `Tensor.expand`: a method of torch's Tensor, imported as Thunder does
            "Tensor" => {
                set.insert("from torch import Tensor".into());
            }
            // `torch.torch.ops.aten.x`: Thunder's spelling, reachable through `import torch`
            m if m.starts_with("torch.torch.") => {}
            m => {
                set.insert(format!("import {m}"));
            }
        }
    }
    let mut v: Vec<String> = set.into_iter().collect();
    if t.decorators.iter().any(|d| d == "no_autocast") {
        v.push("from thunder.executors.torchex import no_autocast".into());
    }
    v
}

fn indent(out: &mut String, depth: usize) {
    for _ in 0..depth {
        out.push_str("  ");
    }
}

/// `# name: "type"` and a newline, after `depth` indents.
fn write_type_comment(out: &mut String, t: &Trace, v: ValueId, depth: usize) {
    indent(out, depth);
    out.push_str("# ");
    push_name(out, t, v);
    out.push_str(": \"");
    push_type(out, t, v);
    out.push_str("\"\n");
}

/// Appends a value's name (no copy of it is made).
fn push_name(out: &mut String, t: &Trace, v: ValueId) {
    match t.value(v) {
        Some(val) => out.push_str(val.name),
        None => {
            let _ = write!(out, "<undefined {v}>");
        }
    }
}

/// Appends a value's type as printed in type comments (`Any` when it has none).
fn push_type(out: &mut String, t: &Trace, v: ValueId) {
    match t.ty(v) {
        Some(ty) => {
            let _ = write!(out, "{ty}");
        }
        None => out.push_str("Any"),
    }
}

fn write_subsymbol(out: &mut String, s: &SubSymbol, depth: usize) {
    indent(out, depth);
    out.push_str("# ");
    out.push_str(&s.text);
    out.push('\n');
    for c in &s.children {
        write_subsymbol(out, c, depth + 1);
    }
}

fn write_statement(out: &mut String, t: &Trace, _idx: NodeIndex, n: &Node, depth: usize) {
    indent(out, depth);
    match n.lhs {
        Lhs::Unpack if n.op == ops::UNPACK_SEQUENCE => {
            for o in &n.outputs {
                push_name(out, t, *o);
                out.push_str(", ");
            }
            out.push_str("= ");
            if let Some(a) = n.args.first() {
                write_arg(out, t, a);
            }
            out.push('\n');
            for o in &n.outputs {
                write_type_comment(out, t, *o, depth);
            }
            return;
        }
        Lhs::None => {}
        Lhs::Single if n.outputs.len() == 1 => {
            push_name(out, t, n.outputs[0]);
            out.push_str(" = ");
        }
        Lhs::Nested if n.lhs_pattern().is_some() => {
            let mut names = n.outputs.iter();
            write_places(out, t, n.lhs_pattern().unwrap_or_default(), &mut names);
            out.push_str(" = ");
        }
        Lhs::Tuple => {
            out.push('(');
            for (i, o) in n.outputs.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                push_name(out, t, *o);
            }
            out.push_str(if n.outputs.len() == 1 {
                ",) = "
            } else {
                ") = "
            });
        }
        _ => {
            out.push('[');
            for (i, o) in n.outputs.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                push_name(out, t, *o);
            }
            out.push_str("] = ");
        }
    }
    out.push_str(n.callee_name());
    out.push('(');
    let mut first = true;
    for a in &n.args {
        if !first {
            out.push_str(", ");
        }
        first = false;
        write_arg(out, t, a);
    }
    for (k, a) in n.kwargs() {
        if !first {
            out.push_str(", ");
        }
        first = false;
        out.push_str(k);
        out.push('=');
        write_arg(out, t, a);
    }
    out.push(')');
    if n.lhs == Lhs::Single && n.outputs.len() == 1 {
        // the same comment as on its own line, two spaces after the statement
        write_type_comment(out, t, n.outputs[0], 1);
    } else {
        out.push('\n');
        if n.lhs != Lhs::None {
            for o in &n.outputs {
                write_type_comment(out, t, *o, depth);
            }
        }
    }
}

/// A nested left-hand side's places as a parenthesized tuple, names taken in order.
fn write_places<'a>(
    out: &mut String,
    t: &Trace,
    slots: &[LhsSlot],
    names: &mut impl Iterator<Item = &'a ValueId>,
) {
    out.push('(');
    for (i, s) in slots.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        match s {
            LhsSlot::Out => match names.next() {
                Some(o) => push_name(out, t, *o),
                // the verifier reports a pattern that names more places than outputs
                None => out.push('_'),
            },
            LhsSlot::Discard => out.push('_'),
            LhsSlot::Group(g) => write_places(out, t, g, names),
        }
    }
    out.push_str(if slots.len() == 1 { ",)" } else { ")" });
}

/// Python repr of a string: single quotes unless the text holds one and no double quote.
pub fn py_str(s: &str) -> String {
    let q = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(q);
    out
}

pub(crate) fn write_arg(out: &mut String, t: &Trace, a: &Arg) {
    match a {
        Arg::Value(v) => match t.value(*v) {
            Some(val) => out.push_str(val.name),
            None => {
                let _ = write!(out, "<undefined {v}>");
            }
        },
        Arg::None => out.push_str("None"),
        Arg::Bool(b) => out.push_str(if *b { "True" } else { "False" }),
        Arg::Int(i) => {
            let _ = write!(out, "{i}");
        }
        Arg::Float(f) => out.push_str(&pyfloat::repr(*f)),
        Arg::Str(s) => out.push_str(&py_str(s)),
        Arg::Tuple(items) => {
            out.push('(');
            write_items(out, t, items);
            if items.len() == 1 {
                out.push(',');
            }
            out.push(')');
        }
        Arg::List(items) => {
            out.push('[');
            write_items(out, t, items);
            out.push(']');
        }
        Arg::Dict(items) => {
            out.push('{');
            for (i, (k, v)) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_arg(out, t, k);
                out.push_str(": ");
                write_arg(out, t, v);
            }
            out.push('}');
        }
        Arg::DType(d, DTypeSpelling::Thunder) => {
            let _ = write!(out, "dtypes.{}", d.thunder_name());
        }
        Arg::DType(d, DTypeSpelling::Torch) => {
            let _ = write!(out, "torch.{}", d.torch_name());
        }
        Arg::Device(d, DeviceSpelling::Thunder) => {
            let _ = write!(out, "devices.Device(\"{d}\")");
        }
        Arg::Device(d, DeviceSpelling::Torch) => {
            let _ = write!(out, "torch.device(\"{d}\")");
        }
        Arg::Opaque(o) => out.push_str(&o.printed_name()),
        Arg::Slice(parts) => {
            out.push_str("slice(");
            for (i, p) in parts.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                match p {
                    Some(v) => {
                        let _ = write!(out, "{v}");
                    }
                    None => out.push_str("None"),
                }
            }
            out.push(')');
        }
        Arg::Ellipsis => out.push_str("..."),
    }
}

fn write_items(out: &mut String, t: &Trace, items: &[Arg]) {
    for (i, a) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        write_arg(out, t, a);
    }
}
