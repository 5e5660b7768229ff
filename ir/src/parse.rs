//! Parses Thunder's text form (see TRACE_FORMAT.md) into a `Trace`. What cannot be represented is
//! an error naming line and column; nothing is dropped silently except what the format calls
//! derived (`del`, imports, blank lines).

use crate::arg::{Arg, DTypeSpelling, DeviceSpelling, Opaque};
use crate::decomposition::inline_unknown_decompositions;
use crate::name_table::NameTable;
use crate::node::{Lhs, LhsSlot, Node, SubSymbol};
use crate::pyfloat;
use crate::registry::{ops, DTypeRule, MetaOut, OpRegistry};
use crate::trace::{Provenance, Trace, TraceKind};
use crate::types::{DType, Device, Type};
use crate::value::{ValueId, ValueIdMap};
use std::fmt;

/// A parse error: where, what, and the line as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ParseError {
    /// The line, counting from 1.
    pub line: usize,
    /// The column, counting from 1.
    pub col: usize,
    /// What is wrong.
    pub message: String,
    /// The line as written (empty when there is none, as at the end of the text).
    pub text: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "line {}, column {}: {}\n  | {}",
            self.line, self.col, self.message, self.text
        )
    }
}

/// Parses with the built-in op registry.
pub fn parse_trace(text: &str) -> Result<Trace, ParseError> {
    parse_trace_with(text, OpRegistry::builtin())
}

/// Parses with a given op registry (for traces that use ops registered by the user).
pub fn parse_trace_with(text: &str, registry: &OpRegistry) -> Result<Trace, ParseError> {
    // a trace's value names live in one text of at most 4 GiB; a larger text could hold more
    if text.len() > crate::name_text::MAX_NAME_TEXT {
        return Err(ParseError {
            line: 1,
            col: 1,
            message: format!(
                "the text is {} bytes; traces over {} bytes are not read",
                text.len(),
                crate::name_text::MAX_NAME_TEXT
            ),
            text: String::new(),
        });
    }
    if text.contains("\\\n") || text.contains("\\\r\n") {
        let (joined, line_no) = join_continuations(text);
        return parse_lines(&joined, line_no, registry);
    }
    parse_lines(text, Vec::new(), registry)
}

/// Parses `text` whose line `i` is line `line_no[i]` of what the user gave (empty: the same).
/// A trace with ops no registry entry knows is read again with those that carry a printed
/// decomposition replaced by it ([`crate::decomposition`]); the trace's provenance says so.
fn parse_lines(
    text: &str,
    line_no: Vec<usize>,
    registry: &OpRegistry,
) -> Result<Trace, ParseError> {
    let mut p = Parser::new(text, registry);
    p.line_no = line_no.clone();
    let first = match p.run() {
        Ok(t) => return lowered(t, text, &line_no, registry),
        Err(Failure::UnknownOps(e)) => e,
        Err(Failure::Other(e)) => return Err(e),
    };
    let (inlined_text, map, inlined) =
        inline_unknown_decompositions(text, |callee| registry.resolve(callee).is_some());
    if inlined.is_empty() {
        return Err(first);
    }
    let physical = |l: usize| line_no.get(l).copied().unwrap_or(l);
    let mut p = Parser::new(&inlined_text, registry);
    let p_line_no: Vec<usize> = map.iter().map(|&l| physical(l)).collect();
    p.line_no = p_line_no.clone();
    let mut trace = match p.run() {
        Ok(t) => t,
        // the op stays unknown, named where the user wrote it; the body's gap is said too
        Err(Failure::UnknownOps(inner)) => {
            return Err(ParseError {
                message: format!(
                    "{}; the printed decompositions do not help: {}",
                    first.message, inner.message
                ),
                ..first
            })
        }
        Err(Failure::Other(e)) => return Err(e),
    };
    // each op once, with the lines it is on
    let mut by_op: Vec<(&str, Vec<usize>)> = Vec::new();
    for op in inlined.iter().filter(|op| !op.nested) {
        let line = physical(op.line - 1) + 1;
        match by_op.iter_mut().find(|(c, _)| *c == op.callee) {
            Some((_, lines)) => lines.push(line),
            None => by_op.push((&op.callee, vec![line])),
        }
    }
    let ops: Vec<String> = by_op
        .iter()
        .map(|(c, lines)| {
            let lines: Vec<String> = lines.iter().map(usize::to_string).collect();
            let s = if lines.len() == 1 { "" } else { "s" };
            format!("`{c}` (line{s} {})", lines.join(", "))
        })
        .collect();
    trace.provenance.push(Provenance {
        pass: format!("{}{}", crate::decomposition::PROVENANCE, ops.join(", ")),
        millis: None,
    });
    lowered(trace, &inlined_text, &p_line_no, registry)
}

/// The trace with the ops [`crate::lowering`] rewrites rewritten; an error names the line of
/// the statement (found by the name it defines in `text`, whose line `i` is `line_no[i]`).
fn lowered(
    mut trace: Trace,
    text: &str,
    line_no: &[usize],
    registry: &OpRegistry,
) -> Result<Trace, ParseError> {
    match crate::lowering::lower(&mut trace, registry) {
        Ok(()) => Ok(trace),
        Err(e) => {
            let line = text
                .lines()
                .position(|l| {
                    let l = l.trim_start();
                    !l.starts_with('#')
                        && l.split(" = ").next().is_some_and(|lhs| {
                            lhs.split(['(', ')', ',', ' ']).any(|n| n == e.output)
                        })
                })
                .unwrap_or(0);
            Err(ParseError {
                line: line_no.get(line).copied().unwrap_or(line) + 1,
                col: 1,
                message: e.message,
                text: text.lines().nth(line).unwrap_or_default().to_string(),
            })
        }
    }
}

/// Why a parse failed: ops no registry entry knows (which a printed decomposition may
/// replace), or anything else.
enum Failure {
    UnknownOps(ParseError),
    Other(ParseError),
}

impl From<ParseError> for Failure {
    fn from(e: ParseError) -> Self {
        Failure::Other(e)
    }
}

/// Joins Python's explicit line continuations (a line ending in `\`) into one logical line,
/// and maps each logical line to the physical line it starts on (errors name that one).
fn join_continuations(text: &str) -> (String, Vec<usize>) {
    let mut out = String::with_capacity(text.len());
    let mut line_no = Vec::new();
    let mut continuing = false;
    let mut open = None;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim_end();
        let (cont, still_open) = continues(line, open);
        open = still_open;
        let body = match line.strip_suffix('\\') {
            Some(b) if cont => b,
            _ => line,
        };
        if continuing {
            out.push(' ');
            out.push_str(body.trim_start());
        } else {
            line_no.push(i);
            out.push_str(body);
        }
        if !cont {
            out.push('\n');
        }
        continuing = cont;
    }
    (out, line_no)
}

/// Whether `line` (trailing blanks trimmed) continues on the next one, and the string it
/// leaves open: it ends in a `\` that is code or inside a string (`open`: the quote of a
/// string a continued line left open), not in a comment. Thunder copies each op's source line
/// into a comment, and a Python line continued by `\` (`return a + \`) keeps its backslash
/// there; taking that as a continuation would swallow the op on the next line.
fn continues(line: &str, open: Option<char>) -> (bool, Option<char>) {
    let mut quote = open;
    let mut escaped = false;
    for ch in line.chars() {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if ch == '\\' {
                    escaped = true;
                } else if ch == q {
                    quote = None;
                }
            }
            None => match ch {
                '#' => return (false, None),
                '\'' | '"' => quote = Some(ch),
                _ => {}
            },
        }
    }
    // in a string, the last `\` continues it unless it was itself escaped
    let cont = line.ends_with('\\') && (quote.is_none() || escaped);
    (cont, quote.filter(|_| cont))
}

// ----- tokens -----

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Tok<'a> {
    Name(&'a str),
    Int(i64),
    Float(f64),
    Str(String),
    Punct(char),
    Comment(&'a str),
}

pub(crate) struct Lexed<'a> {
    pub(crate) toks: Vec<(Tok<'a>, usize)>,
}

pub(crate) fn lex(line: &str) -> Result<Lexed<'_>, (usize, String)> {
    let b = line.as_bytes();
    let mut i = 0;
    let mut toks = Vec::with_capacity(16);
    while i < b.len() {
        let c = b[i];
        let start = i;
        match c {
            b' ' | b'\t' => i += 1,
            b'#' => {
                toks.push((Tok::Comment(line[i + 1..].trim_start()), start));
                break;
            }
            b'.' if line[i..].starts_with("...") => {
                toks.push((Tok::Name(&line[i..i + 3]), start));
                i += 3;
            }
            b'a'..=b'z' | b'A'..=b'Z' | b'_' => {
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'.')
                {
                    i += 1;
                }
                toks.push((Tok::Name(&line[start..i]), start));
            }
            b'0'..=b'9' => {
                while i < b.len()
                    && (b[i].is_ascii_alphanumeric()
                        || b[i] == b'.'
                        || b[i] == b'_'
                        || ((b[i] == b'+' || b[i] == b'-') && matches!(b[i - 1], b'e' | b'E')))
                {
                    i += 1;
                }
                let s = line[start..i].replace('_', "");
                let is_float = s.contains(['.', 'e', 'E']);
                let tok = if is_float {
                    s.parse::<f64>().map(Tok::Float).ok()
                } else {
                    s.parse::<i64>().map(Tok::Int).ok()
                };
                toks.push((
                    tok.ok_or_else(|| (start, format!("bad number `{}`", &line[start..i])))?,
                    start,
                ));
            }
            b'\'' | b'"' => {
                let q = c;
                i += 1;
                let mut s = String::new();
                loop {
                    let Some(&ch) = b.get(i) else {
                        return Err((start, "unterminated string".into()));
                    };
                    if ch == q {
                        i += 1;
                        break;
                    }
                    if ch == b'\\' {
                        let Some(&e) = b.get(i + 1) else {
                            return Err((i, "unterminated escape".into()));
                        };
                        match e {
                            b'n' => s.push('\n'),
                            b't' => s.push('\t'),
                            b'r' => s.push('\r'),
                            b'\\' => s.push('\\'),
                            b'\'' => s.push('\''),
                            b'"' => s.push('"'),
                            b'x' => {
                                let hex = line
                                    .get(i + 2..i + 4)
                                    .ok_or((i, "bad \\x escape".to_string()))?;
                                let v = u8::from_str_radix(hex, 16)
                                    .map_err(|_| (i, "bad \\x escape".to_string()))?;
                                s.push(v as char);
                                i += 2;
                            }
                            _ => return Err((i, format!("unsupported escape `\\{}`", e as char))),
                        }
                        i += 2;
                        continue;
                    }
                    // copy one UTF-8 character
                    let ch_len = line[i..].chars().next().map_or(1, char::len_utf8);
                    s.push_str(&line[i..i + ch_len]);
                    i += ch_len;
                }
                toks.push((Tok::Str(s), start));
            }
            b'(' | b')' | b'[' | b']' | b'{' | b'}' | b',' | b':' | b'=' | b'-' | b'*' => {
                toks.push((Tok::Punct(c as char), start));
                i += 1;
            }
            _ => {
                let ch = line[i..].chars().next().unwrap_or('?');
                return Err((start, format!("unexpected character `{ch}`")));
            }
        }
    }
    Ok(Lexed { toks })
}

// ----- the parser -----

struct Parser<'a> {
    lines: Vec<&'a str>,
    reg: &'a OpRegistry,
    trace: Trace,
    names: NameTable,
    /// Values still waiting for a type, with the line that defined them.
    untyped: ValueIdMap<usize>,
    node_lines: Vec<usize>,
    last_node: Option<petgraph::stable_graph::NodeIndex>,
    pending_source: Option<String>,
    /// Physical line of each logical line, when continuations were joined.
    line_no: Vec<usize>,
    /// Callees no op is registered for: (callee, first line, column, uses).
    unknown: Vec<(String, usize, usize, usize)>,
}

type PResult<T> = Result<T, ParseError>;
/// Positional and keyword operands of a call.
type CallArgs = (Vec<Arg>, Vec<(String, Arg)>);

impl<'a> Parser<'a> {
    fn new(text: &'a str, reg: &'a OpRegistry) -> Self {
        let lines: Vec<&str> = text.lines().collect();
        // Every statement and every value takes at least one line: tables sized by the line
        // count never grow (growing a million-entry table rehashes it, out of cache, twice
        // over on the way up).
        let n = lines.len();
        let mut trace = Trace::new("", TraceKind::Computation);
        trace.reserve(n, n);
        Parser {
            lines,
            reg,
            trace,
            names: NameTable::new(),
            untyped: ValueIdMap::default(),
            node_lines: Vec::with_capacity(n),
            last_node: None,
            pending_source: None,
            line_no: Vec::new(),
            unknown: Vec::new(),
        }
    }

    fn err(&self, line: usize, col: usize, msg: impl Into<String>) -> ParseError {
        ParseError {
            line: self.line_no.get(line).copied().unwrap_or(line) + 1,
            col: col + 1,
            message: msg.into(),
            text: self
                .lines
                .get(line)
                .map(|s| s.to_string())
                .unwrap_or_default(),
        }
    }

    fn run(mut self) -> Result<Trace, Failure> {
        let mut ln = 0;
        let mut decorators = Vec::new();
        let mut saw_def = false;
        // header
        while ln < self.lines.len() {
            let raw = self.lines[ln];
            let line = raw.trim_end();
            if line.trim().is_empty() {
                ln += 1;
                continue;
            }
            if let Some(rest) = line.strip_prefix("# Constructed by ") {
                self.trace.provenance.push(parse_provenance(rest));
            } else if line.starts_with("import ") || line.starts_with("from ") {
            } else if let Some(d) = line.strip_prefix('@') {
                decorators.push(d.trim().to_string());
            } else if line.starts_with("def ") {
                self.parse_signature(ln, line)?;
                saw_def = true;
                ln += 1;
                break;
            } else {
                return Err(self
                    .err(
                        ln,
                        0,
                        "expected a header line (`# Constructed by`, import, decorator or `def`)",
                    )
                    .into());
            }
            ln += 1;
        }
        if !saw_def {
            return Err(self
                .err(ln.saturating_sub(1), 0, "no `def` line: not a trace")
                .into());
        }
        self.trace.decorators = decorators;
        let mut returned = false;
        while ln < self.lines.len() {
            let raw = self.lines[ln];
            let line = raw.trim_end();
            let body = line.trim_start_matches(' ');
            let ind = line.len() - body.len();
            if body.is_empty() {
                ln += 1;
                continue;
            }
            if ind < 2 {
                return Err(self
                    .err(ln, 0, "statement outside the function body")
                    .into());
            }
            if returned {
                if body.starts_with('#') {
                    ln += 1;
                    continue;
                }
                return Err(self.err(ln, ind, "statement after `return`").into());
            }
            if let Some(c) = body.strip_prefix('#') {
                let c = c.strip_prefix(' ').unwrap_or(c);
                if ind >= 4 {
                    self.attach_subsymbol(ln, ind, c)?;
                } else if let Some((name, ty)) = type_comment(c) {
                    self.apply_type_comment(ln, ind, name, ty)?;
                } else {
                    self.pending_source = Some(c.to_string());
                }
            } else if let Some(rest) = body.strip_prefix("del ") {
                for name in rest.split(',') {
                    let name = name.trim();
                    if !name.is_empty() && !self.names.contains_key(name) {
                        return Err(self
                            .err(ln, ind + 4, format!("`del` of undefined name `{name}`"))
                            .into());
                    }
                }
            } else if body == "return" || body.starts_with("return ") {
                let lx = lex(body).map_err(|(c, m)| self.err(ln, ind + c, m))?;
                let toks = strip_comment(&lx.toks);
                self.trace.ret = if toks.len() <= 1 {
                    Arg::None
                } else {
                    let mut p = ExprParser {
                        toks,
                        pos: 1,
                        parser: &self,
                        ln,
                        ind,
                        depth: 0,
                    };
                    let e = p.parse_return()?;
                    p.expect_end()?;
                    e
                };
                returned = true;
            } else {
                self.parse_statement(ln, ind, body)?;
            }
            ln += 1;
        }
        if !self.unknown.is_empty() {
            return Err(Failure::UnknownOps(self.unknown_ops_error()));
        }
        if !returned {
            return Err(self
                .err(
                    self.lines.len().saturating_sub(1),
                    0,
                    "trace has no `return`",
                )
                .into());
        }
        self.resolve_untyped()?;
        self.keep_input_dtypes();
        self.trace.kind = infer_kind(&self.trace);
        Ok(self.trace)
    }

    /// Thunder's grad rules can declare a result in a dtype its op cannot give: 0.2.6's rule
    /// for `amax` (behind `max_pool1d`, `torch.max(x, dim)`) declares the `unsqueeze` and
    /// `expand` of an i64 tie count as `b8`. Those ops keep their input's dtype in PyTorch, so
    /// when Thunder runs the trace the values are i64. For an op whose dtype is its first
    /// operand's, a declared dtype that differs (shape and device agreeing with the op's meta)
    /// is replaced by the dtype torch gives, and the trace's provenance lists every value so
    /// read. Any other disagreement stays for the verifier to report.
    fn keep_input_dtypes(&mut self) {
        let mut fixed: Vec<String> = Vec::new();
        let order: Vec<_> = self.trace.schedule().to_vec();
        for idx in order {
            let Some(node) = self.trace.node(idx) else {
                continue;
            };
            if self.reg.get(&node.op).map(|d| d.dtype) != Some(DTypeRule::First) {
                continue;
            }
            let first = node.args.iter().find_map(|a| match a {
                Arg::Value(v) => match self.trace.ty(*v) {
                    Some(Type::Tensor(t)) => Some(t.dtype),
                    _ => None,
                },
                _ => None,
            });
            let Some(first) = first else { continue };
            let differs = node
                .outputs
                .iter()
                .any(|o| matches!(self.trace.ty(*o), Some(Type::Tensor(t)) if t.dtype != first));
            if !differs {
                continue;
            }
            let node = node.clone();
            let Ok(MetaOut::Types(types)) = self.reg.infer_node(&self.trace, &node) else {
                continue;
            };
            if types.len() != node.outputs.len() {
                continue;
            }
            for (o, want) in node.outputs.iter().zip(types) {
                let (Some(Type::Tensor(have)), Type::Tensor(w)) = (self.trace.ty(*o), &want) else {
                    continue;
                };
                if have.dtype != w.dtype && have.shape == w.shape && have.device == w.device {
                    fixed.push(format!(
                        "{} ({} declared {}, gives {})",
                        self.trace.name(*o),
                        node.op,
                        have.dtype,
                        w.dtype
                    ));
                    self.trace.set_ty(*o, want);
                }
            }
        }
        if !fixed.is_empty() {
            self.trace.provenance.push(Provenance {
                pass: format!(
                    "tracepass import: the dtype torch gives, not Thunder's: {}",
                    fixed.join(", ")
                ),
                millis: None,
            });
        }
    }

    fn parse_signature(&mut self, ln: usize, line: &str) -> PResult<()> {
        let rest = &line[4..];
        let open = rest
            .find('(')
            .ok_or_else(|| self.err(ln, 4, "expected `(` in `def`"))?;
        let name = rest[..open].trim();
        if name.is_empty() || !is_ident(name) {
            return Err(self.err(ln, 4, format!("bad function name `{name}`")));
        }
        let close = rest
            .rfind("):")
            .ok_or_else(|| self.err(ln, line.len(), "expected `):` ending the `def` line"))?;
        self.trace.name = name.to_string();
        let mut col = 4 + open + 1;
        for part in rest[open + 1..close].split(',') {
            let arg = part.trim();
            if !arg.is_empty() {
                if !is_ident(arg) {
                    return Err(self.err(ln, col, format!("unsupported parameter `{arg}`")));
                }
                if self.names.contains_key(arg) {
                    return Err(self.err(ln, col, format!("parameter `{arg}` appears twice")));
                }
                let id = self.trace.push_arg(arg, Type::Any);
                self.names.insert(arg, (id, ln));
                self.untyped.insert(id, ln);
            }
            col += part.len() + 1;
        }
        Ok(())
    }

    /// `# name: "type"`, its `#` at column `ind` (0-based, as everywhere in the parser).
    fn apply_type_comment(&mut self, ln: usize, ind: usize, name: &str, ty: &str) -> PResult<()> {
        let Some((id, _)) = self.names.get(name) else {
            return Err(self.err(
                ln,
                ind + 2,
                format!("type comment for undefined name `{name}`"),
            ));
        };
        let col = ind + 2 + name.len() + 3;
        let parsed =
            Type::parse(ty).ok_or_else(|| self.err(ln, col, format!("unknown type `{ty}`")))?;
        if parsed.is_oversized() {
            return Err(self.err(
                ln,
                col,
                format!(
                    "type `{ty}` is too large: over {} bytes",
                    crate::types::MAX_TENSOR_BYTES
                ),
            ));
        }
        self.trace.set_ty(id, parsed);
        self.untyped.remove(&id);
        Ok(())
    }

    fn attach_subsymbol(&mut self, ln: usize, ind: usize, text: &str) -> PResult<()> {
        let Some(idx) = self.last_node else {
            return Err(self.err(ln, ind, "decomposition comment before any statement"));
        };
        let depth = ind / 2 - 1; // 1 for the first level under a statement
        let node = self.trace.node_mut(idx).expect("last node exists");
        let mut level = node.subsymbols_mut();
        for _ in 1..depth {
            match level.last_mut() {
                Some(s) => level = &mut s.children,
                None => {
                    return Err(self.err(ln, ind, "decomposition comment indented past its parent"))
                }
            }
        }
        level.push(SubSymbol {
            text: text.to_string(),
            children: Vec::new(),
        });
        Ok(())
    }

    fn define(&mut self, ln: usize, col: usize, name: &str) -> PResult<ValueId> {
        if name == "_" && self.names.get(name).is_some() {
            return Err(self.err(
                ln,
                col,
                "`_` is bound more than once: only a tuple left-hand side, `(a, _, (_, b)) = f(x)`, may discard several results",
            ));
        }
        if let Some((_, first)) = self.names.get(name) {
            return Err(self.err(
                ln,
                col,
                format!("`{name}` is defined twice (first on line {})", first + 1),
            ));
        }
        let id = self.trace.new_value(name, Type::Any);
        self.names.insert(name, (id, ln));
        self.untyped.insert(id, ln);
        Ok(id)
    }

    /// The places of a nested left-hand side: the tuple opening at `lhs[open]`, read up to its
    /// closing `)`; gives the places and the index just past that `)`. Names are defined by
    /// the caller (in order, `_` excepted).
    fn lhs_places(
        &self,
        ln: usize,
        ind: usize,
        lhs: &[(Tok<'_>, usize)],
        open: usize,
        depth: usize,
    ) -> PResult<(Vec<LhsSlot>, usize)> {
        const MAX_DEPTH: usize = 64;
        if depth > MAX_DEPTH {
            return Err(self.err(
                ln,
                ind + lhs[open].1,
                format!("left-hand side nested deeper than {MAX_DEPTH} levels"),
            ));
        }
        let mut slots = Vec::new();
        let mut i = open + 1;
        loop {
            match lhs.get(i) {
                Some((Tok::Punct(')'), _)) => return Ok((slots, i + 1)),
                Some((Tok::Name("_"), _)) => {
                    slots.push(LhsSlot::Discard);
                    i += 1;
                }
                Some((Tok::Name(_), _)) => {
                    slots.push(LhsSlot::Out);
                    i += 1;
                }
                Some((Tok::Punct('('), _)) => {
                    let (inner, end) = self.lhs_places(ln, ind, lhs, i, depth + 1)?;
                    slots.push(LhsSlot::Group(inner));
                    i = end;
                }
                Some((_, c)) => {
                    return Err(self.err(ln, ind + c, "cannot read the left-hand side"))
                }
                None => {
                    return Err(self.err(
                        ln,
                        ind + lhs[open].1,
                        "this `(` of the left-hand side is never closed",
                    ))
                }
            }
            match lhs.get(i) {
                Some((Tok::Punct(','), _)) => i += 1,
                Some((Tok::Punct(')'), _)) => {}
                Some((_, c)) => {
                    return Err(self.err(ln, ind + c, "expected `,` or `)` in the left-hand side"))
                }
                None => {
                    return Err(self.err(
                        ln,
                        ind + lhs[open].1,
                        "this `(` of the left-hand side is never closed",
                    ))
                }
            }
        }
    }

    fn parse_statement(&mut self, ln: usize, ind: usize, body: &str) -> PResult<()> {
        let lx = lex(body).map_err(|(c, m)| self.err(ln, ind + c, m))?;
        // the comment and the column of its `#`
        let comment = match lx.toks.last() {
            Some((Tok::Comment(c), at)) => Some((*c, ind + *at)),
            _ => None,
        };
        let toks = strip_comment(&lx.toks);
        // find a top-level `=` that is not inside brackets (kwargs are inside the call)
        let mut depth = 0i32;
        let mut eq = None;
        for (i, (t, _)) in toks.iter().enumerate() {
            match t {
                Tok::Punct('(' | '[' | '{') => depth += 1,
                Tok::Punct(')' | ']' | '}') => depth -= 1,
                Tok::Punct('=') if depth == 0 => {
                    eq = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let mut pattern = None;
        let (lhs_kind, lhs_names, rhs_start) = match eq {
            None => (Lhs::None, Vec::new(), 0),
            Some(e) => {
                let lhs = &toks[..e];
                let names: Vec<(&str, usize)> = lhs
                    .iter()
                    .filter_map(|(t, c)| match t {
                        Tok::Name(n) => Some((*n, *c)),
                        _ => None,
                    })
                    .collect();
                let kind = match lhs.first() {
                    Some((Tok::Punct('['), _)) => Lhs::List,
                    Some((Tok::Punct('('), _)) => Lhs::Tuple,
                    Some((Tok::Name("_"), _)) if lhs.len() == 1 => Lhs::None,
                    Some((Tok::Name(_), _)) if lhs.len() == 1 => Lhs::Single,
                    Some((Tok::Name(_), _)) => Lhs::Unpack,
                    _ => return Err(self.err(ln, ind, "cannot read the left-hand side")),
                };
                let expected_punct = lhs.iter().all(|(t, _)| {
                    matches!(t, Tok::Name(_) | Tok::Punct(',' | '[' | ']' | '(' | ')'))
                });
                if !expected_punct {
                    return Err(self.err(ln, ind, "cannot read the left-hand side"));
                }
                let names = if kind == Lhs::None { Vec::new() } else { names };
                let nested = kind == Lhs::Tuple
                    && (names.iter().any(|(n, _)| *n == "_")
                        || lhs
                            .iter()
                            .skip(1)
                            .any(|(t, _)| matches!(t, Tok::Punct('('))));
                if nested {
                    let (slots, end) = self.lhs_places(ln, ind, lhs, 0, 1)?;
                    if end != lhs.len() {
                        return Err(self.err(
                            ln,
                            ind + lhs[end].1,
                            "unexpected text after the left-hand side's closing `)`",
                        ));
                    }
                    pattern = Some(slots);
                    let named = names.into_iter().filter(|(n, _)| *n != "_").collect();
                    (Lhs::Nested, named, e + 1)
                } else {
                    (kind, names, e + 1)
                }
            }
        };
        let rhs = &toks[rhs_start..];
        let node = if lhs_kind == Lhs::Unpack {
            // a, b, = source
            let (Some((Tok::Name(src), c)), 1) = (rhs.first(), rhs.len()) else {
                return Err(self.err(
                    ln,
                    ind,
                    "sequence unpacking needs a single name on the right",
                ));
            };
            let src_id = self.lookup(ln, ind + c, src)?;
            let mut outs = Vec::new();
            for (n, c) in &lhs_names {
                outs.push(self.define(ln, ind + c, n)?);
            }
            let mut n = Node::new(ops::UNPACK_SEQUENCE, vec![Arg::Value(src_id)], outs);
            n.lhs = Lhs::Unpack;
            n
        } else {
            let (callee, ccol) = match rhs.first() {
                Some((Tok::Name(n), c)) => (*n, *c),
                _ => return Err(self.err(ln, ind, "expected a call")),
            };
            if !matches!(rhs.get(1), Some((Tok::Punct('('), _))) {
                return Err(self.err(
                    ln,
                    ind + ccol + callee.len(),
                    "expected `(` after the callee",
                ));
            }
            let op = match self.reg.resolve(callee) {
                Some(op) => op.to_string(),
                None => {
                    if !self.reg.allows_unregistered() {
                        match self.unknown.iter_mut().find(|u| u.0 == callee) {
                            Some(u) => u.3 += 1,
                            None => self.unknown.push((callee.to_string(), ln, ind + ccol, 1)),
                        }
                    }
                    // kept as an opaque node under the name it was printed with
                    callee.to_string()
                }
            };
            let mut p = ExprParser {
                toks: rhs,
                pos: 2,
                parser: self,
                ln,
                ind,
                depth: 0,
            };
            let (args, kwargs) = p.parse_call_args()?;
            p.expect_end()?;
            let mut outs = Vec::new();
            for (n, c) in &lhs_names {
                outs.push(self.define(ln, ind + c, n)?);
            }
            let mut n = Node::new(op.clone(), args, outs);
            n.set_kwargs(kwargs);
            match pattern {
                Some(p) => n.set_nested_lhs(p),
                None => n.lhs = lhs_kind,
            }
            if callee != op {
                n.set_callee(Some(callee.to_string()));
            }
            n
        };
        let outputs = node.outputs.clone();
        let mut node = node;
        node.set_source(self.pending_source.take());
        let idx = self.trace.append(node);
        self.node_lines.push(ln);
        self.last_node = Some(idx);
        if let Some((c, hash_col)) = comment {
            match type_comment(c) {
                Some((name, ty)) if outputs.len() == 1 && self.trace.name(outputs[0]) == name => {
                    self.apply_type_comment(ln, hash_col, name, ty)?
                }
                Some((name, _)) => {
                    return Err(self.err(
                        ln,
                        ind,
                        format!(
                            "type comment names `{name}`, which this statement does not define"
                        ),
                    ))
                }
                None => {
                    return Err(self.err(ln, ind, format!("unexpected trailing comment `# {c}`")))
                }
            }
        }
        Ok(())
    }

    /// One error naming every op of the trace that no registry entry knows.
    fn unknown_ops_error(&self) -> ParseError {
        let (_, ln, col, _) = &self.unknown[0];
        let list: Vec<String> = self
            .unknown
            .iter()
            .map(|(op, l, _, n)| {
                let line = self.line_no.get(*l).copied().unwrap_or(*l) + 1;
                match n {
                    1 => format!("`{op}` (line {line})"),
                    n => format!("`{op}` (line {line}, {n} uses)"),
                }
            })
            .collect();
        self.err(
            *ln,
            *col,
            format!(
                "{} unknown op{}: {} (register them, or pass --allow-unregistered to keep them as opaque nodes)",
                self.unknown.len(),
                if self.unknown.len() == 1 { "" } else { "s" },
                list.join(", ")
            ),
        )
    }

    fn lookup(&self, ln: usize, col: usize, name: &str) -> PResult<ValueId> {
        self.names
            .get(name)
            .map(|(v, _)| v)
            .ok_or_else(|| self.err(ln, col, format!("undefined name `{name}`")))
    }

    /// Fills in types the text did not give, from each op's meta, in schedule order.
    fn resolve_untyped(&mut self) -> PResult<()> {
        if self.untyped.is_empty() {
            return Ok(());
        }
        let untyped = std::mem::take(&mut self.untyped);
        let order: Vec<_> = self.trace.schedule().to_vec();
        for (pos, idx) in order.into_iter().enumerate() {
            let needs = self
                .trace
                .node(idx)
                .is_some_and(|n| n.outputs.iter().any(|o| untyped.contains_key(o)));
            if !needs {
                continue;
            }
            let node = self.trace.node(idx).expect("scheduled").clone();
            let ln = self.node_lines[pos];
            let out = self
                .reg
                .infer_node(&self.trace, &node)
                .map_err(|m| self.err(ln, 0, format!("cannot infer output types: {m}")))?;
            match out {
                MetaOut::Types(types) if types.len() == node.outputs.len() => {
                    for (o, t) in node.outputs.iter().zip(types) {
                        if untyped.contains_key(o) {
                            self.trace.set_ty(*o, t);
                        }
                    }
                }
                MetaOut::Types(types) => {
                    return Err(self.err(
                        ln,
                        0,
                        format!(
                            "{} gives {} outputs, the statement binds {}",
                            node.op,
                            types.len(),
                            node.outputs.len()
                        ),
                    ))
                }
                // `infer_node` binds nested places to types
                MetaOut::Declared | MetaOut::Places(_) => {
                    // Thunder binds a member it never reads to `_` (`t4, _, = cotangents`,
                    // the cotangent of an integer output) and gives it no type comment
                    let discarded: Vec<_> = node
                        .outputs
                        .iter()
                        .filter(|o| untyped.contains_key(o) && self.trace.name(**o) == "_")
                        .copied()
                        .collect();
                    for o in discarded {
                        self.trace.set_ty(o, Type::Any);
                    }
                    let o = node
                        .outputs
                        .iter()
                        .find(|o| untyped.contains_key(o) && self.trace.name(**o) != "_")
                        .copied();
                    if let Some(o) = o {
                        return Err(self.err(
                            ln,
                            0,
                            format!("no type comment for `{}`", self.trace.name(o)),
                        ));
                    }
                }
            }
        }
        // arguments without type comments stay `Any`
        Ok(())
    }
}

pub(crate) fn strip_comment<'t, 'a>(toks: &'t [(Tok<'a>, usize)]) -> &'t [(Tok<'a>, usize)] {
    match toks.last() {
        Some((Tok::Comment(_), _)) => &toks[..toks.len() - 1],
        _ => toks,
    }
}

pub(crate) fn is_ident(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some(ch) if ch.is_ascii_alphabetic() || ch == '_')
        && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
}

/// `name: "type"` → (name, type).
fn type_comment(c: &str) -> Option<(&str, &str)> {
    let (name, rest) = c.split_once(": ")?;
    if !is_ident(name) {
        return None;
    }
    let ty = rest.trim().strip_prefix('"')?.strip_suffix('"')?;
    Some((name, ty))
}

fn parse_provenance(rest: &str) -> Provenance {
    if let Some((pass, tail)) = rest.rsplit_once(" (took ") {
        if let Some(ms) = tail
            .strip_suffix(" milliseconds)")
            .and_then(|m| m.parse::<u64>().ok())
        {
            return Provenance {
                pass: pass.to_string(),
                millis: Some(ms),
            };
        }
    }
    Provenance {
        pass: rest.to_string(),
        millis: None,
    }
}

/// Backward by name, joint when it asks for gradients, forward when it returns
/// `(outputs, saved_for_backward)`, otherwise a plain computation.
fn infer_kind(t: &Trace) -> TraceKind {
    if t.name.starts_with("backward") {
        return TraceKind::Backward;
    }
    if t.nodes().any(|(_, n)| n.op == "prims.get_grad") {
        return TraceKind::Joint;
    }
    if let Arg::Tuple(items) = &t.ret {
        if items.len() == 2 && matches!(items[0], Arg::Dict(_)) && matches!(items[1], Arg::Tuple(_))
        {
            return TraceKind::Forward;
        }
    }
    TraceKind::Computation
}

struct ExprParser<'p, 't, 'a> {
    toks: &'t [(Tok<'a>, usize)],
    pos: usize,
    parser: &'p Parser<'a>,
    ln: usize,
    ind: usize,
    /// Nesting of the expression being parsed (bounded: parsing recurses per level).
    depth: u32,
}

impl ExprParser<'_, '_, '_> {
    fn col(&self) -> usize {
        self.ind
            + self
                .toks
                .get(self.pos)
                .map_or_else(|| self.toks.last().map_or(0, |t| t.1 + 1), |t| t.1)
    }
    fn err(&self, msg: impl Into<String>) -> ParseError {
        self.parser.err(self.ln, self.col(), msg)
    }
    fn peek(&self) -> Option<&Tok<'_>> {
        self.toks.get(self.pos).map(|t| &t.0)
    }
    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(&Tok::Punct(c)) {
            self.pos += 1;
            true
        } else {
            false
        }
    }
    fn expect(&mut self, c: char) -> PResult<()> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(self.err(format!("expected `{c}`")))
        }
    }
    fn expect_end(&self) -> PResult<()> {
        if self.pos < self.toks.len() {
            return Err(self.err("unexpected text after the expression"));
        }
        Ok(())
    }

    /// After `callee(`: positional and keyword operands up to `)`.
    fn parse_call_args(&mut self) -> PResult<CallArgs> {
        let mut args = Vec::new();
        let mut kwargs = Vec::new();
        loop {
            if self.eat(')') {
                break;
            }
            if let (Some(Tok::Name(k)), Some((Tok::Punct('='), _))) =
                (self.peek(), self.toks.get(self.pos + 1))
            {
                let k = k.to_string();
                self.pos += 2;
                let v = self.parse_expr()?;
                kwargs.push((k, v));
            } else {
                if !kwargs.is_empty() {
                    return Err(self.err("positional operand after a keyword operand"));
                }
                args.push(self.parse_expr()?);
            }
            if !self.eat(',') {
                self.expect(')')?;
                break;
            }
        }
        Ok((args, kwargs))
    }

    /// `return a, b` (bare tuple) or `return expr`.
    fn parse_return(&mut self) -> PResult<Arg> {
        let first = self.parse_expr()?;
        if self.peek() != Some(&Tok::Punct(',')) {
            return Ok(first);
        }
        let mut items = vec![first];
        while self.eat(',') {
            if self.pos >= self.toks.len() {
                break;
            }
            items.push(self.parse_expr()?);
        }
        Ok(Arg::Tuple(items))
    }

    fn parse_seq(&mut self, close: char) -> PResult<(Vec<Arg>, bool)> {
        let mut items = Vec::new();
        let mut trailing = false;
        loop {
            if self.eat(close) {
                break;
            }
            items.push(self.parse_expr()?);
            trailing = self.eat(',');
            if !trailing {
                self.expect(close)?;
                break;
            }
        }
        Ok((items, trailing))
    }

    fn parse_expr(&mut self) -> PResult<Arg> {
        if self.depth >= crate::arg::MAX_NESTING {
            return Err(self.err(format!(
                "expression nests deeper than {} levels",
                crate::arg::MAX_NESTING
            )));
        }
        self.depth += 1;
        let r = self.parse_expr_inner();
        self.depth -= 1;
        r
    }

    fn parse_expr_inner(&mut self) -> PResult<Arg> {
        let col = self.col();
        let Some((tok, _)) = self.toks.get(self.pos).cloned() else {
            return Err(self.err("expected an operand"));
        };
        self.pos += 1;
        match tok {
            Tok::Int(v) => Ok(Arg::Int(v)),
            Tok::Float(v) => Ok(Arg::Float(v)),
            Tok::Str(s) => Ok(Arg::Str(s)),
            Tok::Punct('-') => match self.parse_expr()? {
                Arg::Int(v) => Ok(Arg::Int(-v)),
                Arg::Float(v) => Ok(Arg::Float(-v)),
                _ => {
                    Err(self
                        .parser
                        .err(self.ln, col, "`-` before something that is not a number"))
                }
            },
            Tok::Punct('(') => {
                let (items, trailing) = self.parse_seq(')')?;
                if items.len() == 1 && !trailing {
                    Ok(items.into_iter().next().expect("one item"))
                } else {
                    Ok(Arg::Tuple(items))
                }
            }
            Tok::Punct('[') => Ok(Arg::List(self.parse_seq(']')?.0)),
            Tok::Punct('{') => {
                let mut items = Vec::new();
                loop {
                    if self.eat('}') {
                        break;
                    }
                    let k = self.parse_expr()?;
                    self.expect(':')?;
                    let v = self.parse_expr()?;
                    items.push((k, v));
                    if !self.eat(',') {
                        self.expect('}')?;
                        break;
                    }
                }
                Ok(Arg::Dict(items))
            }
            Tok::Name(name) => self.parse_name(name, col),
            Tok::Punct(c) => Err(self.parser.err(self.ln, col, format!("unexpected `{c}`"))),
            Tok::Comment(_) => Err(self.parser.err(self.ln, col, "unexpected comment")),
        }
    }

    fn parse_name(&mut self, name: &str, col: usize) -> PResult<Arg> {
        let (parser, ln) = (self.parser, self.ln);
        let perr = move |m: String| parser.err(ln, col, m);
        if self.peek() == Some(&Tok::Punct('(')) {
            // the few calls Thunder prints inside operands: devices and special floats
            self.pos += 1;
            let (args, kwargs) = self.parse_call_args()?;
            let single_str = match (args.as_slice(), kwargs.is_empty()) {
                ([Arg::Str(s)], true) => Some(s.as_str()),
                _ => None,
            };
            return match (name, single_str) {
                ("devices.Device" | "thunder.devices.Device", Some(s)) => Device::parse(s)
                    .map(|d| Arg::Device(d, DeviceSpelling::Thunder))
                    .ok_or_else(|| perr(format!("unknown device `{s}`"))),
                ("torch.device", Some(s)) => Device::parse(s)
                    .map(|d| Arg::Device(d, DeviceSpelling::Torch))
                    .ok_or_else(|| perr(format!("unknown device `{s}`"))),
                ("slice", _) if kwargs.is_empty() && (1..=3).contains(&args.len()) => {
                    let mut parts = [None, None, None];
                    let given: Vec<Option<i64>> = args
                        .iter()
                        .map(|a| match a {
                            Arg::None => Ok(None),
                            Arg::Int(i) => Ok(Some(*i)),
                            other => {
                                Err(perr(format!("slice bound {other:?} is not an int or None")))
                            }
                        })
                        .collect::<PResult<_>>()?;
                    // slice(stop) or slice(start, stop[, step])
                    if given.len() == 1 {
                        parts[1] = given[0];
                    } else {
                        parts[..given.len()].copy_from_slice(&given);
                    }
                    Ok(Arg::Slice(Box::new(parts)))
                }
                ("float", Some(s)) => pyfloat::parse(s)
                    .map(Arg::Float)
                    .ok_or_else(|| perr(format!("bad float `{s}`"))),
                _ => Err(perr(format!(
                    "call of `{name}` inside an operand is not supported"
                ))),
            };
        }
        match name {
            "True" => return Ok(Arg::Bool(true)),
            "False" => return Ok(Arg::Bool(false)),
            "None" => return Ok(Arg::None),
            "..." | "Ellipsis" => return Ok(Arg::Ellipsis),
            "inf" | "math.inf" => return Ok(Arg::Float(f64::INFINITY)),
            "nan" | "math.nan" => return Ok(Arg::Float(f64::NAN)),
            _ => {}
        }
        if let Some((v, _)) = self.parser.names.get(name) {
            return Ok(Arg::Value(v));
        }
        if let Some(d) = name.strip_prefix("dtypes.").and_then(DType::from_thunder) {
            return Ok(Arg::DType(d, DTypeSpelling::Thunder));
        }
        if let Some(d) = name.strip_prefix("torch.").and_then(DType::from_torch) {
            return Ok(Arg::DType(d, DTypeSpelling::Torch));
        }
        if let Some(o) = Opaque::from_name(name) {
            return Ok(Arg::Opaque(Box::new(o)));
        }
        Err(perr(format!("undefined name `{name}`")))
    }
}

#[cfg(test)]
mod tests {
    use super::continues;

    #[test]
    fn a_trailing_backslash_continues_code_and_strings_but_not_comments() {
        assert_eq!(continues("t0 = ltorch.add(a, \\", None), (true, None));
        assert_eq!(
            continues("  # model.py:3: return a + \\", None),
            (false, None)
        );
        assert_eq!(continues("t0 = ltorch.add(a, b)", None), (false, None));
        // a `#` in a string starts no comment
        assert_eq!(continues("t0 = f(a, 'x#y', \\", None), (true, None));
        // a string left open by its `\` stays open on the next line, where a `#` is text
        assert_eq!(continues("t0 = f(a, 'x\\", None), (true, Some('\'')));
        assert_eq!(continues("#y', \\", Some('\'')), (true, None));
        // an escaped backslash ends nothing: the string is closed later on the line
        assert_eq!(continues(r#"t0 = f("a\\") # \"#, None), (false, None));
    }
}
