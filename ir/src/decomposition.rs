//! Ops tracepass has no entry for, read through the decomposition Thunder prints below them.
//!
//! Thunder prints every symbol an executor runs with its whole decomposition as indented
//! comments, down to prims:
//!
//! ```text
//!   t43 = torch.diagonal(t_0, 0, 0, 1)  # t43: "cpu i64[9, 4]"
//!     # t43 = ltorch.diagonal(t_0, 0, 0, 1)  # t43: "cpu i64[9, 4]"
//!       # t31 = prims.transpose(t_0, (2, 0, 1))  # t31: "cpu i64[9, 4, 7]"
//!       ...
//!       # t43 = prims.take(t40, t42, 1)  # t43: "cpu i64[9, 4]"
//! ```
//!
//! That decomposition is Thunder's own definition of the op, so a statement whose callee no
//! registry entry knows is replaced by its first-level body (as [`crate::fusion`] does for
//! executor regions), and again while a statement so made is itself unknown: here
//! `torch.diagonal` becomes `ltorch.diagonal`, which becomes the prims. Nothing is guessed: a
//! statement is replaced only when its body defines every value the statement defines, and
//! an op without a printed body stays an unknown op (an error naming it). The parser records
//! each replacement in the trace's provenance.

/// How the trace's provenance starts the entry that lists the ops read through their
/// decompositions (the parser writes it; tools show it).
pub const PROVENANCE: &str = "tracepass import: ops read through Thunder's printed decomposition: ";

/// One statement replaced by its decomposition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InlinedOp {
    /// The callee as printed (`torch.diagonal`).
    pub callee: String,
    /// Its line in the text given, counting from 1.
    pub line: usize,
    /// Whether it was itself part of a decomposition (`ltorch.diagonal` under `torch.diagonal`).
    pub nested: bool,
}

/// The text with every unknown op that has a complete printed decomposition replaced by it,
/// the line of the given text each line of the result comes from (counting from 0), and the
/// ops replaced (an op replaced in several rounds is listed once per round).
pub fn inline_unknown_decompositions(
    text: &str,
    is_known: impl Fn(&str) -> bool,
) -> (String, Vec<usize>, Vec<InlinedOp>) {
    let mut lines: Vec<(usize, String)> = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i, l.to_string()))
        .collect();
    let mut inlined = Vec::new();
    // each round goes one level down; Thunder's decompositions are a few levels deep
    for _ in 0..32 {
        let before = inlined.len();
        lines = inline_one_level(lines, &is_known, &mut inlined);
        if inlined.len() == before {
            break;
        }
    }
    let original: Vec<&str> = text.lines().collect();
    for op in &mut inlined {
        op.nested = original[op.line - 1].trim_start().starts_with('#');
    }
    let mut out = String::with_capacity(text.len());
    let mut map = Vec::with_capacity(lines.len());
    for (src, l) in lines {
        out.push_str(&l);
        out.push('\n');
        map.push(src);
    }
    (out, map, inlined)
}

fn inline_one_level(
    lines: Vec<(usize, String)>,
    is_known: &impl Fn(&str) -> bool,
    inlined: &mut Vec<InlinedOp>,
) -> Vec<(usize, String)> {
    let mut out = Vec::with_capacity(lines.len());
    let mut i = 0;
    while i < lines.len() {
        let (src, line) = &lines[i];
        let body = line.trim_start_matches(' ');
        let ind = line.len() - body.len();
        let call = (!body.starts_with('#'))
            .then(|| statement_call(body))
            .flatten()
            .filter(|(callee, _)| !is_known(callee));
        let Some((callee, defined)) = call else {
            out.push(lines[i].clone());
            i += 1;
            continue;
        };
        // the body: the comment lines indented deeper than the statement
        let mut j = i + 1;
        while j < lines.len() {
            let b = lines[j].1.trim_start_matches(' ');
            if lines[j].1.len() - b.len() <= ind || !b.starts_with('#') {
                break;
            }
            j += 1;
        }
        let first_level = ind + 2;
        let statements: Vec<&str> = lines[i + 1..j]
            .iter()
            .filter(|(_, l)| l.len() - l.trim_start_matches(' ').len() == first_level)
            .map(|(_, l)| l.trim_start_matches(' ')[1..].trim_start())
            .collect();
        let body_defines: Vec<String> = statements
            .iter()
            .filter_map(|s| statement_call(s))
            .flat_map(|(_, d)| d)
            .collect();
        let complete = !statements.is_empty()
            && statements.iter().all(|s| statement_call(s).is_some())
            && defined.iter().all(|d| body_defines.contains(d));
        if !complete {
            out.push(lines[i].clone());
            i += 1;
            continue;
        }
        inlined.push(InlinedOp {
            callee: callee.to_string(),
            line: src + 1,
            nested: false,
        });
        for (s, l) in &lines[i + 1..j] {
            let b = l.trim_start_matches(' ');
            let d = l.len() - b.len();
            let pad = " ".repeat(d - 2);
            if d == first_level {
                out.push((*s, format!("{pad}{}", b[1..].trim_start())));
            } else {
                out.push((*s, format!("{pad}{b}")));
            }
        }
        i = j;
    }
    out
}

/// The callee of a call statement (`a, b = ns.op(x)`, `(a,) = op(x)`, `op(x)`) and the names
/// it defines; `None` for anything else (`del`, `return`, comments).
fn statement_call(body: &str) -> Option<(&str, Vec<String>)> {
    let code = body.split("  #").next().unwrap_or(body);
    let (lhs, rhs) = match code.split_once(" = ") {
        Some((l, r)) if !l.contains('(') || l.trim_start().starts_with('(') => (l, r),
        _ => ("", code),
    };
    let open = rhs.find('(')?;
    let callee = rhs[..open].trim();
    let ident = |s: &str| {
        !s.is_empty()
            && s.split('.').all(|p| {
                p.chars()
                    .next()
                    .is_some_and(|c| c.is_alphabetic() || c == '_')
                    && p.chars().all(|c| c.is_alphanumeric() || c == '_')
            })
    };
    if !ident(callee) || matches!(callee, "return" | "del") {
        return None;
    }
    let defined = lhs
        .split(['[', ']', '(', ')', ','])
        .map(str::trim)
        .filter(|n| !n.is_empty() && *n != "_")
        .map(str::to_string)
        .collect();
    Some((callee, defined))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIAGONAL: &str = "def computation(t_0):
  # t_0: \"cpu i64[2, 3]\"
  t9 = torch.select(t_0, 1, 1)  # t9: \"cpu i64[2]\"
    # t9 = ltorch.select(t_0, 1, 1)  # t9: \"cpu i64[2]\"
      # t8 = prims.slice_prim(t_0, [0, 1], [2, 2], [1, 1])  # t8: \"cpu i64[2, 1]\"
      # t9 = ltorch.squeeze(t8, 1)  # t9: \"cpu i64[2]\"
        # t9 = prims.squeeze(t8, (1,))  # t9: \"cpu i64[2]\"
  return (t9,)
";

    fn known(c: &str) -> bool {
        c.starts_with("prims.") || c == "ltorch.squeeze"
    }

    #[test]
    fn an_unknown_op_becomes_its_prims() {
        let (text, map, ops) = inline_unknown_decompositions(DIAGONAL, known);
        assert_eq!(
            ops,
            [
                InlinedOp {
                    callee: "torch.select".into(),
                    line: 3,
                    nested: false
                },
                InlinedOp {
                    callee: "ltorch.select".into(),
                    line: 4,
                    nested: true
                }
            ]
        );
        let want = "def computation(t_0):
  # t_0: \"cpu i64[2, 3]\"
  t8 = prims.slice_prim(t_0, [0, 1], [2, 2], [1, 1])  # t8: \"cpu i64[2, 1]\"
  t9 = ltorch.squeeze(t8, 1)  # t9: \"cpu i64[2]\"
    # t9 = prims.squeeze(t8, (1,))  # t9: \"cpu i64[2]\"
  return (t9,)
";
        assert_eq!(text, want);
        // every line keeps the line it came from
        assert_eq!(map, [0, 1, 4, 5, 6, 7]);
    }

    #[test]
    fn known_ops_and_bodiless_ops_stay() {
        let (text, _, ops) = inline_unknown_decompositions(DIAGONAL, |_| true);
        assert_eq!(text, DIAGONAL);
        assert!(ops.is_empty());
        let bare = "def f(a):\n  b = torch.mystery(a)  # b: \"cpu f32[2]\"\n  return b\n";
        let (text, _, ops) = inline_unknown_decompositions(bare, |_| false);
        assert_eq!(text, bare);
        assert!(ops.is_empty());
    }

    #[test]
    fn a_body_that_does_not_define_the_outputs_is_not_used() {
        // the body defines t8 only: replacing the statement would leave t9 undefined
        let text = "def f(t_0):
  t9 = torch.select(t_0, 1, 1)  # t9: \"cpu i64[2]\"
    # t8 = prims.slice_prim(t_0, [0, 1], [2, 2], [1, 1])  # t8: \"cpu i64[2, 1]\"
  return (t9,)
";
        let (out, _, ops) = inline_unknown_decompositions(text, known);
        assert_eq!(out, text);
        assert!(ops.is_empty());
    }

    #[test]
    fn tuple_targets_and_calls_without_targets() {
        assert_eq!(
            statement_call("(t8, t9) = torch.tensor_split(t_0, 2, 1)"),
            Some(("torch.tensor_split", vec!["t8".into(), "t9".into()]))
        );
        assert_eq!(
            statement_call("t4, _, = torch.frexp(a)  # t4: \"cpu f32[2]\""),
            Some(("torch.frexp", vec!["t4".into()]))
        );
        assert_eq!(statement_call("print(a)"), Some(("print", vec![])));
        assert_eq!(statement_call("return (t9,)"), None);
        assert_eq!(statement_call("del t1"), None);
    }

    #[test]
    fn the_parser_reads_an_unknown_op_through_its_decomposition() {
        let t = crate::parse_trace(DIAGONAL).unwrap();
        let ops: Vec<&str> = t
            .schedule()
            .iter()
            .filter_map(|&i| t.node(i))
            .map(|n| n.op.as_str())
            .collect();
        assert_eq!(ops, ["prims.slice_prim", "ltorch.squeeze"]);
        let t9 = t.find_value("t9").unwrap();
        assert_eq!(t.ty(t9).unwrap().to_string(), "cpu i64[2]");
        let said: Vec<&str> = t.provenance.iter().map(|p| p.pass.as_str()).collect();
        assert_eq!(
            said,
            [
                "tracepass import: ops read through Thunder's printed decomposition: \
              `torch.select` (line 3)"
            ]
        );
        crate::verify(&t).unwrap();
    }

    #[test]
    fn an_unknown_op_inside_a_decomposition_keeps_the_op_unknown() {
        let text = DIAGONAL.replace("prims.slice_prim", "prims.mystery");
        let e = crate::parse_trace(&text).unwrap_err();
        assert_eq!(e.line, 3, "{e}");
        assert!(
            e.message
                .starts_with("1 unknown op: `torch.select` (line 3)"),
            "{e}"
        );
        assert!(e.message.contains("`prims.mystery` (line 5)"), "{e}");
        // the registry that keeps unknown ops opaque keeps `torch.select` as it is
        let reg = crate::registry::OpRegistry::builtin_allowing_unregistered();
        let t = crate::parse_trace_with(DIAGONAL, reg).unwrap();
        assert!(t
            .schedule()
            .iter()
            .any(|&i| t.node(i).unwrap().op == "torch.select"));
    }
}
