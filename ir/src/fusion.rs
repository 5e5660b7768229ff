//! Thunder's executor fusion regions (`nvFusion0`, `TorchCompile1`, `CUDAGraph2`): a statement
//! whose body is printed below it as decomposition comments,
//!
//! ```text
//!   [t34, t20] = TorchCompile1(t27, t21)
//!     # t34 = ltorch.matmul(t32, t33)  # t34: "cpu f32[2, 4]"
//!       # t34 = prims.matmul(t32, t33)  # t34: "cpu f32[2, 4]"
//!     # t20 = ltorch.sum(t25, (0,), False, dtype=None)  # t20: "cpu f32[4]"
//! ```
//!
//! tracepass has no kernel for a region, but its body is ordinary statements. [`inline_fusion_regions`]
//! rewrites the text so each region's first-level body becomes statements in its place (their
//! own decompositions stay comments), which [`parse_trace`](crate::parse_trace) then reads: the
//! values a region returns are defined by its body under the same names, with their types.
//! Ops inside a body that tracepass does not know are still an error, on the body's line.

/// Callee prefixes of Thunder's fusion executors (a prefix followed by the region's number).
pub const FUSION_PREFIXES: &[&str] = &["nvFusion", "TorchCompile", "CUDAGraph"];

/// One inlined region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FusionRegion {
    /// Its callee as printed (`nvFusion0`).
    pub name: String,
    /// The values it returns, in order.
    pub outputs: Vec<String>,
    /// Its line in the original text, counting from 1.
    pub line: usize,
    /// How many statements of its body were inlined.
    pub statements: usize,
}

/// The callee of a fusion-region statement (`[a, b] = nvFusion0(x, y)`), if `body` is one.
fn region_call(body: &str) -> Option<(&str, &str)> {
    let (lhs, rhs) = body.split_once(" = ")?;
    let open = rhs.find('(')?;
    let callee = &rhs[..open];
    let digits = FUSION_PREFIXES
        .iter()
        .find_map(|p| callee.strip_prefix(p))?;
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())).then_some((callee, lhs))
}

/// `text` with every fusion region replaced by its body, and the regions found.
///
/// A region's line is replaced by its first-level body statements, un-commented at the
/// statement's indentation; deeper comments move up one level and stay decompositions. A
/// region printed without a body is left as it is (the parser then names it as an unknown op).
pub fn inline_fusion_regions(text: &str) -> (String, Vec<FusionRegion>) {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = String::with_capacity(text.len());
    let mut regions = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let body = line.trim_start_matches(' ');
        let ind = line.len() - body.len();
        let call = (!body.starts_with('#'))
            .then(|| region_call(body))
            .flatten();
        let Some((callee, lhs)) = call else {
            out.push_str(line);
            out.push('\n');
            i += 1;
            continue;
        };
        // the body: the comment lines indented deeper than the statement
        let mut j = i + 1;
        let mut inlined = Vec::new();
        while j < lines.len() {
            let l = lines[j];
            let b = l.trim_start_matches(' ');
            let d = l.len() - b.len();
            if d <= ind || !b.starts_with('#') {
                break;
            }
            inlined.push((d, b));
            j += 1;
        }
        if inlined.is_empty() {
            out.push_str(line);
            out.push('\n');
            i += 1;
            continue;
        }
        let first_level = ind + 2;
        let mut statements = 0;
        for (d, b) in &inlined {
            let pad = " ".repeat(d - 2);
            if *d == first_level {
                let stmt = b.trim_start_matches('#').trim_start();
                out.push_str(&pad);
                out.push_str(stmt);
                statements += 1;
            } else {
                out.push_str(&pad);
                out.push_str(b);
            }
            out.push('\n');
        }
        let outputs = lhs
            .split(['[', ']', '(', ')', ','])
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .collect();
        regions.push(FusionRegion {
            name: callee.to_string(),
            outputs,
            line: i + 1,
            statements,
        });
        i = j;
    }
    (out, regions)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "def backward_fn(g, w, x):\n  # g: \"cpu f32[3, 2]\"\n  # w: \"cpu f32[2, 4]\"\n  # x: \"cpu f32[3, 4]\"\n  [t1, t2] = TorchCompile1(g, x)\n    # t0 = prims.transpose(g, (1, 0))  # t0: \"cpu f32[2, 3]\"\n    # t1 = ltorch.matmul(t0, x)  # t1: \"cpu f32[2, 4]\"\n      # t1 = prims.matmul(t0, x)  # t1: \"cpu f32[2, 4]\"\n    # t2 = prims.sum(g, (0,))  # t2: \"cpu f32[2]\"\n  del g\n  return (None, t1, t2)\n";

    #[test]
    fn a_region_becomes_its_body() {
        let (text, regions) = inline_fusion_regions(TEXT);
        assert_eq!(
            regions,
            [FusionRegion {
                name: "TorchCompile1".into(),
                outputs: vec!["t1".into(), "t2".into()],
                line: 5,
                statements: 3
            }]
        );
        assert!(text.contains("\n  t1 = ltorch.matmul(t0, x)  # t1: \"cpu f32[2, 4]\"\n    # t1 = prims.matmul(t0, x)"), "{text}");
        let t = crate::parse_trace(&text).unwrap();
        let t1 = t.find_value("t1").unwrap();
        assert_eq!(t.ty(t1).unwrap().to_string(), "cpu f32[2, 4]");
        assert_eq!(t.node_count(), 3);
    }

    #[test]
    fn an_unknown_op_inside_a_region_is_still_an_error() {
        let bad = TEXT.replace("prims.sum(g, (0,))", "prims.frobnicate(g, (0,))");
        let (text, _) = inline_fusion_regions(&bad);
        let e = crate::parse_trace(&text).unwrap_err().to_string();
        assert!(e.contains("prims.frobnicate"), "{e}");
    }

    #[test]
    fn other_calls_are_left_alone() {
        let plain = "def f(x):\n  # x: \"cpu f32[2]\"\n  y = nvFusionX(x)  # y: \"cpu f32[2]\"\n  return (y,)\n";
        assert_eq!(inline_fusion_regions(plain).0, plain);
        assert!(inline_fusion_regions(plain).1.is_empty());
    }
}
