//! tracepass's fusion regions (`tracepass.fusion`, made by the `fuse-elementwise` pass): one
//! statement that stands for a chain of elementwise ops, printed as Thunder prints its own
//! regions, the body below it as decomposition comments:
//!
//! ```text
//!   t4 = tracepass.fusion(x, b)  # t4: "cpu f32[2, 3]"
//!     # t2 = ltorch.add(x, b)  # t2: "cpu f32[2, 3]"
//!     # t3 = ltorch.tanh(t2)  # t3: "cpu f32[2, 3]"
//!     # t4 = ltorch.mul(t3, 0.5)  # t4: "cpu f32[2, 3]"
//! ```
//!
//! The body is kept as the text of its statements (a node's decomposition), so the printed
//! form, the binary format and JSON carry it with nothing new, and `parse(print(t))` gives the
//! region back. [`region_body`] reads it as a trace of its own: the names the body reads but
//! does not define are its parameters, taken in order of first reading, and the region's
//! operands are bound to them by position (so a pass that renames an operand leaves a region
//! that still computes the same thing). The last statement defines the region's output.

use crate::arg::Arg;
use crate::node::{Node, SubSymbol};
use crate::parse::parse_trace;
use crate::print::print_node_line;
use crate::trace::Trace;
use crate::value::ValueId;
use petgraph::stable_graph::NodeIndex;

/// Why a region's body cannot be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RegionError {
    /// A region statement without a body (its decomposition was dropped).
    #[error("fusion region `{0}` has no body")]
    NoBody(String),
    /// A region has one output.
    #[error("fusion region `{0}` defines {1} values; a region defines one")]
    Outputs(String, usize),
    /// The body reads another number of outside values than the region has operands.
    #[error("fusion region `{line}`: its body reads {body} outside values ({names}), the region has {operands} operands")]
    Operands {
        /// The region statement.
        line: String,
        /// How many names the body reads without defining them.
        body: usize,
        /// Those names.
        names: String,
        /// How many value operands the statement has.
        operands: usize,
    },
    /// A region operand is a literal, not a value.
    #[error("fusion region `{0}`: operand {1} is not a value")]
    Literal(String, usize),
    /// The body's text is not a trace.
    #[error("fusion region `{line}`: {message}")]
    Body {
        /// The region statement.
        line: String,
        /// What the parser or the check said.
        message: String,
    },
}

/// The body statements of a region made of `members` (in schedule order), as decomposition
/// lines.
pub fn body_lines(t: &Trace, members: &[NodeIndex]) -> Vec<SubSymbol> {
    members
        .iter()
        .map(|&m| SubSymbol {
            text: print_node_line(t, m),
            children: Vec::new(),
        })
        .collect()
}

/// The body of the region `node` of `t` as a trace: its arguments are the region's operands
/// (names as the body spells them, types from the operands), it returns the region's output.
pub fn region_body(t: &Trace, node: &Node) -> Result<Trace, RegionError> {
    let line = node_text(t, node);
    if node.subsymbols().is_empty() {
        return Err(RegionError::NoBody(line));
    }
    let [out] = node.outputs() else {
        return Err(RegionError::Outputs(line, node.outputs().len()));
    };
    let operands: Vec<ValueId> = node
        .args()
        .iter()
        .enumerate()
        .map(|(i, a)| match a {
            Arg::Value(v) => Ok(*v),
            _ => Err(RegionError::Literal(line.clone(), i)),
        })
        .collect::<Result<_, _>>()?;
    let statements: Vec<&str> = node.subsymbols().iter().map(|s| s.text.as_str()).collect();
    let params = free_names(&statements);
    if params.len() != operands.len() {
        return Err(RegionError::Operands {
            line,
            body: params.len(),
            names: params.join(", "),
            operands: operands.len(),
        });
    }
    let mut text = format!("def fusion({}):\n", params.join(", "));
    for (p, v) in params.iter().zip(&operands) {
        let ty = t
            .ty(*v)
            .map_or_else(|| "Any".to_string(), |ty| ty.to_string());
        text.push_str(&format!("  # {p}: \"{ty}\"\n"));
    }
    for s in &statements {
        text.push_str("  ");
        text.push_str(s);
        text.push('\n');
    }
    let last = statements
        .last()
        .and_then(|s| s.split_once(" = "))
        .map(|(lhs, _)| lhs.trim())
        .unwrap_or_default();
    text.push_str(&format!("  return {last}\n"));
    let body = parse_trace(&text).map_err(|e| RegionError::Body {
        line: line.clone(),
        message: e.to_string(),
    })?;
    let defined = body.find_value(last).and_then(|v| body.ty(v));
    if defined != t.ty(*out) {
        return Err(RegionError::Body {
            line,
            message: format!(
                "its last statement defines `{last}` of type {}, the region's output is {}",
                defined.map_or("nothing".into(), ToString::to_string),
                t.ty(*out).map_or("untyped".into(), ToString::to_string)
            ),
        });
    }
    Ok(body)
}

fn node_text(t: &Trace, node: &Node) -> String {
    let outs: Vec<String> = node.outputs().iter().map(|v| t.name(*v)).collect();
    format!("{} = {}(...)", outs.join(", "), node.callee_name())
}

/// The names `statements` read before (or without) defining them, in order of first reading.
///
/// A name is an identifier of a right-hand side outside string literals that is not a callee
/// (`ltorch.mul(`), an attribute or module (`dtypes.float32`), a keyword (`dtype=`), or a
/// Python constant (`True`, `None`, `inf`, `nan`).
pub fn free_names(statements: &[&str]) -> Vec<String> {
    let mut defined: Vec<&str> = Vec::new();
    let mut free: Vec<String> = Vec::new();
    for s in statements {
        let (lhs, rhs) = s.split_once(" = ").unwrap_or(("", s));
        let rhs = rhs.split_once("  # ").map_or(rhs, |(r, _)| r);
        let b = rhs.as_bytes();
        let mut i = 0;
        let mut quote: Option<u8> = None;
        while i < b.len() {
            let c = b[i];
            if let Some(q) = quote {
                if c == q {
                    quote = None;
                }
                i += 1;
                continue;
            }
            if c == b'\'' || c == b'"' {
                quote = Some(c);
                i += 1;
                continue;
            }
            if c.is_ascii_alphabetic() || c == b'_' {
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
                let word = &rhs[start..i];
                let after = rhs[i..].trim_start().bytes().next();
                let attr = start > 0 && b[start - 1] == b'.';
                let skip = attr
                    || matches!(after, Some(b'(' | b'.' | b'='))
                    || matches!(word, "True" | "False" | "None" | "inf" | "nan");
                if !skip && !defined.contains(&word) && !free.iter().any(|f| f == word) {
                    free.push(word.to_string());
                }
                continue;
            }
            if c.is_ascii_digit() {
                // a number, exponent included (`1e-05`)
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.') {
                    i += 1;
                }
                continue;
            }
            i += 1;
        }
        for name in lhs.split([',', '[', ']', '(', ')']) {
            let name = name.trim();
            if !name.is_empty() {
                defined.push(name);
            }
        }
    }
    free
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_names_skip_callees_attributes_keywords_and_constants() {
        let body = [
            "t2 = ltorch.add(x, b, alpha=2)  # t2: \"cpu f32[2]\"",
            "t3 = prims.convert_element_type(t2, dtypes.float32)  # t3: \"cpu f32[2]\"",
            "t4 = ltorch.div(t3, y, rounding_mode='x y')  # t4: \"cpu f32[2]\"",
            "t5 = ltorch.mul(t4, 1e-05)  # t5: \"cpu f32[2]\"",
            "t6 = ltorch.where(x, t5, -inf)  # t6: \"cpu f32[2]\"",
        ];
        assert_eq!(free_names(&body), ["x", "b", "y"]);
    }

    #[test]
    fn a_region_parses_and_its_body_reads_back() {
        let text = "def f(x, b):\n  # x: \"cpu f32[2, 3]\"\n  # b: \"cpu f32[3]\"\n  t4 = tracepass.fusion(x, b)  # t4: \"cpu f32[2, 3]\"\n    # t2 = ltorch.add(x, b)  # t2: \"cpu f32[2, 3]\"\n    # t3 = ltorch.tanh(t2)  # t3: \"cpu f32[2, 3]\"\n    # t4 = ltorch.mul(t3, 0.5)  # t4: \"cpu f32[2, 3]\"\n  return t4\n";
        let t = parse_trace(text).expect("parses");
        let printed = crate::print_trace(&t);
        let region =
            &text[text.find("  t4 =").expect("a region")..text.find("  return").expect("a return")];
        assert!(printed.contains(region), "{printed}");
        assert_eq!(
            parse_trace(&printed).expect("reads back").fingerprint(),
            t.fingerprint()
        );
        let (_, node) = t.nodes().next().expect("one node");
        let body = region_body(&t, node).expect("a body");
        assert_eq!(body.node_count(), 3);
        assert_eq!(body.args().len(), 2);
        // a renamed operand is still bound by position
        let renamed = text.replace("ltorch.add(x, b)", "ltorch.add(x, z)");
        let t = parse_trace(&renamed).expect("parses");
        let (_, node) = t.nodes().next().expect("one node");
        assert_eq!(region_body(&t, node).expect("a body").args().len(), 2);
        let bad = text.replace("ltorch.mul(t3, 0.5)", "ltorch.mul(t3, z)");
        let t = parse_trace(&bad).expect("parses");
        let (_, node) = t.nodes().next().expect("one node");
        let e = region_body(&t, node)
            .expect_err("three outside names")
            .to_string();
        assert!(e.contains("reads 3 outside values (x, b, z)"), "{e}");
    }
}
