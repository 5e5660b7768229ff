//! Typed op signatures: positional and keyword parameter names with defaults, declared once per
//! op as a Python-style parameter list (`"a, dim=None, keepdim=False, *, dtype=None"`), and the
//! binding of a node's operands to them. Binding is how the verifier checks arity and keyword
//! names, and how meta functions and kernels read an operand by its name whatever way the trace
//! spelled it (`torch.sum(t, (0,), False)` and `torch.sum(t, dim=(0,))` bind alike).

use crate::arg::Arg;
use std::fmt;

/// How a parameter may be passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// Positionally or by keyword.
    Positional,
    /// `*name`: every remaining positional operand, bound as one tuple.
    VarArgs,
    /// After `*`: by keyword only.
    KeywordOnly,
}

/// One parameter of an op.
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    /// Its name.
    pub name: String,
    /// Positional, keyword or both.
    pub kind: ParamKind,
    /// `None`: required.
    pub default: Option<Arg>,
}

/// An op's parameter list.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Signature {
    /// The parameters, in order.
    pub params: Vec<Param>,
    /// `**kwargs`: keywords outside the list are accepted (ops whose keywords Thunder forwards
    /// to PyTorch unchanged).
    pub open_keywords: bool,
}

/// Operands bound to parameters: for each parameter, the operand given or its default.
#[derive(Clone, Debug)]
pub struct Bound<'a> {
    sig: &'a Signature,
    slots: Vec<Option<Slot<'a>>>,
}

#[derive(Clone, Debug)]
enum Slot<'a> {
    Given(&'a Arg),
    /// The collected `*args`.
    Rest(Arg),
}

impl Signature {
    /// Parses a Python-style parameter list; an error names the malformed part.
    pub fn parse(text: &str) -> Result<Signature, String> {
        let mut sig = Signature::default();
        let mut keyword_only = false;
        for part in split_top_level(text) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            if part == "*" {
                keyword_only = true;
                continue;
            }
            if part == "/" {
                // positional-only marker: Thunder prints those operands positionally anyway
                continue;
            }
            if let Some(name) = part.strip_prefix("**") {
                if !is_ident(name) {
                    return Err(format!("bad parameter `{part}`"));
                }
                sig.open_keywords = true;
                continue;
            }
            if let Some(name) = part.strip_prefix('*') {
                if !is_ident(name) {
                    return Err(format!("bad parameter `{part}`"));
                }
                sig.params.push(Param {
                    name: name.to_string(),
                    kind: ParamKind::VarArgs,
                    default: None,
                });
                keyword_only = true;
                continue;
            }
            let (name, default) = match part.split_once('=') {
                Some((n, d)) => (n.trim(), Some(parse_literal(d.trim())?)),
                None => (part, None),
            };
            if !is_ident(name) {
                return Err(format!("bad parameter `{part}`"));
            }
            if sig.params.iter().any(|p| p.name == name) {
                return Err(format!("parameter `{name}` appears twice"));
            }
            sig.params.push(Param {
                name: name.to_string(),
                kind: if keyword_only {
                    ParamKind::KeywordOnly
                } else {
                    ParamKind::Positional
                },
                default,
            });
        }
        Ok(sig)
    }

    /// The index of parameter `name`.
    pub fn index(&self, name: &str) -> Option<usize> {
        self.params.iter().position(|p| p.name == name)
    }

    /// Binds operands as Python would; an error names the first mismatch.
    pub fn bind<'a>(
        &'a self,
        args: &'a [Arg],
        kwargs: &'a [(String, Arg)],
    ) -> Result<Bound<'a>, String> {
        let mut slots: Vec<Option<Slot<'a>>> = vec![None; self.params.len()];
        let mut next = 0;
        let mut rest: Option<(usize, Vec<Arg>)> = None;
        for a in args {
            while next < self.params.len() && self.params[next].kind == ParamKind::KeywordOnly {
                next += 1;
            }
            match self.params.get(next) {
                Some(p) if p.kind == ParamKind::VarArgs => {
                    rest.get_or_insert_with(|| (next, Vec::new()))
                        .1
                        .push(a.clone());
                }
                Some(_) => {
                    slots[next] = Some(Slot::Given(a));
                    next += 1;
                }
                None => {
                    return Err(format!(
                        "takes at most {} positional operands, got {}",
                        self.positional_count(),
                        args.len()
                    ))
                }
            }
        }
        if let Some((i, items)) = rest {
            slots[i] = Some(Slot::Rest(Arg::Tuple(items)));
        }
        for (k, v) in kwargs {
            match self.index(k) {
                Some(i) if self.params[i].kind != ParamKind::VarArgs => {
                    if slots[i].is_some() {
                        return Err(format!("operand `{k}` is given twice"));
                    }
                    slots[i] = Some(Slot::Given(v));
                }
                _ if self.open_keywords => {}
                _ => {
                    let names: Vec<&str> = self.params.iter().map(|p| p.name.as_str()).collect();
                    return Err(format!(
                        "has no keyword `{k}` (its parameters: {})",
                        names.join(", ")
                    ));
                }
            }
        }
        for (i, p) in self.params.iter().enumerate() {
            if slots[i].is_none() && p.default.is_none() && p.kind != ParamKind::VarArgs {
                return Err(format!("needs operand `{}`", p.name));
            }
        }
        Ok(Bound { sig: self, slots })
    }

    fn positional_count(&self) -> usize {
        self.params
            .iter()
            .filter(|p| p.kind == ParamKind::Positional)
            .count()
    }
}

impl<'a> Bound<'a> {
    /// The operand bound to `name`, or its default; `None` when the op has no such parameter or
    /// a `*args` parameter received nothing.
    pub fn get(&self, name: &str) -> Option<&Arg> {
        let i = self.sig.index(name)?;
        match &self.slots[i] {
            Some(Slot::Given(a)) => Some(a),
            Some(Slot::Rest(a)) => Some(a),
            None => self.sig.params[i].default.as_ref(),
        }
    }
    /// Whether the trace gave `name` (not just its default).
    pub fn given(&self, name: &str) -> bool {
        self.sig
            .index(name)
            .is_some_and(|i| self.slots[i].is_some())
    }
}

impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut star = false;
        for p in &self.params {
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            match p.kind {
                ParamKind::VarArgs => {
                    star = true;
                    write!(f, "*{}", p.name)?;
                    continue;
                }
                ParamKind::KeywordOnly if !star => {
                    star = true;
                    f.write_str("*, ")?;
                }
                _ => {}
            }
            f.write_str(&p.name)?;
            if let Some(d) = &p.default {
                write!(f, "={}", literal_text(d))?;
            }
        }
        if self.open_keywords {
            if !first {
                f.write_str(", ")?;
            }
            f.write_str("**kwargs")?;
        }
        Ok(())
    }
}

fn literal_text(a: &Arg) -> String {
    match a {
        Arg::None => "None".into(),
        Arg::Bool(b) => if *b { "True" } else { "False" }.into(),
        Arg::Int(i) => i.to_string(),
        Arg::Float(x) => format!("{x:?}"),
        Arg::Str(s) => format!("'{s}'"),
        Arg::Tuple(items) => {
            let inner: Vec<String> = items.iter().map(literal_text).collect();
            if items.len() == 1 {
                format!("({},)", inner[0])
            } else {
                format!("({})", inner.join(", "))
            }
        }
        other => format!("{other:?}"),
    }
}

fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn is_ident(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some(ch) if ch.is_ascii_alphabetic() || ch == '_')
        && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
}

/// Default values: None, booleans, ints, floats, strings and tuples of them.
fn parse_literal(s: &str) -> Result<Arg, String> {
    match s {
        "None" => return Ok(Arg::None),
        "True" => return Ok(Arg::Bool(true)),
        "False" => return Ok(Arg::Bool(false)),
        _ => {}
    }
    if let Some(inner) = s.strip_prefix('(').and_then(|r| r.strip_suffix(')')) {
        let items = split_top_level(inner)
            .into_iter()
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(parse_literal)
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(Arg::Tuple(items));
    }
    if let Some(q) = s.strip_prefix('\'').and_then(|r| r.strip_suffix('\'')) {
        return Ok(Arg::Str(q.to_string()));
    }
    if let Ok(i) = s.parse::<i64>() {
        return Ok(Arg::Int(i));
    }
    if let Ok(x) = s.parse::<f64>() {
        return Ok(Arg::Float(x));
    }
    Err(format!("bad default `{s}`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_positional_keyword_and_defaults() {
        let s = Signature::parse("a, dim=None, keepdim=False, *, dtype=None").unwrap();
        let args = [Arg::Int(7), Arg::Tuple(vec![Arg::Int(0)])];
        let kwargs = [("dtype".to_string(), Arg::None)];
        let b = s.bind(&args, &kwargs).unwrap();
        assert_eq!(b.get("a"), Some(&Arg::Int(7)));
        assert_eq!(b.get("dim"), Some(&Arg::Tuple(vec![Arg::Int(0)])));
        assert_eq!(b.get("keepdim"), Some(&Arg::Bool(false)));
        assert!(!b.given("keepdim"));
        assert!(b.given("dtype"));
        assert_eq!(s.to_string(), "a, dim=None, keepdim=False, *, dtype=None");
    }

    #[test]
    fn collects_varargs_into_a_tuple() {
        let s = Signature::parse("a, *shape").unwrap();
        let args = [Arg::Int(0), Arg::Int(2), Arg::Int(-1)];
        let b = s.bind(&args, &[]).unwrap();
        assert_eq!(
            b.get("shape"),
            Some(&Arg::Tuple(vec![Arg::Int(2), Arg::Int(-1)]))
        );
    }

    #[test]
    fn mismatches_are_errors_naming_the_operand() {
        let s = Signature::parse("a, b, *, alpha=None").unwrap();
        let e = s.bind(&[Arg::Int(1)], &[]).unwrap_err();
        assert!(e.contains("`b`"), "{e}");
        let e = s
            .bind(&[Arg::Int(1), Arg::Int(2), Arg::Int(3)], &[])
            .unwrap_err();
        assert!(e.contains("at most 2"), "{e}");
        let kw = [("beta".to_string(), Arg::Int(1))];
        let e = s.bind(&[Arg::Int(1), Arg::Int(2)], &kw).unwrap_err();
        assert!(e.contains("no keyword `beta`"), "{e}");
        let kw = [("a".to_string(), Arg::Int(1))];
        let e = s.bind(&[Arg::Int(1), Arg::Int(2)], &kw).unwrap_err();
        assert!(e.contains("given twice"), "{e}");
    }

    #[test]
    fn open_keywords_accept_any_keyword() {
        let s = Signature::parse("a, **kwargs").unwrap();
        let kw = [("memory_format".to_string(), Arg::None)];
        assert!(s.bind(&[Arg::Int(1)], &kw).is_ok());
        assert_eq!(s.to_string(), "a, **kwargs");
    }
}
